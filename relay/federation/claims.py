"""Agent names no node can squat: one claim per name, made before the name is announced.

    relay:{team}:claim:<name, case folded>    string: the node that holds the name

A node claims each of its agents' names with SETNX (the value: its node name) in a round trip
of its own, before the HSET that lists them in its entry; the ACL grants a node SETNX alone on
claim keys (no SET, DEL, RENAME, EXPIRE ...), so a claim once made is never overwritten or
removed by a node: only the server's admin frees one (`relay federation claim-free`), gives it to
another node (`claim-grant`), or frees a retired node's (`retire`).

A claim outranks every list: the owner of a name is its claim's node. A node that lists a name
claimed by another is not taken for it (its list is not trusted for that name); a name no one
claimed (a node whose ACL predates claims, a server that lost them) is decided by the lists, as
before claims (directory.py). A claim held by a node an operator retired counts for nothing.

Why a node that reads everything its ACL lets it read cannot squat a new name: the name is
claimed before it is visible anywhere (the entry listing it is written after the claim's reply;
the claim and the entry are in the team's one hash slot, so a replica or a Cluster master never
has the one without the other), so by the time a squatter can read it, the claim is taken. No
stream id nor last seen decides anything: a node chooses those itself.

Reading is bounded: the claims of the names the team's entries list (at most
max_agents_per_node each) in MGETs of CHUNK keys, at a look whose lists changed and at least every
REFRESH seconds (an operator's grant or free takes effect by then); never in proportion to what a
node stores under its own prefix. A claim too large to read is held by no node.
"""
import logging

from relay.federation.client import ReplyTooLarge, each, reason
from relay.federation.keys import RETIRED

log = logging.getLogger(__name__)

CHUNK = 512                 # claim keys per MGET
REFRESH = 5.0               # seconds between two reads of the claims when no list changed
NOBODY = "?"                # a claim that cannot be read: held by no node (never a node name)
RECORDED = 8192             # names a node records in its entry's `claims` field, at most


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def read(client, keys, folded):
    """{case-folded name: its claim's node, or None when unclaimed} for `folded`, in MGETs of CHUNK
    keys in one round trip, and the error that kept the claims from being read (an ACL without
    them), or None. A chunk too large to read is asked name by name; a name too large is NOBODY's."""
    names = sorted(folded)
    cluster = hasattr(client, "get_node_from_key")      # a Cluster client pipelines no MGET: a GET each
    chunks = [names[i:i + (1 if cluster else CHUNK)] for i in range(0, len(names), 1 if cluster else CHUNK)]

    def ask(pipe, chunk):
        return pipe.get(keys.claim(chunk[0])) if cluster else pipe.mget([keys.claim(n) for n in chunk])
    out, error = {}, None
    for chunk, reply in zip(chunks, each(client, chunks, ask), strict=True):
        if cluster and not isinstance(reply, Exception):
            reply = [reply]
        if isinstance(reply, ReplyTooLarge):
            reply = [NOBODY if isinstance(r, Exception) else r
                     for r in each(client, chunk, lambda pipe, n: pipe.get(keys.claim(n)))]
        elif isinstance(reply, Exception):
            error = reply
            reply = [None] * len(chunk)
        out.update((n, _text(r)) for n, r in zip(chunk, reply, strict=True))
    return out, error


class Claims:
    """One node's claims (made at each announcement) and its view of everyone's (read at looks);
    used by the directory, on the publisher's thread."""

    def __init__(self, client, keys, node):
        self.client = client
        self.keys = keys
        self.node = node
        self.held = set()           # the case-folded names this node holds (made or found its own)
        self.owners = {}            # case-folded name -> its claim's node (None: unclaimed), as last read
        self.read_at = None         # when the claims were last read (this relay's clock)
        self.refused = None         # why claims could not be made or read (said once)
        self.moved = False          # an owner learned at an announcement, not yet resolved

    # -- this node's -----------------------------------------------------------------------

    def make(self, local, recorded, again):
        """Claim the names of this node's agents (a pipeline of SETNX, then whose each claim is) before they
        are announced: every name not known to be this node's (all of them and those `recorded`
        in its entry when `again`: a first announcement, or an entry the server lost). Returns
        what to record in the entry's `claims` field (JSON). OutOfMemoryError when the server
        refuses writes; any other refusal (an ACL that predates claims) is said once and the
        names are announced unclaimed."""
        import orjson
        import redis
        if again:
            self.held = set()
        want = {n.casefold() for n in local}
        check = sorted((want | (set(_names(recorded)) if again else set())) - self.held)
        if check:
            pipe = self.client.pipeline(transaction=False)
            for n in check:
                pipe.setnx(self.keys.claim(n), self.node)
            made = pipe.execute(raise_on_error=False)
            full = next((r for r in made if isinstance(r, redis.exceptions.OutOfMemoryError)), None)
            if full is not None:
                raise full
            found, error = read(self.client, self.keys, check)     # whose each claim is (the reader's bounds)
            holders = [found[n] for n in check]
            wrong = next((r for r in made if isinstance(r, Exception)), error)
            self._said(None if wrong is None else
                       f"cannot claim this node's agent names ({reason(wrong)}): they are announced unclaimed, "
                       "and a node that lists them too makes them ambiguous; the ACL predates claims: run the "
                       "line `relay federation acl` prints again")
            for n, holder in zip(check, holders, strict=True):
                if holder == self.node:
                    self.held.add(n)
                else:
                    self.held.discard(n)
                    if n in want and holder is not None and self.owners.get(n) != holder:
                        log.error("federation: agent name %s is claimed by node %s: this node's agent is not "
                                  "reachable from the team until the server's admin runs the line `relay "
                                  "federation claim-grant %s %s` prints", n, holder, n, self.node)
                if self.owners.get(n) != holder:
                    self.owners[n] = holder
                    self.read_at = None     # read again at the next look, and resolved
                    self.moved = True
        kept = sorted(self.held & want) + sorted(self.held - want)
        return orjson.dumps(kept[:RECORDED])

    def _said(self, why):
        if why is not None and why != self.refused:
            log.error("federation: %s", why)
        self.refused = why

    # -- everyone's ------------------------------------------------------------------------

    def refresh(self, now, entries, local, force):
        """Read the claims of every name the entries (and this node) list, when `force` (a list
        changed) or REFRESH seconds after the last read. True when an owner changed."""
        if not force and self.read_at is not None and now - self.read_at < REFRESH:
            return False
        folded = {name.casefold() for e in entries.values() for name in e.agents}
        folded.update(name.casefold() for name in local)
        owners, error = read(self.client, self.keys, folded)
        if error is not None:
            self._said(f"cannot read the agent names' claims ({reason(error)}): names are decided by the nodes' "
                       "lists alone; the ACL predates claims: run the line `relay federation acl` prints again")
        self.read_at = now
        # A name of this node's freed or given to another by the admin is claimed again (or
        # said to be another's) at the next announcement.
        self.held -= {n for n in self.held if n in owners and owners[n] != self.node}
        changed = owners != self.owners or self.moved
        self.owners, self.moved = owners, False
        return changed

    def owner(self, name, entries):
        """The node holding `name`'s claim, or None: unclaimed, or held by a node an operator
        retired."""
        holder = self.owners.get(name.casefold())
        if holder is None:
            return None
        entry = entries.get(holder)
        return None if entry is not None and entry.version == RETIRED["v"] else holder


def _names(recorded):
    """The case-folded names of an entry's `claims` field as read (JSON), or ()."""
    import orjson
    try:
        names = orjson.loads(recorded) if recorded else []
    except orjson.JSONDecodeError:
        return ()
    return [n for n in names if isinstance(n, str)][:RECORDED] if isinstance(names, list) else ()
