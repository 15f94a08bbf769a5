"""The loops that drive a Relay's steps (daemon.py): `drain()` for `relay run --once`, `run()` for
the daemon, with the wait between steps, the handling of a step that failed, and waking.

A part the Relay holds (relay.loop), given what it drives: the relay's `step(now)`,
`recover(now, stopped)`, `finish(counts)`, `abandon()` and `in_flight()`, its `config`, `clock`
and `ledger.path`; the intake (whether hints or a rescan wait), the schedule (`next_deadline`,
`waiting`; a drain writes its `held_wait` and `sweep_at`) and the wake it sleeps on."""
import gc
import logging
import sqlite3
import time

from relay.errors import LedgerCorrupt, sqlite_cause
from relay.core.retries import MAX_HELD_WAIT, compute_backoff
from relay.core.work import Counts

log = logging.getLogger(__name__)

DRAIN_PATIENCE = 10.0    # run --once waits this long for files that make no progress
DRAIN_MIN_WAIT = 0.05
DRAIN_DUE = 1.0          # run --once waits for a message due within this long (or settle, if longer)
DRAIN_FROZEN = 3         # waits in a row without the clock moving after which run --once gives up
MAX_IDLE = 3600.0        # the longest the daemon's loop waits when nothing is due
CHECK_EVERY = 1.0        # while the loop waits, seconds between two calls of the process's check
STEP_PAUSE = 1.0         # the wait after a failed step, doubled for each failure in a row
MAX_STEP_PAUSE = 60.0    # and at most this
GC_YOUNG = 20_000        # allocations between two collections of the youngest generation (Python's: 700)


def quiet_gc(young=GC_YOUNG):
    """For a process whose work is this loop (relay run, and the benchmark standing for it): what
    exists at start is frozen (never scanned again) and, with `young`, the youngest generation
    is collected every `young` allocations instead of 700. A step allocates a few objects per
    message and frees them by reference counting; the collector's passes over them cost about
    5% of run --once's CPU. The daemon keeps Python's 700 (young=None): a collection of 20,000
    objects in the middle of a step lengthened its p99 at 1,000 msg/s by a third. Not for a
    library caller: it changes the whole process."""
    gc.freeze()
    if young:
        gc.set_threshold(young, 20, 20)


class Loop:
    def __init__(self, relay, intake, schedule, wake):
        self.relay, self.intake, self.schedule, self.wake = relay, intake, schedule, wake
        self.left = []                          # what drain() gave up waiting for
        self.step_pause = STEP_PAUSE            # the wait after a failed step of run(), doubled
        self.failures = 0                       # steps of run() failed in a row

    def drain(self, wait=time.sleep, now_fn=None, patience=DRAIN_PATIENCE):
        """Recover, then step until every message present is delivered or failed (run --once).

        Files still settling are waited for, but no longer than `patience` without progress:
        what is left then (a file held open for writing, one that keeps changing) is listed in
        `self.left` as (path, why). Messages backing off after a transient error are left
        pending for the next run.
        """
        now_fn = now_fn or self.relay.clock
        self.schedule.held_wait = horizon = max(self.relay.config.settle, DRAIN_DUE)   # a file held open stays in sight
        try:
            return self._drain(wait, now_fn, patience, horizon)
        finally:
            self.schedule.held_wait = MAX_HELD_WAIT

    def _drain(self, wait, now_fn, patience, horizon):
        total = Counts()
        relay = self.relay
        self.left = []
        relay.recover(now_fn())
        self.schedule.sweep_at = 0.0
        progress_at = last_wait = now_fn()
        frozen = 0
        while True:
            counts = relay.step(now_fn())
            total.add(counts)
            now = now_fn()
            # A claim that only deferred its message again (its file still held open) is no
            # progress: patience runs out for it as for a file waiting in the outbox.
            if counts.registered or counts.archived or counts.bounced or counts.swept or counts.delivered or counts.failed \
                    or counts.retried or counts.claimed > counts.deferred:
                progress_at = now
            if counts.busy or self.intake.busy():
                continue
            deadline = self.schedule.next_deadline(now, horizon=horizon)
            if deadline is None:
                return total
            frozen = frozen + 1 if now <= last_wait else 0
            if now - progress_at >= patience or frozen > DRAIN_FROZEN:     # a clock that never moves: give up too
                self.left = self.schedule.waiting(now, DRAIN_DUE)
                return total
            last_wait = now
            wait(max(0.0, min(deadline - now, max(relay.config.settle, DRAIN_MIN_WAIT))))

    def run(self, stop, before=None, after=None, check=None, max_wait=None, watch=None):
        """The daemon's loop (relay run; recover() first): step whenever woken (the watcher's
        hints, a signal) or when next_deadline() comes, until `stop.is_set()` (set it, then
        `wake`). What only a process has comes in as callbacks on this thread: `before()` at
        the top of each turn (it may raise to end the loop), `after(counts)` after each step,
        `check()` every CHECK_EVERY seconds of a wait, which `max_wait` caps. `watch`: a file
        watcher this loop reads itself (watcher.Watcher: `fileno()`, None when it has no
        descriptor, and `pump(timeout)`, which hands its events' hints to this relay): its events
        are read at the top of each turn and wake the idle wait, with no thread between."""
        relay = self.relay
        total = Counts()
        while True:
            # Cleared before the flags are read: a signal from here on leaves the event set,
            # and the idle wait below returns at once instead of sleeping past it.
            self.wake.clear()
            if stop.is_set():
                relay.finish(total)
                return total
            if watch is not None:
                watch.pump(0)       # what came since the last turn, in one read
            if before is not None:
                before()
            counts = self.guarded_step()
            total.add(counts)
            if after is not None:
                after(counts)
            if self.intake.busy() or relay.in_flight():
                continue
            now = relay.clock()     # what the step left (a full claim, a sweep's next batch) is due now
            wait = self.schedule.next_deadline(now) - now
            if max_wait:
                wait = min(wait, max_wait)
            self._idle(max(0.0, min(wait, MAX_IDLE)), stop, check, watch)

    def guarded_step(self):
        """One step of the daemon's loop: an unforeseen error (a ledger locked past
        busy_timeout, a full disk under the ledger) is logged and waited out (`step_pause`,
        backing off; a wake ends it), and what the step had claimed is recovered."""
        try:
            counts = self.relay.step()
            self.failures = 0
            return counts
        except sqlite3.DatabaseError as e:
            if sqlite_cause(e) == "corrupt":      # no wait mends it: stop with what to do
                raise LedgerCorrupt(self.relay.ledger.path, e) from None
            return self._failed_step()
        except Exception:  # noqa: BLE001 - the daemon must outlive any one bad moment
            return self._failed_step()

    def _failed_step(self):
        """Log the failure (with its traceback: it was not foreseen), wait, recover."""
        pause = compute_backoff(self.step_pause, self.failures, MAX_STEP_PAUSE)
        log.exception("the relay step failed; retrying in %.0fs", pause)
        self.wake.wait(pause)
        self.failures += 1
        try:
            self.relay.abandon()
            self.relay.recover(stopped=False)     # relay did not stop: no claim budget is spent
        except Exception:  # noqa: BLE001
            log.exception("recovery after the failed step failed too; will try again")
        return Counts()

    def _idle(self, timeout, stop, check, watch=None):
        """Wait until woken (a file event of `watch` too), stopped or `timeout` passes, calling
        `check()` every CHECK_EVERY."""
        start = time.monotonic()
        deadline, next_check = start + timeout, start + CHECK_EVERY
        while not stop.is_set():
            now = time.monotonic()
            if now >= deadline or self.wake.is_set():
                return
            if now >= next_check:
                next_check = now + CHECK_EVERY
                if check is not None:
                    check()
            fd = watch.fileno() if watch is not None else None
            if self.wake.poll(min(deadline, next_check) - now, () if fd is None else (fd,)):
                watch.pump(0)       # its hints set the wake; events with no hint sleep on
