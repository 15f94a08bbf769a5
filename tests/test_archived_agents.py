"""An agent an operator archived (`relay archive-agent`) is no longer alive anywhere an agent
looks: a send to it or from it is refused at once, with the reason and the operator's way back
(`relay archive-agent --undo NAME`), in the CLI, the Python API and MCP; `relay agents`, the
API's and MCP's agents() show it archived, never active; `relay adopt` names only live agents;
what it drops in its outbox anyway is quarantined with the reason, never delivered."""
import json
import sqlite3

import anyio
import pytest

import relay
from mcp_client import ToolFailed, serve
from relay.errors import RelayError
from test_commands import by_name, drop

UNDO = "relay archive-agent --undo Carol"


@pytest.fixture
def archived(team):
    """Alice, Bob and Carol; Carol archived by an operator."""
    team("archive-agent", "Carol")
    return team


def failed_and_owed(project):
    """({sender: messages failed}, {sender: bounces owed}) as the ledger has them."""
    db = sqlite3.connect(f"file:{project.state / 'ledger.sqlite'}?mode=ro", uri=True)
    try:
        failed = dict(db.execute("SELECT sender, count(*) FROM messages WHERE status = 'failed' GROUP BY sender"))
        owed = dict(db.execute("SELECT sender, count(*) FROM bounces GROUP BY sender"))
    finally:
        db.close()
    return failed, owed


def one_line(result):
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


def test_send_to_an_archived_agent_is_refused_at_once_with_the_way_back(archived):
    r = archived("send", "--from", "Alice", "--to", "Bob,Carol", "are you there?", ok=False)
    line = one_line(r)
    assert r.exit_code == 1 and "agent Carol is archived" in line and "nothing was sent" in line and UNDO in line
    assert list((archived.state / "outbox" / "Alice").iterdir()) == []


def test_init_of_an_archived_agent_says_it_stays_archived_and_how_to_restore_it(archived):
    r = archived("init", "--agent", "Carol", "--agent", "Dan")
    assert r.stdout.splitlines()[0] == f"initialised {archived.state} with agents Dan"     # not Carol
    [note] = r.stderr.splitlines()
    assert note.startswith("relay: Carol is archived (by ") and note.endswith(UNDO)
    alone = archived("init", "--agent", "Carol")
    assert alone.stdout.splitlines()[0] == f"initialised {archived.state}" and UNDO in alone.stderr
    assert {d["agent"]: d["state"] for d in json.loads(archived("agents", "--json").output)}["Carol"] == "archived"


def test_send_to_a_released_then_archived_agent_is_refused_without_the_released_warning(archived):
    archived("archive-agent", "--undo", "Carol")
    drop(archived, "Bob", "release", "NAME: Carol\n\n")
    archived("run", "--once", "-q")
    assert by_name(archived)["release"]["status"] == "archived"
    archived("archive-agent", "Carol")
    r = archived("send", "--from", "Alice", "--to", "Carol", "hello?", ok=False)
    assert r.exit_code == 1 and "archived" in r.output and "all the same" not in r.output


def test_an_archived_agents_own_send_is_refused_at_once(archived):
    r = archived("send", "--from", "Carol", "--to", "Alice", "still here", ok=False)
    line = one_line(r)
    assert r.exit_code == 1 and "agent Carol is archived" in line and "accepts nothing from it" in line
    assert UNDO in line and list((archived.state / "outbox" / "Carol").iterdir()) == []


def test_a_file_an_archived_agent_drops_anyway_is_quarantined_with_the_reason(archived):
    drop(archived, "Carol", "sneak", "TO: Alice\n\nlet me in")
    archived("run", "--once", "-q")
    row = by_name(archived)["sneak"]
    assert row["status"] == "failed" and "agent Carol is archived" in row["error"]
    assert (archived.state / row["failed_path"]).read_text().startswith("TO: Alice")
    assert list((archived.state / "inbox" / "Alice" / "new").iterdir()) == []


def test_the_api_refuses_sends_to_and_from_an_archived_agent(archived):
    with relay.Agent("Alice", root=archived.root) as alice, relay.Agent("Carol", root=archived.root) as carol:
        with pytest.raises(RelayError, match="agent Carol is archived .*relay delivers nothing to it"):
            alice.send("Carol", "hello")
        with pytest.raises(RelayError, match="agent Carol is archived .*relay accepts nothing from it"):
            carol.send("Alice", "hello")
        assert alice.send("*", "to everyone alive")         # a broadcast leaves Carol out, as ever
        states = {r.name: r.state for r in alice.agents()}
        assert states == {"Alice": "active", "Bob": "active", "Carol": "archived"}
        assert [r.name for r in alice.agents(active=True)] == ["Alice", "Bob"]


def test_relay_agents_shows_the_archived_state_and_active_leaves_it_out(archived):
    docs = {d["agent"]: d for d in json.loads(archived("agents", "--json").output)}
    assert docs["Carol"]["state"] == "archived" and docs["Carol"]["archived"]
    assert [d["agent"] for d in json.loads(archived("agents", "--active", "--json").output)] == ["Alice", "Bob",
                                                                                                    "System"]
    [row] = [ln for ln in archived("agents").output.splitlines() if ln.startswith("Carol")]
    assert row.split()[:3] == ["Carol", "(archived)", "archived"]
    archived("archive-agent", "--undo", "Carol")
    assert {d["agent"]: d["state"] for d in json.loads(archived("agents", "--json").output)}["Carol"] == "active"


def test_adopt_names_only_live_agents_and_refuses_an_archived_one(archived):
    archived("adopt", "Alice")
    text = (archived.root / "AGENTS.md").read_text()
    assert "`Bob`" in text and "Carol" not in text
    r = archived("adopt", "Carol", ok=False)
    assert r.exit_code == 1 and "agent Carol is archived" in one_line(r) and UNDO in r.output


def test_mcp_refuses_sends_to_and_from_an_archived_agent_and_lists_it_archived(archived, tmp_path):
    async def as_alice(client):
        with pytest.raises(ToolFailed, match="agent Carol is archived"):
            await client.call("send", to="Carol", body="hello")
        listed = await client.call("agents")
        assert {a["name"]: a["state"] for a in listed["agents"]}["Carol"] == "archived"
        assert [a["name"] for a in (await client.call("agents", active=True))["agents"]] == ["Alice", "Bob"]

    async def as_carol(client):
        with pytest.raises(ToolFailed, match="accepts nothing from it"):
            await client.call("send", to="Alice", body="still here")

    async def main():
        with open(tmp_path / "server.err", "w") as err:
            async with serve(archived.root, "Alice", err) as client:
                await as_alice(client)
            async with serve(archived.root, "Carol", err) as client:
                await as_carol(client)
    anyio.run(main)
    assert "Traceback" not in (tmp_path / "server.err").read_text()
    assert list((archived.state / "outbox" / "Carol").iterdir()) == []
    assert list((archived.state / "outbox" / "Alice").iterdir()) == []




@pytest.mark.parametrize("batch_between", [True, False], ids=["a-batch-between", "no-batch-between"])
def test_a_file_of_unfit_name_in_an_archived_agents_outbox_is_quarantined_and_bounces_to_nobody(
        project, cli, batch_between):
    """A running relay quarantines the file and owes Carol, archived, no bounce, whether or not
    a batch of messages ran between the archiving and the file; Alice, alive, is owed hers."""
    r = project.relay(agents=("Alice", "Bob", "Carol"))
    r.drain()
    cli("archive-agent", "Carol")
    if batch_between:
        project.drop("Alice", "msg", "TO: Bob\n\na batch after the archiving")
        r.drain()
    for sender in ("Carol", "Alice"):
        project.drop(sender, "bad\x07name", "a file no message can be named after")
    r.drain()
    r.drain()
    failed, owed = failed_and_owed(project)
    assert failed == {"Alice": 1, "Carol": 1}
    assert owed == {"Alice": 1}
    assert len(list((project.state / "inbox" / "Bob" / "new").iterdir())) == int(batch_between)
    assert list((project.state / "outbox" / "Carol").iterdir()) == []


def test_a_message_an_archived_agent_drops_to_an_unknown_recipient_bounces_to_nobody(project, cli):
    """Refused for its unknown recipient or for its archived sender, a message from an archived
    agent owes no bounce (one for Alice's own such message is owed)."""
    r = project.relay(agents=("Alice", "Bob", "Carol"))
    r.drain()
    cli("archive-agent", "Carol")
    for sender in ("Carol", "Alice"):
        project.drop(sender, "lost", "TO: Nobody\nSUBJECT: lost\n\nto no one")
    r.drain()
    r.drain()
    failed, owed = failed_and_owed(project)
    assert failed == {"Alice": 1, "Carol": 1} and owed == {"Alice": 1}
    assert list((project.state / "inbox" / "Carol" / "new").iterdir()) == []
    assert [json.loads(p.read_text())["kind"] for p in (project.state / "inbox" / "Alice" / "new").iterdir()] == ["bounce"]


def test_the_refusal_for_an_archived_agent_names_when_by_whom_and_which_way():
    from relay.core.registry import archived_refusal
    archived = {"Carol": (0.0, "operator:ann"), "Dan": (None, None), "Eve": ("not a time", "")}
    assert archived_refusal("Bob", archived) is None
    assert archived_refusal("Carol", archived) == (
        "agent Carol is archived since 1970-01-01T00:00:00.000000Z by operator:ann: relay delivers nothing to it, so "
        "nothing was sent (an operator restores it: `relay archive-agent --undo Carol`)")
    assert archived_refusal("Dan", archived, sender=True, outcome="the file was quarantined") == (
        "agent Dan is archived by an operator: relay accepts nothing from it, so the file was quarantined "
        "(an operator restores it: `relay archive-agent --undo Dan`)")
    assert archived_refusal("Eve", archived).startswith("agent Eve is archived by an operator: ")
