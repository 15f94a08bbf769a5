"""The servers people run: TLS with a CA of their own and client certificates, and Sentinel
following the master through a failover. Real redis-server, redis-sentinel and openssl (tests
skip, saying why, when one is missing)."""
import shutil
import subprocess
import time
import urllib.parse

import pytest

from fednodes import MISSING, REDIS_SERVER, RedisServer, exchange, fedkit, nodes, team  # noqa: F401 - fixtures
from relay import config as config_mod
from relay.errors import FederationError
from relay.federation.client import connect
from relay.federation.keys import acl

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=MISSING)
OPENSSL = shutil.which("openssl")






def certificates(d):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, signed by it."""
    def run(*args):
        subprocess.run([OPENSSL, *args], cwd=d, check=True, capture_output=True)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=relay test CA")
    for name in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "2", "-copy_extensions", "copy")
    return d


@pytest.mark.skipif(OPENSSL is None, reason="openssl is not installed (Debian's package; .ci/run installs it)")
def test_tls_with_a_ca_of_its_own_and_client_certificates(tmp_path, team, nodes, cli, monkeypatch):
    certs = certificates(tmp_path)
    tls = fedkit.free_port()
    server = RedisServer(tmp_path / "redis", extra=[
        "--tls-port", str(tls), "--tls-cert-file", str(certs / "server.crt"), "--tls-key-file",
        str(certs / "server.key"), "--tls-ca-cert-file", str(certs / "ca.crt"), "--tls-auth-clients", "yes"]).start()
    try:
        query = (f"ssl_ca_certs={certs / 'ca.crt'}&ssl_certfile={certs / 'client.crt'}"
                 f"&ssl_keyfile={certs / 'client.key'}")
        url = f"rediss://127.0.0.1:{tls}/0?{query}"
        n1 = nodes(url, team, "n1", ["Ann"])
        n2 = nodes(url, team, "n2", ["Bob"])
        exchange(n1, n2, rounds=1)
        n1.drop("Ann", "m", "TO: Bob\n\nover TLS")
        exchange(n1, n2)
        assert [e["body"] for e in n2.held("Bob")] == ["over TLS"]
        # Without the CA the server's certificate is not trusted: the link is down, and says why.
        n3 = nodes(f"rediss://127.0.0.1:{tls}/0?ssl_certfile={certs / 'client.crt'}&ssl_keyfile={certs / 'client.key'}",
                   team, "n3", ["Cy"])
        assert n3.link.heartbeat() is False
        assert "CERTIFICATE_VERIFY_FAILED" in (n3.link.down.current or "")
        # Verification switched off is said loudly, by every verb and the daemon's log.
        cfg = config_mod.load(n3.root, ".relay", env={"RELAY_FEDERATION_URL": url + "&ssl_cert_reqs=none"})
        assert any("NOT verified" in w for w in cfg.warnings)
        monkeypatch.setenv("RELAY_FEDERATION_URL", url + "&ssl_cert_reqs=none")
        assert "NOT verified" in cli("--root", str(n3.root), "config").output
    finally:
        server.stop()


@pytest.mark.skipif(shutil.which("redis-sentinel") is None, reason="redis-sentinel is not installed (Debian's "
                    "package; .ci/run installs it)")
@pytest.mark.timeout_s(90)
def test_sentinel_follows_the_master_through_a_failover_and_loses_nothing(tmp_path, team, nodes, clock):
    master = RedisServer(tmp_path / "master").start()
    replica = RedisServer(tmp_path / "replica", extra=["--replicaof", "127.0.0.1", str(master_port := master.port)]
                          ).start()
    sentinel = fedkit.Sentinel(tmp_path / "sentinel", master_port).start()
    try:
        n1 = nodes(sentinel.url, team, "n1", ["Ann"])
        n2 = nodes(sentinel.url, team, "n2", ["Bob"])
        exchange(n1, n2, rounds=1)
        n1.link.check()                                     # the master's run id, known
        n1.drop("Ann", "before", "TO: Bob\n\nbefore the failover")
        exchange(n1, n2)
        for i in range(5):
            n1.drop("Ann", f"m{i}", f"TO: Bob\n\npublished, not yet read {i}")
        n1.send()
        import redis
        s = redis.Redis(port=sentinel.port)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:                  # the replica has caught up: a failover is allowed
            try:
                s.execute_command("SENTINEL", "FAILOVER", "mymaster")
                break
            except redis.ResponseError:
                time.sleep(0.2)
        while time.monotonic() < deadline:
            host, port = s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster")
            if int(port) == replica.port:
                break
            time.sleep(0.1)
        assert int(port) == replica.port, "no failover"
        while time.monotonic() < deadline:                  # the new master takes writes
            try:
                if redis.Redis(port=replica.port).info("replication")["role"] == "master":
                    break
            except redis.RedisError:
                pass
            time.sleep(0.1)
        n1.drop("Ann", "after", "TO: Bob\n\nafter the failover")
        for _ in range(50):
            try:
                exchange(n1, n2, rounds=1)
                n1.link.check()
            except Exception:  # noqa: BLE001 - a command cut by the switch: the next round goes on
                pass
            if len(n2.held("Bob")) == 7:
                break
            time.sleep(0.1)
        got = sorted(e["body"] for e in n2.held("Bob"))
        assert got == sorted(["before the failover", "after the failover"]
                             + [f"published, not yet read {i}" for i in range(5)])
    finally:
        sentinel.stop()
        replica.stop()
        master.stop()


def test_a_sentinel_urls_user_and_password_are_read_percent_decoded(tmp_path):
    """As in a redis:// URL: `%40` in the user or password is an `@`, `%3A` a `:` (the client is
    made without a connection: no server is asked)."""
    cfg = config_mod.load(tmp_path, ".relay", env={
        "RELAY_FEDERATION_URL": "redis+sentinel://us%40er:p%40ss%3Aw@127.0.0.1:1/mymaster",
        "RELAY_FEDERATION_TEAM": "t", "RELAY_FEDERATION_NODE": "n1"})
    kwargs = connect(cfg.federation).connection_pool.connection_kwargs
    assert (kwargs["username"], kwargs["password"]) == ("us@er", "p@ss:w")


@pytest.mark.skipif(shutil.which("redis-cli") is None, reason="redis-cli is not installed (Debian's redis-tools; "
                    ".ci/run installs it)")
@pytest.mark.timeout_s(90)
def test_a_cluster_of_three_masters_with_urls_at_nodes_that_do_not_hold_the_teams_slot(tmp_path, team, nodes):
    """Each node with its own ACL user, made on every node of the cluster by piping the line
    `relay federation acl` prints into redis-cli (a password with quotes, a backslash and a
    dollar read back as written); a user without the slots and command table gets one line
    saying what it lacks, not a traceback. A node started before the cluster is up waits for it,
    as for any server away."""
    cluster = fedkit.Cluster(tmp_path / "cluster")
    early = nodes(f"redis+cluster://127.0.0.1:{cluster.servers[0].port}/0", team, "n0", ["Cy"])
    assert not early.link.heartbeat() and early.link.connected is False     # not up yet: waited for
    cluster.start()
    try:
        assert early.link.heartbeat() and early.link.connected
        from redis.cluster import RedisCluster
        rc = RedisCluster(host="127.0.0.1", port=cluster.servers[0].port)
        holder = rc.get_node_from_key(f"relay:{{{team}}}:node:n1").port
        others = [s.port for s in cluster.servers if s.port != holder]
        rc.close()
        urls = {}
        for node in ("n1", "n2"):
            password = f"pw'{node}\"x\\$y"
            line = acl(team, node, password)
            for server in cluster.servers:
                out = subprocess.run(["redis-cli", "-p", str(server.port)], input=line + "\n", capture_output=True,
                                     text=True, check=True).stdout
                assert out.strip() == "OK", out
            urls[node] = f"relay-{team}-{node}:{urllib.parse.quote(password, safe='')}@127.0.0.1"
            register(cluster, team, node)
        for server in cluster.servers:
            subprocess.run(["redis-cli", "-p", str(server.port), "ACL", "SETUSER", "bare", "on", ">pw", "~*",
                            "+@all", "-cluster|slots", "-cluster|shards"], check=True, capture_output=True)
        bare = config_mod.load(tmp_path, ".relay", env={"RELAY_FEDERATION_URL": f"redis+cluster://bare:pw@127.0.0.1:"
                                                        f"{others[0]}/0", "RELAY_FEDERATION_TEAM": team})
        with pytest.raises(FederationError, match=r"needs \+cluster\|slots"):
            connect(bare.federation)
        n1 = nodes(f"redis+cluster://{urls['n1']}:{others[0]}/0", team, "n1", ["Ann"])
        n2 = nodes(f"redis+cluster://{urls['n2']}:{others[1]}/0", team, "n2", ["Bob"])
        exchange(n1, n2, rounds=1)
        for i in range(3):
            n1.drop("Ann", f"m{i}", f"TO: Bob\n\nthrough the cluster {i}")
        n2.drop("Bob", "r", "TO: Ann\n\nand back")
        exchange(n1, n2, rounds=3)
        assert sorted(e["body"] for e in n2.held("Bob")) == [f"through the cluster {i}" for i in range(3)]
        assert [e["body"] for e in n1.held("Ann")] == ["and back"]
        assert n1.link.check() == 0 and n1.link.check() == 0        # the slot's master: one run id, no resend
        counts = n1.link.history.remote.outbound_counts()
        assert counts["acknowledged"] == 3 and counts["published"] == 0
    finally:
        cluster.stop()


def register(cluster, team, node):
    """The registration line `relay federation acl` prints, run on the master of the team's slot."""
    import shlex

    from redis.cluster import RedisCluster
    from relay.federation.keys import registration
    rc = RedisCluster(host="127.0.0.1", port=cluster.servers[0].port)
    try:
        rc.execute_command(*shlex.split(registration(team, node)))
    finally:
        rc.close()


def _cluster_or_skip(directory):
    """A started fedkit.Cluster, or a skip saying why it could not start here."""
    if shutil.which("redis-cli") is None:
        pytest.skip("redis-cli is not installed (Debian's redis-tools; .ci/run installs it): no cluster here")
    cluster = fedkit.Cluster(directory)
    try:
        return cluster.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        cluster.stop()
        pytest.skip(f"a Redis Cluster could not be started here: {e}")


@pytest.mark.timeout_s(90)
def test_a_node_on_its_acl_user_follows_ask_while_the_teams_slot_migrates(tmp_path, team, nodes):
    """The team's slot held half way through a migration (MIGRATING on its master, IMPORTING on
    another, the stream n1 sends n2 and n2's directory entry already moved): each node's client,
    on the ACL user `relay federation acl` prints, follows the ASK redirects (ASKING, then the
    command on the importing node), and a message goes across both ways."""
    cluster = _cluster_or_skip(tmp_path / "cluster")
    try:
        import redis
        from redis.cluster import RedisCluster
        rc = RedisCluster(host="127.0.0.1", port=cluster.servers[0].port)
        slot = rc.keyslot(f"relay:{{{team}}}:node:n1")
        source = rc.get_node_from_key(f"relay:{{{team}}}:node:n1").port
        rc.close()
        target = next(s.port for s in cluster.servers if s.port != source)
        urls = {}
        for node in ("n1", "n2"):
            line = acl(team, node, f"pw-{node}")
            for server in cluster.servers:
                out = subprocess.run(["redis-cli", "-p", str(server.port)], input=line + "\n", capture_output=True,
                                     text=True, check=True).stdout
                assert out.strip() == "OK", out
            urls[node] = f"redis+cluster://relay-{team}-{node}:pw-{node}@127.0.0.1:{source}/0"
            register(cluster, team, node)
        n1 = nodes(urls["n1"], team, "n1", ["Ann"])
        n2 = nodes(urls["n2"], team, "n2", ["Bob"])
        exchange(n1, n2, rounds=1)
        n1.drop("Ann", "before", "TO: Bob\n\nbefore the migration")
        exchange(n1, n2)
        assert [e["body"] for e in n2.held("Bob")] == ["before the migration"]
        src, dst = redis.Redis(port=source, single_connection_client=True), redis.Redis(port=target)
        src_id, dst_id = src.execute_command("CLUSTER", "MYID"), dst.execute_command("CLUSTER", "MYID")
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        moved = [n1.stream("n2"), n2.key()]
        assert src.exists(*moved) == 2
        src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *moved)
        with pytest.raises(redis.exceptions.AskError):
            src.exists(*moved)                              # gone from the master: it answers ASK
        asking = redis.Redis(port=target, single_connection_client=True)
        assert asking.execute_command("ASKING") and asking.exists(*moved) == 2
        asking.close()
        n1.drop("Ann", "during", "TO: Bob\n\nwhile the slot migrates")
        n2.drop("Bob", "back", "TO: Ann\n\nand back, while it migrates")
        exchange(n1, n2, rounds=3)
        assert sorted(e["body"] for e in n2.held("Bob")) == ["before the migration", "while the slot migrates"]
        assert [e["body"] for e in n1.held("Ann")] == ["and back, while it migrates"]
        assert n1.link.history.remote.outbound_counts()["acknowledged"] == 2
        src.close()
        dst.close()
    finally:
        cluster.stop()
