"""The agent's side attacked: names relay gives a meaning, waits that must wake, ids that
collide, files planted where the agent verbs look, crashes around a re-keyed message."""
import json

import pytest

import relay


def error_line(result):
    """The one line a refusal prints (stderr), without click's prefix."""
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1, result.output
    return lines[0].removeprefix("Error: ")


@pytest.fixture
def team(cli):
    cli("init", "--agent", "Alice", "--agent", "Bob", "--agent", "Carol")
    return cli


def drain(root, now=None):
    import time
    with relay.Relay(relay.load(root, ".relay", env={})) as r:
        return r.drain(now_fn=lambda: (now or time.time()) + 1)


# -- names -------------------------------------------------------------------------------------------

def test_send_to_broadcast_reaches_everyone_like_star(team):
    """SPEC 2: `*` has the alias `Broadcast`; the agent side must not refuse it as an unknown agent."""
    mid = team("send", "--from", "Alice", "--to", "Broadcast", "to all").output.strip()
    drain(team.root)
    for agent in ("Bob", "Carol"):
        assert [m.id for m in relay.Agent(agent, root=team.root).inbox()] == [mid]
    assert relay.Agent("Alice", root=team.root).inbox() == []
    r = team("send", "--from", "Broadcast", "--to", "Bob", "--create", "x", ok=False)
    assert error_line(r) == "'Broadcast' means every agent (as '*') and cannot be one agent's name"
    assert not (team.state / "outbox" / "Broadcast").exists()
