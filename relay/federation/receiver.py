"""Receiving from the team: the streams addressed to this node, read with a cursor each.

    XREAD of relay:{team}:from:<node>:to:<me> for every node of the team (blocking in the
    daemon), through a client that reads no entry past its size bound (client.py)
      -> each entry checked (read_entry): the sending node is the key's, the sender must be an
         agent the directory gives to that node (never one of this node's own), the recipients
         agents of this node
      -> envelopes written into the local inboxes by the same idempotent Maildir write as local
         deliveries (inbox.py), synced
      -> one ledger transaction: each message a row (from node, entry id, the sender's id) and
         its id kept in received_ids, each refused entry a failed row with its reason
      -> the acknowledgement XADDed to relay:{team}:from:<me>:ack:<node>: delivered, or refused
         with why, naming the entry (the sender then deletes it; this node writes nothing of another's)

A message id already received (kept past the retention sweep, for REPLAY_WINDOW) is
acknowledged again and not delivered again; an id older than the window is refused. An entry
whose delivery keeps failing is tried again on its own (XRANGE of its id) and never holds back
the entries behind it; after `retry_period` it is refused with the reason. An entry over the
size bound is refused from the size its reply announced (client.sized), never read whole.
"""
import logging

import orjson

from relay.core import flow
from relay.errors import DurabilityError, MessageRefused
from relay.ledger.history import History
from relay.ids import IdGenerator, id_time
from relay.core.inbox import Inbox
from relay.files.layout import Layout, valid_id
from relay.ledger.ledger import Ledger
from relay.files.sync import Syncer
from relay.core.work import backoff
from relay.federation.client import ReplyTooLarge, Skipping, reason, round_trip, server_errors, sized, unread
from relay.federation.entries import _sender_of, _text, read_entry, renamed
from relay.federation.keys import Keys
from relay.federation.teamlists import TeamLists
from relay.federation.listed import Listed
from relay.federation.refusals import HOLD, Refusals
from relay.federation.sendercheck import UNANNOUNCED, SenderCheck

log = logging.getLogger(__name__)

BATCH = 256                 # entries per read at most ...
FIRST_READ = 8              # ... and at first, doubled each read while entries are small (batch_bytes)
HELD = 4                    # bytes held in memory per byte of an entry read (parsed, written again)
RETRY_BASE = 0.5            # seconds before an entry not yet delivered is tried again, doubled ...
RETRY_CAP = 1.0             # ... at most this while the server answers
REPLAY_WINDOW = 30 * 86400.0    # received ids are kept this long; an entry with an older id is refused
AHEAD = 86400.0             # ... and one with an id dated further ahead than this (clocks differ, not by days)
ACK_KEEP = 10_000           # acknowledgement entries kept in this node's stream to a sender (each holds a batch's)
REPEAT = "repeat"           # the verdict on a message received before


class Incoming:
    """The receiving half of the link, with its own ledger connection, confined file system and
    syncer (it runs on its own thread beside the relay's loop). `nodes()` gives the team's
    nodes and `routes()` the directory as last resolved ({agent: node}, and the set of names in
    conflict); `on_name()` asks for the directory to be read again now."""

    def __init__(self, config, client, clock, hooks=None, nodes=None, routes=None, on_name=None):
        self.config = config
        self.fed = config.federation
        self.keys = Keys(self.fed.team)
        self.node = self.fed.node
        self.client = client
        self.clock = clock
        self.hooks = hooks          # on_deliver, queued once a delivery is recorded (hooks.py)
        self.nodes = nodes or (lambda: [])
        self.routes = routes or (lambda: ({}, set()))
        self.on_name = on_name or (lambda: None)
        import redis
        self.redis = redis
        self.errors = server_errors()
        self.layout = Layout(config.root, config.state_dir).create()
        self.syncer = Syncer(config.durability, self.layout.fs)
        self.inbox = Inbox(self.layout, self.syncer)
        self.ledger = Ledger(self.layout.ledger, durability=config.durability)
        self.history = History(self.ledger)
        self.ids = IdGenerator()
        self.flow = flow.FlowControl(self.layout, self.history, self.inbox)     # this node's own limits
        self.cursors = {}           # node -> the last entry id read from its stream to this node
        self.epoch = 0              # counts the resets: a read made before one moves no cursor
        self.failures = 0           # steps failed in a row (the server)
        self.paused = None          # why this node's streams are not read now (another relay holds the name)
        self.retry = {}             # (node, entry id) -> (first failure, next try): read again on their own
        self.count = FIRST_READ     # entries the next read asks for (_fit)
        self.acks = {}              # node -> [[message id, refusal or None]] to acknowledge
        self.handled = {}           # node -> entry ids those acknowledgements are for
        self.last_error = None
        self.skipping = Skipping("message")
        self.refusals = Refusals()  # how many of each node's entries were refused, and whose stream waits
        self.bulky = set()          # streams read entry by entry (one held an entry too large to read)
        self.rest = 0.0             # seconds until a stream may be read, when the last step could read none
        self.team = TeamLists(client, self.keys, self.fed.max_agents_per_node, self.nodes, clock, self.on_name)
        self.listed = Listed(client, self.keys, self.fed.max_agents_per_node)     # what a node's entry lists now
        self.senders = SenderCheck(self.node, self.routes, self.listed, self.team)    # who may send through a stream

    def close(self):
        try:
            self.acknowledge()
        except self.errors:
            pass                    # the sender publishes them again, and they are known
        self.client.close()
        self.ledger.close()
        self.syncer.close()
        self.layout.close()

    def pause(self):
        return backoff(RETRY_BASE, self.failures - 1, RETRY_CAP)

    def reset(self):
        """Read every stream from its start again (a server restarted without its data, or a
        failover: entry ids may have gone back). What was delivered is known by its id. Called
        from the publisher's thread: a read in flight then moves no cursor (its epoch is old)."""
        self.epoch += 1
        self.cursors = {}

    def step(self, now, block_ms=None):
        """Acknowledge what was handled, retry what is due, then read and handle what waits
        (waiting up to `block_ms` for it). Returns the number of entries handled."""
        if self.paused:
            return 0
        handled = 0
        try:
            handled += self._retry(now)
            team = {self.keys.messages(n, self.node): n for n in sorted(self.nodes()) if n != self.node}
            streams = {key: self.cursors.get(n, "0-0") for key, n in team.items() if self.refusals.readable(n, now)}
            streams = self.skipping.usable(self.client, streams, now)
            self.rest = 0.0
            if not streams:
                ready = [max(self.refusals.until(n), self.skipping.until.get(key, (0.0, None))[0])
                         for key, n in team.items()]
                self.rest = min(max(0.0, min(ready, default=now) - now), HOLD)
                return handled
            epoch = self.epoch
            try:
                entries = self._read(streams, block_ms)
            except self.redis.ResponseError as e:
                if not self.skipping.found(self.client, streams, now, e):
                    raise
                return handled      # the next step reads the others
            handled += self.handle(entries, self.clock() if block_ms else now, again=self.epoch != epoch)
            if block_ms is None:
                self.acknowledge()
        except self.errors as e:
            self._failed(e)
            self.reset()            # what was read and not handled is read again (thoroughly)
            return handled
        except BaseException:
            self.reset()
            raise
        if self.failures:
            log.info("federation: reading this node's streams again")
        self.failures = 0
        self.last_error = None
        return handled

    def _failed(self, error):
        why = reason(error)
        if why != self.last_error:
            log.error("federation: cannot read the streams to this node: %s; trying again", why)
        self.last_error = why
        self.failures += 1

    def _read(self, streams, block_ms):
        """[(node, entry id, fields)] read after the cursors: the bulky streams (one found with an
        entry too large to read) entry by entry, the others in one XREAD (_batch)."""
        bulky = {key: cursor for key, cursor in streams.items() if key in self.bulky}
        plain = {key: cursor for key, cursor in streams.items() if key not in self.bulky}
        out = self._one_by_one(bulky)
        if plain:
            out += self._batch(plain, None if out else block_ms)
        else:
            self.acknowledge()      # (with a read of the others otherwise)
        return out

    def _batch(self, streams, block_ms):
        """The entries after the cursors, in one round trip with the acknowledgements of what
        was handled before (the server syncs its log once for both). A reply with an entry over
        a bound (its size, its fields) makes that entry's stream bulky: it is read entry by
        entry until a read reaches its end, so the server builds each such entry once, and each
        is refused from what its reply announced. A refused acknowledgement never stops the
        read: reading is what frees a server out of memory."""
        commands, nodes = self._acks()
        read = ["XREAD", "COUNT", self.count]
        if block_ms is not None:
            read += ["BLOCK", block_ms]
        commands.append((*read, "STREAMS", *streams, *streams.values()))
        try:
            results = round_trip(self.client, commands)
        except ReplyTooLarge as e:
            if e.key not in streams:
                return self._read_sized(streams)
            self.bulky.add(e.key)
            rest = {key: cursor for key, cursor in streams.items() if key != e.key}
            return self._one_by_one({e.key: streams[e.key]}) + (self._batch(rest, None) if rest else [])
        try:
            self._acked(nodes, results[:-1])
        except self.errors as e:
            self._failed(e)
        reply = results[-1]
        if isinstance(reply, Exception):
            raise reply
        out = []
        for key, entries in reply or []:
            node = self._node_of(key)
            for eid, fields in entries:
                if isinstance(fields, list):        # as the server sent it: name, value, name, value ...
                    fields = dict(zip(fields[::2], fields[1::2]))
                out.append((node, eid.decode() if isinstance(eid, bytes) else eid, fields))
        self._fit(out)
        return out

    def _node_of(self, key):
        key = key.decode() if isinstance(key, bytes) else key
        return key[len(self.keys.prefix + "from:"):].split(":to:", 1)[0]

    def _one_by_one(self, streams):
        """The next FIRST_READ entries of each bulky stream, one by one; a stream whose end is
        read is read with the others again."""
        out = []
        for key, cursor in streams.items():
            got = sized(self.client, key, cursor, FIRST_READ)
            if len(got) < FIRST_READ:
                self.bulky.discard(key)
            node = self._node_of(key)
            out.extend((node, eid, fields) for eid, fields in got)
        return out

    def _read_sized(self, streams):
        """After a reply too large to read whose stream is not known: each stream's next entries
        one by one, those within the bound read, the others refused from the size their reply
        announced."""
        self.count = 1
        return self._one_by_one(streams)

    def _retry(self, now):
        """Entries whose delivery failed before, read again on their own when due."""
        due = [(node, eid) for (node, eid), (_, at) in self.retry.items() if at <= now]
        if not due:
            return 0
        entries = []
        for node, eid in due:
            try:
                got = self.client.xrange(self.keys.messages(node, self.node), eid, eid)
            except ReplyTooLarge as e:
                got = [(eid, unread(e))]
            if not got:             # gone: its sender deleted or republished it
                self.retry.pop((node, eid), None)
                continue
            entries.extend((node, eid, fields) for _, fields in got)
        return self.handle(entries, now, again=True)

    def acknowledge(self):
        """XADD the acknowledgements of what was handled (recorded in the ledger). One lost (a
        crash, the server away) only makes the sender publish again, which this node knows."""
        if self.acks:
            commands, nodes = self._acks()
            self._acked(nodes, round_trip(self.client, commands))

    def _acks(self):
        """The XADD of every acknowledgement waiting, and their nodes."""
        nodes = sorted(self.acks)
        return [("XADD", self.keys.acks(self.node, node), "MAXLEN", "~", ACK_KEEP, "*",
                 "acks", orjson.dumps(self.acks[node])) for node in nodes], nodes

    def _acked(self, nodes, results):
        """What the server answered to the acknowledgements (RedisError when one was refused)."""
        full = []
        for node, result in zip(nodes, results, strict=True):
            if not isinstance(result, Exception):
                del self.acks[node]
                self.handled.pop(node, None)
            elif isinstance(result, self.redis.exceptions.OutOfMemoryError):
                full.append(node)
        if full:
            # The server is out of memory: what was handled is deleted from the senders' streams
            # (XDEL needs no memory), which frees it; their senders publish again once it takes
            # writes, and the repeats are acknowledged then.
            pipe = self.client.pipeline(transaction=False)
            for node in full:
                if self.handled.get(node):
                    pipe.xdel(self.keys.messages(node, self.node), *self.handled[node])
            pipe.execute(raise_on_error=False)
        if self.acks:
            raise next(r for r in results if isinstance(r, Exception))

    def _fit(self, entries):
        """The next read's size: doubled up to BATCH while the largest entry read, times what
        handling one holds in memory, fits batch_bytes that many times; fewer otherwise."""
        if not entries:
            return
        largest = max(sum(len(k) + len(v) for k, v in f.items()) if f else 0 for _, _, f in entries)
        fits = self.config.batch_bytes // max(1, HELD * largest)
        self.count = max(1, min(BATCH, 2 * self.count, fits))

    # -- one batch --------------------------------------------------------------------------

    def handle(self, entries, now, again=False):
        """Deliver, record and acknowledge a batch of (node, entry id, fields); return how many
        were handled. `again`: entries read out of order (a retry, or a read the streams were
        reset under), which move no cursor."""
        if not entries:
            return 0
        self.layout.fs.recheck()    # each directory looked up again by name: one may have been swapped since
        local = self.layout.agent_names(self.config.agents)
        self.senders.batch(entries, local)
        works, refused, repeats = self._sort(entries, now, again, local)
        for node, mid, eid, failed in repeats:
            self._ack(node, mid, failed, eid)
        self._record(works, refused, now)
        return len(entries)

    def _sort(self, entries, now, again, local):
        """The batch's entries checked, each one to deliver (work, item), refused (a failed row's
        values, acknowledged already), or a repeat (node, id, entry id, its first refusal) to
        acknowledge again; an entry whose sender its node has not announced yet waits."""
        works, refused, seen, repeats = [], [], {}, []      # seen: (node, id) -> sha256 of the original, in this read
        named = [(node, _text(f.get(b"id"))) for node, _, f in entries if isinstance(f, dict)]
        ids = [i for _, i in named]
        before = self.history.remote.received_before([(n, i) for n, i in named if i and valid_id(i)])
        known = set(ids) - self.history.unknown([i for i in ids if i])     # ids this ledger holds already
        used = set()                # ids the messages of this read keep here
        # An entry read for the first time since this node started reading its stream (or since
        # a reset), or read again, may have been written into an inbox by a run a crash cut
        # short: it is looked for there first. One read after the cursor never was.
        fresh = {node for node, _, _ in entries if again or node not in self.cursors}
        for node, eid, fields in entries:
            if not again:
                self.cursors[node] = eid
            read = self._checked(node, eid, fields, local, now, before, refused)
            if read is None:
                continue
            w, item = read
            w.earlier_attempt = node in fresh
            verdict = self._verdict(w, node, before.get((node, w.id)), seen)
            if verdict is None and (w.id in known or w.id in used or self._held_here(w, now)):
                # Its id names another message here (a local one, another node's, one a recipient
                # holds): delivered under an id of this node's, its sender's id kept beside it.
                renamed(w, item, self.ids.new(now))
            if verdict == REPEAT:
                # Its first handling's answer again: a refusal (shed, given up) whose acknowledgement
                # was lost is not taken for a delivery the second time.
                failed = (before.get((node, w.id)) or (None, None, None))[2]
                log.info("%s from node %s (entry %s) was received before: acknowledged again%s, not delivered again",
                         w.id, node, eid, " (refused, as then)" if failed else "")
                repeats.append((node, w.id, eid, failed))
                continue
            if verdict is not None:
                if self.refusals.recorded(node, now):
                    refused.append((self.ids.new(now), item["sender"], item["name"], node, eid, verdict))
                    log.error("federation: entry %s from node %s refused: %s", eid, node, verdict)
                self._ack(node, w.id, verdict, eid)
                continue
            seen[(node, item.get("remote_id") or w.id)] = w.sha256
            used.add(w.id)
            works.append((w, item))
        return works, refused, repeats

    def _checked(self, node, eid, fields, local, now, before, refused):
        """The entry read (read_entry) as (work, item) when its sender may speak through `node`'s
        stream and its id is within the replay window; None when it waits for the next read of
        the team's lists, or is refused (a failed row's values appended to `refused`, acknowledged)."""
        try:
            w, item = read_entry(node, eid, fields, local, self.config)
            why = self.senders.why_not(w.sender, node, local)
            since = self.retry.get((node, eid), (now,))[0]
            if why and why.endswith(UNANNOUNCED) and self.team.waits(since):
                self.retry[(node, eid)] = (since, self.team.next_read)    # the next read of the lists decides
                return None
            if why:
                raise MessageRefused(why)
            if id_time(w.id) - now > AHEAD:
                raise MessageRefused(f"message id {w.id} is dated {(id_time(w.id) - now) / 86400:.0f} days ahead of this "
                                     "node's clock; refused")
            if now - id_time(w.id) > REPLAY_WINDOW and (node, w.id) not in before:
                raise MessageRefused(f"message id {w.id} is older than the replay window "
                                     f"({REPLAY_WINDOW / 86400:.0f} days); refused")
            return w, item
        except Exception as e:  # noqa: BLE001 - whatever an entry holds, it is refused, never fatal
            if not isinstance(e, MessageRefused):
                e = MessageRefused(f"unreadable entry ({type(e).__name__}: {str(e)[:200]})")
            mid = _text(fields.get(b"id")) if isinstance(fields, dict) else None
            sender = _sender_of(fields)
            if self.refusals.recorded(node, now):
                refused.append((self.ids.new(now), sender or "?", f"entry {eid}", node, eid, str(e)))
                log.error("federation: entry %s from node %s refused: %s", eid, node, e)
            self._ack(node, mid, str(e), eid)
            return None

    def _record(self, works, refused, now):
        """This node's limits, the deliveries, then one ledger transaction for what was delivered,
        refused or given up, and the acknowledgements of each."""
        works, shed = self._admit(works, now)
        done, gave_up = self._deliver(works, now)
        failed = [dict(item, delivered=w.delivered_now, error=why) for w, item, why in gave_up + shed]
        sheds = [(w.id, r, w.sender, s.reason, s.limit, s.observed) for w, _, *_ in done + shed for r, s in w.shed.items()]
        if done or refused or failed:
            self.ledger.remote.received(now, [dict(item, delivered=w.delivered_now) for w, item in done], refused, sheds, failed)
            self.flow.commit([w for w, _ in done], now, self.config)
            if self.hooks is not None:
                self.hooks.delivered([w for w, _ in done] + [w for w, _, _ in gave_up])
            for w, item in done:
                log.info("%s received from %s on node %s (entry %s), delivered to %s", w.id, item["sender"],
                         item["node"], item["entry_id"], ",".join(sorted(w.delivered_now)))
                flow.logged(w)
        for w, item in done:
            self._ack(item["node"], item.get("remote_id") or w.id, None, item["entry_id"])
        for m in failed:
            self._ack(m["node"], m.get("remote_id") or m["id"], m["error"], m["entry_id"])

    def _ack(self, node, mid, refusal, eid):
        self.retry.pop((node, eid), None)
        self.handled.setdefault(node, []).append(eid)
        if mid and valid_id(mid):
            self.acks.setdefault(node, []).append([mid, eid, refusal[:500] if refusal else None])

    def _verdict(self, w, node, before, seen):
        """REPEAT for a message this node received before from the same node (the same id and
        original: a publish repeated), None for one to deliver, else why the entry is refused:
        an id its node used before (or in this read) for other content. Ids are each node's own:
        another node's message under the same id is another message."""
        if (node, w.id) in seen:
            if seen[(node, w.id)] == w.sha256:
                return REPEAT
            return f"message id {w.id} came twice from node {node} in one read with other content; refused"
        if before is not None:
            if before[0] == w.sha256:
                return REPEAT
            return f"message id {w.id} was received before from node {node} with other content; refused"
        return None

    def _held_here(self, w, now):
        """Whether a recipient holds an envelope of another message under w's id (one this
        node's ledger no longer lists: swept, so older than retention): never replaced. An id
        younger than that names no message the ledger forgot; it is looked for only when the
        entry may have been written here before (earlier_attempt)."""
        retention = self.config.retention
        if not w.earlier_attempt and (not retention or now - id_time(w.id) < retention - 60):
            return False
        return any(self.inbox.taken(r, w.id, w.sha256, partial_is_ours=w.earlier_attempt) for r in w.recipients)

    def _admit(self, works, now):
        """This node's own shedding limits (flow.py: queue_limit, per_pair_rate, an archived
        recipient) on the messages about to be delivered. Returns the (work, item) to deliver
        (each shed recipient in its `shed`) and the (work, item, reason) shed for every recipient."""
        if not works:
            return works, []
        self.flow.admit([w for w, _ in works], now, self.config, self.history.archived_agents(), {}, senders=False)
        shed = [(w, item, w.refused) for w, item in works if w.refused]
        for w, item, why in shed:
            log.error("%s from node %s: %s", w.id, item["node"], why)
        return [(w, item) for w, item in works if not w.refused], shed

    def _deliver(self, works, now):
        """The Maildir writes, then one sync. Returns the (work, item) delivered to every
        recipient, and the (work, item, reason) given up: an fsync error (never retried into
        success), or a recipient still failing after `retry_period` (a local fault, as for a
        local message). The others are tried again on their own (self.retry), without holding
        back the entries behind them."""
        if not works:
            return [], []
        batch = [w for w, _ in works]
        linked = self.inbox.deliver(batch)     # a few envelopes are fsynced, more by syncfs (sync.py)
        try:
            self.syncer.flush("inbox new/ (received)")
        except DurabilityError as e:
            self.inbox.unlink(linked, e)
        done, gave_up = [], []
        for w, item in works:
            key = (item["node"], item["entry_id"])
            if w.complete:
                done.append((w, item))
                continue
            since, _ = self.retry.get(key, (now, None))
            missed = "; ".join(f"not delivered to {r}: {e}" for r, e in sorted(w.failed_for.items()))
            fsync_failed = any(isinstance(e, DurabilityError) for e in w.failed_for.values())
            if now - since >= self.config.retry_period or fsync_failed:
                why = f"gave up after {now - since:.0f}s: {missed}; delivered to {', '.join(sorted(w.delivered_now)) or 'nobody'}"
                gave_up.append((w, item, why))
                log.error("%s from node %s: %s", w.id, item["node"], why)
            else:
                tries = len(self.retry)
                self.retry[key] = (since, now + backoff(RETRY_BASE, min(tries, 6), 30.0))
                log.warning("%s from node %s: %s; tried again shortly", w.id, item["node"], missed)
        return done, gave_up
