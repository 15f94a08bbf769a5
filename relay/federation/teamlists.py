"""Every node's list of names as the receiver last read it, for a sender the directory has not
resolved yet (announced since the directory's last look), read again at most once per EVERY.

Before, each batch holding such a sender read every node's list again (and walked the keyspace
for the team's nodes): a node writing entries from names nobody announced, every 20 ms, made the
receiver read the whole directory fifty times a second. Now the lists are kept, with each
entry's version: a read asks each node's version (one round trip) and its list only when that
changed, and comes at most once per EVERY (or once a batch when the directory says a name moved:
a retire). An entry whose sender the lists do not have waits (tried again on its own, by its id)
when the lists were read before the entry was first seen and not in this batch; the next read
decides: a name just announced is delivered, a name nobody announced refused.
"""
from relay.federation.directory import each, listed_names, team_nodes

EVERY = 1.0                 # seconds between two reads of the team's lists, at least


class TeamLists:
    def __init__(self, client, keys, limit, nodes, clock, on_read):
        self.client = client
        self.keys = keys
        self.limit = limit          # max_agents_per_node
        self.nodes = nodes          # the team's nodes as the directory last read them
        self.clock = clock
        self.on_read = on_read      # asks the directory to look again now
        self.cache = {}             # node -> (version, {folded name: names})
        self.read_at = None
        self.in_batch = False       # read during this batch
        self.reads = 0              # reads made (counted, for tests and benchmarks)

    def batch(self):
        self.in_batch = False

    def lists(self, node, force=False):
        """{node: {folded name: names}}, read again when older than EVERY (with `force`, once a batch)."""
        now = self.clock()
        if self.read_at is None or now - self.read_at >= EVERY or (force and not self.in_batch):
            self._read(node, now)
        return {n: names for n, (_, names) in self.cache.items()}

    def waits(self, since):
        """Whether an entry first seen at `since`, whose sender the lists do not have, waits for
        their next read (when: next_read) instead of being refused now."""
        return not self.in_batch and self.read_at is not None and self.read_at <= since

    @property
    def next_read(self):
        return (self.read_at or 0.0) + EVERY

    def _read(self, node, now):
        self.reads += 1
        nodes = sorted(team_nodes(self.client, self.keys) | set(self.nodes()) | {node})
        versions = each(self.client, nodes, lambda pipe, n: pipe.hget(self.keys.node(n), "v"))
        stale = [n for n, v in zip(nodes, versions, strict=True)
                 if isinstance(v, Exception) or n not in self.cache or self.cache[n][0] != v]
        cache = {n: self.cache[n] for n in nodes if n in self.cache and n not in stale}
        replies = each(self.client, stale, lambda pipe, n: pipe.hget(self.keys.node(n), "agents"))
        for n, listed in zip(stale, replies, strict=True):
            folded = {}
            for name in listed_names(None if isinstance(listed, Exception) else listed, self.limit)[0]:
                folded.setdefault(name.casefold(), set()).add(name)
            version = versions[nodes.index(n)]
            cache[n] = (None if isinstance(version, Exception) else version, folded)
        self.cache = cache
        self.read_at = now
        self.in_batch = True
        self.on_read()
