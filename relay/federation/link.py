"""The federation link of one relay: the directory, the publisher and the receiver, each driven by
a step that tests call with `now`, and run on threads of their own by `start()` in the daemon.

    publisher thread: announce (heartbeat, or at once when this node's agents change), look at
      the team's directory (every second, or at once when asked), publish what is due, read the
      acknowledgements, publish again what the server lost or what is late
    receiver thread: read the streams addressed to this node, deliver, acknowledge

Each thread has its own ledger connection and Redis connection, so no local delivery ever
waits for the server. Reading never depends on writing: a server that refuses writes (out of
memory with noeviction) is still read. Errors are logged once per change of condition, then
counted (conditions.py).
"""
import logging
import socket
import threading
import time

from relay.ledger.history import History
from relay.core.hooks import Hooks
from relay.files.layout import Layout
from relay.ledger.ledger import Ledger
from relay.core.work import backoff
from relay.federation.client import SOCKET_TIMEOUT, connect, reason, redis_module, server_errors
from relay.federation.conditions import Condition
from relay.federation.directory import LOOK, Directory
from relay.federation.publisher import ACK_BYTES, BATCH, RETRY_BASE, RETRY_CAP, Publisher
from relay.federation.entries import entry_limit
from relay.federation.keys import RETIRED
from relay.federation.receiver import Incoming

log = logging.getLogger(__name__)

MAX_WAIT = 1.0              # the publisher looks at the ledger at least this often
ACKS_EVERY = 0.1            # the daemon's publisher reads acknowledgements at most this often
REPLAY_SWEEP = 3600.0       # how often received ids older than the replay window are forgotten


class Link:
    def __init__(self, config, clock=time.time, router=None, on_directory=None, hooks=None):
        self.config = config
        self.fed = config.federation
        self.node = self.fed.node
        self.clock = clock
        self.redis = redis_module()
        self.errors = server_errors()
        self.router = router
        self.queued = router.queued if router is not None else threading.Event()
        if router is not None:
            router.linked = True                # offers are taken here (publish_offered)
        self.on_directory = on_directory        # called when the routes changed
        self.layout = Layout(config.root, config.state_dir).create()
        # What the publisher records (entry ids, acknowledgements, the directory, the link's
        # state) need not survive a power cut: lost, a row is published again and the receiver
        # knows the repeat. Not syncing it keeps its commits from holding the write lock over an
        # fsync the loop waits for.
        self.ledger = Ledger(self.layout.ledger, durability="normal")
        self.history = History(self.ledger)
        self.client = connect(self.fed)
        limit = entry_limit(config)
        self.own_hooks = hooks is None
        self.hooks = Hooks(config) if hooks is None else hooks
        self.identity = f"{socket.gethostname()}:{config.root}"     # which relay holds the node name
        listed = self.fed.max_agents_per_node * 70
        self.directory = Directory(self.fed, self.client, self.ledger, self.history, self.identity, self.redis,
                                   reader=connect(self.fed, limit=max(listed, 1 << 16), budget=4 * max(listed, 1 << 16),
                                                  name=f"relay-{self.node}-directory"))
        self.publisher = Publisher(config, self.client, connect(self.fed, limit=ACK_BYTES, name=f"relay-{self.node}-acks"),
                                   self.ledger, self.history, router, self.redis)
        if router is not None:
            router.wire = self.publisher.wire   # the loop writes its offers itself while the link is well
            router.announced = frozenset()      # ... of the senders announced (speakers.py)
        self.incoming = Incoming(config, connect(self.fed, limit=limit, budget=max(limit, config.batch_bytes // 4)),
                                 clock=clock, hooks=self.hooks, nodes=self.known_nodes, routes=self.routes,
                                 on_name=self.look_soon)
        self.connected = None
        self.next_heartbeat = 0.0
        self.next_look = 0.0
        self.next_sweep = 0.0
        self.next_acks = 0.0
        self.local = None                       # this node's agents as last announced
        self.nodes = set()                      # the team's nodes, as last read
        self.alive = {}
        self.down = Condition(log, "federation: the server cannot be used", over="federation: the server is used again")
        self.stopping = threading.Event()
        self.back = threading.Event()           # set when the server is back (ends the receiver's wait)
        self.threads = []

    @property
    def duplicate(self):
        return self.directory.duplicate

    @property
    def conflicts(self):
        return self.directory.conflicts

    def known_nodes(self):
        return self.nodes

    def routes(self):
        return self.directory.routes, {name for name, _ in self.directory.conflicts}

    def look_soon(self):
        self.next_look = 0.0
        self.queued.set()

    def close(self):
        self.stop()
        if self.threads:        # a thread still uses them: closing its ledger under it would crash the process
            return
        if self.own_hooks:
            self.hooks.stop()
        self.incoming.close()
        self.publisher.wire.close()
        self.publisher.acks_client.close()
        self.directory.reader.close()
        self.client.close()
        self.ledger.close()
        self.layout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- the state of the link --------------------------------------------------------------

    def _up(self, now):
        if self.publisher.refusing:
            return                      # connected, but writes are refused: said by down, not flipped
        if self.connected is not True and not self.duplicate:
            log.info("federation: connected to %s as node %s of team %s", self.fed.shown_url, self.node, self.fed.team)
            self.ledger.remote.link_state(now, self.node, True)
            if self.connected is False:
                self.ledger.remote.publish_now(now)    # what waited for the server goes now
            self.down.clear()
            self.back.set()
            self.connected = True

    def _down(self, now, error):
        why = reason(error) if not isinstance(error, str) else error
        self.down.report(why)
        if self.connected is not False:
            self.ledger.remote.link_state(now, self.node, False, why)
            self.connected = False

    # -- the directory ----------------------------------------------------------------------

    def heartbeat(self, now=None):
        """Announce this node's agents (and stamp its last seen), then read the directory."""
        now = self.clock() if now is None else now
        self.next_heartbeat = now + self.fed.heartbeat
        self.layout.fs.forget()
        local = sorted(self.layout.agent_names(self.config.agents))
        try:
            written = self.directory.announce(now, local)
        except self.redis.exceptions.OutOfMemoryError as e:
            self.publisher.refusing = True      # the server answers, and refuses writes: probed at each look
            self.down.report(f"the server refuses writes ({reason(e)}); this node reads on")
            written = None
        except self.errors as e:
            self._down(now, e)          # reading goes on: a server refusing writes is still read
            written = None
        if written is False:
            self.incoming.paused = self.duplicate
            self.ledger.remote.link_state(now, self.node, False, self.duplicate)
            self.connected = False
            return False
        self.incoming.paused = None
        self.local = local if written else self.local
        if written:
            self.publisher.speakers.release(now, local)     # their names claimed: their messages may go
            if self.router is not None:
                self.router.announced = self.publisher.speakers.free()
        looked = self.look(now, local)
        if written and looked:
            self._up(self.clock())       # when it worked, not when the attempt began
        return bool(written and looked)

    def look(self, now=None, local=None):
        """Read the team's directory; tell the loop when the routes changed."""
        now = self.clock() if now is None else now
        self.next_look = now + LOOK
        if local is None:
            self.layout.fs.forget()
            local = sorted(self.layout.agent_names(self.config.agents))
            if self.local is not None and local != self.local:
                return self.heartbeat(now)      # a new or removed agent: announced at once
        if self.publisher.refusing and self.local is not None:
            self._probe_writes(now)
        try:
            changed = self.directory.look(now, set(local))
            self.nodes = set(self.directory.entries) | {n for n, _ in self.history.remote.agents().values()}
            # A node an operator retired is gone for good, whatever its last heartbeat says: what
            # waits for it goes to the node that lists its agents now, without waiting for its timeout.
            self.alive = {n: e.alive(self.directory.server_now, self.directory.timeout) and e.version != RETIRED["v"]
                          for n, e in self.directory.entries.items()}
        except self.errors as e:
            self._down(now, e)
            return False
        if changed and self.on_directory is not None:
            self.on_directory()
        return True

    def _probe_writes(self, now):
        """The server refused writes for want of memory: its announcement, tried again at every
        look, says when it takes them again, and then everything waiting goes at once (not at
        each row's own backoff)."""
        try:
            written = self.directory.announce(now, self.local)
        except self.errors:
            return
        if written:
            self.publisher.refusing = False
            self.ledger.remote.publish_now(now)
            self.queued.set()

    # -- publishing -------------------------------------------------------------------------

    def publish(self, now=None, force=True):
        """Publish what is due, read the acknowledgements (in the daemon at most every
        ACKS_EVERY seconds: reading them is off every message's way). Returns the number of rows
        published."""
        now = self.clock() if now is None else now
        done, error = self.publisher.publish(now)
        speakers = self.publisher.speakers
        if speakers.unheard:            # a sender not announced yet: announced (and claimed) at once
            speakers.unheard = False
            self.look_soon()
        if self.router is not None:     # a loop beside the link writes its offers itself while it is well
            self.router.announced = speakers.free()
            self.publisher.wire.ready(error is None and not self.publisher.refusing and not self.duplicate
                                      and self.connected is True)
        if error is not None:
            self._down(now, error)
            return done
        if now < self.next_acks and not force:
            if self.directory.read_at is not None and not self.duplicate:
                self._up(now)
            return done
        self.next_acks = now + ACKS_EVERY
        try:
            self.publisher.read_acks(now, self.nodes | set(self.history.remote.waiting_nodes()))
            if self.publisher.moved:        # refused by a node whose agents they are no longer
                self.publisher.reroute(now, self.directory.routes, self.alive)
        except self.errors as e:
            self._down(now, e)
            return done
        if self.directory.read_at is not None and not self.duplicate:
            self._up(self.clock())
        return done

    def check(self, now=None):
        """Publish again what the server lost or what is late; reroute what another node holds now."""
        now = self.clock() if now is None else now
        self.publisher.unanswered(now)      # a node not acknowledging, said in the log
        try:
            again = self.publisher.check(now, self.alive)
        except self.errors as e:

            self._down(now, e)
            return 0
        if self.publisher.new_server:
            self.incoming.reset()           # entry ids may have gone back: every stream from its start,
            self.publisher.cursors.clear()  # the acknowledgement streams' too
        self.publisher.reroute(now, self.directory.routes, self.alive)
        if now >= self.next_sweep:
            from relay.federation.receiver import REPLAY_WINDOW
            self.next_sweep = now + REPLAY_SWEEP
            self.ledger.remote.forget_received(now - REPLAY_WINDOW)
        return again

    # -- the threads ------------------------------------------------------------------------

    def start(self):
        """The publisher and the receiver, each on its own thread, until stop()."""
        self.stopping.clear()
        self.threads = [threading.Thread(target=self._guarded, args=(serve,), name=name, daemon=True)
                        for serve, name in ((self._serve_out, "relay-link-out"), (self._serve_in, "relay-link-in"))]
        for t in self.threads:
            t.start()

    def stop(self):
        """Ask the threads to stop and wait for them (each step is bounded: a blocking read
        waits at most a second, a server call at most the socket timeout)."""
        self.stopping.set()
        self.queued.set()
        self.back.set()
        for t in self.threads:
            t.join(timeout=4 * SOCKET_TIMEOUT)
        self.threads = [t for t in self.threads if t.is_alive()]
        if self.threads:
            log.error("federation: %s still running at the stop; its connections are left open",
                      ", ".join(t.name for t in self.threads))

    def _guarded(self, serve):
        """A thread's loop; an unforeseen error is logged and waited out, never fatal."""
        failures = 0
        while not self.stopping.is_set():
            began = time.monotonic()
            try:
                serve()
                return
            except Exception:  # noqa: BLE001 - the link must outlive any one bad moment
                log.exception("federation: the %s failed; starting it again", serve.__name__)
                failures = 1 if time.monotonic() - began > 60 else failures + 1    # a good minute forgives
                self.stopping.wait(backoff(RETRY_BASE, failures, RETRY_CAP))

    def _serve_out(self):
        while not self.stopping.is_set():
            self.queued.clear()
            now = self.clock()
            if self.router is not None and self.router.asked.is_set():
                self.router.asked.clear()
                self.next_look = 0.0
            if now >= self.next_heartbeat:
                self.heartbeat(now)
                self.check(now)
            elif now >= self.next_look:
                self.look(now)
                self.check(now)
            while self.publish(self.clock(), force=False) >= BATCH:
                pass
            self.queued.wait(self.wake(self.clock()))

    def wake(self, now):
        """Seconds the publisher's thread may sleep (at most MAX_WAIT): until its next heartbeat,
        look, publish due, or read of acknowledgements while something waits for one."""
        due = self.history.remote.next_outbound_due()
        waiting = self.publisher.early or self.history.remote.any_unacknowledged()  # published, not acknowledged
        wake = min(self.next_heartbeat, self.next_look, due if due is not None else float("inf"),
                   self.next_acks if waiting else float("inf"))
        return max(0.0, min(wake - now, MAX_WAIT))

    def _serve_in(self):
        while not self.stopping.is_set():
            if self.incoming.paused or not self.nodes:
                self.back.wait(MAX_WAIT)     # until a heartbeat says the node name is this relay's
                self.back.clear()
                continue
            if not self.incoming.step(self.clock(), block_ms=int(MAX_WAIT * 1000)) and \
                    (self.incoming.failures or self.incoming.rest):
                # At most a second while the server answers, or until a stream held back (a node's
                # refusals, a key not a stream) may be read again.
                self.back.wait(self.incoming.pause() if self.incoming.failures else self.incoming.rest)
                self.back.clear()

    def once(self, now=None):
        """One pass for `relay run --once`: the directory, every publish due, every entry waiting,
        the acknowledgements. Returns (published, received)."""
        now = self.clock() if now is None else now
        self.heartbeat(now)
        self.check(now)
        published = 0
        while (n := self.publish(now)) > 0:
            published += n
        received = 0
        while (n := self.incoming.step(now)) > 0:
            received += n
        self.publish(now)
        return published, received


def directory(config, timeout=1.0):
    """{agent: node} of the team's agents on other nodes, as the server has it now; {} when it
    cannot be asked (relay send's check of a name this node has not heard of yet)."""
    from relay.federation.keys import Keys
    import orjson
    from relay.files.layout import valid_agent
    from relay.names import reserved
    fed = config.federation
    try:
        client = connect(fed, timeout, limit=fed.max_agents_per_node * 70)
    except Exception:  # noqa: BLE001 - no server, no package: nothing known
        return {}
    redis = redis_module()
    keys = Keys(fed.team)
    out = {}
    try:
        from relay.federation.roster import registered
        for node in sorted(registered(client, keys)):
            key = keys.node(node)
            if node == fed.node:
                continue
            try:
                names = orjson.loads(client.hget(key, "agents") or b"[]")
            except Exception:  # noqa: BLE001 - a node's entry that cannot be read names nobody
                continue
            for name in names if isinstance(names, list) else []:
                if isinstance(name, str) and valid_agent(name) and not reserved(name):
                    out.setdefault(name, node)
    except redis.RedisError:
        return out
    finally:
        client.close()
    return out


def probe(config, history, timeout=1.0):
    """What `relay status` shows of the federation: the ledger's side (the daemon's link, what
    waits to be published or acknowledged, what was received) and the server's, asked now
    (reachable, the entries waiting in the streams this node sends and receives)."""
    import orjson
    from relay.federation.keys import Keys
    fed = config.federation
    link = history.remote.link()
    out = history.remote.outbound_counts()
    doc = {"node": fed.node, "team": fed.team, "url": fed.shown_url, "ack_warn": fed.ack_timeout,
           "link": {"connected": bool(link["connected"]) if link else None,
                    "since": link["since"] if link else None, "error": link["error"] if link else None},
           "directory": {"read_at": link["directory_at"] if link else None,
                         "error": link["directory_error"] if link else None},
           "conflicts": [], "others_conflicts": [],
           "outbound": out, "received": history.remote.received_counts(),
           "server": {"reachable": False, "error": None, "incoming": None, "asked": fed.url is not None}}
    for name, other, *own in orjson.loads(link["conflicts"]) if link and link["conflicts"] else []:
        # [name, other node, whether the name is this node's own] (before: [name, other], its own)
        doc["conflicts" if not own or own[0] else "others_conflicts"].append([name, other])
    if fed.url is None:
        return doc              # an agent's shell: the daemon's link above says how the server is
    try:
        client = connect(fed, timeout)
    except Exception as e:  # noqa: BLE001 - the status shows why
        doc["server"]["error"] = str(e)
        return doc
    redis = redis_module()
    keys = Keys(fed.team)
    try:
        client.ping()
        doc["server"]["reachable"] = True
        nodes = sorted({n for n, _ in history.remote.agents().values()})
        pipe = client.pipeline(transaction=False)
        for n in nodes:
            pipe.xlen(keys.messages(n, fed.node))
        doc["server"]["incoming"] = sum(x for x in pipe.execute(raise_on_error=False) if isinstance(x, int))
    except redis.RedisError as e:
        doc["server"]["error"] = reason(e)
    finally:
        client.close()
    return doc
