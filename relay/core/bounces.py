"""Bounces: a sender hears of a message that failed, or that was shed for some of its recipients,
or that another node refused (contract §4, "senders hear of failure"), as mail does. relay
sends it a message from System, kind "bounce", naming the message (id, subject, to whom), the
reason and what to do, in the message's thread (its id when it has none).

Once, and exactly once: what is owed is recorded in the transaction that records the failure
(ledger/bounces.py: one per message and recipient set, never for a message from System or of
kind bounce, so never a bounce of a bounce); `emit()` then writes the bounce as a file in the
spool (written whole, synced, renamed into place) and registers it, with the same id whatever
crashed when, as a pending message from System. From there it goes the way of every message:
claimed, delivered once into the sender's inbox (on_deliver wakes it), archived, in the
ledger. A bounce whose own delivery fails is quarantined like any message, and bounces nothing.
`bounces = false` in relay.toml turns them off."""
import logging

import orjson

from relay.config import SYSTEM
from relay.core.message import BROADCAST
from relay.core.work import Outcome, fields
from relay.errors import DurabilityError
from relay.ledger.bounces import KIND
from relay.ledger.rows import sift

log = logging.getLogger(__name__)

BATCH = 256             # bounces emitted per step at most
LOAD_LIMITS = ("per_pair_rate", "queue_limit")     # sheds that bounce once a window (Bounces.owed)
QUIET_DEFAULT = 600.0   # that window when pair_window is 0
QUIET_KEPT = 10_000     # windows kept before the past ones are dropped

# What to do, by the words of the reason (the first that matches).
HINTS = (
    ("unknown recipient", "check the name (`relay agents` lists the agents; --create makes a new one on "
                          "purpose) and send it again"),
    ("per_pair_rate", "you sent them more than `pair_rate` messages in `pair_window` (a loop between two agents "
                      "is stopped this way; do not answer this notice): wait, then send it again. Until the "
                      "window has passed, what else is shed on the way to them brings no other notice"),
    ("queue_limit", "their inbox is full (they do not read it): send it again once they have read their "
                    "messages. Until `pair_window` has passed, what else is shed on the way to them brings no "
                    "other notice"),
    ("recipient_archived", "an operator retired them (relay archive-agent): send it to another agent"),
    ("body_size", "the body is over `max_body_bytes`: send it in smaller parts"),
    ("max_body_bytes", "the body is over `max_body_bytes`: send it in smaller parts"),
)
DEFAULT_HINT = "fix what the reason says and send it again; an operator can deliver this one as it is with"


def owed(works, archived=frozenset(), quiet=None):
    """(message id, sender, recipients, reason) of each work of a recorded batch whose sender is
    owed a bounce: failed (for every recipient that does not hold it), or delivered and archived
    while shed for some. None for a message from System, a duplicate, or a sender an operator
    archived (`archived`). `quiet(sender, recipient, reason)`: whether a shed for a load limit
    (per_pair_rate, queue_limit) bounces (Bounces.quiet)."""
    out = []
    for w in works:
        if w.sender == SYSTEM or w.duplicate_of or w.sender in archived:
            continue
        if w.outcome is Outcome.FAILED:
            held = set(w.delivered_now) | set(w.delivered_before) | set(w.remote)
            whom = [r for r in w.recipients if r not in held] or sorted(w.shed) or (
                [n for n in w.message.to if n not in BROADCAST] if w.message is not None else [])
            if quiet is not None and w.shed and whom and all(quiet(w.sender, r, _reason(w, r)) for r in whom):
                continue
            out.append((w.id, w.sender, whom, w.refused))
        elif w.outcome in (Outcome.ARCHIVED, Outcome.DELIVERED) and (w.shed or w.shed_before):
            sheds = {**w.shed_before, **w.shed}
            whom = sorted(r for r in sheds if r not in w.delivered_now and r not in w.delivered_before)
            if quiet is not None and whom and all(quiet(w.sender, r, _reason(w, r)) for r in whom):
                continue
            if whom:
                reasons = "; ".join(f"shed for {r} ({sheds[r]})" for r in whom)
                out.append((w.id, w.sender, whom, reasons))
    return out


def _reason(w, r):
    """The shed reason of recipient `r` of a work (decided now, or by an earlier attempt)."""
    shed = w.shed.get(r)
    return shed.reason if shed is not None else w.shed_before.get(r)


def of_row(row, delivered, reason):
    """The bounce owed for a message failed outside a batch (recovery): its row, the recipients
    that hold it, the reason."""
    try:
        recipients = orjson.loads(row["recipients"]) if row["recipients"] else []
    except orjson.JSONDecodeError:
        recipients = []
    return row["id"], row["sender"], [r for r in recipients if r not in delivered], reason


def hint(reason, mid):
    low = reason.lower()
    for words, text in HINTS:
        if words in low:
            return text
    return f"{DEFAULT_HINT} `relay retry {mid}`"


def document(b, limit):
    """The bounce's file (JSON, contract §2) for a row of history.bounces.due(), its body cut
    to `limit` bytes (max_body_bytes)."""
    mid, reason = b["message_id"], b["reason"]
    try:
        whom = [r for r in orjson.loads(b["recipients"]) if isinstance(r, str)]
    except orjson.JSONDecodeError:
        whom = []
    subject = b["subject"]
    quoted = f' "{subject}"' if subject else ""
    body = (f"Your message {mid}{quoted} was not delivered to {', '.join(whom) or 'its recipients'}.\n\n"
            f"Why: {reason}\n\nWhat to do: {hint(reason, mid)}.\n\n`relay show {mid}` tells its whole story.\n")
    if len(body.encode()) > limit:
        body = body.encode()[:max(0, limit - 3)].decode("utf-8", "ignore") + "..."
    return orjson.dumps({
        "to": b["sender"], "kind": KIND, "thread": b["thread"] or mid,
        "subject": f"Undelivered: {subject}" if subject else f"Undelivered: your message {mid}",
        "body": body, "bounce_of": mid, "failed_recipients": whom, "reason": reason})


class Bounces:
    """Writes the bounces owed into the spool and registers them (the relay's loop, each step
    when some may be due)."""

    def __init__(self, layout, ledger, history, syncer, config):
        self.layout, self.ledger, self.history, self.syncer = layout, ledger, history, syncer
        self.config = config
        self.quiet_until = {}   # (sender, recipient, reason) -> until when its sheds bounce no more
        self.now = 0.0
        self.due = True         # bounces may be owed and not emitted: look (at start, after a
                                # batch recorded some, at each rescan, when the link says so)
        # `relay run --once` passes over what is present when it starts: the bounces owed before
        # then are delivered, those its own pass owes wait for the next run or the daemon.
        self.before = None

    def owed(self, works, archived, now):
        """The bounces a recorded batch owes (owed()), with a shed for a load limit bounced once
        per sender, recipient and reason in a `pair_window` (10 minutes when that is 0): an
        agent that answers every message, bounces too, would otherwise keep alive the very loop
        `pair_rate` stops, each shed bringing a bounce and each bounce an answer. Kept in
        memory: a restart may bounce one more."""
        if not self.config.bounces:
            return []
        self.now = now
        if len(self.quiet_until) > QUIET_KEPT:
            self.quiet_until = {k: t for k, t in self.quiet_until.items() if t > now}
        return owed(works, archived, self.quiet)

    def quiet(self, sender, recipient, reason):
        """Whether a shed of `reason` from `sender` to `recipient` bounces no more now; the first
        in a window does, and starts it."""
        if reason not in LOAD_LIMITS:
            return False
        key = (sender, recipient, reason)
        if self.quiet_until.get(key, 0.0) > self.now:
            return True
        self.quiet_until[key] = self.now + (self.config.pair_window or QUIET_DEFAULT)
        return False

    def emit(self, now, limit=BATCH):
        """Emit up to `limit` bounces owed; returns how many were registered. A bounce whose file
        cannot be written waits for the next look (logged)."""
        if not self.due:
            return 0
        bad = []
        rows = list(sift(self.history.bounces.due(limit, self.before), bad, "bounces"))
        for b in bad:
            log.error("%s; no bounce is sent for it", b)
        self.due = len(rows) + len(bad) >= limit
        fsync = self.syncer.fsync if self.syncer.durable else False
        done = []
        for b in rows:
            if not b["registered"]:         # (recovery registered one whose file was in the spool)
                try:
                    self.layout.fs.put(self.layout.spool_rel(SYSTEM, b["id"], KIND), document(b, self.config.max_body_bytes),
                                       fsync=fsync)
                except (OSError, DurabilityError) as e:
                    log.error("%s: cannot write the bounce %s to %s: %s; tried again later", b["message_id"], b["id"],
                              b["sender"], e, **fields("bounce-failed", b["message_id"], b["sender"]))
                    continue
            done.append((b["id"], b["message_id"], b["sender"]))
            log.info("%s: bounce %s to %s", b["message_id"], b["id"], b["sender"],
                     **fields("bounced", b["message_id"], b["sender"]))
        if done or bad:
            self.ledger.bounces.bounced(now, done, skipped=[b.key for b in bad])
        return len(done)
