"""relay web hammered while the daemon delivers: does the web view harm delivery?

    python benchmarks/web_load.py [--clients 1000] [--seconds 15] [--rate 20] [--workers 16] [--rows 20000]

Starts `relay run` and `relay web` as processes on a new project (its ledger preloaded with
`rows` archived messages), on loopback only. Then three phases, each offering `rate` messages/s
for `seconds` s from 8 agents (loadgen.offer: from each rename into an outbox to its envelope
seen in new/): quiet, hammered, quiet again. While hammered, `clients` live streams (/events)
stay open and read, and `workers` loops ask without pause for the pages, for huge query strings,
path traversal in every kind of parameter, no token and wrong tokens. Prints one JSON line: each
phase's delivery p50/p99, the hammered p50 over the quiet ones' (the issue's target: within
1.2x), the streams opened, refused and still open at the end, the requests by kind and answer,
and `harm`: any answer 5xx or 200 where a refusal was due, a file's content leaked, a request
that got no answer, or the daemon or the web server gone. A request line over the server's
bound may be refused by closing the connection while the client still writes it (a reset
before the 400 is read): for the huge query strings that counts as refused, not as harm. Every
phase is bounded in time (--limit for the whole run).
"""
import argparse
import asyncio
import collections
import itertools
import json
import multiprocessing
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from relay.bench import bench
from relay.bench.loadgen import offer

AGENTS = [f"agent{i}" for i in range(8)]
SECRET = "relay-web-load-secret-line"
# (kind, path, token: True the run's, None none, a string that one, statuses that are no harm)
TRAVERSAL = ["/messages/..%2F..%2Fsecret.txt/original", "/messages/..%2f..%2f..%2fetc%2fpasswd/original",
             "/threads/..%2F..%2F..%2Fsecret.txt", "/static/..%2F..%2F..%2Fsecret.txt", "/static/%2e%2e/app.py",
             "/messages?thread=../../secret.txt", "/messages?q=../../secret.txt", "/messages?before=../../x",
             "/messages?from=..%2F..%2Fsecret", "/threads/%2e%2e", "/messages/../../secret.txt/original"]
PAGES = ["/", "/messages", "/messages?agent=agent1", "/messages?q=load", "/agents", "/metrics",
         "/messages?status=archived&kind=message"]


def requests():
    """The requests a hammering worker cycles through: (kind, path, token, statuses that are no harm)."""
    out = [("page", p, True, {200}) for p in PAGES]
    out += [("traversal", p, True, {200, 400, 404}) for p in TRAVERSAL]
    refused = {400, 414, 431, "reset"}     # "reset": closed while the request line was still being sent
    out += [("huge_query", "/messages?q=" + "a" * n, True, refused) for n in (5_000, 60_000)]
    out += [("huge_query", "/messages?" + "&".join(f"x{i}=1" for i in range(3000)), True, refused)]
    out += [("no_token", p, None, {401}) for p in ("/", "/metrics", "/events")]
    out += [("wrong_token", p, "x" * 43, {401}) for p in ("/", "/messages", "/events")]
    out += [("wrong_token", "/?token=" + "y" * 43, None, {401})]
    kinds = {}
    for r in out:
        kinds.setdefault(r[0], []).append(r)
    return [r for turn in itertools.zip_longest(*kinds.values()) for r in turn if r is not None]     # kinds in turn


async def ask(port, path, token, secret):
    """(status or None, harm words or None) of one request, Connection: close."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
    try:
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Connection: close\r\n\r\n".encode())
        await writer.drain()
        data = await asyncio.wait_for(reader.read(-1), 30)
    finally:
        writer.close()
    if not data.startswith(b"HTTP/1.1 "):
        return None, "no HTTP answer"
    status = int(data[9:12])
    return status, ("a planted file's content was served" if secret.encode() in data else None)


class Load:
    """The hammering, on an event loop of its own thread: `clients` streams, `workers` askers."""

    def __init__(self, port, token, clients, workers, nice=10):
        self.port, self.token, self.clients, self.workers, self.nice = port, token, clients, workers, nice
        self.answers = collections.Counter()     # (kind, status) -> n
        self.harm = collections.Counter()
        self.streams = {"opened": 0, "refused": 0, "failed": 0, "updates": 0, "open_at_end": 0}
        self.open = 0
        self.stop = None
        self.loop = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self, patience=60.0):
        self.thread.start()
        self.ready.wait(patience)
        return self

    def close(self):
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(60)

    def _run(self):
        # The clients stand for browsers and scripts elsewhere: on this machine, their thread
        # yields the CPU to the processes measured (Linux: a thread's own nice value).
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self._main())
        self.loop.close()

    async def _main(self):
        self.stop = asyncio.Event()
        streams = [asyncio.create_task(self._stream()) for _ in range(self.clients)]
        deadline = time.monotonic() + 60
        while self.streams["opened"] + self.streams["refused"] + self.streams["failed"] < self.clients:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        workers = [asyncio.create_task(self._hammer(i)) for i in range(self.workers)]
        self.ready.set()
        await self.stop.wait()
        self.streams["open_at_end"] = self.open
        for t in streams + workers:
            t.cancel()
        await asyncio.gather(*streams, *workers, return_exceptions=True)

    async def _stream(self):
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.port), 30)
        except (OSError, asyncio.TimeoutError):
            self.streams["failed"] += 1
            return
        try:
            writer.write(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {self.token}\r\n\r\n"
                         .encode())
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            if not head.startswith(b"HTTP/1.1 200"):
                self.streams["refused" if head.startswith(b"HTTP/1.1 503") else "failed"] += 1
                return
            self.streams["opened"] += 1
            self.open += 1
            try:
                while chunk := await reader.read(65536):
                    self.streams["updates"] += chunk.count(b"event: update")
            finally:
                self.open -= 1
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError):
            self.streams["failed"] += 1
        finally:
            writer.close()

    async def _hammer(self, i):
        todo = requests()
        n = i
        while not self.stop.is_set():
            kind, path, token, fine = todo[n % len(todo)]
            n += 1
            token = self.token if token is True else token
            try:
                status, harm = await ask(self.port, path, token, SECRET)
            except (ConnectionResetError, BrokenPipeError) as e:
                status, harm = ("reset", None) if "reset" in fine else (None, f"no answer ({type(e).__name__})")
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
                status, harm = None, f"no answer ({type(e).__name__})"
            self.answers[(kind, status)] += 1
            if harm:
                self.harm[f"{kind} {path[:60]}: {harm}"] += 1
            elif status not in fine:
                self.harm[f"{kind} {path[:60]}: answered {status}"] += 1


def hammer(port, token, clients, workers, conn):
    """The load in a process of its own (so that the measuring process's threads never wait for
    its interpreter): started, it says "ready"; told "stop", it sends what it saw."""
    load = Load(port, token, clients, workers).start()
    conn.send("ready")
    conn.recv()
    load.close()
    answers = collections.defaultdict(dict)
    for (kind, status), c in sorted(load.answers.items(), key=str):
        answers[kind][str(status)] = c
    conn.send({"streams": load.streams, "requests": dict(answers), "harm": dict(load.harm)})


def phase(root, rate, seconds, alive, start):
    state = root / ".relay"
    inboxes = [state / "inbox" / n / "new" for n in AGENTS]
    route = lambda i: (state / "outbox" / AGENTS[i % len(AGENTS)], AGENTS[(i + 1) % len(AGENTS)])  # noqa: E731
    count = bench.offered(rate, seconds)
    lat = offer(count, rate, route, inboxes, 30, start=start, alive=alive)
    return lat, count


def figures(lat, count):
    if not lat:
        return {"offered": count, "delivered": 0, "p50_ms": None, "p99_ms": None}
    return {"offered": count, "delivered": len(lat), "p50_ms": round(bench.percentile(lat, 0.5), 1),
            "p99_ms": round(bench.percentile(lat, 0.99), 1)}


def start_web(root, env, nice=0):
    web = subprocess.Popen(["nice", "-n", str(nice), sys.executable, "-m", "relay", "web", "--host", "127.0.0.1"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    line = web.stdout.readline().decode()
    if not line.startswith("relay web: http://127.0.0.1:"):
        raise SystemExit(f"web_load: relay web did not start: {line!r}")
    url = line.split(" ", 2)[2].strip()
    port = int(url.split(":")[2].split("/")[0])
    threading.Thread(target=web.stdout.read, daemon=True).start()      # what else it prints, read
    return web, port, url.split("token=", 1)[1]


def run(base, clients=1000, seconds=15.0, rate=20.0, workers=16, rows=20_000, limit=600.0, web_nice=0):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = clients * 2 + 512
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    root = Path(tempfile.mkdtemp(dir=base, prefix="web-load-"))
    (root / "secret.txt").write_text(SECRET + "\n")
    env = dict(os.environ, RELAY_ROOT=str(root), RELAY_AGENTS=",".join(AGENTS), RELAY_LOG_LEVEL="WARNING",
               RELAY_PAIR_RATE="0")
    env.pop("RELAY_STATE_DIR", None)
    from relay import config as config_mod
    from relay.core.daemon import Relay
    relay = Relay(config_mod.load(root, ".relay", env={"RELAY_AGENTS": ",".join(AGENTS)}))
    bench.preload_ledger(relay.ledger, rows)
    relay.close()
    sock_path = f"@relay-web-load-{os.getpid()}-{os.urandom(4).hex()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + sock_path[1:])
    sock.settimeout(1)
    log = tempfile.TemporaryFile(dir=base)
    daemon = subprocess.Popen([sys.executable, "-m", "relay", "run"], env={**env, "NOTIFY_SOCKET": sock_path},
                              stderr=log)
    web, load, out = None, None, {"clients": clients, "seconds": seconds, "rate": rate, "workers": workers,
                                  "rows": rows, "cpus": os.cpu_count(), "web_nice": web_nice}
    alive = lambda: daemon.poll() is None      # noqa: E731
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(f"web_load: past --limit ({limit:g} s), stopped"))
    timer = threading.Timer(limit, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.daemon = True
    timer.start()
    try:
        if not bench.wait_ready(sock, alive):
            raise SystemExit("web_load: relay run did not start")
        sock.close()
        web, port, token = start_web(root, env, web_nice)
        n = bench.offered(rate, seconds)
        quiet, _ = phase(root, rate, seconds, alive, 0)
        mine, theirs = multiprocessing.Pipe()
        load = multiprocessing.get_context("fork").Process(target=hammer, args=(port, token, clients, workers, theirs),
                                                           daemon=True)
        load.start()
        if not mine.poll(120):
            raise SystemExit("web_load: the load did not start within 120 s")
        mine.recv()
        hammered, _ = phase(root, rate, seconds, alive, n)
        mine.send("stop")
        seen = mine.recv() if mine.poll(120) else {"streams": None, "requests": None, "harm": {"the load hung": 1}}
        load.join(30)
        again, _ = phase(root, rate, seconds, alive, 2 * n)
        base_p50 = statistics.mean([bench.percentile(quiet, 0.5), bench.percentile(again, 0.5)]) if quiet and again \
            else None
        out["quiet"], out["hammered"], out["quiet_again"] = figures(quiet, n), figures(hammered, n), figures(again, n)
        out["ratio_p50"] = round(bench.percentile(hammered, 0.5) / base_p50, 2) if base_p50 and hammered else None
        out["target_ratio"] = 1.2
        out.update(seen)
        for name in ("quiet", "hammered", "quiet_again"):
            lost = out[name]["offered"] - out[name]["delivered"]
            if lost:
                out["harm"][f"{lost} message(s) not delivered within 30 s in the {name} phase"] = 1
        if not alive():
            out["harm"]["the daemon exited"] = 1
        if web.poll() is not None:
            out["harm"]["the web server exited"] = 1
    finally:
        timer.cancel()
        if load is not None and load.is_alive():
            load.kill()
        if web is not None:
            bench.stop(web)
        bench.stop(daemon)
        sock.close()
        bench.discard(root)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--limit", type=float, default=600.0, help="seconds the whole run may take at most")
    ap.add_argument("--web-nice", type=int, default=0,
                    help="nice relay web further by this (it runs 10 below the daemon by itself)")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    print(json.dumps(run(args.dir, args.clients, args.seconds, args.rate, args.workers, args.rows, args.limit,
                         args.web_nice)))


if __name__ == "__main__":
    main()
