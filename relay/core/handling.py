"""One message's way through a batch, a mixin of the Relay: read before custody or taken into the
spool and read there, parsed, its recipients resolved (a name the team may still announce waits),
a spawn or release checked against the agent registry's rules (registry.py), then settled:
archived, retried with backoff, deferred, or quarantined with a report."""
import hashlib
import logging

from relay.core import flow, oversize, registry
from relay.core.loop import DRAIN_MIN_WAIT
from relay.core.message import accept
from relay.core.work import Outcome, backoff, fields
from relay.config import SYSTEM
from relay.errors import DurabilityError, MessageRefused, TooLarge, TransientError, UnknownRecipient

CONVERGE = 2.0           # seconds after a message was found that the directory is read before its unknown name fails
log = logging.getLogger("relay.core.daemon")     # the relay's loop logs as one


class Handling:
    """A mixin: see the module's docstring."""

    def _peek(self, w, now):
        """Read and parse a message before custody where its file allows (Outbox.peek): its
        envelopes are then synced with the claim, one sync for both. False: not read."""
        if w.thorough or w.spooled:
            return False
        try:
            if not self.outbox.peek(w, self.config.max_body_bytes):
                return False
            self._parse(w, now)
        except Exception as e:  # noqa: BLE001 - isolate the message, keep the daemon alive
            log.exception("%s from %s: unexpected error while reading it", w.id, w.sender,
                          **fields("error", w))
            w.error = TransientError(f"unexpected error: {e!r}"[:500])
        return True

    def _prepare(self, w, now):
        """Custody, reading and parsing of one message (the claim is durable). One message's
        unforeseen failure is logged with its id; the batch goes on."""
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
            log.exception("%s from %s: unexpected error while reading it", w.id, w.sender,
                          **fields("error", w))
            w.error = TransientError(f"unexpected error: {e!r}"[:500])

    def _parse(self, w, now):
        spawned = None
        try:
            accepted = accept(w.data, w.name, w.sender, self.known_agents, self.config, mid=w.id,
                              sent_at=w.sent_at, relayed_at=now, sha256=w.sha256)
            if accepted.message.kind in registry.KINDS:
                spawned = registry.check(accepted.message, self.known_agents, self.history.archived_agents)
        except UnknownRecipient as e:
            if self.router is not None and self._may_learn(w, e, now):
                return
            return flow.refused(w, e, self.known_agents())
        except MessageRefused as e:
            if isinstance(e, TooLarge) and e.parsed is None:    # what it says, for its record and bounce
                e.parsed = oversize.said(w.data, w.name, self.config.max_body_bytes)
            return flow.refused(w, e, self.known_agents())
        finally:
            if w.peeked is None:    # read before custody: kept until it (Outbox.take)
                w.data = b""        # the bytes are hashed and parsed; the batch need not hold them
        w.message, w.recipients = accepted.message, accepted.recipients
        if self.router is not None:
            w.remote = self.router.route(w.recipients, self._local)
        for name in accepted.created:
            self.layout.make_inbox(name)
            self._known = None
            log.info("%s: created the inbox of new agent %s", w.id, name, **fields("inbox-created", w))
        if spawned is not None:         # a new agent: its outbox and inbox, so that it can send and be written to
            for problem in self.layout.init([spawned]):
                log.warning("%s", problem)
            self._known = None
            log.info("%s: created the outbox and inbox of %s, spawned by %s", w.id, spawned, w.sender,
                     **fields("agent-created", w))
        w.envelope = accepted.envelope
        w.envelope_sha256 = hashlib.sha256(w.envelope).hexdigest()

    def _may_learn(self, w, e, now):
        """A recipient this node does not know may be one the team is still announcing: the
        message waits (a transient error, tried again within retry_period) until the directory
        has been read whole CONVERGE seconds after the message was found; only then does it fail
        ("did you mean"). True when it waits."""
        read_at, error = self.router.directory_state()
        since = w.discovered_at if w.discovered_at is not None else now
        if error is None and read_at is not None and read_at >= since + CONVERGE:
            return False
        self.router.ask()
        self._known = None
        why = f"the team's directory cannot be read: {error}" if error else "the team's directory is being read"
        w.message = e.parsed
        w.error = TransientError(f"{e} ({why}; the message waits for the name)"[:800])
        return True

    def _settle(self, w, now):
        """Decide the outcome of one work after delivery; archive or quarantine its file."""
        durability = next((e for e in w.missed.values() if isinstance(e, DurabilityError)), None)
        if w.refused or isinstance(w.error, DurabilityError) or durability:
            if durability and not w.refused:
                w.refused = f"{durability}; delivered to {', '.join(sorted(w.got)) or 'nobody'}"
            return self._quarantine(w, now)
        flow.report(self.archive, w, now)       # shed for some: the sender learns who, and why
        if w.defer:
            w.outcome = Outcome.DEFER
            # Held open for writing (found by the lease on the spooled file): looked at again
            # after the settle time, doubled at each claim that finds it still held, so that a
            # writer that never lets go does not cost a claim and a commit every settle time.
            w.next_attempt_at = now + backoff(max(self.config.settle, DRAIN_MIN_WAIT), w.attempts - 1,
                                              self.held_wait) if w.path else now
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
        own = getattr(w.message, "max_retries", None)      # the sender's MAX-RETRIES, at most the configured
        if own is not None:
            if w.retries + 1 > min(own, self.config.max_retries):
                w.refused = f"gave up after {w.retries + 1} attempts (MAX-RETRIES: {own}): {w.error}"
                return self._quarantine(w, now)
        elif w.retries + 1 > self.config.max_retries and now - since >= self.config.retry_period:
            return self._quarantine(w, now)
        w.outcome = Outcome.RETRY
        w.next_attempt_at = now + backoff(self.config.retry_backoff, w.retries)

    def _quarantine(self, w, now):
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

    def _report(self, w, now, counts):
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
