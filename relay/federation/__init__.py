"""The federation: relays on several machines form one team through a Redis server.

- keys.py: the team's keys laid out by who writes them, and the ACL line of one node
- client.py: connections (a URL, Sentinel), with a reader that never reads a reply past its bound
- directory.py: each node's agents, announced in its own key and read from the others'
- routes.py: the loop's view of the directory (which recipients live on other nodes)
- publisher.py: messages for other nodes published, acknowledged end to end, published again
- receiver.py: the streams addressed to this node read, checked, delivered and acknowledged
- sendercheck.py: who may send through a node's stream (the receiver's check of each sender)
- link.py: the publisher, the receiver and the directory run together (threads, or run --once)

Nothing here imports `redis` until a link is made: without a `[federation]` section relay is the
single-machine relay.
"""

_NAMES = {"Link": "link", "directory": "link", "probe": "link", "redis_module": "client", "connect": "client",
          "EXTRA": "client", "acl": "keys", "Keys": "keys"}


def __getattr__(name):
    """The link's names, imported when first asked for (the loop imports routes alone)."""
    if name not in _NAMES:
        raise AttributeError(name)
    import importlib
    return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
