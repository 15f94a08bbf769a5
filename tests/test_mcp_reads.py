"""`relay mcp` reads no more of the inbox than a call returns."""
import os

import anyio
import pytest

import relay
import relay.fs
from mcp_client import deliver

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fdinfo"), reason="tells a waiter by /proc fdinfo")


@pytest.fixture
def team(cli, project):
    """Alice and Bob; `team.agent(name)` is a relay.Agent closed after the test."""
    cli("init", "--agent", "Alice", "--agent", "Bob")
    made = []

    def agent(name):
        made.append(relay.Agent(name, root=project.root))
        return made[-1]
    project.agent = agent
    yield project
    for a in made:
        a.layout.close()


@pytest.fixture
def opened(monkeypatch):
    """The envelopes in an inbox's new/ read through the confined file system, in order."""
    seen = []
    read = relay.fs.StateDir.read

    def counting(self, rel, limit=None):
        if rel.startswith("inbox/") and rel.split("/")[2:3] == ["new"]:
            seen.append(rel.rsplit("/", 1)[1].split(".")[0])
        return read(self, rel, limit)
    monkeypatch.setattr(relay.fs.StateDir, "read", counting)
    return seen


def test_inbox_and_wait_with_a_limit_read_only_the_envelopes_they_return(team, opened):
    """Five new messages: inbox(limit=2) and wait(limit=1) open only those they return, the
    oldest first, and count the others as `more`. In process, through MCPServer.call_tool."""
    from relay import mcp_server
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
