"""RELAY_AGENT names the agent every agent verb, the Python API and the MCP server act as when
none is given: an agent started with it set needs no name in any command."""
import json
import os
import sys

import anyio
import pytest

import relay
from conftest import error_line
from mcp_client import deliver


@pytest.fixture
def team(cli, project, monkeypatch):
    cli("init", "--agent", "Alice", "--agent", "Bob")
    with relay.Agent("Alice", root=project.root) as alice:
        project.first = alice.send("Bob", "the parser fails", subject="bug")
    deliver(project)
    project.cli = cli
    project.env = monkeypatch
    return project


def test_every_agent_verb_takes_the_agent_from_relay_agent(team):
    cli = team.cli
    team.env.setenv("RELAY_AGENT", "Bob")
    sent = cli("send", "--to", "Alice", "on it")
    out = sent.stdout
    assert "warning" not in sent.stderr     # RELAY_AGENT is no configuration key, and not taken for one
    deliver(team)
    with relay.Agent("Alice", root=team.root) as alice:
        [m] = alice.inbox()
    assert (m.id, m.sender) == (out.strip(), "Bob")
    assert [d["id"] for d in json.loads(cli("inbox", "--json").output)] == [team.first]
    assert [d["id"] for d in json.loads(cli("search", "parser", "--json").output)] == [team.first]
    assert cli("search", "on it").output.startswith(m.id)           # Bob's own send is his to find
    doc = json.loads(cli("read", team.first, "--json").output)       # Bob's copy, then marked read
    assert doc["state"] == "cur"
    assert cli("mark-read", team.first).output == f"{team.first}: read already\n"
    assert json.loads(cli("read", m.id, "--json").output)["from"] == "Bob"   # not in Bob's inbox: the ledger's
    # a name given wins; an empty one is none
    assert json.loads(cli("inbox", "Alice", "--json").output)[0]["id"] == m.id
    assert cli("send", "--from", "", "--to", "Alice", "again").stdout.strip()
    with relay.Agent(root=team.root) as me:
        assert me.name == "Bob"
    team.env.setenv("RELAY_AGENT", "bob")
    assert "did you mean Bob?" in error_line(cli("inbox", ok=False))


def test_without_it_a_verb_that_needs_an_agent_says_how_to_name_one(team):
    cli = team.cli
    for args, flag in ((["send", "--to", "Alice", "x"], "--from NAME"), (["inbox"], "AGENT"),
                       (["mark-read", team.first], "--agent NAME"), (["mcp"], "--agent NAME")):
        r = cli(*args, ok=False)
        assert r.exit_code == 2, args
        assert r.output.splitlines()[-1] == f"relay: name the agent: {flag}, or set RELAY_AGENT=NAME", args
    with pytest.raises(relay.RelayError) as e:
        relay.Agent(root=team.root)
    assert str(e.value) == 'name the agent: relay.Agent("NAME"), or set RELAY_AGENT=NAME'
    # without it, search and read look at every message, as an operator does
    assert [d["id"] for d in json.loads(cli("search", "parser", "--json").output)] == [team.first]
    assert json.loads(cli("read", team.first, "--json").output)["state"] == "new"


def test_the_mcp_server_takes_the_agent_from_relay_agent(team, tmp_path):
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
    params = StdioServerParameters(command=sys.executable, cwd=str(team.root), args=["-m", "relay", "mcp"],
                                   env={**os.environ, "RELAY_AGENT": "Bob"})

    async def main():
        with open(tmp_path / "server.err", "w") as err:
            async with stdio_client(params, errlog=err) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    got = await session.call_tool("agents", {})
                    assert got.structured_content["me"] == "Bob"
    anyio.run(main)
    assert "Traceback" not in (tmp_path / "server.err").read_text()
