"""The federation link: relay nodes of one team exchange messages through Redis Streams.

Each node reads its own stream `relay:{team}:in:<node>` through a consumer group (incoming.py);
a message for agents of another node is queued by the relay's loop as an outbound row in the
batch's own transaction (routes.py, ledger.py), and published here, off the delivery path:

    loop: T2 records the outbound row, sets router.queued
      -> publisher thread: XADD to the node's stream (a pipeline per batch), records the entry id
      -> receiver thread of the other node: XREADGROUP, Maildir write, ledger, XACK + XDEL

The publisher runs on its own thread with its own ledger connection and Redis connection, so
no local delivery ever waits for the server; while the server is unreachable each row is tried
again with backoff (and at once when the link comes back). A repeated publish (a crash between
XADD and the record of its entry id) is recognised by the receiver by the message id.

The directory: every heartbeat the publisher claims this node's agents in the team's hash
`relay:{team}:agents` (name -> node) and stamps the node's last seen (the server's clock) in
`relay:{team}:nodes`, in one Lua script that also returns the whole directory; a name held by
another live node (seen within 12 of its own heartbeats, `relay:{team}:timeouts`) is a conflict, logged and shown by `relay status` and `relay agents`, and
never taken. The directory is written to the ledger, where the loop's Router reads it.

`redis` is imported only here and only when a `[federation]` section exists.
"""
import logging
import math
import socket
import threading
import time

import orjson

from .config import SYSTEM
from .errors import FederationError
from .fedconfig import NAME
from .history import History
from .hooks import Hooks
from .incoming import Incoming
from .layout import Layout, valid_agent
from .ledger import Ledger
from .work import backoff

log = logging.getLogger(__name__)

EXTRA = "the federation needs the redis package: pip install 'relay[federation]'"
BATCH = 256                 # outbound rows per XADD pipeline
RETRY_BASE = 0.5            # seconds before a failed publish is tried again, doubled each time ...
RETRY_CAP = 30.0            # ... at most this (and at once when the link comes back)
SOCKET_TIMEOUT = 5.0
CONNECT_TIMEOUT = 2.0
NODE_TIMEOUT_BEATS = 12     # a node not seen for this many heartbeats loses its names to a claim
MAX_WAIT = 1.0              # the publisher looks at the ledger at least this often
HELD = 4                    # bytes held in memory per byte of an envelope published (row, pipeline)

CLAIM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local me, timeout, ident = ARGV[1], tonumber(ARGV[2]), ARGV[3]
-- A node is alive for the timeout it announced itself (its own heartbeat), else this one's.
local function alive(node, seen)
  return now - seen < (tonumber(redis.call('HGET', KEYS[4], node) or '') or timeout)
end
local holder = redis.call('HGET', KEYS[3], me)
local last = tonumber(redis.call('HGET', KEYS[2], me) or '0') or 0
if holder and holder ~= ident and alive(me, last) then
  return {tostring(now), {}, {}, {}, holder}
end
redis.call('HSET', KEYS[3], me, ident)
redis.call('HSET', KEYS[2], me, tostring(now))
redis.call('HSET', KEYS[4], me, tostring(timeout))
-- Other node names held by this relay (host and root) are its former names: renamed, it holds
-- their agents at once, and the caller moves what their streams hold.
local former, formers = {}, {}
local owners = redis.call('HGETALL', KEYS[3])
for i = 1, #owners, 2 do
  if owners[i] ~= me and owners[i + 1] == ident then
    former[owners[i]] = true
    table.insert(formers, owners[i])
  end
end
local mine, owner_of, conflicts = {}, {}, {}
for i = 4, #ARGV do mine[ARGV[i]] = true end
local current = redis.call('HGETALL', KEYS[1])
for i = 1, #current, 2 do owner_of[current[i]] = current[i + 1] end
for name, _ in pairs(mine) do
  local owner = owner_of[name]
  local seen = owner and tonumber(redis.call('HGET', KEYS[2], owner) or '0') or 0
  if owner and owner ~= me and not former[owner] and alive(owner, seen) then
    table.insert(conflicts, name)
    table.insert(conflicts, owner)
  elseif owner ~= me then
    redis.call('HSET', KEYS[1], name, me)
    owner_of[name] = me
  end
end
for name, owner in pairs(owner_of) do
  if (owner == me or former[owner]) and not mine[name] then
    redis.call('HDEL', KEYS[1], name)
    owner_of[name] = nil
  end
end
local out = {}
for name, owner in pairs(owner_of) do
  table.insert(out, name)
  table.insert(out, owner)
end
return {tostring(now), conflicts, out, redis.call('HGETALL', KEYS[2]), formers}
"""

# The entries of a former name's stream (KEYS[1]) moved into this node's (KEYS[2]), marked so
# that the receiver looks for each in the inboxes first; one that cannot be added again is
# replaced by a stub the receiver refuses with its reason.
MOVE = """
local entries = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', tonumber(ARGV[1]))
for _, e in ipairs(entries) do
  local f = e[2]
  table.insert(f, 'moved')
  table.insert(f, e[1])
  if not pcall(function() redis.call('XADD', KEYS[2], '*', unpack(f)) end) then
    redis.call('XADD', KEYS[2], '*', 'moved', e[1])
  end
  redis.call('XDEL', KEYS[1], e[1])
end
if redis.call('XLEN', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[1])
end
return #entries
"""


def redis_module():
    """The `redis` package, or FederationError saying which extra to install."""
    try:
        import redis
    except ImportError:
        raise FederationError(EXTRA) from None
    return redis


def connect(federation, timeout=SOCKET_TIMEOUT):
    """A client of the team's server. Commands fail fast (no hidden retries): the callers back
    off themselves."""
    redis = redis_module()
    return redis.Redis.from_url(federation.url, socket_timeout=timeout,
                                socket_connect_timeout=min(timeout, CONNECT_TIMEOUT), retry=None,
                                retry_on_timeout=False, client_name=f"relay-{federation.node}")


def reason(error):
    """One line for a Redis error (the URL's password never shows: redis-py does not print it)."""
    text = " ".join(str(error).split()) or type(error).__name__
    return f"{type(error).__name__}: {text}"[:300]


def _pairs(flat):
    flat = [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in flat]
    return list(zip(flat[::2], flat[1::2]))


def _seconds(text):
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


class Link:
    """The federation of one relay: publisher (with the directory) and receiver, each driven by
    a step (`heartbeat`, `publish`, `incoming.step`) that tests call with `now`, and run on
    threads of their own by `start()` in the daemon."""

    def __init__(self, config, clock=time.time, router=None, on_directory=None, hooks=None):
        self.config = config
        self.fed = config.federation
        self.node = self.fed.node
        self.clock = clock
        self.redis = redis_module()
        self.router = router
        self.queued = router.queued if router is not None else threading.Event()
        if router is not None:
            router.linked = True                # offers are taken here (publish_offered)
        self.early = {}                         # (message id, node) -> entry id published from an offer
        self.on_directory = on_directory        # called when the directory changed
        self.layout = Layout(config.root, config.state_dir).create()
        # What the publisher records (entry ids, retries, the directory, the link's state) need not
        # survive a power cut: lost, a row is published again and the receiver knows the repeat.
        # Not syncing it keeps its commits from holding the write lock over an fsync the loop waits for.
        self.ledger = Ledger(self.layout.ledger, durability="normal")
        self.history = History(self.ledger)
        self.client = connect(self.fed)
        # on_deliver runs for a received message as for a local one: the relay's hooks in the
        # daemon (one queue and one limit), else hooks of the link's own (run --once).
        self.own_hooks = hooks is None
        self.hooks = Hooks(config) if hooks is None else hooks
        self.incoming = Incoming(config, connect(self.fed), clock=clock, hooks=self.hooks)
        self._claim = self.client.register_script(CLAIM)
        self._move = self.client.register_script(MOVE)
        self.identity = f"{socket.gethostname()}:{config.root}"     # which relay holds the node name
        self.connected = None
        self.conflicts = []
        self.duplicate = None                   # why this relay may not act as its node (another holds the name)
        self.directory = {}
        self.next_heartbeat = 0.0
        self.stopping = threading.Event()
        self.back = threading.Event()           # set when the server is back (ends the receiver's backoff)
        self.threads = []

    def close(self):
        self.stop()
        if self.own_hooks:
            self.hooks.stop()
        self.incoming.close()
        self.client.close()
        self.ledger.close()
        self.layout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- the state of the link --------------------------------------------------------------

    def _up(self, now):
        if self.connected is not True and not self.duplicate:
            log.info("federation: connected to %s as node %s of team %s", self.fed.shown_url, self.node, self.fed.team)
            self.ledger.link_state(now, self.node, True)
            if self.connected is False:
                self.ledger.publish_now(now)    # what waited for the server goes now
            self.back.set()                     # and the receiver reads now, not after its wait
            self.connected = True

    def _down(self, now, error):
        if self.connected is not False:
            log.error("federation: the server %s cannot be used (%s); messages for other nodes wait and are "
                      "retried", self.fed.shown_url, reason(error))
            self.ledger.link_state(now, self.node, False, reason(error))
            self.connected = False

    # -- the directory ----------------------------------------------------------------------

    def heartbeat(self, now=None):
        """Claim this node's agents, stamp its last seen, record the team's directory."""
        now = self.clock() if now is None else now
        self.next_heartbeat = now + self.fed.heartbeat
        self.layout.fs.forget()
        local = sorted(self.layout.agent_names(self.config.agents))
        timeout = self.fed.heartbeat * NODE_TIMEOUT_BEATS
        try:
            keys = [self.fed.prefix + k for k in ("agents", "nodes", "owners", "timeouts")]
            reply = self._claim(keys=keys, args=[self.node, timeout, self.identity, *local])
        except self.redis.RedisError as e:
            self._down(now, e)
            return False
        _, conflicts, directory, nodes = reply[:4]
        if not isinstance(reply[4], list):      # another relay runs under this node name: its stream is not ours
            holder = reply[4].decode("utf-8", "replace")
            why = (f"node name {self.node} is in use by another relay ({holder}); this one neither claims its "
                   f"agents nor reads the node's stream until that one has been gone for {timeout:.0f}s: set another "
                   "`node` in [federation]")
            if self.duplicate != why:
                log.error("federation: %s", why)
                self.ledger.link_state(now, self.node, False, why)
            self.incoming.paused = self.duplicate = why
            self.connected = False
            return False
        self.incoming.paused = self.duplicate = None
        # What the server holds is read like any input: names that are not agent (or node) names,
        # and times that are not numbers, are left out.
        seen = {n: _seconds(t) for n, t in _pairs(nodes) if NAME.match(n)}
        directory = {a: n for a, n in _pairs(directory) if valid_agent(a) and a != SYSTEM and NAME.match(n)}
        self._keep_lost(directory, seen, _seconds(reply[0]), timeout)
        conflicts = _pairs(conflicts)
        if conflicts != self.conflicts:
            for name, other in conflicts:
                log.error("federation: agent %s is on node %s too; this node (%s) keeps it local and the team "
                          "routes it to %s: rename one of them", name, other, self.node, other)
            self.conflicts = conflicts
        remote = sorted((name, node, seen.get(node)) for name, node in directory.items() if node != self.node)
        self.ledger.directory(now, self.node, remote, [list(c) for c in conflicts])
        self._up(now)
        self.take_over([n.decode("utf-8", "replace") for n in reply[4]])
        changed = directory != self.directory
        self.directory = directory
        if changed and self.on_directory is not None:
            self.on_directory()
        return True

    def _keep_lost(self, directory, seen, now, timeout):
        """A node the server no longer knows at all (it lost its data: restarted without AOF, an
        empty new server) keeps its agents in this node's directory until it would have timed
        out, so that messages to them wait for it to announce itself again instead of failing
        as unknown recipients. A name a known node gave up is forgotten at once."""
        if now is None:
            return
        known = set(seen)
        for name, (node, last) in self.history.remote_agents().items():
            if (name not in directory and node not in known and node != self.node and isinstance(last, (int, float))
                    and now - last < timeout):
                directory[name] = node
                seen.setdefault(node, last)

    def take_over(self, formers):
        """Move into this node's stream what was sent to this relay's former node names (a node
        renamed: senders used the old name until their next heartbeat, and while it was stopped)."""
        for old in formers:
            if not NAME.match(old):
                continue
            moved = 0
            try:
                while (n := self._move(keys=[self.fed.stream(old), self.fed.stream(self.node)], args=[BATCH])) > 0:
                    moved += n
            except self.redis.RedisError as e:
                log.error("federation: cannot move the entries sent to node %s (this relay's former name): %s",
                          old, reason(e))
            if moved:
                log.warning("federation: node %s was this relay's name before; its agents are node %s's now, and "
                            "the %d entries sent to it were moved to this node's stream", old, self.node, moved)

    # -- publishing -------------------------------------------------------------------------

    def _xadd(self, entries):
        """XADD each (message id, node, recipients JSON, envelope) in one pipeline; the entry id
        of each, or the error the server answered for that one (a node's stream key holding
        another type, say): one node's broken stream holds back only its own entries."""
        pipe = self.client.pipeline(transaction=False)
        for mid, node, recipients, envelope in entries:
            pipe.xadd(self.fed.stream(node),
                      {"v": "1", "id": mid, "node": self.node, "to": recipients, "env": envelope})
        return [eid if isinstance(eid, Exception) else eid.decode() for eid in pipe.execute(raise_on_error=False)]

    def publish_offered(self, now=None):
        """Publish at once what the loop offered (routes.Router.offer) while it delivers and
        records locally; the entry ids are recorded when the batch's outbound rows are (publish).
        On an error nothing is lost: the rows are published from the ledger."""
        offered = [(mid, node, orjson.dumps(names), envelope)
                   for mid, node, names, envelope in (self.router.take(BATCH) if self.router is not None else [])]
        if not offered:
            return 0
        at = self.clock() if now is None else now
        try:
            ids = self._xadd(offered)
        except self.redis.RedisError as e:
            self._down(at, e)
            return 0
        self.early.update({(mid, node): (eid, at) for (mid, node, _, _), eid in zip(offered, ids, strict=True)
                           if not isinstance(eid, Exception)})      # the others fail from their rows, with why
        if len(self.early) > 100 * BATCH:      # offers whose rows never came (a batch that failed): forgotten
            self.early = {k: v for k, v in self.early.items() if at - v[1] < 600}
        return len(offered)

    def publish(self, now=None):
        """Publish the outbound rows due now (one pipeline; those published from an offer are
        not sent again), record their entry ids. Returns the number recorded."""
        now = self.clock() if now is None else now
        while self.publish_offered(now) >= BATCH:
            pass
        rows = self.history.outbound_due(now, BATCH, self.config.batch_bytes // HELD)
        if not rows:
            return 0
        early, rest = [], []
        for r in rows:
            hit = self.early.pop((r["message_id"], r["node"]), None)
            if hit is None:
                rest.append(r)
            else:
                early.append((r, hit[0]))
        try:
            entries = [(r["message_id"], r["node"], r["recipients"], r["envelope"]) for r in rest]
            ids = self._xadd(entries) if entries else []
        except self.redis.RedisError as e:
            self._down(now, e)
            ids, failed = [e] * len(rest), True
        else:
            failed = False
        refused = {}        # reason -> rows the server did not take
        for r, eid in zip(rest, ids, strict=True):
            if isinstance(eid, Exception):
                refused.setdefault(reason(eid), []).append(r)
        for why, rows in refused.items():
            if not failed and any(r["attempts"] == 0 for r in rows):    # logged once, then retried quietly
                log.error("federation: %s not published to node %s: %s; retrying", len(rows),
                          ", ".join(sorted({r["node"] for r in rows})), why)
            self.ledger.publish_failed(now, [(r["message_id"], r["node"], r["attempts"],
                                              now + backoff(RETRY_BASE, r["attempts"], RETRY_CAP)) for r in rows], why)
        done = [(r["message_id"], r["node"], eid) for r, eid in early + list(zip(rest, ids, strict=True))
                if not isinstance(eid, Exception)]
        if not done:
            return 0
        self.ledger.published(now, done)
        for mid, node, eid in done:
            log.info("%s published to node %s as entry %s", mid, node, eid)
        if not failed:
            self._up(now)
        return len(done)

    # -- the threads ------------------------------------------------------------------------

    def start(self):
        """The publisher and the receiver, each on its own thread, until stop()."""
        self.stopping.clear()
        self.threads = [threading.Thread(target=self._guarded, args=(serve,), name=name, daemon=True)
                        for serve, name in ((self._serve_out, "relay-link-out"), (self._serve_in, "relay-link-in"))]
        for t in self.threads:
            t.start()

    def stop(self):
        self.stopping.set()
        self.queued.set()
        self.back.set()
        for t in self.threads:
            t.join(timeout=SOCKET_TIMEOUT + 1)
        self.threads = []

    def _guarded(self, serve):
        """A thread's loop; an unforeseen error is logged and waited out, never fatal."""
        failures = 0
        while not self.stopping.is_set():
            try:
                serve()
                return
            except Exception:  # noqa: BLE001 - the link must outlive any one bad moment
                log.exception("federation: the %s failed; starting it again", serve.__name__)
                failures += 1
                self.stopping.wait(backoff(RETRY_BASE, failures, RETRY_CAP))

    def _serve_out(self):
        while not self.stopping.is_set():
            self.queued.clear()
            now = self.clock()
            if now >= self.next_heartbeat:
                self.heartbeat(now)
            while self.publish(self.clock()) >= BATCH:
                pass
            due = self.history.next_outbound_due()
            wake = min(self.next_heartbeat, due if due is not None else float("inf"))
            self.queued.wait(max(0.0, min(wake - self.clock(), MAX_WAIT)))

    def _serve_in(self):
        while not self.stopping.is_set():
            if self.incoming.paused:        # until a heartbeat says the node name is this relay's
                self.back.wait(MAX_WAIT)
                self.back.clear()
                continue
            if not self.incoming.step(self.clock(), block_ms=int(MAX_WAIT * 1000)):
                if self.incoming.failures:
                    self.back.wait(self.incoming.pause())     # or until a heartbeat finds the server back
                    self.back.clear()

    def once(self, now=None):
        """One pass for `relay run --once`: the directory, every publish due, every entry waiting.
        Returns (published, received)."""
        now = self.clock() if now is None else now
        self.heartbeat(now)
        published = 0
        while (n := self.publish(now)) > 0:
            published += n
        received = 0
        while (n := self.incoming.step(now)) > 0:
            received += n
        return published, received


def directory(config, timeout=1.0):
    """{agent: node} of the team's agents on other nodes, as the server has it now; {} when it
    cannot be asked (relay send's check of a name this node has not heard of yet)."""
    fed = config.federation
    try:
        client = connect(fed, timeout)
    except FederationError:
        return {}
    redis = redis_module()
    try:
        pairs = client.hgetall(fed.prefix + "agents")
    except redis.RedisError:
        return {}
    finally:
        client.close()
    out = {}
    for name, node in pairs.items():
        name, node = name.decode("utf-8", "replace"), node.decode("utf-8", "replace")
        if valid_agent(name) and name != SYSTEM and NAME.match(node) and node != fed.node:
            out[name] = node
    return out


def probe(config, history, timeout=1.0):
    """What `relay status` shows of the federation: the ledger's side (the daemon's link, what
    waits to be published, what was received) and the server's, asked now (reachable, the
    stream's length, entries not yet read (lag) and read but not acknowledged)."""
    fed = config.federation
    link = history.link()
    out = history.outbound_counts()
    oldest = out.pop("oldest_pending_at")
    doc = {"node": fed.node, "team": fed.team, "url": fed.shown_url,
           "link": {"connected": bool(link["connected"]) if link else None,
                    "since": link["since"] if link else None, "error": link["error"] if link else None},
           "conflicts": orjson.loads(link["conflicts"]) if link and link["conflicts"] else [],
           "outbound": {**out, "oldest_pending_at": oldest}, "received": history.received_counts(),
           "server": {"reachable": False, "error": None, "stream_length": None, "lag": None, "unacknowledged": None}}
    try:
        client = connect(fed, timeout)
    except FederationError as e:
        doc["server"]["error"] = str(e)
        return doc
    redis = redis_module()
    try:
        client.ping()
        doc["server"]["reachable"] = True
        stream = fed.stream(fed.node)
        doc["server"]["stream_length"] = client.xlen(stream)
        groups = client.xinfo_groups(stream) if client.exists(stream) else []
        for g in groups:
            if g["name"] in (b"relay", "relay"):
                doc["server"]["unacknowledged"] = g["pending"]
                doc["server"]["lag"] = g.get("lag")
    except redis.RedisError as e:
        doc["server"]["error"] = reason(e)
    finally:
        client.close()
    return doc
