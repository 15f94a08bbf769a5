"""Agent names no node can squat: a name is claimed (a key written only with SETNX) before its
node announces it, and the claim outranks any other node's list. Against a real redis-server,
each node on the ACL user `relay federation acl` prints; the squatter is a raw client with its
own node's credentials that lists (and tries to claim) every name it sees, polling."""
import hashlib
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

    def make(server, team, name, agents):
        node = Node(tmp_path / name, user_url(server, team, name), team, name, agents, clock)
        made.append(node)
        return node
    yield make
    for n in made:
        n.close()


def claim_key(team, name):
    return f"relay:{{{team}}}:claim:{name.casefold()}"


class Squatter:
    """Node n3, hostile: it lists every name another node lists (and a case variant of each) in
    its own entry, with a last seen far ahead, and tries to claim each first."""

    def __init__(self, server, team, others):
        import redis
        self.r = redis.Redis.from_url(user_url(server, team, "n3"))
        self.team, self.keys, self.others = team, Keys(team), others

    def poll(self):
        names = set()
        for n in self.others:
            names.update(orjson.loads(self.r.hget(self.keys.node(n), "agents") or b"[]"))
        for name in names:
            try:
                self.r.setnx(claim_key(self.team, name), "n3")
            except Exception:   # noqa: BLE001 - an ACL without claims refuses it; the squat goes on
                pass
        listed = orjson.dumps(sorted(names | {n.upper() for n in names} | {"Eve"}))
        seconds, _ = self.r.time()
        self.r.hset(self.keys.node("n3"), mapping={"agents": listed, "v": hashlib.sha256(listed).hexdigest()[:16],
                                                   "seen": str(seconds + 3600), "timeout": "60", "owner": "squat"})


def new_agent(node, name):
    for sub in ("tmp", "new", "cur"):
        (node.state / "inbox" / name / sub).mkdir(parents=True, exist_ok=True)
    (node.state / "outbox" / name).mkdir(parents=True, exist_ok=True)


def bodies(node, agent):
    return sorted(e["body"] for e in node.held(agent))


def refusals(node):
    rows = node.relay.history.db.execute("SELECT error FROM messages WHERE node IS NOT NULL AND status = 'failed'")
    return [r[0] for r in rows]


def test_a_squatting_node_cannot_make_a_new_agent_unreachable(server, team, nodes):
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    squat = Squatter(server, team, ["n1", "n2"])
    squat.poll()
    exchange(n1, n2, rounds=1)
    new_agent(n1, "Dan")
    assert n1.link.look()                   # a new agent: claimed, then announced at once
    squat.poll()                            # ... and listed (and claimed) by the squatter at once
    # Dan writes before n2 has looked at the directory since: n2 resolves him now.
    n1.drop("Dan", "hello", "TO: Bob\n\nDan here")
    n1.send()
    n2.receive()
    assert bodies(n2, "Bob") == ["Dan here"]
    # Messages to Dan are routed to n1 at n2's next look, whatever n3 lists.
    n2.drop("Bob", "answer", "TO: Dan\n\nwelcome, Dan")
    for _ in range(2):
        n1.link.heartbeat()
        squat.poll()
        n2.link.heartbeat()
        squat.poll()
        n2.send()
        n1.receive()
        n1.link.publish()
        n2.link.publish()
    assert bodies(n1, "Dan") == ["welcome, Dan"]
    assert n2.relay.history.remote.agents()["Dan"][0] == "n1"
    assert "DAN" not in n2.relay.history.remote.agents()
    assert n2.link.conflicts == [] and n1.link.conflicts == []     # the squat is no conflict anywhere
    assert refusals(n2) == [] and refusals(n1) == []
    # Dan's own messages are still accepted after n2's look.
    n1.drop("Dan", "again", "TO: Bob\n\nstill Dan")
    exchange(n1, n2)
    assert bodies(n2, "Bob") == ["Dan here", "still Dan"]


def test_a_squatter_claiming_every_sender_it_reads_in_a_stream_cannot_take_a_new_agents_name(server, team, nodes):
    """A new agent writes to the squatter's agent before its node has announced it: the squatter
    reads its stream from n1 and claims every sender it sees there. The message is held until
    the sender's name is claimed (and announced), so the squatter never reads a name before its
    claim exists: Zed stays n1's, reachable from n2, and the squatter gets the message."""
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    squat = Squatter(server, team, ["n1", "n2"])
    squat.poll()
    exchange(n1, n2, rounds=1)
    seen = []

    def claim_senders():
        for _, fields in squat.r.xrange(Keys(team).messages("n1", "n3")):
            sender = orjson.loads(fields[b"env"])["from"]
            seen.append(sender)
            squat.r.setnx(claim_key(team, sender), "n3")
    new_agent(n1, "Zed")
    n1.drop("Zed", "first", "TO: Eve\n\nZed's first word")
    n1.send()                               # before any look of n1's since Zed came
    claim_senders()
    for _ in range(3):                      # the publisher's turns, as its thread takes them
        n1.link.publish()
        claim_senders()
        n1.link.look()
        claim_senders()
        n1.clock.advance(0.5)
    n1.link.publish()
    claim_senders()
    assert "Zed" in seen                    # it was published, and the squatter read it
    assert admin(server).get(claim_key(team, "Zed")) == b"n1"
    n2.link.look()
    assert n2.link.directory.routes.get("Zed") == "n1"
    n2.drop("Bob", "hi", "TO: Zed\n\nhello Zed")
    n2.send()
    n1.receive()
    assert bodies(n1, "Zed") == ["hello Zed"]


def test_a_node_cannot_overwrite_or_delete_another_nodes_claim(server, team, nodes):
    import redis
    n1 = nodes(server, team, "n1", ["Ann"])
    n1.link.heartbeat()
    squat = Squatter(server, team, ["n1"])
    key = claim_key(team, "Ann")
    assert squat.r.get(key) == b"n1"
    for cmd in [("SET", key, "n3"), ("SET", key, "n3", "XX"), ("DEL", key), ("UNLINK", key), ("GETSET", key, "n3"),
                ("GETDEL", key), ("EXPIRE", key, "1"), ("PEXPIRE", key, "1"), ("RENAME", key, key + "x"),
                ("APPEND", key, "x"), ("SETRANGE", key, "0", "n3"), ("MSET", key, "n3"), ("COPY", key, key + "x"),
                ("RESTORE", key, "0", "x", "REPLACE"), ("EVAL", "return redis.call('SET', KEYS[1], 'n3')", 1, key)]:
        with pytest.raises(redis.exceptions.NoPermissionError):
            squat.r.execute_command(*cmd)
    assert squat.r.setnx(key, "n3") is False
    assert squat.r.get(key) == b"n1"
    squat.poll()
    n2 = nodes(server, team, "n2", ["Bob"])
    n2.link.heartbeat()
    assert n2.relay.history.remote.agents()["Ann"][0] == "n1"


def test_an_operator_grants_and_frees_a_name(server, team, nodes, cli, clock):
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    squat = Squatter(server, team, ["n1", "n2"])
    squat.r.setnx(claim_key(team, "Zed"), "n3")         # a name guessed before anyone announced it
    exchange(n1, n2, rounds=1)
    new_agent(n1, "Zed")
    n1.link.look()
    squat.poll()
    n2.link.heartbeat()
    # n3 holds the claim: n1's list is not taken for it (n3, listing Zed and ZED, has both)
    assert n2.relay.history.remote.agents()["Zed"][0] == "n3"
    assert n1.link.conflicts == [("Zed", "n3")]             # said on the node whose agent it is
    line = cli("federation", "claim-grant", "Zed", "n1", "--team", team).output.strip()
    admin(server).execute_command(*shlex.split(line))
    clock.advance(10)
    n1.link.heartbeat()
    n2.link.heartbeat()
    assert n2.relay.history.remote.agents()["Zed"][0] == "n1" and n1.link.conflicts == []
    n2.drop("Bob", "m", "TO: Zed\n\nyours now")
    exchange(n1, n2)
    assert bodies(n1, "Zed") == ["yours now"]
    # Freed: the next node to announce it claims it (n1 at its next heartbeat).
    line = cli("federation", "claim-free", "Zed", "--team", team).output.strip()
    admin(server).execute_command(*shlex.split(line))
    assert admin(server).get(claim_key(team, "Zed")) is None
    clock.advance(10)
    n1.link.heartbeat()                 # its look finds its claim gone ...
    n1.link.heartbeat()                 # ... and its next announcement claims the name again
    assert admin(server).get(claim_key(team, "Zed")) == b"n1"
    bad = cli("federation", "claim-grant", "System", "n1", "--team", team, ok=False)
    assert bad.exit_code != 0 and "System" in bad.output


def test_a_retire_frees_the_retired_nodes_claims(server, team, nodes, cli):
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    assert admin(server).get(claim_key(team, "Bob")) == b"n2"
    n2.close()                                              # gone for good
    n4 = nodes(server, team, "n4", ["Bob"])
    n4.link.heartbeat()
    assert n4.link.conflicts == [("Bob", "n2")]             # n2 holds the claim
    line = cli("federation", "retire", "n2", "--team", team).output.strip()
    admin(server).execute_command(*shlex.split(line))
    assert admin(server).get(claim_key(team, "Bob")) is None
    assert admin(server).hget(n2.key(), "agents") == b"[]"
    n4.link.heartbeat()
    assert admin(server).get(claim_key(team, "Bob")) == b"n4" and n4.link.conflicts == []
    n4.drop("Bob", "m", "TO: Ann\n\nBob on n4")
    n1.link.heartbeat()
    exchange(n1, n4)
    assert bodies(n1, "Ann") == ["Bob on n4"]


def test_a_node_listing_case_variants_of_its_own_names_fails_no_other_nodes_health_nor_floods_their_logs(
        server, team, nodes, clock, caplog):
    """n3 lists Zed and ZED (and claims zed): both reach n3, which asked for both; no honest
    node's `relay status` fails for it, nor for a variant of n1's Ann (n1's claim keeps it). Two
    nodes listing thousands of the same unclaimed names at each read are their own conflicts:
    a note on an honest node, and a bounded number of log lines."""
    import logging

    from relay.core import health
    from relay.federation.directory import CONFLICTS_SAID
    from relay.federation.link import probe
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    keys = Keys(team)
    evil = {n: as_node(server, team, n) for n in ("n3", "n4")}

    def listing(lists, claim=True):
        for node, names in lists.items():
            listed = orjson.dumps(names)
            if claim:
                evil[node].setnx(claim_key(team, "zed"), node)
            seconds, _ = evil[node].time()
            evil[node].hset(keys.node(node), mapping={"agents": listed, "v": hashlib.sha256(listed).hexdigest()[:16],
                                                      "seen": str(seconds), "timeout": "60", "owner": f"{node}-host"})
        clock.advance(31)           # past the wait of a list that changes often (directory.Churn)
        for n in (n1, n2):
            n.link.heartbeat()
        return [health.federation(probe(n.config, n.link.history), True, clock.now, 600) for n in (n1, n2)]

    (c1, _), (c2, _) = listing({"n3": ["Eve", "Zed", "ZED"]})
    assert (c1, c2) == (health.EXIT_OK, health.EXIT_OK)
    routed = n2.relay.history.remote.agents()
    assert {k: v[0] for k, v in routed.items() if k in ("Zed", "ZED")} == {"Zed": "n3", "ZED": "n3"}
    (c1, said1), (c2, said2) = listing({"n3": ["Eve", "Zed", "ZED", "ANN"]})
    assert (c1, said1, c2, said2) == (health.EXIT_OK, [], health.EXIT_OK, [])
    assert n2.relay.history.remote.agents()["Ann"][0] == "n1" and "ANN" not in n2.relay.history.remote.agents()
    caplog.set_level(logging.ERROR, logger="relay.federation.directory")
    caplog.clear()
    for i in range(3):      # 2,000 new names in conflict at each read
        names = [f"Q{i}x{j}" for j in range(2000)]
        (c1, _), (c2, said2) = listing({"n3": names, "n4": names}, claim=False)
        assert (c1, c2) == (health.EXIT_OK, health.EXIT_OK) and "listed by more than one node" in said2[0]
    lines = [r for r in caplog.records if r.name == "relay.federation.directory"]
    # Each of the three reads on each of the two nodes: at most CONFLICTS_SAID lines and one more.
    assert 0 < len(lines) <= 3 * 2 * (CONFLICTS_SAID + 1), len(lines)
    # Two nodes each listing one case of a name nobody claimed: one name to a person, so neither
    # is routed, and both are conflicts.
    listing({"n3": ["Eve", "Yan"], "n4": ["YAN"]}, claim=False)
    assert not {"Yan", "YAN"} & set(n2.relay.history.remote.agents())
    assert {("Yan", "n3"), ("YAN", "n4")} <= set(n2.link.directory.conflicts)


def test_a_node_rewriting_its_list_every_second_is_read_ever_more_rarely_and_an_honest_change_at_once(
        server, team, nodes, clock):
    """n3 lists 400 new names (claimed) at every look: its list is read at 1, 2, 4 ... up to 30 s
    apart, not at each look; n1's new agent, after a quiet while, is read at the next look."""
    from relay.federation.directory import CHURN_MAX
    n1 = nodes(server, team, "n1", ["Ann"])
    n2 = nodes(server, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    evil, keys = as_node(server, team, "n3"), Keys(team)
    reads = []
    for second in range(70):
        names = [f"N{second}x{j}" for j in range(400)]
        pipe = evil.pipeline(transaction=False)
        for name in names:
            pipe.setnx(claim_key(team, name), "n3")
        listed = orjson.dumps(names)
        seconds, _ = evil.time()
        pipe.hset(keys.node("n3"), mapping={"agents": listed, "v": hashlib.sha256(listed).hexdigest()[:16],
                                           "seen": str(seconds), "timeout": "60", "owner": "n3-host"})
        pipe.execute()
        clock.advance(1)
        n2.link.look()
        if any(name in n2.link.directory.entries["n3"].agents for name in names):
            reads.append(second)
    gaps = [b - a for a, b in zip(reads, reads[1:])]
    assert reads == [0, 1, 2, 4, 8, 16, 32, 62] and max(gaps) == CHURN_MAX, reads
    new_agent(n1, "Neo")
    n1.link.heartbeat()
    clock.advance(1)
    n2.link.look()
    assert n2.relay.history.remote.agents()["Neo"][0] == "n1"


def test_a_nodes_list_is_read_up_to_its_limit_in_names_and_bytes_and_what_is_wrong_with_it_said():
    from relay.federation.directory import NAME_BYTES, listed_names
    assert listed_names(None, 3) == ((), None)
    assert listed_names(b"not json", 3) == ((), None)
    assert listed_names(b'{"Ann": 1}', 3) == ((), None)
    assert listed_names(b'["Ann", "Bob", "Ann", "a/b", 7]', 3) == (("Ann", "Bob"), None)
    assert listed_names(b'["Ann", "Bob", "Cy"]', 3) == (("Ann", "Bob", "Cy"), None)
    assert listed_names(b'["Ann", "Bob", "Cy", "Dee"]', 3) == (
        ("Ann", "Bob", "Cy"), "lists 4 agents, over max_agents_per_node (3): only the first 3 are taken")
    names, wrong = listed_names(b'["Ann", "system", "Bob"]', 3)
    assert names == ("Ann", "Bob")
    assert wrong == "lists 'system', which relay keeps for itself (in any case): not taken"
    at_limit = b'["Ann"' + b" " * (3 * NAME_BYTES - 7) + b"]"
    assert len(at_limit) == 3 * NAME_BYTES and listed_names(at_limit, 3) == (("Ann",), None)
    over = b'["Ann"' + b" " * (3 * NAME_BYTES - 6) + b"]"
    assert listed_names(over, 3) == ((), f"lists {3 * NAME_BYTES + 1} bytes of agent names, over what "
                                         "max_agents_per_node (3) allows: its names are not taken")


class _Listed:
    """listed.py's face for SenderCheck: no claims; what a node's entry lists now."""

    def __init__(self, lists):
        self.by_node = lists

    def claimed(self, agent, node):
        return None

    def lists(self, node, folded):
        return folded in self.by_node.get(node, {})

    def batch(self, entries):
        pass


class _Team:
    """teamlists.py's face for SenderCheck: every node's entry, {node: {folded: {names}}}."""

    def __init__(self, lists):
        self.by_node = lists

    def lists(self, node, force=False):
        return self.by_node

    def batch(self):
        pass


def test_a_sender_not_resolved_yet_is_its_nodes_only_when_that_node_alone_lists_it_as_written():
    """A name announced since the directory was last resolved: the node's own when its entry alone
    lists it, spelt as sent; no one's when two nodes list it (claimed twice) or the one node lists
    it in another case; not known when no node lists it."""
    from relay.federation.sendercheck import UNANNOUNCED, SenderCheck

    def check(lists):
        c = SenderCheck("here", lambda: ({}, set()), _Listed(lists), _Team(lists))
        c.batch([], local=())
        return c

    alone = {"n1": {"dana": {"Dana"}}}
    assert check(alone).holds("Dana", "n1") is True and check(alone).why_not("Dana", "n1", ()) is None
    assert check(alone).holds("dana", "n1") is False            # listed as Dana: another spelling is no one's
    twice = {"n1": {"dana": {"Dana"}}, "n2": {"dana": {"Dana"}}}
    assert check(twice).holds("Dana", "n1") is False and check(twice).holds("Dana", "n2") is False
    assert "claimed by more than one" in check(twice).why_not("Dana", "n1", ())
    assert check(alone).holds("Dana", "n2") is False            # n1's, not n2's
    assert check({}).holds("Dana", "n1") is None
    assert check({}).why_not("Dana", "n1", ()) == f"the sender Dana is not in the team's directory {UNANNOUNCED}"


def test_a_sender_its_old_holder_no_longer_lists_is_the_new_nodes_only_when_it_alone_lists_it():
    from relay.federation.sendercheck import SenderCheck

    def check(lists):
        c = SenderCheck("here", lambda: ({"Dana": "n0"}, set()), _Listed(lists), _Team(lists))
        c.batch([], local=())
        return c

    assert check({"n0": {"dana": {"Dana"}}, "n1": {"dana": {"Dana"}}}).holds("Dana", "n1") is False   # n0 still lists it
    assert check({"n1": {"dana": {"Dana"}}}).holds("Dana", "n1") is True
    assert check({"n1": {"dana": {"Dana"}}, "n2": {"dana": {"Dana"}}}).holds("Dana", "n1") is False
    assert check({"n1": {"dana": {"dana"}}}).holds("Dana", "n1") is False
    assert check({"n0": {"dana": {"Dana"}}}).holds("Dana", "n0") is True
