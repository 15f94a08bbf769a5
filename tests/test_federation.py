"""Federation over Redis Streams, against a real redis-server on a free local port (tests skip,
saying why, when the binary is missing): nodes are project roots on this machine, driven by
their steps (the relay's drain, the link's heartbeat, publish and receive)."""
import signal
import subprocess
import sys
import time
import uuid

import orjson
import pytest

from fednodes import MISSING, REDIS_SERVER, Node, RedisServer, drop, exchange, held, start_daemon, write_config
from relay import config as config_mod
from relay.errors import ConfigError

needs_server = pytest.mark.skipif(REDIS_SERVER is None, reason=MISSING)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    if REDIS_SERVER is None:
        pytest.skip(MISSING)
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def team():
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def nodes(tmp_path, clock):
    made = []

    def make(url, team, name, agents, extra=""):
        node = Node(tmp_path / name, url, team, name, agents, clock, extra)
        made.append(node)
        return node
    yield make
    for n in made:
        n.close()


def client(url):
    import redis
    return redis.Redis.from_url(url)


# -- configuration, and relay without the section -------------------------------------------

def test_without_a_federation_section_redis_is_never_imported(tmp_path):
    code = ("import sys; from click.testing import CliRunner; import relay.cli; "
            f"r = CliRunner().invoke(relay.cli.main, ['--root', {str(tmp_path)!r}, 'run', '--once', '-q']); "
            "assert r.exit_code == 0, r.output; print('redis' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_the_section_its_defaults_and_its_errors(tmp_path):
    state = write_config(tmp_path, "redis://relay:s3cret@example:6380/2", "acme", "n1", ["Ann"])
    fed = config_mod.load(tmp_path, ".relay", env={}).federation
    assert (fed.team, fed.node, fed.heartbeat) == ("acme", "n1", 1.0)
    assert fed.shown_url == "redis://relay:***@example:6380/2" and "s3cret" not in fed.shown_url
    assert fed.stream("n2") == "relay:{acme}:in:n2"
    # The node's default name: from the host and the project root, the same at every start.
    (state / "relay.toml").write_text('[federation]\nurl = "rediss://h"\nteam = "acme"\n')
    first = config_mod.load(tmp_path, ".relay", env={}).federation.node
    assert first == config_mod.load(tmp_path, ".relay", env={}).federation.node
    other = tmp_path / "other"
    (other / ".relay").mkdir(parents=True)
    (other / ".relay/relay.toml").write_text('[federation]\nurl = "rediss://h"\nteam = "acme"\n')
    assert config_mod.load(other, ".relay", env={}).federation.node != first
    # The environment overrides the file (a password need not be in it).
    env = {"RELAY_FEDERATION_URL": "redis://:pw@127.0.0.1:1", "RELAY_FEDERATION_NODE": "n9"}
    fed = config_mod.load(tmp_path, ".relay", env=env).federation
    assert (fed.url, fed.node, fed.team) == ("redis://:pw@127.0.0.1:1", "n9", "acme")
    for text, where in [('url = "http://h"\nteam = "a"', "redis://"), ('url = "redis://h"', "'team' is missing"),
                        ('url = "redis://h"\nteam = "../x"', "team '../x'"),
                        ('url = "redis://h"\nteam = "a"\nnode = "a b"', "node 'a b'"),
                        ('url = "redis://h"\nteam = "a"\nport = 1', "unknown key 'port'"),
                        ('url = "redis://h:notaport"\nteam = "a"', "not a Redis URL")]:
        (state / "relay.toml").write_text(f"[federation]\n{text}\n")
        with pytest.raises(ConfigError, match="'federation'") as e:
            config_mod.load(tmp_path, ".relay", env={})
        assert where in str(e.value)


def test_without_the_redis_package_a_verb_names_the_extra(cli, monkeypatch):
    write_config(cli.root, "redis://127.0.0.1:1", "acme", "n1", ["Ann"])
    monkeypatch.setitem(sys.modules, "redis", None)         # import redis -> ImportError
    for args in (["run", "--once"], ["status"]):
        result = cli(*args, ok=False)
        assert result.exit_code == 1, result.output
        assert result.output.strip().splitlines() == [
            "Error: the federation needs the redis package: pip install 'relay[federation]'"]


# -- messages between nodes -----------------------------------------------------------------

@needs_server
def test_direct_messages_both_ways_and_the_thread_on_both_sides(redis_server, team, nodes, cli):
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob", "Cy"])
    exchange(n1, n2, rounds=1)                          # the directory, before anything is sent
    n1.drop("Ann", "m1", "TO: Bob\nTHREAD: review-7\nSUBJECT: first\n\nhello Bob")
    exchange(n1, n2)
    n2.clock.advance(1)                                 # ids sort by time, across nodes too
    n2.drop("Bob", "m2", "TO: Ann, Cy\nTHREAD: review-7\n\nhello Ann (and Cy here)")
    exchange(n1, n2)
    [to_bob] = n2.held("Bob")
    assert (to_bob["from"], to_bob["body"], to_bob["node"], to_bob["thread"]) == ("Ann", "hello Bob", "n1", "review-7")
    [to_ann] = n1.held("Ann")
    assert (to_ann["from"], to_ann["node"]) == ("Bob", "n2")
    [to_cy] = n2.held("Cy")
    assert to_cy["id"] == to_ann["id"] and "node" not in to_cy      # local delivery, as ever
    assert n1.held("Bob") == [] and n2.held("Ann") == []
    # Each side reads the whole thread, oldest first, with the node of the other side.
    for node, sender_row, reply_row in ((n1, "Ann → Bob@n2", "Bob@n2 → Ann"), (n2, "Ann@n1 → Bob", "Bob → Ann@n1,Cy")):
        out = cli("--root", str(node.root), "audit", "--thread", "review-7").output
        lines = out.splitlines()[1:]
        assert len(lines) == 2 and sender_row in lines[0] and reply_row in lines[1], out
        rows = orjson.loads(cli("--root", str(node.root), "audit", "--thread", "review-7", "--json").output)
        assert [r["status"] for r in rows] == ["archived", "archived"]
    # relay show on either side tells what it knows.
    sent = cli("--root", str(n1.root), "show", to_bob["id"], "--json").output
    doc = orjson.loads(sent)
    [remote] = doc["remote"]
    assert (remote["node"], remote["recipients"], remote["status"]) == ("n2", ["Bob"], "published")
    assert remote["entry_id"] and any(e["event"] == "published" for e in doc["events"])
    got = orjson.loads(cli("--root", str(n2.root), "show", to_bob["id"], "--json").output)
    assert (got["node"], got["entry_id"], got["from"]) == ("n1", remote["entry_id"], "Ann")
    assert [d["recipient"] for d in got["deliveries"]] == ["Bob"]
    assert "received from node n1 as stream entry" in cli("--root", str(n2.root), "show", to_bob["id"]).output
    # The loop and the receiver both append to the hash chain, turn by turn: it stays one chain.
    n1.drop("Ann", "m3", "TO: Bob\n\nagain")
    exchange(n1, n2)
    n2.drop("Bob", "m4", "TO: Cy\n\nlocal")
    exchange(n1, n2)
    assert [e["body"] for e in n2.held("Cy")] == ["hello Ann (and Cy here)", "local"]
    # The streams hold nothing acknowledged; verify chains what was received too.
    r = client(redis_server.url)
    assert r.xlen(f"relay:{{{team}}}:in:n1") == 0 and r.xlen(f"relay:{{{team}}}:in:n2") == 0
    for node in (n1, n2):
        assert "ok" in cli("--root", str(node.root), "verify").output


@needs_server
def test_broadcast_reaches_every_agent_of_every_node_once(redis_server, team, nodes, cli):
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob", "Cy"])
    n3 = nodes(redis_server.url, team, "n3", ["Dee"])
    exchange(n1, n2, n3, rounds=1)
    n2.drop("Bob", "all", "TO: *\n\nto everyone")
    exchange(n1, n2, n3)
    exchange(n1, n2, n3)        # again: nothing more arrives
    for node, agent in ((n1, "Ann"), (n2, "Cy"), (n3, "Dee")):
        [env] = node.held(agent)
        assert (env["body"], env["to"], env["from"]) == ("to everyone", ["*"], "Bob")
    assert n2.held("Bob") == []
    doc = orjson.loads(cli("--root", str(n2.root), "show", n2.held("Cy")[0]["id"], "--json").output)
    assert sorted((o["node"], o["recipients"][0]) for o in doc["remote"]) == [("n1", "Ann"), ("n3", "Dee")]
    agents = orjson.loads(cli("--root", str(n1.root), "agents", "--json").output)
    remote = {a["agent"]: a["node"] for a in agents if a["node"] != "n1"}
    assert remote == {"Bob": "n2", "Cy": "n2", "Dee": "n3"}
    assert all(a["last_seen"] for a in agents if a["agent"] in remote)


@needs_server
def test_a_name_on_two_nodes_is_an_error_on_the_second(redis_server, team, nodes, cli):
    n1 = nodes(redis_server.url, team, "n1", ["Ann", "Bob"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob", "Cy"])
    assert n1.link.heartbeat() and n2.link.heartbeat()
    assert n1.link.conflicts == [] and n2.link.conflicts == [("Bob", "n1")]
    status = cli("--root", str(n2.root), "status", ok=False).output
    assert "CONFLICT   agent Bob is on node n1 too" in status
    assert orjson.loads(cli("--root", str(n2.root), "status", "--json", ok=False).output)["federation"]["conflicts"] == [["Bob", "n1"]]
    # What the directory holds is input: odd names and times planted in it are left out.
    r = client(redis_server.url)
    r.hset(f"relay:{{{team}}}:agents", mapping={"../evil": "n1", "System": "n1", "Eve": "bad node", "Zed": "n9"})
    r.hset(f"relay:{{{team}}}:nodes", mapping={"n9": "not a time", "bad node": "1"})
    assert n2.link.heartbeat()
    remote = n2.relay.history.remote_agents()
    assert set(remote) == {"Ann", "Bob", "Zed"} and remote["Zed"] == ("n9", None) and remote["Ann"][1] > 0
    r.hdel(f"relay:{{{team}}}:agents", "Zed")
    # The team routes Bob to the first node; on the second, Bob stays a local agent.
    n1.link.heartbeat()
    n3 = nodes(redis_server.url, team, "n3", ["Dee"])
    exchange(n1, n2, n3, rounds=1)
    n3.drop("Dee", "m", "TO: Bob\n\nfor the first Bob")
    n2.drop("Cy", "m", "TO: Bob\n\nfor the local Bob")
    exchange(n1, n2, n3)
    assert [e["body"] for e in n1.held("Bob")] == ["for the first Bob"]
    assert [e["body"] for e in n2.held("Bob")] == ["for the local Bob"]


@needs_server
def test_an_acl_user_limited_to_the_team_as_the_readme_sets_it_up(redis_server, team, nodes, cli):
    """The README's ACL user (its team's keys, no admin command, no MULTI) is enough; a node of
    another team with the same user is refused by the server and says so, without a traceback."""
    user = f"u{team}"
    client(redis_server.url).execute_command(
        "ACL", "SETUSER", user, "on", ">s3cret", f"~relay:{{{team}}}:*", "-@all", "+@read", "+@write", "+@stream",
        "+@hash", "+@scripting", "+@connection", "+time")
    url = f"redis://{user}:s3cret@127.0.0.1:{redis_server.port}/0"
    n1 = nodes(url, team, "n1", ["Ann"])
    n2 = nodes(url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    n1.drop("Ann", "m", "TO: Bob\n\nwith the team's user")
    exchange(n1, n2)
    assert [e["body"] for e in n2.held("Bob")] == ["with the team's user"]
    assert client(redis_server.url).xlen(f"relay:{{{team}}}:in:n2") == 0
    other = nodes(url, f"x{team}", "n3", ["Cy"])
    assert other.link.heartbeat() is False and other.receive() == 0
    status = orjson.loads(cli("--root", str(other.root), "status", "--json", ok=False).output)["federation"]
    assert status["link"]["connected"] is False and "no permissions" in status["link"]["error"]
    assert "no permissions" in status["server"]["error"]


@needs_server
def test_run_once_on_each_node_carries_a_message_across(redis_server, team, cli, tmp_path):
    for name, agent in (("n1", "Ann"), ("n2", "Bob")):
        write_config(tmp_path / name, redis_server.url, team, name, [agent])
    once = lambda node: cli("--root", str(tmp_path / node), "run", "--once").output      # noqa: E731
    once("n1"), once("n2")                              # each node announces its agents
    cli("--root", str(tmp_path / "n1"), "send", "--from", "Ann", "--to", "Bob", "across")
    assert "federation: published 1, received 0" in once("n1")
    assert "federation: published 0, received 1" in once("n2")
    assert [e["body"] for e in held(tmp_path / "n2/.relay", "Bob")] == ["across"]
    agents = cli("--root", str(tmp_path / "n2"), "agents").output
    assert any(line.split()[:2] == ["Ann", "n1"] for line in agents.splitlines()), agents


# -- the server away, and back ----------------------------------------------------------------

@needs_server
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
    assert status["outbound"] == {"pending": 0, "published": 1, "oldest_pending_at": None}
    assert status["link"]["connected"] is True
    server.stop()


@needs_server
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
    server.stop()


# -- the receiver after a crash, and against what an entry may hold ---------------------------

@needs_server
def test_a_publish_repeated_and_an_entry_read_but_never_acknowledged_deliver_once(redis_server, team, nodes, cli):
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    n1.drop("Ann", "m1", "TO: Bob\n\nonce")
    n1.drop("Ann", "m2", "TO: Bob\n\ntwice read")
    n1.send()
    r = client(redis_server.url)
    stream = f"relay:{{{team}}}:in:n2"
    entries = r.xrange(stream)
    assert len(entries) == 2
    r.xadd(stream, entries[0][1])                       # the publish repeated (a crash before its id was recorded)
    server = orjson.loads(cli("--root", str(n2.root), "status", "--json", ok=False).output)["federation"]["server"]
    assert (server["stream_length"], server["lag"], server["unacknowledged"]) == (3, 3, 0)
    # A receiver that read everything and died before acknowledging (another consumer name: a
    # renamed node) leaves the entries pending: claimed again at the next start.
    assert len(r.xreadgroup("relay", "crashed", {stream: ">"})[0][1]) == 3
    server = orjson.loads(cli("--root", str(n2.root), "status", "--json", ok=False).output)["federation"]["server"]
    assert (server["stream_length"], server["lag"], server["unacknowledged"]) == (3, 0, 3)
    assert "3 entries, lag 0, 3 unacknowledged" in cli("--root", str(n2.root), "status", ok=False).output
    # ... and one envelope already written into new/ before the crash is recognised, not doubled.
    body = entries[1][1][b"env"]
    doc = orjson.loads(body)
    (n2.state / "inbox/Bob/new" / f"{doc['id']}.json").write_bytes(orjson.dumps({**doc, "node": "n1"}))
    n2.close()
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])  # the node starts again
    assert n2.receive() == 0                            # nothing read before its first heartbeat
    assert n2.link.heartbeat()
    assert n2.receive() == 3
    assert sorted(e["body"] for e in n2.held("Bob")) == ["once", "twice read"]
    assert r.xlen(stream) == 0 and r.xpending(stream, "relay")["pending"] == 0
    assert n2.receive() == 0


@needs_server
def test_malformed_entries_are_recorded_acknowledged_and_never_write_outside(redis_server, team, nodes, cli, tmp_path):
    n2 = nodes(redis_server.url, team, "n2", ["Bob"], extra='max_body_bytes = "1KiB"')
    n2.link.heartbeat()
    n2.receive()                                        # the group exists
    r = client(redis_server.url)
    stream = f"relay:{{{team}}}:in:n2"
    good = {"id": "01M8NY4DA9BNVZQW02BT7NGYD2", "from": "Ann", "to": ["Bob"], "kind": "message", "thread": None,
            "subject": None, "body": "ok", "headers": {}, "sent_at": "2026-11-30T00:00:00.000000Z",
            "relayed_at": "2026-11-30T00:00:00.000000Z", "source": "msg", "sha256": "a" * 64}

    def entry(env=None, **fields):
        env = env if isinstance(env, bytes) else orjson.dumps(env or good)
        doc = {"v": "1", "id": good["id"], "node": "n1", "to": orjson.dumps(["Bob"]), "env": env}
        doc.update(fields)
        return {k: v for k, v in doc.items() if v is not None}
    outside = tmp_path / "outside"
    bad = [entry(v="2"), entry(node="../n1"), entry(id="../../../outside/x"), entry(env=b"{not json"),
           entry(to=orjson.dumps(["../../outside"])), entry(to=orjson.dumps(["Zed"])), entry(to=orjson.dumps(["System"])),
           entry(env={**good, "body": "x" * 2000}), entry(env={**good, "id": "01M8NY4DA9BNVZQW02BT7NGYD3"}),
           entry(env={**good, "from": "../Ann"}), entry(env={**good, "sha256": "zz"}),
           entry(env={**good, "subject": {"x": 1}}), entry(env={**good, "cwd": "../.."}), {"junk": b"\xff\xfe"}, entry(env={**good, "cwd": "a\x00b"}),
           entry(env=b"x" * (9 << 20))]
    for fields in bad:
        r.xadd(stream, fields)
    r.xadd(stream, entry())                             # and one good entry after them
    assert sum(iter(n2.receive, 0)) == len(bad) + 1      # in reads of a few entries at first
    assert [e["body"] for e in n2.held("Bob")] == ["ok"]
    assert r.xlen(stream) == 0 and r.xpending(stream, "relay")["pending"] == 0     # all acknowledged
    assert not outside.exists()
    assert sorted(p.name for p in (n2.state / "inbox").iterdir()) == ["Bob", "System"]
    rows = orjson.loads(cli("--root", str(n2.root), "audit", "--status", "failed", "--json").output)
    assert len(rows) == len(bad) and all(r["node"] and r["error"] for r in rows)
    reasons = " | ".join(r["error"] for r in rows)
    for why in ("version 1", "no valid node name", "not a relay message id", "not JSON", "not a list of agent names",
                "none of Zed is an agent of node n2", "over this node's max_body_bytes", "the entry's message id",
                "is not an agent name", "no sha256", "'subject' is not text", "outside this node's project root",
                "larger than this node accepts"):
        assert why in reasons, why
    status = orjson.loads(cli("--root", str(n2.root), "status", "--json", ok=False).output)["federation"]
    assert status["received"] == {"delivered": 1, "refused": len(bad)}


@needs_server
def test_an_unknown_recipient_still_fails_and_a_message_waiting_for_the_server_is_not_swept(tmp_path, team, nodes):
    server = RedisServer(tmp_path / "redis").start()
    n1 = nodes(server.url, team, "n1", ["Ann"])
    n2 = nodes(server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    server.stop()
    n1.drop("Ann", "m0", "TO: Ghost\n\nnobody has Ghost")
    n1.drop("Ann", "m1", "TO: Bob\n\nwaits for the server")
    counts, _ = n1.send()
    assert (counts.failed, counts.archived) == (1, 1)
    assert "unknown recipient Ghost; known agents: Ann, Bob" in n1.relay.history.audit(status="failed").fetchone()["error"]
    swept = n1.relay.sweep(n1.clock.advance(30 * 86400), older_than=1)
    assert swept.archived == 0 and n1.relay.history.counts()["archived"] == 1
    server.start()
    exchange(n1, n2)
    assert [e["body"] for e in n2.held("Bob")] == ["waits for the server"]
    # Published: the daemon's own sweep (30 days on, retention 7d) removes it now.
    assert n1.relay.history.counts()["archived"] == 0
    server.stop()


# -- the daemons -----------------------------------------------------------------------------

def wait_for(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def knows(root, name):
    from relay.history import History
    from relay.ledger import Ledger
    path = root / ".relay" / "ledger.sqlite"
    if not path.exists():
        return False
    try:
        with History(Ledger(path, readonly=True)) as h:
            return name in h.remote_agents()
    except Exception:   # noqa: BLE001 - not migrated yet: the daemon is starting
        return False


@needs_server
@pytest.mark.timeout_s(120)
def test_two_daemons_both_ways_and_a_node_killed_with_sigkill_mid_stream(redis_server, team, tmp_path):
    s1 = write_config(tmp_path / "n1", redis_server.url, team, "n1", ["Ann"])
    s2 = write_config(tmp_path / "n2", redis_server.url, team, "n2", ["Bob"])
    procs = [start_daemon(tmp_path / "n1"), start_daemon(tmp_path / "n2")]
    try:
        wait_for(lambda: knows(tmp_path / "n1", "Bob") and knows(tmp_path / "n2", "Ann"), what="the directory")
        drop(s2, "Bob", "hello", "TO: Ann\n\nfrom n2")
        for i in range(30):
            drop(s1, "Ann", f"m{i}", f"TO: Bob\n\nn1-{i}")
            if i == 10:
                wait_for(lambda: held(s2, "Bob"), what="the first arrivals")
                procs[1].kill()                         # SIGKILL, mid-stream
                procs[1].wait()
                procs[1] = start_daemon(tmp_path / "n2")
        wanted = sorted(f"n1-{i}" for i in range(30))
        wait_for(lambda: len(held(s2, "Bob")) >= 30 and held(s1, "Ann"), what="every message")
        bodies = sorted(e["body"] for e in held(s2, "Bob"))
        assert bodies == wanted                         # once each
        assert [e["body"] for e in held(s1, "Ann")] == ["from n2"]
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)
    for p in procs:
        assert p.returncode == 0, open(p.log).read()[-2000:]
    assert "Traceback" not in open(procs[1].log).read()


@needs_server
def test_a_link_planted_in_an_inbox_holds_the_entry_until_fixed_or_retry_period_then_it_fails(
        redis_server, team, nodes, tmp_path):
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    outside = tmp_path / "outside"
    outside.mkdir()
    new = n2.state / "inbox/Bob/new"
    new.rmdir()
    new.symlink_to(outside)                             # planted: relay never writes through it
    r = client(redis_server.url)
    stream = f"relay:{{{team}}}:in:n2"
    n1.drop("Ann", "m1", "TO: Bob\n\nfirst")
    n1.send()
    assert n2.receive() == 1
    assert list(outside.iterdir()) == [] and r.xpending(stream, "relay")["pending"] == 1
    new.unlink()
    new.mkdir()                                         # fixed: the next look delivers it, once
    n2.clock.advance(5)
    n2.receive()
    assert [e["body"] for e in n2.held("Bob")] == ["first"] and r.xpending(stream, "relay")["pending"] == 0
    (n2.state / "inbox/Bob/new").rename(n2.state / "inbox/Bob/new.real")
    new.symlink_to(outside)
    n1.drop("Ann", "m2", "TO: Bob\n\nsecond")
    n1.send()
    n2.receive()
    n2.clock.advance(3601)                              # past retry_period: failed with why, acknowledged
    n2.receive()
    assert list(outside.iterdir()) == [] and r.xpending(stream, "relay")["pending"] == 0 and r.xlen(stream) == 0
    [failed] = list(n2.relay.history.audit(status="failed"))
    assert failed["node"] == "n1" and "gave up after 3601s: not delivered to Bob" in failed["error"]
    assert "delivered to nobody" in failed["error"]


@needs_server
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
    n1.relay.ledger.record = killed
    with pytest.raises(RuntimeError):
        n1.send()
    assert n1.link.publish_offered() == 1               # already in n2's stream
    n1.close()
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])   # started again: recovery, then the row
    counts, published = n1.send()
    assert counts.archived == 1 and published == 1
    r = client(redis_server.url)
    assert r.xlen(f"relay:{{{team}}}:in:n2") == 2
    assert n2.receive() == 2
    assert [e["body"] for e in n2.held("Bob")] == ["once only"]
    assert r.xlen(f"relay:{{{team}}}:in:n2") == 0


@needs_server
def test_a_node_name_used_by_two_relays_is_an_error_and_the_second_reads_nothing(redis_server, team, nodes, cli):
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    twin = Node(n1.root.parent / "copy", redis_server.url, team, "n1", ["Al"], n1.clock)    # a copied project
    try:
        assert twin.link.heartbeat() is False
        n2.drop("Bob", "m", "TO: Ann\n\nfor the first n1")
        n2.send()
        assert twin.receive() == 0 and n1.receive() == 1
        assert [e["body"] for e in n1.held("Ann")] == ["for the first n1"]
        status = orjson.loads(cli("--root", str(twin.root), "status", "--json", ok=False).output)["federation"]["link"]
        assert status["connected"] is False and "node name n1 is in use by another relay" in status["error"]
        assert str(n1.root) in status["error"]
    finally:
        twin.close()
