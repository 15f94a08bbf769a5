"""One scripted day of three agents on one repository, each through a
different side of relay, with a real `relay run` daemon delivering for the project.

- ann works from the shell: the real `relay` CLI as a subprocess, `RELAY_AGENT=ann`;
- bob from Python: `relay.Agent("bob", root=...)` in this process;
- cy through MCP: a real `relay mcp --agent cy` process driven by the official SDK's client.

ann asks bob for a review and bob replies in the thread; bob writes to dee, whom the operator
has just archived: the send is refused at once, and a file bob writes into his outbox by hand
is taken, fails in the daemon, and bob gets the bounce; ann sends
cy a note with `--wait-delivered 30` (exit 0); cy finds it with `search` by a word of its body,
sees nothing of ann and bob's thread (no party to it) while bob reads it from its first message
(as ann does with `relay audit --thread`),
takes its inbox, "loses" the result and gets the message back with `read(id)` and
`inbox(recent=1)`; bob reserves src/parser/ exclusively, ann's overlapping exclusive request is
refused naming bob (exit 1), and bob is told. Every wait has a deadline; nothing sleeps a fixed
time. `pytest -s tests/test_agents_day.py` prints the session as a transcript."""
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

import relay
from mcp_client import serve

pytest.importorskip("mcp")

SCRIPT = Path(sys.executable).with_name("relay")
RELAY = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "relay"]
DEADLINE = 20        # seconds any one wait may take


def say(line=""):
    print(line, flush=True)


def result(*lines):
    for i, line in enumerate(lines):
        say(("      -> " if i == 0 else "         ") + line)


class Shell:
    """ann's terminal: `relay` as a subprocess in the project's top directory."""

    def __init__(self, root, agent=None):
        self.root, self.agent = root, agent

    def __call__(self, *args, code=0, who=None):
        env = dict(os.environ)
        prefix = ""
        if self.agent:
            env["RELAY_AGENT"] = self.agent
            prefix = f"RELAY_AGENT={self.agent} "
        say(f"{who or self.agent or 'operator':8} $ {prefix}relay {shlex.join(args)}")
        done = subprocess.run([*RELAY, *args], cwd=self.root, env=env, capture_output=True, text=True,
                              timeout=DEADLINE + 10)
        assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        return done


class Daemon:
    """`relay run` for the project, ready once it says READY=1 on its notify socket."""

    def __init__(self, root, aside):
        self.sock_path = str(aside / "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.sock_path)
        self.sock.settimeout(DEADLINE)
        self.log_path = aside / "relay-run.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([*RELAY, "run"], cwd=root, env=dict(os.environ, NOTIFY_SOCKET=self.sock_path),
                                         stdout=subprocess.DEVNULL, stderr=log)

    def ready(self):
        while b"READY=1" not in self.sock.recv(4096):
            pass

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=DEADLINE)
        return code, self.log_path.read_text()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.sock.close()


def brief(m):
    return f"{m.id} from {m.sender}, kind {m.kind}, thread {m.thread}, subject {m.subject!r}"


def test_three_agents_day_shell_python_and_mcp_with_a_running_daemon(tmp_path):
    root = tmp_path / "repo"
    (root / "src" / "parser").mkdir(parents=True)
    (root / "src" / "parser" / "lexer.py").write_text("# the lexer\n")
    operator, ann = Shell(root), Shell(root, "ann")

    say()
    say("=== the agents' day: ann (shell), bob (Python), cy (MCP), one `relay run` ===")
    operator("init", "--agent", "ann", "--agent", "bob", "--agent", "cy", "--agent", "dee")
    daemon = Daemon(root, tmp_path)
    bob = None
    try:
        daemon.ready()
        say("operator $ relay run &")
        result(f"pid {daemon.proc.pid}, READY=1 on its notify socket")
        bob = relay.Agent("bob", root=root)
        errlog = tmp_path / "mcp-cy.err"

        async def day():
            with open(errlog, "w") as err:
                async with serve(root, "cy", err) as cy:
                    await session(cy)

        async def mcp(cy, tool, **arguments):
            shown = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
            say(f"{'cy':8} mcp {tool}({shown})")
            return await cy.call(tool, **arguments)

        async def session(cy):
            tools = await cy.tools()
            say(f"{'cy':8} mcp (relay mcp --agent cy --root {root.name}/)")
            result(f"{len(tools)} tools: {', '.join(sorted(tools))}")
            assert {"send", "reply", "inbox", "wait", "read", "mark_read", "search", "agents", "thread",
                    "reserve", "release", "reservations"} <= set(tools)

            # 1. ann asks bob; bob replies in the thread; ann reads the reply from the shell
            say("\n-- 1. ann asks bob for a review; bob replies in the thread")
            asked = ann("send", "--to", "bob", "--subject", "parser review",
                        "please review the lexer rewrite in src/parser/lexer.py").stdout.strip()
            result(asked)
            say(f"{'bob':8} >>> bob.wait(timeout={DEADLINE}, ack=True)")
            [m] = bob.wait(timeout=DEADLINE, ack=True)
            result(brief(m), f"body: {m.body!r}")
            assert (m.id, m.sender, m.to, m.kind, m.subject) == (asked, "ann", ["bob"], "message", "parser review")
            assert m.body == "please review the lexer rewrite in src/parser/lexer.py" and m.state == "cur"
            say(f"{'bob':8} >>> bob.reply(m, 'looks good; one nit in the escape handling')")
            answer = bob.reply(m, "looks good; one nit in the escape handling")
            result(answer)
            out = ann("inbox", "--wait", f"{DEADLINE}s", "--ack", "--json").stdout
            [back] = json.loads(out)
            result(f"{back['id']} from {back['from']}, thread {back['thread']}, subject {back['subject']!r}, "
                   f"state {back['state']}", f"body: {back['body']!r}")
            assert (back["id"], back["from"], back["thread"], back["subject"], back["state"]) == (
                answer, "bob", asked, "Re: parser review", "cur")   # the thread is the first message's id

            # 2. a send to an archived agent is refused at once; a file written by hand is taken,
            # fails in the daemon, and its sender gets the bounce
            say("\n-- 2. bob writes to dee, archived meanwhile: refused at once; by hand, fails later, bob gets the bounce")
            out = operator("archive-agent", "dee").stdout
            result(*out.strip().splitlines())
            assert "dee: archived" in out
            outbox = root / ".relay" / "outbox" / "bob"
            before = sorted(outbox.iterdir())
            say(f"{'bob':8} >>> bob.send('dee', 'can you take the docs?', subject='docs')")
            with pytest.raises(relay.InvalidName) as refusal:
                bob.send("dee", "can you take the docs?", subject="docs")
            result(f"refused: {refusal.value}")
            assert str(refusal.value).startswith("agent dee is archived since ") and str(refusal.value).endswith(
                "relay delivers nothing to it, so nothing was sent (an operator restores it: "
                "`relay archive-agent --undo dee`)")
            assert sorted(outbox.iterdir()) == before                          # nothing was written
            say(f"{'bob':8} $ printf 'TO: dee\\nSUBJECT: docs\\n\\ncan you take the docs?\\n' > .relay/outbox/bob/docs")
            (outbox / ".docs.tmp").write_text("TO: dee\nSUBJECT: docs\n\ncan you take the docs?\n")
            os.rename(outbox / ".docs.tmp", outbox / "docs")
            say(f"{'bob':8} >>> bob.wait(timeout={DEADLINE}, ack=True)")
            [b] = bob.wait(timeout=DEADLINE, ack=True)
            result(brief(b), *b.body.splitlines()[:3],
                   f"headers: bounce_of={b.headers['bounce_of']}, failed_recipients={b.headers['failed_recipients']}")
            [lost] = [d["id"] for d in json.loads(operator("show", "--path", "outbox/bob/docs", "--json").stdout)]
            assert (b.sender, b.to, b.kind, b.subject, b.thread) == ("System", ["bob"], "bounce", "Undelivered: docs", lost)
            assert b.headers["bounce_of"] == lost and b.headers["failed_recipients"] == ["dee"]
            assert "recipient_archived" in b.headers["reason"] and lost in b.body and "dee" in b.body
            shown = json.loads(operator("show", lost, "--json").stdout)
            result(f"status {shown['status']}: {shown['error']}")
            assert shown["status"] == "failed" and "recipient_archived" in shown["error"]

            # 3. ann sends cy a note and waits until it is delivered
            say("\n-- 3. ann sends cy a note with --wait-delivered 30: exit 0 once cy has it")
            done = ann("send", "--to", "cy", "--subject", "lexer merged", "--wait-delivered", "30",
                       "the lexer rewrite is merged; the tokenizer now keeps unicode escapes")
            note = done.stdout.strip()
            result(f"{note} (exit {done.returncode})")
            assert (root / ".relay" / "inbox" / "cy" / "new" / f"{note}.json").is_file()

            # 4. cy finds it by a word of its body, without taking it
            say("\n-- 4. cy searches its mail by a word of a body")
            found = (await mcp(cy, "search", query="tokenizer"))["results"]
            result(*(f"{r['id']} from {r['from']}: {r['snippet']!r} ({r['status']})" for r in found))
            assert [(r["id"], r["from"], r["subject"]) for r in found] == [(note, "ann", "lexer merged")]
            assert "**tokenizer**" in found[0]["snippet"]

            # 5. the thread read from its first message: ann's question first, then bob's reply; cy,
            # no party to it, sees nothing of it, as of a thread that is not there
            say("\n-- 5. a thread named by its first message's id starts with that message; only its parties see it")
            thread = await mcp(cy, "thread", thread=asked)
            result(f"cy: messages {thread['messages']}, more {thread['more']}")
            assert thread == await mcp(cy, "thread", thread="no-such-thread") | {"thread": asked}
            assert thread["messages"] == [] and thread["more"] == 0
            say(f"{'bob':8} >>> bob.thread({asked!r})")
            mine = bob.thread(asked)
            result(*(f"{t['id']} {t['from']}: {t['subject']!r} ({t['status']})" for t in mine))
            assert [(t["id"], t["from"], t["subject"]) for t in mine] == [
                (asked, "ann", "parser review"), (answer, "bob", "Re: parser review")]
            rows = json.loads(ann("audit", "--thread", asked, "--json").stdout)
            result(*(f"{r['id']} {r['from']} -> {','.join(r['to'])} {r['status']}" for r in rows))
            assert [r["id"] for r in rows] == [asked, answer]

            # 6. cy takes its inbox, "loses" the result, and gets the message back by id
            say("\n-- 6. cy takes its inbox (marks read), loses the result, gets it back by id")
            took = await mcp(cy, "inbox")
            result(*(f"{t['id']} from {t['from']}: {t['subject']!r} (read before: {t['read']})" for t in took["messages"]))
            assert [(t["id"], t["read"]) for t in took["messages"]] == [(note, False)]
            del took                                                        # the result is lost
            again = await mcp(cy, "inbox")
            result(f"messages {again['messages']}, more {again['more']}")
            assert again["messages"] == [] and again["more"] == 0           # consumed: not new any more
            got = await mcp(cy, "read", id=note)
            result(f"{got['id']} from {got['from']}, read {got['read']}: {got['body']!r}")
            assert (got["id"], got["from"], got["read"]) == (note, "ann", True)
            assert got["body"] == "the lexer rewrite is merged; the tokenizer now keeps unicode escapes"
            recent = await mcp(cy, "inbox", recent=1)
            result(*(f"recent: {t['id']} from {t['from']}: {t['subject']!r}" for t in recent["recent"]))
            assert [t["id"] for t in recent["recent"]] == [note] and recent["messages"] == []

            # 7. overlapping reservations: the second exclusive request is refused naming the holder
            say("\n-- 7. bob reserves src/parser/; ann's overlapping exclusive request is refused; bob is told")
            say(f"{'bob':8} >>> bob.reserve(['src/parser/'], ttl='30m', exclusive=True, reason='lexer review')")
            [lease] = bob.reserve(["src/parser/"], ttl="30m", exclusive=True, reason="lexer review")
            result(f"{lease.agent} holds {lease.path} ({lease.scope}, exclusive {lease.exclusive})")
            assert (lease.agent, lease.path, lease.exclusive) == ("bob", "src/parser", True)
            refused = ann("reserve", "src/parser/lexer.py", "--exclusive", "--for", "10m", code=1)
            result(f"exit {refused.returncode}", *refused.stderr.strip().splitlines())
            assert "src/parser/lexer.py is held exclusively by bob (as src/parser)" in refused.stderr
            assert "lexer review" in refused.stderr
            say(f"{'bob':8} >>> bob.wait(timeout={DEADLINE}, ack=True)")
            [told] = bob.wait(timeout=DEADLINE, ack=True)
            result(brief(told), told.body.splitlines()[0])
            assert (told.sender, told.kind) == ("System", "reservation-refused")
            assert told.headers["requester"] == "ann" and told.headers["held"] == "src/parser"
            held = (await mcp(cy, "reservations"))["reservations"]
            result(*(f"{r['agent']} {r['path']} exclusive {r['exclusive']} ({r['reason']})" for r in held))
            assert [(r["agent"], r["path"], r["exclusive"]) for r in held] == [("bob", "src/parser", True)]

        anyio.run(day)
        assert "Traceback" not in errlog.read_text()
        code, log = daemon.stop()
        say("\noperator $ kill -TERM <relay run>")
        result(f"exit {code}")
        assert code == 0 and "Traceback" not in log, log
    finally:
        if bob is not None:
            bob.close()
        daemon.kill()
