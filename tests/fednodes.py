"""The federation tests' helpers: benchmarks/fedkit.py (a real redis-server, node roots, daemons),
Node, a relay root linked to the team in-process, driven by steps, the fixtures both federation
test files use, and the entries a node (or a test standing for one) writes into its own keys."""
import importlib.util
import uuid
from pathlib import Path

import orjson
import pytest

_spec = importlib.util.spec_from_file_location("fedkit", Path(__file__).parent.parent / "benchmarks" / "fedkit.py")
fedkit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fedkit)
MISSING, REDIS_SERVER, RedisServer = fedkit.MISSING, fedkit.REDIS_SERVER, fedkit.RedisServer
drop, free_port, held, start_daemon, write_config = (fedkit.drop, fedkit.free_port, fedkit.held, fedkit.start_daemon,
                                                     fedkit.write_config)

needs_server = pytest.mark.skipif(REDIS_SERVER is None, reason=MISSING)


class Node:
    """One relay root linked to the team, in-process: its Relay and its Link driven by steps."""

    def __init__(self, root, url, team, name, agents, clock, extra="", heartbeat="1s"):
        from relay import config as config_mod
        from relay.core.daemon import Relay
        from relay.federation import Link
        self.root = Path(root)
        self.name = name
        self.state = write_config(root, url, team, name, agents, extra, heartbeat)
        self.clock = clock
        self.closed = False
        self.config = config_mod.load(self.root, ".relay", env={})
        self.relay = Relay(self.config, clock=clock)
        self.link = Link(self.config, clock=clock, router=self.relay.router, on_directory=lambda: self.relay.hint("dir"))
        self.keys = self.link.publisher.keys

    def drop(self, sender, name, text):
        path = drop(self.state, sender, name, text)
        self.relay.hint("file", sender, name)
        return path

    def send(self):
        """Deliver what is in the outboxes, then publish what was queued for other nodes."""
        counts = self.relay.drain(now_fn=self.clock, wait=lambda s: None)
        return counts, self.link.publish()

    def receive(self):
        return self.link.incoming.step(self.clock())

    def stream(self, to):
        """The key of the stream this node sends `to` another node."""
        return self.keys.messages(self.name, to)

    def key(self):
        """The key of this node's directory entry."""
        return self.keys.node(self.name)

    def acks(self, r, to):
        """What this node acknowledged to node `to`, in order: (message id, refusal or None)."""
        return [(item[0], item[2] if len(item) > 2 else None)
                for _, fields in r.xrange(self.keys.acks(self.name, to)) for item in orjson.loads(fields[b"acks"])]

    def outbound(self, mid):
        """{node: outbound row} of one message sent from this node."""
        return {o["node"]: o for o in self.relay.history.remote.outbound(mid)}

    def held(self, agent):
        return held(self.state, agent)

    def close(self):
        if not self.closed:
            self.link.close()
            self.relay.close()
            self.closed = True


def exchange(*nodes, rounds=2):
    """Every node sends, then every node receives, then every node reads its acknowledgements,
    `rounds` times."""
    for _ in range(rounds):
        for n in nodes + nodes:         # twice: each node sees the others' agents
            n.link.heartbeat()
        for n in nodes:
            n.send()
        for n in nodes:
            n.receive()
        for n in nodes:
            n.link.publish()


# -- fixtures ---------------------------------------------------------------------------------

def _started(tmp_path_factory):
    """A Redis server of its own, started, stopped when the fixture ends (skipped without one)."""
    if REDIS_SERVER is None:
        pytest.skip(MISSING)
    s = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    yield from _started(tmp_path_factory)


@pytest.fixture
def team():
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def nodes(tmp_path, clock):
    made = []

    def make(url, team, name, agents, extra="", heartbeat="1s"):
        node = Node(tmp_path / name, url, team, name, agents, clock, extra, heartbeat)
        made.append(node)
        return node
    yield make
    for n in made:
        n.close()


def client(url):
    import redis
    return redis.Redis.from_url(url)


# -- entries as a node writes them ------------------------------------------------------------

def envelope(clock, **fields):
    """A well-formed envelope from Ann to Bob, with a fresh id (ids older than the replay window
    are refused)."""
    from relay.ids import IdGenerator
    doc = {"id": IdGenerator().new(clock.now), "from": "Ann", "to": ["Bob"], "kind": "message", "thread": None,
           "subject": None, "body": "ok", "headers": {}, "sent_at": "2026-11-30T00:00:00.000000Z",
           "relayed_at": "2026-11-30T00:00:00.000000Z", "source": "msg", "sha256": "a" * 64}
    doc.update(fields)
    return doc


def entry(env, to=("Bob",), **fields):
    """The fields of a stream entry as a node publishes them (None leaves a field out)."""
    env = env if isinstance(env, bytes) else orjson.dumps(env)
    try:
        mid = orjson.loads(env).get("id")
    except orjson.JSONDecodeError:
        mid = "01M8NY4DA9BNVZQW02BT7NGYD2"
    doc = {"v": "2", "id": mid, "to": orjson.dumps(list(to)), "env": env}
    doc.update(fields)
    return {k: v for k, v in doc.items() if v is not None}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A Redis server of the module's own, for tests that put each node on its ACL user."""
    yield from _started(tmp_path_factory)


def admin(server):
    import redis
    return redis.Redis.from_url(server.url)


def user_url(server, team, node):
    """The node's own ACL user, made from the lines `relay federation acl` prints."""
    import shlex

    from relay.federation.keys import acl, registration
    password = f"pw-{node}-{team}"
    for line in (acl(team, node, password), registration(team, node)):
        admin(server).execute_command(*shlex.split(line))
    return f"redis://relay-{team}-{node}:{password}@127.0.0.1:{server.port}/0"


def as_node(server, team, node):
    """A raw client with `node`'s credentials: what a hostile node can do by hand."""
    import redis
    return redis.Redis.from_url(user_url(server, team, node))
