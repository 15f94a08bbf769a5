"""The team's directory: which node holds which agent name.

Each node writes its own entry, the hash `relay:{team}:node:<N>` (its agents, a version of that
list, its owner: the host and project root of the relay running it, its heartbeat timeout, and
its last seen by the server's clock, stamped by the announcing script), and reads the others':

    announce (every heartbeat, and at once when its agents change)
    look (every LOOK seconds, and at once when asked): the team's nodes (roster.py), one
      pipeline of HMGET (version, last seen, timeout) per node, the agents of a node read only
      when its version changed, then the names resolved and recorded in the ledger

A node can write only its own entry (ACLs), so nothing it writes says anything of another
node's names. A name's claim (claims.py: written once, before the name is announced) outranks
every list: a node listing a name another node claimed is not taken for it. For a name no one
claimed, which node holds it is decided by each reader from the lists:

- a name of this node's own agents is local (another node claiming it is a conflict, shown);
- a name one live node lists is that node's;
- a name stays with the node this reader had it on for as long as that node lists it, alive or
  not: no other node's claim moves it (a name moves when its node drops it, or when an operator
  deletes the key of a node gone for good);
- a new name several live nodes list is ambiguous: routed nowhere (its messages wait, then fail
  with the reason) and shown as a conflict;
- a node's "last seen" is its own, stamped by the server when it announces; a time it forged
  only makes itself look alive;
- a node the server no longer knows at all (it lost its data) keeps its names until it would
  have timed out, so messages to it wait for it to announce again instead of failing.

A node's list is read only up to `max_agents_per_node` names; past that it is cut, logged.
"""
import hashlib
import logging

import orjson

from relay.names import reserved
from relay.files.layout import valid_agent
from relay.federation.claims import Claims
from relay.federation.client import each, reason, server_errors     # each: used by listed.py, receiver.py
from relay.federation.keys import Keys
from relay.federation.roster import Roster, registered

log = logging.getLogger(__name__)

LOOK = 1.0                  # seconds between two reads of the team's directory
TIMEOUT_BEATS = 12          # a node not seen for this many of its heartbeats is gone
NAME_BYTES = 70             # what one name costs in a node's list, at most (JSON)
CHURN_MIN = 1.0             # seconds a node's list changed again soon after a read waits, at first ...
CHURN_MAX = 30.0            # ... doubled at each such change, up to this
CONFLICTS_SAID = 20         # names newly in conflict logged one by one at a read, at most
CONFLICTS_KEPT = 100        # other nodes' names in conflict recorded for relay status, at most




def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _number(value):
    try:
        n = float(_text(value))
    except (TypeError, ValueError):
        return None
    return n if n == n and abs(n) != float("inf") else None


class Entry:
    """What one node's key says (read, never trusted beyond its own names)."""
    __slots__ = ("version", "seen", "timeout", "agents", "owner")

    def __init__(self):
        self.version, self.seen, self.timeout, self.agents, self.owner = None, None, None, (), None

    def alive(self, now, default):
        if self.seen is None:
            return False
        return now - self.seen < (self.timeout if self.timeout and self.timeout > 0 else default)


def team_nodes(client, keys):
    """The nodes in the team's registry (one SMEMBERS: roster.py), never a walk of the keyspace."""
    return registered(client, keys)


def listed_names(listed, limit):
    """A node's `agents` field as read (bytes, or None): (its names: JSON, agent names only, at
    most `limit`; what is wrong with it, or None)."""
    if listed is None:
        return (), None
    if len(listed) > limit * NAME_BYTES:
        return (), (f"lists {len(listed)} bytes of agent names, over what max_agents_per_node ({limit}) allows: "
                    "its names are not taken")
    try:
        names = orjson.loads(listed)
    except orjson.JSONDecodeError:
        return (), None
    if not isinstance(names, list):
        return (), None
    good = [n for n in names if isinstance(n, str) and valid_agent(n)]
    kept = [n for n in good if not reserved(n)]     # System, Broadcast in any case: relay's own (names.py)
    wrong = (f"lists {len(kept)} agents, over max_agents_per_node ({limit}): only the first {limit} are taken"
             if len(kept) > limit else None)
    if len(kept) < len(good):
        taken = ", ".join(repr(n) for n in good if reserved(n))[:200]
        wrong = "; ".join(w for w in (wrong, f"lists {taken}, which relay keeps for itself (in any case): "
                                              "not taken") if w)
    good = kept
    return tuple(dict.fromkeys(good[:limit])), wrong


class Churn:
    """When a node's list, changed, is read again. A list that changes again within twice the
    wait after its last read waits twice as long before the next (1 s up to CHURN_MAX); one
    that stays the same that long is read at its next change at once. An honest node adding an
    agent now and then is read at each look; a node rewriting its list every second (thousands
    of new names, each to be resolved and claimed by every node) is read twice a minute."""

    def __init__(self):
        self.last = {}              # node -> (when its changed list was read, the wait after it)

    def due(self, node, now):
        at, wait = self.last.get(node, (float("-inf"), 0.0))
        return now >= at + wait

    def read(self, node, now):
        at, wait = self.last.get(node, (float("-inf"), 0.0))
        soon = now - at <= 2 * max(wait, CHURN_MIN)
        self.last[node] = (now, min(CHURN_MAX, max(CHURN_MIN, 2 * wait)) if soon else 0.0)


class Directory:
    """This node's side of the directory; used by the link's publisher thread only."""

    def __init__(self, fed, client, ledger, history, identity, redis, reader=None):
        self.fed = fed
        self.keys = Keys(fed.team)
        self.node = fed.node
        self.client = client
        # The others' entries are read through a guarded client: no field past what a list of
        # max_agents_per_node names takes is ever read whole (a node may write anything there).
        self.reader = reader if reader is not None else client
        self.bad = {}               # node -> why its entry is not read (logged once)
        self.ledger = ledger
        self.history = history
        self.identity = identity
        self.redis = redis
        self.errors = server_errors()
        self.timeout = fed.heartbeat * TIMEOUT_BEATS
        self.entries = {}           # node -> Entry, as last read
        self.roster = Roster(client, self.keys, self.node)     # which nodes the team has
        self.churn = Churn()        # when each node's changed list may be read again
        self.claims = Claims(self.reader, self.keys, self.node)     # who holds each name (claims.py)
        self.announced = None       # the version of this node's list last written
        self.duplicate = None       # why this relay may not act as its node (another holds the name)
        self.conflicts = []
        self.routes = {}            # name -> node, as last resolved
        self.server_now = None
        self.read_at = None         # when the directory was last read whole (this relay's clock)
        self.error = None           # why it cannot be read now

    # -- this node's entry -------------------------------------------------------------------

    def announce(self, now, local):
        """Write this node's entry (its agents). True when written; False when another relay
        holds the node name (self.duplicate says why); RedisError when the server refuses."""
        names = sorted(local)[:self.fed.max_agents_per_node]
        if len(local) > len(names):
            log.error("federation: this node has %d agents, over max_agents_per_node (%d): only the first %d are "
                      "announced to the team", len(local), self.fed.max_agents_per_node, len(names))
        listed = orjson.dumps(names)
        version = hashlib.sha256(listed).hexdigest()[:16]
        key = self.keys.node(self.node)
        owner, seen, timeout, written, recorded = self.client.hmget(key, "owner", "seen", "timeout", "v", "claims")
        secs, micros = self._time()
        self.server_now = now_there = int(secs) + int(micros) / 1e6
        holder = _text(owner)[:200] if owner is not None else None
        seen, timeout = _number(seen) or 0.0, _number(timeout) or 0.0
        if holder is not None and holder != self.identity and now_there - seen < timeout:
            pass                    # another relay announced under this name within its timeout
        else:
            holder = None
            # Each name claimed before it is listed: no node can read it anywhere before its claim.
            again = self.announced is None or _text(written) != self.announced     # first, or the entry lost
            claimed = self.claims.make(names, recorded, again)
            self.client.hset(key, mapping={"owner": self.identity, "seen": repr(now_there), "timeout": self.timeout,
                                           "agents": listed, "v": version, "claims": claimed})
        if holder:
            why = (f"node name {self.node} is in use by another relay ({holder}); this one neither announces its "
                   f"agents nor reads the node's streams until that one has been gone for {self.timeout:.0f}s: set "
                   "another `node` in [federation]")
            if self.duplicate != why:
                log.error("federation: %s", why)
            self.duplicate = why
            return False
        self.duplicate = None
        self.announced = version
        self.roster.register(now, self.errors)
        return True

    # -- the others' entries -----------------------------------------------------------------

    def nodes(self):
        """Every node of the team found now (the registry, and the walk's backstop: roster.py),
        this one included."""
        return self.roster.nodes(None)

    def look(self, now, local):
        """Read the team's directory and record what it resolves to. Returns True when the
        routes changed. RedisError when the server cannot be read (recorded, with why)."""
        try:
            changed = self._look(now, local)
        except self.errors as e:
            why = reason(e)
            if self.error != why:
                log.error("federation: cannot read the team's directory: %s; messages to names this node does "
                          "not know wait", why)
                self.ledger.remote.directory_failed(now, self.node, why)
            self.error = why
            raise
        if self.error is not None:
            log.info("federation: the team's directory is read again")
        self.error = None
        self.read_at = now
        self.ledger.remote.directory_read(now)
        return changed

    def _look(self, now, local):
        names = self.nodes() | {n for n, _ in self.history.remote.agents().values()}
        names.discard(self.node)
        names = sorted(names)
        secs, micros = self._time()
        self.server_now = int(secs) + int(micros) / 1e6
        reply = self._each(names, lambda pipe, n: pipe.hmget(self.keys.node(n), "v", "seen", "timeout", "owner"))
        stale, entries = [], {}
        for n, got in zip(names, reply, strict=True):
            if got is None:
                continue            # no key, or one that cannot be read (self.bad says why)
            version, seen, timeout, owner = got
            if version is None and seen is None:
                continue            # no key: the node is gone, or the server lost it
            e = Entry()
            e.version, e.seen, e.timeout, e.owner = _text(version), _number(seen), _number(timeout), _text(owner)
            old = self.entries.get(n)
            if old is not None and old.version == e.version:
                e.agents = old.agents
            elif old is not None and not self.churn.due(n, now):
                e.version, e.agents = old.version, old.agents      # changed again too soon: read later
            else:
                stale.append(n)
            entries[n] = e
        if stale:
            for n, listed in zip(stale, self._each(stale, lambda pipe, n: pipe.hget(self.keys.node(n), "agents")),
                                 strict=True):
                entries[n].agents = self._agents(n, listed)
                self.churn.read(n, now)
        before = (self.routes, self.conflicts)
        claimed = self.claims.refresh(now, entries, local, force=bool(stale) or self.read_at is None)
        if claimed or stale or set(entries) != set(self.entries) \
                or self._liveness(entries) != self._liveness(self.entries) or self.read_at is None:
            self.entries = entries
            self.resolve(now, local)
        else:
            self.entries = entries
        return (self.routes, self.conflicts) != before

    def _each(self, names, command):
        """One command per node in one round trip, through the guarded reader (each()); a node
        whose key answers an error (another type) or more than the bound is left out (None),
        said once."""
        out = []
        for n, r in zip(names, each(self.reader, names, command), strict=True):
            if isinstance(r, Exception):
                why = reason(r)
                if self.bad.get(n) != why:
                    log.error("federation: the directory entry of node %s cannot be read (%s): it is left out", n, why)
                self.bad[n] = why
                out.append(None)
            else:
                self.bad.pop(n, None)
                out.append(r)
        return out

    def _time(self):
        """The clock of the server holding the team's keys (in a cluster, the slot's master)."""
        if hasattr(self.client, "get_node_from_key"):
            return self.client.time(target_nodes=self.client.get_node_from_key(self.keys.node(self.node)))
        return self.client.time()

    def _liveness(self, entries):
        return {n: e.alive(self.server_now, self.timeout) for n, e in entries.items()}

    def _agents(self, node, listed):
        """A node's list of names, as read (listed_names()), what is wrong with it logged."""
        names, wrong = listed_names(listed, self.fed.max_agents_per_node)
        if wrong:
            log.error("federation: node %s %s", node, wrong)
        return names

    def _holder(self, name, holders, before, owner=None):
        """The node a name is routed to, or None (unknown, or ambiguous). Whether a node is
        alive never decides it: a node's own last seen is its to forge. A name's claim
        outranks every list (claims.py): only its `owner` may hold it then."""
        if owner is not None:
            holders = [h for h in holders if h == owner]
            before = before if before is not None and before[0] == owner else None
        if before is not None:
            node, _ = before
            entry = self.entries.get(node)
            if entry is None or name in entry.agents:
                # Still listed by its holder, or its key is gone (the server lost it, or its node
                # is being renamed): no other node's claim moves it. It moves when its node drops
                # it, or an operator empties that node's entry (relay federation retire).
                return node
        if len(holders) == 1:
            return holders[0]
        return None

    def resolve(self, now, local):
        """Decide each name's node (the rules in this module's docstring) and record it."""
        previous = self.history.remote.agents()        # name -> (node, last seen)
        claims = {}
        for n, e in self.entries.items():
            for name in e.agents:
                claims.setdefault(name, []).append(n)
        routes, conflicts = {}, []
        for name in set(claims) | {n for n, (node, _) in previous.items() if node not in self.entries} | set(local):
            holders = claims.get(name, [])
            owner = self.claims.owner(name, self.entries)
            if name in local:
                # Another node's claim takes this node's agent out of the team's routes; a node
                # listing a name this node claimed is not taken for it.
                if owner is None:
                    conflicts.extend((name, h) for h in holders)
                elif owner != self.node:
                    conflicts.append((name, owner))
                continue
            node = self._holder(name, holders, previous.get(name), owner)
            if node is not None:
                routes[name] = node
            elif holders and owner is None:
                conflicts.extend((name, h) for h in sorted(holders))
        # Names that differ only by case are one name to a person: a remote one beside a local
        # one is a conflict, routed nowhere; of remote ones, the one routed to its node before
        # keeps it (another node listing a case variant takes nothing), else all are conflicts.
        folded = {}
        for name in list(routes) + list(local):
            folded.setdefault(name.casefold(), set()).add(name)
        for names in folded.values():
            if len(names) > 1:
                remote = names - set(local)
                if remote == names and len({routes[n] for n in remote}) == 1:
                    continue        # one node lists them all: each reaches that node, as it asks
                settled = [n for n in remote if not names & set(local) and previous.get(n, (None,))[0] == routes[n]]
                keep = settled[0] if len(settled) == 1 else None
                for name in remote - {keep}:
                    conflicts.append((name, routes.pop(name)))
        seen = {n: e.seen for n, e in self.entries.items()}
        rows = sorted((name, node, seen.get(node, previous.get(name, (None, None))[1])) for name, node in routes.items())
        conflicts = sorted(set(conflicts))
        if conflicts != self.conflicts:
            before = set(self.conflicts)
            new = [c for c in conflicts if c not in before]
            for name, other in new[:CONFLICTS_SAID]:
                where = "this node's own agent" if name in local else "claimed by more than one node, or a name that differs only by case"
                log.error("federation: agent %s is also listed by node %s (%s); %s", name, other, where,
                          "it stays local here" if name in local else "messages to it wait until one of them drops it")
            if len(new) > CONFLICTS_SAID:
                log.error("federation: %d more names are newly listed by more than one node (relay status shows "
                          "some of them)", len(new) - CONFLICTS_SAID)
            self.conflicts = conflicts
        # Recorded for relay status: this node's own names in conflict (its health), and some of
        # the others' (what other nodes list is no fault of this node's).
        own = [[name, other, True] for name, other in conflicts if name in local]
        others = [[name, other, False] for name, other in conflicts if name not in local][:CONFLICTS_KEPT]
        self.ledger.remote.directory(now, self.node, rows, own + others)
        self.routes = routes
