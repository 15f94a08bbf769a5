"""`relay mcp`: the SDK's own client drives the server over stdio, end to end through a real
relay (Relay.drain in this process, on the same project)."""
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import anyio
import pytest

import relay
import relay.agent.api
from mcp_client import (ToolFailed, deliver, serve, server_pid, team, until, until_async,  # noqa: F401 - team: a fixture
                        watches, watching)

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fdinfo"), reason="tells a waiter by /proc fdinfo")

TOOLS = {"send", "reply", "inbox", "wait", "agents", "spawn", "release_agent", "thread", "read", "mark_read", "search",
         "reserve", "release", "reservations", "receipts", "acknowledge"}
SDK_PREFIX = "Error executing tool "        # the SDK's, before relay's one line


def run(scenario, root, tmp_path, agent="Bob"):
    """Run `scenario(client)` against `relay mcp --agent AGENT`; the server's stderr must stay
    free of tracebacks."""
    errlog = tmp_path / "server.err"

    async def main():
        with open(errlog, "w") as err:
            async with serve(root, agent, err) as client:
                await scenario(client)
    anyio.run(main)
    text = errlog.read_text()
    assert "Traceback" not in text, text


def test_tools_send_read_and_thread_through_a_real_relay(team, tmp_path):
    root = team.root
    outbox = team.state / "outbox" / "Bob"
    alice = team.agent("Alice")
    first = alice.send("Bob", "please review the parser\nline two", subject="review", thread="T-1")
    assert deliver(team).archived == 1

    async def scenario(bob):
        tools = await bob.tools()
        assert set(tools) == TOOLS
        assert all(t.description for t in tools.values())
        send_schema = tools["send"].input_schema
        assert set(send_schema["properties"]) == {"to", "body", "subject", "thread", "request_id", "kind",
                                                  "wait_delivered_s", "priority", "ack_required"}
        assert send_schema["properties"]["ack_required"]["type"] == "boolean"
        never_spawned = {"state": "active", "metadata": {}, "spawned_at": None, "spawned_by": None,
                         "released_at": None, "released_by": None}
        assert await bob.call("agents") == {"me": "Bob", "agents": [{"name": "Alice", "me": False, **never_spawned},
                                                                    {"name": "Bob", "me": True, **never_spawned}]}

        got = await bob.call("inbox")
        assert got["more"] == 0 and got["unreadable"] == [] and not got["timed_out"]
        [m] = got["messages"]
        assert {k: m[k] for k in ("id", "from", "to", "thread", "subject", "body")} == {
            "id": first, "from": "Alice", "to": ["Bob"], "thread": "T-1", "subject": "review",
            "body": "please review the parser\nline two"}
        assert m["sent_at"] and m["relayed_at"]
        assert (m["priority"], m["ack_required"]) == ("normal", False)
        assert (await bob.call("inbox"))["messages"] == []          # returned once
        # marked read once the reply holding it is written: just after the client could read it
        cur = team.state / "inbox" / "Bob" / "cur"
        await until_async(lambda: any(cur.iterdir()), "the message is marked read")
        [kept] = team.agent("Bob").inbox(include_read=True)
        assert kept.id == first and kept.state == "cur"

        sent = await bob.call("send", to=m["from"], body="done, two nits", subject="Re: review", thread=m["thread"])
        assert sent["repeated"] is False and sent["relay_running"] is False
        assert deliver(team).archived == 1
        [reply] = alice.inbox()
        assert (reply.id, reply.sender, reply.thread, reply.body) == (sent["id"], "Bob", "T-1", "done, two nits")

        thread = await bob.call("thread", thread="T-1")
        assert thread["thread"] == "T-1"
        assert [(t["id"], t["from"], t["body"], t["status"]) for t in thread["messages"]] == [
            (first, "Alice", "please review the parser\nline two", "archived"),
            (sent["id"], "Bob", "done, two nits", "archived")]
        assert (await bob.call("thread", thread="no-such-thread"))["messages"] == []

        # a retried send with the same request id is not sent again
        once = await bob.call("send", to="Alice", body="deploy", request_id="deploy-7")
        deliver(team)
        again = await bob.call("send", to="Alice", body="deploy", request_id="deploy-7")
        assert once["repeated"] is False and again == once | {"repeated": True}
        other = await bob.call("send", to="Alice", body="deploy", request_id="deploy-8")
        assert other["repeated"] is False and other["id"] != once["id"]
        deliver(team)
        assert [m.id for m in alice.inbox()][-2:] == [once["id"], other["id"]]

        # refusals are tool errors carrying relay's one line; nothing is written, the server goes on
        before = sorted(outbox.iterdir())
        with pytest.raises(ToolFailed) as e:
            await bob.call("send", to="alice", body="hi")
        assert e.value.args[0] == (f"{SDK_PREFIX}send: unknown recipient 'alice'; did you mean Alice? "
                                   "known agents: Alice, Bob")
        with pytest.raises(ToolFailed) as e:
            await bob.call("send", to="Alice", body="hi", subject="two\nlines")
        assert e.value.args[0] == f"{SDK_PREFIX}send: subject must be one line"
        with pytest.raises(ToolFailed) as e:
            await bob.call("send", to="Alice", body="hi", request_id="x" * 1000)
        assert e.value.args[0] == f"{SDK_PREFIX}send: request_id must be one line of at most 200 characters"
        assert sorted(outbox.iterdir()) == before
        assert (await bob.call("agents"))["me"] == "Bob"
    run(scenario, root, tmp_path)


def test_wait_and_inbox_timeout_wake_cancel_races_and_planted_files(team, tmp_path):
    alice = team.agent("Alice")
    new = team.state / "inbox" / "Bob" / "new"

    async def scenario(bob):
        pid = server_pid()
        assert await bob.call("wait", timeout_s=0.05) == {
            "messages": [], "more": 0, "unreadable": [], "timed_out": True, "recent": []}

        results = []

        async def wait():
            results.append(await bob.call("wait", timeout_s=60))
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await until_async(lambda: watching(pid, new), "the server watches Bob's inbox")
            assert results == []                                    # it waits
            mid = alice.send("Bob", "woken", thread="T-2")
            deliver(team)
        [got] = results
        assert [m["id"] for m in got["messages"]] == [mid] and got["timed_out"] is False
        assert got["messages"][0]["body"] == "woken"
        await until_async(lambda: not any(new.iterdir()), "the message is marked read")

        with anyio.CancelScope() as scope:                          # a wait the client gives up
            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(bob.call, "wait", timeout_s=60))
                await until_async(lambda: watching(pid, new), "the server watches Bob's inbox")
                scope.cancel()
        await until_async(lambda: not watching(pid, new), "the cancelled wait stops watching")
        later = alice.send("Bob", "after the cancel")
        deliver(team)
        assert [m["id"] for m in (await bob.call("inbox"))["messages"]] == [later]   # still new until asked

        for i in range(3):
            alice.send("Bob", f"m{i}")
        deliver(team)
        capped = await bob.call("wait", timeout_s=10_000, limit=2)   # timeout capped, limit kept
        assert [m["body"] for m in capped["messages"]] == ["m0", "m1"] and capped["more"] == 1
        assert [m["body"] for m in (await bob.call("inbox", limit=1))["messages"]] == ["m2"]

        # readers at once: each message is returned by exactly one of them
        sent = [alice.send("Bob", f"r{i}") for i in range(6)]
        deliver(team)
        seen = []

        async def read(tool, **args):
            seen.extend(m["id"] for m in (await bob.call(tool, **args))["messages"])
        async with anyio.create_task_group() as tg:
            for tool, args in [("inbox", {"limit": 2}), ("inbox", {}), ("wait", {"timeout_s": 0.05}), ("inbox", {})]:
                tg.start_soon(functools.partial(read, tool, **args))
        assert sorted(seen) == sorted(sent)

        # a planted file in new/ is reported, never marked read; the others are returned
        ok = alice.send("Bob", "fine")
        deliver(team)
        (new / "01PLANTED.host").write_bytes(b"\xff not json")
        got = await bob.call("inbox")
        assert [m["id"] for m in got["messages"]] == [ok]
        [planted] = got["unreadable"]
        assert planted["id"] == "01PLANTED" and "unreadable envelope" in planted["error"]
        assert (new / "01PLANTED.host").exists()
        (new / "01PLANTED.host").unlink()
        stuck = alice.send("Bob", "stuck")
        deliver(team)

        # new/ a symlink out of the state directory: refused with the reason
        (team.state / "inbox" / "Bob" / "new").rename(tmp_path / "moved-new")
        (team.state / "inbox" / "Bob" / "new").symlink_to(tmp_path / "moved-new")
        with pytest.raises(ToolFailed) as e:
            await bob.call("inbox")
        assert "it may lead outside the state directory" in e.value.args[0]
        assert [p.name.split(".")[0] for p in (tmp_path / "moved-new").iterdir()] == [stuck]

        # Bob's inbox removed and made again while the server runs: it reads the new one
        shutil.rmtree(team.state / "inbox" / "Bob")
        again = alice.send("Bob", "into the new inbox")
        deliver(team)
        assert [m["id"] for m in (await bob.call("inbox"))["messages"]] == [again]
    run(scenario, team.root, tmp_path)


def test_a_message_that_cannot_be_marked_read_is_an_error_not_a_spin(team):
    """cur/ gone: inbox and wait fail with the reason (a wait does not spin to its deadline on
    a message it cannot take) and the message stays new. In process, through the SDK's
    MCPServer.call_tool."""
    from mcp.server.mcpserver.exceptions import ToolError
    from relay.agent import mcp_server
    mid = team.agent("Alice").send("Bob", "stuck")
    deliver(team)
    (team.state / "inbox" / "Bob" / "cur").rmdir()
    server = mcp_server.build(team.agent("Bob"))

    async def main():
        for tool, args in [("inbox", {}), ("wait", {"timeout_s": 300})]:
            with pytest.raises(ToolError) as e:
                await server.call_tool(tool, args)
            assert "No such file or directory" in str(e.value)
    anyio.run(main)
    assert [p.name.split(".")[0] for p in (team.state / "inbox" / "Bob" / "new").iterdir()] == [mid]


def test_a_message_another_reader_took_after_the_listing_is_not_returned_again(team):
    """Two readers list the same new message; the first marks it read; the second returns
    nothing (each message is returned by exactly one reader). In process."""
    from relay.agent import mcp_server
    mid = team.agent("Alice").send("Bob", "once")
    deliver(team)
    bob = team.agent("Bob")
    listed = bob.inbox()
    assert [m.id for m in team.agent("Bob").inbox(ack=True)] == [mid]       # the other reader
    for wire in (False, True):
        got = mcp_server.Handover("Bob", bob.project.config, wire=wire).take(bob, listed, 10, key="1")
        assert got["messages"] == [] and got["more"] == 0


def test_a_damaged_ledger_is_a_tool_error_with_what_to_do(team):
    from mcp.server.mcpserver.exceptions import ToolError
    from relay.agent import mcp_server
    team.agent("Alice").send("Bob", "hi", thread="T")
    deliver(team)
    server = mcp_server.build(team.agent("Bob"))
    (team.state / "ledger.sqlite").write_bytes(b"not a database" * 512)
    for name in ("ledger.sqlite-wal", "ledger.sqlite-shm"):
        (team.state / name).unlink(missing_ok=True)

    async def main():
        with pytest.raises(ToolError) as e:
            await server.call_tool("thread", {"thread": "T"})
        assert "is damaged" in str(e.value) and "\n" not in str(e.value)
        assert [m["body"] for m in (await server.call_tool("inbox", {})).structured_content["messages"]] == ["hi"]
    anyio.run(main)


def test_send_says_whether_a_relay_is_running_to_deliver_it(team):
    from relay.agent import mcp_server
    from relay.files.lock import DaemonLock
    server = mcp_server.build(team.agent("Bob"))

    async def send():
        return (await server.call_tool("send", {"to": "Alice", "body": "hi"})).structured_content["relay_running"]
    assert anyio.run(send) is False
    with DaemonLock(team.state / "relay.lock"):
        assert anyio.run(send) is True


def test_waits_at_once_are_capped_and_the_other_tools_still_answer(team):
    """MAX_WAITS waits block at once (a thread and an inotify instance each); more queue, and
    the other tools keep answering. In process, through the SDK's MCPServer.call_tool."""
    from relay.agent import mcp_server
    server = mcp_server.build(team.agent("Bob"))
    new = team.state / "inbox" / "Bob" / "new"
    results = []

    async def wait():
        results.append(await server.call_tool("wait", {"timeout_s": 300}))

    async def main():
        async with anyio.create_task_group() as tg:
            for _ in range(mcp_server.MAX_WAITS + 3):
                tg.start_soon(wait)
            await until_async(lambda: watches(os.getpid(), new) == mcp_server.MAX_WAITS, "the waits watch")
            listed = (await server.call_tool("agents", {})).structured_content["agents"]
            assert [(a["name"], a["me"], a["state"]) for a in listed] == [("Alice", False, "active"), ("Bob", True, "active")]
            assert (await server.call_tool("inbox", {})).structured_content["messages"] == []
            assert watches(os.getpid(), new) == mcp_server.MAX_WAITS and results == []
            tg.cancel_scope.cancel()
        await until_async(lambda: watches(os.getpid(), new) == 0, "the cancelled waits stop watching")
    anyio.run(main)
    assert results == []


def test_the_server_ends_when_its_input_closes_or_on_ctrl_c_during_a_wait(team, tmp_path):
    """Closing stdin ends the server even with a wait in progress (its thread is stopped), with
    status 0; Ctrl-C (SIGINT) ends it at once, as SIGTERM does."""
    new = team.state / "inbox" / "Bob" / "new"
    errs = [open(tmp_path / f"server{i}.err", "w") for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-m", "relay", "mcp", "--agent", "Bob", "--root", str(team.root)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err) for err in errs]
    try:
        def rpc(proc, doc):
            proc.stdin.write(json.dumps({"jsonrpc": "2.0"} | doc).encode() + b"\n")
            proc.stdin.flush()
        for proc in procs:
            rpc(proc, {"id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}})
        for proc in procs:
            assert json.loads(proc.stdout.readline())["result"]["serverInfo"]["name"] == "relay"
            rpc(proc, {"method": "notifications/initialized"})
            rpc(proc, {"id": 2, "method": "tools/call", "params": {"name": "wait", "arguments": {"timeout_s": 300}}})
        for proc in procs:
            until(lambda: watching(proc.pid, new), "the server waits")
        closed, interrupted = procs
        closed.stdin.close()
        interrupted.send_signal(signal.SIGINT)
        assert closed.wait(timeout=30) == 0
        assert interrupted.wait(timeout=30) == 130         # 128 + SIGINT, as a shell reports Ctrl-C
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for err in errs:
            err.close()
    for i in range(2):
        assert "Traceback" not in (tmp_path / f"server{i}.err").read_text()
    assert (tmp_path / "server1.err").read_text() == ""


def test_ctrl_c_on_an_idle_server_exits_130_quietly(team):
    """Ctrl-C on `relay mcp` waiting for its client's next request: exit 130, nothing on stderr
    (it used to die of the signal itself: -2 to its parent, no exit status of its own)."""
    proc = subprocess.Popen([sys.executable, "-m", "relay", "mcp", "--agent", "Bob", "--root", str(team.root)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}
        ).encode() + b"\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["result"]["serverInfo"]["name"] == "relay"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and err.decode() == ""


def test_a_stop_ends_an_agent_wait_from_another_thread(team):
    bob = team.agent("Bob")
    stop = relay.agent.api.Stop()
    out = []
    waiter = threading.Thread(target=lambda: out.append(bob.wait(timeout=300, stop=stop)))
    waiter.start()
    until(lambda: watching(os.getpid(), team.state / "inbox" / "Bob" / "new"), "the wait watches")
    stop.set()
    waiter.join(timeout=30)
    assert not waiter.is_alive() and out == [[]]
    assert bob.wait(timeout=300, stop=stop) == []                   # set already: returns at once


def test_unknown_agent_or_no_project_exits_1_before_serving(cli, tmp_path_factory, monkeypatch):
    cli("init", "--agent", "Alice", "--agent", "Bob")
    r = cli("mcp", "--agent", "bob", ok=False)
    assert r.exit_code == 1
    assert r.output.strip().splitlines() == [
        "relay: unknown agent (--agent) 'bob'; did you mean Bob? known agents: Alice, Bob "
        "(relay init --agent NAME adds one)"]
    r = cli("mcp", "--agent", "../x", ok=False)
    assert r.exit_code == 1 and "invalid agent name '../x' (--agent)" in r.output
    from click.testing import CliRunner
    from relay.cli import main
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    r = CliRunner().invoke(main, ["mcp", "--agent", "Bob"])
    assert r.exit_code == 1
    assert r.output.strip().splitlines() == [
        "relay: not in a relay project (no .relay/ here or above); run relay init"]


def test_without_the_sdk_relay_mcp_says_how_to_install_it(cli, monkeypatch):
    cli("init", "--agent", "Bob")
    for name in [n for n in sys.modules if n == "mcp" or n.startswith("mcp.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "mcp", None)
    monkeypatch.delitem(sys.modules, "relay.agent.mcp_server", raising=False)
    r = cli("mcp", "--agent", "Bob", ok=False)
    assert r.exit_code == 1
    assert r.output.strip().splitlines() == [
        "relay: relay mcp needs the MCP SDK (the mcp package), which is not installed: pip install 'agent-outbox-relay[mcp]' "
        "(from a checkout of relay: pip install '.[mcp]')"]


def test_every_install_hint_gives_the_package_index_form_and_the_checkout_form():
    """`pip install 'agent-outbox-relay[mcp]'` fails where the package index has no such
    distribution (yet); from a checkout of relay it is `pip install '.[mcp]'`: every hint (the
    verbs' lines, the instructions agents get, the README and the docs) gives both."""
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    files = [*(root / "relay").rglob("*.py"), root / "README.md", *(root / "docs").glob("*.md"),
             *(root / "contrib").glob("*.md")]
    hints = 0
    for f in files:
        text = f.read_text()
        for m in re.finditer(r"pip install '?agent-outbox-relay\[(\w+)\]'?", text):
            assert f"pip install '.[{m.group(1)}]'" in text[m.end():m.end() + 120], (f.name, text[m.start():m.end() + 120])
            hints += 1
    assert hints >= 7


def test_import_relay_and_other_verbs_never_import_mcp(cli):
    cli("init", "--agent", "Bob")
    code = ("import sys, relay, relay.cli\n"
            "from click.testing import CliRunner\n"
            f"for args in (['--help'], ['mcp', '--help'], ['--root', {str(cli.root)!r}, 'agents']):\n"
            "    assert CliRunner().invoke(relay.cli.main, args).exit_code == 0, args\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mcp'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("package", ["mcp", "pydantic", "anyio"])
def test_without_any_one_package_the_server_imports_relay_mcp_says_how_to_install_the_sdk(cli, monkeypatch, package):
    cli("init", "--agent", "Bob")
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")] + [package]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "relay.agent.mcp_server", raising=False)
    r = cli("mcp", "--agent", "Bob", ok=False)
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.splitlines() == [
        "relay: relay mcp needs the MCP SDK (the mcp package), which is not installed: pip install "
        "'agent-outbox-relay[mcp]' (from a checkout of relay: pip install '.[mcp]')"]


def test_relay_mcp_missing_a_module_of_relays_own_is_not_said_to_be_the_sdk(cli, monkeypatch):
    cli("init", "--agent", "Bob")
    monkeypatch.delitem(sys.modules, "relay.agent.mcp_server", raising=False)
    monkeypatch.setitem(sys.modules, "relay.agent.mcp_wire", None)
    with pytest.raises(ImportError) as e:
        cli("mcp", "--agent", "Bob", ok=False)
    assert e.value.name == "relay.agent.mcp_wire"
