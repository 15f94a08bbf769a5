"""What the ledger records of one message a batch handled (`ledger.messages.record`): a narrow,
frozen record of the ledger's own, with exactly what the record writes. The pipeline builds one
per message at the boundary, where a batch is recorded; the ledger knows rows and these
records, not the pipeline's working object."""
import dataclasses

STATUSES = ("archived", "delivered", "retry", "defer", "failed")


@dataclasses.dataclass(frozen=True)
class Said:
    """What the message said, as its row keeps it."""
    kind: str = None
    thread: str = None
    subject: str = None
    body: str = None
    headers: dict = dataclasses.field(default_factory=dict)
    to: tuple = ()                  # the names it was addressed to, as written
    content_type: str = None
    max_retries: int = None         # the sender's MAX-RETRIES
    priority: str = None
    ack_required: bool = False


@dataclasses.dataclass(frozen=True)
class ShedFor:
    """One recipient shed by flow control in this batch."""
    recipient: str
    reason: str                     # body_size, per_pair_rate, queue_limit, recipient_archived
    limit: float = None
    observed: float = None
    said: str = ""                  # the reason and its sentence, for the event

    def __str__(self):
        return self.said or self.reason


@dataclasses.dataclass(frozen=True)
class OutcomeRecord:
    """One message's outcome in a batch: `status` (STATUSES) and what its row, its deliveries,
    sheds, outbound rows, receipts and search index record."""
    id: str
    sender: str
    status: str
    message: Said = None            # None: never read or parsed
    recipients: tuple = ()          # as resolved (empty: refused before they were)
    discovered_at: float = None
    retries: int = 0                # failed attempts before this one
    size: int = 0
    sha256: str = None
    sent_at: float = None
    archive_rel: str = None
    failed_rel: str = None
    spooled: bool = False
    next_attempt_at: float = 0.0
    error: str = None               # the transient error (retry, defer, delivered, failed)
    refused: str = None             # why it failed
    duplicate: bool = False         # repeats a message sent before (same request id): delivered to no one
    delivered: tuple = ()           # (recipient, size, sha256) of each copy written in this batch
    delivered_before: tuple = ()    # recipients an earlier attempt delivered to
    sheds: tuple = ()               # ShedFor of this batch
    shed_before: tuple = ()         # recipients an earlier attempt shed
    remote: tuple = ()              # (recipient, node) of the recipients on other nodes, queued
    envelope: bytes = b""           # what is queued for them
    earlier_attempt: bool = False   # an earlier attempt may have queued them already

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown outcome {self.status!r}")

    @property
    def shed_whole(self):
        """Failed because it was shed for every recipient (shed_keep.py keeps what audit needs)."""
        return (self.message is not None and self.status == "failed" and bool(self.sheds or self.shed_before)
                and not self.delivered and not self.delivered_before)

    @property
    def queued(self):
        """Its recipients on other nodes get an outbound row: not a duplicate, nor a message
        that failed outright with no copy delivered."""
        return bool(self.remote) and not self.duplicate and not (self.refused and self.status == "failed"
                                                                 and not self.delivered)
