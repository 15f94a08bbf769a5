"""`relay mcp` marks a message read only once a reply holding it reached a client that is there,
and reads no more of the inbox than a call returns."""
import json
import os
import subprocess
import sys

import anyio
import pytest

import relay
import relay.files.fs
from relay.arguments import EXIT_PIPE
from mcp_client import deliver, team, until, watching  # noqa: F401 - team: a fixture

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fdinfo"), reason="tells a waiter by /proc fdinfo")


def rpc(proc, doc):
    proc.stdin.write(json.dumps({"jsonrpc": "2.0"} | doc).encode() + b"\n")
    proc.stdin.flush()


class Server:
    """`relay mcp --agent Bob` as a subprocess, initialized; its stdout a pipe, or one end of a
    socket pair (`socket=True`). `close_reading()` does what a client that is gone does: the
    pipe's read end closed (the server's poll sees it), or the socket shut for reading (only the
    server's next write fails)."""

    def __init__(self, root, errlog, socket=False):
        self.sock = None
        if socket:
            import socket as sockets
            self.sock, theirs = sockets.socketpair()
            out = theirs.fileno()
        else:
            out = subprocess.PIPE
        self.proc = subprocess.Popen([sys.executable, "-m", "relay", "mcp", "--agent", "Bob", "--root", str(root)],
                                     stdin=subprocess.PIPE, stdout=out, stderr=errlog)
        if socket:
            theirs.close()
        self.replies = self.sock.makefile("rb") if socket else self.proc.stdout
        rpc(self.proc, {"id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}})
        assert json.loads(self.replies.readline())["result"]["serverInfo"]["name"] == "relay"
        rpc(self.proc, {"method": "notifications/initialized"})

    def close_reading(self):
        if self.sock is not None:
            import socket as sockets
            self.sock.shutdown(sockets.SHUT_RD)
        else:
            self.proc.stdout.close()

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdin.close()
        self.replies.close()
        if self.sock is not None:
            self.sock.close()


@pytest.mark.parametrize("socket", [False, True], ids=["pipe", "socket"])
@pytest.mark.parametrize("tool", ["wait", "inbox"])
def test_a_client_that_closed_its_end_gets_nothing_marked_read_and_the_server_exits(team, tmp_path, tool, socket):
    """The client stops reading the server's stdout but keeps stdin open, during a wait or
    before an inbox call: the message the server would have returned stays new, and the server,
    whose replies can reach no one, exits quietly (as any verb whose reader went away)."""
    new, cur = (team.state / "inbox" / "Bob" / sub for sub in ("new", "cur"))
    alice = team.agent("Alice")
    with open(tmp_path / "server.err", "w") as err:
        server = Server(team.root, err, socket=socket)
        try:
            if tool == "wait":
                rpc(server.proc, {"id": 2, "method": "tools/call", "params": {"name": "wait", "arguments": {"timeout_s": 300}}})
                until(lambda: watching(server.proc.pid, new), "the server waits")
                server.close_reading()
                mid = alice.send("Bob", "for a client that is gone")
                deliver(team)
            else:
                mid = alice.send("Bob", "for a client that is gone")
                deliver(team)
                server.close_reading()
                rpc(server.proc, {"id": 2, "method": "tools/call", "params": {"name": "inbox", "arguments": {}}})
            assert server.proc.wait(timeout=20) == EXIT_PIPE
        finally:
            server.close()
    assert sorted(p.name for p in new.iterdir()) == [f"{mid}.json"]
    assert list(cur.iterdir()) == []
    assert "Traceback" not in (tmp_path / "server.err").read_text()


@pytest.fixture
def opened(monkeypatch):
    """The envelopes in an inbox's new/ read through the confined file system, in order."""
    seen = []
    read = relay.files.fs.StateDir.read

    def counting(self, rel, limit=None):
        if rel.startswith("inbox/") and rel.split("/")[2:3] == ["new"]:
            seen.append(rel.rsplit("/", 1)[1].split(".")[0])
        return read(self, rel, limit)
    monkeypatch.setattr(relay.files.fs.StateDir, "read", counting)
    return seen


def test_inbox_and_wait_with_a_limit_read_only_the_envelopes_they_return(team, opened):
    """Five new messages: inbox(limit=2) and wait(limit=1) open only those they return, the
    oldest first, and count the others as `more`. In process, through MCPServer.call_tool."""
    from relay.agent import mcp_server
    alice = team.agent("Alice")
    sent = [alice.send("Bob", f"m{i}") for i in range(5)]
    deliver(team)
    server = mcp_server.build(team.agent("Bob"))

    async def call(tool, **args):
        return (await server.call_tool(tool, args)).structured_content

    async def main():
        got = await call("inbox", limit=2)
        assert [m["id"] for m in got["messages"]] == sent[:2] and got["more"] == 3
        assert opened == sent[:2]
        opened.clear()
        got = await call("wait", timeout_s=5, limit=1)
        assert [m["id"] for m in got["messages"]] == sent[2:3] and got["more"] == 2
        assert opened == sent[2:3]
    anyio.run(main)


def test_a_reply_marks_read_what_it_holds_only_once_written(team):
    """Over the wire, what a call takes is held (no other call returns it) until the transport
    says its reply was written (then marked read) or not (then new again). In process, through
    the Handover the transport reports to."""
    from mcp.server.mcpserver.exceptions import ToolError

    from relay.agent import mcp_server
    alice = team.agent("Alice")
    first, second = alice.send("Bob", "one"), alice.send("Bob", "two")
    deliver(team)
    bob = team.agent("Bob")
    handover = mcp_server.Handover("Bob", bob.project.config, wire=True)
    new = team.state / "inbox" / "Bob" / "new"

    def take(key, limit=1):
        got = handover.take(bob, bob.inbox(limit=limit, skip=handover.held), limit, key)
        return [m["id"] for m in got["messages"]], got["more"]

    assert take("7") == ([first], 1)
    assert take("8") == ([second], 0)           # the first is held: not returned again
    assert take("9") == ([], 0)
    handover.unanswered("7")                    # its reply was not written: new, free again
    assert sorted(p.name for p in new.iterdir()) == [f"{first}.json", f"{second}.json"]
    assert take("10") == ([first], 0)
    handover.written("8")
    handover.written("10")
    assert list(new.iterdir()) == [] and handover.held == set()
    assert [(m.id, m.state) for m in bob.inbox(include_read=True)] == [(first, "cur"), (second, "cur")]
    third = alice.send("Bob", "three")
    deliver(team)
    assert take("11") == ([third], 0)
    handover.gone()                             # the client is gone: nothing more is taken
    with pytest.raises(ToolError):
        take("12")
    handover.written("11")                      # forgotten: stays new
    assert [p.name for p in new.iterdir()] == [f"{third}.json"]
def test_two_calls_that_listed_the_same_message_return_it_once(team):
    """The calls of one server run at once in worker threads: both may list a new message
    before either takes it. The first takes it (held until its reply is written), the second
    returns nothing: a message is in one reply."""
    from relay.agent import mcp_server
    mid = team.agent("Alice").send("Bob", "once")
    deliver(team)
    bob = team.agent("Bob")
    handover = mcp_server.Handover("Bob", bob.project.config, wire=True)
    first, second = (bob.inbox(limit=5, skip=handover.held) for _ in range(2))
    assert [m["id"] for m in handover.take(bob, list(first), 5, "1")["messages"]] == [mid]
    assert handover.take(bob, list(second), 5, "2")["messages"] == []
    handover.written("1")
    handover.unanswered("2")
    assert [(m.id, m.state) for m in bob.inbox(include_read=True)] == [(mid, "cur")]


WIRE = """
import sys

import anyio
from mcp import types
from mcp.shared.message import SessionMessage

from relay.agent.mcp_wire import serve


class Replies:
    def written(self, key):
        print("written", key, file=sys.stderr, flush=True)

    def unanswered(self, key):
        print("unanswered", key, file=sys.stderr, flush=True)

    def gone(self):
        print("gone", file=sys.stderr, flush=True)


async def run(read_stream, write_stream):
    error = types.CallToolResult(content=[types.TextContent(type="text", text="refused")], is_error=True)
    ok = types.CallToolResult(content=[types.TextContent(type="text", text="fine")])
    for mid, result in ((5, error), (6, ok)):
        await write_stream.send(SessionMessage(types.JSONRPCResponse(
            jsonrpc="2.0", id=mid, result=result.model_dump(by_alias=True, exclude_none=True))))
    await write_stream.send(SessionMessage(types.JSONRPCError(
        jsonrpc="2.0", id=7, error=types.ErrorData(code=-32603, message="failed"))))
    async for _ in read_stream:
        pass

anyio.run(serve, run, Replies())
"""


def test_the_wire_says_written_only_for_a_reply_that_is_no_error():
    """relay's stdio transport (mcp_wire.serve) tells the server which replies reached the
    client whole: a tool's result is `written` once on the wire; a tool's error result and an
    error response are `unanswered`, so what their calls held stays new."""
    out = subprocess.run([sys.executable, "-c", WIRE], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    assert [json.loads(line)["id"] for line in out.stdout.splitlines()] == [5, 6, 7]
    assert out.stderr.splitlines() == ["unanswered 5", "written 6", "unanswered 7"]




def in_process(team, sent_by_alice):
    """Bob's MCP server in this process (MCPServer.call_tool) after Alice sent `sent_by_alice`
    bodies, delivered: (call, the ids sent)."""
    from relay.agent import mcp_server
    alice = team.agent("Alice")
    sent = [alice.send("Bob", body) for body in sent_by_alice]
    deliver(team)
    server = mcp_server.build(team.agent("Bob"))

    async def call(tool, **args):
        return (await server.call_tool(tool, args)).structured_content
    return call, sent


def test_inbox_without_marking_read_lists_the_same_first_messages_and_counts_the_rest(team):
    """inbox(mark_read=false) with a limit: the oldest `limit` messages, `more` counting exactly
    those past them, and nothing taken: the next call lists the same ones."""
    call, sent = in_process(team, [f"m{i}" for i in range(5)])

    async def main():
        for _ in range(2):
            got = await call("inbox", limit=2, mark_read=False)
            assert [m["id"] for m in got["messages"]] == sent[:2] and got["more"] == 3
            assert [m["read"] for m in got["messages"]] == [False, False]
        got = await call("inbox", limit=5)
        assert [m["id"] for m in got["messages"]] == sent and got["more"] == 0
    anyio.run(main)


def test_read_marks_a_new_message_read_and_returns_a_read_one_as_it_is(team):
    """read(id) of a new message returns it (`read` false: it was new) and marks it read, so
    inbox no longer returns it; read(id) again returns it with `read` true."""
    call, sent = in_process(team, ["first", "second"])

    async def main():
        got = await call("read", id=sent[0])
        assert (got["id"], got["body"], got["read"]) == (sent[0], "first", False)
        assert [m["id"] for m in (await call("inbox", mark_read=False))["messages"]] == sent[1:]
        again = await call("read", id=sent[0])
        assert (again["id"], again["body"], again["read"]) == (sent[0], "first", True)
    anyio.run(main)


def test_a_line_that_is_no_json_rpc_message_leaves_the_server_answering_the_next(team, tmp_path):
    with open(tmp_path / "server.err", "w") as err:
        server = Server(team.root, err)
        try:
            server.proc.stdin.write(b"this is no JSON\n{\"jsonrpc\": \"2.0\", \"nonsense\": 1}\n")
            rpc(server.proc, {"id": 2, "method": "tools/call", "params": {"name": "agents", "arguments": {}}})
            replies = [json.loads(server.replies.readline())]
            while replies[-1].get("id") != 2:
                replies.append(json.loads(server.replies.readline()))
            assert "result" in replies[-1] and not replies[-1]["result"].get("isError")
            assert server.proc.poll() is None
        finally:
            server.close()
    assert "Traceback" not in (tmp_path / "server.err").read_text()
