""""Published" is not "delivered": a cross-node message is done at the sender only when its node
acknowledged the durable delivery. Whatever the server loses (a flush, a restart without its
data, an acknowledgement) is published again and delivered once; names the team is still
announcing wait instead of failing; a server refusing writes is still read."""
import shlex
import signal
import time

import orjson
import pytest

from fednodes import MISSING, REDIS_SERVER, RedisServer, exchange, nodes, team  # noqa: F401 - fixtures
from relay.federation.keys import Keys, acl

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=MISSING)






@pytest.fixture
def server(tmp_path):
    s = RedisServer(tmp_path / "redis").start()
    yield s
    s.stop()


def admin(url):
    import redis
    return redis.Redis.from_url(url)


def bodies(node, agent):
    return sorted(e["body"] for e in node.held(agent))


def drain(node):
    """Receive until nothing more waits; the number of entries handled."""
    total = 0
    while (n := node.receive()) > 0:
        total += n
    return total


def states(node):
    return dict(node.link.history.db.execute("SELECT status, count(*) FROM outbound GROUP BY status").fetchall())


def test_a_message_is_done_only_when_its_node_acknowledged_it(server, team, nodes, cli):
    n1 = nodes(server.url, team, "n1", ["Ann"])
    n2 = nodes(server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    n1.drop("Ann", "m", "TO: Bob\n\nhello")
    n1.send()
    assert states(n1) == {"published": 1}
    [row] = orjson.loads(cli("--root", str(n1.root), "audit", "--json").output)
    shown = cli("--root", str(n1.root), "show", row["id"]).output
    assert "waiting for node n2 to acknowledge it" in shown
    status = orjson.loads(cli("--root", str(n1.root), "status", "--json", ok=False).output)["federation"]
    assert status["outbound"]["published"] == 1 and status["outbound"]["by_node"]["n2"]["waiting"] == 1
    n2.receive()
    n1.link.publish()                   # reads the acknowledgement
    assert states(n1) == {"acknowledged": 1}
    assert "acknowledged by node n2" in cli("--root", str(n1.root), "show", row["id"]).output
    assert admin(server.url).xlen(n1.stream("n2")) == 0         # the acknowledged entry is deleted


def test_a_flush_with_a_backlog_for_a_stopped_node_is_published_again_and_delivered_once(server, team, nodes):
    n1 = nodes(server.url, team, "n1", ["Ann"])
    n2 = nodes(server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    for i in range(101):
        n1.drop("Ann", f"m{i}", f"TO: Bob\n\nbacklog {i}")
    n1.send()
    assert states(n1) == {"published": 101}
    admin(server.url).flushall()
    n1.link.heartbeat()
    assert n1.link.check() == 101                               # its stream is shorter than what waits
    n1.link.publish()
    assert drain(n2) == 101
    exchange(n1, n2, rounds=1)
    assert bodies(n2, "Bob") == sorted(f"backlog {i}" for i in range(101))
    assert states(n1) == {"acknowledged": 101}


def test_a_restart_without_its_data_is_a_new_server_and_everything_waiting_goes_again(tmp_path, team, nodes):
    server = RedisServer(tmp_path / "redis", appendfsync="no")
    server.start()
    try:
        n1 = nodes(server.url, team, "n1", ["Ann"])
        n2 = nodes(server.url, team, "n2", ["Bob"])
        exchange(n1, n2, rounds=1)
        n1.link.check()                                         # the server's run id, known
        for i in range(5):
            n1.drop("Ann", f"m{i}", f"TO: Bob\n\nbefore {i}")
        n1.send()
        n2.receive()                                            # three of them read, acknowledged ...
        # ... and an entry id an hour ahead (a server whose clock was wrong) read by n1: the new
        # server's ids are smaller, and n1's cursors go back to the start of its streams.
        ahead = f"{int(time.time() * 1000) + 3_600_000}-0"
        admin(server.url).xadd(Keys(team).acks("n2", "n1"), {"acks": b"[]"}, id=ahead)
        n1.link.publish()
        assert n1.link.publisher.cursors["n2"] == ahead
        server.stop(signal.SIGKILL)
        (tmp_path / "redis" / "appendonlydir").exists() and __import__("shutil").rmtree(tmp_path / "redis" / "appendonlydir")
        server.start()                                          # ... and all lost with the data
        exchange(n1, n2, rounds=1)
        n1.link.check()
        assert n1.link.publisher.new_server and n1.link.publisher.cursors == {}
        exchange(n1, n2, rounds=3)
        assert bodies(n2, "Bob") == sorted(f"before {i}" for i in range(5))
        assert states(n1) == {"acknowledged": 5}
    finally:
        server.stop()


def test_an_acknowledgement_lost_makes_the_message_go_again_at_its_deadline_delivered_once(server, team, nodes, clock):
    n1 = nodes(server.url, team, "n1", ["Ann"])
    n2 = nodes(server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    n1.drop("Ann", "m", "TO: Bob\n\nonce")
    n1.send()
    n2.receive()
    admin(server.url).delete(Keys(team).acks("n2", "n1"))     # the acknowledgement is lost
    n1.link.publish()
    assert states(n1) == {"published": 1}
    clock.advance(31)                                           # past ack_timeout (30s)
    exchange(n1, n2, rounds=1)
    assert n1.link.check() == 1
    exchange(n1, n2, rounds=2)
    assert bodies(n2, "Bob") == ["once"]
    assert states(n1) == {"acknowledged": 1}
    events = [e["event"] for e in n1.link.history.events(n1.held and
                                                         n1.link.history.db.execute("SELECT message_id FROM outbound").fetchone()[0])]
    assert "republished" in events and events[-1] == "acknowledged"


def test_a_refusal_whose_acknowledgement_was_lost_is_given_again_not_taken_for_a_delivery(server, team, nodes,
                                                                                         clock):
    """n2 sheds a message (its queue_limit) and acknowledges it with the reason; the server
    loses that before n1 reads it. Published again, the message is one n2 received before: its
    answer is the refusal again, so n1 records it refused (the sender's bounce), never as
    acknowledged while Bob never had it."""
    n1 = nodes(server.url, team, "n1", ["Ann"])
    n2 = nodes(server.url, team, "n2", ["Bob"], extra="queue_limit = 1")
    exchange(n1, n2, rounds=1)
    n1.drop("Ann", "m0", "TO: Bob\n\nfirst, left unread")
    exchange(n1, n2)
    n1.drop("Ann", "m1", "TO: Bob\n\nsecond, shed by queue_limit")
    n1.send()
    n2.receive()
    n2.link.incoming.acknowledge()
    admin(server.url).flushall()         # the refusal is lost before n1 read it
    for _ in range(3):
        clock.advance(1.5)
        for n in (n1, n2):
            n.link.heartbeat()
        n1.link.check()
        n1.link.publish()
        n2.receive()
        n2.link.incoming.acknowledge()
        n1.link.publish()
    assert bodies(n2, "Bob") == ["first, left unread"]
    assert states(n1) == {"acknowledged": 1, "refused": 1}
    [refused] = n1.link.history.db.execute("SELECT error FROM outbound WHERE status = 'refused'").fetchone()
    assert "queue_limit" in refused


def test_a_name_announced_after_the_message_was_written_waits_for_it(server, team, nodes, clock, cli):
    n1 = nodes(server.url, team, "n1", ["Ann"])
    n2 = nodes(server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    n1.drop("Ann", "m", "TO: Cleo\n\nfor an agent not made yet")
    counts, _ = n1.send()
    assert counts.failed == 0 and counts.retried == 1        # waits: the directory was not read since
    (n2.state / "outbox/Cleo").mkdir()
    n2.link.look()                                             # n2 sees its new agent: announced at once
    clock.advance(3)
    n1.link.look()
    exchange(n1, n2, rounds=2)
    assert bodies(n2, "Cleo") == ["for an agent not made yet"]
    # A name the directory, read whole after the message, lacks: fails with the closest name.
    n1.drop("Ann", "typo", "TO: Bbo\n\nmistyped")
    n1.send()
    clock.advance(3)
    n1.link.look()
    clock.advance(5)
    counts, _ = n1.send()
    assert counts.failed == 1
    [failed] = [r for r in orjson.loads(cli("--root", str(n1.root), "audit", "--json").output) if r["status"] == "failed"]
    assert "unknown recipient Bbo; did you mean Bob?" in failed["error"]


def test_a_directory_that_cannot_be_read_makes_names_wait_and_says_why(tmp_path, team, nodes, clock, cli):
    server = RedisServer(tmp_path / "redis").start()
    try:
        user, password = f"relay-{team}-n1", "pw"
        admin(server.url).execute_command(*shlex.split(acl(team, "n1", password)))
        admin(server.url).execute_command("ACL", "SETUSER", user, "clearselectors")      # an incomplete ACL
        n1 = nodes(f"redis://{user}:{password}@127.0.0.1:{server.port}/0", team, "n1", ["Ann"])
        n1.link.heartbeat()
        n1.drop("Ann", "m", "TO: Bob\n\nwaits")
        counts, _ = n1.send()
        assert counts.failed == 0 and counts.retried == 1
        out = cli("--root", str(n1.root), "status", ok=False).output
        assert "directory  CANNOT BE READ" in out and "no permissions" in out
        assert "cannot be read" in cli("--root", str(n1.root), "doctor", ok=False).output
    finally:
        server.stop()


def test_a_server_that_refuses_writes_is_still_read(server, team, nodes):
    n1 = nodes(server.url, team, "n1", ["Ann"])
    n2 = nodes(server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    for i in range(20):
        n1.drop("Ann", f"m{i}", f"TO: Bob\n\n{i}")
    n1.send()
    r = admin(server.url)
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", 1)                               # every write is refused now
    try:
        assert n2.link.heartbeat() is False                    # its announce is refused ...
        assert drain(n2) == 20                                 # ... and it reads all the same
        assert len(n2.held("Bob")) == 20
    finally:
        r.config_set("maxmemory", 0)
    exchange(n1, n2, rounds=2)
    assert len(n2.held("Bob")) == 20 and states(n1) == {"acknowledged": 20}


def test_relay_send_to_an_agent_another_node_is_announcing_waits_for_it_not_fails(server, team, nodes, cli):
    import threading
    n1 = nodes(server.url, team, "n1", ["Ann"])
    n2 = nodes(server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    (n2.state / "outbox/Cleo").mkdir()                  # made on n2, announced a moment later
    announce = threading.Timer(0.3, n2.link.look)
    announce.start()
    try:
        out = cli("--root", str(n1.root), "send", "--from", "Ann", "--to", "Cleo", "welcome")
    finally:
        announce.join()
    assert out.exit_code == 0
    typo = cli("--root", str(n1.root), "send", "--from", "Ann", "--to", "Cleoo", "x", ok=False)
    assert typo.exit_code == 1 and "did you mean Cleo?" in typo.output


def test_a_server_out_of_memory_takes_writes_again_and_everything_waiting_goes_at_once(server, team, nodes, clock):
    n1 = nodes(server.url, team, "n1", ["Ann"])
    n2 = nodes(server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    r = admin(server.url)
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", 1)
    try:
        for i in range(5):
            n1.drop("Ann", f"m{i}", f"TO: Bob\n\n{i}")
        n1.send()
        for _ in range(6):                          # refused again and again: each row's backoff grows
            clock.advance(40)
            n1.link.publish()
        assert states(n1) == {"pending": 5} and n1.link.publisher.refusing
    finally:
        r.config_set("maxmemory", 0)
    n1.link.look()                                  # its announcement is taken: the server writes again
    n1.link.publish()                               # at once, not at each row's backoff
    assert states(n1) == {"published": 5}
    drain(n2)
    n1.link.publish()
    assert states(n1) == {"acknowledged": 5} and len(n2.held("Bob")) == 5


def test_a_reset_that_comes_while_a_read_is_in_flight_moves_no_cursor(server, team, nodes):
    n1 = nodes(server.url, team, "n1", ["Ann"])
    n2 = nodes(server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    n1.drop("Ann", "m", "TO: Bob\n\nduring a failover")
    n1.send()
    incoming = n2.link.incoming
    pool = incoming.client.connection_pool
    real = pool.release

    def release(connection):                        # the publisher's thread finds a new run id meanwhile
        real(connection)
        incoming.reset()
    pool.release = release
    try:
        assert n2.receive() == 1
    finally:
        pool.release = real
    assert incoming.cursors == {}                   # the next read starts every stream from its start


@pytest.mark.parametrize("executed", [False, True], ids=["xdel-lost", "xdel-reply-lost"])
def test_an_acknowledged_entry_whose_deletion_was_cut_is_deleted_at_the_next_step_and_loss_counts_right(
        server, team, nodes, tmp_path, executed):
    """n1 reads n2's acknowledgements, records them, and its XDEL of the entries is cut with its
    connection (never sent, or done and its reply lost): the entries are deleted at n1's next
    step, and the stream-length check then sees one entry the server lost among those that wait."""
    from fedcut import CutProxy
    proxy = CutProxy(server.port).start()
    try:
        n1 = nodes(proxy.url(), team, "n1", ["Ann"])
        n2 = nodes(server.url, team, "n2", ["Bob"])
        exchange(n1, n2, rounds=1)
        n1.link.check()                                         # the server's run id, known
        for i in range(3):
            n1.drop("Ann", f"m{i}", f"TO: Bob\n\nacknowledged {i}")
        n1.send()
        assert drain(n2) == 3
        n2.link.incoming.acknowledge()
        proxy.cut(b"XDEL", executed=executed)
        n1.link.publish()                                       # acknowledgements recorded; the XDEL cut
        assert proxy.cuts == 1 and states(n1) == {"acknowledged": 3}
        r = admin(server.url)
        assert r.xlen(n1.stream("n2")) == (0 if executed else 3)
        n1.link.publish()                                       # the next step deletes them
        assert r.xlen(n1.stream("n2")) == 0
        for i in range(2):
            n1.drop("Ann", f"w{i}", f"TO: Bob\n\nwaiting {i}")
        n1.send()
        [(first, _), _] = r.xrange(n1.stream("n2"))
        r.xdel(n1.stream("n2"), first)                          # the server loses one of the two that wait
        assert n1.link.check() == 1                             # seen: the one lost published again
        n1.link.publish()
        assert drain(n2) == 2
        n1.link.publish()
        assert states(n1) == {"acknowledged": 5} and r.xlen(n1.stream("n2")) == 0
    finally:
        proxy.stop()


def test_entries_left_by_a_deletion_cut_before_a_restart_are_deleted_at_the_first_check(server, team, nodes):
    """The XDEL cut, then the relay stops before its next step: the new run deletes what its
    ledger settled before the stop, and counts what waits right."""
    from fedcut import CutProxy
    proxy = CutProxy(server.port).start()
    try:
        n1 = nodes(proxy.url(), team, "n1", ["Ann"])
        n2 = nodes(server.url, team, "n2", ["Bob"])
        exchange(n1, n2, rounds=1)
        for i in range(3):
            n1.drop("Ann", f"m{i}", f"TO: Bob\n\nacknowledged {i}")
        n1.send()
        drain(n2)
        n2.link.incoming.acknowledge()
        proxy.cut(b"XDEL")
        n1.link.publish()
        n1.close()
        r = admin(server.url)
        assert r.xlen(n1.stream("n2")) == 3
        again = nodes(proxy.url(), team, "n1", ["Ann"])
        again.link.heartbeat()
        assert again.link.check() == 0 and r.xlen(n1.stream("n2")) == 0
    finally:
        proxy.stop()


def test_a_node_that_stops_acknowledging_is_said_once_ack_timeout_passes_in_status_and_the_log(
        server, team, nodes, clock, caplog):
    """n2 frozen (it reads nothing, answers nothing) while n1 sends to it: within ack_timeout
    (30 s) all is well; past it the log says so once, and `relay status` (the document probe()
    makes from the ledger, judged at the injected time) names the node and is no longer healthy,
    long before --max-pending-age (10 minutes). Once n2 acknowledges, the log says that too."""
    import logging

    from relay.core import health
    from relay.federation.link import probe
    from relay.operator import views
    n1 = nodes(server.url, team, "n1", ["Ann"])
    n2 = nodes(server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    for i in range(3):
        n1.drop("Ann", f"m{i}", f"TO: Bob\n\nto a frozen node {i}")
    n1.send()
    sent = clock.now

    def verdict(at):
        doc = probe(n1.config, n1.link.history)
        return health.federation(doc, True, at, 600), views.federation(doc, running=True, now=at)

    caplog.set_level(logging.INFO, logger="relay.federation")
    clock.advance(20)
    n1.link.check()
    (code, said), shown = verdict(clock.now)
    assert (code, said) == (0, []) and "NOT ACKNOWLEDGING" not in shown
    assert not [r for r in caplog.records if "not acknowledging" in r.getMessage()]
    clock.advance(11)                                           # 31 s: past ack_timeout
    n1.link.check()
    n1.link.check()
    (code, said), shown = verdict(clock.now)
    assert code == health.EXIT_STALE
    assert said == [f"federation: node n2 is not acknowledging: 3 message(s) wait for it, the oldest for "
                    f"{clock.now - sent:.0f}s, more than ack_timeout (30s)"]
    assert "n2" in shown and "NOT ACKNOWLEDGING" in shown
    late = [r.getMessage() for r in caplog.records if "is not acknowledging" in r.getMessage()]
    assert late == ["federation: node n2 is not acknowledging: 3 message(s) wait for it, the oldest for 31s, more "
                    "than ack_timeout (30s); it may be stopped, frozen or cut off from the server"]    # once
    n1.link.publish()                                           # what the check published again
    drain(n2)
    n2.link.incoming.acknowledge()
    n1.link.publish()
    n1.link.check()
    assert verdict(clock.now)[0] == (0, [])
    assert any("node n2 acknowledges again" in r.getMessage() for r in caplog.records)
