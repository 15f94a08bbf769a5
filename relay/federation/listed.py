"""What one node's directory entry lists now, for the receiver's check of a sender the directory,
as last read, gives to another node (receiver.Incoming._moved): the entry's version is read at
most once a batch, its list only when that version changed. A node sending names it does not
hold thus costs a small read a batch, never every node's lists."""
from relay.federation.directory import each, listed_names


class Listed:
    def __init__(self, client, keys, limit):
        self.client = client
        self.keys = keys
        self.limit = limit          # max_agents_per_node
        self.cache = {}             # node -> (its version, its names case folded), as last read
        self.fresh = set()          # the nodes whose version this batch read

    def batch(self):
        """A new batch: each entry's version is read again at its first use."""
        self.fresh = set()

    def lists(self, node, folded):
        """Whether `node`'s entry lists the name (case folded) now. An entry that cannot be read
        (another type, too large) is taken to list it: the name stays with the node it had."""
        if node not in self.fresh:
            self.fresh.add(node)
            key = self.keys.node(node)
            [version] = each(self.client, [node], lambda pipe, n: pipe.hget(key, "v"))
            if isinstance(version, Exception):
                self.cache.pop(node, None)
                return True
            if node not in self.cache or self.cache[node][0] != version:
                [listed] = each(self.client, [node], lambda pipe, n: pipe.hget(key, "agents")) \
                    if version is not None else [None]
                if isinstance(listed, Exception):
                    self.cache.pop(node, None)
                    return True
                names = listed_names(listed, self.limit)[0]
                self.cache[node] = (version, {name.casefold() for name in names})
        return node not in self.cache or folded in self.cache[node][1]
