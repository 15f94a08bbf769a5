"""The values a batch passes between stages: what a step did, one claimed message on its way, and
the fields a log line about a message carries. (Whether a claimed row is one this build can
read: history.unreadable.)"""
import dataclasses
import enum

from relay.ledger.outcome import OutcomeRecord, Said, ShedFor
from relay.core.retries import MAX_BACKOFF, compute_backoff as backoff  # noqa: F401 - the name its users import


class Outcome(str, enum.Enum):
    """What became of a claimed message in one batch (the ledger records each kind)."""
    ARCHIVED = "archived"       # delivered to every recipient, original archived
    DELIVERED = "delivered"     # delivered to every recipient, the archive move failed
    RETRY = "retry"             # some or all recipients are tried again after a backoff
    DEFER = "defer"             # still open for writing, or left for the next batch
    FAILED = "failed"           # quarantined

    def __str__(self):
        return self.value


@dataclasses.dataclass
class Counts:
    registered: int = 0
    claimed: int = 0
    delivered: int = 0
    archived: int = 0
    failed: int = 0
    retried: int = 0
    deferred: int = 0
    swept: int = 0
    shed: int = 0           # recipients shed (flow.py)
    bounced: int = 0        # bounces delivered to their senders and archived (bounces.py), not in `archived`

    def add(self, other):
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def busy(self):
        return bool(self.registered or self.claimed or self.archived or self.bounced or self.swept)


@dataclasses.dataclass(frozen=True)
class Shed:
    """Why one recipient does not get a message (flow.py): the reason, the limit in force and
    the value observed, and a sentence for the sender."""
    reason: str             # body_size, per_pair_rate, queue_limit, recipient_archived
    limit: float = None
    observed: float = None
    text: str = ""

    def __str__(self):
        return f"{self.reason}: {self.text}" if self.text else self.reason


@dataclasses.dataclass(frozen=True)
class Claim:
    """A claimed row's facts, as the claim read them: they do not change while its batch runs."""
    id: str
    sender: str
    name: str
    archive_rel: str = None         # the archive path the claim recorded
    retries: int = 0                # failed attempts before this one
    attempts: int = 1               # claims of this message, this one included
    spooled: bool = False           # its file was in the spool already
    discovered_at: float = None
    failing_since: float = None
    spool_id: str = None            # the id its spool file is named by, when a sender chose another

    @classmethod
    def of(cls, row):
        """The Claim of a row the ledger's claim returned."""
        return cls(row["id"], row["sender"], row["name"], row["archive_path"], row["retries"], row["attempts"],
                   bool(row["spooled"]), row["discovered_at"], row["failing_since"], row["spool_id"])


# What the pipeline learns about a message on its way, with each one's value before it learns it
# (a callable: a new one for each work). The message itself, once parsed, is a frozen Message.
LEARNED = {
    "request_id": None,
    "duplicate_of": None,           # the id of the message this one repeats (same request id)
    "path": None,                   # relative path of the file now (spool, or outbox when not regular)
    "refused": None,                # permanent reason: quarantined
    "error": None,                  # transient or durability error of the message as a whole
    "defer": False,
    "peeked": None,                 # (dev, inode, size, mtime ns, ctime ns, mode) of the file read before custody
    "data": b"",
    "size": 0,
    "sha256": None,
    "sent_at": None,
    "written": None,                # when flow control counts it written: sent_at, no later than relay's clock
    "message": None,                # the parsed message (message.Message, frozen), or what a refusal kept of it
    "recipients": (),
    "envelope": b"",
    "envelope_sha256": None,
    "delivered_before": dict,       # recipient -> (size, sha256) already recorded
    "delivered_now": dict,          # recipient -> (size, sha256) delivered now
    "failed_for": dict,             # recipient -> error
    "remote": dict,                 # recipient on another node -> node (queued)
    "offered": False,               # handed to the link for every node at once (routes.Router.offer)
    "shed": dict,                   # recipient -> Shed, decided in this batch
    "shed_before": dict,            # recipient -> reason recorded by an earlier attempt
    "failed_rel": None,
    "next_attempt_at": 0.0,
    "outcome": None,                # Outcome
}


class Work:
    """One message on its way through a batch: its `claim` (frozen: the row's facts) and what the
    pipeline learns about it (LEARNED). The claim's sender, name, retries, attempts and times are
    read through it and cannot be changed; the id, archive path and spool id start as the
    claim's and change when the sender's chosen id is taken (identity.py)."""
    __slots__ = ("claim", "id", "archive_rel", "spool_id", "spooled", "earlier_attempt", *LEARNED)

    def __init__(self, id, sender, name, archive_rel=None, retries=0, earlier_attempt=False, attempts=1,
                 spooled=False, discovered_at=None, failing_since=None, spool_id=None, claim=None, **learned):
        claim = claim or Claim(id, sender, name, archive_rel, retries, attempts, spooled, discovered_at,
                               failing_since, spool_id)
        self.claim = claim
        self.id, self.archive_rel, self.spool_id, self.spooled = claim.id, claim.archive_rel, claim.spool_id, claim.spooled
        self.earlier_attempt = earlier_attempt      # an earlier attempt may have delivered to some recipients
        for key, value in LEARNED.items():
            setattr(self, key, value() if callable(value) else value)
        for key, value in learned.items():
            if key not in LEARNED:
                raise TypeError(f"Work has no {key!r}")
            setattr(self, key, value)

    @classmethod
    def claimed(cls, row):
        """The Work of a row the ledger's claim returned."""
        claim = Claim.of(row)
        return cls(claim.id, claim.sender, claim.name, earlier_attempt=claim.attempts > 1, claim=claim)

    sender = property(lambda self: self.claim.sender)
    name = property(lambda self: self.claim.name)
    retries = property(lambda self: self.claim.retries)
    attempts = property(lambda self: self.claim.attempts)
    discovered_at = property(lambda self: self.claim.discovered_at)
    failing_since = property(lambda self: self.claim.failing_since)

    def __repr__(self):
        return f"Work({self.id!r}, {self.sender!r}, {self.name!r}, outcome={self.outcome})"

    @property
    def error_text(self):
        return None if self.error is None else str(self.error)

    @property
    def complete(self):
        """Every recipient holds it (recorded before, or delivered in this batch), or, on another
        node, has it queued for the link in this batch's transaction; or it repeats a message sent
        before and is not delivered again."""
        if self.duplicate_of is not None:
            return not self.failed_for
        return bool(self.recipients) and not self.failed_for and all(
            r in self.delivered_now or r in self.delivered_before or r in self.remote or r in self.shed or r in self.shed_before
            for r in self.recipients)


def recorded(w):
    """The ledger's record of a work's outcome (ledger/outcome.py), built at the boundary: the
    ledger records it, never the work itself."""
    m = w.message
    said = None if m is None else Said(m.kind, m.thread, m.subject, m.body, m.headers, tuple(m.to), m.content_type,
                                       m.max_retries, m.priority, m.ack_required)
    return OutcomeRecord(
        w.id, w.sender, w.outcome.value, said, tuple(w.recipients), w.discovered_at, w.retries, w.size, w.sha256,
        w.sent_at, w.archive_rel, w.failed_rel, w.spooled, w.next_attempt_at, w.error_text, w.refused,
        bool(w.duplicate_of), tuple((r, size, sha) for r, (size, sha) in w.delivered_now.items()), tuple(w.delivered_before),
        tuple(ShedFor(r, s.reason, s.limit, s.observed, str(s)) for r, s in w.shed.items()), tuple(w.shed_before),
        tuple(w.remote.items()), w.envelope, w.earlier_attempt)


def fields(event, mid, sender=None, recipients=None):
    """The `extra=` of a log line about one message: its id, sender, recipients and the event,
    carried as fields of the record (the JSON log format writes them out). `mid` may be the
    message's Work, which gives all three."""
    if isinstance(mid, Work):
        mid, sender, recipients = mid.id, mid.sender, mid.recipients
    return {"extra": {"relay_event": event, "relay_id": mid, "relay_from": sender,
                      "relay_to": list(recipients) if recipients else []}}
