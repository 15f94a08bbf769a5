"""A claimed message's end in its batch: archived, retried with backoff, deferred, or quarantined
with a report; then counted and logged (`report`).

The Settler uses the archive (store, quarantine, report files) and the schedule (an archive
move that failed is tried again by `archive_retry_by`, a file held open waits at most
`held_wait`). It writes the work's outcome, error, refusal and next attempt."""
import logging

from relay.config import SYSTEM
from relay.core import flow
from relay.core.work import Outcome, backoff, fields
from relay.errors import DurabilityError, TransientError

HELD_MIN = 0.05          # the shortest wait before a file held open for writing is looked at again
log = logging.getLogger(__name__)


class Settler:
    def __init__(self, config, archive, schedule):
        self.config, self.archive, self.schedule = config, archive, schedule

    def settle(self, w, now):
        """Decide the outcome of one work after delivery; archive or quarantine its file."""
        durability = next((e for e in w.missed.values() if isinstance(e, DurabilityError)), None)
        if w.refused or isinstance(w.error, DurabilityError) or durability:
            if durability and not w.refused:
                w.refused = f"{durability}; delivered to {', '.join(sorted(w.got)) or 'nobody'}"
            return self.quarantine(w, now)
        flow.report(self.archive, w, now)       # shed for some: the sender learns who, and why
        if w.defer:
            w.outcome = Outcome.DEFER
            # Held open for writing (found by the lease on the spooled file): looked at again
            # after the settle time, doubled at each claim that finds it still held, so that a
            # writer that never lets go does not cost a claim and a commit every settle time.
            w.next_attempt_at = now + backoff(max(self.config.settle, HELD_MIN), w.attempts - 1,
                                              self.schedule.held_wait) if w.path else now
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
                self.schedule.archive_retry_by(w.next_attempt_at)
            return
        if w.error is None:
            w.error = TransientError("; ".join(f"not delivered to {r}: {e}" for r, e in sorted(w.missed.items())))
        since = w.failing_since if w.failing_since is not None else now
        own = getattr(w.message, "max_retries", None)      # the sender's MAX-RETRIES, at most the configured
        if own is not None:
            if w.retries + 1 > min(own, self.config.max_retries):
                w.refused = f"gave up after {w.retries + 1} attempts (MAX-RETRIES: {own}): {w.error}"
                return self.quarantine(w, now)
        elif w.retries + 1 > self.config.max_retries and now - since >= self.config.retry_period:
            return self.quarantine(w, now)
        w.outcome = Outcome.RETRY
        w.next_attempt_at = now + backoff(self.config.retry_backoff, w.retries)

    def quarantine(self, w, now):
        if w.refused is None:
            w.refused = f"gave up after {w.retries + 1} attempts: {w.error}" \
                if isinstance(w.error, TransientError) else str(w.error)
        delivered = sorted(set(w.got) | set(w.had))
        report = self.archive.report(w.id, w.sender, w.name, w.refused, now, w.retries + 1, delivered, flow.entries(w))
        try:
            w.failed_rel = self.archive.quarantine(w.path, w.sender, w.id, w.name, report)
        except (OSError, DurabilityError) as e:
            log.error("%s: could not quarantine the file (%s); it stays at %s", w.id, e, w.path,
                      **fields("failed", w))
            w.failed_rel = None
        w.outcome = Outcome.FAILED


def report(w, now, counts):
    """Count and log one work's outcome."""
    to = ",".join(w.recipients)
    counts.shed += flow.logged(w)
    if w.outcome is Outcome.FAILED:
        counts.failed += 1
        log.error("%s from %s failed: %s", w.id, w.sender, w.refused, **fields("failed", w))
    elif w.outcome is Outcome.DEFER:
        counts.deferred += 1
        if w.path:
            log.info("%s from %s is still open for writing; looking again shortly", w.id, w.sender,
                     **fields("deferred", w))
    elif w.duplicate_of:
        counts.archived += 1
        log.info("%s from %s repeats %s (request id %r): not delivered again; archived as %s",
                 w.id, w.sender, w.duplicate_of, w.request_id, w.archive_rel, **fields("duplicate", w))
    elif w.outcome is Outcome.ARCHIVED:
        counts.delivered += 1
        if w.sender == SYSTEM:      # a bounce (bounces.py): counted apart from the agents' messages
            counts.bounced += 1
        else:
            counts.archived += 1
        log.info("%s %s; archived as %s", w.id, _where(w), w.archive_rel, **fields("archived", w))
    elif w.outcome is Outcome.DELIVERED:
        counts.delivered += 1
        log.warning("%s delivered from %s to %s; archive move failed, will retry: %s",
                    w.id, w.sender, to, w.error, **fields("archive-failed", w))
    else:
        counts.retried += 1
        log.warning("%s from %s: %s; attempt %d failed, next in %.1fs%s", w.id, w.sender, w.error,
                    w.retries + 1, w.next_attempt_at - now,
                    f" (delivered to {', '.join(sorted(w.got))})" if w.got else "",
                    **fields("retried", w))


def _where(w):
    """Where a message archived went: "delivered from Ann to Bob", and the recipients queued
    for other nodes by node (delivered there once their node has them: relay show says when)."""
    here = [r for r in w.recipients if r not in w.remote]
    away = {}
    for r, node in sorted(w.remote.items()):
        away.setdefault(node, []).append(r)
    said = f"delivered from {w.sender} to {','.join(here)}" if here else f"from {w.sender}"
    return said + "".join(f"; queued for node {node}: {','.join(rs)}" for node, rs in away.items())
