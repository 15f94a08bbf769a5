"""The relay: one `step(now)` moves every message it can one batch further.

    found files -> [T1: register + claim] -> custody (outbox -> spool) -> read, parse
      -> inbox tmp writes -> sync -> links into new/ -> sync
      -> spool -> archive (or failed/) -> sync -> [T2: delivered + archived, events]

`drain()` repeats steps until nothing is left (relay run --once); `run()` is the daemon loop,
woken by the watcher's hints, the settle deadlines and the scheduled work.
"""
import collections
import dataclasses
import hashlib
import itertools
import logging
import os
import stat
import threading
import time

import orjson

from . import retention
from .archive import Archive, day_of
from .config import SYSTEM
from .errors import DurabilityError, MessageRefused, TransientError
from .ids import IdGenerator
from .inbox import Inbox
from .layout import Layout, is_inside, move, valid_agent
from .ledger import Ledger
from .message import envelope, parse, resolve
from .outbox import OPEN_FLAGS, Outbox, ignore_lease_breaks, not_regular
from .sync import Syncer

log = logging.getLogger(__name__)

BATCH = 256              # messages claimed per transaction
SCAN_BUDGET = 2048       # files registered per step
SWEEP_BATCH = retention.BATCH
ORPHAN_AGE = 86400.0     # tmp/ files older than this are removed
MAX_BACKOFF = 3600.0
HEADER_ALLOWANCE = 256 * 1024


@dataclasses.dataclass
class Counts:
    registered: int = 0
    claimed: int = 0
    delivered: int = 0
    archived: int = 0
    failed: int = 0
    retried: int = 0
    deferred: int = 0
    swept: int = 0

    def add(self, other):
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def busy(self):
        return bool(self.registered or self.claimed or self.archived or self.swept)


@dataclasses.dataclass(eq=False)
class Work:
    """One claimed message on its way through a batch."""
    id: str
    sender: str
    name: str
    archive_rel: str
    retries: int
    thorough: bool
    discovered_at: float = None
    path: str = None            # where the file is now (spool, or outbox when not regular)
    refused: str = None         # permanent reason
    error: Exception = None     # transient or durability error
    defer: bool = False
    data: bytes = b""
    sha256: str = None
    sent_at: float = None
    message: object = None
    recipients: list = ()
    envelope: bytes = b""
    delivered: bool = False
    archived: bool = False
    failed: bool = False
    failed_rel: str = None


class Relay:
    """The pipeline over one state directory. Ledger writes happen on the caller's thread."""

    def __init__(self, config, clock=time.time, sync_mode=None, batch=BATCH):
        self.config = config
        self.clock = clock
        self.batch = batch
        self.layout = Layout(config.root, config.state_dir)
        self.layout.init(config.agents)
        self.ledger = Ledger(self.layout.ledger, durability=config.durability)
        self.syncer = Syncer(config.durability, self.layout.state, mode=sync_mode)
        self.inbox = Inbox(self.layout, self.syncer)
        self.archive = Archive(self.layout, self.syncer)
        self.outbox = Outbox(self.layout, config.settle)
        self._spool, self._outbox = str(self.layout.spool), str(self.layout.outbox)
        self.ids = IdGenerator()
        self.hints = collections.deque()        # (kind, sender, path) from the watcher
        self.wake = threading.Event()
        self._scan = None                       # the full rescan in progress (a generator)
        self._known = None
        self._next_rescan = 0.0
        self._next_sweep = 0.0
        self._next_orphans = 0.0
        self._next_archive_retry = 0.0
        ignore_lease_breaks()

    def close(self):
        self.ledger.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- hints from the watcher (any thread) -------------------------------------------------

    def hint(self, kind, sender=None, path=None):
        """kind: 'file' (may be complete), 'closed' (complete), 'dir' (scan it), 'rescan'."""
        self.hints.append((kind, sender, path))
        self.wake.set()

    # -- start ------------------------------------------------------------------------------

    def recover(self, now=None):
        """Crash recovery: processing rows back to pending with their file put where the
        pipeline looks for it; spooled files with no ledger record (a power loss between the
        claim and its sync) registered again; orphan tmp files removed. Returns the number of
        messages recovered."""
        now = self.clock() if now is None else now
        reset = []
        for row in self.ledger.processing():
            mid, sender, name = row["id"], row["sender"], row["name"]
            spool = self.layout.spool_path(sender, mid, name)
            spooled = os.path.lexists(spool)
            if not spooled:
                # The archive or quarantine move may have happened before the ledger recorded
                # it: put the file back in the spool; re-delivery is idempotent.
                for rel in (row["archive_path"], self.layout.failed_rel(sender, mid, name)):
                    if rel and os.path.lexists(self.layout.state / rel):
                        os.makedirs(os.path.dirname(spool), exist_ok=True)
                        move(self.layout.state / rel, spool)
                        spooled = True
                        break
            reset.append((mid, spooled))
            log.warning("%s from %s was left processing by a stopped relay: back to pending", mid, sender)
        orphans = [(mid, sender, name) for sender, mid, name, _ in self.layout.spooled()
                   if self.ledger.get(mid) is None and valid_agent(sender)]
        for mid, sender, _ in orphans:
            log.warning("%s from %s was in the spool with no ledger record: registered again", mid, sender)
        if reset or orphans:
            self.syncer.dir_changed(self.layout.spool)
            self.syncer.flush("recovery moves")
            self.ledger.reset(reset, now)
            self.ledger.readopt(orphans, now)
        self.remove_orphans(now)
        self._scan = None
        self._next_rescan = 0.0
        return len(reset) + len(orphans)

    def remove_orphans(self, now):
        removed = 0
        for path in self.inbox.orphans(now - ORPHAN_AGE):
            try:
                os.unlink(path)
                removed += 1
                log.info("removed orphaned inbox file %s", path)
            except OSError:
                pass
        self._next_orphans = now + 3600.0
        return removed

    # -- the step ---------------------------------------------------------------------------

    def step(self, now=None):
        """Move everything one batch further. Returns what was done."""
        now = self.clock() if now is None else now
        counts = Counts()
        found = self._gather(now)
        batch = self.batch
        # With one file-system sync per batch, that sync also makes this transaction durable
        # before anything depends on it: the commit need not fsync the WAL on its own.
        day = day_of(now)
        registered, claimed = self.ledger.register_and_claim(
            [(self.ids.new(now), f.sender, f.name, f.sent_at) for f in found], now, batch,
            lambda sender, mid, name: self.layout.archive_rel(day, sender, mid, name),
            lazy=self.syncer.durable and self.syncer.mode == "fs")
        counts.registered, counts.claimed = len(registered), len(claimed)
        for mid, sender, name in registered:
            log.info("%s discovered: outbox/%s/%s", mid, sender, name)
        if claimed:
            self._process(claimed, now, counts)
        if now >= self._next_archive_retry:
            self._retry_archive(now, counts)
        if now >= self._next_sweep:
            result = self.sweep(now)
            counts.swept = result.archived + result.failed
            self._next_sweep = now if result.more else now + self.config.sweep_interval
        if now >= self._next_orphans:
            self.remove_orphans(now)
        return counts

    def _gather(self, now):
        found = []
        if now >= self._next_rescan and self._scan is None:
            self._known = None
            self._scan = self.outbox.scan_all(now)
            self._next_rescan = now + self.config.rescan_interval
        while self.hints and len(found) < SCAN_BUDGET:
            kind, sender, path = self.hints.popleft()
            if kind == "rescan":
                self._known = None
                self._scan = self.outbox.scan_all(now)
            elif kind == "dir":
                self._known = None
                if valid_agent(sender) and self.layout.outbox_problem(sender, path) is None:
                    found.extend(self.outbox.scan_dir(sender, path, now))
            else:
                hit = self.outbox.check(sender, path, now, hinted=(kind == "closed"))
                if hit:
                    found.append(hit)
        found.extend(self.outbox.due_waiting(now))
        if self._scan is not None:
            more = list(itertools.islice(self._scan, max(0, SCAN_BUDGET - len(found))))
            found.extend(more)
            if len(found) < SCAN_BUDGET:
                self._scan = None
        return found

    def known_agents(self, refresh=False):
        if self._known is None or refresh:
            self._known = self.layout.agent_names(self.config.agents)
        return self._known

    def _process(self, rows, now, counts):
        rows = self._readable(rows, now, counts)
        works = [self._take_safely(row, now) for row in rows]
        ready = [w for w in works if not (w.refused or w.error or w.defer)]
        for w in self.inbox.deliver(ready):
            w.delivered = True
        for w in works:
            if w.delivered:
                try:
                    self.archive.store(w.path, w.archive_rel)
                    w.archived = True
                except OSError as e:
                    w.error = TransientError(f"moving the original to {w.archive_rel}: {e.strerror or e}")
            elif w.refused or isinstance(w.error, DurabilityError) or (
                    isinstance(w.error, TransientError) and w.retries + 1 > self.config.max_retries):
                self._quarantine(w, now)
        try:
            self.syncer.flush("archive and outbox directories")
        except DurabilityError as e:
            for w in works:
                if w.archived:
                    w.archived, w.error = False, e
        self.ledger.finish(now, [self._outcome(w, now, counts) for w in works])

    def _readable(self, rows, now, counts):
        """Rows this build can read; any other is reported with its id and column, failed, and
        the batch goes on without it."""
        good, bad = [], []
        for row in rows:
            problem = _unreadable(row)
            if problem is None:
                good.append(row)
                continue
            column, value = problem
            reason = (f"ledger row {row['id']!r}: column {column} holds {value!r}, which this relay "
                      "cannot read; the row was skipped")
            log.error("%s", reason)
            bad.append({"id": row["id"], "state": "failed", "error": reason, "failed_path": None})
            counts.failed += 1
        if bad:
            self.ledger.finish(now, bad)
        return good

    def _retry_archive(self, now, counts):
        """Archive moves that failed after delivery (disk full, permissions) are tried again."""
        rows = self.ledger.delivered_due(now, self.batch)
        outcomes = []
        for row in rows:
            rel = row["archive_path"] or self.layout.archive_rel(day_of(now), row["sender"], row["id"], row["name"])
            spool = self.layout.spool_path(row["sender"], row["id"], row["name"])
            try:
                if os.path.lexists(spool):
                    self.archive.store(spool, rel)
                elif not os.path.lexists(self.layout.state / rel):
                    raise FileNotFoundError(2, "the original is in neither the spool nor the archive")
                outcomes.append({"id": row["id"], "state": "archive", "archive_path": rel})
            except OSError as e:
                backoff = min(self.config.retry_backoff * 2 ** min(row["retries"] + 1, 20), MAX_BACKOFF)
                outcomes.append({"id": row["id"], "state": "archive-retry", "error": f"archive: {e.strerror or e}",
                                 "next_attempt_at": now + backoff, "retries": row["retries"] + 1})
        if outcomes:
            try:
                self.syncer.flush("archive directories")
            except DurabilityError as e:
                outcomes = [{"id": o["id"], "state": "archive-retry", "error": str(e),
                             "next_attempt_at": now + MAX_BACKOFF, "retries": 0} for o in outcomes]
            self.ledger.finish(now, outcomes)
            counts.archived += sum(1 for o in outcomes if o["state"] == "archive")
        nxt = self.ledger.next_archive_due()
        self._next_archive_retry = nxt if nxt is not None else float("inf")

    def _take_safely(self, row, now):
        """One message's unforeseen failure is logged with its id; the batch goes on."""
        try:
            return self._take(row, now)
        except Exception as e:  # noqa: BLE001 - isolate the message, keep the daemon alive
            log.exception("%s from %s: unexpected error while reading it", row["id"], row["sender"])
            spool = self.layout.spool_path(row["sender"], row["id"], row["name"])
            w = Work(id=row["id"], sender=row["sender"], name=row["name"], archive_rel=row["archive_path"],
                     retries=row["retries"], thorough=True, path=spool if os.path.lexists(spool) else None)
            w.error = TransientError(f"unexpected error: {e!r}"[:500])
            return w

    def _take(self, row, now):
        """Take custody of a claimed message's file, read and parse it."""
        w = Work(id=row["id"], sender=row["sender"], name=row["name"], archive_rel=row["archive_path"],
                 retries=row["retries"], thorough=row["attempts"] > 1, discovered_at=row["discovered_at"])
        spool = self.layout.spool_path(w.sender, w.id, w.name)
        if row["spooled"]:
            if not os.path.lexists(spool):
                w.refused = "the message file vanished from relay's spool before it was delivered"
                return w
        else:
            src_dir = f"{self._outbox}/{w.sender}"
            src = f"{src_dir}/{w.name}"
            try:
                st = os.lstat(src)
            except FileNotFoundError:
                w.refused = (f"outbox/{w.sender}/{w.name} disappeared before relay could read it "
                             "(deleted or moved away by someone else)")
                return w
            except OSError as e:
                w.error = TransientError(f"cannot look at outbox/{w.sender}/{w.name}: {e.strerror}")
                return w
            if not stat.S_ISREG(st.st_mode):
                w.path = src
                w.refused = not_regular(src, st)
                return w
            try:
                try:
                    move(src, spool)
                except FileNotFoundError:
                    if os.path.lexists(src):        # the sender's spool directory is new
                        os.makedirs(os.path.dirname(spool), exist_ok=True)
                        self.syncer.dir_changed(self._spool)
                        move(src, spool)
                    else:
                        raise
            except FileNotFoundError:
                w.refused = f"outbox/{w.sender}/{w.name} disappeared before relay could read it"
                return w
            except OSError as e:
                w.error = TransientError(f"cannot take outbox/{w.sender}/{w.name}: {e.strerror}")
                return w
            self.syncer.dir_changed(src_dir)
            self.syncer.dir_changed(os.path.dirname(spool))
        w.path = spool
        self._read(w, now)
        return w

    def _read(self, w, now):
        try:
            fd = os.open(w.path, OPEN_FLAGS)
        except OSError as e:
            w.error = TransientError(f"cannot open the message: {e.strerror}")
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                w.refused = not_regular(w.path, st)
                return
            if self.outbox.leases.writers(fd):
                w.defer = True
                return
            if st.st_mode & 0o022:      # the archived original is not writable by group/other
                os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~0o022)
            limit = self.config.max_body_bytes + HEADER_ALLOWANCE
            if st.st_size > limit:
                w.refused = (f"the file is {st.st_size} bytes, over max_body_bytes "
                             f"({self.config.max_body_bytes}) plus room for headers")
                return
            chunks, total = [], 0
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
                total += len(chunk)
                if total > limit:
                    w.refused = f"the file grew past {limit} bytes while relay read it"
                    return
            w.data = b"".join(chunks)
            w.sent_at = st.st_mtime
        except OSError as e:
            w.error = TransientError(f"reading the message: {e.strerror}")
            return
        finally:
            os.close(fd)
        w.sha256 = hashlib.sha256(w.data).hexdigest()
        try:
            w.message = parse(w.data, w.name, self.config.max_body_bytes)
            create = self.config.unknown_recipient == "create"
            known = self.known_agents()
            if any(n not in known and n not in ("*", "Broadcast", SYSTEM) for n in w.message.to):
                known = self.known_agents(refresh=True)
            w.recipients = list(w.message.to)
            cwd = w.message.control.get("cwd")
            if cwd is not None and not is_inside(self.layout.root / cwd, self.layout.root):
                raise MessageRefused(f"CWD {cwd!r} is outside the project root {self.layout.root}")
            w.recipients, created = resolve(w.message, w.sender, known, create)
            for name in created:
                self.layout.make_inbox(name)
                self._known = None
                log.info("%s: created the inbox of new agent %s", w.id, name)
        except MessageRefused as e:
            w.refused = str(e)
            return
        w.envelope = envelope(w.id, w.sender, w.recipients, w.message, w.sent_at, now, w.name, w.sha256)

    def _quarantine(self, w, now):
        if w.refused is None:
            w.refused = f"gave up after {w.retries + 1} attempts: {w.error}" \
                if isinstance(w.error, TransientError) else str(w.error)
        report = self.archive.report(w.id, w.sender, w.name, w.refused, now, w.retries + 1)
        try:
            w.failed_rel = self.archive.quarantine(w.path, w.sender, w.id, w.name, report)
        except (OSError, DurabilityError) as e:
            log.error("%s: could not quarantine the file (%s); it stays at %s", w.id, e, w.path)
            w.failed_rel = None
        w.failed = True

    def _outcome(self, w, now, counts):
        fields = {"id": w.id}
        if w.message is not None:
            m = w.message
            fields.update(kind=m.kind, thread=m.thread, subject=m.subject, body=m.body,
                          headers=orjson.dumps(m.headers).decode(),
                          recipients=orjson.dumps(w.recipients).decode())
        if w.sha256:
            fields.update(size=len(w.data), sha256=w.sha256, sent_at=w.sent_at)
        if w.failed:
            counts.failed += 1
            log.error("%s from %s failed: %s", w.id, w.sender, w.refused)
            return {**fields, "state": "failed", "error": w.refused, "failed_path": w.failed_rel,
                    "retries": w.retries + (1 if w.error else 0)}
        if w.defer:
            counts.deferred += 1
            log.info("%s from %s is still open for writing; looking again shortly", w.id, w.sender)
            return {**fields, "state": "defer", "next_attempt_at": now + max(self.config.settle, 0.05),
                    "spooled": True, "error": "still open for writing"}
        if w.delivered:
            counts.delivered += 1
            to = ",".join(w.recipients)
            if w.archived:
                counts.archived += 1
                log.info("%s delivered from %s to %s; archived as %s", w.id, w.sender, to, w.archive_rel)
                return {**fields, "state": "archived", "archive_path": w.archive_rel, "sender": w.sender,
                        "discovered_at": w.discovered_at}
            log.warning("%s delivered from %s to %s; archive move failed, will retry: %s",
                        w.id, w.sender, to, w.error)
            self._next_archive_retry = min(self._next_archive_retry, now + self.config.retry_backoff)
            return {**fields, "state": "delivered", "archive_path": w.archive_rel, "error": str(w.error),
                    "next_attempt_at": now + self.config.retry_backoff}
        retries = w.retries + 1
        backoff = min(self.config.retry_backoff * (2 ** w.retries), MAX_BACKOFF)
        counts.retried += 1
        log.warning("%s from %s: %s; attempt %d of %d failed, next in %.1fs", w.id, w.sender, w.error,
                    retries, self.config.max_retries, backoff)
        return {"id": w.id, "state": "retry", "retries": retries, "error": str(w.error),
                "next_attempt_at": now + backoff,
                "spooled": w.path == self.layout.spool_path(w.sender, w.id, w.name)}

    # -- retention --------------------------------------------------------------------------

    def sweep(self, now=None, older_than=None, dry_run=False, limit=SWEEP_BATCH):
        """One bounded batch of the retention sweep. `result.more` says another batch is due."""
        now = self.clock() if now is None else now
        keep = self.config.retention if older_than is None else older_than
        return retention.sweep(self.ledger, self.archive, now, keep, dry_run, limit)

    def sweep_all(self, now=None, older_than=None, dry_run=False):
        """The whole sweep, batch after batch (relay sweep)."""
        now = self.clock() if now is None else now
        keep = self.config.retention if older_than is None else older_than
        return retention.sweep_all(self.ledger, self.archive, now, keep, dry_run)

    # -- loops ------------------------------------------------------------------------------

    def drain(self, wait=time.sleep, now_fn=None):
        """Recover, then step until every message present is delivered or failed (run --once).

        Files still settling are waited for; messages backing off after a transient error are
        left pending for the next run.
        """
        now_fn = now_fn or self.clock
        total = Counts()
        self.recover(now_fn())
        self._next_sweep = 0.0
        while True:
            counts = self.step(now_fn())
            total.add(counts)
            if counts.busy or self.hints or self._scan is not None:
                continue
            deadline = self.outbox.next_deadline()
            due = self.ledger.next_due()
            if due is not None and due - now_fn() <= max(self.config.settle, 1.0):
                deadline = min(deadline if deadline is not None else due, due)
            if deadline is None:
                return total
            wait(max(0.0, min(deadline - now_fn(), max(self.config.settle, 0.05))))


def _unreadable(row):
    """(column, value) of the first column of a claimed row that this build cannot use."""
    checks = (("sender", lambda v: isinstance(v, str) and valid_agent(v)),
              ("name", lambda v: isinstance(v, str) and v and "/" not in v and v not in (".", "..")),
              ("spooled", lambda v: v in (0, 1)),
              ("retries", lambda v: isinstance(v, int) and v >= 0),
              ("attempts", lambda v: isinstance(v, int) and v >= 0),
              ("archive_path", lambda v: isinstance(v, str) and ".." not in v.split("/")))
    for column, ok in checks:
        if not ok(row[column]):
            return column, row[column]
    return None

