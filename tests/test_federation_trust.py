"""A hostile node holding only its own credentials (one ACL user per node, as `relay federation
acl` prints them), against a real redis-server: what it may write, what it cannot, and what the
honest nodes refuse of what it writes. Each attack fails with NOPERM from the server or with a
refusal whose reason is recorded; nothing is lost."""
import shlex

import orjson
import pytest

from fednodes import (MISSING, REDIS_SERVER, Node, RedisServer, admin, as_node, exchange, server,  # noqa: F401 - fixtures
                      team, user_url)
from relay.federation.keys import Keys, acl, registration

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


def bodies(node, agent):
    return sorted(e["body"] for e in node.held(agent))


def refusals(node):
    """The reasons of the entries a node refused (its failed rows from other nodes)."""
    rows = node.relay.history.db.execute("SELECT error FROM messages WHERE node IS NOT NULL AND status = 'failed'")
    return [r[0] for r in rows]


def envelope(mid, sender, to, body="forged", sha="0" * 64, **extra):
    return orjson.dumps({"id": mid, "from": sender, "to": to, "kind": "message", "body": body, "sha256": sha,
                         "headers": {}, **extra})


def test_a_node_writes_only_its_own_keys(server, team, nodes):
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    import redis
    evil, keys = as_node(server, team, "n3"), Keys(team)
    forbidden = [("XADD", keys.messages("n1", "n2"), "*", "v", "2"),          # speak as n1
                 ("XDEL", keys.messages("n1", "n2"), "1-1"),                  # remove n1's traffic
                 ("XTRIM", keys.messages("n1", "n2"), "MAXLEN", "0"),
                 ("DEL", keys.messages("n1", "n2")),
                 ("XREAD", "STREAMS", keys.messages("n1", "n2"), "0"),        # read n1's traffic to n2
                 ("XADD", keys.acks("n2", "n1"), "*", "acks", "[]"),         # acknowledge for n2
                 ("HSET", keys.node("n2"), "agents", '["Bob", "Eve"]'),      # rewrite n2's names ...
                 ("HSET", keys.node("n2"), "seen", "99999999999"),          # ... or its last seen
                 ("DEL", keys.node("n1")),
                 ("EVAL", "return redis.call('DEL', KEYS[1])", 1, keys.node("n1")),
                 ("FLUSHALL",), ("CONFIG", "SET", "maxmemory", "1"), ("KEYS", "*"),
                 ("SCAN", "0", "COUNT", "50000000"),                         # one call walks the keyspace
                 ("EVAL", "while true do end", 0), ("EVAL_RO", "while true do end", 0),   # hold the server
                 ("SCRIPT", "LOAD", "return 1"), ("FUNCTION", "LIST"),
                 ("SET", "relay:{%s}:anything" % team, "x")]
    for cmd in forbidden:
        with pytest.raises(redis.exceptions.NoPermissionError):
            evil.execute_command(*cmd)
    # What it may do: its own entry and streams, and read what is addressed to it.
    evil.hset(keys.node("n3"), "agents", "[]")
    evil.xadd(keys.messages("n3", "n2"), {"v": "2"})
    assert evil.xread({keys.messages("n1", "n3"): "0"}) == []
    exchange(n1, n2)
    n1.drop("Ann", "m", "TO: Bob\n\nstill fine")
    exchange(n1, n2)
    assert bodies(n2, "Bob") == ["still fine"]


def test_a_node_cannot_speak_for_the_receivers_own_agents_or_another_nodes(server, team, nodes, clock):
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob", "Al"])
    n3 = nodes(server, team, "n3", ["Eve"])
    exchange(n1, n2, n3, rounds=1)
    evil, keys = as_node(server, team, "n3"), Keys(team)
    ids = [n2.relay.ids.new(clock()) for _ in range(4)]
    for mid, sender in zip(ids, ["Al", "Bob", "Ann", "Zed"]):     # n2's own agents, n1's agent, a name nobody has
        evil.xadd(keys.messages("n3", "n2"), {"v": "2", "id": mid, "to": '["Bob"]',
                                              "env": envelope(mid, sender, ["Bob"], body=f"as {sender}")})
    n3.drop("Eve", "m", "TO: Bob\n\nfrom Eve, honestly")
    exchange(n1, n2, n3)
    assert bodies(n2, "Bob") == ["from Eve, honestly"]
    why = refusals(n2)
    assert len(why) == 4
    assert sum("is an agent of this node (n2); node n3 cannot speak for it" in w for w in why) == 2
    assert any("the sender Ann is not an agent of node n3" in w for w in why)
    assert any("the sender Zed is not in the team's directory" in w for w in why)
    # The forged messages never counted against Al's or Bob's flow control: nothing is shed.
    assert n2.relay.history.db.execute("SELECT count(*) FROM sheds").fetchone()[0] == 0
    # n3 learns of each refusal through its acknowledgement stream.
    raw = admin(server).xrange(keys.acks("n2", "n3"))
    refused = [a for _, f in raw for a in orjson.loads(f[b"acks"]) if a[2] is not None]
    assert sorted(a[0] for a in refused) == sorted(ids)


def test_a_node_cannot_speak_as_system_even_listing_it_among_its_agents(server, team, nodes, clock):
    """System (relay's own sender: pings, control) is no agent of any node: a node that lists it
    in its own entry and writes a message from it is refused, whatever its list says."""
    n2 = nodes(server, team, "n2", ["Bob"])
    n3 = nodes(server, team, "n3", ["Eve"])
    exchange(n2, n3, rounds=1)
    evil, keys = as_node(server, team, "n3"), Keys(team)
    evil.hset(keys.node("n3"), mapping={"agents": '["Eve", "System"]', "v": "with-system"})
    mid = n2.relay.ids.new(clock())
    evil.xadd(keys.messages("n3", "n2"), {"v": "2", "id": mid, "to": '["Bob"]',
                                          "env": envelope(mid, "System", ["Bob"], body="stop everything", kind="ping")})
    assert n2.receive() == 1
    assert n2.held("Bob") == []
    [why] = refusals(n2)
    assert "the sender: 'System' is a name relay keeps for itself" in why


@pytest.mark.parametrize("name", ["system", "SYSTEM", "sYsTeM", "System", "broadcast", "BROADCAST", "Broadcast"])
def test_a_reserved_name_in_any_case_in_a_nodes_list_is_not_taken_nor_its_mail_delivered(server, team, nodes,
                                                                                          clock, name):
    """A node that lists a reserved name in some case (names.py) has it taken by no other node
    (the directory, relay send's look-up), and a message from it is refused, not delivered as
    System's."""
    from relay.federation.link import directory
    n2 = nodes(server, team, "n2", ["Bob"])
    n3 = nodes(server, team, "n3", ["Eve"])
    exchange(n2, n3, rounds=1)
    evil, keys = as_node(server, team, "n3"), Keys(team)
    evil.hset(keys.node("n3"), mapping={"agents": orjson.dumps(["Eve", name]).decode(), "v": "with-reserved"})
    exchange(n2, n3, rounds=1)
    assert directory(n2.config) == {"Eve": "n3"}
    assert name not in n2.relay.history.remote.agents() and name not in n2.relay.known_agents(refresh=True)
    mid = n2.relay.ids.new(clock())
    evil.xadd(keys.messages("n3", "n2"), {"v": "2", "id": mid, "to": '["Bob"]',
                                          "env": envelope(mid, name, ["Bob"], body="your mail failed", kind="bounce")})
    assert n2.receive() == 1
    assert n2.held("Bob") == []
    [why] = refusals(n2)
    assert f"the sender: {name!r} is a name relay keeps for itself" in why


@pytest.mark.parametrize("kind", ["bounce", "Bounce", "ping", "reservation-refused"])
def test_a_kind_relay_writes_itself_from_another_nodes_agent_is_refused(server, team, nodes, clock, kind):
    n2 = nodes(server, team, "n2", ["Bob"])
    n3 = nodes(server, team, "n3", ["Eve"])
    exchange(n2, n3, rounds=1)
    evil, keys = as_node(server, team, "n3"), Keys(team)
    mid = n2.relay.ids.new(clock())
    evil.xadd(keys.messages("n3", "n2"), {"v": "2", "id": mid, "to": '["Bob"]',
                                          "env": envelope(mid, "Eve", ["Bob"], body="your mail failed", kind=kind)})
    assert n2.receive() == 1
    assert n2.held("Bob") == []
    [why] = refusals(n2)
    assert "is relay's own: only System sends it" in why


def test_a_node_cannot_take_back_an_acknowledgement_it_gave(server, team, nodes):
    """An acknowledgement settles a row once: a refusal (or another acknowledgement) a node
    writes later for a message it acknowledged changes nothing at the sender."""
    n1 = nodes(server, team, "n1", ["Ann"])
    n3 = nodes(server, team, "n3", ["Eve"])
    exchange(n1, n3, rounds=1)
    n1.drop("Ann", "m", "TO: Eve\n\nreceived")
    exchange(n1, n3)
    mid = n1.relay.history.audit().fetchone()["id"]
    before = n1.outbound(mid)["n3"]
    assert before["status"] == "acknowledged"
    evil, keys = as_node(server, team, "n3"), Keys(team)
    evil.xadd(keys.acks("n3", "n1"), {"acks": orjson.dumps([[mid, None, "never got it"], [mid, None, None]])})
    n1.link.publish()
    after = n1.outbound(mid)["n3"]
    assert (after["status"], after["error"], after["acked_at"]) == ("acknowledged", None, before["acked_at"])
    assert [e["event"] for e in n1.relay.history.events(mid)].count("acknowledged") == 1
    assert "refused-by-node" not in [e["event"] for e in n1.relay.history.events(mid)]


def test_a_name_held_by_a_node_is_never_taken_by_anothers_claim(server, team, nodes, clock):
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    assert n1.link.directory.routes["Bob"] == "n2"
    # n3 lists Bob in its own entry, with a last seen far in the future.
    evil, keys = as_node(server, team, "n3"), Keys(team)
    evil.hset(keys.node("n3"), mapping={"agents": '["Bob", "Eve"]', "v": "x", "seen": "99999999999",
                                        "timeout": "99999999999", "owner": "evil"})
    exchange(n1, n2)
    assert n1.link.directory.routes["Bob"] == "n2" and n1.link.directory.routes["Eve"] == "n3"
    n1.drop("Ann", "m", "TO: Bob\n\nfor the real Bob")
    exchange(n1, n2)
    assert bodies(n2, "Bob") == ["for the real Bob"]
    assert evil.xlen(keys.messages("n1", "n3")) == 0
    # Even with n2 stopped for long, Bob stays n2's while n2's entry lists it: messages wait.
    n2.close()
    clock.advance(3600)
    n1.link.heartbeat()
    assert n1.link.directory.routes["Bob"] == "n2"
    # A node new to the team gives Bob to n2 too: n2 claimed the name before it listed it, and a
    # node listing a name another claimed is not taken for it (claims.py): no route, no conflict.
    n4 = nodes(server, team, "n4", ["Dee"])
    n4.link.heartbeat()
    assert n4.link.directory.routes.get("Bob") == "n2" and n4.link.conflicts == []


def test_a_case_variant_or_a_name_just_announced_elsewhere_gives_a_node_no_voice_and_takes_no_name(
        server, team, nodes, clock):
    """n3 lists ANN (n1's Ann, long held) or BOB (n2's own Bob), or a name n1 has just announced,
    and writes from it before n2 looks at the directory again: each entry is refused, the name
    it varies stays its holder's, and n1's Ann is still delivered from and to at n2."""
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=2)
    evil, keys = as_node(server, team, "n3"), Keys(team)
    evil.hset(keys.node("n3"), mapping={"agents": '["Eve"]', "v": "e1", "seen": evil.time()[0], "owner": "evil"})
    n2.link.look()
    (n1.state / "outbox" / "Newbie").mkdir()
    n1.link.heartbeat()                     # n1 announces Newbie; n2 has not looked since
    for k, spoof in enumerate(("ANN", "BOB", "AnN", "Newbie")):
        evil.hset(keys.node("n3"), mapping={"agents": orjson.dumps(["Eve", spoof]), "v": f"e{k + 2}"})
        mid = n2.relay.ids.new(clock())
        evil.xadd(keys.messages("n3", "n2"), {"v": "2", "id": mid, "to": '["Bob"]',
                                              "env": envelope(mid, spoof, ["Bob"], body=f"as {spoof}")})
        n2.receive()                        # before n2's next look
    assert bodies(n2, "Bob") == []
    why = refusals(n2)
    assert len(why) == 4 and any("differs only by case from Bob, an agent of this node" in w for w in why)
    assert sum("not an agent of node n3" in w for w in why) == 3
    n2.link.look()
    routes = n2.link.directory.routes
    # n1 claimed Newbie before announcing him: n3's list is not taken for him, nor for ANN
    # (one claim covers every case of a name).
    assert routes["Ann"] == "n1" and routes["Newbie"] == "n1" and n2.link.directory.conflicts == []
    evil.hset(keys.node("n3"), mapping={"agents": '["Eve", "ANN"]', "v": "e9"})
    n2.link.look()
    assert n2.link.directory.routes["Ann"] == "n1" and "ANN" not in n2.link.directory.routes
    n1.drop("Ann", "m", "TO: Bob\n\nthe real Ann, after the claims")
    n2.drop("Bob", "r", "TO: Ann\n\nback to the real Ann")
    exchange(n1, n2)
    assert bodies(n2, "Bob") == ["the real Ann, after the claims"] and bodies(n1, "Ann") == ["back to the real Ann"]


def test_a_name_a_new_node_announced_is_no_one_elses_and_an_oversized_list_refuses_no_honest_name(
        server, team, nodes, clock):
    """n4 joins and announces Dee; before n2 looks again, n3 lists Dee too and writes from Dee:
    refused (every node key of the team is found for a name not yet resolved, n4's too). n3
    then makes its own list too large to read: n1's new name is still delivered from."""
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    evil, keys = as_node(server, team, "n3"), Keys(team)
    evil.hset(keys.node("n3"), mapping={"agents": '["Eve"]', "v": "1", "seen": evil.time()[0], "owner": "evil"})
    exchange(n1, n2, rounds=2)
    n4 = nodes(server, team, "n4", ["Dee"])
    n4.link.heartbeat()                     # n2 has not looked since
    evil.hset(keys.node("n3"), mapping={"agents": '["Eve", "Dee"]', "v": "2"})
    mid = n2.relay.ids.new(clock())
    evil.xadd(keys.messages("n3", "n2"), {"v": "2", "id": mid, "to": '["Bob"]',
                                          "env": envelope(mid, "Dee", ["Bob"], body="Dee here")})
    n2.receive()
    assert bodies(n2, "Bob") == [] and any("the sender Dee is not an agent of node n3" in w for w in refusals(n2))
    evil.hset(keys.node("n3"), mapping={"agents": b"[" + b'"x",' * (3 << 20) + b'"Eve"]', "v": "3"})
    (n1.state / "outbox" / "Newbie").mkdir()
    n1.link.heartbeat()
    n1.drop("Newbie", "m", "TO: Bob\n\nfrom a name just made")
    n1.send()
    n2.receive()                            # the lists were read this second: the entry waits for the next read
    clock.advance(1)
    n2.receive()
    assert bodies(n2, "Bob") == ["from a name just made"]


def test_one_nodes_acknowledgements_in_bulk_take_none_of_anothers_turn(server, team, nodes, clock):
    """n0 (its name first in order) writes 8,192 made-up acknowledgements before each of n1's
    reads: n2's genuine acknowledgement is read in the first, each node has its own budget."""
    from relay.federation.publisher import ACKS_PER_CALL
    from relay.ids import IdGenerator
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    evil, keys, ids = as_node(server, team, "n0"), Keys(team), IdGenerator()
    n1.drop("Ann", "m", "TO: Bob\n\nacknowledged beside a flood")
    n1.send()
    n2.receive()
    n2.link.incoming.acknowledge()
    evil.xadd(keys.acks("n0", "n1"), {"acks": orjson.dumps([[ids.new(clock())] for _ in range(ACKS_PER_CALL)])})
    n1.link.publisher.read_acks(clock(), {"n0", "n2"})
    assert n1.relay.history.remote.outbound_counts()["acknowledged"] == 1


def test_a_replay_after_the_retention_sweep_is_not_delivered_again(server, team, nodes, clock, cli):
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"], extra='retention = "1h"')
    exchange(n1, n2, rounds=1)
    n1.drop("Ann", "m", "TO: Bob\n\nonce only")
    exchange(n1, n2)
    assert bodies(n2, "Bob") == ["once only"]
    [entry] = [e for e in n2.held("Bob")]
    clock.advance(7200)
    n2.relay.sweep(clock())
    assert n2.relay.history.get(entry["id"]) is None                  # the message's row is swept ...
    # ... and n1 (or anyone with n1's credentials) adds the very same entry again.
    keys = Keys(team)
    row = n1.link.history.remote.outbound(entry["id"])[0]
    as_node(server, team, "n1").xadd(keys.messages("n1", "n2"),
                                     {"v": "2", "id": entry["id"], "to": '["Bob"]', "env": row["envelope"]})
    for sub in ("new", "cur"):                                         # Bob read and deleted it meanwhile
        for p in (n2.state / "inbox/Bob" / sub).iterdir():
            p.unlink()
    exchange(n1, n2)
    assert n2.held("Bob") == []
    # An id older than the replay window is refused from its id alone.
    from relay.ids import IdGenerator
    old = IdGenerator().new(clock() - 40 * 86400)
    as_node(server, team, "n1").xadd(keys.messages("n1", "n2"), {"v": "2", "id": old, "to": '["Bob"]',
                                                                 "env": envelope(old, "Ann", ["Bob"])})
    exchange(n1, n2)
    assert n2.held("Bob") == [] and any("older than the replay window" in w for w in refusals(n2))
    # One dated years ahead (it would sort after every message to come) is refused too.
    ahead = IdGenerator().new(clock() + 3 * 365 * 86400)
    as_node(server, team, "n1").xadd(keys.messages("n1", "n2"), {"v": "2", "id": ahead, "to": '["Bob"]',
                                                                 "env": envelope(ahead, "Ann", ["Bob"])})
    exchange(n1, n2)
    assert n2.held("Bob") == [] and any("days ahead of this node's clock" in w for w in refusals(n2))


def test_an_oversized_entry_is_refused_from_its_size_and_holds_back_nothing(server, team, nodes, clock):
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"], extra='max_body_bytes = "1KiB"')
    exchange(n1, n2, rounds=1)
    keys = Keys(team)
    big = n1.relay.ids.new(clock())
    as_node(server, team, "n1").xadd(keys.messages("n1", "n2"),
                                     {"v": "2", "id": big, "to": '["Bob"]', "env": b"x" * (3 << 20)})
    n1.drop("Ann", "m", "TO: Bob\n\nbehind the big one")
    exchange(n1, n2)
    assert bodies(n2, "Bob") == ["behind the big one"]
    assert any("over what this node reads" in w for w in refusals(n2))


def test_an_entry_of_a_hundred_thousand_empty_fields_is_refused_from_its_count_unread(server, team, nodes, clock):
    """Empty fields are nearly free on the wire (the byte bound passes 7 MB of them) but each
    costs a parsed object: the count the entry announces refuses it before one field is read."""
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    keys = Keys(team)
    wide = n1.relay.ids.new(clock())
    fields = {"v": "2", "id": wide, "to": '["Bob"]', "env": envelope(wide, "Ann", ["Bob"])}
    fields.update((f"f{i}", "") for i in range(100_000))
    as_node(server, team, "n1").xadd(keys.messages("n1", "n2"), fields)
    for extra in (12, 13):                  # 16 fields in all, read; 17, refused unread
        mid = n1.relay.ids.new(clock())
        edge = {"v": "2", "id": mid, "to": '["Bob"]', "env": envelope(mid, "Ann", ["Bob"], body=f"{4 + extra} fields")}
        edge.update((f"f{i}", "") for i in range(extra))
        as_node(server, team, "n1").xadd(keys.messages("n1", "n2"), edge)
    n1.drop("Ann", "m", "TO: Bob\n\nbehind the wide one")
    exchange(n1, n2)
    assert sorted(bodies(n2, "Bob")) == ["16 fields", "behind the wide one"]
    assert any("an entry of 100004 fields announced, over the 16" in w for w in refusals(n2)), refusals(n2)
    assert any("an entry of 17 fields announced, over the 16" in w for w in refusals(n2)), refusals(n2)


def test_a_stream_with_entries_too_wide_to_read_is_read_entry_by_entry_so_the_server_builds_each_once(
        server, team, nodes, clock):
    """Each read of a wide entry costs the server the whole reply (90 ms for a million fields)
    however little of it the receiver reads: once one is found, its stream is read one entry
    at a time until its end, and the others in the XREAD as before."""
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    n3 = nodes(server, team, "n3", ["Cy"])
    exchange(n1, n2, n3, rounds=1)
    evil, stream = as_node(server, team, "n1"), Keys(team).messages("n1", "n2")
    wide = {"v": "2", **{f"f{i}": "" for i in range(1000)}}
    for _ in range(4):
        evil.xadd(stream, wide)
    n1.drop("Ann", "m", "TO: Bob\n\nafter the wide ones")
    n1.send()
    n3.drop("Cy", "m", "TO: Bob\n\nbeside them")
    n3.send()
    admin(server).config_resetstat()
    assert n2.receive() == 1 + 4 + 1        # beside, then (bulky) the four and the good one
    assert n2.link.incoming.bulky == set()  # its end was read: read with the others again
    stats = admin(server).info("commandstats")
    # One XREAD of both streams (cut at the first wide entry), one more of n3's alone, and an
    # XRANGE for each of n1's five and its end: the first wide entry built twice, the others once.
    assert stats["cmdstat_xread"]["calls"] == 2 and stats["cmdstat_xrange"]["calls"] == 6, stats
    assert bodies(n2, "Bob") == ["after the wide ones", "beside them"]
    assert sum("an entry of 1001 fields announced" in w for w in refusals(n2)) == 4


def test_the_guarded_client_counts_an_entrys_fields_before_reading_one_and_no_other_pair(server, team):
    import redis
    from relay.federation.client import ENTRY_FIELDS, ReplyTooLarge, _guarded_parser
    plain = admin(server)
    guarded = redis.Redis.from_url(server.url, protocol=2, parser_class=_guarded_parser(1 << 20, 1 << 22))
    keys = [f"{team}:{k}" for k in ("fit", "wide", "pairs", "list", "empties")]
    plain.xadd("fit", {f"f{i}": "" for i in range(ENTRY_FIELDS)})
    plain.xadd("wide", {f"f{i}": "" for i in range(ENTRY_FIELDS + 1)})
    plain.hset("pairs", mapping={"1-1": "x"})              # a pair of an id-like name and a value
    plain.rpush("list", "1-1", "2-2")                       # ... and of two id-like strings
    assert len(guarded.xrange("fit")[0][1]) == ENTRY_FIELDS
    assert guarded.hgetall("pairs") == {b"1-1": b"x"} and guarded.lrange("list", 0, -1) == [b"1-1", b"2-2"]
    with pytest.raises(ReplyTooLarge) as e:
        guarded.xread({"fit": "0", "wide": "0"})
    assert e.value.what == "fields" and e.value.size == ENTRY_FIELDS + 1
    # Empty bulks count their wire bytes against the budget.
    plain.rpush("empties", *[""] * 2000)
    small = redis.Redis.from_url(server.url, protocol=2, parser_class=_guarded_parser(1 << 20, 8000))
    with pytest.raises(ReplyTooLarge):
        small.lrange("empties", 0, -1)


def test_an_envelopes_headers_and_subject_are_bounded_as_a_local_messages_headers(server, team, nodes, clock):
    """The body is bounded by max_body_bytes; the rest of an envelope (headers, subject, thread,
    source) by what a local message's headers may take, not by the entry's whole bound."""
    from relay.core.message import MAX_HEADER_BYTES
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    keys, evil = Keys(team), as_node(server, team, "n1")
    sent = {}
    for name, extra in (("fits", {"headers": {"x-pad": "h" * (MAX_HEADER_BYTES - 1024)}}),
                        ("headers", {"headers": {"x-pad": "h" * (MAX_HEADER_BYTES + 1)}}),
                        ("subject", {"subject": "s" * (MAX_HEADER_BYTES + 1)}),
                        ("spread", {"thread": "t" * (MAX_HEADER_BYTES // 2), "source": "s" * (MAX_HEADER_BYTES // 2)})):
        mid = n1.relay.ids.new(clock())
        sent[mid] = name
        evil.xadd(keys.messages("n1", "n2"), {"v": "2", "id": mid, "to": '["Bob"]',
                                               "env": envelope(mid, "Ann", ["Bob"], body=name, **extra)})
    exchange(n1, n2)
    assert bodies(n2, "Bob") == ["fits"]
    over = [w for w in refusals(n2) if "besides its body, over the 262144 a message's headers may take" in w]
    assert len(over) == 3, refusals(n2)


def test_a_source_with_path_characters_is_shown_escaped_and_audited(server, team, nodes, clock, cli):
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    keys = Keys(team)
    mid = n1.relay.ids.new(clock())
    as_node(server, team, "n1").xadd(keys.messages("n1", "n2"), {
        "v": "2", "id": mid, "to": '["Bob"]', "env": envelope(mid, "Ann", ["Bob"], source="../../evil\x1b[31m")})
    exchange(n1, n2)
    [got] = n2.held("Bob")
    assert got["id"] == mid
    out = cli("--root", str(n2.root), "audit", "--json").output
    audit = orjson.loads(out)
    assert [r["id"] for r in audit] == [mid]
    assert audit[0]["source_path"] == "n1:outbox/Ann/.._.._evil\\x1b[31m"       # stored escaped, no `/`
    assert "\x1b" not in cli("--root", str(n2.root), "audit").output
    assert not (n2.root.parent / "evil").exists()


def test_a_flood_of_names_in_one_nodes_entry_is_cut_at_max_agents_per_node(server, team, nodes, clock):
    n1 = nodes(server, team, "n1", ["Ann"], extra="")
    n2 = nodes(server, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    keys = Keys(team)
    names = [f"fake{i}" for i in range(50_000)]
    as_node(server, team, "n3").hset(keys.node("n3"), mapping={"agents": orjson.dumps(names), "v": "1",
                                                               "seen": "99999999999", "timeout": "60"})
    n1.link.heartbeat()
    assert not any(n.startswith("fake") for n in n1.link.directory.routes)      # over the bound: none taken
    n1.drop("Ann", "all", "TO: *\n\nto everyone")
    exchange(n1, n2)
    assert bodies(n2, "Bob") == ["to everyone"]


def test_a_node_that_copies_another_nodes_id_cannot_replace_or_remove_its_message(server, team, nodes, clock):
    """Eve (n3) writes to Bob and Ann: n1 (Ann's node) learns the id and races its own message
    under it to n2. Both arrive, each under an id of its own at n2; Eve's is delivered as sent,
    and n3 is told so only because it was."""
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    n3 = nodes(server, team, "n3", ["Eve"])
    exchange(n1, n2, n3, rounds=1)
    n3.drop("Eve", "m", "TO: Bob, Ann\n\nthe real one")
    n3.send()                                            # published to n1 and n2, n2 not reading yet
    n1.receive()
    [copy] = n1.held("Ann")
    forged = orjson.loads(orjson.dumps({**copy, "from": "Ann", "body": "FORGED: wire money to n1", "to": ["Bob"]}))
    forged.pop("node", None)
    keys = Keys(team)
    # n1's own stream sorts before n3's: its entry comes first in n2's read.
    as_node(server, team, "n1").xadd(keys.messages("n1", "n2"), {"v": "2", "id": copy["id"], "to": '["Bob"]',
                                                               "env": orjson.dumps(forged)})
    exchange(n1, n2, n3)
    got = {e["body"]: e for e in n2.held("Bob")}
    assert sorted(got) == ["FORGED: wire money to n1", "the real one"]
    assert got["the real one"]["from"] == "Eve" and got["FORGED: wire money to n1"]["from"] == "Ann"
    assert got["the real one"]["id"] != got["FORGED: wire money to n1"]["id"]
    rows = n3.link.history.remote.outbound(copy["id"])
    assert {r["node"]: r["status"] for r in rows} == {"n1": "acknowledged", "n2": "acknowledged"}


def test_a_name_is_not_taken_when_the_server_loses_its_holders_entry(server, team, nodes, clock):
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    n3 = nodes(server, team, "n3", ["Eve"])
    exchange(n1, n2, n3, rounds=1)
    keys = Keys(team)
    evil = as_node(server, team, "n1")
    n2.close()                                            # Bob's node stopped, a backlog for him waits
    for i in range(3):
        n3.drop("Eve", f"m{i}", f"TO: Bob\n\nfor Bob {i}")
    n3.send()
    admin(server).flushall()                              # the server loses every key ...
    for name, n in (("n1", n1), ("n3", n3)):
        admin(server).execute_command(*shlex.split(acl(team, name, f"pw-{name}-{team}")))
    evil.hset(keys.node("n1"), mapping={"agents": '["Ann", "Bob"]', "v": "squat", "seen": "99999999999"})
    clock.advance(3600)                                   # ... and n2 stays away for long
    n3.link.heartbeat()
    n3.link.check()
    n3.link.publish()
    assert n3.link.directory.routes["Bob"] == "n2"        # still n2's: never the squatter's
    rows = n3.link.history.db.execute("SELECT DISTINCT node FROM outbound").fetchall()
    assert [r[0] for r in rows] == ["n2"]
    # A node that joins now, hearing of Bob only from n1, cannot know better: it is told by an
    # operator (relay federation retire) or by n2 announcing again; the honest nodes it meets
    # keep Bob where he was.


def test_keys_of_another_type_in_one_nodes_name_stop_no_other_node(server, team, nodes, clock):
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    n3 = nodes(server, team, "n3", ["Eve"])
    exchange(n1, n2, n3, rounds=1)
    keys, evil = Keys(team), as_node(server, team, "n1")
    evil.delete(keys.messages("n1", "n2"), keys.acks("n1", "n3"))
    evil.hset(keys.messages("n1", "n2"), "x", "y")            # its stream to n2: a hash
    evil.hset(keys.acks("n1", "n3"), "a", "b")                # its acknowledgements to n3: a hash
    evil.delete(keys.node("n1"))
    evil.xadd(keys.node("n1"), {"x": "1"})                    # its directory entry: a stream
    n3.drop("Eve", "m", "TO: Bob\n\nstill delivered")
    for _ in range(3):
        exchange(n2, n3, rounds=1)
    assert bodies(n2, "Bob") == ["still delivered"]
    assert n3.link.history.remote.outbound_counts()["acknowledged"] == 1
    assert n2.link.directory.error is None and n3.link.directory.error is None


def test_huge_fields_in_a_nodes_own_entry_are_never_read_whole(server, team, nodes, clock):
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    reader = n2.link.directory.reader
    big = b"x" * (4 << 20)
    as_node(server, team, "n3").hset(Keys(team).node("n3"), mapping={"agents": '["Gus"]', "v": big, "owner": big,
                                                                     "seen": "1", "timeout": "60"})
    assert n2.link.heartbeat()
    assert "n3" in n2.link.directory.bad and "Gus" not in n2.link.directory.routes
    assert reader.connection_pool.connection_kwargs["parser_class"].__name__ == "Guarded"
    n1.drop("Ann", "m", "TO: Bob\n\nunbothered")
    exchange(n1, n2)
    assert bodies(n2, "Bob") == ["unbothered"]


def test_a_flood_of_bad_entries_is_recorded_a_hundred_a_minute_and_then_read_once_a_second(
        server, team, nodes, clock):
    """Past REFUSALS refusals in a minute, the flooding node's stream is read at most once in
    HOLD seconds: the rest of its flood waits unread, another node's message does not."""
    from relay.federation.receiver import BATCH
    from relay.federation.refusals import HOLD, REFUSALS
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    n3 = nodes(server, team, "n3", ["Cy"])
    exchange(n1, n2, n3, rounds=1)
    evil, stream = as_node(server, team, "n1"), Keys(team).messages("n1", "n2")
    for _ in range(2000):
        evil.xadd(stream, {"v": "1"})
    while n2.receive():
        pass
    assert len(refusals(n2)) == REFUSALS

    def read():
        cursor = n2.link.incoming.cursors["n1"]
        return len(admin(server).xrange(stream, "-", cursor))
    first = read()
    assert REFUSALS < first <= REFUSALS + 2 * BATCH     # the read that passed the bound, and no more
    n1.drop("Ann", "m", "TO: Bob\n\nbehind the flood")
    n3.drop("Cy", "m", "TO: Bob\n\nbeside the flood")
    exchange(n1, n2, n3)
    assert bodies(n2, "Bob") == ["beside the flood"] and read() == first
    clock.advance(HOLD)
    n2.receive()
    assert first < read() <= first + BATCH
    for _ in range(2000 // BATCH + 1):
        clock.advance(HOLD)
        exchange(n1, n2, n3)
    assert bodies(n2, "Bob") == ["behind the flood", "beside the flood"]
    assert len(refusals(n2)) == REFUSALS       # the same minute: none more recorded one by one


def test_a_receiver_whose_only_stream_is_held_back_rests_instead_of_spinning(server, team, nodes, clock):
    from relay.federation.refusals import HOLD, REFUSALS
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    for _ in range(REFUSALS + 1):
        as_node(server, team, "n1").xadd(Keys(team).messages("n1", "n2"), {"v": "1"})
    while n2.receive():
        pass
    assert n2.link.incoming.rest == HOLD      # the serving thread waits this long
    clock.advance(HOLD / 2)
    assert n2.receive() == 0 and n2.link.incoming.rest == pytest.approx(HOLD / 2)
    clock.advance(HOLD / 2)
    n2.receive()
    assert n2.link.incoming.rest == 0.0


def test_an_envelopes_recipients_reach_the_inbox_as_names_alone(server, team, nodes, clock):
    """What a node puts in the envelope's own `to` (the message's recipients as its sender wrote
    them) reaches the inbox as agent names alone: no objects, numbers, nulls or escapes."""
    n2 = nodes(server, team, "n2", ["Bob"])
    n3 = nodes(server, team, "n3", ["Eve"])
    exchange(n2, n3, rounds=1)
    evil, keys = as_node(server, team, "n3"), Keys(team)
    mid = n2.relay.ids.new(clock())
    evil.xadd(keys.messages("n3", "n2"), {"v": "2", "id": mid, "to": '["Bob"]', "env": envelope(
        mid, "Eve", [{"a": 1}, None, 5, [["deep"]], "CEO", "\x1b]52;c;aGk=\x07", "Bob"], body="odd recipients")})
    n2.receive()
    [got] = n2.held("Bob")
    assert got["body"] == "odd recipients" and got["to"] == ["CEO", "Bob"]


def test_refusals_are_recorded_a_hundred_per_node_per_minute_and_the_minutes_overflow_said_once_at_its_end(caplog):
    """REFUSALS of one node in the minute from its first are recorded; the next is not, and holds
    that node's stream for HOLD seconds (another node's is not held); at exactly 60 s a new
    minute starts, and the one before's unrecorded count is said once."""
    import logging

    from relay.federation.refusals import HOLD, REFUSALS, Refusals
    r, t0 = Refusals(), 1_000.0
    assert all(r.recorded("n1", t0 + i * 0.1) for i in range(REFUSALS))
    assert r.readable("n1", t0) and r.until("n1") == 0.0
    assert r.recorded("n1", t0 + 30) is False
    assert r.until("n1") == t0 + 30 + HOLD
    assert not r.readable("n1", t0 + 30 + HOLD - 0.01) and r.readable("n1", t0 + 30 + HOLD)
    assert r.recorded("n3", t0 + 30) is True and r.readable("n3", t0 + 30)
    with caplog.at_level(logging.ERROR, logger="relay.federation.refusals"):
        assert r.recorded("n1", t0 + 59.99) is False
        assert "more entries refused" not in caplog.text
        assert r.recorded("n1", t0 + 60) is True
        assert caplog.text.count("federation: node n1 sent 2 more entries refused in the last minute (not "
                                 "recorded one by one)") == 1
        assert all(r.recorded("n1", t0 + 60 + i * 0.1) for i in range(1, REFUSALS))
        assert r.recorded("n1", t0 + 61 + REFUSALS * 0.1) is False
        caplog.clear()
        assert r.recorded("n3", t0 + 90) is True             # n3's minute rolls over with nothing unsaid
        assert "more entries refused" not in caplog.text


def test_relay_sends_look_up_takes_each_name_from_the_first_node_listing_it_and_skips_what_cannot_be_read(
        server, team, nodes):
    """directory(): the names of the team's other nodes, never this node's own; a name two nodes
    list is the first's (by node name); an entry whose list is no JSON list, or a name no agent
    may have, names nobody; the rest of the team still read."""
    from relay.federation.link import directory
    n2 = nodes(server, team, "n2", ["Bob"])
    n3 = nodes(server, team, "n3", ["Eve"])
    n4 = nodes(server, team, "n4", ["Ann"])
    n5 = nodes(server, team, "n5", ["Dan"])
    exchange(n2, n3, n4, n5, rounds=1)
    assert directory(n2.config) == {"Eve": "n3", "Ann": "n4", "Dan": "n5"}
    keys = Keys(team)
    as_node(server, team, "n4").hset(keys.node("n4"), mapping={"agents": orjson.dumps(["Ann", "Eve", "a/b", "", 7])
                                                                .decode(), "v": "x1"})
    as_node(server, team, "n5").hset(keys.node("n5"), mapping={"agents": "not json", "v": "x2"})
    assert directory(n2.config) == {"Eve": "n3", "Ann": "n4"}
    assert directory(n4.config) == {"Bob": "n2", "Eve": "n3"}
    as_node(server, team, "n5").hset(keys.node("n5"), mapping={"agents": '{"Dan": 1}', "v": "x3"})
    assert directory(n2.config) == {"Eve": "n3", "Ann": "n4"}


def test_relay_sends_look_up_knows_no_name_while_the_server_is_away(tmp_path, team, nodes):
    from relay.federation.link import directory
    own = RedisServer(tmp_path / "redis")
    own.start()
    n2 = nodes(own, team, "n2", ["Bob"])
    n3 = nodes(own, team, "n3", ["Eve"])
    exchange(n2, n3, rounds=1)
    assert directory(n2.config) == {"Eve": "n3"}
    own.stop()
    assert directory(n2.config, timeout=0.5) == {}
