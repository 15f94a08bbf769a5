"""The relay over one state directory: `step(now)` moves every message it can one batch further.

Relay composes its parts and is none of them:

    intake     what a step looks at: the watcher's hints, the rescan under way (intake.py)
    pipeline   a batch's way: claim -> read and parse -> admit -> deliver -> settle -> record
               (pipeline.py, with reading.py and settle.py)
    schedule   when the next work falls due: rescans, sweeps, orphans, archive moves, the
               deadline the loop sleeps to (schedule.py)
    loop       drain() for run --once, run() for the daemon, the wait between steps (loop.py)
    router     the federation's one seam: a Router on a node of a team, Alone on one machine
               (routes.py)

and the modules they use: recovery.py, message.py, retention.py, flow.py, bounces.py, the
files/ package and the ledger's parts. `step()`, `drain()` and `run()` are its public faces; service.py supplies
what only a process has around run().
"""
import dataclasses
import logging
import time

from relay.core import bounces, flow, health, retention
from relay.core.archive import Archive
from relay.ledger.history import History
from relay.core.hooks import Hooks
from relay.core.intake import Intake
from relay.core.wake import Wake
from relay.ids import IdGenerator
from relay.core.inbox import Inbox
from relay.files.layout import Layout
from relay.ledger.ledger import Ledger
from relay.core.loop import DRAIN_PATIENCE, Loop
from relay.core.outbox import Outbox, ignore_sigio
from relay.core.senders import declared
from relay.core.pipeline import Pipeline, Stages
from relay.core.reading import Reader
from relay.core.reads import Reads
from relay.core.recovery import Recovery
from relay.core.routes import Alone, KnownAgents, Router
from relay.core.schedule import Schedule
from relay.core.settle import Settler
from relay.files.sync import Syncer
from relay.core.waker import Waker
from relay.core.work import Counts

log = logging.getLogger(__name__)

BATCH = 256              # messages claimed per transaction
SWEEP_BATCH = retention.BATCH
RESTART_KEYS = ("root", "state_dir", "federation", "metrics")    # what a reload cannot change under a running relay


class Relay:
    """The pipeline over one state directory. Ledger writes happen on the caller's thread."""

    def __init__(self, config, clock=time.time, sync_mode=None, batch=BATCH, fsync=None, submit=None):
        self.config = config
        self.clock = clock
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
        self.ids = IdGenerator()
        self._hooks = Hooks(config)             # on_deliver, run off this thread (hooks.py)
        self._wakes = Wake(config, self._hooks)     # [wake]: a line in each agent's tmux pane, on the same workers
        self.reads = Reads(self.layout, self.ledger)    # envelopes a Maildir client moved to cur/ (reads.py)
        self._wake = Waker()                    # set by hints and by other threads; the loop sleeps on it
        # The federation's one seam: which recipients are on other nodes, and the link (routes.py).
        self.router = Router(config.federation, self.history) if config.federation else Alone()
        self.router.on_bounce = self._bounce_due    # the link recorded a bounce (a node refused a message)
        self.known = KnownAgents(self.layout, config, self.router)
        self.schedule = Schedule(config, self.outbox, self.history, self.reads)
        self.intake = Intake(self.outbox, self.schedule, self.known, self.bounces, self._wake)
        self.reader = Reader(config, self.layout, self.outbox, self.history, self.known, self.router)
        self.settler = Settler(config, self.archive, self.schedule)
        self.pipeline = Pipeline(config, Stages(
            layout=self.layout, fs=self.fs, syncer=self.syncer, ledger=self.ledger, history=self.history,
            outbox=self.outbox, inbox=self.inbox, archive=self.archive, recovery=self.recovery,
            flow=self.flow, bounces=self.bounces, ids=self.ids, reader=self.reader, settler=self.settler,
            router=self.router, intake=self.intake, listeners=(self._hooks, self._wakes, self.reads)),
            clock, batch, submit)
        self.loop = Loop(self, self.intake, self.schedule, self._wake)
        self._senders(config)
        ignore_sigio()

    def _senders(self, config):
        """Whose outboxes are read: every agent's, or only the declared ones (senders.Declared)."""
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

    # -- the public faces: the loops, hints, and what the loop reads -------------------------

    def drain(self, wait=time.sleep, now_fn=None, patience=DRAIN_PATIENCE):
        """Recover, then step until every message present is delivered or failed (run --once):
        see Loop.drain. What is left is in `left`."""
        return self.loop.drain(wait, now_fn, patience)

    def run(self, stop, before=None, after=None, check=None, max_wait=None, watch=None):
        """The daemon's loop (relay run; recover() first): see Loop.run."""
        self.intake.watch = watch
        try:
            return self.loop.run(stop, before, after, check, max_wait, watch)
        finally:
            self.intake.watch = None

    def guarded_step(self):
        return self.loop.guarded_step()

    def next_deadline(self, now, horizon=None):
        return self.schedule.next_deadline(now, horizon)

    @property
    def left(self):
        """What drain() gave up waiting for: (path, why)."""
        return self.loop.left

    @property
    def failures(self):
        """Steps of run() failed in a row."""
        return self.loop.failures

    @property
    def step_pause(self):
        """The wait after a failed step of run(), doubled for each failure in a row."""
        return self.loop.step_pause

    @step_pause.setter
    def step_pause(self, seconds):
        self.loop.step_pause = seconds

    # The seams tests and benchmarks swap (Relay.hooks = Hooks(...), batch = 2, wake = ...):
    # the parts that hold them are given the new one.

    @property
    def hooks(self):
        """on_deliver's runner (hooks.py): told of each recorded batch."""
        return self._hooks

    @hooks.setter
    def hooks(self, hooks):
        self._hooks = hooks
        self._listen()

    @property
    def wakes(self):
        """[wake]'s notices (wake.py): told of each recorded batch."""
        return self._wakes

    @wakes.setter
    def wakes(self, wakes):
        self._wakes = wakes
        self._listen()

    def _listen(self):
        if hasattr(self, "pipeline"):
            self.pipeline.s.listeners = (self.hooks, self.wakes, self.reads)

    @property
    def batch(self):
        """Messages claimed per transaction."""
        return self.pipeline.batch

    @batch.setter
    def batch(self, n):
        self.pipeline.batch = n

    @property
    def wake(self):
        """The Waker the loop sleeps on, set by hints and by other threads."""
        return self._wake

    @wake.setter
    def wake(self, waker):
        self._wake = self.intake.wake = self.loop.wake = waker

    @property
    def hints(self):
        return self.intake.hints

    def hint(self, kind, sender=None, name=None):
        """kind: 'file' (may be complete), 'closed' (complete), 'dir' (scan it), 'rescan'."""
        self.intake.hint(kind, sender, name)

    def hint_many(self, hints):
        """Several hints at once (one read of the watcher): one wake for them all."""
        self.intake.hint_many(hints)

    def known_agents(self, refresh=False):
        return self.known(refresh)

    def in_flight(self):
        """A batch's last sync runs, its record still to come (finish)."""
        return self.pipeline.pending is not None

    def finish(self, counts=None):
        """Record the batch whose last sync runs (Pipeline.finish). Returns `counts`."""
        return self.pipeline.finish(counts)

    def abandon(self):
        """Drop the batch whose last sync runs, unrecorded (Pipeline.abandon)."""
        self.pipeline.abandon()

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
        if self.pipeline.pending is not None:
            self.finish()       # this relay's own batch in flight is recorded, not recovered
        self.outbox.read_ahead.drop()   # read for a step that failed, maybe before its registration
        recovered = self.recovery.recover(now, budget=max(1, self.config.max_retries), stopped=stopped,
                                          bounce=self.config.bounces)
        self.bounces.due = True
        self.flow.seed(now, self.config)
        self.schedule.recovered(now)
        self.intake.scan = None
        return recovered

    def remove_orphans(self, now):
        """Orphaned inbox tmp/ files removed now (recovery.py); the next time is scheduled."""
        removed = self.recovery.remove_orphans(now)
        self.schedule.orphans_removed(now)
        return removed

    # -- the step ---------------------------------------------------------------------------

    def step(self, now=None):
        """Move everything one batch further. Returns what was done."""
        now = self.clock() if now is None else now
        self.pipeline.begin(now)
        self.fs.recheck()           # look each directory up again: one may have been swapped
        counts = Counts()
        claimed = self.pipeline.claim(self.intake.gather(now), now, counts)
        if claimed:
            self.pipeline.process(claimed, now, counts)
        if self.in_flight() and not (claimed and self.intake.more_ready(claimed, self.batch)):
            self.finish(counts)     # nothing to overlap its sync with: recorded now
        if now >= self.schedule.archive_retry_at:
            counts.archived += self.recovery.retry_archive(now, self.batch, self.config.retry_backoff)
            self.schedule.archive_retried(self.history.next_archive_due())
        if now >= self.schedule.sweep_at:
            result = self.sweep(now)
            counts.swept = result.archived + result.failed
            self.schedule.swept(now, result.more)
        if now >= self.schedule.orphans_at:
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
        """The instant of a phase of the current step (Pipeline.phase)."""
        return self.pipeline.phase()

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
        for part in (self.known, self.reader, self.settler, self.pipeline):
            part.config = config
        self.outbox.settle = config.settle
        self.syncer.durable = config.durability == "full"
        self.ledger.set_durability(config.durability)
        self.hooks.configure(config)
        self.wakes.configure(config)
        if "agents" in changed:         # a newly listed agent gets its outbox and inbox now
            for problem in self.layout.init(config.agents):
                log.warning("%s", problem)
            self.syncer.flush("the state directory's layout")
            self.known.forget()
        self._senders(config)
        if "senders" in changed or "agents" in changed:
            self.hint("rescan")         # outboxes read now, or no longer
        self.schedule.configure(config, changed, self.clock())
        return [k for k in changed if k not in restart], restart
