"""One claimed message read and parsed: read before custody where its file allows (`peek`), or
taken into the spool and read there (`prepare`); then parsed (message.accept), its recipients
resolved (a name the team may still announce waits: the router's `wait_for`), a spawn or
release checked against the agent registry's rules (registry.py), and its envelope made.

The Reader uses the outbox (take, peek, read), the layout (inboxes and outboxes of agents a
message creates), history.archived_agents, the known agents (and tells them to `forget()` when
it made an agent) and the router (where each recipient lives). It writes only the work it reads."""
import hashlib
import logging

from relay.core import flow, oversize, registry
from relay.core.message import accept
from relay.core.work import fields
from relay.errors import MessageRefused, TooLarge, TransientError, UnknownRecipient

log = logging.getLogger(__name__)


class Reader:
    def __init__(self, config, layout, outbox, history, known, router):
        self.config, self.layout, self.outbox, self.history = config, layout, outbox, history
        self.known, self.router = known, router

    def peek(self, w, now):
        """Read and parse a message before custody where its file allows (Outbox.peek): its
        envelopes are then synced with the claim, one sync for both. False: not read."""
        if w.earlier_attempt or w.spooled:
            return False
        try:
            if not self.outbox.peek(w, self.config.max_body_bytes):
                return False
            self.parse(w, now)
        except Exception as e:  # noqa: BLE001 - isolate the message, keep the daemon alive
            log.exception("%s from %s: unexpected error while reading it", w.id, w.sender,
                          **fields("error", w))
            w.error = TransientError(f"unexpected error: {e!r}"[:500])
        return True

    def prepare(self, w, now):
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
            self.parse(w, now)
        except Exception as e:  # noqa: BLE001 - isolate the message, keep the daemon alive
            log.exception("%s from %s: unexpected error while reading it", w.id, w.sender,
                          **fields("error", w))
            w.error = TransientError(f"unexpected error: {e!r}"[:500])

    def parse(self, w, now):
        spawned = None
        try:
            accepted = accept(w.data, w.name, w.sender, self.known, self.config, mid=w.id,
                              sent_at=w.sent_at, relayed_at=now, sha256=w.sha256)
            if accepted.message.kind in registry.KINDS:
                spawned = registry.check(accepted.message, self.known, self.history.archived_agents)
        except UnknownRecipient as e:
            since = w.discovered_at if w.discovered_at is not None else now
            waits = self.router.wait_for(e, since, now)
            if waits is not None:       # the team may still announce the name: tried again
                w.message, w.error = e.parsed, waits
                self.known.forget()
                return
            return flow.refused(w, e, self.known())
        except MessageRefused as e:
            if isinstance(e, TooLarge) and e.parsed is None:    # what it says, for its record and bounce
                e.parsed = oversize.said(w.data, w.name, self.config.max_body_bytes)
            return flow.refused(w, e, self.known())
        finally:
            if w.peeked is None:    # read before custody: kept until it (Outbox.take)
                w.data = b""        # the bytes are hashed and parsed; the batch need not hold them
        w.message, w.recipients = accepted.message, accepted.recipients
        w.remote = self.router.route(w.recipients, self.known.local)
        for name in accepted.created:
            self.layout.make_inbox(name)
            self.known.forget()
            log.info("%s: created the inbox of new agent %s", w.id, name, **fields("inbox-created", w))
        if spawned is not None:         # a new agent: its outbox and inbox, so that it can send and be written to
            for problem in self.layout.init([spawned]):
                log.warning("%s", problem)
            self.known.forget()
            log.info("%s: created the outbox and inbox of %s, spawned by %s", w.id, spawned, w.sender,
                     **fields("agent-created", w))
        w.envelope = accepted.envelope
        w.envelope_sha256 = hashlib.sha256(w.envelope).hexdigest()
