"""Receiving from the team: this node's stream read through a consumer group.

    XREADGROUP (pending entries first after a start or a failed delivery, then new ones)
      -> each entry checked (read_entry): a message for this node's agents, or refused with why
      -> envelopes written into the local inboxes by the same idempotent Maildir write as local
         deliveries (inbox.py), synced
      -> one ledger transaction: each message a row (from node, entry id, the sender's id),
         its deliveries, each refused entry a failed row with its reason
      -> XACK and XDEL of every entry handled: acknowledged only once durable, then trimmed

A message id already received is acknowledged and not delivered again (a publish repeated
after a crash). A malformed entry is recorded and acknowledged with its reason, never retried,
never fatal. An entry is never trusted: the recipients must be this node's agents (checked with
the agent-name rule), the id must be a relay id (it names the inbox file), the body must fit
this node's max_body_bytes, and every write goes through the confined file system (fs.py).
"""
import collections
import datetime
import hashlib
import logging
import re

import orjson

from . import flow
from .config import SYSTEM
from .errors import DurabilityError, MessageRefused
from .fs import shown
from .history import History
from .ids import IdGenerator
from .inbox import Inbox
from .layout import Layout, fit, is_inside, valid_agent, valid_id
from .ledger import Ledger
from .message import CONTROL_KEYS, MAX_RECIPIENTS
from .sync import Syncer
from .work import Work, backoff

log = logging.getLogger(__name__)

GROUP = "relay"
BATCH = 256                 # entries per read at most ...
FIRST_READ = 8              # ... and at first, doubled each read while entries are small (batch_bytes)
HELD = 4                    # bytes held in memory per byte of an entry read (parsed, written again)
RETRY_BASE = 0.5            # seconds before entries not yet delivered are read again, doubled ...
RETRY_CAP = 30.0            # ... at most this
HEX64 = re.compile(r"[0-9a-f]{64}\Z")
NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
REPEAT = "repeat"           # the verdict on a message received before
# What flow control and hooks read of a received message (a local one has its parsed Message).
Remote = collections.namedtuple("Remote", "to kind thread subject")
TEXT_FIELDS = ("kind", "thread", "subject", "sent_at", "relayed_at", "source")


class Incoming:
    """The receiving half of the link, with its own ledger connection, confined file system and
    syncer (it runs on its own thread beside the relay's loop)."""

    def __init__(self, config, client, clock, hooks=None):
        self.config = config
        self.fed = config.federation
        self.client = client
        client.set_response_callback("XAUTOCLAIM", lambda reply, **options: reply)     # _start
        self.clock = clock
        self.hooks = hooks          # on_deliver, queued once a delivery is recorded (hooks.py)
        import redis
        self.redis = redis
        self.layout = Layout(config.root, config.state_dir).create()
        self.syncer = Syncer(config.durability, self.layout.fs)
        self.inbox = Inbox(self.layout, self.syncer)
        self.ledger = Ledger(self.layout.ledger, durability=config.durability)
        self.history = History(self.ledger)
        self.ids = IdGenerator()
        self.flow = flow.FlowControl(self.layout, self.history, self.inbox)     # this node's own limits
        self.stream = self.fed.stream(self.fed.node)
        self.consumer = self.fed.node
        self.ready = False          # the group exists and what others held is claimed
        self.fresh = False          # the group was made now: any entry may have been read by a lost one
        self.recheck_at = 0.0       # when this consumer's pending entries are read again
        self.failures = 0           # steps failed in a row (the server, or a delivery)
        self.paused = "no heartbeat yet"     # why this node's stream is not read now (federation.Link)
        self.unsettled = {}         # id -> when its delivery first failed in this run (tried again thoroughly)
        self.count = FIRST_READ     # entries the next read asks for (_fit)
        self.acks = []              # entry ids handled and recorded, acknowledged with the next read

    def close(self):
        try:
            self.acknowledge()
        except self.redis.RedisError:
            pass                    # they come again at the next start, and are known
        self.client.close()
        self.ledger.close()
        self.syncer.close()
        self.layout.close()

    def pause(self):
        return backoff(RETRY_BASE, self.failures - 1, RETRY_CAP)

    def step(self, now, block_ms=None):
        """Read and handle what waits: this consumer's pending entries when due, then new ones
        (waiting up to `block_ms` for one). Returns the number of entries handled."""
        handled = 0
        if self.paused:
            return 0
        try:
            if not self.ready:
                self._start()
            if now >= self.recheck_at:
                entries, asked = self._read("0")
                handled += self.handle(entries, now)
                if len(entries) < asked and self.recheck_at <= now:
                    self.recheck_at = float("inf")
            entries, asked = self._read(">", block_ms)
            handled += self.handle(entries, self.clock() if block_ms else now, ">")
            if len(entries) < asked:
                self.fresh = False      # every entry the group found at its making is read
            if block_ms is None:
                self.acknowledge()      # a step leaves nothing it handled unacknowledged; the daemon's
                                        # loop sends them with its next read
        except self.redis.RedisError as e:
            if not self.failures:
                log.error("federation: cannot read this node's stream %s: %s; trying again", self.stream, e)
            if "NOGROUP" in str(e):     # the group (or the stream) was deleted, the server lost its data:
                self.ready = False      # made again at the next step
            self.failures += 1
            self.recheck_at = 0.0       # what was read but not acknowledged is read again
            return handled
        except BaseException:
            self.recheck_at = 0.0       # an unforeseen error (the caller logs it): read again from the pending ones
            raise
        if self.failures and self.recheck_at == float("inf"):
            log.info("federation: reading this node's stream again")
        if self.recheck_at == float("inf"):
            self.failures = 0
        return handled

    def _start(self):
        """The group (made with the stream if need be), and every entry another consumer of it
        left unacknowledged (a node renamed, a crash) claimed for this one."""
        try:
            self.client.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
            # A group made now reads the stream from its start: an entry a deleted group had
            # delivered but not acknowledged is looked for in the inboxes first (inbox.held).
            self.fresh = True
        except self.redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise
        cursor = "0-0"
        while True:
            # The ids only (JUSTID; the entries are read later). redis-py's xautoclaim drops the
            # cursor of a JUSTID reply, hence the command itself, its reply as the server sent it.
            reply = self.client.execute_command("XAUTOCLAIM", self.stream, GROUP, self.consumer, 0, cursor,
                                                "COUNT", BATCH, "JUSTID")
            cursor = reply[0]
            if cursor in (b"0-0", "0-0"):
                break
        self.ready = True
        self.recheck_at = 0.0

    def _read(self, since, block_ms=None):
        """(entries, how many were asked for). The acknowledgements of what was handled go in the
        same round trip, ahead of the read: the server syncs its log once for both."""
        asked = self.count
        pipe = self._acks()
        pipe.xreadgroup(GROUP, self.consumer, {self.stream: since}, count=asked, block=block_ms)
        reply = pipe.execute()[-1]
        self.acks = []
        entries = reply[0][1] if reply else []
        self._fit(entries)
        return entries, asked

    def _acks(self):
        """A pipeline holding XACK and XDEL of the entries handled and not yet acknowledged."""
        pipe = self.client.pipeline(transaction=False)       # no MULTI: an ACL user needs no @transaction
        if self.acks:
            pipe.xack(self.stream, GROUP, *self.acks)
            pipe.xdel(self.stream, *self.acks)
        return pipe

    def acknowledge(self):
        """XACK and XDEL now what was handled (recorded in the ledger) since the last read. An
        acknowledgement lost (a crash, the server away) only makes an entry come again, which
        the ledger knows: acknowledged then, not delivered again."""
        if self.acks:
            self._acks().execute()
            self.acks = []

    def _fit(self, entries):
        """The next read's size: doubled up to BATCH while the largest entry read, times what
        handling one holds in memory, fits batch_bytes that many times; fewer otherwise. (A read
        of 256 entries of 1 MiB held 800 MB; one that kills the process is read again at the
        start, which begins with FIRST_READ.)"""
        if not entries:
            return
        largest = max(sum(len(k) + len(v) for k, v in f.items()) if f else 0 for _, f in entries)
        fits = self.config.batch_bytes // max(1, HELD * largest)
        self.count = max(1, min(BATCH, 2 * self.count, fits))

    # -- one batch --------------------------------------------------------------------------

    def handle(self, entries, now, since="0"):
        """Deliver, record and acknowledge a batch of entries ("0": read before, from this
        consumer's pending ones); return how many were handled."""
        if not entries:
            return 0
        self.layout.fs.forget()     # walk from the top again: a directory may have been swapped since
        local = self.layout.agent_names(self.config.agents)
        acks, works, refused, seen = [], [], [], {}      # seen: id -> sha256 of the original, in this read
        ids = [_text(f.get(b"id")) for _, f in entries if f]
        known = set(ids) - self.history.unknown([i for i in ids if i])     # ids this ledger holds already
        for eid, fields in entries:
            eid = eid.decode() if isinstance(eid, bytes) else eid
            if not fields:                  # trimmed meanwhile: nothing to deliver
                acks.append(eid)
                continue
            try:
                w, item = read_entry(eid, fields, local, self.config)
            except Exception as e:  # noqa: BLE001 - whatever an entry holds, it is refused, never fatal
                if not isinstance(e, MessageRefused):
                    e = MessageRefused(f"unreadable entry ({type(e).__name__}: {str(e)[:200]})")
                node = shown(_text(fields.get(b"node")) or "?")[:64]
                refused.append((self.ids.new(now), "?", f"entry {eid}", node, eid, str(e)))
                log.error("federation: entry %s from node %s refused: %s", eid, node, e)
                acks.append(eid)
                continue
            # A first reading of an entry writes at once; one read before, or a message whose
            # delivery failed in this run, is looked for in the inboxes first (inbox.held).
            moved = b"moved" in fields or "moved" in fields        # from a former name's stream: read there before?
            w.thorough = since == "0" or self.fresh or moved or w.id in self.unsettled
            verdict = self._verdict(w, self.history.get(w.id) if w.id in known else None, seen)
            if verdict == REPEAT:
                log.info("%s from node %s (entry %s) was received before: acknowledged, not delivered again",
                         w.id, item["node"], eid)
                acks.append(eid)
                continue
            if verdict is not None:
                refused.append((self.ids.new(now), item["sender"], item["name"], item["node"], eid, verdict))
                log.error("federation: entry %s from node %s refused: %s", eid, item["node"], verdict)
                acks.append(eid)
                continue
            seen[w.id] = w.sha256
            works.append((w, item))
        works, shed = self._admit(works, now)
        done, gave_up = self._deliver(works, now)
        failed = [dict(item, got=w.got, error=why) for w, item, why in gave_up + shed]
        acks += [item["entry_id"] for _, item in done] + [m["entry_id"] for m in failed]
        sheds = [(w.id, r, w.sender, s.reason, s.limit, s.observed) for w, _, *_ in done + shed for r, s in w.shed.items()]
        if done or refused or failed:
            self.ledger.received(now, [dict(item, got=w.got) for w, item in done], refused, sheds, failed)
            self.flow.commit([w for w, _ in done], now, self.config)
            if self.hooks is not None:
                self.hooks.delivered([w for w, _ in done] + [w for w, _, _ in gave_up])
            for w, item in done:
                log.info("%s received from %s on node %s (entry %s), delivered to %s", w.id, item["sender"],
                         item["node"], item["entry_id"], ",".join(sorted(w.got)))
                flow.logged(w)
        self.acks += acks           # recorded: acknowledged and trimmed with the next read (or acknowledge())
        if len(done) + len(gave_up) < len(works):
            self.failures += 1
            self.recheck_at = now + self.pause()
        return len(entries)

    def _verdict(self, w, row, seen):
        """REPEAT for a message received before (a publish repeated after a crash: the same id
        and original), None for one to deliver, else why the entry is refused: an id this node
        knows for another message (a local one, another node's, another original), or one a
        recipient holds for another message (the ledger forgot it at the retention sweep)."""
        first = seen.get(w.id, row["sha256"] if row is not None and row["node"] is not None else None)
        if w.id in seen or (row is not None and row["node"] is not None and row["status"] == "archived"):
            if first == w.sha256:
                return REPEAT
            where = "came twice in one read" if w.id in seen else f"was received before from node {row['node']}"
            return f"message id {w.id} {where} with other content (sha256 of the original); refused"
        if row is not None:
            return f"message id {w.id} is already a message of this node; refused"
        for r in w.recipients:
            if self.inbox.taken(r, w.id, w.sha256, partial_is_ours=w.thorough):
                return (f"message id {w.id} is held by another message in the inbox of {r} (one this node's "
                        "ledger no longer lists); refused, so that it is not replaced")
        return None

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
        local message). The others are read again later (their entries stay pending)."""
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
            if w.complete:
                done.append((w, item))
                self.unsettled.pop(w.id, None)
                continue
            since = self.unsettled.setdefault(w.id, now)
            missed = "; ".join(f"not delivered to {r}: {e}" for r, e in sorted(w.missed.items()))
            fsync_failed = any(isinstance(e, DurabilityError) for e in w.missed.values())
            if now - since >= self.config.retry_period or fsync_failed:
                why = f"gave up after {now - since:.0f}s: {missed}; delivered to {', '.join(sorted(w.got)) or 'nobody'}"
                gave_up.append((w, item, why))
                self.unsettled.pop(w.id, None)
                log.error("%s from node %s: %s", w.id, item["node"], why)
            else:
                log.warning("%s from node %s: %s; tried again shortly", w.id, item["node"], missed)
        return done, gave_up


def _text(value):
    if value is None:
        return None
    try:
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)
    except UnicodeDecodeError:
        return None


def _when(text):
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except (AttributeError, ValueError, OverflowError):
        return None


def read_entry(eid, fields, local, config):
    """(Work, item) of a well-formed entry for this node's agents; MessageRefused saying what is
    wrong otherwise. Nothing in the entry is trusted: every field is checked, and the envelope
    the inboxes get is made again from the checked fields."""
    fields = {(k.decode("utf-8", "replace") if isinstance(k, bytes) else k): v for k, v in fields.items()}
    if _text(fields.get("v")) != "1":
        raise MessageRefused(f"not a relay entry of version 1 (v={shown(str(fields.get('v')))[:20]})")
    node = _text(fields.get("node"))
    if not node or not NODE.match(node):
        raise MessageRefused("no valid node name in the entry")
    mid = _text(fields.get("id"))
    if not mid or not valid_id(mid):
        raise MessageRefused(f"{shown(str(mid))[:40]!r} is not a relay message id")
    raw = fields.get("env")
    limit = 6 * config.max_body_bytes + (2 << 20)
    if not isinstance(raw, bytes) or len(raw) > limit:
        raise MessageRefused(f"the envelope is missing or larger than this node accepts ({limit} bytes)")
    try:
        doc = orjson.loads(raw)
        to_here = orjson.loads(fields.get("to") or b"null")
    except orjson.JSONDecodeError as e:
        raise MessageRefused(f"the envelope or its recipients are not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("id") != mid:
        raise MessageRefused("the envelope is not an object with the entry's message id")
    sender = doc.get("from")
    if not isinstance(sender, str) or not valid_agent(sender) or sender == SYSTEM:
        raise MessageRefused(f"the sender {shown(str(sender))[:70]!r} is not an agent name")
    if not isinstance(to_here, list) or not to_here or len(to_here) > MAX_RECIPIENTS or \
            not all(isinstance(r, str) and valid_agent(r) for r in to_here):
        raise MessageRefused("the recipients are not a list of agent names")
    body = doc.get("body")
    if not isinstance(body, str):
        raise MessageRefused("the body is not text")
    size = len(body.encode("utf-8", "surrogatepass"))
    if size > config.max_body_bytes:
        raise MessageRefused(f"the body is {size} bytes, over this node's max_body_bytes ({config.max_body_bytes})")
    sha = doc.get("sha256")
    if not isinstance(sha, str) or not HEX64.match(sha):
        raise MessageRefused("the envelope has no sha256 of the original")
    for key in TEXT_FIELDS + CONTROL_KEYS:
        if doc.get(key) is not None and not isinstance(doc[key], str):
            raise MessageRefused(f"'{key}' is not text")
    if not isinstance(doc.get("headers", {}), dict) or not isinstance(doc.get("to", []), list):
        raise MessageRefused("'headers' or 'to' has the wrong type")
    if doc.get("cwd") is not None and not is_inside(config.root / doc["cwd"], config.root):
        raise MessageRefused(f"CWD {doc['cwd'][:100]!r} is outside this node's project root")
    mine = [r for r in dict.fromkeys(to_here) if r in local and r != SYSTEM]
    if not mine:
        raise MessageRefused(f"none of {', '.join(to_here[:10])} is an agent of node {config.federation.node}")
    others = [r for r in to_here if r not in mine]
    envelope = {k: doc.get(k) for k in ("id", "from", "to", "kind", "thread", "subject", "body", "headers",
                                         "sent_at", "relayed_at", "source", "sha256")}
    envelope.update({k: doc[k] for k in CONTROL_KEYS if doc.get(k) is not None})
    envelope["node"] = node
    try:
        data = orjson.dumps(envelope)
    except TypeError as e:
        raise MessageRefused(f"the envelope cannot be written again: {e}") from None
    w = Work(id=mid, sender=sender, name=fit(shown(doc.get("source") or "remote")), archive_rel=None, retries=0,
             thorough=True, sha256=sha, recipients=mine, envelope=data,
             envelope_sha256=hashlib.sha256(data).hexdigest(),
             message=Remote([t for t in envelope["to"] or [] if isinstance(t, str)], doc.get("kind"),
                            doc.get("thread"), doc.get("subject")))
    item = {"id": mid, "sender": sender, "name": w.name, "node": node, "entry_id": eid, "recipients": mine,
            "kind": doc.get("kind"), "thread": doc.get("thread"), "subject": doc.get("subject"), "body": body,
            "headers": orjson.dumps(doc.get("headers") or {}).decode(), "sha256": sha,
            "sent_at": _when(doc.get("sent_at")),
            "note": f"not agents of this node: {', '.join(others[:10])}" if others else None}
    return w, item
