"""A message to an agent of another node is delivered once, and its sender knows it: what the
server loses (away, restarted, flushed, replaced, a stream trimmed), a crash of either node at
any step, a publish repeated, a row for a node that no longer holds its recipients, an inbox that
keeps failing, this node's own limits, and whatever an entry holds. Against a real redis-server
on a free local port (skipped, saying why, when the binary is missing); nodes are driven by their
steps and the injected clock. Entries a test writes stand for what a node writes into its own
keys (relay:{team}:from:<node>:...), which is all one node's credentials allow."""
import errno
import logging
import os
import signal
import threading

import orjson
import pytest

from relay.federation.keys import RETIRED
from relay.files.sync import FEW_DIRS
from relay.operator.views import remote_state
from fednodes import (RedisServer, client, entry, envelope, exchange, needs_server, nodes,  # noqa: F401 - fixtures
                      redis_server, team)
from relay.ids import IdGenerator

pytestmark = needs_server


def refusals(node):
    return [r["error"] for r in node.relay.history.audit(status="failed")]


@pytest.fixture
def two(redis_server, team, nodes):
    """n1 (Ann) and n2 (Bob) on the session's server, each knowing the other."""
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    return n1, n2


# -- the server away, restarted, flushed or replaced ----------------------------------------------

def test_local_deliveries_never_wait_for_the_server_and_remote_ones_wait_then_arrive_once(tmp_path, team, nodes, cli):
    server = RedisServer(tmp_path / "redis")
    server.start()
    n1 = nodes(server.url, team, "n1", ["Ann", "Al"])
    n2 = nodes(server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    server.stop()
    n1.drop("Ann", "m1", "TO: Al, Bob\n\nwhile the server is away")
    counts, published = n1.send()
    assert counts.archived == 1 and published == 0
    assert [e["body"] for e in n1.held("Al")] == ["while the server is away"]       # local: at once
    doc = orjson.loads(cli("--root", str(n1.root), "show", n1.held("Al")[0]["id"], "--json").output)
    [waiting] = doc["remote"]
    assert waiting["status"] == "pending" and waiting["attempts"] == 1 and "Connection" in waiting["error"]
    status = orjson.loads(cli("--root", str(n1.root), "status", "--json", ok=False).output)["federation"]
    assert status["server"]["reachable"] is False and status["outbound"]["pending"] == 1
    assert status["link"]["connected"] is False
    n1.clock.advance(1)
    assert n1.link.publish() == 0                       # still away: backing off
    assert orjson.loads(cli("--root", str(n1.root), "show", doc["id"], "--json").output)["remote"][0]["attempts"] == 2
    assert n2.receive() == 0
    server.start()                                      # back: the next heartbeat makes everything due now
    exchange(n1, n2)
    exchange(n1, n2)
    assert [e["body"] for e in n2.held("Bob")] == ["while the server is away"]
    status = orjson.loads(cli("--root", str(n1.root), "status", "--json", ok=False).output)["federation"]
    assert {k: status["outbound"][k] for k in ("pending", "published", "acknowledged", "refused", "oldest_pending_at")} \
        == {"pending": 0, "published": 0, "acknowledged": 1, "refused": 0, "oldest_pending_at": None}
    assert status["link"]["connected"] is True
    server.stop()


def test_the_server_restarted_mid_stream_loses_nothing_and_duplicates_nothing(tmp_path, team, nodes):
    server = RedisServer(tmp_path / "redis").start()
    n1 = nodes(server.url, team, "n1", ["Ann"])
    n2 = nodes(server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    for i in range(5):
        n1.drop("Ann", f"a{i}", f"TO: Bob\n\nbefore {i}")
    n1.send()                                           # published, not read yet
    server.stop(signal.SIGKILL)                         # killed: the AOF (appendfsync always) has them
    for i in range(5):
        n1.drop("Ann", f"b{i}", f"TO: Bob\n\nduring {i}")
    n1.send()
    assert n2.receive() == 0
    server.start()
    exchange(n1, n2, rounds=3)
    bodies = sorted(e["body"] for e in n2.held("Bob"))
    assert bodies == sorted([f"before {i}" for i in range(5)] + [f"during {i}" for i in range(5)])
    assert n1.relay.history.remote.outbound_counts()["acknowledged"] == 10
    assert client(server.url).xlen(n1.stream("n2")) == 0
    server.stop()


def test_what_a_server_restarted_without_its_data_lost_is_published_again_and_the_directory_announced_again(
        tmp_path, team, nodes):
    server = RedisServer(tmp_path / "redis", appendfsync="always")
    server.start()
    try:
        n1 = nodes(server.url, team, "n1", ["Ann"])
        n2 = nodes(server.url, team, "n2", ["Bob"])
        exchange(n1, n2, rounds=1)
        n1.drop("Ann", "m0", "TO: Bob\n\nbefore the flush")
        n1.send()                                   # published, not read yet ...
        client(server.url).flushall()               # ... and gone: what a restart with no AOF and no snapshot leaves
        for n in (n1, n2, n1):                      # the directory announced again
            n.link.heartbeat()
        assert n2.receive() == 0
        assert n1.link.check() == 1                 # the stream holds fewer entries than wait: published again
        n1.drop("Ann", "m1", "TO: Bob\n\nafter the flush")
        n1.send()
        n2.receive()
        n1.link.publish()
        assert sorted(e["body"] for e in n2.held("Bob")) == ["after the flush", "before the flush"]
        assert n1.relay.history.remote.outbound_counts()["acknowledged"] == 2 and n1.link.check() == 0
        assert client(server.url).xlen(n1.stream("n2")) == 0
    finally:
        server.stop()


def test_a_new_server_has_every_message_not_yet_acknowledged_published_again_and_delivered_once(tmp_path, team, nodes):
    """A failover to a replica that lagged, or a server restarted empty, is another server (its
    run id): what waited for an acknowledgement is published again, even what was delivered."""
    first = RedisServer(tmp_path / "a").start()
    n1 = nodes(first.url, team, "n1", ["Ann"])
    n2 = nodes(first.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    assert n1.link.check() == 0                         # the server's run id, known
    n1.drop("Ann", "m1", "TO: Bob\n\ndelivered, its acknowledgement lost")
    n1.send()
    incoming = n2.link.incoming
    incoming.acknowledge = incoming.acks.clear          # lost with the server
    n2.receive()
    del incoming.acknowledge
    n1.drop("Ann", "m2", "TO: Bob\n\nnever read")
    n1.send()
    first.stop()
    second = RedisServer(tmp_path / "b", port=first.port).start()       # another server, empty
    try:
        for n in (n1, n2, n1):
            n.link.heartbeat()
        assert n1.link.check() == 2
        n1.link.publish()
        n2.receive()
        n1.link.publish()
        assert sorted(e["body"] for e in n2.held("Bob")) == ["delivered, its acknowledgement lost", "never read"]
        assert n1.relay.history.remote.outbound_counts()["acknowledged"] == 2
        assert client(second.url).xlen(n1.stream("n2")) == 0
    finally:
        second.stop()


def test_a_new_server_has_the_receivers_read_every_stream_from_its_start_again(tmp_path, team, nodes):
    first = RedisServer(tmp_path / "a").start()
    n1 = nodes(first.url, team, "n1", ["Ann"])
    n2 = nodes(first.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    n1.link.check(), n2.link.check()                   # both know the server's run id
    # The old server's entry ids ran ahead of the new one's (a failover to a host whose clock is behind).
    ahead = int(n1.clock.now * 1000) + 3_600_000
    client(first.url).xadd(n1.stream("n2"), {"junk": b"1"}, id=f"{ahead}-0")
    n2.receive()
    first.stop()
    second = RedisServer(tmp_path / "b", port=first.port).start()
    try:
        for n in (n1, n2, n1):
            n.link.heartbeat()
        n1.link.check(), n2.link.check()
        n1.drop("Ann", "m", "TO: Bob\n\non the new server")
        n1.send()
        n2.receive()
        assert [e["body"] for e in n2.held("Bob")] == ["on the new server"]
    finally:
        second.stop()


def test_a_stream_trimmed_by_someone_else_is_published_again_and_the_receiver_reads_on(two, redis_server):
    n1, n2 = two
    r = client(redis_server.url)
    n1.drop("Ann", "m1", "TO: Bob\n\npublished, then trimmed")
    n1.send()
    r.xtrim(n1.stream("n2"), maxlen=0)                  # an operator's mistake, or a server that lost it
    n1.drop("Ann", "m2", "TO: Bob\n\nafter the trim")
    n1.send()
    n2.receive()
    n1.link.publish()
    assert [e["body"] for e in n2.held("Bob")] == ["after the trim"]
    assert n1.link.check() == 1                         # the stream holds fewer entries than wait
    n1.link.publish()
    n2.receive()
    n1.link.publish()
    assert sorted(e["body"] for e in n2.held("Bob")) == ["after the trim", "published, then trimmed"]
    assert n1.relay.history.remote.outbound_counts()["acknowledged"] == 2 and r.xlen(n1.stream("n2")) == 0


def test_a_stream_key_of_the_wrong_type_holds_only_its_own_node(redis_server, team, nodes):
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    n3 = nodes(redis_server.url, team, "n3", ["Dee"])
    exchange(n1, n2, n3, rounds=1)
    r = client(redis_server.url)
    r.delete(n1.stream("n3"))
    r.set(n1.stream("n3"), "not a stream")          # n1's own key, mistaken (or an operator's)
    n1.drop("Ann", "m", "TO: Bob, Dee\n\nto two nodes")
    n1.send()
    mid = n1.relay.history.audit().fetchone()["id"]
    rows = n1.outbound(mid)
    assert rows["n2"]["status"] == "published" and rows["n3"]["status"] == "pending"
    assert "WRONGTYPE" in rows["n3"]["error"]
    for _ in range(3):                              # tried again: n2 gets no second entry
        n1.clock.advance(60)
        n1.link.publish()
    assert r.xlen(n1.stream("n2")) == 1
    n2.receive()
    assert [e["body"] for e in n2.held("Bob")] == ["to two nodes"]
    r.delete(n1.stream("n3"))                       # mended: n3's entry goes now
    n1.clock.advance(60)
    n1.link.publish()
    n3.link.heartbeat()
    n3.receive()
    n1.link.publish()
    assert [e["body"] for e in n3.held("Dee")] == ["to two nodes"]
    assert {n: o["status"] for n, o in n1.outbound(mid).items()} == {"n2": "acknowledged", "n3": "acknowledged"}


def test_the_receiver_reads_again_as_soon_as_the_server_is_back_not_after_its_backoff(tmp_path, team, nodes):
    """The receiver backs off while the server is away (up to 30 s); the publisher publishes at once
    when the link comes back, and the receiver now reads at once too (its threads, on real time)."""
    import time
    from test_federation import wait_for
    server = RedisServer(tmp_path / "redis").start()
    try:
        n1 = nodes(server.url, team, "n1", ["Ann"])
        n2 = nodes(server.url, team, "n2", ["Bob"])
        exchange(n1, n2, rounds=1)
        server.stop()
        n2.link.incoming.failures = 10              # a long outage: its next pause is 30 s
        n2.link.connected = False
        n2.link.next_heartbeat = 0.0
        n2.link.clock = time.time                   # the threads run on real time
        n2.link.start()
        server.start()
        n1.drop("Ann", "m", "TO: Bob\n\nright after the outage")
        n1.send()
        wait_for(lambda: n2.held("Bob"), timeout=15, what="the message after the outage")
    finally:
        n2.link.stop()
        server.stop()


# -- acknowledgements, deadlines, and a publish repeated ----------------------------------------

def test_a_message_not_acknowledged_by_its_deadline_is_published_again_while_its_node_is_alive(two, redis_server):
    n1, n2 = two
    n1.drop("Ann", "m", "TO: Bob\n\nits acknowledgement lost")
    n1.send()
    incoming = n2.link.incoming
    incoming.acknowledge = incoming.acks.clear          # lost (the node, or the server, gone before the XADD)
    n2.receive()
    del incoming.acknowledge
    n1.link.publish()
    [row] = n1.outbound(n2.held("Bob")[0]["id"]).values()
    assert row["status"] == "published"
    # n2 is away: its rows wait, not published again to nobody.
    r = client(redis_server.url)
    seconds, _ = r.time()
    r.hset(n2.key(), "seen", str(seconds - 60))
    n1.clock.advance(31)                                # past ack_timeout (30s)
    n1.link.look()
    assert n1.link.alive["n2"] is False and n1.link.check() == 0
    n2.link.heartbeat()                                 # back
    n1.link.look()
    assert n1.link.check() == 1
    events = [e["event"] for e in n1.relay.history.events(row["message_id"])]
    assert "republished" in events
    n1.link.publish()
    n2.receive()                                        # known: acknowledged again, not delivered again
    n1.link.publish()
    assert [e["body"] for e in n2.held("Bob")] == ["its acknowledgement lost"]
    assert n1.outbound(row["message_id"])["n2"]["status"] == "acknowledged"
    assert n1.link.check() == 0 and r.xlen(n1.stream("n2")) == 0


def test_a_publish_repeated_and_entries_read_by_a_receiver_that_died_deliver_once(redis_server, team, nodes, cli):
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    n1.drop("Ann", "m1", "TO: Bob\n\nonce")
    n1.drop("Ann", "m2", "TO: Bob\n\ntwice read")
    n1.send()
    r = client(redis_server.url)
    stream = n1.stream("n2")
    entries = r.xrange(stream)
    assert len(entries) == 2
    r.xadd(stream, entries[0][1])                       # the publish repeated (a crash before its id was recorded)
    server = orjson.loads(cli("--root", str(n2.root), "status", "--json", ok=False).output)["federation"]["server"]
    assert server["incoming"] == 3
    # A receiver that read everything and died before recording or acknowledging anything; one
    # envelope already written into new/ before the crash is recognised, not doubled.
    doc = orjson.loads(entries[1][1][b"env"])
    (n2.state / "inbox/Bob/new" / f"{doc['id']}.json").write_bytes(orjson.dumps({**doc, "node": "n1"}))
    n2.close()
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])  # the node starts again: its cursors from the start
    assert n2.receive() == 0                            # nothing read before its first heartbeat
    assert n2.link.heartbeat()
    assert n2.receive() == 3
    assert sorted(e["body"] for e in n2.held("Bob")) == ["once", "twice read"]
    first = entries[0][1][b"id"].decode()
    assert sorted(n2.acks(r, "n1")) == sorted([(first, None), (first, None), (doc["id"], None)])    # the repeat too
    n1.link.publish()
    assert n1.relay.history.remote.outbound_counts()["acknowledged"] == 2
    assert r.xlen(stream) == 0                          # the repeat's entry too
    assert n2.receive() == 0


def test_the_entry_of_a_publish_repeated_is_deleted_too_once_acknowledged(two, redis_server):
    n1, n2 = two
    n1.drop("Ann", "m", "TO: Bob\n\nonce")
    n1.send()
    r = client(redis_server.url)
    [(_, fields)] = r.xrange(n1.stream("n2"))
    r.xadd(n1.stream("n2"), fields)                     # the publish repeated
    n2.receive()
    n1.link.publish()
    assert [e["body"] for e in n2.held("Bob")] == ["once"]
    assert r.xlen(n1.stream("n2")) == 0


def test_a_message_published_from_the_offer_before_its_batch_was_recorded_arrives_once(redis_server, team, nodes):
    """The link publishes what a batch offers while the batch still delivers and records; a
    relay killed before its batch's transaction processes the message again and publishes it
    from the recorded row: two entries, one delivery."""
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    n1.drop("Ann", "m", "TO: Bob\n\nonce only")

    def killed(now, works, *times):
        raise RuntimeError("killed before the batch's transaction")
    n1.relay.ledger.messages.record = killed
    with pytest.raises(RuntimeError):
        n1.send()
    assert n1.link.publisher.publish_offered(n1.clock.now) == 1     # already in n2's stream
    n1.close()
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])   # started again: recovery, then the row
    n1.link.heartbeat()
    counts, published = n1.send()
    assert counts.archived == 1 and published == 1
    r = client(redis_server.url)
    assert r.xlen(n1.stream("n2")) == 2
    assert n2.receive() == 2
    assert [e["body"] for e in n2.held("Bob")] == ["once only"]
    n1.link.publish()
    mid = n2.held("Bob")[0]["id"]
    assert n1.outbound(mid)["n2"]["status"] == "acknowledged"
    assert r.xlen(n1.stream("n2")) == 0                 # both entries deleted


def test_the_loop_writes_an_offer_to_the_server_itself_and_the_publisher_records_its_entry_id(
        redis_server, team, nodes):
    """With the link well, the step that takes a message for another node writes its XADD on
    the wire's connection (no hand-off): the entry is in the stream before the publisher's next
    turn, which reads the reply and records the row published with that entry id."""
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    assert n1.link.publisher.wire.usable
    n1.drop("Ann", "m", "TO: Bob\n\nstraight from the loop")
    n1.relay.step()
    r = client(redis_server.url)
    [(eid, fields)] = r.xrange(n1.stream("n2"))
    mid = fields[b"id"].decode()
    assert not n1.relay.router.offered          # written, not queued for the publisher
    n1.link.publish()
    assert n1.outbound(mid)["n2"]["entry_id"] == eid.decode()
    assert n1.outbound(mid)["n2"]["status"] == "published"
    assert n2.receive() == 1
    n1.link.publish()
    assert n1.outbound(mid)["n2"]["status"] == "acknowledged"
    assert [e["body"] for e in n2.held("Bob")] == ["straight from the loop"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name descriptors")
def test_a_message_for_another_node_syncs_its_three_directories_by_fsync_and_a_local_one_by_syncfs(
        redis_server, team, nodes):
    """Where syncfs is trusted ("fs" mode) on a file system where one directory's fsync makes
    every change before it durable (ext4, XFS), the batch of a message for another node syncs
    the three directories it changed (its outbox, the spool, its archive day) one by one: a
    syncfs would wait for whatever every process writes on the file system. A local message
    changes a fourth (the recipient's new/): one syncfs."""
    n1 = nodes(redis_server.url, team, "n1", ["Ann", "Cy"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    syncer = n1.relay.syncer
    syncer.mode, syncer.few_dirs = "fs", FEW_DIRS      # as on ext4 or XFS
    whole, synced = [], []
    syncer.syncfs = whole.append
    real = syncer.fsync

    def fsync(fd):
        synced.append(os.path.relpath(os.readlink(f"/proc/self/fd/{fd}"), n1.state))
        real(fd)

    syncer.fsync = fsync
    n1.drop("Ann", "first", "TO: Bob\n\nmakes the spool and the archive's day")
    n1.relay.step()
    del whole[:], synced[:]
    n1.drop("Ann", "m", "TO: Bob\n\nfor another node")
    n1.relay.step(n1.clock.advance(1))
    [row] = [r for r in n1.relay.history.audit() if r["name"] == "m"]
    day_dir = os.path.dirname(row["archive_path"])
    assert whole == []
    assert {"outbox/Ann", "spool/Ann", day_dir} <= set(synced), synced
    n1.drop("Ann", "l", "TO: Cy\n\nfor an agent of this node")
    n1.relay.step(n1.clock.advance(1))
    assert len(whole) == 1
    assert [e["body"] for e in n1.held("Cy")] == ["for an agent of this node"]


def test_the_publisher_is_woken_for_the_replies_to_what_the_loop_wrote_only_once_the_batch_is_recorded(
        redis_server, team, nodes):
    """The loop writes a message's XADD and goes on with its batch; the publisher's thread is
    woken to read the reply only when that batch is recorded (its outbound row there), not at
    the write, while the server and the receiver act on the message. A step that fails after
    the write wakes it all the same."""
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    r = client(redis_server.url)
    router = n1.relay.router
    woken = []

    class Watched(threading.Event):
        def set(self):
            rows = [n1.outbound(fields[b"id"].decode()) for _, fields in r.xrange(n1.stream("n2"))]
            woken.append([row["n2"]["status"] if "n2" in row else None for row in rows])
            super().set()

    router.queued = Watched()
    n1.drop("Ann", "m", "TO: Bob\n\nread its reply later")
    n1.relay.step()
    [(_, fields)] = r.xrange(n1.stream("n2"))
    mid = fields[b"id"].decode()
    assert not router.offered                   # written by the loop
    assert woken == [["pending"]]               # once, after the record (before it: no row at all)
    n1.link.publish()
    assert n1.outbound(mid)["n2"]["status"] == "published"
    woken.clear()
    n1.drop("Ann", "m2", "TO: Bob\n\nwritten, then the batch abandoned")
    router.offer = _then_fail(router.offer)
    with pytest.raises(RuntimeError):
        n1.relay.step()
    n1.relay.abandon()
    assert len(woken) == 1 and len(woken[0]) == 2      # woken though nothing was recorded


def test_an_acknowledgement_read_before_its_batch_is_recorded_settles_the_row_once_recorded(
        redis_server, team, nodes, caplog):
    """The loop wrote the XADD; the receiver delivered and acknowledged it; the publisher read
    that acknowledgement before the loop's batch recorded the row. It is kept, with the entry
    it names, and settles the row once recorded: the message is not published a second time,
    its entry is not deleted under a row that still waits for it, and no loss is reported."""
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    r = client(redis_server.url)
    record = n1.relay.ledger.messages.record
    read_early = []

    def acknowledged_first(*a, **k):
        read_early.append(n2.receive())
        n1.link.publish()                   # a turn of the publisher's (its ACKS_EVERY timer)
        return record(*a, **k)

    n1.relay.ledger.messages.record = acknowledged_first
    n1.drop("Ann", "m", "TO: Bob\n\nacknowledged before the record")
    n1.relay.step()
    n1.relay.ledger.messages.record = record
    assert read_early == [1]
    [mid] = [row["id"] for row in n1.relay.history.audit() if row["name"] == "m"]
    assert r.xlen(n1.stream("n2")) == 1     # kept while its row waits
    with caplog.at_level(logging.WARNING, logger="relay.federation"):
        n1.link.publish()                   # the turn replied() wakes: the row published, then settled
        n1.link.check(n1.clock.advance(2))
    assert n1.outbound(mid)["n2"]["status"] == "acknowledged"
    assert r.xlen(n1.stream("n2")) == 0     # its entry deleted once settled, published once
    assert not any("lost" in m for m in caplog.messages)
    assert n2.receive() == 0
    assert [e["body"] for e in n2.held("Bob")] == ["acknowledged before the record"]
    assert n1.link.publisher.early_acks == {} and (mid, "n2") not in n1.link.publisher.early
    # Read again after the record and before the publisher marked the row published: the row goes
    # from pending to acknowledged, with the entry the receiver read.
    publisher = n1.link.publisher

    def acks_first(*a, **k):
        n2.receive()
        publisher.read_acks(n1.clock.now, {"n2"})
        return record(*a, **k)

    n1.relay.ledger.messages.record = acks_first
    n1.drop("Ann", "m2", "TO: Bob\n\nacknowledged while pending")
    n1.relay.step(n1.clock.advance(1))
    n1.relay.ledger.messages.record = record
    [mid2] = [row["id"] for row in n1.relay.history.audit() if row["name"] == "m2"]
    [(eid, _)] = r.xrange(n1.stream("n2"))
    assert n1.outbound(mid2)["n2"]["status"] == "pending"
    publisher.read_acks(n1.clock.now, {"n2"})
    row = n1.outbound(mid2)["n2"]
    assert row["status"] == "acknowledged" and row["entry_id"] == eid.decode()
    assert remote_state(row).endswith(f"(published as entry {eid.decode()})")
    n1.link.publish()
    assert r.xlen(n1.stream("n2")) == 0 and n1.outbound(mid2)["n2"]["status"] == "acknowledged"


def test_acknowledgements_of_ids_never_sent_are_held_within_a_bound_per_node_and_their_entries_deleted_when_forgotten(
        redis_server, team, nodes):
    """A node acknowledging thousands of ids this node never sent (or not yet recorded): at
    most EARLY_ACKS_HELD of that node's are kept, the newest; none longer than EARLY_ACKS_KEPT,
    and the entry one names is deleted when it is forgotten (left in the stream, it would hide
    an entry the server lost from the check that compares the stream with the rows waiting).
    Another node's early acknowledgement is not crowded out, and rows settle as ever."""
    from relay.federation.publisher import EARLY_ACKS_HELD, EARLY_ACKS_KEPT
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    n3 = nodes(redis_server.url, team, "n3", ["Cid"])
    exchange(n1, n2, n3, rounds=1)
    r = client(redis_server.url)
    orphan = r.xadd(n1.stream("n2"), {"id": "left by a batch that was never recorded"}).decode()
    ids = IdGenerator()
    made_up = [[ids.new(n1.clock.now), None, None] for _ in range(EARLY_ACKS_HELD + 300)]
    made_up[-1][1] = orphan
    for i in range(0, len(made_up), 100):
        r.xadd(n2.keys.acks("n2", "n1"), {"acks": orjson.dumps(made_up[i:i + 100])})
    publisher = n1.link.publisher
    record = n1.relay.ledger.messages.record

    def acknowledged_first(*a, **k):        # n3's genuine acknowledgement, read before the record
        n3.receive()
        n1.link.publish()
        return record(*a, **k)

    n1.relay.ledger.messages.record = acknowledged_first
    n1.drop("Ann", "m", "TO: Cid\n\nacknowledged early, beside a flood")
    n1.relay.step()
    n1.relay.ledger.messages.record = record
    held = publisher.early_acks
    # Ids n1 never had in flight to n2 are dropped at once (one lookup a batch), never held; the
    # entry one names is deleted with the batch's XDEL.
    assert not held.get("n2") and r.xlen(n1.stream("n2")) == 0
    assert len(held["n3"]) == 1
    n1.link.publish()
    [mid] = [row["id"] for row in n1.relay.history.audit() if row["name"] == "m"]
    assert n1.outbound(mid)["n3"]["status"] == "acknowledged" and r.xlen(n1.stream("n3")) == 0
    assert "n3" not in publisher.early_acks
    n1.clock.advance(EARLY_ACKS_KEPT)
    n1.link.publish()
    assert publisher.early_acks == {}
    assert n3.receive() == 0 and [e["body"] for e in n3.held("Cid")] == ["acknowledged early, beside a flood"]


def test_acknowledgement_entries_too_many_or_too_large_together_never_keep_another_nodes_from_being_read(
        redis_server, team, nodes, caplog):
    """n3 fills its acknowledgement stream to n1 with entries each under ACK_BYTES but too large
    together for one read's budget, then with entries of ids that are no relay ids (empty, or a
    megabyte long) and with more acknowledgements than one call settles: n2's acknowledgement
    is read all the same, each call settles at most ACKS_PER_CALL, nothing unlike an id is held,
    and the entries too large are said once, not at every read."""
    from relay.federation.publisher import ACK_BYTES, ACKS_PER_CALL
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    n3 = nodes(redis_server.url, team, "n3", ["Cid"])
    exchange(n1, n2, n3, rounds=1)
    r = client(redis_server.url)
    flood = n3.keys.acks("n3", "n1")
    for _ in range(9):          # each under the bound; together over a read's
        r.xadd(flood, {"acks": orjson.dumps([["x" * (ACK_BYTES // 2 - 100), None, None]])})
    r.xadd(flood, {"acks": b"y" * (ACK_BYTES + 10)})     # one over it
    r.xadd(flood, {"acks": orjson.dumps([[""]] * 50_000 + [["z" * 900_000]])})
    ids = IdGenerator()
    r.xadd(flood, {"acks": orjson.dumps([[ids.new(n1.clock.now)] for _ in range(3 * ACKS_PER_CALL)])})
    n1.drop("Ann", "m", "TO: Bob\n\nits acknowledgement behind a flood of another node's")
    n1.send()
    n2.receive()
    [mid] = [row["id"] for row in n1.relay.history.audit() if row["name"] == "m"]
    publisher = n1.link.publisher
    settled = publisher.read_acks(n1.clock.now, {"n2", "n3"})
    assert settled == 1 and n1.outbound(mid)["n2"]["status"] == "acknowledged"
    for _ in range(6):
        publisher.read_acks(n1.clock.now, {"n2", "n3"})
        assert len(publisher.early_acks.get("n3", {})) <= 1024
    assert all(len(m) == 26 for m in publisher.early_acks.get("n3", {}))
    assert publisher.cursors["n3"] == r.xrevrange(flood, count=1)[0][0].decode()     # read to its end
    assert sum("too large to be any" in rec.getMessage() for rec in caplog.records) == 1


def _then_fail(offer):
    def offered(works):
        offer(works)
        raise RuntimeError("the step fails after the write")
    return offered


def test_an_xadd_the_loop_wrote_lost_with_its_connection_is_published_from_the_ledger_and_delivered_once(
        redis_server, team, nodes, caplog):
    """The loop wrote a message's XADD, and its connection dropped before the server ran it:
    the wire gives the connection up, the row is published from the ledger in the same turn
    (the link stays up: it was the wire's connection, not the server), and the wire takes a
    new connection for the next message."""
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    r = client(redis_server.url)
    n1.drop("Ann", "m", "TO: Bob\n\nwritten, never run")
    r.client_pause(5000, all=False)     # write commands wait: the XADD is held ...
    try:
        n1.relay.step()
        r.client_kill_filter(_type="normal", skipme=True)     # ... and its connection killed
    finally:
        r.client_unpause()
    assert r.xlen(n1.stream("n2")) == 0
    wire = n1.link.publisher.wire
    with caplog.at_level(logging.INFO, logger="relay.federation"):
        n1.link.publish()
    assert r.xlen(n1.stream("n2")) == 1             # from the ledger
    assert n1.link.connected is True and not any("cannot be used" in m for m in caplog.messages)
    assert any("the connection the loop writes on failed" in m for m in caplog.messages)
    assert wire.usable and wire.conn is not None       # taken again (the pool's, reconnected)
    n1.drop("Ann", "m2", "TO: Bob\n\nby the new connection")
    n1.relay.step()
    assert not n1.relay.router.offered and r.xlen(n1.stream("n2")) == 2
    for _ in range(2):
        n1.link.publish()
        n2.receive()
        n1.link.publish()
    assert sorted(e["body"] for e in n2.held("Bob")) == ["by the new connection", "written, never run"]
    assert all(n1.outbound(e["id"])["n2"]["status"] == "acknowledged" for e in n2.held("Bob"))


@pytest.mark.parametrize("closed_by", ["CLIENT KILL", "a restart"])
def test_the_wire_gives_up_a_connection_the_server_closed_while_idle_before_the_loop_writes_on_it(
        tmp_path, team, nodes, caplog, closed_by):
    """The server closes an idle client (its `timeout`, CLIENT KILL, a restart): the publisher's
    next turn sees the connection closed and takes another, the loop's next message goes by it,
    and the link is never reported down."""
    server = RedisServer(tmp_path / "redis").start()
    try:
        n1 = nodes(server.url, team, "n1", ["Ann"])
        n2 = nodes(server.url, team, "n2", ["Bob"])
        exchange(n1, n2, rounds=1)
        wire = n1.link.publisher.wire
        assert wire.usable and wire.conn is not None
        if closed_by == "a restart":
            server.stop()
            server.start()
        else:
            client(server.url).client_kill_filter(_type="normal", skipme=True)
        with caplog.at_level(logging.INFO, logger="relay.federation"):
            n1.link.heartbeat()
            n1.link.publish()
            assert wire.usable and wire.conn is not None
            n1.drop("Ann", "m", f"TO: Bob\n\nafter {closed_by}")
            n1.relay.step()
            assert not n1.relay.router.offered          # written by the loop, on the new connection ...
            assert client(server.url).xlen(n1.stream("n2")) == 1     # ... which the server read
            n1.link.publish()
            n2.receive()
            n1.link.publish()
        assert [e["body"] for e in n2.held("Bob")] == [f"after {closed_by}"]
        assert n1.link.connected is True and not any("cannot be used" in m for m in caplog.messages)
    finally:
        server.stop()


# -- the receiver after a crash -------------------------------------------------------------------

def test_an_entry_written_to_an_inbox_before_a_crash_is_not_delivered_again_after_the_restart(
        redis_server, team, nodes):
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    n1.drop("Ann", "m1", "TO: Bob\n\nonce")
    n1.send()

    def killed(*args):
        raise RuntimeError("killed before the ledger's record")
    n2.link.incoming.ledger.remote.received = killed
    with pytest.raises(RuntimeError):
        n2.receive()                            # in Bob's new/, neither recorded nor acknowledged
    [path] = (n2.state / "inbox/Bob/new").iterdir()
    path.rename(n2.state / "inbox/Bob/cur" / f"{path.name}:2,S")     # and Bob has read it
    n2.close()
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])      # started again: reads its streams from the start
    n2.link.heartbeat()
    n2.receive()
    n1.link.publish()
    assert [e["body"] for e in n2.held("Bob")] == ["once"]
    assert n1.relay.history.remote.outbound_counts()["acknowledged"] == 1
    assert client(redis_server.url).xlen(n1.stream("n2")) == 0


def test_a_crash_between_the_ledger_record_and_the_acknowledgement_delivers_once(redis_server, team, nodes):
    import redis as redis_mod
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    n1.drop("Ann", "m", "TO: Bob\n\nonce")
    n1.send()
    incoming = n2.link.incoming

    def killed():
        if incoming.acks:
            raise redis_mod.ConnectionError("killed before the acknowledgement")
    incoming.acknowledge = killed               # the server (or the node) gone after the ledger's record
    n2.receive()
    assert n2.relay.history.counts()["archived"] == 1
    n1.link.publish()
    assert n1.relay.history.remote.outbound_counts()["published"] == 1     # not acknowledged
    n2.close()
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    n2.link.heartbeat()
    n2.receive()
    n1.link.publish()
    assert [e["body"] for e in n2.held("Bob")] == ["once"]
    assert n1.relay.history.remote.outbound_counts()["acknowledged"] == 1
    assert client(redis_server.url).xlen(n1.stream("n2")) == 0


def test_a_receiver_reading_its_streams_from_the_start_again_delivers_nothing_twice(two, redis_server):
    n1, n2 = two
    r = client(redis_server.url)
    n1.drop("Ann", "m1", "TO: Bob\n\nonce")
    n1.send()
    assert n2.receive() == 1                    # delivered; its sender has not read the acknowledgement yet
    n2.link.incoming.reset()                    # as after a new server: every stream read from its start
    assert n2.receive() == 1                    # known: acknowledged again, not delivered again
    mid = n2.held("Bob")[0]["id"]
    assert n2.acks(r, "n1") == [(mid, None), (mid, None)]
    n1.link.publish()
    assert [e["body"] for e in n2.held("Bob")] == ["once"]
    assert n1.outbound(mid)["n2"]["status"] == "acknowledged" and r.xlen(n1.stream("n2")) == 0
    n2.link.incoming.reset()
    assert n2.receive() == 0


# -- what an entry holds --------------------------------------------------------------------------

def test_an_entry_at_the_receivers_limits_is_delivered_and_one_past_them_is_refused(redis_server, team, nodes, clock):
    """The receiving node's own limits, each at its edge: a body of exactly its max_body_bytes
    (counted in bytes, not characters) and exactly 10,000 recipients are delivered; one byte or
    one recipient more (513 two-byte characters too) is refused with the reason."""
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"], extra='max_body_bytes = "1KiB"')
    for n in (n1, n2):
        n.link.heartbeat()
    crowd = ["Bob"] + [f"a{i}" for i in range(9_999)]
    r = client(redis_server.url)
    for fields in (entry(envelope(clock, body="x" * 1024)), entry(envelope(clock, body="\u00e9" * 512)),
                   entry(envelope(clock, body="crowd"), to=crowd),
                   entry(envelope(clock, body="x" * 1025)), entry(envelope(clock, body="crowd+1"), to=crowd + ["a9999"]),
                   entry(envelope(clock, body="\u00e9" * 513))):
        r.xadd(n1.stream("n2"), fields)
    assert sum(iter(n2.receive, 0)) == 6
    assert sorted(e["body"] for e in n2.held("Bob")) == ["crowd", "x" * 1024, "\u00e9" * 512]
    errors = sorted(row["error"] for row in n2.relay.history.audit(status="failed"))
    assert len(errors) == 3
    assert "the body is 1025 bytes, over this node's max_body_bytes (1024)" in errors[0]
    assert "the body is 1026 bytes, over this node's max_body_bytes (1024)" in errors[1]
    assert "the recipients are not a list of agent names" in errors[2]


def test_malformed_entries_are_recorded_refused_to_their_node_and_never_write_outside(
        redis_server, team, nodes, cli, tmp_path, clock):
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n3 = nodes(redis_server.url, team, "n3", ["Dee"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"], extra='max_body_bytes = "1KiB"')
    for n in (n1, n3, n2):
        n.link.heartbeat()
    r = client(redis_server.url)
    good = envelope(clock)
    outside = tmp_path / "outside"
    old = envelope(clock, id=IdGenerator().new(clock.now - 31 * 86400))
    bad = [entry(good, v="1"), entry(good, v=None), entry(good, v="2\x1b[2J"), entry(good, id="../../../outside/x"),
           entry(b"{not json"),
           entry(good, to=["../../outside"]), entry(good, to=["Zed"]), entry(good, to=["System"]),
           entry({**good, "body": "x" * 2000}), entry({**good, "id": envelope(clock)["id"]}, id=good["id"]),
           entry({**good, "from": "../Ann"}), entry({**good, "sha256": "zz"}),
           entry({**good, "subject": {"x": 1}}), entry({**good, "cwd": "../.."}), {"junk": b"\xff\xfe"},
           entry({**good, "cwd": "a\x00b"}),
           entry({**good, "from": "Bob"}),              # this node's own agent
           entry({**good, "from": "Dee"}),              # another node's agent
           entry({**good, "from": "Cy"}),               # nobody's
           entry(old),                                  # older than the replay window
           entry(b"x" * (9 << 20))]
    for fields in bad:
        r.xadd(n1.stream("n2"), fields)
    r.xadd(n1.stream("n2"), entry(good))                # and one good entry after them
    assert sum(iter(n2.receive, 0)) == len(bad) + 1     # in reads of a few entries at first
    assert [e["body"] for e in n2.held("Bob")] == ["ok"]
    assert n2.receive() == 0                            # nothing read twice
    assert not outside.exists()
    assert sorted(p.name for p in (n2.state / "inbox").iterdir()) == ["Bob", "System"]
    rows = orjson.loads(cli("--root", str(n2.root), "audit", "--status", "failed", "--json").output)
    assert len(rows) == len(bad) and all(r["node"] == "n1" and r["error"] for r in rows)
    reasons = " | ".join(r["error"] for r in rows)
    assert reasons.count("not a relay entry of version 2") == 4        # v=1, no v, a control, junk
    assert "(v=2\\x1b[2J)" in reasons                                  # the version as an escape
    for why in ("not a relay message id", "not JSON",
                "not a list of agent names", "none of Zed is an agent of node n2", "none of System is an agent",
                "over this node's max_body_bytes", "the entry's message id", "is not an agent name", "no sha256",
                "'subject' is not text", "outside this node's project root",
                "the sender Bob is an agent of this node (n2)", "the sender Dee is not an agent of node n1",
                "the sender Cy is not in the team's directory", "older than the replay window",
                "over what this node reads"):
        assert why in reasons, why
    # Each entry with a message id is answered: the good one acknowledged, the others refused with why.
    acks = n2.acks(r, "n1")
    assert [mid for mid, refusal in acks if refusal is None] == [good["id"]]
    assert len([mid for mid, refusal in acks if refusal]) >= len(bad) - 3     # not those with no id (or too large)
    status = orjson.loads(cli("--root", str(n2.root), "status", "--json", ok=False).output)["federation"]
    assert status["received"] == {"delivered": 1, "refused": len(bad)}


def test_an_entry_over_the_receivers_bound_is_refused_to_its_sender_once(redis_server, team, nodes):
    n1 = nodes(redis_server.url, team, "n1", ["Ann"], extra='max_body_bytes = "8MiB"')
    n2 = nodes(redis_server.url, team, "n2", ["Bob"], extra='max_body_bytes = "1KiB"')
    exchange(n1, n2, rounds=1)
    n1.drop("Ann", "big", "TO: Bob\n\n" + "x" * (3 << 20))
    n1.send()
    n2.receive()
    n1.link.publish()
    [row] = n1.relay.history.remote.outbound(n1.relay.history.audit().fetchone()["id"])
    assert row["status"] == "refused" and "bytes" in row["error"]


def test_ids_are_each_nodes_own_a_repeat_is_known_and_another_nodes_message_under_a_taken_id_is_delivered(
        redis_server, team, nodes, clock):
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n3 = nodes(redis_server.url, team, "n3", ["Cy"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    for n in (n1, n3, n2):
        n.link.heartbeat()
    r = client(redis_server.url)
    good = envelope(clock)
    r.xadd(n1.stream("n2"), entry(good))
    assert n2.receive() == 1
    # Another node's message under the same id (a node that learnt the id copied it, or two
    # senders chose one ID:): delivered under an id of n2's own, never taken for a repeat nor
    # refused. One node's id twice in one read with other content is refused; the same message
    # again (a publish repeated) is known; n3's id twice in a read with other content is refused.
    other = {**good, "from": "Cy", "body": "another message", "sha256": "b" * 64}
    third = envelope(clock, body="a third", sha256="c" * 64)
    r.xadd(n3.stream("n2"), entry(other))
    r.xadd(n1.stream("n2"), entry(third))
    r.xadd(n1.stream("n2"), entry({**third, "body": "not the third", "sha256": "d" * 64}))
    r.xadd(n1.stream("n2"), entry(good))
    r.xadd(n3.stream("n2"), entry({**good, "from": "Cy"}))
    assert n2.receive() == 5
    held = {e["body"]: e for e in n2.held("Bob")}
    assert sorted(held) == ["a third", "another message", "ok"]
    assert held["ok"]["id"] == good["id"] and held["another message"]["id"] != good["id"]
    assert held["another message"]["remote_id"] == good["id"]
    errors = refusals(n2)
    assert len(errors) == 2, errors
    assert any(f"message id {third['id']} came twice from node n1 in one read with other content" in e for e in errors)
    assert any(f"message id {good['id']} came twice from node n3 in one read with other content" in e for e in errors)
    assert sorted(mid for mid, refusal in n2.acks(r, "n1") if refusal is None) == sorted(
        [good["id"], good["id"], third["id"]])
    assert sorted(bool(refusal) for _, refusal in n2.acks(r, "n3")) == [False, True]


def test_an_id_received_before_from_the_same_node_with_other_content_is_refused(two, redis_server, clock):
    """The same node, the same id, another original (sha256): no repeat of what was delivered,
    another message under its id; refused with the reason, the first left as it is."""
    n1, n2 = two
    r = client(redis_server.url)
    good = envelope(clock)
    r.xadd(n1.stream("n2"), entry(good))
    assert n2.receive() == 1
    r.xadd(n1.stream("n2"), entry({**good, "body": "rewritten", "sha256": "f" * 64}))
    assert n2.receive() == 1
    assert [e["body"] for e in n2.held("Bob")] == ["ok"]
    [error] = refusals(n2)
    assert f"message id {good['id']} was received before from node n1 with other content" in error
    assert [refusal is None for mid, refusal in n2.acks(r, "n1")] == [True, False]


def test_a_repeat_is_acknowledged_again_even_once_its_id_is_older_than_the_replay_window(two, redis_server, clock):
    """Ids received are kept for the replay window and forgotten by an hourly sweep: a message
    received before is known by its id, however old the id has grown since, until that sweep
    forgets it: acknowledged again, never refused for its age."""
    n1, n2 = two
    r = client(redis_server.url)
    good = envelope(clock, id=IdGenerator().new(clock.now - 29 * 86400))
    r.xadd(n1.stream("n2"), entry(good))
    assert n2.receive() == 1
    clock.advance(2 * 86400)                            # the id is 31 days old now
    r.xadd(n1.stream("n2"), entry(good))                # published again (its acknowledgement was lost)
    assert n2.receive() == 1
    assert [e["body"] for e in n2.held("Bob")] == ["ok"] and refusals(n2) == []
    assert n2.acks(r, "n1") == [(good["id"], None), (good["id"], None)]


def test_an_entry_never_replaces_an_envelope_of_another_message_a_recipient_holds_under_its_id(
        redis_server, team, nodes, clock):
    """The ledger forgets a message at the retention sweep; its recipient may still hold it,
    unread even. An entry under that id (a sender on another node chose it) is delivered under
    an id of this node's, and the envelope held stays as it is."""
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob", "Cy"])
    exchange(n1, n2, rounds=1)
    good = envelope(clock)
    old = {**good, "from": "Cy", "body": "an old local message", "sha256": "e" * 64}
    unread = n2.state / "inbox/Bob/new" / f"{good['id']}.json"
    unread.write_bytes(orjson.dumps(old))
    read = {**old, "id": envelope(clock)["id"]}
    (n2.state / "inbox/Cy/cur" / f"{read['id']}.json:2,S").write_bytes(orjson.dumps(read))
    r = client(redis_server.url)
    r.xadd(n1.stream("n2"), entry(good))
    r.xadd(n1.stream("n2"), entry({**good, "id": read["id"], "to": ["Cy"]}, to=["Cy"]))
    assert n2.receive() == 2
    assert orjson.loads(unread.read_bytes())["body"] == "an old local message"
    assert sorted(e["body"] for e in n2.held("Bob")) == ["an old local message", "ok"]
    assert sorted(e["body"] for e in n2.held("Cy")) == ["an old local message", "ok"]
    renamed = {e["remote_id"]: e["id"] for a in ("Bob", "Cy") for e in n2.held(a) if e.get("remote_id")}
    assert set(renamed) == {good["id"], read["id"]} and not set(renamed.values()) & set(renamed)
    assert refusals(n2) == []
    assert sorted(mid for mid, refusal in n2.acks(r, "n1") if not refusal) == sorted([good["id"], read["id"]])


# -- the receiver's inboxes and memory --------------------------------------------------------------

def test_a_link_planted_in_an_inbox_holds_the_entry_until_fixed_or_retry_period_then_it_is_refused(
        redis_server, team, nodes, tmp_path):
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"], extra='retry_period = "10m"')
    exchange(n1, n2, rounds=1)
    outside = tmp_path / "outside"
    outside.mkdir()
    new = n2.state / "inbox/Bob/new"
    new.rmdir()
    new.symlink_to(outside)                             # planted: relay never writes through it
    r = client(redis_server.url)
    n1.drop("Ann", "m1", "TO: Bob\n\nfirst")
    n1.send()
    assert n2.receive() == 1
    n1.link.publish()
    assert list(outside.iterdir()) == [] and n1.relay.history.remote.outbound_counts()["published"] == 1
    new.unlink()
    new.mkdir()                                         # fixed: the next try delivers it, once
    n2.clock.advance(5)
    n2.receive()
    n1.link.publish()
    assert [e["body"] for e in n2.held("Bob")] == ["first"]
    assert n1.relay.history.remote.outbound_counts()["acknowledged"] == 1 and r.xlen(n1.stream("n2")) == 0
    (n2.state / "inbox/Bob/new").rename(n2.state / "inbox/Bob/new.real")
    new.symlink_to(outside)
    n1.drop("Ann", "m2", "TO: Bob\n\nsecond")
    n1.send()
    n2.receive()
    n2.clock.advance(601)                               # past retry_period: failed with why, refused to n1
    n2.receive()
    n1.link.publish()
    assert list(outside.iterdir()) == [] and r.xlen(n1.stream("n2")) == 0
    [failed] = list(n2.relay.history.audit(status="failed"))
    assert failed["node"] == "n1" and "gave up after 601s: not delivered to Bob" in failed["error"]
    assert "delivered to nobody" in failed["error"]
    row = n1.outbound(failed["id"])["n2"]
    assert row["status"] == "refused" and "gave up after 601s" in row["error"]


def test_a_received_message_whose_sync_fails_is_given_up_at_once_never_retried_into_success(two, redis_server):
    """An fsync error means the data may be lost: the receiving node does not try again until it
    seems to work. The message fails at once with the reason, refused to its sender; nothing is
    in Bob's inbox, then or later."""
    n1, n2 = two

    def eio(fd):
        raise OSError(errno.EIO, "Input/output error")

    syncer = n2.link.incoming.syncer
    real, syncer.fsync = syncer.fsync, eio
    n1.drop("Ann", "m", "TO: Bob\n\nmaybe lost")
    n1.send()
    assert n2.receive() == 1
    syncer.fsync = real
    n2.clock.advance(60)
    n2.receive()
    n1.link.publish()
    [failed] = list(n2.relay.history.audit(status="failed"))
    assert "Input/output error" in failed["error"] and "delivered to nobody" in failed["error"]
    assert n2.held("Bob") == [] and not n2.link.incoming.retry
    row = n1.outbound(failed["id"])["n2"]
    assert row["status"] == "refused" and "Input/output error" in row["error"]


def test_acknowledgements_do_not_depend_on_the_receivers_clock_agreeing_with_the_servers(two, redis_server):
    n1, n2 = two
    n2.clock.advance(2 * 3600)                          # the nodes' clock two hours ahead of the server's
    n1.drop("Ann", "m", "TO: Bob\n\nacknowledged")
    n1.send()
    n2.receive()
    n1.link.publish()
    mid = n2.held("Bob")[0]["id"]
    assert n1.outbound(mid)["n2"]["status"] == "acknowledged"


def test_an_entry_that_keeps_failing_does_not_hold_back_the_entries_behind_it(
        redis_server, team, nodes, tmp_path):
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob", "Cy"])
    exchange(n1, n2, rounds=1)
    outside = tmp_path / "outside"
    outside.mkdir()
    new = n2.state / "inbox/Bob/new"
    new.rmdir()
    new.symlink_to(outside)                             # Bob's inbox fails, Cy's works
    n1.drop("Ann", "m1", "TO: Bob\n\nheld")
    n1.send()
    assert n2.receive() == 1 and len(n2.link.incoming.retry) == 1
    n1.drop("Ann", "m2", "TO: Cy\n\nbehind it, delivered at once")
    n1.send()
    assert n2.receive() == 1
    n1.link.publish()
    assert [e["body"] for e in n2.held("Cy")] == ["behind it, delivered at once"]
    counts = n1.relay.history.remote.outbound_counts()
    assert (counts["published"], counts["acknowledged"]) == (1, 1)
    n1.drop("Ann", "m3", "TO: Cy\n\nread once")
    n1.send()
    assert n2.receive() == 1                            # its entry stays until n1 reads the acknowledgement
    new.unlink()
    new.mkdir()                                         # fixed: tried again on its own, delivered
    n2.clock.advance(5)
    assert n2.receive() == 1                            # read on its own: the cursor stays past m3,
    n1.link.publish()                                   # which is not read again
    assert [e["body"] for e in n2.held("Bob")] == ["held"] and not n2.link.incoming.retry
    assert n1.relay.history.remote.outbound_counts()["acknowledged"] == 3
    assert list(outside.iterdir()) == []


def test_the_receiver_reads_large_entries_a_few_at_a_time_within_batch_bytes(redis_server, team, nodes, clock):
    """256 entries of 1 MiB in one read held about 800 MB (the entry, the parsed envelope, the one
    written): a node with less memory was killed, started again, read the same 256 again: forever.
    A read starts small, and holds about batch_bytes at most once entries are seen to be large."""
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"], extra='batch_bytes = "2MiB"')
    exchange(n1, n2, rounds=1)
    r = client(redis_server.url)
    for i in range(30):
        doc = envelope(clock, body=f"{i} " + "x" * 100_000, sha256=f"{i:064x}")
        r.xadd(n1.stream("n2"), entry(doc))
    reads = []
    while (n := n2.receive()) > 0:
        reads.append(n)
    assert sum(reads) == 30 and len(n2.held("Bob")) == 30
    assert reads[0] <= 8 and max(reads[1:]) <= 2 * 1024 * 1024 // (4 * 100_000), reads


def test_messages_for_other_nodes_are_offered_only_to_a_link_and_within_a_bound(redis_server, team, nodes, clock):
    """run --once drains with no link beside the loop: every envelope for another node was kept in
    memory until the end (256 of 1 MiB: 320 MB, 94 MB with local recipients)."""
    from relay.core.daemon import Relay
    from relay.core.routes import MAX_OFFERED
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    n1.close()
    with Relay(n1.config, clock=clock) as alone:         # as run --once drains
        for i in range(3):
            n1.drop("Ann", f"m{i}", f"TO: Bob\n\n{i}")
        alone.drain(now_fn=clock, wait=lambda s: None)
        assert len(alone.router.offered) == 0 and len(alone.router.history.remote.outbound_due(clock.now, 10)) == 3
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])   # a link beside the loop takes offers, up to a bound
    n1.link.heartbeat()                                 # (of senders it announced: its first act)
    big = "x" * 1_000_000
    for i in range(20):
        n1.drop("Ann", f"b{i}", f"TO: Bob\n\n{big}")
    n1.relay.drain(now_fn=clock, wait=lambda s: None)
    offered = n1.relay.router.offered
    assert 0 < len(offered) < 20 and sum(len(o[3]) for o in offered) <= MAX_OFFERED
    while n1.link.publish():
        pass
    while n2.receive():
        pass
    assert len(n2.held("Bob")) == 23 and len(offered) == 0


def test_the_publisher_takes_large_envelopes_a_few_at_a_time_within_batch_bytes(tmp_path, team, nodes):
    server = RedisServer(tmp_path / "redis").start()
    try:
        n1 = nodes(server.url, team, "n1", ["Ann"], extra='batch_bytes = "2MiB"')
        n2 = nodes(server.url, team, "n2", ["Bob"])
        exchange(n1, n2, rounds=1)
        server.stop()                                   # a backlog builds while the server is away
        for i in range(12):
            n1.drop("Ann", f"m{i}", f"TO: Bob\n\n{i} " + "x" * 100_000)
        n1.send()
        server.start()
        n1.link.heartbeat()
        published = list(iter(n1.link.publish, 0))
        assert sum(published) == 12 and max(published) <= 2 * 1024 * 1024 // (4 * 100_000) + 1, published
        n2.link.heartbeat()
        while n2.receive():
            pass
        assert len(n2.held("Bob")) == 12
    finally:
        server.stop()


# -- a name that moved -------------------------------------------------------------------------------

def test_a_row_for_a_node_that_no_longer_holds_its_recipient_is_rerouted_to_the_node_that_does(
        redis_server, team, nodes, clock, tmp_path):
    """A node renamed (stopped, started under another name): its old entry goes when the operator
    deletes it (a node gone for good), and once the old name would have timed out, what waited
    for it goes to the node that lists its agents now."""
    from fednodes import Node
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    n1.close()                                          # stopped to be renamed ...
    n2.drop("Bob", "m1", "TO: Ann\n\nsent while n1 was stopped")
    n2.send()
    mid = n2.relay.history.audit().fetchone()["id"]
    assert n2.outbound(mid)["n1"]["status"] == "published"
    renamed = Node(n1.root, redis_server.url, team, "laptop", ["Ann"], clock)    # ... and started as laptop
    try:
        r = client(redis_server.url)
        assert renamed.link.heartbeat()
        assert renamed.link.conflicts == [("Ann", "n1")]     # its old entry still lists Ann
        n2.link.heartbeat()
        assert n2.relay.history.remote.agents()["Ann"][0] == "n1"   # no claim moves a name its node lists
        seconds, _ = r.time()
        r.hset(n1.key(), "seen", str(seconds - 60))         # n1 not seen for longer than its timeout ...
        n2.link.heartbeat()
        r.hset(n1.key(), mapping=RETIRED)                   # ... and retired by an operator: gone for good
        assert renamed.link.heartbeat() and renamed.link.conflicts == []
        n2.link.heartbeat()
        assert n2.relay.history.remote.agents()["Ann"][0] == "laptop"
        n2.link.check()                                     # rerouted
        assert set(n2.outbound(mid)) == {"laptop"}
        assert any(e["event"] == "rerouted" for e in n2.relay.history.events(mid))
        n2.link.publish()
        renamed.receive()
        n2.link.publish()
        assert [e["body"] for e in renamed.held("Ann")] == ["sent while n1 was stopped"]
        assert n2.outbound(mid)["laptop"]["status"] == "acknowledged"
        n2.drop("Bob", "m2", "TO: Ann\n\nto the new name")
        n2.send()
        renamed.receive()
        assert sorted(e["body"] for e in renamed.held("Ann")) == ["sent while n1 was stopped", "to the new name"]
    finally:
        renamed.close()


def test_a_new_nodes_first_messages_after_a_retire_are_delivered_before_the_receivers_next_look(
        redis_server, team, nodes, cli):
    """n3, listing Bob, started while n2 (gone) still listed him. An operator retires n2 with the
    line `relay federation retire` prints; n3's Bob writes at once, and n1 reads that entry before
    its next look at the directory: delivered (the name's holder no longer lists it, and n3 alone
    does), not refused as another node's. While n2 still lists Bob, n3 cannot speak for him."""
    import shlex
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    n2.close()                                                  # gone for good
    n3 = nodes(redis_server.url, team, "n3", ["Bob"])
    assert n3.link.heartbeat() and n3.link.conflicts == [("Bob", "n2")]
    n1.link.look()
    assert n1.relay.history.remote.agents()["Bob"][0] == "n2"
    n3.drop("Bob", "early", "TO: Ann\n\nwhile n2 still lists Bob")
    n3.send()
    n1.receive()
    assert n1.held("Ann") == []                                 # n2's name: refused
    line = cli("federation", "retire", "n2", "--team", team).output.strip()
    client(redis_server.url).execute_command(*shlex.split(line))
    n3.link.look()
    n3.drop("Bob", "m", "TO: Ann\n\nfirst after the retire")
    n3.send()
    n1.receive()                                                # n1 has not looked since the retire
    assert [e["body"] for e in n1.held("Ann")] == ["first after the retire"]
    n1.link.incoming.acknowledge()
    n3.link.publish()
    [mid] = [r["id"] for r in n3.relay.history.audit() if r["name"] == "m"]
    assert n3.outbound(mid)["n1"]["status"] == "acknowledged"
    # Ann's answer, written before n1's look too, goes to n2's stream; the look then finds n2
    # retired (gone for good, whatever its last heartbeat says) and Bob on n3: rerouted at once.
    n1.drop("Ann", "answer", "TO: Bob\n\nacross the retire")
    n1.send()
    n1.link.look()
    n1.link.check()
    n1.link.publish()
    n3.receive()
    assert [e["body"] for e in n3.held("Bob")] == ["across the retire"]


def test_a_row_not_yet_published_for_a_node_gone_for_good_is_rerouted_too(redis_server, team, nodes, clock):
    """What waits for a node gone for good goes to the node that lists its agent now, whether it
    was published to the old node already or was still waiting to be published."""
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    n1.close()
    n2.drop("Bob", "m", "TO: Ann\n\nqueued, not yet published")
    n2.relay.drain(now_fn=clock, wait=lambda s: None)          # recorded for n1; the link has not published it
    mid = n2.relay.history.audit().fetchone()["id"]
    assert n2.outbound(mid)["n1"]["status"] == "pending"
    r = client(redis_server.url)
    seconds, _ = r.time()
    r.hset(n1.key(), "seen", str(seconds - 60))                # n1 not seen for longer than its timeout ...
    n2.link.heartbeat()
    r.hset(n1.key(), mapping=RETIRED)                          # ... and retired by an operator: gone for good
    n3 = nodes(redis_server.url, team, "n3", ["Ann"])
    assert n3.link.heartbeat()
    n2.link.heartbeat()
    assert n2.relay.history.remote.agents()["Ann"][0] == "n3"
    n2.link.check()
    assert set(n2.outbound(mid)) == {"n3"}
    n2.link.publish()
    n3.receive()
    n2.link.publish()
    assert [e["body"] for e in n3.held("Ann")] == ["queued, not yet published"]
    assert n2.outbound(mid)["n3"]["status"] == "acknowledged"


def test_a_row_for_a_live_node_that_dropped_its_recipient_is_rerouted_to_the_node_that_holds_it_now(
        redis_server, team, nodes, cli):
    import shlex
    import shutil
    n1 = nodes(redis_server.url, team, "n1", ["Al"])
    for sub in ("tmp", "new", "cur"):
        (n1.state / "inbox/Ann" / sub).mkdir(parents=True)
    (n1.state / "outbox/Ann").mkdir(parents=True)       # Ann, an agent of n1 by her directories
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    assert n2.relay.history.remote.agents()["Ann"][0] == "n1"
    n2.drop("Bob", "m", "TO: Ann\n\nfollows Ann")
    n2.send()                                           # published to n1, not read yet
    shutil.rmtree(n1.state / "inbox/Ann")
    shutil.rmtree(n1.state / "outbox/Ann")
    assert n1.link.heartbeat()                          # n1 lists Al alone now
    n3 = nodes(redis_server.url, team, "n3", ["Ann"])   # Ann moved to n3 ...
    assert n3.link.heartbeat() and n3.link.conflicts == [("Ann", "n1")]     # ... but n1 holds her claim
    n2.link.heartbeat()
    assert "Ann" not in n2.link.directory.routes
    line = cli("federation", "claim-grant", "Ann", "n3", "--team", team).output.strip()
    client(redis_server.url).execute_command(*shlex.split(line))    # the admin moves the name
    n2.clock.advance(10)                                # the claims are read again (claims.REFRESH)
    n2.link.heartbeat()
    assert n2.relay.history.remote.agents()["Ann"][0] == "n3" and n2.link.alive["n1"]
    n2.link.check()
    exchange(n1, n2, n3)
    mid = n2.relay.history.audit().fetchone()["id"]
    assert {n: o["status"] for n, o in n2.outbound(mid).items()} == {"n3": "acknowledged"}
    assert [e["body"] for e in n3.held("Ann")] == ["follows Ann"]


def test_a_row_for_a_node_that_dropped_its_recipient_that_no_node_holds_now_is_refused_once_not_republished(
        redis_server, team, nodes, clock):
    """n2 stops hosting Bob just as Ann writes to him: n2 answers "none of Bob is an agent of
    node n2". No node holds Bob: the row waits MOVED_WAIT for one to announce him, its entry
    kept (no check takes it for one the server lost and publishes every row again), then it is
    refused with n2's reason and Ann gets her bounce."""
    import shutil
    from relay.federation.publisher import MOVED_WAIT
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Carl"])
    for sub in ("tmp", "new", "cur"):
        (n2.state / "inbox/Bob" / sub).mkdir(parents=True)
    (n2.state / "outbox/Bob").mkdir(parents=True)
    exchange(n1, n2, rounds=1)
    shutil.rmtree(n2.state / "inbox/Bob")
    shutil.rmtree(n2.state / "outbox/Bob")
    n1.drop("Ann", "m", "TO: Bob\n\nare you there?")
    n1.send()
    [mid] = [row["id"] for row in n1.relay.history.audit() if row["name"] == "m"]
    waited = 0.0
    while waited <= MOVED_WAIT:
        clock.advance(1.0)
        waited += 1.0
        n2.receive()
        n2.link.heartbeat()
        n1.link.heartbeat()
        n1.link.check()
        n1.link.publish()
        if waited < MOVED_WAIT:
            assert n1.outbound(mid)["n2"]["status"] == "published"
    row = n1.outbound(mid)["n2"]
    assert (row["status"], row["attempts"]) == ("refused", 1) and row["error"] == "none of Bob is an agent of node n2"
    assert client(redis_server.url).xlen(n1.stream("n2")) == 0
    for _ in range(3):
        n1.relay.step(clock.advance(1))
    assert [(e["kind"], e["from"], e["subject"]) for e in n1.held("Ann")] == [
        ("bounce", "System", f"Undelivered: your message {mid}")]


def test_a_rerouted_row_leaves_no_entry_in_the_stream_of_its_former_node(redis_server, team, nodes, clock):
    from fednodes import Node
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    n1.close()
    n2.drop("Bob", "m1", "TO: Ann\n\nsent while n1 was stopped")
    n2.send()
    renamed = Node(n1.root, redis_server.url, team, "laptop", ["Ann"], clock)
    try:
        r = client(redis_server.url)
        seconds, _ = r.time()
        r.hset(n1.key(), "seen", str(seconds - 60))
        n2.link.heartbeat()
        r.hset(n1.key(), mapping=RETIRED)
        renamed.link.heartbeat()
        n2.link.heartbeat()
        n2.link.check()
        n2.link.publish()
        renamed.receive()
        n2.link.publish()
        assert [e["body"] for e in renamed.held("Ann")] == ["sent while n1 was stopped"]
        assert r.xlen(n2.stream("n1")) == 0
    finally:
        renamed.close()


def test_a_recipient_moved_to_a_node_that_already_has_the_message_is_refused_with_the_reason_never_dropped(
        redis_server, team, nodes):
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    n3 = nodes(redis_server.url, team, "n3", ["Dee"])
    exchange(n1, n2, n3, rounds=1)
    n1.close()                                          # n1 gone for good; Ann moves to n3
    n2.drop("Bob", "m", "TO: Ann, Dee\n\nto Ann and Dee")
    exchange(n2, n3)
    assert [e["body"] for e in n3.held("Dee")] == ["to Ann and Dee"]
    for sub in ("tmp", "new", "cur"):
        (n3.state / "inbox/Ann" / sub).mkdir(parents=True, exist_ok=True)
    r = client(redis_server.url)
    seconds, _ = r.time()
    r.hset(n1.key(), "seen", str(seconds - 60))
    n2.link.heartbeat()
    r.hset(n1.key(), mapping=RETIRED)
    n3.link.heartbeat()
    n2.link.heartbeat()
    assert n2.relay.history.remote.agents()["Ann"][0] == "n3"
    n2.link.check()
    mid = n2.relay.history.audit().fetchone()["id"]
    # n3 knows this message by its id (Dee has it): it cannot be sent there again for Ann. The row
    # for Ann is refused with the reason, shown by relay show; nothing is dropped unsaid.
    rows = n2.outbound(mid)
    assert rows["n3"]["status"] == "acknowledged" and rows["n1"]["status"] == "refused"
    assert "Ann moved to node n3, which already has this message for Dee" in rows["n1"]["error"]
    exchange(n2, n3)
    assert n3.held("Ann") == [] and [e["body"] for e in n3.held("Dee")] == ["to Ann and Dee"]


# -- flow control, hooks, retention, expire and retry ----------------------------------------------

def test_a_remote_recipient_shed_by_an_earlier_attempt_is_not_published_when_the_message_is_retried(
        redis_server, team, nodes):
    from conftest import failing_create
    n1 = nodes(redis_server.url, team, "n1", ["Ann", "Al"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    # Bob was an agent of n1, archived there, and now lives on n2: n1 still sheds him.
    n1.relay.ledger.operations.archive_agent("Bob", n1.clock.now, "operator:test")
    exchange(n1, n2, rounds=1)
    switch = failing_create(n1.relay, PermissionError(13, "Permission denied"), lambda rel: rel.startswith("inbox/Al/"))
    n1.drop("Ann", "m", "TO: Al, Bob\n\nfor Al only")
    n1.relay.step()                                 # Al fails (retried), Bob is shed
    mid = n1.relay.history.audit().fetchone()["id"]
    assert n1.outbound(mid) == {}
    switch["on"] = False
    n1.clock.advance(600)
    n1.send()                                       # the retry: Al gets it; Bob still is not published
    assert [e["body"] for e in n1.held("Al")] == ["for Al only"]
    assert n1.outbound(mid) == {} and n1.relay.history.get(mid)["status"] == "archived"
    assert client(redis_server.url).xlen(n1.stream("n2")) == 0


def test_a_sender_on_another_node_named_as_an_agent_archived_here_is_still_heard(redis_server, team, nodes):
    """Bob was an agent of n2 and is archived there; the Bob of n1 (another agent, the name his
    now) writes to n2's Cy: the archiving of n2's Bob says nothing about who may send from n1."""
    n1 = nodes(redis_server.url, team, "n1", ["Bob"])
    n2 = nodes(redis_server.url, team, "n2", ["Cy"])
    n2.relay.ledger.operations.archive_agent("Bob", n2.clock.now, "operator:test")
    exchange(n1, n2, rounds=1)
    n1.drop("Bob", "m", "TO: Cy\n\nfrom the other Bob")
    exchange(n1, n2)
    assert [e["body"] for e in n2.held("Cy")] == ["from the other Bob"]


def test_the_receiving_node_applies_its_own_shedding_limits_to_incoming_messages(redis_server, team, nodes, cli):
    n1 = nodes(redis_server.url, team, "n1", ["Ann", "Al", "Ed"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob", "Cy", "Dee"],
               extra='pair_rate = 2\npair_window = "1h"\nqueue_limit = 3')
    n2.relay.ledger.operations.archive_agent("Dee", n2.clock.now, "operator:test")
    exchange(n1, n2, rounds=1)
    for i in range(3):                              # an echo loop across nodes is stopped too
        n1.drop("Ann", f"b{i}", f"TO: Bob\n\nto Bob {i}")
    n1.drop("Ann", "d", "TO: Cy, Dee\n\nnot for an archived agent")
    exchange(n1, n2)
    assert [e["body"] for e in n2.held("Bob")] == ["to Bob 0", "to Bob 1"]
    assert [e["body"] for e in n2.held("Cy")] == ["not for an archived agent"] and n2.held("Dee") == []
    rows = {r["subject"] or r["body"]: r for r in n2.relay.history.audit()}
    assert rows["to Bob 2"]["status"] == "failed" and "per_pair_rate" in rows["to Bob 2"]["error"]
    assert [s["reason"] for s in n2.relay.history.sheds(rows["to Bob 2"]["id"])] == ["per_pair_rate"]
    assert rows["not for an archived agent"]["status"] == "archived"
    assert [(s["recipient"], s["reason"]) for s in n2.relay.history.sheds(rows["not for an archived agent"]["id"])] == \
        [("Dee", "recipient_archived")]
    assert n2.relay.history.shed_counts() == {"per_pair_rate": 1, "recipient_archived": 1}
    # The sender hears of it: shed for every recipient is refused by the node, with why.
    sent = {r["body"]: r for r in n1.relay.history.audit()}
    row = n1.outbound(sent["to Bob 2"]["id"])["n2"]
    assert row["status"] == "refused" and "per_pair_rate" in row["error"]
    assert n1.outbound(sent["not for an archived agent"]["id"])["n2"]["status"] == "acknowledged"
    # queue_limit: Cy holds one unread; two more fill it to 3; the next is shed.
    for i, sender in enumerate(("Al", "Ed", "Al")):
        n1.drop(sender, f"c{i}", f"TO: Cy\n\nto Cy {i}")
        exchange(n1, n2)
    assert [e["body"] for e in n2.held("Cy")] == ["not for an archived agent", "to Cy 0", "to Cy 1"]
    [last] = [r for r in n2.relay.history.audit() if r["body"] == "to Cy 2"]
    assert [s["reason"] for s in n2.relay.history.sheds(last["id"])] == ["queue_limit"]
    assert n1.relay.history.remote.outbound_counts()["published"] == 0
    assert "queue_limit" in cli("--root", str(n2.root), "status", ok=False).output


def test_a_message_received_from_another_node_runs_the_on_deliver_hook(redis_server, team, nodes, tmp_path):
    log = tmp_path / "hooks.log"
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob", "Cy"], extra=(
        f'on_deliver = \'printf "%s|%s|%s|%s\\\\n" "$RELAY_RECIPIENT" "$RELAY_SENDER" "$RELAY_SUBJECT" '
        f'"$RELAY_ENVELOPE" >> {log}\''))
    exchange(n1, n2, rounds=1)
    n1.drop("Ann", "m", "TO: Bob, Cy\nSUBJECT: across\n\nwake up")
    exchange(n1, n2)
    assert n2.link.hooks.join(30)
    mid = n2.held("Bob")[0]["id"]
    assert sorted(log.read_text().splitlines()) == [
        f"{who}|Ann|across|{n2.state}/inbox/{who}/new/{mid}.json" for who in ("Bob", "Cy")]


def test_an_unknown_recipient_waits_for_the_directory_then_fails_and_a_message_waiting_for_the_server_is_not_swept(
        tmp_path, team, nodes):
    server = RedisServer(tmp_path / "redis").start()
    try:
        n1 = nodes(server.url, team, "n1", ["Ann"])
        n2 = nodes(server.url, team, "n2", ["Bob"])
        exchange(n1, n2, rounds=1)
        n1.drop("Ann", "m0", "TO: Ghost\n\nnobody has Ghost")
        counts, _ = n1.send()
        assert counts.failed == 0                       # it may be a name being announced: it waits ...
        for _ in range(3):
            n1.clock.advance(3)
            n1.link.look()                              # ... for the directory read whole since
            counts, _ = n1.send()
            if counts.failed:
                break
        assert counts.failed == 1
        assert "unknown recipient Ghost; known agents: Ann, Bob" in \
            n1.relay.history.audit(status="failed").fetchone()["error"]
        server.stop()
        n1.drop("Ann", "m1", "TO: Bob\n\nwaits for the server")
        counts, _ = n1.send()
        assert counts.archived == 1
        later = n1.clock.now + 8 * 86400                # retention 7d
        swept = n1.relay.sweep(later)                   # (m0's bounce to Ann is swept, archived here)
        assert swept.archived == 1 and n1.relay.history.counts()["archived"] == 1
        server.start()
        exchange(n1, n2)
        assert [e["body"] for e in n2.held("Bob")] == ["waits for the server"]
        # Acknowledged: swept now.
        assert n1.relay.sweep(later).archived == 1 and n1.relay.history.counts()["archived"] == 0
    finally:
        server.stop()


def test_a_failed_message_whose_remote_part_waits_for_the_server_is_not_swept_with_it(tmp_path, team, nodes):
    from conftest import failing_create
    server = RedisServer(tmp_path / "redis").start()
    try:
        n1 = nodes(server.url, team, "n1", ["Ann", "Al"], extra='max_retries = 1\nretry_period = "1s"')
        n2 = nodes(server.url, team, "n2", ["Bob"])
        exchange(n1, n2, rounds=1)
        server.stop()
        failing_create(n1.relay, PermissionError(13, "Permission denied"), lambda rel: rel.startswith("inbox/Al/"))
        n1.drop("Ann", "m", "TO: Al, Bob\n\nBob still gets it")
        for _ in range(3):
            n1.send()
            n1.clock.advance(60)
        mid = n1.relay.history.audit(sender="Ann").fetchone()["id"]
        assert n1.relay.history.get(mid)["status"] == "failed" and n1.outbound(mid)["n2"]["status"] == "pending"
        assert n1.relay.sweep(n1.clock.now, older_than=0.001).failed == 0
        assert n1.relay.sweep_all(n1.clock.now, older_than=0.001, dry_run=True).failed == 0
        assert n1.outbound(mid)["n2"]["status"] == "pending"
        server.start()
        exchange(n1, n2)
        assert n1.outbound(mid)["n2"]["status"] == "acknowledged"
        assert [e["body"] for e in n2.held("Bob")] == ["Bob still gets it"]
        assert n1.relay.sweep(n1.clock.now, older_than=0.001).failed == 1      # acknowledged: swept now
    finally:
        server.stop()


def test_expire_and_retry_of_a_message_whose_remote_part_waits_for_the_server(tmp_path, team, nodes, cli):
    from conftest import failing_create
    server = RedisServer(tmp_path / "redis").start()
    try:
        n1 = nodes(server.url, team, "n1", ["Ann", "Al"])
        n2 = nodes(server.url, team, "n2", ["Bob"])
        exchange(n1, n2, rounds=1)
        server.stop()
        switch = failing_create(n1.relay, PermissionError(13, "Permission denied"), lambda r: r.startswith("inbox/Al/"))
        n1.drop("Ann", "m", "TO: Al, Bob\n\ncalled off")
        n1.send()
        mid = n1.relay.history.audit().fetchone()["id"]
        assert n1.relay.history.get(mid)["status"] == "pending" and n1.outbound(mid)["n2"]["status"] == "pending"
        out = cli("--root", str(n1.root), "expire", mid).output
        assert "expired; will not be delivered" in out
        server.start()
        exchange(n1, n2)
        exchange(n1, n2)
        assert n2.held("Bob") == []                 # expired: not published to n2 either
        doc = orjson.loads(cli("--root", str(n1.root), "show", mid, "--json").output)
        assert doc["status"] == "failed" and all(o["status"] == "pending" for o in doc["remote"])
        # relay retry puts it back whole: n2 gets it then, once.
        switch["on"] = False
        cli("--root", str(n1.root), "retry", mid)
        exchange(n1, n2)
        exchange(n1, n2)
        assert [e["body"] for e in n2.held("Bob")] == ["called off"]
        assert [e["body"] for e in n1.held("Al")] == ["called off"]
        assert n1.outbound(mid)["n2"]["status"] == "acknowledged"
    finally:
        server.stop()


def test_the_log_says_which_recipients_were_delivered_here_and_which_are_queued_for_another_node(
        redis_server, team, nodes, caplog):
    """A message is archived once its local links and its queue for other nodes are durable:
    its log line names the local deliveries and, apart, the recipients queued for each node (not
    delivered there yet: `relay show` says when their node acknowledges them)."""
    import logging
    n1 = nodes(redis_server.url, team, "n1", ["Ann", "Cy"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    with caplog.at_level(logging.INFO, logger="relay"):
        n1.drop("Ann", "both", "TO: Bob, Cy\n\nto both")
        n1.drop("Ann", "away", "TO: Bob\n\nto Bob alone")
        n1.relay.step()
        n1.relay.finish()
    said = [r.getMessage() for r in caplog.records if "archived as" in r.getMessage()]
    assert sorted(m.split(" ", 1)[1].rsplit("; archived", 1)[0] for m in said) == [
        "delivered from Ann to Cy; queued for node n2: Bob", "from Ann; queued for node n2: Bob"]


def test_relay_show_lists_a_messages_events_in_the_order_of_their_times(redis_server, team, tmp_path, cli):
    """The queue for another node is stamped with the batch's time and recorded after the
    archive move it preceded: `relay show` lists the events by time (then by their order).
    Real clocks: the times of one batch's events differ."""
    import time
    from fednodes import Node
    n1 = Node(tmp_path / "n1", redis_server.url, team, "n1", ["Ann"], time.time)
    n2 = Node(tmp_path / "n2", redis_server.url, team, "n2", ["Bob"], time.time)
    try:
        exchange(n1, n2, rounds=1)
        n1.drop("Ann", "m", "TO: Bob\n\nin order")
        exchange(n1, n2)
        [mid] = [row["id"] for row in n1.relay.history.audit() if row["name"] == "m"]
        events = n1.relay.history.events(mid)
        assert [e["at"] for e in events] == sorted(e["at"] for e in events)
        kinds = [e["event"] for e in events]
        assert kinds.index("queued") < kinds.index("published") < kinds.index("acknowledged")
        shown = cli("--root", str(n1.root), "show", mid).output
        assert shown.index("queued") < shown.index("acknowledged  by node n2")
    finally:
        n1.close()
        n2.close()


def test_the_overview_and_metrics_show_each_node_awaiting_acknowledgements_and_the_link_up_or_down(
        tmp_path, team, nodes, clock):
    """relay web's Overview and /metrics of a federated node: before the link has said anything,
    'not connected yet'; a row published and not acknowledged, counted for its node with its age;
    once acknowledged, no node listed and none counted; the server gone, the link down with its
    error and the row waiting again, relay_federation_link_up 0."""
    import re

    from prometheus_client.parser import text_string_to_metric_families

    from relay.web import metrics, reads
    from webkit import get, server as web

    def scrape(node):
        text = metrics.exposition(metrics.registry(lambda: node.relay.history, node.relay.layout, node.config,
                                                   clock))[0].decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
                for s in f.samples if s.name.startswith("relay_federation")}

    def said(node, rows=()):
        with web(node.root, clock=clock) as srv:
            page = get(srv, "/")[2]
        for row in rows:
            assert row in page
        return " ".join(re.search(r'<p id="federation">(.*?)</p>', page, re.S).group(1).split())

    server = RedisServer(tmp_path / "redis")
    server.start()
    n1 = nodes(server.url, team, "n1", ["Ann"])
    n2 = nodes(server.url, team, "n2", ["Bob"])
    assert reads.federation(n1.relay.history, n1.config, clock())["connected"] is None
    assert said(n1) == "node n1: link not connected yet"
    assert scrape(n1) == {("relay_federation_link_up", ()): 0.0}
    exchange(n1, n2, rounds=1)
    n1.drop("Ann", "m1", "TO: Bob\n\nhi")
    queued = clock.advance(1)
    assert n1.send()[1] == 1
    doc = reads.federation(n1.relay.history, n1.config, clock.advance(90))
    assert clock() == queued + 90
    assert (doc["node"], doc["connected"], doc["error"]) == ("n1", True, None)
    assert doc["nodes"] == [{"node": "n2", "waiting": 1, "published": 1, "oldest_s": 90.0}]
    assert said(n1, ['<tr><td>n2</td><td class="n">1</td><td class="n">1m30s</td></tr>']) == "node n1: link up"
    assert scrape(n1) == {("relay_federation_unacknowledged", (("node", "n2"),)): 1.0,
                          ("relay_federation_link_up", ()): 1.0}
    exchange(n1, n2, rounds=2)
    assert reads.federation(n1.relay.history, n1.config, clock())["nodes"] == []
    assert scrape(n1) == {("relay_federation_link_up", ()): 1.0}
    server.stop()
    n1.drop("Ann", "m2", "TO: Bob\n\nagain")
    assert n1.send()[1] == 0
    n1.link.heartbeat()
    doc = reads.federation(n1.relay.history, n1.config, clock())
    assert doc["connected"] is False and "Connection refused" in doc["error"]
    assert [(n["node"], n["waiting"], n["published"]) for n in doc["nodes"]] == [("n2", 1, 0)]
    assert said(n1).startswith('node n1: link <span class="warn">down</span> ConnectionError:')
    assert scrape(n1) == {("relay_federation_link_up", ()): 0.0}


@pytest.fixture
def reader_config(tmp_path):
    """A federated node's configuration (n2 with Bob, bodies of 1 KiB at most): read_entry needs
    no server."""
    from relay import config as config_mod
    from fednodes import write_config
    write_config(tmp_path / "n2", "redis://127.0.0.1:1/0", "tq", "n2", ["Bob"], extra='max_body_bytes = "1KiB"')
    return config_mod.load(tmp_path / "n2", ".relay", env={})


def test_an_entrys_body_is_measured_in_utf8_bytes_up_to_max_body_bytes_exactly(reader_config, clock):
    from relay.errors import MessageRefused
    from relay.federation.entries import read_entry
    at_limit = envelope(clock, body="\u00e9" * 512)                 # 1024 bytes, 512 characters
    w, item = read_entry("n1", "1-0", entry(at_limit, to=("Bob", "Zed", "System")), {"Bob", "System"}, reader_config)
    assert item["recipients"] == ["Bob"] and item["body"] == at_limit["body"] and item["node"] == "n1"
    assert item["note"] == "not agents of this node: Zed, System" and item["entry_id"] == "1-0"
    w, item = read_entry("n1", "1-0", entry(envelope(clock), to=("Bob",) * 10_000), {"Bob"}, reader_config)
    assert item["recipients"] == ["Bob"] and item["note"] is None
    over = envelope(clock, body="\u00e9" * 512 + "x")
    with pytest.raises(MessageRefused, match=r"^the body is 1025 bytes, over this node's max_body_bytes \(1024\)$"):
        read_entry("n1", "1-0", entry(over), {"Bob"}, reader_config)


@pytest.mark.parametrize("fields, why", [
    (lambda c: entry({**envelope(c), "body": 5}), "the body is not text"),
    (lambda c: entry({**envelope(c), "headers": ["x"]}), "'headers' or 'to' has the wrong type"),
    (lambda c: entry({**envelope(c), "to": "Bob"}), "'headers' or 'to' has the wrong type"),
    (lambda c: {**entry(envelope(c)), "to": b"[not json"}, "the envelope or its recipients are not JSON"),
    (lambda c: {**entry(envelope(c)), "v": b"\xff"}, "not a relay entry of version 2 (v=None)"),
    (lambda c: {"oversize": "99", "what": "fields", "why": "too many fields"}, "the entry is not read: too many fields"),
    (lambda c: {"oversize": "99"}, "the entry is 99 bytes, over what this node reads"),
    (lambda c: entry({**envelope(c), "content_type": "not a type"}), "the envelope's the content type 'not a type' "
                                                                       "is not a media type"),
    (lambda c: entry(envelope(c), to=()), "the recipients are not a list of agent names"),
    (lambda c: entry(envelope(c), to=("Bob",) * 10_001), "the recipients are not a list of agent names"),
    (lambda c: entry(envelope(c), to=("Bob", "../x")), "the recipients are not a list of agent names"),
    (lambda c: "not a dict", "the entry has no fields"),
])
def test_an_entry_wrong_in_one_way_is_refused_saying_which(reader_config, clock, fields, why):
    from relay.errors import MessageRefused
    from relay.federation.entries import read_entry
    with pytest.raises(MessageRefused) as e:
        read_entry("n1", "1-0", fields(clock), {"Bob"}, reader_config)
    assert str(e.value).startswith(why), str(e.value)


def test_the_envelope_an_inbox_gets_from_another_node_keeps_every_field_the_sender_wrote(reader_config, clock):
    """Made again from the checked fields: each of them, the pass-through headers and the spawn
    keys included, comes over as the sending node wrote it, with the node it came from."""
    import orjson

    from relay.federation.entries import read_entry
    sent = envelope(clock, kind="spawn", thread="t-1", subject="the plan", body="go", headers={"x-team": "blue"},
                    name="Dana", cli="claude", model="opus")
    w, item = read_entry("n1", "1-0", entry(sent), {"Bob"}, reader_config)
    got = orjson.loads(w.envelope)
    for key in ("id", "from", "to", "kind", "thread", "subject", "body", "headers", "sent_at", "relayed_at", "source",
                "sha256", "name", "cli", "model"):
        assert got[key] == sent[key], key
    assert got["node"] == "n1" and got["content_type"] == "text/plain" and "cwd" not in got
    assert orjson.loads(item["headers"]) == {"x-team": "blue"}


@pytest.mark.parametrize("fields, why", [
    (lambda c: entry(envelope(c), id=None), "'None' is not a relay message id"),
    (lambda c: entry(envelope(c), id=""), "'' is not a relay message id"),
    (lambda c: entry(envelope(c), id="not-an-id"), "'not-an-id' is not a relay message id"),
    (lambda c: entry(envelope(c), v="1"), "not a relay entry of version 2 (v=1)"),
    (lambda c: entry(envelope(c), v=None), "not a relay entry of version 2 (v=None)"),
    (lambda c: {**entry(envelope(c)), "env": orjson.dumps(envelope(c)).decode()},
     "the envelope is missing or larger than this node accepts"),
    (lambda c: {k: v for k, v in entry(envelope(c)).items() if k != "env"},
     "the envelope is missing or larger than this node accepts"),
    (lambda c: {**entry(envelope(c)), "env": orjson.dumps(envelope(c)).ljust(6 * 1024 + (2 << 20) + 1)},
     "the envelope is missing or larger than this node accepts (2103296 bytes)"),
    (lambda c: {**entry(envelope(c)), "env": b"[1]"}, "the envelope is not an object with the entry's message id"),
    (lambda c: {**entry(envelope(c)), "env": orjson.dumps(envelope(c, id="01M8NY4DA9BNVZQW02BT7NGYD2"))},
     "the envelope is not an object with the entry's message id"),
    (lambda c: {k: v for k, v in entry(envelope(c)).items() if k != "to"}, "the recipients are not a list"),
    (lambda c: entry(envelope(c), to=("Bob", 7)), "the recipients are not a list of agent names"),
    (lambda c: {**entry(envelope(c)), "to": b'{"Bob": 1}'}, "the recipients are not a list of agent names"),
    (lambda c: {**entry(envelope(c)), "to": b'"Bob"'}, "the recipients are not a list of agent names"),
    (lambda c: entry(envelope(c, **{"from": 7})), "the sender '7' is not an agent name"),
    (lambda c: entry(envelope(c, **{"from": "a b"})), "the sender 'a b' is not an agent name"),
    (lambda c: entry(envelope(c, **{"from": "System"})), "the sender: "),
    (lambda c: entry(envelope(c, kind="bounce")), "kind 'bounce' is relay's own: only System sends it"),
    (lambda c: entry(envelope(c, sha256=None)), "the envelope has no sha256 of the original"),
    (lambda c: entry(envelope(c, sha256="A" * 64)), "the envelope has no sha256 of the original"),
    (lambda c: entry(envelope(c, sha256="a" * 63)), "the envelope has no sha256 of the original"),
    (lambda c: entry(envelope(c, subject=7)), "'subject' is not text"),
    (lambda c: entry(envelope(c, source=["x"])), "'source' is not text"),
    (lambda c: entry(envelope(c, cwd="../../elsewhere")), "CWD '../../elsewhere' is outside this node's project root"),
])
def test_an_entry_wrong_in_one_more_way_is_refused_saying_which(reader_config, clock, fields, why):
    from relay.errors import MessageRefused
    from relay.federation.entries import read_entry
    with pytest.raises(MessageRefused) as e:
        read_entry("n1", "1-0", fields(clock), {"Bob"}, reader_config)
    assert str(e.value).startswith(why), str(e.value)


def test_an_entry_read_keeps_a_null_subject_a_cwd_inside_the_root_and_only_names_or_star_in_to(reader_config, clock):
    from relay.federation.entries import read_entry
    sent = envelope(clock, subject=None, cwd="sub/dir", to=["Bob", "*", 7, "a b", "Cy"])
    w, item = read_entry("n1", "1-0", {k.encode(): v for k, v in entry(sent).items()}, {"Bob"}, reader_config)
    got = orjson.loads(w.envelope)
    assert got["to"] == ["Bob", "*", "Cy"] and got["cwd"] == "sub/dir" and item["subject"] is None
    assert orjson.loads(item["headers"]) == {}
    padded = entry(envelope(clock))       # an envelope of exactly the limit (6 x 1 KiB of body, 2 MiB more) is read
    padded["env"] = padded["env"].ljust(6 * 1024 + (2 << 20))
    assert read_entry("n1", "1-0", padded, {"Bob"}, reader_config)[1]["body"] == "ok"


@pytest.mark.parametrize("source, name", [("", "remote"), (None, "remote"), (".", "remote"), ("..", "remote"),
                                          ("a/b", "a_b"), ("...", "..."), ("msg.md", "msg.md")])
def test_a_received_messages_name_is_its_source_as_a_plain_name_or_remote(source, name):
    from relay.federation.entries import source_name
    assert source_name(source) == name


def test_an_envelope_without_to_or_headers_is_read_with_none_of_either(reader_config, clock):
    from relay.federation.entries import read_entry
    sent = {k: v for k, v in envelope(clock).items() if k not in ("to", "headers")}
    w, item = read_entry("n1", "1-0", entry(sent), {"Bob"}, reader_config)
    got = orjson.loads(w.envelope)
    assert got["to"] == [] and got["headers"] is None and item["headers"] == "{}" and item["recipients"] == ["Bob"]


@pytest.mark.parametrize("to, local", [(("Zed",), {"Bob"}), (("System",), {"Bob", "System"}),
                                       (("Zed", "Cy"), {"Bob", "Ann"})])
def test_an_entry_for_none_of_this_nodes_agents_is_refused_naming_them(reader_config, clock, to, local):
    from relay.errors import MessageRefused
    from relay.federation.entries import read_entry
    with pytest.raises(MessageRefused) as e:
        read_entry("n1", "1-0", entry(envelope(clock), to=to), local, reader_config)
    assert str(e.value) == f"none of {', '.join(to)} is an agent of node n2"


def test_an_envelopes_fields_besides_its_body_are_read_up_to_max_header_bytes_exactly(reader_config, clock):
    from relay.core.message import MAX_HEADER_BYTES
    from relay.errors import MessageRefused
    from relay.federation.entries import read_entry
    sent = envelope(clock, subject="", body="b" * 1000)          # the body counts for nothing here
    pad = MAX_HEADER_BYTES - len(orjson.dumps({k: v for k, v in sent.items() if k != "body"}))
    at_limit = {**sent, "subject": "s" * pad}
    assert read_entry("n1", "1-0", entry(at_limit), {"Bob"}, reader_config)[1]["subject"] == "s" * pad
    over = {**sent, "subject": "s" * (pad + 1)}
    with pytest.raises(MessageRefused) as e:
        read_entry("n1", "1-0", entry(over), {"Bob"}, reader_config)
    assert str(e.value) == (f"the envelope holds {MAX_HEADER_BYTES + 1} bytes besides its body, over the "
                            f"{MAX_HEADER_BYTES} a message's headers may take")
