"""relay queues: each column, per agent and per pair, worst queue first."""
import json
import os

from conftest import failing_create
from relay.operator import queues
from relay.operator import roster
from relay.core.message import iso


def project_now(relay, now):
    return queues.project(relay.history, relay.layout, relay.known_agents(refresh=True), now)


def test_each_column_per_agent_and_per_pair(project, clock):
    relay = project.relay(queue_limit=2)
    t0 = clock.now
    # Ben: two unread from Ann (the second one fills his queue), one shed by queue_limit
    project.drop("Ann", "a1", "TO: Ben\n\na1")
    relay.drain()
    t_a2 = clock.advance(2)
    project.drop("Ann", "a2", "TO: Ben\n\na2")
    relay.hint("rescan")
    relay.step(t_a2)
    project.drop("Ann", "a3", "TO: Ben\n\na3 is shed")
    relay.hint("rescan")
    relay.step(clock.advance(5))
    t_cy = clock.advance(5)
    # Cy: one pending from Ann (its inbox fails), one unread from Ben
    project.drop("Ben", "b1", "TO: Cy\n\nb1")
    relay.hint("rescan")
    relay.step(t_cy)
    switch = failing_create(relay, PermissionError(13, "Permission denied"), lambda rel: rel.startswith("inbox/Cy/"))
    project.drop("Ann", "c1", "TO: Cy\n\nc1")
    relay.hint("rescan")
    relay.step(clock.advance(1))
    assert switch["on"]
    now = clock.advance(100)
    doc = project_now(relay, now)
    agents = {r["agent"]: r for r in doc["agents"]}
    pairs = {(r["from"], r["to"]): r for r in doc["pairs"]}

    ben = agents["Ben"]
    assert (ben["pending"], ben["unread"], ben["depth"]) == (0, 2, 2)
    assert ben["oldest_unread_age_s"] == round(now - t0, 3)            # a1's, the older of the two
    assert ben["last_delivery"] == iso(t_a2)
    assert ben["shed"]["queue_limit"] == 1 and ben["archived"] is None and ben["ping"] is None
    ann_ben = pairs[("Ann", "Ben")]
    assert (ann_ben["pending"], ann_ben["unread"], ann_ben["depth"]) == (0, 2, 2)
    assert ann_ben["shed"] == {"body_size": 0, "per_pair_rate": 0, "queue_limit": 1, "recipient_archived": 0}

    cy = agents["Cy"]
    assert (cy["pending"], cy["unread"], cy["depth"]) == (1, 1, 2)
    assert cy["oldest_unread_age_s"] == round(now - t_cy, 3) and cy["last_delivery"] == iso(t_cy)
    assert (pairs[("Ann", "Cy")]["pending"], pairs[("Ann", "Cy")]["unread"]) == (1, 0)
    assert pairs[("Ann", "Cy")]["last_delivery"] is None
    assert (pairs[("Ben", "Cy")]["pending"], pairs[("Ben", "Cy")]["unread"]) == (0, 1)

    # worst first: depth, then the oldest unread
    assert [r["agent"] for r in doc["agents"]][:2] == ["Ben", "Cy"]
    assert [(r["from"], r["to"]) for r in doc["pairs"]][0] == ("Ann", "Ben")
    assert doc["pairs"][-1]["depth"] <= doc["pairs"][0]["depth"]

    # Ben reads one: the queue is shallower, the oldest unread is the other
    first = sorted((project.state / "inbox/Ben/new").iterdir())[0]
    os.rename(first, project.state / "inbox/Ben/cur" / first.name)
    ben = {r["agent"]: r for r in project_now(relay, now)["agents"]}["Ben"]
    assert ben["unread"] == 1 and ben["oldest_unread_age_s"] == round(now - t_a2, 3)


def test_ping_column_waiting_then_read(project, clock):
    relay = project.relay()
    sent = clock.now
    roster.ping(relay.ledger, relay.layout, "Ben", "operator:test", now=sent)
    row = {r["agent"]: r for r in project_now(relay, sent + 30)["agents"]}["Ben"]
    assert row["ping"]["state"] == "waiting" and row["ping"]["age_s"] == 30
    assert row["unread"] == 1 and row["oldest_unread_age_s"] == 30         # a ping waits like any message
    [env] = (project.state / "inbox/Ben/new").iterdir()
    assert json.loads(env.read_text())["id"] == row["ping"]["id"]
    os.rename(env, project.state / "inbox/Ben/cur" / (env.name + ":2,S"))
    taken = (project.state / "inbox/Ben/cur" / (env.name + ":2,S")).stat().st_ctime
    row = {r["agent"]: r for r in project_now(relay, sent + 60)["agents"]}["Ben"]
    assert row["ping"]["state"] == "read" and row["ping"]["read_after_s"] == round(max(0.0, taken - sent), 3)
    assert row["unread"] == 0


def test_queues_cli_table_and_json(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    assert "(no traffic yet)" in cli("queues").output
    box = cli.state / "outbox/Ann"
    (box / "m").write_text("TO: Ben\n\nhello")
    os.utime(box / "m", (1_700_000_000, 1_700_000_000))
    cli("run", "--once", "-q")
    doc = json.loads(cli("queues", "--json").output)
    assert doc["agents"][0]["agent"] == "Ben" and doc["agents"][0]["depth"] == 1
    assert doc["pairs"] == [{**doc["pairs"][0], "from": "Ann", "to": "Ben", "unread": 1, "pending": 0, "depth": 1}]
    table = cli("queues").output
    assert "Ann -> Ben" in table and table.index("Ben ") < table.index("Ann ")
