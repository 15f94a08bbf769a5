"""Two agents end to end, each the way it likes: Alice sends with the CLI; Bob waits with
`relay inbox --wait` (a process of its own), reads the body and replies in the thread through
MCP; Alice reads the reply with the Python API; `relay audit --thread` shows the conversation in
order. Run with `-s` to see the exchange."""
import json
import os
import subprocess
import sys

import anyio
import pytest

import relay
from mcp_client import serve, until, watching


@pytest.mark.skipif(not os.path.isdir("/proc/self/fdinfo"), reason="tells a waiter by /proc fdinfo")
def test_two_agents_talk_through_cli_wait_mcp_and_python(cli, tmp_path):
    root = cli.root
    cli("init", "--agent", "Alice", "--agent", "Bob")
    said = []

    # Bob waits for a message, in a process of his own
    waiter = subprocess.Popen([sys.executable, "-m", "relay", "--root", str(root), "inbox", "Bob",
                               "--wait", "60", "--ack", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        until(lambda: watching(waiter.pid, cli.state / "inbox" / "Bob" / "new"), "relay inbox --wait watches")
        assert waiter.poll() is None

        # Alice sends with the CLI; the relay delivers
        asked = cli("send", "--from", "Alice", "--to", "Bob", "--thread", "review-42", "--subject", "review",
                    "please review the parser").stdout.strip()
        said.append(f"Alice (relay send): {asked} 'please review the parser'")
        assert "relayed 1 message(s), 0 failed" in cli("run", "--once").output

        out, err = waiter.communicate(timeout=60)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    assert waiter.returncode == 0, err
    [got] = json.loads(out)
    assert (got["id"], got["from"], got["thread"], got["subject"], got["body"]) == (
        asked, "Alice", "review-42", "review", "please review the parser")
    assert got["state"] == "cur"                                    # --ack: marked read once printed
    said.append(f"Bob (relay inbox --wait): {got['id']} from {got['from']}: {got['body']!r}")

    # Bob replies in the thread through MCP
    async def reply(bob):
        sent = await bob.call("send", to=got["from"], body="looks good; two nits", subject="Re: review",
                              thread=got["thread"])
        said.append(f"Bob (MCP send): {sent['id']} 'looks good; two nits'")
        return sent["id"]

    answer = []

    async def main():
        with open(tmp_path / "server.err", "w") as errlog:
            async with serve(root, "Bob", errlog) as bob:
                answer.append(await reply(bob))
    anyio.run(main)
    assert "Traceback" not in (tmp_path / "server.err").read_text()
    assert "relayed 1 message(s), 0 failed" in cli("run", "--once").output

    # Alice reads the reply with the Python API
    alice = relay.Agent("Alice", root=root)
    try:
        [back] = alice.wait(timeout=60, ack=True)
    finally:
        alice.layout.close()
    assert (back.id, back.sender, back.thread, back.subject, back.body) == (
        answer[0], "Bob", "review-42", "Re: review", "looks good; two nits")
    said.append(f"Alice (relay.Agent.wait): {back.id} from {back.sender}: {back.body!r}")

    # the conversation, oldest first
    records = json.loads(cli("audit", "--thread", "review-42", "--json").output)
    assert [(r["id"], r["from"], r["to"], r["status"]) for r in records] == [
        (asked, "Alice", ["Bob"], "archived"), (answer[0], "Bob", ["Alice"], "archived")]
    table = cli("audit", "--thread", "review-42").output
    assert 0 <= table.index(asked) < table.index(answer[0])
    print("\n".join(said) + "\n" + table)
