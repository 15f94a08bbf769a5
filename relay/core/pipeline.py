"""A batch's way: claim -> read and parse -> admit -> hand over (federation) -> deliver -> settle
(archive, retry, defer, quarantine) -> record.

    found files -> [T1: register + claim, unsynced] -> read in the outbox, accept
      -> inbox tmp writes -> sync files and the ledger's log (T1 durable) -> custody (outbox ->
      spool) -> links into new/ -> spool -> archive (or failed/)
      -> sync directories (overlapping the next batch) -> [T2: deliveries per recipient, outcomes]

A file that is not plain (Outbox.peek), or a retry, is taken into the spool before it is read,
after the ledger syncs its log on its own. Group commit: the last sync of a batch (links and
moves) runs on a thread while the next step claims and reads its batch; `finish()` then records
the batch (T2) before the next one's request ids are settled, or it is admitted or delivered.

The Pipeline is given its parts (`Stages`: the file modules, the ledger, flow control, bounces,
the reader and settler, the router, and who hears of a delivery) and the relay's clock. It
writes the ledger (claims, records), the files (through the outbox, inbox and archive) and
`bounces.due`; it reads the intake only to ask whether more is ready (group commit)."""
import concurrent.futures
import dataclasses
import logging

from relay.core import registry
from relay.core.archive import day_of
from relay.core.identity import identify
from relay.core.settle import report
from relay.core.work import Counts, Outcome, Work, fields, recorded
from relay.errors import DurabilityError, TransientError
from relay.files.fs import shown
from relay.files.layout import fit

log = logging.getLogger(__name__)

FRESH_KEPT = 100_000     # ids registered and not yet claimed whose rows are trusted as read


def inline(fn, *args):
    """An executor's submit that runs `fn` at once, on the caller's thread."""
    done = concurrent.futures.Future()
    try:
        done.set_result(fn(*args))
    except BaseException as e:  # noqa: BLE001 - raised again by result(), where it is waited for
        done.set_exception(e)
    return done


@dataclasses.dataclass
class Stages:
    """What the pipeline works with: the relay's parts, named."""
    layout: object
    fs: object
    syncer: object
    ledger: object
    history: object
    outbox: object
    inbox: object
    archive: object
    recovery: object
    flow: object
    bounces: object
    ids: object
    reader: object              # reading.Reader: peek, prepare
    settler: object             # settle.Settler: settle
    router: object              # routes.Router or routes.Alone: the federation's one seam
    intake: object              # intake.Intake: more_ready()
    listeners: tuple = ()       # told of each recorded batch: `delivered(works)` (hooks, wakes, reads)


class Pipeline:
    def __init__(self, config, stages, clock, batch, submit=None):
        self.config, self.s, self.clock, self.batch = config, stages, clock, batch
        # Where a batch's last sync runs while the next batch is read (group commit, finish()):
        # `submit(fn, *args)` -> a future; None: a thread of the syncer's. A seam for tests.
        self.submit = submit
        self.pending = None             # the batch whose last sync runs: (works, linked, now, delivered, wait)
        self.fresh = set()              # ids this relay registered, not yet claimed: rows of its own making
        self.archived = frozenset()     # the agents an operator archived, as the last batch saw them
        self.began = (0.0, 0.0)         # (now, clock()) when the current step began

    def begin(self, now):
        self.began = (now, self.clock())

    def phase(self):
        """The instant of a phase of the current step: the step's `now` plus the time the clock
        says has passed since the step began (an injected clock that stands still: `now`)."""
        now, began = self.began
        return now + max(0.0, self.clock() - began)

    # -- claim ------------------------------------------------------------------------------

    def claim(self, found, now, counts):
        """Register the files found (quarantining a name that cannot be a message's) and claim
        a batch of what is due (T1, unsynced). Returns the claimed rows."""
        s = self.s
        plain = []
        if any(f.bad for f in found):
            self.archived = s.history.archived_agents()     # archived since the last batch: no bounce
        for f in found:
            if f.bad:
                self.refuse_name(f, now, counts)
            else:
                plain.append(f)
        # Ids (and so the order messages are claimed, delivered and counted against the flow's
        # limits) follow the order the files were written, not the order a directory lists them.
        plain.sort(key=lambda f: (f.sent_at, f.sender, f.name))
        day = day_of(now)
        registered, claimed = s.ledger.messages.register_and_claim(
            [(s.ids.new(now), f.sender, f.name, f.sent_at) for f in plain], now, self.batch,
            lambda sender, mid, name: s.layout.archive_rel(day, sender, mid, name), synced=False)
        counts.registered, counts.claimed = len(registered), len(claimed)
        s.outbox.read_ahead.bind(registered)
        for mid, sender, name in registered:
            # DEBUG: the line of its outcome names the file too (its archive or failed/ path)
            log.debug("%s discovered: outbox/%s/%s", mid, sender, name, **fields("discovered", mid, sender))
        if len(self.fresh) > FRESH_KEPT:
            self.fresh.clear()      # checked as any other row then
        self.fresh.update(mid for mid, _, _ in registered)
        return claimed

    def refuse_name(self, f, now, counts):
        """A file whose name cannot be a message name: quarantined at once, name escaped."""
        s = self.s
        mid = s.ids.new(now)
        name = fit(shown(f.name))
        rel = s.layout.failed_rel(f.sender, mid, name)
        reason = f"{f.bad} ('{name}'); rename it with a plain UTF-8 name and no control characters"
        try:
            s.archive.move(f"outbox/{f.sender}/{f.name}", rel)
            s.archive.write_report(rel, s.archive.report(mid, f.sender, name, reason, now, 0))
            s.syncer.flush("a quarantined file")
        except (OSError, DurabilityError) as e:
            log.error("outbox/%s/%s: %s; cannot quarantine it: %s", f.sender, name, f.bad, e)
            return
        s.ledger.messages.refuse_found(mid, f.sender, name, now, reason, rel,
                              bounce=self.config.bounces and f.sender not in self.archived)
        counts.failed += 1
        log.error("%s from %s failed: %s", mid, f.sender, reason, **fields("failed", mid, f.sender))

    # -- read, admit, deliver, settle -------------------------------------------------------

    def process(self, rows, now, counts):
        s = self.s
        works, shed = self._read(rows, now, counts)
        # The previous batch is recorded before this one's ids and request ids are settled (a
        # repeat must see whether the first failed), admitted and delivered.
        self.finish(counts)
        identify(s.ledger, s.layout, works, now)
        ready = [w for w in works if not (w.refused or w.error or w.defer or w.duplicate_of)]
        self.archived = s.history.archived_agents()
        s.flow.admit(ready, now, self.config, self.archived, shed)
        ready = [w for w in ready if not w.refused]
        ready = s.router.hand_over(works, ready, self.custody)
        # The claim was committed unsynced: it is synced with the envelopes, and the files read
        # before custody are taken between that sync and the links.
        if s.ledger.unsynced and s.syncer.durable:
            s.syncer.log_written(s.ledger.wal_fd(), s.ledger.synced)
        linked = s.inbox.deliver(ready, custody=lambda: self.custody(works))
        self.custody(works)         # where deliver did not: its sync failed, or nothing was ready
        delivered = self.phase()
        for w in works:
            s.settler.settle(w, now)
        # One sync for the links into new/ and the archive moves: an original archived before its
        # links are durable is found there by recovery (its claim names the path) and delivered
        # again, idempotently. It runs while the next batch is claimed, taken and read (group
        # commit); finish() waits for it, then records this batch (T2).
        # With nothing more ready it runs here, without a hand-off to the syncer's thread.
        wait = s.syncer.flush_later("inbox new/, archive and outbox directories",
                                    self.submit if s.intake.more_ready(rows, self.batch) else inline)
        self.pending = (works, linked, now, delivered, wait)

    def _read(self, rows, now, counts):
        """The claimed rows' works, read and parsed (before custody where a file allows, one
        sync for the claim and the envelopes), up to the batch's bytes; the rest deferred.
        Returns (works, the recipients shed by earlier attempts of the retries among them)."""
        s = self.s
        fresh = {r["id"] for r in rows if r["id"] in self.fresh}
        self.fresh -= fresh
        readable = s.recovery.readable(rows, now, need=("archive_path",), fresh=fresh)
        counts.failed += len(rows) - len(readable)
        works = [Work.claimed(row) for row in readable]
        earlier_attempt = [w.id for w in works if w.earlier_attempt]
        had, shed = s.history.delivered_to(earlier_attempt), s.history.sheds_of(earlier_attempt)
        budget = self.config.batch_bytes
        for w in works:
            w.delivered_before = had.get(w.id, {})
            if budget <= 0:
                w.defer = True      # left for the next batch: this one holds enough bytes
                continue
            if not s.reader.peek(w, now):
                s.ledger.sync()     # the claim before any file is taken (a no-op once synced)
                s.reader.prepare(w, now)
            budget -= w.size + len(w.envelope) + (len(w.message.body) if w.message else 0)
        s.outbox.read_ahead.release(works)      # what was read ahead for a claim that did not take it
        return works, shed

    def custody(self, works):
        """Take custody of the files read before it (Outbox.peek), once the claim is durable
        (its log synced with the envelopes, or here by the ledger; a sync of it that failed
        failed the step before this: never retried)."""
        s = self.s
        todo = [w for w in works if w.peeked is not None and w.path is None]
        if todo:
            s.ledger.sync()             # a no-op once the envelopes' flush synced the log
            s.fs.recheck("outbox")      # an outbox moved away since the read is not followed
        for w in todo:
            try:
                s.outbox.take(w)
            except Exception as e:  # noqa: BLE001 - isolate the message, keep the daemon alive
                log.exception("%s from %s: unexpected error while taking it", w.id, w.sender,
                              **fields("error", w))
                w.error = e if isinstance(e, DurabilityError) else TransientError(f"unexpected error: {e!r}"[:500])
                if w.path is not None and not s.fs.exists(w.path):
                    w.path = None
            w.data = b""        # kept for a private copy (Outbox.take)
            w.spooled = w.path is not None and w.path.startswith("spool/")
        taken = [w for w in todo if w.spooled]
        if taken and s.syncer.mode == "file":
            # Each directory is synced on its own there: the moves into the spool are durable
            # before any move out of it (into the archive), or a file could come back in both.
            try:
                s.syncer.flush("the outbox and spool directories")
            except DurabilityError as e:
                for w in taken:
                    w.error = e         # not delivered; quarantined (settle)

    # -- record -----------------------------------------------------------------------------

    def finish(self, counts=None):
        """Group commit: wait for the last sync of the batch that has one running, then record
        it (T2), count it in flow control, tell the listeners and report it. Every ordering of
        the pipeline holds: the batch's record follows its sync, and the next batch is admitted
        and written into the inboxes only after this record. Returns `counts` (or new Counts)."""
        counts = Counts() if counts is None else counts
        pending, self.pending = self.pending, None
        if pending is None:
            return counts
        s = self.s
        works, linked, now, delivered, wait = pending
        try:
            wait()
        except DurabilityError as e:
            s.inbox.unlink(linked, e)
            for w in works:
                if w.outcome in (Outcome.ARCHIVED, Outcome.DELIVERED, Outcome.RETRY):
                    if w.outcome is Outcome.ARCHIVED:
                        w.path = w.archive_rel
                    w.outcome, w.refused = Outcome.FAILED, f"{e}; delivered to {', '.join(sorted(w.delivered_now)) or 'nobody'}"
                    w.failed_rel = None
                    log.error("%s: %s; the original stays at %s", w.id, e, w.path,
                              **fields("failed", w))
        owed = s.bounces.owed(works, self.archived, now)
        settled = self.phase()
        if s.ledger.messages.record(now, [recorded(w) for w in works], delivered, settled, owed,
                                     registry.changes(works, settled)):
            s.bounces.due = True
        s.flow.commit(works, now, self.config)
        for listener in s.listeners:    # durable now: hooks queued, wakes typed, reads watched
            listener.delivered(works)
        s.router.recorded(works)
        for w in works:
            report(w, now, counts)
        return counts

    def abandon(self):
        """Drop the batch whose last sync runs, unrecorded (after a failed step): its rows stay
        processing, and recovery puts them back, delivering again idempotently."""
        pending, self.pending = self.pending, None
        if pending is not None:
            try:
                pending[-1]()
            except DurabilityError:
                pass
        self.s.router.abandoned()
