"""Federation over Redis Streams, against a real redis-server on a free local port (tests skip,
saying why, when the binary is missing): nodes are project roots on this machine, driven by
their steps (the relay's drain, the link's heartbeat, publish and receive). This file: the
configuration, the team's directory (each node's own key), one ACL user per node, messages
between nodes end to end, run --once and the daemons. What makes a cross-node delivery happen
once whatever the server, a crash or an entry does is in test_federation_delivery.py."""
import shlex
import subprocess
import sys
import time

import orjson
import pytest

from fednodes import (Node, client, drop, exchange, held, needs_server, nodes, redis_server,  # noqa: F401 - fixtures
                      start_daemon, team, write_config)
from relay import config as config_mod
from relay.core import health
from relay.errors import ConfigError
from conftest import error_line
from relay.federation.keys import RETIRED, Keys


# -- configuration, and relay without the section -------------------------------------------

def test_without_a_federation_section_redis_is_never_imported(tmp_path):
    code = ("import sys; from click.testing import CliRunner; import relay.cli; "
            f"r = CliRunner().invoke(relay.cli.main, ['--root', {str(tmp_path)!r}, 'run', '--once', '-q']); "
            "assert r.exit_code == 0, r.output; print('redis' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_the_section_its_defaults_its_keys_and_its_errors(tmp_path):
    state = write_config(tmp_path, "redis://relay:s3cret@example:6380/2", "acme", "n1", ["Ann"])
    fed = config_mod.load(tmp_path, ".relay", env={}).federation
    assert (fed.team, fed.node, fed.heartbeat, fed.ack_timeout) == ("acme", "n1", 1.0, 30.0)
    assert fed.shown_url == "redis://relay:***@example:6380/2" and "s3cret" not in fed.shown_url
    # The team's keys, laid out by who writes them.
    keys = Keys(fed.team)
    assert fed.prefix == keys.prefix == "relay:{acme}:"
    assert keys.node("n1") == "relay:{acme}:node:n1" and keys.node_name(keys.node("n1")) == "n1"
    assert keys.messages("n1", "n2") == "relay:{acme}:from:n1:to:n2"
    assert keys.acks("n2", "n1") == "relay:{acme}:from:n2:ack:n1"
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
                        ('url = "redis://h"\nteam = "a"\nnode = "a:b"', "node 'a:b'"),
                        ('url = "redis://h"\nteam = "a"\nport = 1', "unknown key 'port'"),
                        ('url = "redis://h"\nteam = "a"\nack_timeout = "0s"', "ack_timeout"),
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
            "relay: the federation needs the redis package: pip install 'agent-outbox-relay[federation]' "
            "(from a checkout of relay: pip install '.[federation]')"]


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
    # relay show on either side tells what it knows: the sender's row is done once the receiving
    # node acknowledged its durable delivery.
    sent = cli("--root", str(n1.root), "show", to_bob["id"], "--json").output
    doc = orjson.loads(sent)
    [remote] = doc["remote"]
    assert (remote["node"], remote["recipients"], remote["status"]) == ("n2", ["Bob"], "acknowledged")
    assert remote["entry_id"] and remote["acknowledged_at"]
    assert [e["event"] for e in doc["events"] if e["event"] in ("queued", "published", "acknowledged")] == [
        "queued", "published", "acknowledged"]
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
    assert r.xlen(n1.stream("n2")) == 0 and r.xlen(n2.stream("n1")) == 0
    assert n1.relay.history.remote.outbound_counts()["acknowledged"] == 2
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
    assert sorted((o["node"], o["recipients"][0], o["status"]) for o in doc["remote"]) == [
        ("n1", "Ann", "acknowledged"), ("n3", "Dee", "acknowledged")]
    agents = orjson.loads(cli("--root", str(n1.root), "agents", "--json").output)
    remote = {a["agent"]: a["node"] for a in agents if a["node"] != "n1"}
    assert remote == {"Bob": "n2", "Cy": "n2", "Dee": "n3"}
    assert all(a["last_seen"] for a in agents if a["agent"] in remote)


@needs_server
def test_run_once_on_each_node_carries_a_message_across(redis_server, team, cli, tmp_path):
    for name, agent in (("n1", "Ann"), ("n2", "Bob")):
        write_config(tmp_path / name, redis_server.url, team, name, [agent])
    once = lambda node: cli("--root", str(tmp_path / node), "run", "--once").output      # noqa: E731
    once("n1"), once("n2"), once("n1")                  # each node announces its agents, and reads the others'
    cli("--root", str(tmp_path / "n1"), "send", "--from", "Ann", "--to", "Bob", "across")
    assert "federation: published 1, received 0" in once("n1")
    assert "federation: published 0, received 1" in once("n2")      # and acknowledged
    assert [e["body"] for e in held(tmp_path / "n2/.relay", "Bob")] == ["across"]
    once("n1")                                          # reads the acknowledgement
    doc = orjson.loads(cli("--root", str(tmp_path / "n1"), "status", "--json", ok=False).output)["federation"]
    assert (doc["outbound"]["published"], doc["outbound"]["acknowledged"]) == (0, 1)
    agents = cli("--root", str(tmp_path / "n2"), "agents").output
    assert any(line.split()[:3] == ["Ann", "active", "n1"] for line in agents.splitlines()), agents


@needs_server
def test_relay_send_asks_the_server_for_a_name_this_node_has_not_heard_of_yet(redis_server, team, nodes, cli,
                                                                              tmp_path):
    import relay.federation.link  # noqa: F401 - as in any process that ran a link (run --once, the daemon, tests)
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    assert n2.link.heartbeat()
    write_config(tmp_path / "n1", redis_server.url, team, "n1", ["Ann"])        # n1 has never read the directory
    cli("--root", str(tmp_path / "n1"), "send", "--from", "Ann", "--to", "Bob", "across")
    assert "federation: published 1" in cli("--root", str(tmp_path / "n1"), "run", "--once").output


def test_an_agents_shell_without_the_url_sends_to_the_team_by_what_the_daemon_read(redis_server, team, nodes,
                                                                                cli, tmp_path, monkeypatch):
    """The password stays in the daemon's environment: an agent's verbs, with relay.toml's
    [federation] and no URL, know the team's agents from the ledger (what the daemon read of
    the directory), send to them without a warning, and the node carries the message; relay
    run without a URL says what it needs, in one line."""
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    (n1.state / "relay.toml").write_text(f'agents = ["Ann"]\n[federation]\nteam = "{team}"\nnode = "n1"\n')
    monkeypatch.delenv("RELAY_FEDERATION_URL", raising=False)
    sent = cli("--root", str(n1.root), "send", "--from", "Ann", "--to", "Bob", "from a shell without the password")
    assert "warning" not in sent.output and "federation" not in sent.output
    assert "Bob" in cli("--root", str(n1.root), "agents").output
    typo = cli("--root", str(n1.root), "send", "--from", "Ann", "--to", "Bobb", "x", ok=False)
    assert typo.exit_code != 0 and "did you mean Bob" in typo.output
    status = cli("--root", str(n1.root), "status", ok=False)
    assert f"federation node n1 of team {team}" in status.output and "server     not asked from here" in status.output
    run = cli("--root", str(n1.root), "run", "--once", ok=False)
    assert run.exit_code == 1 and error_line(run).startswith(f"[federation] of team {team}: no federation url here")
    exchange(n1, n2, rounds=3)       # the daemon, with its URL
    assert [e["body"] for e in n2.held("Bob")] == ["from a shell without the password"]


@needs_server
def test_a_chosen_id_and_a_request_id_for_a_remote_recipient(redis_server, team, nodes, cli, clock):
    from relay.ids import IdGenerator
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    chosen = IdGenerator().new(clock.now - 60)
    n1.drop("Ann", "a", f"TO: Bob\nID: {chosen}\nREQUEST-ID: r-1\n\nfirst")
    exchange(n1, n2)
    n1.drop("Ann", "b", "TO: Bob\nREQUEST-ID: r-1\n\nthe same request again")
    exchange(n1, n2)
    [env] = n2.held("Bob")
    assert (env["id"], env["body"]) == (chosen, "first")
    rows = list(n1.relay.history.audit())
    repeat = next(r for r in rows if r["id"] != chosen)
    assert n1.outbound(repeat["id"]) == {} and n1.outbound(chosen)["n2"]["status"] == "acknowledged"
    for node in (n1, n2):
        assert orjson.loads(cli("--root", str(node.root), "show", chosen, "--json").output)["id"] == chosen
    assert client(redis_server.url).xlen(n1.stream("n2")) == 0


@needs_server
def test_a_message_queued_for_another_node_keeps_its_id_when_its_chosen_id_frees_up(redis_server, team, nodes, clock):
    """A message's id is one for all its recipients. Ann chose an id that Cy's inbox held for
    another message: the message kept relay's id, was queued under it for Bob on n2, and Cy's
    delivery failed for a moment. Cy then read and deleted that other message; the retry still
    keeps the id it was queued under, so Bob and Cy hold it under the same id."""
    import errno

    from conftest import failing_create
    from relay.ids import IdGenerator
    n1 = nodes(redis_server.url, team, "n1", ["Ann", "Cy"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    chosen = IdGenerator().new(clock.now - 60)
    other = n1.state / "inbox" / "Cy" / "new" / f"{chosen}.json"
    other.write_bytes(orjson.dumps({"id": chosen, "from": "Dee", "body": "another message", "sha256": "b" * 64}))
    switch = failing_create(n1.relay, OSError(errno.ENOSPC, "No space left on device"),
                            when=lambda rel: rel.startswith("inbox/Cy/"))
    n1.drop("Ann", "a", f"TO: Bob, Cy\nID: {chosen}\n\nhello")
    n1.send()
    [row] = n1.relay.history.audit()
    assert row["id"] != chosen and row["status"] == "pending" and n1.outbound(row["id"])["n2"]
    other.unlink()                              # Cy read it and deleted it
    switch["on"] = False
    clock.advance(3600)
    exchange(n1, n2)
    assert [e["id"] for e in n1.held("Cy") if e["body"] == "hello"] == [row["id"]]
    assert [e["id"] for e in n2.held("Bob")] == [row["id"]]
    assert n1.relay.history.get(row["id"])["status"] == "archived" and n1.relay.history.get(chosen) is None


# -- the directory -----------------------------------------------------------------------------

@needs_server
def test_a_name_on_two_nodes_stays_local_on_each_and_goes_to_the_node_that_claimed_it_first(
        redis_server, team, nodes, cli):
    n1 = nodes(redis_server.url, team, "n1", ["Ann", "Bob"])
    n3 = nodes(redis_server.url, team, "n3", ["Dee"])
    assert n1.link.heartbeat() and n3.link.heartbeat()      # n3 knows Bob on n1 before anyone else lists him
    n2 = nodes(redis_server.url, team, "n2", ["Bob", "Cy"])
    assert n2.link.heartbeat() and n1.link.heartbeat() and n3.link.heartbeat()
    # n1 claimed Bob before it announced him (claims.py): the conflict is n2's, whose Bob is local
    # only; n2's list is not taken for a name n1 claimed.
    assert n1.link.conflicts == [] and n2.link.conflicts == [("Bob", "n1")]
    assert n3.link.conflicts == [] and n3.relay.history.remote.agents()["Bob"][0] == "n1"
    status = cli("--root", str(n2.root), "status", ok=False).output
    assert "CONFLICT" in status and "agent Bob is also listed by node n1" in status, status
    assert orjson.loads(cli("--root", str(n2.root), "status", "--json", ok=False).output)["federation"]["conflicts"] == [
        ["Bob", "n1"]]
    # A node that hears of Bob only now, from two live nodes, routes him to the one that claimed him.
    n4 = nodes(redis_server.url, team, "n4", ["Eli"])
    assert n4.link.heartbeat()
    assert n4.link.conflicts == [] and n4.relay.history.remote.agents()["Bob"][0] == "n1"
    # What a node's key holds is input: odd names, lists and times planted in keys (each by the
    # node whose key it is) are left out, and no node's claim takes a name another one holds.
    r = client(redis_server.url)
    r.hset(n1.key(), mapping={"agents": orjson.dumps(["Ann", "Bob", "../evil", "System", 7]), "v": "planted"})
    keys = n1.keys
    r.hset(keys.node("n9"), mapping={"agents": orjson.dumps(["Zed"]), "v": "1", "seen": "not a time"})
    r.hset(keys.node("n8"), mapping={"agents": b"{not json", "v": "1", "seen": "1"})
    r.hset(keys.node("n7"), mapping={"agents": orjson.dumps(["Ann", "Gus"]), "v": "1", "seen": "9e15",
                                     "timeout": "12"})     # a forged last seen: n7 looks alive, nothing more
    r.hset(keys.prefix + "node:bad node", mapping={"agents": orjson.dumps(["Eve"]), "v": "1", "seen": "1"})
    assert n2.link.heartbeat()
    remote = n2.relay.history.remote.agents()
    assert {a: n for a, (n, _) in remote.items()} == {"Ann": "n1", "Dee": "n3", "Eli": "n4", "Zed": "n9", "Gus": "n7"}
    assert remote["Zed"][1] is None and remote["Ann"][1] > 0
    assert n2.link.conflicts == [("Bob", "n1")]
    r.delete(keys.node("n9"), keys.node("n8"), keys.node("n7"), keys.prefix + "node:bad node")
    assert n2.link.heartbeat() and n2.relay.history.remote.agents()["Zed"][0] == "n9"     # lost keys keep names
    r.hset(keys.node("n9"), mapping=RETIRED)             # an operator retires n9 (relay federation retire)
    r.hset(keys.node("n7"), mapping=RETIRED)
    assert n2.link.heartbeat() and "Zed" not in n2.relay.history.remote.agents()
    # The node that had Bob first keeps him for the others that knew it; each Bob stays local.
    assert n1.link.heartbeat()
    exchange(n1, n2, n3, rounds=1)
    n3.drop("Dee", "m", "TO: Bob\n\nfor the first Bob")
    n2.drop("Cy", "m", "TO: Bob\n\nfor the local Bob")
    n1.drop("Ann", "m", "TO: Bob\n\nfor n1's own Bob")
    exchange(n1, n2, n3)
    assert sorted(e["body"] for e in n1.held("Bob")) == ["for n1's own Bob", "for the first Bob"]
    assert [e["body"] for e in n2.held("Bob")] == ["for the local Bob"]


@needs_server
def test_a_node_is_alive_for_its_own_twelve_heartbeats_and_being_gone_gives_no_name_away(redis_server, team, nodes):
    n1 = nodes(redis_server.url, team, "n1", ["Bob"], heartbeat="10s")     # 120 s to its mind
    n2 = nodes(redis_server.url, team, "n2", ["Bob", "Cy"])
    assert n1.link.heartbeat() and n2.link.heartbeat()
    n3 = nodes(redis_server.url, team, "n3", ["Dee"])                      # heartbeat 1s: 12 s to its mind
    r = client(redis_server.url)
    seconds, micros = r.time()
    now = seconds + micros / 1e6
    assert float(r.hget(n1.key(), "timeout")) == 120.0
    r.hset(n1.key(), "seen", str(now - 15))             # n1's last beat, 15 s ago: alive, by its own timeout
    assert n3.link.heartbeat()
    assert n3.link.alive == {"n1": True, "n2": True}
    assert n3.link.conflicts == [] and n3.relay.history.remote.agents()["Bob"][0] == "n1"   # n1 claimed Bob first
    r.hset(n1.key(), "seen", str(now - 121))            # past n1's 12 beats: gone
    assert n3.link.heartbeat()
    assert n3.link.alive == {"n1": False, "n2": True}
    # Gone is not retired: its names are not given to the other node that lists them (its last
    # seen is its own to write, and n2's as much).
    assert n3.link.conflicts == [] and n3.relay.history.remote.agents()["Bob"][0] == "n1"


@needs_server
def test_a_directory_the_server_lost_keeps_routing_to_the_nodes_it_knew_until_they_announce_again(
        redis_server, team, nodes):
    """A server restarted without its data (AOF off, a new empty server) has no directory until
    every node has announced itself again: a node whose heartbeat came first failed every message
    to the others' agents as unknown recipients (and its local recipients with them)."""
    n1 = nodes(redis_server.url, team, "n1", ["Ann", "Al"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob", "Cy"])
    exchange(n1, n2, rounds=1)
    r = client(redis_server.url)
    for key in r.keys(f"relay:{{{team}}}:*"):
        r.delete(key)                               # the server's data gone
    assert n1.link.heartbeat()                      # n1 announces itself first
    assert {a: n for a, (n, _) in n1.relay.history.remote.agents().items()} == {"Bob": "n2", "Cy": "n2"}
    n1.drop("Ann", "m", "TO: Al, Bob\n\nafter the server lost its data")
    counts, _ = n1.send()
    assert counts.failed == 0 and [e["body"] for e in n1.held("Al")] == ["after the server lost its data"]
    n2.link.heartbeat()
    n2.receive()
    n1.link.publish()
    assert [e["body"] for e in n2.held("Bob")] == ["after the server lost its data"]
    mid = n2.held("Bob")[0]["id"]
    assert n1.outbound(mid)["n2"]["status"] == "acknowledged"
    # A name its live node gave up (in its own key) is forgotten at once.
    r.hset(n2.key(), mapping={"agents": orjson.dumps(["Cy"]), "v": "without Bob"})
    assert n1.link.heartbeat()
    assert "Bob" not in n1.relay.history.remote.agents() and "Cy" in n1.relay.history.remote.agents()


@needs_server
def test_a_node_name_used_by_two_relays_is_an_error_and_the_second_reads_nothing(redis_server, team, nodes, cli):
    n1 = nodes(redis_server.url, team, "n1", ["Ann"])
    n2 = nodes(redis_server.url, team, "n2", ["Bob"])
    exchange(n1, n2, rounds=1)
    twin = Node(n1.root.parent / "copy", redis_server.url, team, "n1", ["Al"], n1.clock)    # a copied project
    try:
        assert twin.link.heartbeat() is False
        assert orjson.loads(client(redis_server.url).hget(n1.key(), "agents")) == ["Ann"]   # n1's entry as it was
        n2.drop("Bob", "m", "TO: Ann\n\nfor the first n1")
        n2.send()
        assert twin.receive() == 0 and n1.receive() == 1
        assert [e["body"] for e in n1.held("Ann")] == ["for the first n1"]
        status = orjson.loads(cli("--root", str(twin.root), "status", "--json", ok=False).output)["federation"]["link"]
        assert status["connected"] is False and "node name n1 is in use by another relay" in status["error"]
        assert str(n1.root) in status["error"]
    finally:
        twin.close()


# -- one ACL user per node ---------------------------------------------------------------------

@needs_server
def test_one_acl_user_per_node_as_relay_federation_acl_prints_it(redis_server, team, nodes, cli):
    """Each node's user (relay federation acl) is enough to work, and with one node's
    credentials nothing can be sent as another node, and no other node's names or traffic can
    be taken, moved, removed or read. A node of another team with that user is refused by the
    server and says so, without a traceback."""
    import redis
    admin = client(redis_server.url)
    urls = {}
    for node in ("n1", "n2", "n3"):
        result = cli("federation", "acl", node, "--team", team, "--password", f"pw-{node}", "--no-save")
        line, register = result.stdout.strip().splitlines()
        assert line.startswith("ACL SETUSER") and "pw-" in line and register == f"SADD relay:{{{team}}}:nodes {node}"
        for each_line in (line, register):
            admin.execute_command(*shlex.split(each_line))
        urls[node] = f"redis://relay-{team}-{node}:pw-{node}@127.0.0.1:{redis_server.port}/0"
    n1 = nodes(urls["n1"], team, "n1", ["Ann"])
    n2 = nodes(urls["n2"], team, "n2", ["Bob"])
    n3 = nodes(urls["n3"], team, "n3", ["Cy"])
    exchange(n1, n2, n3, rounds=1)
    n1.drop("Ann", "m", "TO: Bob, Cy\n\nwith each node's user")
    n3.drop("Cy", "m", "TO: Bob\n\nfrom n3")
    exchange(n1, n2, n3)
    assert sorted(e["body"] for e in n2.held("Bob")) == ["from n3", "with each node's user"]
    assert [e["body"] for e in n3.held("Cy")] == ["with each node's user"]
    assert admin.xlen(n1.stream("n2")) == 0 and admin.xlen(n1.stream("n3")) == 0
    assert n1.link.check() == 0                                     # INFO, XLEN: allowed
    n3.drop("Cy", "later", "TO: Bob\n\nstill in n3's stream")
    n3.send()
    # What n1's credentials cannot do.
    as_n1 = client(urls["n1"])
    keys = n1.keys
    forbidden = [lambda: as_n1.hset(keys.node("n2"), "agents", orjson.dumps(["Bob", "Ann"])),
                 lambda: as_n1.delete(keys.node("n2")),
                 lambda: as_n1.xadd(keys.messages("n3", "n2"), {"v": "2"}),            # speak as n3
                 lambda: as_n1.xadd(keys.acks("n2", "n3"), {"acks": b"[]"}),            # acknowledge as n2
                 lambda: as_n1.xdel(keys.messages("n3", "n2"), "0-1"),
                 lambda: as_n1.delete(keys.messages("n3", "n2")),
                 lambda: as_n1.xtrim(keys.messages("n3", "n2"), maxlen=0),
                 lambda: as_n1.xread({keys.messages("n3", "n2"): "0-0"}),              # not addressed to n1
                 lambda: as_n1.xread({keys.acks("n2", "n3"): "0-0"}),
                 lambda: as_n1.flushall(), lambda: as_n1.keys("*"), lambda: as_n1.config_get("*")]
    for attempt in forbidden:
        with pytest.raises(redis.exceptions.NoPermissionError):
            attempt()
    assert admin.xlen(keys.messages("n3", "n2")) == 1 and orjson.loads(admin.hget(keys.node("n2"), "agents")) == ["Bob"]
    # ... and what it can: its own entry and streams, the others' entries, what is sent to it.
    assert as_n1.hget(keys.node("n2"), "agents") and as_n1.xread({keys.messages("n2", "n1"): "0-0"}) is not None
    n2.receive()
    assert "still in n3's stream" in [e["body"] for e in n2.held("Bob")]


@needs_server
def test_a_node_whose_user_the_server_refuses_says_so_in_its_status(redis_server, team, nodes, cli):
    admin = client(redis_server.url)
    for line in cli("federation", "acl", "n1", "--team", team, "--password", "pw", "--no-save").stdout.splitlines():
        admin.execute_command(*shlex.split(line))
    url = f"redis://relay-{team}-n1:pw@127.0.0.1:{redis_server.port}/0"
    other = nodes(url, f"x{team}", "n1", ["Dan"])          # another team's node with n1's user
    assert other.link.heartbeat() is False and other.receive() == 0
    result = cli("--root", str(other.root), "status", "--json", ok=False)
    assert "Traceback" not in result.output
    status = orjson.loads(result.output)["federation"]
    assert status["link"]["connected"] is False and "no permissions" in status["link"]["error"]


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
    from relay.ledger.history import History
    from relay.ledger.ledger import Ledger
    path = root / ".relay" / "ledger.sqlite"
    if not path.exists():
        return False
    try:
        with History(Ledger(path, readonly=True)) as h:
            return name in h.remote.agents()
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


def test_a_url_s_parameters_are_checked_by_name_and_no_password_shows(tmp_path):
    from relay.config.federation import redact
    state = write_config(tmp_path, "redis://h/0", "acme", "n1", ["Ann"])
    for url, why in [("redis://h/0?foo=1", "unknown parameter 'foo'"),
                     ("redis://:p%40ss@h/0?ssl_password=s3cret", "ssl_password needs TLS"),
                     ("redis://u:p/ss@h/0", "the password holds a character that ends it")]:
        (state / "relay.toml").write_text(f'[federation]\nurl = "{url}"\nteam = "acme"\n')
        with pytest.raises(ConfigError, match=why) as e:
            config_mod.load(tmp_path, ".relay", env={})
        assert "s3cret" not in str(e.value) and "p/ss" not in str(e.value)
    assert redact("redis+sentinel://h:26379/m?sentinel_password=SeCr#et99") == \
        "redis+sentinel://h:26379/m?sentinel_password=***"
    assert "p#1/a?b" not in redact("redis://u:p#1/a?b@c%d@h:6379/0")
    # the user part ends at the last @: a password holding an unencoded @ is hidden whole
    assert redact("redis://u:p@ss@h:6379/0") == "redis://u:***@h:6379/0"


def test_the_health_check_counts_the_federation_a_link_down_and_an_old_unacknowledged_message():
    """`relay status` exits 5 when the running daemon's link is down, its directory cannot be
    read or a name is claimed twice, and 4 when a message for another node waits for its
    acknowledgement longer than --max-pending-age; a stopped daemon's last link state is no news."""
    def doc(connected=True, directory=None, conflicts=(), oldest=None):
        return {"link": {"connected": connected, "error": None if connected else "ConnectionError: refused"},
                "directory": {"error": directory}, "conflicts": list(conflicts),
                "outbound": {"by_node": {"n2": {"waiting": 3, "oldest_at": oldest}} if oldest else {}}}
    assert health.federation(doc(), True, 1000.0, 600) == (0, [])
    code, said = health.federation(doc(connected=False), True, 1000.0, 600)
    assert code == health.EXIT_FEDERATION and "link to the team's server is down (ConnectionError" in said[0]
    assert health.federation(doc(directory="NoPermissionError: x"), True, 1000.0, 600)[0] == health.EXIT_FEDERATION
    assert health.federation(doc(conflicts=[("Ann", "n3")]), True, 1000.0, 600)[0] == health.EXIT_FEDERATION
    assert health.federation(doc(connected=False), False, 1000.0, 600) == (0, [])
    code, said = health.federation(doc(oldest=100.0), True, 1000.0, 600)
    assert code == health.EXIT_STALE and said == ["federation: 3 message(s) for node n2 not acknowledged, the oldest "
                                                  "for 900s, more than --max-pending-age 10m"]
    assert health.federation(doc(oldest=100.0), True, 1000.0, 0) == (0, [])


class Lines:
    """A logger of federation's conditions whose error and info lines are kept, formatted."""
    def __init__(self):
        self.lines = []

    def error(self, fmt, *args):
        self.lines.append(fmt % args)

    info = error


def test_an_error_whose_reason_alternates_is_said_once_per_reason_then_counted():
    """A TLS handshake refused one way, then another: each reason once while the condition
    lasts (at most SAID of them), then one count a minute; said again after it ended."""
    from relay.federation.conditions import EVERY, SAID, Condition
    log, now = Lines(), [0.0]
    lines = log.lines
    down = Condition(log, "federation: the server cannot be used", clock=lambda: now[0])
    for i in range(1000):
        now[0] = i * 0.5
        down.report("TLSV13_ALERT_CERTIFICATE_REQUIRED" if i % 2 else "EOF occurred in violation of protocol")
    assert lines[:2] == ["federation: the server cannot be used: EOF occurred in violation of protocol",
                         "federation: the server cannot be used: TLSV13_ALERT_CERTIFICATE_REQUIRED"]
    assert len(lines) == 2 + int(499.5 // EVERY) and all("again" in ln for ln in lines[2:])
    for i in range(3 * SAID):
        down.report(f"reason {i}")
    assert len([ln for ln in lines if "reason" in ln and "again" not in ln]) == SAID - 2
    down.clear()
    assert lines[-1] == "federation: the server cannot be used: no longer (it was: reason 23)"
    down.report("EOF occurred in violation of protocol")
    assert lines[-1] == "federation: the server cannot be used: EOF occurred in violation of protocol"


def test_a_password_for_the_acl_line_is_refused_with_a_control_or_format_character(cli):
    """DEL, a C1 control or a bidi override would print as an escape redis-cli stores literally
    (the node could never log in) or hide what the line says: refused, in one line."""
    for bad in ("a\x7fb", "a\x85b", "pass\u202eword", "two words"):
        result = cli("federation", "acl", "n1", "--team", "acme", "--password", bad, ok=False)
        assert result.exit_code == 2 and "printable characters without spaces" in result.output
    assert cli("federation", "acl", "n1", "--team", "acme", "--password", "é'\"\\$x").exit_code == 0


@pytest.mark.parametrize("node, team", [("n*", "acme"), ("n1:x", "acme"), ("n1", "ac*me"), ("n1", "acme:x")])
def test_the_acl_line_is_refused_for_a_node_or_team_name_a_key_pattern_would_read_wider(cli, node, team):
    """relay federation acl writes the node's and the team's names into key patterns: a `*` or
    `:` there would reach other nodes' keys, so such a name is refused, naming the argument."""
    result = cli("federation", "acl", node, "--team", team, "--password", "pw", "--no-save", ok=False)
    assert result.exit_code == 2 and "is not a valid name" in result.output
    assert ("NODE" if node != "n1" else "--team") in result.output and "~relay" not in result.output


def test_a_redis_error_is_one_line_without_the_clients_own_description():
    """redis-py puts its client's repr (pools, connections, settings) in some errors: the log
    and `relay status` get the error's own words."""
    from redis.sentinel import MasterNotFoundError
    from relay.federation.client import reason
    error = MasterNotFoundError("No master found for 'mymaster' : <redis.client.Redis(<redis.connection."
                                "ConnectionPool(<redis.connection.Connection(db=0,username=<REDACTED>,...")
    assert reason(error) == "MasterNotFoundError: No master found for 'mymaster'"
    assert reason(ConnectionError("Error 111\nconnecting")) == "ConnectionError: Error 111 connecting"


def test_the_acl_line_takes_the_team_of_the_federation_section_and_without_one_asks_for_team(cli):
    for where in ("no project", "no section"):
        if where == "no section":
            cli("init", "--agent", "Ann")
        result = cli("federation", "acl", "n1", "--password", "pw", "--no-save", ok=False)
        assert result.exit_code == 2 and "relay: no [federation] section here: give --team" in result.output
        assert "ACL SETUSER" not in result.output
    (cli.state / "relay.toml").write_text('[federation]\nurl = "rediss://h"\nteam = "acme"\n')
    line = cli("federation", "acl", "n1", "--password", "pw", "--no-save").stdout
    assert line.startswith("ACL SETUSER relay-acme-n1 reset ") and "~relay:{acme}:node:n1 " in line
    line = cli("federation", "acl", "n1", "--team", "other", "--password", "pw", "--no-save").stdout
    assert line.startswith("ACL SETUSER relay-other-n1 reset ") and "{acme}" not in line


def _fed(value, root="/p"):
    from relay.config import federation as federation_section
    return federation_section.parse(value, root, config_mod.parse_duration)


@pytest.mark.parametrize("value, why", [
    ("x", "must be a table ([federation] with url, team and node)"),
    ({"team": "a", "heartbeat": "0s"}, "heartbeat must be more than 0s"),
    ({"team": "a", "ack_timeout": "0ms"}, "ack_timeout must be more than 0s"),
    ({"team": "a", "max_agents_per_node": 0}, "max_agents_per_node 0 must be a whole number above 0"),
    ({"team": "a", "max_agents_per_node": -3}, "max_agents_per_node -3 must be a whole number above 0"),
    ({"team": "a", "max_agents_per_node": "many"}, "max_agents_per_node 'many' must be a whole number above 0"),
    ({"team": "a", "max_agents_per_node": None}, "max_agents_per_node None must be a whole number above 0"),
    ({"team": 5}, "team 5 is not a valid name"), ({"team": "a", "node": 5}, "node 5 is not a valid name"),
    ({"team": "a", "url": 5}, "url 5 is not a Redis URL (redis://host:6379 or rediss://user:password@host)"),
    ({"team": "a", "url": "h:6379"}, "url 'h:6379' must be redis://host[:port][/db]"),
    ({"team": "a", "url": "redis://[::1"}, "url 'redis://[::1' is not a Redis URL"),
    ({"team": "a", "url": "redis://h:65536"}, "its port is not a number from 1 to 65535"),
    ({"team": "a", "url": "redis://h:0"}, "its port is not a number from 1 to 65535"),
    ({"team": "a", "url": "rediss+cluster://h:0"}, "its port is not a number from 1 to 65535"),
    ({"team": "a", "url": "redis://h/0?db"}, "url 'redis://h/0?db': its query is not name=value pairs"),
    ({"team": "a", "url": "redis:///0"}, "must be redis://host[:port][/db]"),
    ({"team": "a", "url": "redis://h/0?ssl_ca_certs=/x"}, "ssl_ca_certs needs TLS: rediss:// (or rediss+cluster://)"),
])
def test_each_bad_federation_value_is_refused_saying_why(value, why):
    with pytest.raises(ValueError) as e:
        _fed(value)
    assert why in str(e.value)


def test_a_federation_section_takes_its_defaults_and_each_url_scheme():
    fed = _fed({"team": "acme"})
    assert (fed.url, fed.heartbeat, fed.ack_timeout, fed.max_agents_per_node) == (None, 5.0, 30.0, 4096)
    assert _fed({"team": "acme", "url": "", "node": ""}).url is None
    assert _fed({"team": "a", "max_agents_per_node": "1"}).max_agents_per_node == 1
    assert _fed({"team": "a", "heartbeat": "1ms", "ack_timeout": "2m"}).ack_timeout == 120
    for url in ("redis://h", "redis://h:1/0", "redis://h:65535", "rediss://u:p@h/0?ssl_ca_certs=/x",
                "redis+sentinel://h:26379,g:26379/svc?ssl_cert_reqs=required", "redis+cluster://h:7000",
                "rediss+cluster://h:7000?ssl_check_hostname=true", "redis://h/0?socket_timeout=5&db=1"):
        assert _fed({"team": "a", "url": url}).url == url


@pytest.mark.parametrize("url, shown", [
    (None, "?"), (5, "?"), ("h:6379", "h:6379"), ("redis://h:6379", "redis://h:6379"),
    ("redis://u@h", "redis://u@h"), ("redis://u:pw@h", "redis://u:***@h"), ("redis://:pw@h/0", "redis://:***@h/0"),
    ("redis://h/0?PASSWORD=x&db=1", "redis://h/0?PASSWORD=***&db=1"),
])
def test_a_url_is_shown_with_any_password_hidden_and_a_user_kept(url, shown):
    from relay.config.federation import redact
    assert redact(url) == shown


@pytest.mark.parametrize("host, node", [("build01.example.com", "build01"), ("--x--", "x"), ("ünï", "n"),
                                        ("...", "node"), ("a" * 60, "a" * 48), ("", None)])
def test_a_default_node_is_the_hosts_first_label_cleaned_and_the_roots_hash(host, node):
    import hashlib
    import re
    import socket

    from relay.config.federation import default_node
    tail = hashlib.sha256(b"/p").hexdigest()[:6]
    if node is None:
        node = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname().split(".")[0]).strip("-._")[:48] or "node"
    assert default_node("/p", host) == f"{node}-{tail}"


@pytest.mark.parametrize("word", ["plain-Pass_1", "it's", 'say "hi"', "back\\slash", "a'b\"c\\d", "ünï"])
def test_a_word_of_the_acl_line_is_read_back_whole_by_a_shell_and_quoted_only_when_it_must_be(word):
    import shlex

    from relay.federation.keys import quoted
    shown = quoted(word)
    assert shlex.split(f"ACL SETUSER n1 >{shown}") == ["ACL", "SETUSER", "n1", f">{word}"]
    assert (shown == word) is not any(c in word for c in "'\"\\")


def test_the_acl_line_takes_a_password_given_or_makes_a_random_one_never_an_empty_one_and_saves_unless_told(cli):
    import re
    r = cli("federation", "acl", "n1", "--team", "acme", "--password", "p@ss/w")
    lines = r.stdout.splitlines()
    assert " >p@ss/w " in lines[0] and lines[1:] == ["SADD relay:{acme}:nodes n1", "ACL SAVE"]
    assert "RELAY_FEDERATION_URL='redis://relay-acme-n1:p%40ss%2Fw@<redis-host>:6379/0'" in r.stderr
    made = []
    for _ in range(2):
        r = cli("federation", "acl", "n1", "--team", "acme", "--no-save")
        assert r.stdout.splitlines()[1:] == ["SADD relay:{acme}:nodes n1"]      # no ACL SAVE
        [secret] = re.findall(r" >([A-Za-z0-9_-]+) ", r.stdout)
        assert len(secret) == 32 and f":{secret}@<redis-host>" in r.stderr
        made.append(secret)
    assert made[0] != made[1]
    r = cli("federation", "acl", "n1", "--team", "acme", "--password", "", ok=False)
    assert r.exit_code == 2 and r.stdout == "" and "printable characters without spaces" in r.stderr


def test_a_claim_names_an_agent_and_says_why_a_name_is_refused(cli):
    for verb in (("claim-grant",), ("claim-free",)):
        for name, why in (("../x", "'../x' is not an agent name"),
                          ("system", "'system' is not an agent name (System is relay's own)")):
            args = (*verb, name, *(("n1",) if verb == ("claim-grant",) else ()), "--team", "acme")
            r = cli("federation", *args, ok=False)
            assert r.exit_code == 2 and r.stderr.splitlines()[-1] == f"relay: Invalid value for NAME: {why}", args


def test_a_repeated_error_is_counted_aloud_exactly_a_minute_after_it_was_said_and_its_end_said_as_given():
    from relay.federation.conditions import Condition
    log, now = Lines(), [0.0]
    lines = log.lines
    down = Condition(log, "federation: down", over="federation: back", clock=lambda: now[0])
    for t in (0.0, 10.0, 59.999, 60.0, 119.999, 120.0):
        now[0] = t
        down.report("refused")
    assert lines == ["federation: down: refused",
                     "federation: down: refused (again 3 times in the last 60s)",
                     "federation: down: refused (again 2 times in the last 60s)"]
    down.clear()
    down.clear()
    assert lines[3:] == ["federation: back (it was: refused)"]
