"""A request id repeated at once is recognised. The check sees what is still in
the outbox (the ledger records a send's request id with its id, before the file is written), and
a message that repeats one reads as a duplicate in `relay show` and `relay audit`, not as
delivered."""
import errno
import json
import threading

from conftest import failing_create

import relay
from relay.core.daemon import Relay
from relay import config as config_mod


def drain(root):
    with Relay(config_mod.load(root, env={})) as r:
        return r.drain()


def test_a_request_id_repeated_at_once_returns_the_first_id(team):
    a = relay.Agent("Alice", root=team.root)
    one = a.send("Bob", "deploy please", request_id="R2")
    assert not a.repeated
    two = a.send("Bob", "deploy please", request_id="R2")         # relay has not run: one is in the outbox
    assert two == one and a.repeated
    assert [p.name for p in (team.state / "outbox/Alice").iterdir()] == [f"msg-{one.lower()}"]
    r = team("send", "--from", "Alice", "--to", "Bob", "--request-id", "R2", "again")
    assert r.stdout.strip() == one and "was sent before" in r.stderr
    drain(team.root)
    assert [m.id for m in relay.Agent("Bob", root=team.root).inbox()] == [one]


def test_concurrent_sends_with_one_request_id_write_one_message(team):
    ids, start = [], threading.Barrier(4)

    def send():
        agent = relay.Agent("Alice", root=team.root)
        start.wait()
        ids.append(agent.send("Bob", "once", request_id="R3"))
        agent.close()
    threads = [threading.Thread(target=send) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 1 and len(list((team.state / "outbox/Alice").iterdir())) == 1


def test_a_request_id_whose_message_failed_before_it_was_read_may_be_sent_again(team):
    a = relay.Agent("Alice", root=team.root)
    first = a.send("Bob", "x", request_id="R4")
    (team.state / "outbox/Alice" / f"msg-{first.lower()}").write_bytes(b"\xff not utf-8")     # fails unread
    drain(team.root)
    assert json.loads(team("show", first, "--json").stdout)["status"] == "failed"
    again = a.send("Bob", "x", request_id="R4")
    assert again != first and not a.repeated


def test_a_duplicate_reads_as_one_in_show_and_audit(team):
    a = relay.Agent("Alice", root=team.root)
    one = a.send("Bob", "deploy please", subject="deploy", request_id="R5")
    drain(team.root)
    (team.state / "outbox/Alice/by-hand").write_text("TO: Bob\nREQUEST-ID: R5\nSUBJECT: deploy\n\nagain")
    drain(team.root)
    rows = json.loads(team("audit", "--json").stdout)
    dup = next(r for r in rows if r["id"] != one)
    assert dup["duplicate_of"] == one and dup["delivered_at"] is None
    table = team("audit").stdout.splitlines()
    assert "duplicate" in next(line for line in table if line.startswith(dup["id"]))
    assert "duplicate" not in next(line for line in table if line.startswith(one))
    text = team("show", dup["id"]).stdout
    assert f"duplicate of {one}" in text and "not delivered" in text and "deliveries:" not in text
    doc = json.loads(team("show", dup["id"], "--json").stdout)
    assert doc["deliveries"] == [] and doc["delivered_at"] is None and doc["duplicate_of"] == one
    assert team("verify").exit_code == 0


def test_a_request_id_whose_message_failed_in_delivery_may_be_sent_again_despite_its_duplicate(project):
    """Ann's first message with a request id failed on the way to Ben after a second file had
    repeated it: `send` with that request id writes a new message, it does not answer with the
    duplicate's id."""
    r = project.relay(max_retries=0, retry_period="0s")
    switch = failing_create(r, OSError(errno.EACCES, "Permission denied"), lambda rel: rel.startswith("inbox/Ben/"))
    project.drop("Ann", "a", "TO: Ben\nREQUEST-ID: R9\n\nfirst")
    project.drop("Ann", "b", "TO: Ben\nREQUEST-ID: R9\n\nagain")
    r.drain()
    rows = {row["name"]: row for row in r.history.audit() if row["sender"] == "Ann"}
    assert rows["a"]["status"] == "failed" and rows["b"]["duplicate_of"] == rows["a"]["id"]
    switch["on"] = False
    a = relay.Agent("Ann", root=project.root)
    third = a.send("Ben", "third", request_id="R9")
    assert not a.repeated and third not in (rows["a"]["id"], rows["b"]["id"])
    project.clock.advance(1)
    r.drain()
    assert [e["body"] for e in project.inbox("Ben")] == ["third"]


def test_waiting_for_a_duplicate_is_waiting_for_the_first_message_it_repeats(team):
    from relay.agent.delivery import wait_delivered
    with relay.Agent("Alice", root=team.root) as a:
        one = a.send("Bob", "deploy please", request_id="R7")
        drain(team.root)
        (team.state / "outbox/Alice/by-hand").write_text("TO: Bob\nREQUEST-ID: R7\n\nagain")
        drain(team.root)
        dup = next(r["id"] for r in json.loads(team("audit", "--json").stdout) if r["id"] != one)
        got = wait_delivered(a.project, dup, 0)
        assert (got.id, got.delivered, got.reason) == (dup, True, None)


def test_waiting_for_a_duplicate_of_a_failed_message_says_the_first_ones_failure(project):
    from relay.agent.delivery import wait_delivered
    r = project.relay(max_retries=0, retry_period="0s")
    failing_create(r, OSError(errno.EACCES, "Permission denied"), lambda rel: rel.startswith("inbox/Ben/"))
    project.drop("Ann", "a", "TO: Ben\nREQUEST-ID: R9\n\nfirst")
    project.drop("Ann", "b", "TO: Ben\nREQUEST-ID: R9\n\nagain")
    r.drain()
    rows = {row["name"]: row for row in r.history.audit() if row["sender"] == "Ann"}
    with relay.Agent("Ann", root=project.root) as a:
        first, dup = wait_delivered(a.project, rows["a"]["id"], 0), wait_delivered(a.project, rows["b"]["id"], 0)
    assert first.delivered is False and "Permission denied" in first.reason
    assert (dup.id, dup.delivered, dup.reason) == (rows["b"]["id"], False, first.reason)
