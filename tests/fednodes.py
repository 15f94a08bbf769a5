"""The federation tests' helpers: benchmarks/fedkit.py (a real redis-server, node roots, daemons)
and Node, a relay root linked to the team in-process, driven by steps."""
import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("fedkit", Path(__file__).parent.parent / "benchmarks" / "fedkit.py")
fedkit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fedkit)
MISSING, REDIS_SERVER, RedisServer = fedkit.MISSING, fedkit.REDIS_SERVER, fedkit.RedisServer
drop, free_port, held, start_daemon, write_config = (fedkit.drop, fedkit.free_port, fedkit.held, fedkit.start_daemon,
                                                     fedkit.write_config)


class Node:
    """One relay root linked to the team, in-process: its Relay and its Link driven by steps."""

    def __init__(self, root, url, team, name, agents, clock, extra="", heartbeat="1s"):
        from relay import config as config_mod
        from relay.daemon import Relay
        from relay.federation import Link
        self.root = Path(root)
        self.name = name
        self.state = write_config(root, url, team, name, agents, extra, heartbeat)
        self.clock = clock
        self.closed = False
        self.config = config_mod.load(self.root, ".relay", env={})
        self.relay = Relay(self.config, clock=clock)
        self.link = Link(self.config, clock=clock, router=self.relay.router, on_directory=lambda: self.relay.hint("dir"))

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

    def held(self, agent):
        return held(self.state, agent)

    def close(self):
        if not self.closed:
            self.link.close()
            self.relay.close()
            self.closed = True


def exchange(*nodes, rounds=2):
    """Every node sends, then every node receives, `rounds` times."""
    for _ in range(rounds):
        for n in nodes + nodes:         # twice: each node sees the others' agents
            n.link.heartbeat()
        for n in nodes:
            n.send()
        for n in nodes:
            n.receive()
