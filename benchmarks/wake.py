"""How soon a message reaches an idle agent: from the file's rename into the sender's outbox to
each way relay has of telling the recipient, with a real daemon (`relay run`) delivering.

    python benchmarks/wake.py [--rate 10] [--seconds 10] [--no-tmux] [--dir DIR]

Alice sends Bob `rate` messages a second for `seconds`, each a file renamed into her outbox with
its own `ID:` (so every figure knows which message it saw). Figures (milliseconds, p50/p99/max,
one JSON line at the end; the target is p50 <= 50 ms for mcp and tmux):
- hook: `relay hook claude --agent Bob` run back to back with a UserPromptSubmit event, as Claude
  Code runs it at each prompt; the time until the output of a run names the message in its
  additionalContext. A run is a new Python process (a few hundred ms): a message waits for the
  run under way to end and the next to see it, so this figure is about one and a half runs.
- mcp_updated: an SDK client subscribed to relay://inbox/Bob; the time until the
  notifications/resources/updated that follows the message's delivery (the client lists new/
  when one comes, to know which messages it announces).
- mcp_channel: the same server's notifications/claude/channel (the client says it is Claude
  Code), which names the message.
- delivered: when the envelope appeared in Bob's new/ (inotify): the daemon's part of the others.
- tmux: `[wake] tmux = "agents:{agent}"` on a private tmux server (its own socket); Bob's pane
  runs a reader that stamps each line typed into it, so the time is when the line reached the
  pane (capture-pane shows it there at the end). The line names the newest message of its batch:
  it covers the messages sent up to that one. Left out with --no-tmux, or when tmux is missing
  (the JSON line says "tmux": "skipped: ...").
Two rounds of `seconds` each: the pushes (delivered, mcp, tmux) first, then the hook alone, whose
back-to-back processes would otherwise load the machine the pushes are measured on. The clock is
CLOCK_MONOTONIC in every process (time.monotonic()).
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import anyio

import relay
from relay.ids import IdGenerator

PANE_READER = ("import sys, time\n"
               "out = open(sys.argv[1], 'a', buffering=1)\n"
               "for line in sys.stdin:\n"
               "    out.write(f'{time.monotonic():.6f} {line}')\n")


def figures(samples):
    if not samples:
        return {"n": 0}
    s = sorted(samples)
    pick = lambda q: round(s[min(len(s) - 1, int(q * len(s)))] * 1000, 2)     # noqa: E731
    return {"n": len(s), "p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": round(s[-1] * 1000, 2)}


class Bench:
    def __init__(self, where, rate, seconds, tmux):
        self.root = Path(where)
        self.rate, self.seconds = rate, seconds
        self.relay = [sys.executable, "-m", "relay", "--root", str(self.root)]
        self.sent = {}                  # id -> monotonic time just after the rename
        self.order = []                 # ids as sent
        self.seen = {k: {} for k in ("delivered", "hook", "mcp_updated", "mcp_channel")}
        self.done = threading.Event()
        self.tmux = tmux
        self.errors = []

    # -- setting up ----------------------------------------------------------------------------

    def setup(self):
        subprocess.run([*self.relay, "init", "--agent", "Alice", "--agent", "Bob"], check=True,
                       capture_output=True)
        if self.tmux:
            self.sock = str(self.root / "tmux.sock")
            self.pane_log = self.root / "pane.log"
            (self.root / "reader.py").write_text(PANE_READER)
            subprocess.run(["tmux", "-S", self.sock, "-f", "/dev/null", "new-session", "-d", "-s", "agents",
                            "-n", "Bob", "-x", "200", "-y", "50",
                            f"{sys.executable} {self.root / 'reader.py'} {self.pane_log}"], check=True)
            with open(self.root / ".relay" / "relay.toml", "a") as f:
                f.write(f'\n[wake]\ntmux = "agents:{{agent}}"\nsocket = "{self.sock}"\n')
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.root / "notify.sock"))
        self.notify.settimeout(30)
        self.log = open(self.root / "relay.log", "w")
        self.daemon = subprocess.Popen([*self.relay, "run"], stdout=subprocess.DEVNULL, stderr=self.log,
                                       env=dict(os.environ, NOTIFY_SOCKET=str(self.root / "notify.sock")))
        while b"READY=1" not in self.notify.recv(4096):
            pass

    def teardown(self):
        self.daemon.send_signal(signal.SIGTERM)
        self.daemon.wait(timeout=30)
        self.log.close()
        self.notify.close()
        if self.tmux:
            subprocess.run(["tmux", "-S", self.sock, "kill-server"], capture_output=True)

    # -- the readers ---------------------------------------------------------------------------

    def mcp(self, ready):
        """The SDK's client on `relay mcp --agent Bob`, subscribed, in this thread's event loop."""
        from mcp import ClientSession, types
        from mcp.client.extension import NotificationBinding
        from mcp.client.stdio import StdioServerParameters, stdio_client
        from pydantic import BaseModel

        class Channel(BaseModel):
            content: str
            meta: dict[str, str]
        new = self.root / ".relay" / "inbox" / "Bob" / "new"
        updated, channel = self.seen["mcp_updated"], self.seen["mcp_channel"]

        async def on_message(message):
            if isinstance(message, types.ResourceUpdatedNotification):
                now = time.monotonic()
                for name in os.listdir(new):
                    updated.setdefault(name[:-5], now)

        async def on_channel(params):
            channel.setdefault(params.meta["id"], time.monotonic())

        async def main():
            warnings.filterwarnings("ignore", "resources/subscribe is removed")     # the protocol this client speaks
            params = StdioServerParameters(command=sys.executable, cwd=str(self.root),
                                           args=["-m", "relay", "mcp", "--agent", "Bob", "--root", str(self.root)])
            with open(self.root / "mcp.err", "w") as err:
                async with stdio_client(params, errlog=err) as (read, write):
                    async with ClientSession(read, write, message_handler=on_message,
                                             client_info=types.Implementation(name="claude-code", version="bench"),
                                             notification_bindings=[NotificationBinding(
                                                 method="notifications/claude/channel", params_type=Channel,
                                                 handler=on_channel)]) as session:
                        await session.initialize()
                        await session.subscribe_resource("relay://inbox/Bob")
                        ready.set()
                        while not self.done.is_set():
                            await anyio.sleep(0.05)
        try:
            anyio.run(main)
        except Exception as e:          # said in the figures, not a traceback mid-run
            self.errors.append(f"mcp: {e!r}")
            ready.set()

    def hook(self):
        """`relay hook claude` back to back with a UserPromptSubmit event, as one session."""
        event = json.dumps({"session_id": "bench", "transcript_path": "/dev/null", "cwd": str(self.root),
                            "hook_event_name": "UserPromptSubmit", "prompt": "go on"})
        seen = self.seen["hook"]
        while not self.done.is_set():
            out = subprocess.run([*self.relay, "hook", "claude", "--agent", "Bob"], input=event,
                                 capture_output=True, text=True, timeout=60)
            now = time.monotonic()
            for mid in self.order:
                if mid not in seen and mid in out.stdout:
                    seen[mid] = now

    def tmux_lines(self):
        """(time, newest id) of each line typed into Bob's pane."""
        out = []
        for line in self.pane_log.read_text().splitlines():
            stamp, _, text = line.partition(" ")
            if "(newest " in text:
                out.append((float(stamp), text.split("(newest ", 1)[1].split(" ", 1)[0]))
        return out

    # -- the run -------------------------------------------------------------------------------

    def delivered(self):
        """When each envelope appeared in Bob's new/ (inotify, as relay's own waits): how much of
        each figure is the daemon's delivery."""
        from relay.agent.mail import NewMail
        box = self.root / ".relay" / "inbox" / "Bob"
        mail, seen = NewMail([box, box / "new"]).open(), self.seen["delivered"]
        try:
            while not self.done.is_set():
                now = time.monotonic()
                for name in os.listdir(box / "new"):
                    seen.setdefault(name[:-5], now)
                mail.wait(0.2)
        finally:
            mail.close()

    def run(self):
        """Two rounds at the rate: the pushes (MCP, tmux) alone, then the hook alone (its back-to-back
        processes would load the machine the pushes are measured on)."""
        self.setup()
        try:
            ready = threading.Event()
            readers = [threading.Thread(target=self.mcp, args=(ready,), daemon=True),
                       threading.Thread(target=self.delivered, daemon=True)]
            for t in readers:
                t.start()
            ready.wait(60)
            pushes = self.send(("delivered", "mcp_updated", "mcp_channel"))
            with relay.Agent("Bob", root=self.root) as bob:      # read: the hook's session is not given them
                bob.inbox(ack=True)
            readers.append(threading.Thread(target=self.hook, daemon=True))
            readers[-1].start()
            hooked = self.send(("hook",))
            self.done.set()
            for t in readers:
                t.join(60)
            return self.result(pushes, hooked)
        finally:
            self.teardown()

    def send(self, keys):
        """Alice's messages of one round (their ids), once every reader of `keys` saw them (or 15 s)."""
        ids, outbox = IdGenerator(), self.root / ".relay" / "outbox" / "Alice"
        count, first = int(self.rate * self.seconds), len(self.order)
        start = time.monotonic()
        for i in range(first, first + count):
            time.sleep(max(0.0, start + (i - first) / self.rate - time.monotonic()))
            mid = ids.new(time.time())
            (outbox / f".m{i}").write_text(f"ID: {mid}\nTO: Bob\nSUBJECT: wake {i}\n\nmessage {i}\n")
            os.rename(outbox / f".m{i}", outbox / f"m{i}")
            self.sent[mid] = time.monotonic()
            self.order.append(mid)
        mine = self.order[first:]
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not all(m in self.seen[k] for k in keys for m in mine):
            time.sleep(0.1)
        return mine

    def result(self, pushes, hooked):
        out = {"rate_per_s": self.rate, "seconds": self.seconds, "sent": len(self.sent)}
        for key, mine in (("delivered", pushes), ("mcp_updated", pushes), ("mcp_channel", pushes),
                          ("hook", hooked)):
            got = self.seen[key]
            out[key] = figures([got[m] - self.sent[m] for m in mine if m in got]) | {
                "missed": sum(m not in got for m in mine)}
        if self.tmux:
            lines, covered, i = self.tmux_lines(), {}, 0
            for stamp, newest in lines:
                if newest not in self.sent:
                    continue
                upto = self.order.index(newest)
                while i <= upto:
                    covered[self.order[i]] = stamp
                    i += 1
            out["tmux"] = figures([covered[m] - self.sent[m] for m in pushes if m in covered]) | {
                "missed": sum(m not in covered for m in pushes), "lines": len(lines)}
            shown = subprocess.run(["tmux", "-S", self.sock, "capture-pane", "-p", "-t", "agents:Bob"],
                                   capture_output=True, text=True).stdout
            out["tmux"]["in_pane"] = "relay: " in shown
        else:
            out["tmux"] = f"skipped: {self.tmux_skip}"
        if self.errors:
            out["errors"] = self.errors
        return out


def run(rate=10.0, seconds=10.0, tmux=True, where=None):
    """The figures as a dict (what the JSON line holds)."""
    skip = None
    if tmux and shutil.which("tmux") is None:
        tmux, skip = False, "tmux is not installed"
    elif not tmux:
        skip = "--no-tmux"
    with tempfile.TemporaryDirectory(dir=where) as d:
        bench = Bench(d, rate, seconds, tmux)
        bench.tmux_skip = skip
        return bench.run()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=10.0, help="messages a second (default 10)")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long Alice sends (default 10)")
    ap.add_argument("--no-tmux", action="store_true", help="leave the tmux wake out")
    ap.add_argument("--dir", default=None, help="where the temporary project goes")
    args = ap.parse_args()
    print(json.dumps(run(args.rate, args.seconds, not args.no_tmux, args.dir)))


if __name__ == "__main__":
    main()
