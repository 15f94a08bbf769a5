"""Who may send: with `senders = "declared"` only the agents an operator or an agent declared are
read, and an unknown outbox waits with the reason; in either mode a recipient's queue_limit is
shared between its senders, so made-up senders cannot take the room a real one needs."""
import json
import os

import pytest
from conftest import error_line

import relay
from relay.errors import ConfigError


def flood(project, senders, n, to="Bob"):
    for s in senders:
        for i in range(n):
            project.drop(s, f"m{i}", f"TO: {to}\n\n{s} says {i}")


def bodies(project, agent):
    return sorted(e["body"] for e in project.inbox(agent))


def test_made_up_senders_under_pair_rate_do_not_take_the_room_a_real_sender_needs(project):
    """Four made-up senders, each under pair_rate, filled Bob's queue_limit: Ann's "prod is
    down" was then shed and failed."""
    r = project.relay(agents=("Ann", "Bob"), queue_limit=8, pair_rate=5)
    flood(project, ["M1", "M2", "M3", "M4"], 4)
    first = r.drain()
    assert first.shed > 0                               # the flood is still stopped ...
    project.drop("Ann", "alert", "TO: Bob\n\nprod is down")
    r.drain()
    assert "prod is down" in bodies(project, "Bob")     # ... and Ann's message gets through
    [row] = [row for row in r.history.audit() if row["sender"] == "Ann"]
    assert row["status"] == "archived" and r.history.sheds(row["id"]) == []


def test_a_sender_over_its_share_of_a_full_queue_is_shed_one_under_it_is_not(project):
    r = project.relay(agents=("Ann", "Bob", "Cy"), queue_limit=6)
    flood(project, ["Ann"], 10)
    r.drain()
    assert len(project.inbox("Bob")) == 6               # alone, Ann's share is the whole queue
    flood(project, ["Cy"], 4)
    project.clock.advance(1)
    r.drain()
    # Cy's share of the full queue is half of it (two senders): 3 of its 4 get in, Ann's more do not
    assert [b for b in bodies(project, "Bob") if b.startswith("Cy")] == ["Cy says 0", "Cy says 1", "Cy says 2"]
    project.drop("Ann", "more", "TO: Bob\n\nmore")
    project.clock.advance(1)
    r.drain()
    assert "more" not in bodies(project, "Bob")
    [row] = [row for row in r.history.audit() if row["name"] == "more"]
    [shed] = r.history.sheds(row["id"])
    assert shed["reason"] == "queue_limit" and "its share" in row["error"]


def test_in_declared_mode_an_unknown_outbox_waits_with_the_reason(project, cli, caplog):
    (project.state).mkdir()
    (project.state / "relay.toml").write_text('senders = "declared"\nagents = ["Ann", "Bob"]\n')
    r = project.relay(agents=("Ann", "Bob"))
    flood(project, ["M1"], 3)
    project.drop("Ann", "alert", "TO: Bob\n\nprod is down")
    counts = r.drain()
    assert bodies(project, "Bob") == ["prod is down"] and counts.registered == 1
    assert sorted(p.name for p in (project.state / "outbox" / "M1").iterdir()) == ["m0", "m1", "m2"]
    assert any("outbox/M1" in m and "not a declared agent" in m for m in caplog.messages)
    doctor = cli("doctor", "--json", ok=False)
    assert any(p.startswith("outbox/M1: not a declared agent") and "3 file(s) wait" in p
               for p in json.loads(doctor.output)["problems"])
    status = json.loads(cli("status", "--json", ok=False).output)
    assert status["undeclared"] == [{"agent": "M1", "waiting": 3}]
    # the operator declares it: what waited is delivered
    cli("init", "--agent", "M1")
    project.clock.advance(60)
    r.drain()
    assert len(project.inbox("Bob")) == 4 and not list((project.state / "outbox" / "M1").iterdir())


def test_agents_made_by_send_create_and_the_api_are_declared(cli):
    cli("init", "--agent", "Ann", "--agent", "Bob")
    (cli.state / "relay.toml").write_text('senders = "declared"\n')
    cli("send", "--from", "New", "--to", "Bob", "--create", "hello from New")
    relay.Agent("Api", root=cli.root, create=True).send("Bob", "hello from Api")
    made_up = cli.state / "outbox" / "Fake"
    made_up.mkdir()
    (made_up / "m").write_text("TO: Bob\n\nhello from Fake")
    cli("run", "--once")
    assert sorted(m.body for m in relay.Agent("Bob", root=cli.root).inbox()) == ["hello from Api", "hello from New"]
    assert (made_up / "m").exists()


@pytest.mark.parametrize("toml, match", [
    ('senders = "some"', "bad value for 'senders'"),
    ('sender = "declared"', "unknown configuration key 'sender' .*did you mean senders\\?"),
])
def test_the_senders_key_is_checked(tmp_path, toml, match):
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay/relay.toml").write_text(toml)
    with pytest.raises(ConfigError, match=match):
        relay.load(tmp_path, env={})


def test_a_misspelt_senders_key_stops_the_daemon_with_a_did_you_mean(cli):
    cli("init")
    (cli.state / "relay.toml").write_text('sendrs = "declared"\n')
    r = cli("run", "--once", ok=False)
    assert r.exit_code == 1 and "did you mean senders?" in error_line(r)
    assert os.path.exists(cli.state / "relay.toml")
