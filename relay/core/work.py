"""The values a batch passes between rooms: what a step did, one claimed message on its way, and
the fields a log line about a message carries. (Whether a claimed row is one this build can
read: history.unreadable.)"""
import dataclasses
import enum

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


@dataclasses.dataclass(eq=False)
class Work:
    """One claimed message on its way through a batch."""
    id: str
    sender: str
    name: str
    archive_rel: str
    retries: int
    thorough: bool                  # an earlier attempt may have delivered to some recipients
    attempts: int = 1               # claims of this message, this one included
    spooled: bool = False
    discovered_at: float = None
    failing_since: float = None
    spool_id: str = None            # the id its spool file is named by, when a sender chose another
    request_id: str = None
    duplicate_of: str = None        # the id of the message this one repeats (same request id)
    path: str = None                # relative path of the file now (spool, or outbox when not regular)
    refused: str = None             # permanent reason: quarantined
    error: Exception = None         # transient or durability error of the message as a whole
    defer: bool = False
    peeked: tuple = None            # (dev, inode, size, mtime ns, ctime ns, mode) of the file read before custody
    data: bytes = b""
    size: int = 0
    sha256: str = None
    sent_at: float = None
    written: float = None           # when flow control counts it written: sent_at, no later than relay's clock
    message: object = None
    recipients: list = ()
    envelope: bytes = b""
    envelope_sha256: str = None
    had: dict = dataclasses.field(default_factory=dict)        # recipient -> (size, sha256) already recorded
    got: dict = dataclasses.field(default_factory=dict)        # recipient -> (size, sha256) delivered now
    missed: dict = dataclasses.field(default_factory=dict)     # recipient -> error
    remote: dict = dataclasses.field(default_factory=dict)     # recipient on another node -> node (queued)
    offered: bool = False           # handed to the link for every node at once (routes.Router.offer)
    shed: dict = dataclasses.field(default_factory=dict)       # recipient -> Shed, decided in this batch
    shed_before: dict = dataclasses.field(default_factory=dict)  # recipient -> reason recorded by an earlier attempt
    archived: bool = False
    failed_rel: str = None
    next_attempt_at: float = 0.0
    outcome: Outcome = None

    @classmethod
    def claimed(cls, row):
        """The Work of a row the ledger's claim returned."""
        return cls(id=row["id"], sender=row["sender"], name=row["name"], archive_rel=row["archive_path"],
                   retries=row["retries"], thorough=row["attempts"] > 1, attempts=row["attempts"], spooled=bool(row["spooled"]),
                   discovered_at=row["discovered_at"], failing_since=row["failing_since"],
                   spool_id=row["spool_id"])

    @property
    def error_text(self):
        return None if self.error is None else str(self.error)

    @property
    def complete(self):
        """Every recipient holds it (recorded before, or delivered in this batch), or, on another
        node, has it queued for the link in this batch's transaction; or it repeats a message sent
        before and is not delivered again."""
        if self.duplicate_of is not None:
            return not self.missed
        return bool(self.recipients) and not self.missed and all(
            r in self.got or r in self.had or r in self.remote or r in self.shed or r in self.shed_before
            for r in self.recipients)


def fields(event, mid, sender=None, recipients=None):
    """The `extra=` of a log line about one message: its id, sender, recipients and the event,
    carried as fields of the record (the JSON log format writes them out). `mid` may be the
    message's Work, which gives all three."""
    if isinstance(mid, Work):
        mid, sender, recipients = mid.id, mid.sender, mid.recipients
    return {"extra": {"relay_event": event, "relay_id": mid, "relay_from": sender,
                      "relay_to": list(recipients) if recipients else []}}
