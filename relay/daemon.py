"""The relay: one `step(now)` moves every message it can one batch further.

    found files -> [T1: register + claim, durable] -> custody (outbox -> spool) -> read, parse
      -> inbox tmp writes -> sync files -> links into new/ -> sync directories
      -> spool -> archive (or failed/) -> sync -> [T2: deliveries per recipient, outcomes]

`drain()` repeats steps until nothing is left (relay run --once); the daemon's loop in
service.py calls `step()` when the watcher's hints, the settle deadlines or scheduled work say so.
"""
import collections
import hashlib
import itertools
import logging
import threading
import time

from . import retention
from .archive import Archive, check_rel, day_of
from .config import SYSTEM
from .errors import DurabilityError, MessageRefused, TransientError
from .fs import shown
from .ids import IdGenerator
from .inbox import Inbox
from .layout import Layout, fit, is_inside, valid_agent, valid_id
from .ledger import Ledger
from .message import envelope, parse, resolve
from .outbox import Outbox, ignore_lease_breaks
from .sync import Syncer
from .work import Counts, Outcome, Work

log = logging.getLogger(__name__)

BATCH = 256              # messages claimed per transaction
SCAN_BUDGET = 2048       # files registered per step
SWEEP_BATCH = retention.BATCH
ORPHAN_AGE = 86400.0     # tmp/ files older than this are removed
ORPHAN_INTERVAL = 3600.0
MAX_BACKOFF = 300.0      # the longest wait between two attempts
DRAIN_PATIENCE = 10.0    # run --once waits this long for files that make no progress
DRAIN_MIN_WAIT = 0.05


def backoff(base, retries):
    """Seconds before the next attempt after `retries` failed ones: doubling, capped."""
    return min(base * 2 ** min(retries, 30), MAX_BACKOFF)


class Relay:
    """The pipeline over one state directory. Ledger writes happen on the caller's thread."""

    def __init__(self, config, clock=time.time, sync_mode=None, batch=BATCH, fsync=None):
        self.config = config
        self.clock = clock
        self.batch = batch
        self.layout = Layout(config.root, config.state_dir)
        self.fs = self.layout.fs
        self.syncer = Syncer(config.durability, self.fs, mode=sync_mode, fsync=fsync)
        self.fs.on_dir_created = self.syncer.dir_changed
        try:
            for problem in self.layout.init(config.agents):
                log.warning("%s", problem)
            self.syncer.flush("the state directory's layout")
            self.ledger = Ledger(self.layout.ledger, durability=config.durability)
        except BaseException:
            self.syncer.close()
            self.layout.close()
            raise
        self.inbox = Inbox(self.layout, self.syncer)
        self.archive = Archive(self.layout, self.syncer)
        self.outbox = Outbox(self.layout, config.settle, self.syncer)
        self.ids = IdGenerator()
        self.hints = collections.deque()        # (kind, sender, name) from the watcher
        self.wake = threading.Event()
        self.left = []                          # what drain() gave up waiting for
        self._scan = None                       # the full rescan in progress (a generator)
        self._known = None
        self._next_rescan = 0.0
        self._next_sweep = 0.0
        self._next_orphans = 0.0
        self._next_archive_retry = 0.0
        ignore_lease_breaks()

    def close(self):
        self.ledger.close()
        self.syncer.close()
        self.layout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- hints from the watcher (any thread) -------------------------------------------------

    def hint(self, kind, sender=None, name=None):
        """kind: 'file' (may be complete), 'closed' (complete), 'dir' (scan it), 'rescan'."""
        self.hints.append((kind, sender, name))
        self.wake.set()

    # -- start ------------------------------------------------------------------------------

    def recover(self, now=None):
        """Crash and power-loss recovery. Rows left processing go back to pending with their
        file put back in the spool wherever it was found (outbox, spool, archive, failed/);
        files in the spool, or in the latest days of the archive, that no row knows are
        registered again under their id; orphan tmp files are removed. Returns the number of
        messages recovered."""
        now = self.clock() if now is None else now
        self.fs.forget()
        reset = []
        for row in self.ledger.processing():
            mid, sender, name = row["id"], row["sender"], row["name"]
            try:
                reset.append((mid, self._respool(row, self.layout.spool_rel(sender, mid, name))))
            except OSError as e:
                log.error("%s: cannot recover its file (%s); it stays where it is", mid, e)
                reset.append((mid, False))
            log.warning("%s from %s was left processing by a stopped relay: back to pending", mid, sender)
        spooled = list(self.layout.spooled())
        unknown = self.ledger.unknown([mid for _, mid, _, _ in spooled])
        orphans = [(mid, sender, name) for sender, mid, name, _ in spooled if mid in unknown]
        for mid, sender, _ in orphans:
            log.warning("%s from %s was in the spool with no ledger record: registered again", mid, sender)
        orphans += self._adopt_archived()
        if reset or orphans:
            self.syncer.flush("recovery moves")
            self.ledger.reset(reset, now)
            self.ledger.readopt(orphans, now)
        self.remove_orphans(now)
        self._scan = None
        self._next_rescan = 0.0
        self._next_archive_retry = 0.0
        return len(reset) + len(orphans)

    def _respool(self, row, spool):
        """Put a processing row's file back in the spool when an archive or quarantine move
        ran ahead of the ledger. True when the file is in the spool."""
        if self.fs.exists(spool):
            return True
        for rel in (row["archive_path"], self.layout.failed_rel(row["sender"], row["id"], row["name"])):
            try:
                if rel and self.fs.exists(check_rel(rel, "archive", "failed")):
                    self.archive.move(rel, spool)
                    return True
            except OSError:
                continue
        return False

    def _adopt_archived(self):
        """Originals in the archive's latest days that no ledger row knows (the ledger lost
        them): moved back to the spool, to be delivered (idempotently) and archived again."""
        latest = self.ledger.latest_archived_at()
        found = []
        if latest is None:
            # No archived row at all: a new ledger. If the archive holds originals the ledger was
            # replaced or lost; delivering them all again would repeat what agents already read.
            try:
                archived = bool(self.fs.names("archive"))
            except OSError:
                archived = False
            if archived:
                log.warning("archive/ holds originals but the ledger records no archived message: was the "
                            "ledger replaced? They are not delivered again; `relay doctor` lists them")
            return found
        first_day = day_of(latest - 86400)
        try:
            days = sorted(e.name for e in self.fs.scandir("archive") if e.is_dir(follow_symlinks=False)
                          and e.name >= first_day)
        except OSError:
            return found
        for day in days:
            try:
                senders = [e.name for e in self.fs.scandir(f"archive/{day}")
                           if valid_agent(e.name) and e.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            for sender in senders:
                try:
                    files = [e.name for e in self.fs.scandir(f"archive/{day}/{sender}") if e.is_file(follow_symlinks=False)]
                except OSError:
                    continue
                parsed = [(n.partition("--")[0], n.partition("--")[2], n) for n in files]
                parsed = [p for p in parsed if valid_id(p[0]) and p[1]]
                unknown = self.ledger.unknown([p[0] for p in parsed])
                for mid, name, file in parsed:
                    if mid not in unknown:
                        continue
                    try:
                        self.archive.move(f"archive/{day}/{sender}/{file}", self.layout.spool_rel(sender, mid, name))
                    except OSError as e:
                        log.error("archive/%s/%s/%s has no ledger record and cannot be moved back: %s",
                                  day, sender, shown(file), e)
                        continue
                    log.warning("%s from %s was archived with no ledger record: registered again", mid, sender)
                    found.append((mid, sender, name))
        return found

    def remove_orphans(self, now):
        removed = 0
        for rel in self.inbox.orphans(now - ORPHAN_AGE):
            if self.fs.unlink_quietly(rel):
                removed += 1
                log.info("removed orphaned inbox file %s", shown(rel))
        self._next_orphans = now + ORPHAN_INTERVAL
        return removed

    # -- the step ---------------------------------------------------------------------------

    def step(self, now=None):
        """Move everything one batch further. Returns what was done."""
        now = self.clock() if now is None else now
        self.fs.forget()            # walk from the top again: a directory may have been swapped
        counts = Counts()
        found = []
        for f in self._gather(now):
            if f.bad:
                self._refuse_name(f, now, counts)
            else:
                found.append(f)
        day = day_of(now)
        registered, claimed = self.ledger.register_and_claim(
            [(self.ids.new(now), f.sender, f.name, f.sent_at) for f in found], now, self.batch,
            lambda sender, mid, name: self.layout.archive_rel(day, sender, mid, name))
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
            kind, sender, name = self.hints.popleft()
            if kind == "rescan":
                self._known = None
                self._scan = self.outbox.scan_all(now)
            elif kind == "dir":
                self._known = None
                if sender in set(self.outbox.agent_dirs()):
                    found.extend(self.outbox.scan_dir(sender, now))
            elif valid_agent(sender) and sender != SYSTEM:
                hit = self.outbox.check(sender, name, now, hinted=(kind == "closed"))
                if hit:
                    found.append(hit)
        found.extend(self.outbox.due_waiting(now))
        if self._scan is not None:
            more = list(itertools.islice(self._scan, max(0, SCAN_BUDGET - len(found))))
            found.extend(more)
            if len(found) < SCAN_BUDGET:
                self._scan = None
        return found

    def _refuse_name(self, f, now, counts):
        """A file whose name cannot be a message name: quarantined at once, name escaped."""
        mid = self.ids.new(now)
        name = fit(shown(f.name))
        rel = self.layout.failed_rel(f.sender, mid, name)
        reason = f"{f.bad} ('{name}'); rename it with a plain UTF-8 name and no control characters"
        try:
            self.archive.move(f"outbox/{f.sender}/{f.name}", rel)
            self.archive.write_report(rel, self.archive.report(mid, f.sender, name, reason, now, 0))
            self.syncer.flush("a quarantined file")
        except (OSError, DurabilityError) as e:
            log.error("outbox/%s/%s: %s; cannot quarantine it: %s", f.sender, name, f.bad, e)
            return
        self.ledger.refuse_found(mid, f.sender, name, now, reason, rel)
        counts.failed += 1
        log.error("%s from %s failed: %s", mid, f.sender, reason)

    def known_agents(self, refresh=False):
        if self._known is None or refresh:
            self._known = self.layout.agent_names(self.config.agents)
        return self._known

    def _process(self, rows, now, counts):
        works = [_work(row) for row in self._readable(rows, now, counts)]
        had = self.ledger.delivered_to([w.id for w in works if w.thorough])
        budget = self.config.batch_bytes
        for w in works:
            w.had = had.get(w.id, {})
            if budget <= 0:
                w.defer = True      # left for the next batch: this one holds enough bytes
                continue
            self._prepare(w, now)
            budget -= w.size + len(w.envelope) + (len(w.message.body) if w.message else 0)
        linked = self.inbox.deliver([w for w in works if not (w.refused or w.error or w.defer)])
        for w in works:
            self._settle(w, now)
        # One sync for the links into new/ and the archive moves: an original archived before its
        # links are durable is found there by recovery (its claim names the path) and delivered
        # again, idempotently.
        try:
            self.syncer.flush("inbox new/, archive and outbox directories")
        except DurabilityError as e:
            self.inbox.unlink(linked, e)
            for w in works:
                if w.outcome in (Outcome.ARCHIVED, Outcome.DELIVERED, Outcome.RETRY):
                    if w.outcome is Outcome.ARCHIVED:
                        w.path = w.archive_rel
                    w.outcome, w.refused = Outcome.FAILED, f"{e}; delivered to {', '.join(sorted(w.got)) or 'nobody'}"
                    w.failed_rel = None
                    log.error("%s: %s; the original stays at %s", w.id, e, w.path)
        self.ledger.record(now, works)
        for w in works:
            self._report(w, now, counts)

    def _prepare(self, w, now):
        """Custody, reading and parsing of one message. One message's unforeseen failure is
        logged with its id; the batch goes on."""
        try:
            self.outbox.take(w)
            if w.refused or w.error:
                return
            w.spooled = True
            self.outbox.read(w, self.config.max_body_bytes)
            if w.refused or w.error or w.defer:
                return
            self._parse(w, now)
        except Exception as e:  # noqa: BLE001 - isolate the message, keep the daemon alive
            log.exception("%s from %s: unexpected error while reading it", w.id, w.sender)
            w.error = TransientError(f"unexpected error: {e!r}"[:500])

    def _parse(self, w, now):
        try:
            w.message = parse(w.data, w.name, self.config.max_body_bytes)
            create = self.config.unknown_recipient == "create"
            known = self.known_agents()
            if any(n not in known and n not in ("*", "Broadcast", SYSTEM) for n in w.message.to):
                known = self.known_agents(refresh=True)
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
        finally:
            w.data = b""            # the bytes are hashed and parsed; the batch need not hold them
        addressed = ["*" if n in ("*", "Broadcast") else n for n in w.message.to]
        to = list(dict.fromkeys(addressed)) if "*" in addressed else w.recipients
        w.envelope = envelope(w.id, w.sender, to, w.message, w.sent_at, now, w.name, w.sha256)
        w.envelope_sha256 = hashlib.sha256(w.envelope).hexdigest()

    def _settle(self, w, now):
        """Decide the outcome of one work after delivery; archive or quarantine its file."""
        durability = next((e for e in w.missed.values() if isinstance(e, DurabilityError)), None)
        if w.refused or isinstance(w.error, DurabilityError) or durability:
            if durability and not w.refused:
                w.refused = f"{durability}; delivered to {', '.join(sorted(w.got)) or 'nobody'}"
            return self._quarantine(w, now)
        if w.defer:
            w.outcome = Outcome.DEFER
            w.next_attempt_at = now + max(self.config.settle, DRAIN_MIN_WAIT) if w.path else now
            w.error = TransientError("still open for writing") if w.path else None
            return
        if w.error is None and w.complete:
            try:
                self.archive.store(w.path, w.archive_rel)
                w.outcome = Outcome.ARCHIVED
            except OSError as e:
                w.outcome = Outcome.DELIVERED
                w.error = TransientError(f"moving the original to {w.archive_rel}: {e.strerror or e}")
                w.next_attempt_at = now + self.config.retry_backoff
                self._next_archive_retry = min(self._next_archive_retry, w.next_attempt_at)
            return
        if w.error is None:
            w.error = TransientError("; ".join(f"not delivered to {r}: {e}" for r, e in sorted(w.missed.items())))
        since = w.failing_since if w.failing_since is not None else now
        if w.retries + 1 > self.config.max_retries and now - since >= self.config.retry_period:
            return self._quarantine(w, now)
        w.outcome = Outcome.RETRY
        w.next_attempt_at = now + backoff(self.config.retry_backoff, w.retries)

    def _quarantine(self, w, now):
        if w.refused is None:
            w.refused = f"gave up after {w.retries + 1} attempts: {w.error}" \
                if isinstance(w.error, TransientError) else str(w.error)
        delivered = sorted(set(w.got) | set(w.had))
        report = self.archive.report(w.id, w.sender, w.name, w.refused, now, w.retries + 1, delivered)
        try:
            w.failed_rel = self.archive.quarantine(w.path, w.sender, w.id, w.name, report)
        except (OSError, DurabilityError) as e:
            log.error("%s: could not quarantine the file (%s); it stays at %s", w.id, e, w.path)
            w.failed_rel = None
        w.outcome = Outcome.FAILED

    def _report(self, w, now, counts):
        """Count and log one work's outcome."""
        to = ",".join(w.recipients)
        if w.outcome is Outcome.FAILED:
            counts.failed += 1
            log.error("%s from %s failed: %s", w.id, w.sender, w.refused)
        elif w.outcome is Outcome.DEFER:
            counts.deferred += 1
            if w.path:
                log.info("%s from %s is still open for writing; looking again shortly", w.id, w.sender)
        elif w.outcome is Outcome.ARCHIVED:
            counts.delivered += 1
            counts.archived += 1
            log.info("%s delivered from %s to %s; archived as %s", w.id, w.sender, to, w.archive_rel)
        elif w.outcome is Outcome.DELIVERED:
            counts.delivered += 1
            log.warning("%s delivered from %s to %s; archive move failed, will retry: %s",
                        w.id, w.sender, to, w.error)
        else:
            counts.retried += 1
            log.warning("%s from %s: %s; attempt %d failed, next in %.1fs%s", w.id, w.sender, w.error,
                        w.retries + 1, w.next_attempt_at - now,
                        f" (delivered to {', '.join(sorted(w.got))})" if w.got else "")

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
            bad.append((row["id"], reason))
            counts.failed += 1
        if bad:
            self.ledger.fail_unreadable(now, bad)
        return good

    def _retry_archive(self, now, counts):
        """Archive moves that failed after delivery (disk full, permissions) are tried again."""
        done, retry = [], []
        for row in self.ledger.delivered_due(now, self.batch):
            rel = row["archive_path"] or self.layout.archive_rel(day_of(now), row["sender"], row["id"], row["name"])
            spool = self.layout.spool_rel(row["sender"], row["id"], row["name"])
            try:
                if self.fs.exists(spool):
                    self.archive.store(spool, rel)
                elif not self.fs.exists(check_rel(rel, "archive")):
                    raise FileNotFoundError(2, "the original is in neither the spool nor the archive")
                done.append((row["id"], rel))
            except OSError as e:
                retry.append((row["id"], f"archive: {e.strerror or e}",
                              now + backoff(self.config.retry_backoff, row["retries"] + 1), row["retries"] + 1))
        if done or retry:
            try:
                self.syncer.flush("archive directories")
            except DurabilityError as e:
                retry += [(mid, str(e), now + MAX_BACKOFF, 0) for mid, _ in done]
                done = []
            self.ledger.archived_late(now, done, retry)
            counts.archived += len(done)
        nxt = self.ledger.next_archive_due()
        self._next_archive_retry = nxt if nxt is not None else float("inf")

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

    def drain(self, wait=time.sleep, now_fn=None, patience=DRAIN_PATIENCE):
        """Recover, then step until every message present is delivered or failed (run --once).

        Files still settling are waited for, but no longer than `patience` without progress:
        what is left then (a file held open for writing, one that keeps changing) is listed in
        `self.left` as (path, why). Messages backing off after a transient error are left
        pending for the next run.
        """
        now_fn = now_fn or self.clock
        total = Counts()
        self.left = []
        self.recover(now_fn())
        self._next_sweep = 0.0
        progress_at = last_wait = now_fn()
        frozen = 0
        while True:
            counts = self.step(now_fn())
            total.add(counts)
            now = now_fn()
            if counts.busy or counts.delivered or counts.failed:
                progress_at = now
            if counts.busy or self.hints or self._scan is not None:
                continue
            deadline = self.outbox.next_deadline()
            due = self.ledger.next_due()
            if due is not None and due - now <= max(self.config.settle, 1.0):
                deadline = min(deadline if deadline is not None else due, due)
            if deadline is None:
                return total
            frozen = frozen + 1 if now <= last_wait else 0
            if now - progress_at >= patience or frozen > 3:     # a clock that never moves: give up too
                self.left = [(p, why) for p, why, _ in self.outbox.left(now, 0)] + self.ledger.waiting(now, 1.0)
                return total
            last_wait = now
            wait(max(0.0, min(deadline - now, max(self.config.settle, DRAIN_MIN_WAIT))))


def _work(row):
    return Work(id=row["id"], sender=row["sender"], name=row["name"], archive_rel=row["archive_path"],
                retries=row["retries"], thorough=row["attempts"] > 1, spooled=bool(row["spooled"]),
                discovered_at=row["discovered_at"], failing_since=row["failing_since"])


def _unreadable(row):
    """(column, value) of the first column of a claimed row that this build cannot use."""
    checks = (("sender", lambda v: isinstance(v, str) and valid_agent(v)),
              ("name", lambda v: isinstance(v, str) and v and "/" not in v and v not in (".", "..")
               and "\0" not in v),
              ("spooled", lambda v: v in (0, 1)),
              ("retries", lambda v: isinstance(v, int) and v >= 0),
              ("attempts", lambda v: isinstance(v, int) and v >= 0),
              ("failing_since", lambda v: v is None or isinstance(v, (int, float))),
              ("archive_path", lambda v: isinstance(v, str) and ".." not in v.split("/")))
    for column, ok in checks:
        if not ok(row[column]):
            return column, row[column]
    return None
