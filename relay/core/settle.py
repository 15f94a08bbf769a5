"""A claimed message's end in its batch: the retry policy (retries.py) decides, the Settler acts:
archives the original, quarantines it with a report, or leaves it to be claimed again; then each
work is counted and logged (`report`).

The Settler uses the archive (store, quarantine, report files) and the schedule (an archive
move that failed is tried again by `archive_retry_by`, a file held open waits at most
`held_wait`). It writes the work's outcome, error, refusal and next attempt."""
import logging

from relay.config import SYSTEM
from relay.core import flow
from relay.core.retries import Action, Facts, Retries
from relay.core.work import Outcome, fields
from relay.errors import DurabilityError, TransientError

log = logging.getLogger(__name__)


def facts(w):
    """What the retry policy decides from, of one work after its batch's delivery."""
    return Facts(retries=w.retries, attempts=w.attempts, failing_since=w.failing_since,
                 max_retries=getattr(w.message, "max_retries", None), refused=w.refused, error=w.error,
                 failed_for=tuple(w.failed_for.items()), delivered=tuple(w.delivered_now), defer=w.defer, held=bool(w.path),
                 complete=w.complete)


class Settler:
    def __init__(self, config, archive, schedule):
        self.archive, self.schedule = archive, schedule
        self.config = config

    @property
    def config(self):
        return self._config

    @config.setter
    def config(self, config):
        self._config = config
        self.retries = Retries.of(config)

    def settle(self, w, now):
        """Act on the policy's decision for one work after delivery."""
        decision = self.retries.decide(facts(w), now, self.schedule.held_wait)
        action, w.error = decision.action, decision.error
        if action is Action.REFUSE:
            w.refused = decision.reason
            return self.quarantine(w, now)
        flow.report(self.archive, w, now)       # shed for some: the sender learns who, and why
        if action is Action.FAIL:
            w.refused = decision.reason
            return self.quarantine(w, now)
        if action is Action.ARCHIVE:
            return self._archive(w, now)
        w.outcome = Outcome.DEFER if action is Action.DEFER else Outcome.RETRY
        w.next_attempt_at = decision.next_attempt_at

    def _archive(self, w, now):
        try:
            self.archive.store(w.path, w.archive_rel)
            w.outcome = Outcome.ARCHIVED
        except OSError as e:
            w.outcome = Outcome.DELIVERED
            w.error = TransientError(f"moving the original to {w.archive_rel}: {e.strerror or e}")
            w.next_attempt_at = self.retries.archive_again(now)
            self.schedule.archive_retry_by(w.next_attempt_at)

    def quarantine(self, w, now):
        """Move the original into failed/ with a report of why (w.refused), who had it and the sheds."""
        delivered = sorted(set(w.delivered_now) | set(w.delivered_before))
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
                    f" (delivered to {', '.join(sorted(w.delivered_now))})" if w.delivered_now else "",
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
