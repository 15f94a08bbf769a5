"""When the relay's next work falls due: the full rescan of the outboxes, the retention sweep, the
removal of orphaned inbox tmp/ files, the archive moves tried again, and how long a file held open
for writing may wait before it is looked at again (`held_wait`). `next_deadline()` is the one
instant the loop sleeps to: these and what the outbox, the ledger and the reads have due.

The Schedule holds times only; the relay's step does the work when a time comes and tells it
(`swept`, `orphans_removed`, `archive_retry_by`, ...). It reads outbox.next_deadline() and
outbox.left(), history.next_due(), history.waiting() and reads.due(); it writes nothing of theirs."""

from relay.core.retries import MAX_HELD_WAIT

ORPHAN_INTERVAL = 3600.0  # seconds between two removals of orphaned inbox tmp/ files


class Schedule:
    def __init__(self, config, outbox, history, reads):
        self.config, self.outbox, self.history, self.reads = config, outbox, history, reads
        self.rescan_at = 0.0            # the next full rescan of the outboxes
        self.sweep_at = 0.0             # the next batch of the retention sweep
        self.orphans_at = 0.0           # the next removal of orphaned inbox tmp/ files
        self.archive_retry_at = 0.0     # the next archive move of a delivered message tried again
        self.held_wait = MAX_HELD_WAIT  # the longest wait for a file held open (drain: its horizon)

    def configure(self, config, changed, now):
        """A reload: an interval made shorter takes effect now."""
        self.config = config
        if "rescan_interval" in changed:
            self.rescan_at = min(self.rescan_at, now + config.rescan_interval)
        if "sweep_interval" in changed:
            self.sweep_at = min(self.sweep_at, now + config.sweep_interval)

    def recovered(self, now):
        """After recovery: a rescan and the archive moves at once, the orphans in an interval."""
        self.rescan_at = 0.0
        self.archive_retry_at = 0.0
        self.orphans_at = now + ORPHAN_INTERVAL

    def rescanned(self, now):
        self.rescan_at = now + self.config.rescan_interval

    def swept(self, now, more):
        """A batch of the sweep ran: the next one at once when `more` is left."""
        self.sweep_at = now if more else now + self.config.sweep_interval

    def orphans_removed(self, now):
        self.orphans_at = now + ORPHAN_INTERVAL

    def archive_retry_by(self, at):
        """An archive move failed: tried again no later than `at`."""
        self.archive_retry_at = min(self.archive_retry_at, at)

    def archive_retried(self, nxt):
        """The archive moves due were tried; `nxt` is when the next one is due (or None)."""
        self.archive_retry_at = nxt if nxt is not None else float("inf")

    def next_deadline(self, now, horizon=None):
        """When the next step has work, or None: the next look at a file still settling, the
        next pending message due and the scheduled work (rescan, sweep, orphans, archive
        retries, reads). With `horizon` (drain), only the messages present count, and a pending
        one only when it is due within `horizon` seconds of `now`."""
        deadlines = [d for d in (self.outbox.next_deadline(),) if d is not None]
        due = self.history.next_due()
        if due is not None and (horizon is None or due - now <= horizon):
            deadlines.append(due)
        if horizon is None:
            deadlines += [self.rescan_at, self.sweep_at, self.orphans_at, self.archive_retry_at]
            deadlines += [d for d in (self.reads.due(),) if d is not None]
        return min(deadlines, default=None)

    def waiting(self, now, within):
        """What a drain leaves: (path, why) of the files still settling and the messages due
        later than `within` seconds."""
        return [(p, why) for p, why, _ in self.outbox.left(now, 0)] + self.history.waiting(now, within)
