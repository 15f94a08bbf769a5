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


import pytest  # noqa: E402


@pytest.mark.parametrize("seconds, said", [(None, ""), (0, "0s"), (59.9, "59s"), (60, "1m00s"), (61, "1m01s"),
                                           (3599, "59m59s"), (3600, "1h00m"), (3660, "1h01m"), (86399, "23h59m"),
                                           (86400, "1d00h"), (90000, "1d01h")])
def test_an_age_in_the_queues_table_is_said_in_its_largest_unit_from_one_of_it(seconds, said):
    from relay.operator.views import age
    assert age(seconds) == said


def test_a_ping_is_said_read_in_its_time_unread_for_its_age_or_by_its_state():
    from relay.operator.views import ping
    assert ping(None) == "" and ping({}) == ""
    assert ping({"state": "read", "read_after_s": 4}) == "read in 4s"
    assert ping({"state": "waiting", "age_s": 120}) == "unread 2m00s"
    assert ping({"state": "gone"}) == "gone"


def test_a_ping_read_among_other_read_messages_is_found_and_one_deleted_or_without_cur_is_gone(project, clock):
    """The ping's file is looked for among everything the agent has read; a ping sent by a clock
    ahead of the file's change time is read in 0s, never a negative time; a ping the agent
    deleted, or whose cur/ is gone, is said gone."""
    relay = project.relay()
    cur = project.state / "inbox/Ben/cur"
    for i in range(6):
        (cur / f"0{i}-other.json:2,S").write_text("{}")
        (cur / f"zz{i}-other.json:2,S").write_text("{}")
    sent = clock.now + 3600                     # the ping's clock an hour ahead of the file system's
    roster.ping(relay.ledger, relay.layout, "Ben", "operator:test", now=sent)
    [env] = (project.state / "inbox/Ben/new").iterdir()
    os.rename(env, cur / (env.name + ":2,S"))
    row = {r["agent"]: r for r in project_now(relay, sent + 60)["agents"]}["Ben"]
    assert row["ping"]["state"] == "read" and row["ping"]["read_after_s"] == 0.0
    assert queues_ping_word(relay, sent) == "read in 0s"
    (cur / (env.name + ":2,S")).unlink()
    row = {r["agent"]: r for r in project_now(relay, sent + 60)["agents"]}["Ben"]
    assert row["ping"]["state"] == "gone" and row["ping"]["id"] == env.name.removesuffix(".json")
    for f in cur.iterdir():
        f.unlink()
    cur.rmdir()
    row = {r["agent"]: r for r in project_now(relay, sent + 60)["agents"]}["Ben"]
    assert row["ping"]["state"] == "gone"


def queues_ping_word(relay, now):
    from relay.operator.views import ping
    return ping({r["agent"]: r for r in project_now(relay, now + 60)["agents"]}["Ben"]["ping"])


def test_an_envelope_relay_never_delivered_counts_for_its_agent_by_its_file_time_and_in_no_pair(project, clock):
    """A file named like an envelope put into new/ by hand waits for its agent like any (its age
    from the file's time), but no sender is known: it makes no pair. A link, a directory or a
    name that is no id there is no envelope at all; an agent with no inbox has none unread."""
    relay = project.relay()
    project.drop("Ann", "a1", "TO: Ben\n\nhello")
    relay.drain()
    new = project.state / "inbox/Cy/new"
    planted = new / "01M95MNQH6F8RCGWYDRQHFBBC0.json"
    planted.write_text("{}")
    os.utime(planted, (clock.now - 100, clock.now - 100))
    (new / "01M95MNQH6F8RCGWYDRQHFBBC1.json").symlink_to(planted)
    (new / "01M95MNQH6F8RCGWYDRQHFBBC2.json").mkdir()
    (new / "notes.json").write_text("{}")
    import shutil
    shutil.rmtree(project.state / "inbox/Ann")
    doc = project_now(relay, clock.now)
    agents = {r["agent"]: r for r in doc["agents"]}
    assert (agents["Cy"]["unread"], agents["Cy"]["depth"], agents["Cy"]["oldest_unread_age_s"]) == (1, 1, 100.0)
    assert (agents["Ann"]["unread"], agents["Ann"]["oldest_unread_age_s"]) == (0, None)
    assert [(p["from"], p["to"], p["unread"]) for p in doc["pairs"]] == [("Ann", "Ben", 1)]
    assert [r["agent"] for r in doc["agents"]][:2] == ["Cy", "Ben"]     # as deep, the older first


def test_the_queues_table_prints_each_column_an_archived_agent_and_sheds_by_reason_or_a_dash():
    from relay.operator.views import queues as table

    def row(**k):
        return {"pending": 0, "unread": 0, "depth": 0, "oldest_unread_age_s": None, "last_delivery": None,
                "shed": {"queue_limit": 0, "per_pair_rate": 0}, **k}
    doc = {"agents": [row(agent="Ben", archived=None, depth=3, pending=1, unread=2, oldest_unread_age_s=75,
                          last_delivery="2026-01-02T03:04:05.678Z", ping={"state": "waiting", "age_s": 61},
                          shed={"queue_limit": 2, "per_pair_rate": 1}),
                      row(agent="Old", archived="2026-01-01T00:00:00Z")],
           "pairs": [row(**{"from": "Ann", "to": "Ben"}, depth=3, pending=1, unread=2, oldest_unread_age_s=75,
                         last_delivery="2026-01-02T03:04:05.678Z", shed={"queue_limit": 0, "per_pair_rate": 1})]}
    lines = table(doc).splitlines()
    assert lines[1] == (f"{'Ben':<20} {3:>6} {1:>7} {2:>6} {'1m15s':>7}  {'2026-01-02T03:04:05':<19} "
                        f"{'unread 1m01s':<14} queue_limit 2, per_pair_rate 1")
    assert lines[2] == f"{'Old (archived)':<20} {0:>6} {0:>7} {0:>6} {'':>7}  {'':<19} {'':<14} -"
    assert lines[5] == (f"{'Ann -> Ben':<34} {3:>6} {1:>7} {2:>6} {'1m15s':>7}  {'2026-01-02T03:04:05':<19} "
                        "per_pair_rate 1")
    assert "(no traffic yet)" not in lines
    assert table({"agents": [], "pairs": []}).splitlines()[-1] == "(no traffic yet)"


@pytest.mark.parametrize("earlier, later", [("Cy", "Ann"), ("Ann", "Cy")])
def test_an_agents_last_delivery_is_the_latest_of_every_sender_whichever_is_listed_first(project, clock, earlier,
                                                                                        later):
    relay = project.relay()
    project.drop(earlier, "m1", "TO: Ben\n\nearlier")
    relay.drain()
    clock.advance(60)
    project.drop(later, "m2", "TO: Ben\n\nlater")
    relay.drain()
    doc = project_now(relay, clock.now)
    pairs = {(p["from"], p["to"]): p["last_delivery"] for p in doc["pairs"]}
    assert pairs[(later, "Ben")] > pairs[(earlier, "Ben")]
    ben = {r["agent"]: r for r in doc["agents"]}["Ben"]
    assert ben["last_delivery"] == pairs[(later, "Ben")]


def test_queues_as_deep_and_as_old_are_listed_by_name_agents_and_pairs_alike(project, clock):
    relay = project.relay(agents=("Ann", "Ben", "Cy", "Dee"))
    project.drop("Cy", "c1", "TO: Ann\n\nc1")
    project.drop("Ben", "b1", "TO: Dee\n\nb1")
    project.drop("Ben", "b2", "TO: Ann\n\nb2")
    project.drop("Ann", "a1", "TO: Cy\n\na1")
    relay.drain()
    doc = project_now(relay, clock.now + 50)
    assert [(r["from"], r["to"], r["depth"], r["oldest_unread_age_s"]) for r in doc["pairs"]] == [
        ("Ann", "Cy", 1, 50.0), ("Ben", "Ann", 1, 50.0), ("Ben", "Dee", 1, 50.0), ("Cy", "Ann", 1, 50.0)]
    agents = [(r["agent"], r["depth"]) for r in doc["agents"]]
    assert agents[:4] == [("Ann", 2), ("Cy", 1), ("Dee", 1), ("Ben", 0)]
    assert [name for name, depth in agents[3:]] == sorted(name for name, depth in agents[3:])


def test_an_unread_message_delivered_after_the_clock_read_is_zero_seconds_old_never_negative(project, clock):
    relay = project.relay()
    project.drop("Ann", "a1", "TO: Ben\n\nhello")
    relay.drain()
    doc = project_now(relay, clock.now - 100)
    ben = {r["agent"]: r for r in doc["agents"]}["Ben"]
    assert ben["oldest_unread_age_s"] == 0.0 and ben["unread"] == 1
    assert [(p["from"], p["to"], p["oldest_unread_age_s"]) for p in doc["pairs"]] == [("Ann", "Ben", 0.0)]


def test_pairs_as_deep_with_nothing_unread_are_listed_by_sender_then_recipient_whatever_came_first(project, clock):
    relay = project.relay(agents=("Ann", "Ben", "Cy"))
    switch = failing_create(relay, PermissionError(13, "Permission denied"), lambda rel: rel.startswith("inbox/"))
    project.drop("Ann", "a1", "TO: Ben\n\nfirst")
    relay.hint("rescan")
    relay.step(clock.advance(1))
    project.drop("Cy", "c1", "TO: Ann\n\nsecond")
    relay.hint("rescan")
    relay.step(clock.advance(1))
    assert switch["on"]
    doc = project_now(relay, clock.now)
    assert [(p["from"], p["to"], p["pending"], p["depth"]) for p in doc["pairs"]] == [
        ("Ann", "Ben", 1, 1), ("Cy", "Ann", 1, 1)]
