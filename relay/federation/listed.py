"""What one node's directory entry lists now, for the receiver's check of a sender the directory,
as last read, gives to another node (sendercheck.SenderCheck.moved): the entry's version is read at
most once a batch, its list only when that version changed. A node sending names it does not
hold thus costs a small read a batch, never every node's lists. A sender's claim (claims.py) is
read here too: once a batch, for every sender of the batch at the first one asked."""
from relay.federation.claims import read
from relay.federation.directory import each, listed_names
from relay.federation.entries import _sender_of
from relay.federation.keys import RETIRED


class Listed:
    def __init__(self, client, keys, limit):
        self.client = client
        self.keys = keys
        self.limit = limit          # max_agents_per_node
        self.cache = {}             # node -> (its version, {name case folded: its names}), as last read
        self.fresh = set()          # the nodes whose version this batch read
        self.entries = ()           # this batch's entries (node, entry id, fields)
        self.claims = None          # {name case folded: its claim's node or None}, this batch's

    def batch(self, entries=()):
        """A new batch: each entry's version, and the senders' claims, read again at their first use."""
        self.fresh = set()
        self.entries = entries
        self.claims = None

    def lists(self, node, folded):
        """Whether `node`'s entry lists the name (case folded) now. An entry that cannot be read
        (another type, too large) is taken to list it: the name stays with the node it had."""
        names = self._names(node)
        return names is None or folded in names

    def _names(self, node):
        """{folded: names} that `node`'s entry lists now, or None when it cannot be read."""
        if node not in self.fresh:
            self.fresh.add(node)
            key = self.keys.node(node)
            [version] = each(self.client, [node], lambda pipe, n: pipe.hget(key, "v"))
            if isinstance(version, Exception):
                self.cache.pop(node, None)
                return None
            if node not in self.cache or self.cache[node][0] != version:
                [listed] = each(self.client, [node], lambda pipe, n: pipe.hget(key, "agents")) \
                    if version is not None else [None]
                if isinstance(listed, Exception):
                    self.cache.pop(node, None)
                    return None
                folded = {}
                for name in listed_names(listed, self.limit)[0]:
                    folded.setdefault(name.casefold(), set()).add(name)
                self.cache[node] = (version, folded)
        return self.cache[node][1] if node in self.cache else None

    def claimed(self, agent, node):
        """Whether `agent` is `node`'s by its claim: True (the claim is `node`'s and its entry lists
        the name), False (another node's claim, or one no node holds), None (unclaimed, or held
        by a node an operator retired: the lists decide)."""
        folded = agent.casefold()
        if self.claims is None or folded not in self.claims:
            senders = {s.casefold() for s in (_sender_of(f) for _, _, f in self.entries if isinstance(f, dict)) if s}
            got, _ = read(self.client, self.keys, (senders | {folded}) - set(self.claims or ()))
            self.claims = {**(self.claims or {}), **got}
        holder = self.claims[folded]
        if holder is None:
            return None
        if holder != node:
            self._names(holder)
            return None if self.cache.get(holder, (None,))[0] in (RETIRED["v"], RETIRED["v"].encode()) else False
        names = self._names(node)
        return names is None or agent in names.get(folded, ())
