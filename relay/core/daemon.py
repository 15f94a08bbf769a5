"""The relay over one state directory: `step(now)` moves every message it can one batch further.

    found files -> [T1: register + claim, unsynced] -> read in the outbox, accept
      -> inbox tmp writes -> sync files and the ledger's log (T1 durable) -> custody (outbox ->
      spool) -> links into new/ -> spool -> archive (or failed/)
      -> sync directories (overlapping the next batch) -> [T2: deliveries per recipient, outcomes]

A file that is not plain (Outbox.peek), or a retry, is taken into the spool before it is read,
after the ledger syncs its log on its own. Group commit: the last sync of a batch (links and
moves) runs on a thread while the next step claims and reads its batch; finish() then records the
batch (T2) before the next one's request ids are settled, or it is admitted or delivered. A step
records its batch at once when no more work is ready.

`drain()` repeats steps until nothing present is left (relay run --once); `run(stop)` is the
daemon's loop: it steps when the watcher's hints, a signal or `next_deadline()` say so, while
service.py supplies what only a process has (both in loop.py, a base class of Relay). Relay
composes the rooms: recovery.py, message.py, retention.py and the file and ledger rooms below them.
"""
import collections
import concurrent.futures
import dataclasses
import itertools
import logging
import time

from relay.core import bounces, flow, health, registry, retention
from relay.core.archive import Archive, day_of
from relay.config import SYSTEM
from relay.errors import DurabilityError, TransientError
from relay.files.fs import shown
from relay.ledger.history import History
from relay.core.hooks import Hooks
from relay.core.wake import Wake
from relay.ids import IdGenerator
from relay.core.identity import identify
from relay.core.inbox import Inbox
from relay.files.layout import Layout, fit, valid_agent
from relay.ledger.ledger import Ledger
from relay.core.handling import Handling
from relay.core.loop import MAX_HELD_WAIT, STEP_PAUSE, Loop
from relay.core.outbox import Outbox, declared, ignore_lease_breaks
from relay.core.reads import Reads
from relay.core.recovery import Recovery
from relay.core.routes import Router
from relay.files.sync import Syncer
from relay.core.waker import Waker
from relay.core.work import Counts, Outcome, Work, fields

log = logging.getLogger(__name__)

BATCH = 256              # messages claimed per transaction
SCAN_BUDGET = 2048       # files registered per step
FRESH_KEPT = 100_000     # ids registered and not yet claimed whose rows are trusted as read
SWEEP_BATCH = retention.BATCH
ORPHAN_INTERVAL = 3600.0  # seconds between two removals of orphaned inbox tmp/ files
RESTART_KEYS = ("root", "state_dir", "federation", "metrics")    # what a reload cannot change under a running relay


def inline(fn, *args):
    """An executor's submit that runs `fn` at once, on the caller's thread."""
    done = concurrent.futures.Future()
    try:
        done.set_result(fn(*args))
    except BaseException as e:  # noqa: BLE001 - raised again by result(), where it is waited for
        done.set_exception(e)
    return done


class Relay(Handling, Loop):
    """The pipeline over one state directory. Ledger writes happen on the caller's thread."""

    def __init__(self, config, clock=time.time, sync_mode=None, batch=BATCH, fsync=None, submit=None):
        self.config = config
        # Where a batch's last sync runs while the next batch is read (group commit, finish()):
        # `submit(fn, *args)` -> a future; None: a thread of the syncer's. A seam for tests.
        self.submit = submit
        self._pending = None                    # the batch whose last sync runs: (works, linked, now, delivered, wait)
        self._fresh = set()     # ids this relay registered, not yet claimed: rows of its own making
        self.clock = clock
        self.batch = batch
        self.layout = Layout(config.root, config.state_dir).create()
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
        self.history = History(self.ledger)
        self.inbox = Inbox(self.layout, self.syncer)
        self.archive = Archive(self.layout, self.syncer)
        self.outbox = Outbox(self.layout, config.settle, self.syncer)
        self.recovery = Recovery(self.layout, self.ledger, self.history, self.archive, self.inbox, self.syncer)
        self.flow = flow.FlowControl(self.layout, self.history, self.inbox)
        self.bounces = bounces.Bounces(self.layout, self.ledger, self.history, self.syncer, config)
        self._archived = frozenset()            # the agents an operator archived, as the last batch saw them
        self.ids = IdGenerator()
        self.hooks = Hooks(config)              # on_deliver, run off this thread (hooks.py)
        self.wakes = Wake(config, self.hooks)   # [wake]: a line in each agent's tmux pane, on the same workers
        self.reads = Reads(self.layout, self.ledger)    # envelopes a Maildir client moved to cur/ (reads.py)
        # The federation's view from the loop: which recipients are on other nodes (routes.py).
        self.router = Router(config.federation, self.history) if config.federation else None
        if self.router is not None:             # the link recorded a bounce (a node refused a message)
            self.router.on_bounce = self._bounce_due
        self._local = set()
        self.hints = collections.deque()        # (kind, sender, name) from the watcher
        self.watch = None                       # the watcher run() reads itself, while it runs
        self.wake = Waker()                     # set by hints and by other threads; the loop sleeps on it
        self.left = []                          # what drain() gave up waiting for
        self.step_pause = STEP_PAUSE            # the wait after a failed step of run(), doubled
        self.failures = 0                       # steps of run() failed in a row
        self._scan = None                       # the full rescan in progress (a generator)
        self._known = None
        self._next_rescan = 0.0
        self._next_sweep = 0.0
        self._next_orphans = 0.0
        self._next_archive_retry = 0.0
        self._began = (0.0, 0.0)                # (now, clock()) when the current step began
        self.held_wait = MAX_HELD_WAIT          # the longest wait for a file held open (drain: its horizon)
        self._senders(config)
        ignore_lease_breaks()

    def _senders(self, config):
        """Whose outboxes are read: every agent's, or only the declared ones (outbox.Declared)."""
        self.outbox.declared = declared(config, self.history)

    def close(self):
        try:
            self.finish()           # a batch whose last sync still runs is recorded first
        except Exception:  # noqa: BLE001 - its rows stay processing: the next start recovers them
            log.exception("recording the last batch failed; the next start recovers it")
        self.hooks.stop()
        self.ledger.close()
        self.syncer.close()
        self.layout.close()
        self.wake.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- hints from the watcher (any thread) -------------------------------------------------

    def hint(self, kind, sender=None, name=None):
        """kind: 'file' (may be complete), 'closed' (complete), 'dir' (scan it), 'rescan'."""
        self.hints.append((kind, sender, name))
        self.wake.set()

    def hint_many(self, hints):
        """Several hints at once (one read of the watcher): one wake for them all."""
        self.hints.extend(hints)
        self.wake.set()

    # -- start ------------------------------------------------------------------------------

    def attest(self, mode, event="start", now=None):
        """Record in the ledger what its writer connection reports of its settings, with this
        process and the configured durability (health.attest): what `relay status` and
        `relay doctor` show. `mode`: "daemon" or "once"; `event`: "start" or "reload"."""
        return health.attest(self.ledger, self.history, self.config, mode, event,
                             self.clock() if now is None else now)

    def recover(self, now=None, stopped=True):
        """Crash and power-loss recovery (recovery.py), then a full rescan. Returns the number
        of messages recovered. `stopped`: relay stopped (this is a start), so what was being
        handled spends its claim budget; after a failed step of a running relay it does not."""
        now = self.clock() if now is None else now
        if self._pending is not None:
            self.finish()       # this relay's own batch in flight is recorded, not recovered
        self.outbox.read_ahead.drop()   # read for a step that failed, maybe before its registration
        recovered = self.recovery.recover(now, budget=max(1, self.config.max_retries), stopped=stopped,
                                          bounce=self.config.bounces)
        self.bounces.due = True
        self.flow.seed(now, self.config)
        self._next_orphans = now + ORPHAN_INTERVAL
        self._scan = None
        self._next_rescan = 0.0
        self._next_archive_retry = 0.0
        return recovered

    def remove_orphans(self, now):
        """Orphaned inbox tmp/ files removed now (recovery.py); the next time is scheduled."""
        removed = self.recovery.remove_orphans(now)
        self._next_orphans = now + ORPHAN_INTERVAL
        return removed

    # -- the step ---------------------------------------------------------------------------

    def step(self, now=None):
        """Move everything one batch further. Returns what was done."""
        now = self.clock() if now is None else now
        self._began = (now, self.clock())
        self.fs.recheck()           # look each directory up again: one may have been swapped
        counts = Counts()
        found = []
        for f in self._gather(now):
            if f.bad:
                self._refuse_name(f, now, counts)
            else:
                found.append(f)
        # Ids (and so the order messages are claimed, delivered and counted against the flow's
        # limits) follow the order the files were written, not the order a directory lists them.
        found.sort(key=lambda f: (f.sent_at, f.sender, f.name))
        day = day_of(now)
        registered, claimed = self.ledger.register_and_claim(
            [(self.ids.new(now), f.sender, f.name, f.sent_at) for f in found], now, self.batch,
            lambda sender, mid, name: self.layout.archive_rel(day, sender, mid, name), synced=False)
        counts.registered, counts.claimed = len(registered), len(claimed)
        self.outbox.read_ahead.bind(registered)
        for mid, sender, name in registered:
            # DEBUG: the line of its outcome names the file too (its archive or failed/ path)
            log.debug("%s discovered: outbox/%s/%s", mid, sender, name, **fields("discovered", mid, sender))
        if len(self._fresh) > FRESH_KEPT:
            self._fresh.clear()     # checked as any other row then
        self._fresh.update(mid for mid, _, _ in registered)
        if claimed:
            self._process(claimed, now, counts)
        if self._pending is not None and not (claimed and self._more_ready(claimed)):
            self.finish(counts)     # nothing to overlap its sync with: recorded now
        if now >= self._next_archive_retry:
            self._retry_archive(now, counts)
        if now >= self._next_sweep:
            result = self.sweep(now)
            counts.swept = result.archived + result.failed
            self._next_sweep = now if result.more else now + self.config.sweep_interval
        if now >= self._next_orphans:
            self.remove_orphans(now)
        self.reads.step(now)            # reads a Maildir client made (reads.py)
        if self.bounces.due:        # registered now, claimed by the next step
            counts.registered += self.bounces.emit(now)
        return counts

    def _bounce_due(self):
        """Another thread (the federation's link) recorded a bounce: emitted at the next step."""
        self.bounces.due = True
        self.wake.set()

    def phase(self):
        """The instant of a phase of the current step: the step's `now` plus the time the clock
        says has passed since the step began (an injected clock that stands still: `now`)."""
        now, began = self._began
        return now + max(0.0, self.clock() - began)

    def _gather(self, now):
        found = []
        if now >= self._next_rescan and self._scan is None:
            self._known = None
            self.bounces.due = True         # one another connection recorded (the federation's link)
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
            elif valid_agent(sender) and sender != SYSTEM and self.outbox.serves(sender):
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
        self.ledger.refuse_found(mid, f.sender, name, now, reason, rel,
                                 bounce=self.config.bounces and f.sender not in self._archived)
        counts.failed += 1
        log.error("%s from %s failed: %s", mid, f.sender, reason, **fields("failed", mid, f.sender))

    def known_agents(self, refresh=False):
        if self._known is None or refresh:
            self._known = self._local = self.layout.agent_names(self.config.agents)
            if self.router is not None:
                self._known = self._local | set(self.router.remote(self._local, refresh=True))
        return self._known

    def _process(self, rows, now, counts):
        fresh = {r["id"] for r in rows if r["id"] in self._fresh}
        self._fresh -= fresh
        readable = self.recovery.readable(rows, now, need=("archive_path",), fresh=fresh)
        counts.failed += len(rows) - len(readable)
        works = [Work.claimed(row) for row in readable]
        thorough = [w.id for w in works if w.thorough]
        had, shed = self.history.delivered_to(thorough), self.history.sheds_of(thorough)
        budget = self.config.batch_bytes
        for w in works:
            w.had = had.get(w.id, {})
            if budget <= 0:
                w.defer = True      # left for the next batch: this one holds enough bytes
                continue
            if not self._peek(w, now):
                self.ledger.sync()      # the claim before any file is taken (a no-op once synced)
                self._prepare(w, now)
            budget -= w.size + len(w.envelope) + (len(w.message.body) if w.message else 0)
        self.outbox.read_ahead.release(works)      # what was read ahead for a claim that did not take it
        # The previous batch is recorded before this one's ids and request ids are settled (a
        # repeat must see whether the first failed), admitted and delivered.
        self.finish(counts)
        identify(self.ledger, self.layout, works, now)
        ready = [w for w in works if not (w.refused or w.error or w.defer or w.duplicate_of)]
        self._archived = self.history.archived_agents()
        self.flow.admit(ready, now, self.config, self._archived, shed)
        ready = [w for w in ready if not w.refused]
        if self.router is not None:     # first tries only: a retry is published from its recorded row
            self._custody(works)        # what is published for another node is in the spool first
            ready = [w for w in ready if not (w.refused or w.error)]
            for w in ready:
                named = set(w.recipients)
                w.remote = {r: n for r, n in w.remote.items()
                            if r in named and r not in w.shed and r not in w.shed_before}
            self.router.offer([w for w in ready if w.remote and not w.thorough])
        # The claim was committed unsynced: it is synced with the envelopes, and the files read
        # before custody are taken between that sync and the links.
        if self.ledger.unsynced and self.syncer.durable:
            self.syncer.log_written(self.ledger.wal_fd(), self.ledger.synced)
        linked = self.inbox.deliver(ready, custody=lambda: self._custody(works))
        self._custody(works)        # where deliver did not: its sync failed, or nothing was ready
        delivered = self.phase()
        for w in works:
            self._settle(w, now)
        # One sync for the links into new/ and the archive moves: an original archived before its
        # links are durable is found there by recovery (its claim names the path) and delivered
        # again, idempotently. It runs while the next batch is claimed, taken and read (group
        # commit); finish() waits for it, then records this batch (T2).
        # With nothing more ready it runs here, without a hand-off to the syncer's thread.
        wait = self.syncer.flush_later("inbox new/, archive and outbox directories",
                                       self.submit if self._more_ready(rows) else inline)
        self._pending = (works, linked, now, delivered, wait)

    def _more_ready(self, claimed):
        """Whether another batch is likely ready at once (hints waiting, a rescan under way, or
        a full claim): then the last sync of this one overlaps the next step's reading. The
        watcher the loop reads itself (run's `watch`) is read first: what came during this step."""
        if self.watch is not None:
            self.watch.pump(0)
        return bool(self.hints) or self._scan is not None or len(claimed) >= self.batch

    def finish(self, counts=None):
        """Group commit: wait for the last sync of the batch that has one running, then record
        it (T2), count it in flow control, queue its hooks and report it. Every ordering of the
        pipeline holds: the batch's record follows its sync, and the next batch is admitted and
        written into the inboxes only after this record. Returns `counts` (or new Counts)."""
        counts = Counts() if counts is None else counts
        pending, self._pending = self._pending, None
        if pending is None:
            return counts
        works, linked, now, delivered, wait = pending
        try:
            wait()
        except DurabilityError as e:
            self.inbox.unlink(linked, e)
            for w in works:
                if w.outcome in (Outcome.ARCHIVED, Outcome.DELIVERED, Outcome.RETRY):
                    if w.outcome is Outcome.ARCHIVED:
                        w.path = w.archive_rel
                    w.outcome, w.refused = Outcome.FAILED, f"{e}; delivered to {', '.join(sorted(w.got)) or 'nobody'}"
                    w.failed_rel = None
                    log.error("%s: %s; the original stays at %s", w.id, e, w.path,
                              **fields("failed", w))
        owed = self.bounces.owed(works, self._archived, now)
        settled = self.phase()
        if self.ledger.record(now, works, delivered, settled, owed, registry.changes(works, settled)):
            self.bounces.due = True
        self.flow.commit(works, now, self.config)
        self.hooks.delivered(works)     # durable now: each new recipient's hook is queued
        self.wakes.delivered(works)     # and one wake per agent of the batch
        self.reads.delivered(works)
        if self.router is not None and any(w.remote and not w.offered for w in works):
            self.router.queued.set()        # the link publishes what this batch queued
        if self.router is not None:
            # What the loop wrote to the server is published already: the publisher reads the
            # replies now and marks the rows published (an acknowledgement read before this
            # record waits for it: federation/publisher.py).
            self.router.replied()
        for w in works:
            self._report(w, now, counts)
        return counts

    def abandon(self):
        """Drop the batch whose last sync runs, unrecorded (after a failed step): its rows stay
        processing, and recovery puts them back, delivering again idempotently."""
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                pending[-1]()
            except DurabilityError:
                pass
        if self.router is not None:
            self.router.replied()   # what the batch wrote to the server was written all the same

    def _custody(self, works):
        """Take custody of the files read before it (Outbox.peek), once the claim is durable
        (its log synced with the envelopes, or here by the ledger; a sync of it that failed
        failed the step before this: never retried)."""
        todo = [w for w in works if w.peeked is not None and w.path is None]
        if todo:
            self.ledger.sync()              # a no-op once the envelopes' flush synced the log
            self.fs.recheck("outbox")       # an outbox moved away since the read is not followed
        for w in todo:
            try:
                self.outbox.take(w)
            except Exception as e:  # noqa: BLE001 - isolate the message, keep the daemon alive
                log.exception("%s from %s: unexpected error while taking it", w.id, w.sender,
                              **fields("error", w))
                w.error = e if isinstance(e, DurabilityError) else TransientError(f"unexpected error: {e!r}"[:500])
                if w.path is not None and not self.fs.exists(w.path):
                    w.path = None
            w.data = b""        # kept for a private copy (Outbox.take)
            w.spooled = w.path is not None and w.path.startswith("spool/")
        taken = [w for w in todo if w.spooled]
        if taken and self.syncer.mode == "file":
            # Each directory is synced on its own there: the moves into the spool are durable
            # before any move out of it (into the archive), or a file could come back in both.
            try:
                self.syncer.flush("the outbox and spool directories")
            except DurabilityError as e:
                for w in taken:
                    w.error = e         # not delivered; quarantined (_settle)

    def _retry_archive(self, now, counts):
        counts.archived += self.recovery.retry_archive(now, self.batch, self.config.retry_backoff)
        nxt = self.history.next_archive_due()
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

    def reconfigure(self, config):
        """Apply a new configuration (a SIGHUP reload) between two steps: every key that changed,
        except a different root, state directory or federation (RESTART_KEYS), which only a
        restart can change; this relay keeps its own. Returns (keys applied, keys that need a restart)."""
        changed = [f.name for f in dataclasses.fields(config) if f.compare
                   and getattr(config, f.name) != getattr(self.config, f.name)]
        restart = [k for k in changed if k in RESTART_KEYS]
        if restart:         # this relay keeps what it runs with (the federation's link, too)
            config = dataclasses.replace(config, **{k: getattr(self.config, k) for k in restart})
        self.config = self.bounces.config = config
        self.outbox.settle = config.settle
        self.syncer.durable = config.durability == "full"
        self.ledger.set_durability(config.durability)
        self.hooks.configure(config)
        self.wakes.configure(config)
        if "agents" in changed:         # a newly listed agent gets its outbox and inbox now
            for problem in self.layout.init(config.agents):
                log.warning("%s", problem)
            self.syncer.flush("the state directory's layout")
            self._known = None
        self._senders(config)
        if "senders" in changed or "agents" in changed:
            self.hint("rescan")         # outboxes read now, or no longer
        now = self.clock()
        if "rescan_interval" in changed:
            self._next_rescan = min(self._next_rescan, now + config.rescan_interval)
        if "sweep_interval" in changed:
            self._next_sweep = min(self._next_sweep, now + config.sweep_interval)
        return [k for k in changed if k not in restart], restart
