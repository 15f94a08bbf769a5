"""Which nodes the team has, found at a cost that no node's keys can grow.

The team's registry is one set, `relay:{team}:nodes`, read with one SMEMBERS. With one ACL user
per node (the only set-up in which a node is held to its own keys) no node may write it: the
operator adds each node with the line `relay federation acl` prints after the node's user
(`SADD relay:{team}:nodes <node>`). Without ACLs each node adds itself when it finds itself
missing. A SCAN over the whole keyspace, once a second, walked every key of every node (a node
may store a million keys under its own prefix); here the keyspace is walked only as a backstop,
at most WALK_CALLS SCANs of WALK_COUNT slots per look, its cursor kept between looks, for nodes not registered
(a server that lost its data, a registration forgotten): each look costs the same whatever the
server holds, and such a node is found within a few looks on a small server. A node on the user
`relay federation acl` makes may not SCAN at all (one SCAN with a huge COUNT holds the server for
everyone): the walk is then left off, said once, and nodes are found from the registry alone.
"""
import logging

from relay.config.federation import NAME

log = logging.getLogger(__name__)

WALK_COUNT = 1000           # keyspace slots one SCAN walks ...
WALK_CALLS = 4              # ... and SCANs one look makes, at most
MEMBERS_MAX = 4096          # names read from the registry at most (SSCAN past that)
REGISTER_EVERY = 60.0       # seconds between two tries of a node to add itself


def registry(keys):
    return f"{keys.prefix}nodes"


def registered(client, keys):
    """The node names in the team's registry (one SMEMBERS; at most MEMBERS_MAX of them)."""
    key = registry(keys)
    if client.scard(key) <= MEMBERS_MAX:
        found = client.smembers(key)
    else:
        found, cursor = set(), 0
        while len(found) < MEMBERS_MAX:
            cursor, got = client.sscan(key, cursor, count=1000)
            found.update(got)
            if not cursor:
                break
    names = {n.decode("utf-8", "replace") if isinstance(n, bytes) else n for n in found}
    return {n for n in names if NAME.match(n)}


class Roster:
    """One relay's view of the team's nodes: the registry, and what the backstop walk found."""

    def __init__(self, client, keys, node):
        self.client = client
        self.keys = keys
        self.node = node
        self.cursor = 0
        self.walking = set()        # node keys found in the walk under way
        self.walked = set()         # ... and in the last walk finished
        self.members = set()
        self.next_register = 0.0
        self.refused = None         # why this node could not add itself (said once)
        self.walk = True            # False once the server refused a SCAN (an ACL without it)

    def nodes(self, now):
        """Every node found: the registry's members, and the node keys the walk found so far."""
        self.members = registered(self.client, self.keys)
        if self.walk:
            try:
                self._walk()
            except Exception as e:
                if type(e).__name__ != "NoPermissionError":
                    raise
                self.walk = False
                log.info("federation: node %s may not walk the keyspace (its ACL grants no SCAN): the team's nodes are "
                         "found from the registry alone", self.node)
        return self.members | self.walked | self.walking

    def _walk(self):
        """At most WALK_CALLS SCANs of the walk under way."""
        for _ in range(WALK_CALLS):
            self.cursor, keys = self._scan()
            for key in keys:
                name = self.keys.node_name(key)
                if name and NAME.match(name):
                    self.walking.add(name)
            if not self.cursor:
                self.walked, self.walking = self.walking, set()
                break

    def _scan(self):
        """One SCAN from the walk's cursor: (the next cursor, the node keys found). In a cluster,
        on the master of the team's slot (every key of a team lies in it)."""
        if not hasattr(self.client, "get_node_from_key"):
            return self.client.scan(self.cursor, match=self.keys.node_pattern, count=WALK_COUNT)
        node = self.client.get_node_from_key(self.keys.node(self.node))
        cursors, keys = self.client.scan(self.cursor, match=self.keys.node_pattern, count=WALK_COUNT,
                                         target_nodes=node)
        return (cursors.get(node.name, 0) if isinstance(cursors, dict) else cursors), keys

    def register(self, now, errors):
        """Add this node to the registry when it is not there (at most once a REGISTER_EVERY). A
        server that refuses (an ACL without it: the operator's to add) is said once."""
        if self.node in self.members or now < self.next_register:
            return
        self.next_register = now + REGISTER_EVERY
        try:
            self.client.sadd(registry(self.keys), self.node)
        except errors as e:
            why = str(e)[:200]
            if self.refused != why:
                log.warning("federation: node %s is not in the team's registry and cannot add itself (%s): the "
                            "others do not find it (or only by a slow walk of the keyspace, where their ACL allows "
                            "SCAN); the server's admin runs SADD %s %s (relay federation acl prints it)", self.node,
                            why, registry(self.keys), self.node)
            self.refused = why
            return
        self.members.add(self.node)
