"""What one hostile node, holding only its own credentials (its ACL user), can make the others pay:
each attack's work at the honest node is counted (rows published again, events, Redis commands
as the server's INFO commandstats counts them, SQL statements), never timed. Against a real
redis-server."""
import shlex

import orjson
import pytest

from fednodes import (MISSING, REDIS_SERVER, Node, RedisServer, admin, as_node, exchange, server,  # noqa: F401 - fixtures
                      team, user_url)
from relay.federation.keys import Keys, acl

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=MISSING)


@pytest.fixture
def nodes(tmp_path, clock):
    made = []

    def make(server, team, name, agents, extra=""):
        node = Node(tmp_path / name, user_url(server, team, name), team, name, agents, clock, extra)
        made.append(node)
        return node
    yield make
    for n in made:
        n.close()


def calls(server, *commands):
    """How many times the server ran each of `commands` so far (INFO commandstats)."""
    stats = admin(server).info("commandstats")
    return {c: stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in commands}


def events(node, event, detail="%"):
    return node.relay.history.db.execute("SELECT count(*) FROM events WHERE event = ? AND detail LIKE ?",
                                         (event, detail)).fetchone()[0]


def sent(n1, count, to="Bob"):
    for i in range(count):
        n1.drop("Ann", f"m{i}", f"TO: {to}\n\nnumber {i}")
    n1.send()


# -- 1. the republish storm ------------------------------------------------------------------

def test_entries_a_receiver_deletes_are_published_again_alone_and_their_events_bounded(server, team, nodes, clock):
    """n2 never acknowledges and deletes one entry of n1's stream to it every second (XDEL, its
    ACL's relief right): n1 publishes again the entries deleted, never the whole backlog, and
    reads the stream whole at most at a pace that slows while the deletions go on."""
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    sent(n1, 60)
    evil, stream = as_node(server, team, "n2"), Keys(team).messages("n1", "n2")
    assert evil.xlen(stream) == 60
    deleted = 0
    for second in range(20):
        [(eid, _)] = evil.xrange(stream, count=1)
        evil.xdel(stream, eid)
        deleted += 1
        clock.advance(1)
        n1.link.check()
        n1.link.publish()
        assert events(n1, "republished") <= deleted
    assert 1 <= events(n1, "republished") <= deleted
    clock.advance(120)                      # the deletions stopped: what was deleted goes again
    n1.link.check()
    n1.link.publish()
    assert evil.xlen(stream) == 60
    assert events(n1, "republished", "%the server lost it") == deleted     # (the rest: n2's deadline passed)


def test_a_receiver_deleting_its_whole_stream_again_and_again_costs_a_bounded_resend(server, team, nodes, clock):
    """Every entry deleted every second for a minute: the backlog goes again a few times (each
    loss found at a pace that slows), and the per-row events of publishing again are bounded per
    node and minute (one summary line beyond them)."""
    EVENTS = 64
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    sent(n1, 200)
    evil, stream = as_node(server, team, "n2"), Keys(team).messages("n1", "n2")
    before = n1.relay.history.db.execute("SELECT count(*) FROM events").fetchone()[0]
    for second in range(60):
        ids = [eid for eid, _ in evil.xrange(stream)]
        if ids:
            evil.xdel(stream, *ids)
        clock.advance(1)
        n1.link.check()
        n1.link.publish()
    again = n1.relay.history.db.execute("SELECT sum(attempts) - count(*) FROM outbound").fetchone()[0]
    assert again <= 200 * 7                 # found lost at 1, 2, 4, 8, 16, 32 s: not 60 times
    grown = n1.relay.history.db.execute("SELECT count(*) FROM events").fetchone()[0] - before
    assert grown <= 2 * 2 * EVENTS + 20     # republished + published, per row up to EVENTS a minute
    assert events(n1, "republished") <= 2 * EVENTS + 10


def test_a_receiver_deleting_one_entry_a_second_costs_a_bounded_read_a_look_whatever_the_backlog(
        server, team, nodes, clock):
    """n2 never acknowledges 3,000 messages and deletes the oldest entry of its stream every
    second: n1 looks through its stream a window at a time (at most WINDOW entries a look), never
    the whole backlog at a look, and still publishes again each entry deleted."""
    from relay.federation.losses import WINDOW
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    sent(n1, 3000)
    published_all(n1)
    evil, stream = as_node(server, team, "n2"), Keys(team).messages("n1", "n2")
    assert evil.xlen(stream) == 3000
    [(_, fields)] = evil.xrange(stream, count=1)
    entry = sum(len(k) + len(v) for k, v in fields.items()) + 64        # one entry's reply, about
    out = lambda: admin(server).info("stats")["total_net_output_bytes"]  # noqa: E731
    before, deleted = out(), []
    for second in range(10):
        [(eid, _)] = evil.xrange(stream, count=1)
        evil.xdel(stream, eid)
        deleted.append(eid)
        clock.advance(1)
        n1.link.check()
        published_all(n1)
    assert out() - before <= 10 * WINDOW * entry + (256 << 10)
    for _ in range(3000 // WINDOW + 2):     # the deletions stopped: the sweep goes on to its end
        clock.advance(1)
        n1.link.check()
        published_all(n1)
    assert evil.xlen(stream) == 3000
    assert events(n1, "republished", "%the server lost it") == 10


def published_all(node):
    while node.link.publish():
        pass


def republished(node):
    return node.relay.history.db.execute("SELECT coalesce(sum(attempts) - count(*), 0) FROM outbound").fetchone()[0]


def test_a_node_that_never_acknowledges_has_its_late_rows_published_again_ever_more_rarely(server, team, nodes, clock):
    """n2 announces itself (alive) and never reads nor acknowledges 1,500 messages n1 sent it:
    past their deadline n1 publishes them again in rounds of at most ROUND rows of that node and
    at most PER_MINUTE a minute, further and further apart while n2 stays silent; never its
    whole backlog every few seconds."""
    from relay.federation.late import PER_MINUTE, ROUND
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    sent(n1, 1500)
    published_all(n1)
    assert n1.relay.history.remote.unacknowledged() == {"n2": 1500}
    per_second = []
    for second in range(420):
        clock.advance(1)
        n2.link.heartbeat()                 # alive, and silent
        before = republished(n1)
        n1.link.look()
        n1.link.check()
        published_all(n1)
        per_second.append(republished(n1) - before)
    assert max(per_second) <= ROUND
    assert max(sum(per_second[i:i + 60]) for i in range(len(per_second) - 60)) <= PER_MINUTE
    assert sum(per_second[300:]) <= ROUND               # the sixth minute on: one round at most
    assert sum(per_second) >= PER_MINUTE                # and they do go again


def test_a_silent_nodes_backlog_costs_the_publishers_turn_nothing_in_proportion(server, team, nodes, clock):
    """The publisher's turn (publish what is due, read the acknowledgements, decide when to
    wake) costs the same SQLite work whether a node leaves 100 or 2,100 messages unacknowledged:
    a silent node's backlog is never walked on every message's way (counted in SQLite VM steps)."""
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)

    def turn_cost():
        steps = [0]

        def count():
            steps[0] += 1
        clock.advance(1)
        n1.link.ledger.db.set_progress_handler(count, 10)
        try:
            n1.link.publish()
            n1.link.wake(clock())
        finally:
            n1.link.ledger.db.set_progress_handler(None, 10)
        return steps[0]

    sent(n1, 100)
    published_all(n1)
    small = turn_cost()
    for k in range(2000):
        n1.drop("Ann", f"more{k}", "TO: Bob\n\nmore")
    n1.send()
    published_all(n1)
    assert n1.relay.history.remote.unacknowledged() == {"n2": 2100}
    assert turn_cost() <= 1.5 * small + 50


# -- 3. the acknowledgement flood ------------------------------------------------------------

def test_made_up_acknowledgements_in_bulk_cost_one_lookup_a_batch_and_touch_no_row(server, team, nodes, clock):
    """n3 writes 32,768 acknowledgements of fresh, well-formed ids n1 never sent it: n1 settles
    n2's genuine one, runs no UPDATE for the made-up ones (they are looked up once a batch and
    dropped), holds none of them for later, and takes at most its per-second share of n3's."""
    from relay.federation.publisher import ACKS_PER_SECOND
    from relay.ids import IdGenerator
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    n3 = nodes(server, team, "n3", ["Eve"])
    exchange(n1, n2, n3, rounds=1)
    evil, ids = as_node(server, team, "n3"), IdGenerator()
    for _ in range(4):
        evil.xadd(Keys(team).acks("n3", "n1"), {"acks": orjson.dumps([[ids.new(clock()), f"{i}-1", None]
                                                                       for i in range(8192)])})
    n1.drop("Ann", "m", "TO: Bob\n\nacknowledged beside a flood")
    n1.send()
    n2.receive()
    n2.link.incoming.acknowledge()
    statements = []
    n1.link.ledger.db.set_trace_callback(statements.append)
    for _ in range(10):
        clock.advance(0.1)
        n1.link.publish()
    n1.link.ledger.db.set_trace_callback(None)
    assert n1.relay.history.remote.outbound_counts()["acknowledged"] == 1
    assert sum(s.lstrip().upper().startswith("UPDATE OUTBOUND") for s in statements) == 1
    assert not n1.link.publisher.early_acks.get("n3")
    cursor = n1.link.publisher.cursors.get("n3", "0-0")
    read = [eid for eid, _ in admin(server).xrange(Keys(team).acks("n3", "n1"), "-", cursor)] if cursor != "0-0" else []
    assert len(read) * 8192 <= 2 * ACKS_PER_SECOND         # 1 s: one second's share (and one entry over it)


def test_acknowledgement_entries_too_large_together_are_read_one_at_a_time_within_the_share(server, team, nodes,
                                                                                             clock):
    """n3 writes 40 entries of 8,192 made-up acknowledgements each (about 14 MB, over what one
    read takes): n1 reads them an entry at a time and no further than n3's share of the second,
    not the whole backlog again at every call; n2's genuine acknowledgement settles meanwhile."""
    from relay.ids import IdGenerator
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    n3 = nodes(server, team, "n3", ["Eve"])
    exchange(n1, n2, n3, rounds=1)
    evil, ids = as_node(server, team, "n3"), IdGenerator()
    entry = orjson.dumps([[ids.new(clock()), f"{i}-1", None] for i in range(8192)])
    for _ in range(40):
        evil.xadd(Keys(team).acks("n3", "n1"), {"acks": entry})
    n1.drop("Ann", "m", "TO: Bob\n\nacknowledged beside a flood")
    n1.send()
    n2.receive()
    out = lambda: admin(server).info("stats")["total_net_output_bytes"]  # noqa: E731
    before = out()
    for _ in range(10):
        clock.advance(0.1)
        n1.link.publish()
    assert n1.relay.history.remote.outbound_counts()["acknowledged"] == 1
    assert out() - before <= 3 * len(entry) + (256 << 10)


def test_a_node_whose_acknowledgements_are_made_up_has_its_share_shrink_and_an_honest_one_keeps_it(
        server, team, nodes, clock):
    """n3 keeps 40 entries of 8,192 made-up acknowledgements in its stream: each batch found
    made up halves its share (down to FLOOR a second), so ten seconds read a few of its entries,
    not one a second; n2's acknowledgements, all genuine, are each read at the next call."""
    from relay.federation.ackgate import ACKS_PER_SECOND
    from relay.ids import IdGenerator
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    n3 = nodes(server, team, "n3", ["Eve"])
    exchange(n1, n2, n3, rounds=1)
    evil, ids, acks = as_node(server, team, "n3"), IdGenerator(), Keys(team).acks("n3", "n1")
    for _ in range(40):
        evil.xadd(acks, {"acks": orjson.dumps([[ids.new(clock()), f"{i}-1", None] for i in range(8192)])})
    for second in range(10):
        n1.drop("Ann", f"m{second}", f"TO: Bob\n\nnumber {second}")
        n1.send()
        n2.receive()
        for _ in range(10):
            clock.advance(0.1)
            n1.link.publish()
        assert n1.relay.history.remote.outbound_counts()["acknowledged"] == second + 1
    read = len(admin(server).xrange(acks, "-", n1.link.publisher.cursors["n3"]))
    assert read * 8192 <= 4 * 8192 < 10 * ACKS_PER_SECOND


# -- 2. the keyspace flood -------------------------------------------------------------------

def test_keys_a_node_stores_under_its_own_prefix_cost_no_other_node_a_walk_of_them(server, team, nodes, clock):
    """n3 stores 60,000 keys under its own prefix: n1's look at the directory makes the same few
    SCAN calls whatever the server holds (the registry is read with one SMEMBERS), and a node the
    operator registers is found at the next look."""
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    evil = as_node(server, team, "n3")
    pipe = evil.pipeline(transaction=False)
    for i in range(60_000):
        pipe.hset(f"relay:{{{team}}}:from:n3:junk:{i}", "x", "1")
    pipe.execute()
    before = calls(server, "scan", "smembers")
    for _ in range(5):
        clock.advance(1)
        assert n1.link.look()
    after = calls(server, "scan", "smembers")
    assert after["scan"] - before["scan"] <= 5 * 4 and after["smembers"] - before["smembers"] == 5
    n4 = nodes(server, team, "n4", ["Dee"])
    n4.link.heartbeat()
    clock.advance(1)
    n1.link.look()
    assert n1.link.directory.routes["Dee"] == "n4"


# -- 4. the unknown-sender flood -------------------------------------------------------------

def test_entries_from_names_nobody_announced_read_the_teams_lists_at_most_once_a_second(server, team, nodes, clock):
    """n3 writes an entry from a name nobody announced every 20 ms for two seconds: n2 reads the
    team's lists at most once a second (not once a batch), refuses each entry, and a name n1
    announces meanwhile is delivered from within the second."""
    from relay.ids import IdGenerator
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    n3 = nodes(server, team, "n3", ["Eve"])
    exchange(n1, n2, n3, rounds=1)
    evil, ids, stream = as_node(server, team, "n3"), IdGenerator(), Keys(team).messages("n3", "n2")
    before = calls(server, "hget", "scan", "smembers")
    for k in range(100):
        mid = ids.new(clock())
        evil.xadd(stream, {"v": "2", "id": mid, "to": '["Bob"]', "env": orjson.dumps({
            "id": mid, "from": f"Nobody{k}", "to": ["Bob"], "kind": "message", "body": "x", "sha256": "0" * 64,
            "headers": {}})})
        clock.advance(0.02)
        n2.receive()
    clock.advance(1)
    n2.receive()
    after = calls(server, "hget", "scan", "smembers")
    assert after["scan"] == before["scan"]
    assert after["smembers"] - before["smembers"] <= 4          # 2 s of flood: a read each second, at most
    assert after["hget"] - before["hget"] <= 4 * 3 * 2          # each read: 3 versions, lists only when changed
    refused = n2.relay.history.db.execute("SELECT count(*) FROM messages WHERE node = 'n3' AND status = 'failed' "
                                          "AND error LIKE '%not in the team''s directory%'").fetchone()[0]
    assert refused == 100 and n2.held("Bob") == []


# -- 6. the first issue's rules for entries from other nodes ---------------------------------

def test_messages_from_another_node_shed_keep_a_kib_of_body_and_few_of_them_even_that(server, team, nodes, clock):
    """Bob's queue is full (queue_limit = 1): 40 messages of 64 KiB from n1 are shed at n2. The
    ledger keeps of each its headers, size and hash and at most the first KiB of its body, and a
    body at all for at most SHED_BODIES of one sender in a window: not 40 x 64 KiB."""
    from relay.ledger.shed_keep import KEEP_BODY_BYTES, SHED_BODIES
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"], extra="queue_limit = 1")
    exchange(n1, n2, rounds=1)
    big = "x" * (64 << 10)
    for i in range(41):
        n1.drop("Ann", f"m{i}", f"TO: Bob\n\n{i} {big}")
    n1.send()
    while n2.receive():
        pass
    rows = n2.relay.history.db.execute("SELECT body, sha256 FROM messages WHERE node = 'n1' AND status = 'failed'"
                                       ).fetchall()
    assert len(rows) == 40 and len(n2.held("Bob")) == 1
    kept = [len((r["body"] or "").encode()) for r in rows]
    assert max(kept) <= KEEP_BODY_BYTES and sum(1 for k in kept if k) <= SHED_BODIES
    assert all(r["sha256"] for r in rows)


def test_a_node_speaking_as_system_in_any_case_is_refused(server, team, nodes, clock):
    """n3 lists SYSTEM (then system, then sYsTeM) among its agents, alone of its spelling, and
    writes from it: none is taken as n3's, none is delivered (as System or otherwise), each is
    refused as relay's own name."""
    n2 = nodes(server, team, "n2", ["Bob"])
    n3 = nodes(server, team, "n3", ["Eve"])
    exchange(n2, n3, rounds=1)
    evil, keys = as_node(server, team, "n3"), Keys(team)
    for k, spelling in enumerate(("SYSTEM", "system", "sYsTeM")):
        evil.hset(keys.node("n3"), mapping={"agents": orjson.dumps(["Eve", spelling]), "v": f"with-system-{k}"})
        clock.advance(1)
        n2.link.look()
        assert spelling not in n2.link.directory.routes
        mid = n2.relay.ids.new(clock())
        evil.xadd(keys.messages("n3", "n2"), {"v": "2", "id": mid, "to": '["Bob"]', "env": orjson.dumps({
            "id": mid, "from": spelling, "to": ["Bob"], "kind": "message", "body": "stop", "sha256": "0" * 64,
            "headers": {}})})
        clock.advance(1)
        while n2.receive():
            pass
    assert n2.held("Bob") == []
    why = [r[0] for r in n2.relay.history.db.execute("SELECT error FROM messages WHERE node = 'n3' AND "
                                                     "status = 'failed'")]
    assert len(why) == 3 and all("reserved" in w or "relay's own" in w or "keeps for itself" in w for w in why), why


def test_per_row_events_of_publishing_again_refill_a_minute_after_the_minute_began_though_calls_keep_coming():
    """Losses.quiet() counts EVENTS per node from the start of a minute: rows published again
    every 10 s use them up, and once 60 s have passed since that minute began they are all there
    again (a minute's start is not moved on by each call)."""
    from relay.federation.losses import EVENTS, Losses
    losses = Losses(client=None, keys=None, node="n1", history=None)
    hushed = {t: losses.quiet("n2", float(t), EVENTS // 4) for t in range(0, 130, 10)}
    assert [hushed[t] for t in (0, 10, 20, 30)] == [0, 0, 0, 0]                 # EVENTS used up by 30 s
    assert [hushed[t] for t in (40, 50)] == [EVENTS // 4] * 2                     # past them: no event of their own
    assert hushed[60] == 0                                                         # a new minute: events again
    assert [hushed[t] for t in (70, 80, 90, 100, 110)] == [0, 0, 0, EVENTS // 4, EVENTS // 4]
    assert hushed[120] == 0
    assert losses.quiet("n3", 120.0, EVENTS + 5) == 5                              # each node its own quota


def test_a_node_that_answered_once_then_fell_silent_has_its_rounds_spaced_further_apart_again():
    """Late.due(): a round right after an answer comes at QUIET_BASE; each later round while the
    node stays silent doubles the wait (the answer counts for one round, not for ever)."""
    from relay.federation.late import QUIET_BASE, Late

    class Waiting:              # one node, always with rows past their deadline
        def waiting_nodes(self):
            return ["n2"]

        def overdue(self, now, limit, node):
            return [{"message_id": f"m{now}"}]

    class History:
        remote = Waiting()
    late = Late(History())
    late.answered("n2")
    rounds, now = [], 0.0
    while len(rounds) < 5:
        if late.due(now, {"n2": True}):
            rounds.append(now)
        now += 0.5
    assert [b - a for a, b in zip(rounds, rounds[1:])] == [QUIET_BASE, 2 * QUIET_BASE, 4 * QUIET_BASE, 8 * QUIET_BASE]


def test_an_idle_acknowledgement_stream_saves_up_no_more_than_a_seconds_share():
    """AckGate.share(): a stream unread for a minute may take one second's share, not sixty."""
    from relay.federation.ackgate import ACKS_PER_SECOND, AckGate
    gate = AckGate(history=None, per_call=100 * ACKS_PER_SECOND)
    key = "relay:{t}:from:n2:ack:n1"
    gate.owe({key: 0}, 0.0)
    assert gate.share(key, 0.5) == ACKS_PER_SECOND / 2
    assert gate.share(key, 60.0) == ACKS_PER_SECOND
