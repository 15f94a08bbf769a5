"""The ledger's schema: its migrations in order. A migration once released never changes (its
checksum is recorded in the ledger and checked at open); a change of schema is a new one."""
import enum
import hashlib
import logging
import sqlite3
import time

from relay.errors import SchemaError


# A message's status in the messages table (contract §3: its state machine).
class Status(str, enum.Enum):
    PENDING = "pending"
    PROCESSING = "processing"
    DELIVERED = "delivered"
    ARCHIVED = "archived"
    FAILED = "failed"

    def __str__(self):
        return self.value


STATUSES = tuple(s.value for s in Status)

log = logging.getLogger(__name__)

# Why a delivery to one recipient was shed (the sheds table's `reason`; flow.py decides them).
REASONS = ("body_size", "per_pair_rate", "queue_limit", "recipient_archived")

# An agent's state in the registry (the agent_registry table's `state`; core/registry.py decides it).
AGENT_STATES = ("active", "inactive")

MIGRATIONS = [
    (1, "initial schema", """
CREATE TABLE messages (
    id              TEXT PRIMARY KEY,
    sender          TEXT NOT NULL,
    name            TEXT NOT NULL,
    status          TEXT NOT NULL,
    spooled         INTEGER NOT NULL DEFAULT 0,
    recipients      TEXT,
    kind            TEXT,
    thread          TEXT,
    subject         TEXT,
    body            TEXT,
    headers         TEXT,
    size            INTEGER,
    sha256          TEXT,
    sent_at         REAL,
    discovered_at   REAL NOT NULL,
    claimed_at      REAL,
    delivered_at    REAL,
    archived_at     REAL,
    failed_at       REAL,
    retries         INTEGER NOT NULL DEFAULT 0,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL DEFAULT 0,
    error           TEXT,
    archive_path    TEXT,
    failed_path     TEXT
);
CREATE UNIQUE INDEX messages_unclaimed_path ON messages(sender, name)
    WHERE spooled = 0 AND status IN ('pending', 'processing');
CREATE INDEX messages_due ON messages(status, next_attempt_at, id);
CREATE INDEX messages_archived_at ON messages(archived_at) WHERE status = 'archived';
CREATE INDEX messages_failed_at ON messages(failed_at) WHERE status = 'failed';
CREATE INDEX messages_thread ON messages(thread, id);
CREATE INDEX messages_sender ON messages(sender, id);
CREATE TABLE deliveries (
    message_id   TEXT NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    recipient    TEXT NOT NULL,
    delivered_at REAL NOT NULL,
    PRIMARY KEY (message_id, recipient)
) WITHOUT ROWID;
CREATE INDEX deliveries_recipient ON deliveries(recipient, message_id);
CREATE TABLE events (
    seq        INTEGER PRIMARY KEY,
    message_id TEXT,
    at         REAL NOT NULL,
    event      TEXT NOT NULL,
    detail     TEXT,
    actor      TEXT NOT NULL DEFAULT 'relay'
);
CREATE INDEX events_message ON events(message_id, seq);
CREATE TABLE agents (
    name       TEXT PRIMARY KEY,
    first_seen REAL NOT NULL,
    last_seen  REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE chain (
    seq        INTEGER PRIMARY KEY,
    message_id TEXT NOT NULL UNIQUE,
    hash       TEXT NOT NULL
);
CREATE TABLE checkpoints (
    seq     INTEGER PRIMARY KEY,
    at      REAL NOT NULL,
    upto    INTEGER NOT NULL,
    head    TEXT NOT NULL,
    removed INTEGER NOT NULL
);
"""),
    (2, "per-recipient deliveries", """
ALTER TABLE deliveries ADD COLUMN size INTEGER;
ALTER TABLE deliveries ADD COLUMN sha256 TEXT;
ALTER TABLE messages ADD COLUMN failing_since REAL;
"""),
    (3, "ids chosen by senders, request ids", """
ALTER TABLE messages ADD COLUMN spool_id TEXT;
ALTER TABLE messages ADD COLUMN request_id TEXT;
ALTER TABLE messages ADD COLUMN duplicate_of TEXT;
CREATE INDEX messages_spool_id ON messages(spool_id) WHERE spool_id IS NOT NULL;
CREATE INDEX messages_request ON messages(sender, request_id) WHERE request_id IS NOT NULL
"""),
    (4, "flow control and operator commands", """
CREATE TABLE sheds (
    message_id TEXT NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    recipient  TEXT NOT NULL,
    sender     TEXT NOT NULL,
    reason     TEXT NOT NULL,
    limit_value REAL,
    observed   REAL,
    at         REAL NOT NULL,
    released_at REAL,
    PRIMARY KEY (message_id, recipient)
) WITHOUT ROWID;
CREATE INDEX sheds_pair ON sheds(sender, recipient, reason);
CREATE INDEX sheds_at ON sheds(at);
CREATE TABLE commands (
    id        TEXT PRIMARY KEY,
    verb      TEXT NOT NULL,
    arguments TEXT NOT NULL,
    actor     TEXT NOT NULL,
    at        REAL NOT NULL,
    result    TEXT
) WITHOUT ROWID;
CREATE TABLE pings (
    id      TEXT PRIMARY KEY,
    agent   TEXT NOT NULL,
    sent_at REAL NOT NULL,
    actor   TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX pings_agent ON pings(agent, sent_at);
CREATE TABLE archived_agents (
    name   TEXT PRIMARY KEY,
    at     REAL NOT NULL,
    actor  TEXT NOT NULL
) WITHOUT ROWID;
ALTER TABLE messages ADD COLUMN expired_at REAL;
UPDATE messages SET expired_at = failed_at WHERE status = 'failed' AND EXISTS (
    SELECT 1 FROM events e WHERE e.message_id = messages.id AND e.event = 'expired' AND e.seq > coalesce(
        (SELECT max(r.seq) FROM events r WHERE r.message_id = messages.id AND r.event = 'retry'), 0));
"""),
    # Attested durability (ledger/ledger.py): each connection's settings, recorded as it opens
    # the ledger; and how many of a message's attempts were interrupted (relay stopped mid-batch).
    (5, "attested durability; interrupted attempts", """
CREATE TABLE attestations (
    seq             INTEGER PRIMARY KEY,
    at              REAL NOT NULL,
    pid             INTEGER NOT NULL,
    host            TEXT NOT NULL,
    version         TEXT NOT NULL,
    mode            TEXT NOT NULL,
    event           TEXT NOT NULL,
    durability      TEXT NOT NULL,
    journal_mode    TEXT NOT NULL,
    synchronous     TEXT NOT NULL,
    busy_timeout_ms INTEGER NOT NULL,
    foreign_keys    INTEGER NOT NULL
);
ALTER TABLE messages ADD COLUMN interrupted INTEGER NOT NULL DEFAULT 0;
"""),
    # Federation (relay/federation/). A message received from another node is a row like any
    # other, with the node it came from and its stream entry id; one sent to agents of other
    # nodes has one outbound row per node (its own state, retries, the entry id once published).
    (6, "federation over Redis Streams", """
ALTER TABLE messages ADD COLUMN node TEXT;
ALTER TABLE messages ADD COLUMN entry_id TEXT;
CREATE TABLE outbound (
    message_id      TEXT NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    node            TEXT NOT NULL,
    recipients      TEXT NOT NULL,
    envelope        BLOB NOT NULL,
    status          TEXT NOT NULL,
    queued_at       REAL NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL DEFAULT 0,
    error           TEXT,
    entry_id        TEXT,
    published_at    REAL,
    PRIMARY KEY (message_id, node)
) WITHOUT ROWID;
CREATE INDEX outbound_due ON outbound(status, next_attempt_at);
CREATE TABLE remote_agents (
    name      TEXT PRIMARY KEY,
    node      TEXT NOT NULL,
    last_seen REAL
) WITHOUT ROWID;
CREATE TABLE link (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    node       TEXT NOT NULL,
    connected  INTEGER NOT NULL,
    since      REAL NOT NULL,
    error      TEXT,
    conflicts  TEXT,
    updated_at REAL NOT NULL
);
"""),
    # Ids bound to their senders (ledger/senders.py): the id relay send gave each sender.
    (7, "ids bound to their senders", """
CREATE TABLE sent_ids (
    id     TEXT PRIMARY KEY,
    sender TEXT NOT NULL,
    at     REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX sent_ids_at ON sent_ids(at)
"""),
    # The agents declared as senders (senders = "declared"; ledger/senders.py).
    (8, "declared senders", """
CREATE TABLE declared_agents (
    name TEXT PRIMARY KEY,
    at   REAL NOT NULL,
    how  TEXT NOT NULL
) WITHOUT ROWID
"""),
    # Federation, second protocol (relay/federation/): a message for another node is done at the
    # sender only once that node acknowledged its durable delivery; the receiver keeps the ids it
    # received, by node (not swept with the messages), so that a replay is refused, and a message
    # whose id is taken here keeps the sender's as remote_id under one of its own; the link records when
    # the team's directory was last read, or why it cannot be. Rows published under the first
    # protocol (streams no node reads any more) are published again, and known by their ids.
    (9, "federation: end-to-end acknowledgements, received ids, the directory's state", """
ALTER TABLE outbound ADD COLUMN acked_at REAL;
ALTER TABLE outbound ADD COLUMN ack_deadline REAL;
CREATE INDEX outbound_node ON outbound(node, status);
CREATE TABLE received_ids (
    node     TEXT NOT NULL,
    id       TEXT NOT NULL,
    sha256   TEXT NOT NULL,
    at       REAL NOT NULL,
    local_id TEXT NOT NULL,
    PRIMARY KEY (node, id)
) WITHOUT ROWID;
CREATE INDEX received_ids_at ON received_ids(at);
ALTER TABLE messages ADD COLUMN remote_id TEXT;
INSERT OR IGNORE INTO received_ids (node, id, sha256, at, local_id)
    SELECT node, id, sha256, discovered_at, id FROM messages WHERE node IS NOT NULL AND sha256 IS NOT NULL;
ALTER TABLE link ADD COLUMN directory_at REAL;
ALTER TABLE link ADD COLUMN directory_error TEXT;
UPDATE outbound SET status = 'pending', next_attempt_at = 0 WHERE status = 'published';
"""),
    # A request id `relay send` gave with an id (senders.py): a send that repeats it is known
    # while the first message still waits in the outbox, before relay has read it.
    (20, "request ids of the ids relay send gave", """
ALTER TABLE sent_ids ADD COLUMN request_id TEXT;
CREATE INDEX sent_ids_request ON sent_ids(sender, request_id) WHERE request_id IS NOT NULL
"""),
    # Bounces (bounces.py): what a sender is owed for a message that failed or was shed for some
    # of its recipients, once per (message, recipient set), recorded in the transaction that
    # records the failure; `emitted_at` once the bounce is a message of its own (id `id`, from
    # System) in the spool and the ledger.
    (21, "bounces to senders", """
CREATE TABLE bounces (
    message_id TEXT NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    recipients TEXT NOT NULL,
    id         TEXT NOT NULL UNIQUE,
    sender     TEXT NOT NULL,
    reason     TEXT NOT NULL,
    at         REAL NOT NULL,
    emitted_at REAL,
    PRIMARY KEY (message_id, recipients)
) WITHOUT ROWID;
CREATE INDEX bounces_due ON bounces(at) WHERE emitted_at IS NULL
"""),
    # Full-text search (ledger/search.py): each message's subject and the first 4096 characters of
    # its body (search_docs, the external content), indexed by FTS5 (search); the messages already
    # in the ledger are indexed here.
    (30, "full-text search", """
CREATE TABLE search_docs (
    seq        INTEGER PRIMARY KEY,
    message_id TEXT NOT NULL UNIQUE,
    subject    TEXT,
    body       TEXT
);
CREATE VIRTUAL TABLE search USING fts5(subject, body, content='search_docs', content_rowid='seq',
    tokenize='unicode61 remove_diacritics 2');
INSERT INTO search_docs (message_id, subject, body)
    SELECT id, subject, substr(body, 1, 4096) FROM messages
    WHERE duplicate_of IS NULL AND (subject IS NOT NULL OR body IS NOT NULL) ORDER BY id;
INSERT INTO search (rowid, subject, body) SELECT seq, subject, body FROM search_docs
"""),
    # File reservations (ledger/reservations.py): a row while a lease is held (released and
    # expired ones are deleted, each change an event); the notices from System to a holder
    # when someone was refused on its paths, kept until written into its inbox and a while after.
    (40, "file reservations", """
CREATE TABLE reservations (
    id         TEXT PRIMARY KEY,
    agent      TEXT NOT NULL,
    pattern    TEXT NOT NULL,
    scope      TEXT NOT NULL,
    exclusive  INTEGER NOT NULL,
    reason     TEXT,
    since      REAL NOT NULL,
    renewed_at REAL NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;
CREATE UNIQUE INDEX reservations_held ON reservations(agent, pattern);
CREATE INDEX reservations_expiry ON reservations(expires_at);
CREATE TABLE reservation_notices (
    id           TEXT PRIMARY KEY,
    holder       TEXT NOT NULL,
    requester    TEXT NOT NULL,
    at           REAL NOT NULL,
    subject      TEXT NOT NULL,
    body         TEXT NOT NULL,
    headers      TEXT NOT NULL,
    delivered_at REAL
) WITHOUT ROWID;
CREATE INDEX reservation_notices_pair ON reservation_notices(holder, requester, at);
CREATE INDEX reservation_notices_due ON reservation_notices(at) WHERE delivered_at IS NULL
"""),
    # The agent registry (ledger/registry.py, core/registry.py): an agent a `spawn` message named
    # (active, with what the spawn said of it) or a `release` named (inactive), changed in the
    # transaction that records the control message. An agent with no row is active.
    (50, "agent registry", """
CREATE TABLE agent_registry (
    name        TEXT PRIMARY KEY,
    state       TEXT NOT NULL,
    metadata    TEXT NOT NULL,
    spawned_at  REAL,
    spawned_by  TEXT,
    spawn_id    TEXT,
    released_at REAL,
    released_by TEXT,
    release_id  TEXT,
    updated_at  REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX agent_registry_state ON agent_registry(state, name)
"""),
    # Team state (ledger/state.py): a coordinator's keys and values. A key's version goes up by
    # one at each change; a deleted key keeps its row with no value (and its version, one up), so
    # a version once given is never given again and a compare-and-set on it cannot be fooled.
    (51, "team state", """
CREATE TABLE team_state (
    key        TEXT PRIMARY KEY,
    value      TEXT,
    version    INTEGER NOT NULL,
    updated_at REAL NOT NULL,
    updated_by TEXT NOT NULL
) WITHOUT ROWID
"""),
    # Imports (ledger/imports.py, operator/importer.py): each record brought over from another
    # system's ledger (`source`, e.g. agent-relay), by that ledger's own id for it, with the id
    # it has here, the status it had there and the ledger it was read from. Never swept with the
    # messages: an import run again skips what came over once, even after relay delivered,
    # archived and swept it.
    (52, "imports", """
CREATE TABLE imports (
    source     TEXT NOT NULL,
    source_id  TEXT NOT NULL,
    message_id TEXT NOT NULL,
    status     TEXT NOT NULL,
    origin     TEXT NOT NULL,
    at         REAL NOT NULL,
    PRIMARY KEY (source, source_id)
) WITHOUT ROWID;
CREATE INDEX imports_message ON imports(message_id)
"""),
    (53, "content type and retry budget per message", """
ALTER TABLE messages ADD COLUMN content_type TEXT;
ALTER TABLE messages ADD COLUMN max_retries INTEGER
"""),
    (54, "migration times in Unix seconds", """
UPDATE schema_migrations SET applied_at = (applied_at - 2440587.5) * 86400.0 WHERE applied_at < 1e7
"""),
    # Receipts, acknowledgements and priority (ledger/receipts.py): what a message asked for (a
    # row only for one not `normal` or asking for acknowledgements), and each delivered copy's
    # later steps (surfaced, read, acknowledged), each at its first time. Swept with the message.
    (55, "receipts, acknowledgements and priority", """
CREATE TABLE IF NOT EXISTS asks (
    message_id   TEXT PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
    priority     TEXT NOT NULL,
    ack_required INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS receipts (
    message_id  TEXT NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    recipient   TEXT NOT NULL,
    surfaced_at REAL,
    read_at     REAL,
    acked_at    REAL,
    note        TEXT,
    reply_id    TEXT,
    PRIMARY KEY (message_id, recipient)
) WITHOUT ROWID
"""),
    # What relay's Claude Code hooks told each session of an agent (ledger/hook_sessions.py):
    # a message given in a hook's context, and a stop blocked for it, once per session.
    (56, "claude code hook sessions", """
CREATE TABLE IF NOT EXISTS hook_marks (
    agent      TEXT NOT NULL,
    session_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    at         REAL NOT NULL,
    given_at   REAL,
    blocked_at REAL,
    PRIMARY KEY (agent, session_id, message_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS hook_marks_at ON hook_marks(at)
"""),
    # The web view's Messages filtered by kind or by time (ledger/web.py): a kind or a span that
    # matches no message is answered from these, not by a walk of every message.
    (57, "messages by kind and by time", """
CREATE INDEX IF NOT EXISTS messages_kind ON messages(kind, id);
CREATE INDEX IF NOT EXISTS messages_discovered_at ON messages(discovered_at)
"""),
    # Federation: what waits for a node's acknowledgement is read by node, never walked whole
    # (remote_history.py): its oldest by queued time, its late rows by deadline. A node that
    # leaves thousands unacknowledged costs each look a few index seeks, not a walk of them.
    (58, "outbound rows by node, age and deadline", """
DROP INDEX IF EXISTS outbound_node;
CREATE INDEX IF NOT EXISTS outbound_node_queued ON outbound(node, status, queued_at);
CREATE INDEX IF NOT EXISTS outbound_node_deadline ON outbound(node, status, ack_deadline)
"""),
]
# Written in order of their numbers (tests/test_schema.py holds it); applied by number, each
# once: a ledger that lacks one gets it at its next start.
SCHEMA_VERSION = max(v for v, _, _ in MIGRATIONS)


def checksum(sql):
    return hashlib.sha256(sql.encode()).hexdigest()


def statements(sql):
    """A migration's statements, each whole by SQLite's own rule (sqlite3.complete_statement): a
    `;` inside a string literal or a trigger's body does not end one."""
    out, part = [], ""
    for piece in sql.split(";"):
        part += piece + ";"
        if sqlite3.complete_statement(part):
            if part.strip(" \n\t;"):
                out.append(part.strip())
            part = ""
    if part.strip(" \n\t;"):
        raise SchemaError(f"a migration ends inside a statement: {part.strip()[:80]!r}")
    return out


def migrate(db, path, readonly, now=None):
    """Apply the migrations `db` lacks, in one transaction, each logged; SchemaError for a ledger
    newer than this relay, a migration whose text changed, or a read-only one that needs some."""
    has_table = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_migrations'").fetchone()
    applied = {}
    if has_table:
        for row in db.execute("SELECT version, name, checksum FROM schema_migrations"):
            applied[row["version"]] = (row["name"], row["checksum"])
    newest = max(applied, default=0)
    if newest > SCHEMA_VERSION:
        raise SchemaError(f"the ledger {path} has schema version {newest}, newer than this relay "
                          f"knows ({SCHEMA_VERSION}); upgrade relay to use it (the ledger was not changed)")
    for version, name, sql in MIGRATIONS:
        if version in applied and applied[version][1] != checksum(sql):
            raise SchemaError(f"the ledger's migration {version} ({name}) does not match this relay's "
                              f"(checksum {applied[version][1][:12]} != {checksum(sql)[:12]})")
    todo = sorted(m for m in MIGRATIONS if m[0] not in applied)
    if not todo:
        return
    if readonly:
        raise SchemaError(f"the ledger {path} needs migration to version {SCHEMA_VERSION}; "
                          "start `relay run` once to apply it")
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
                   "name TEXT NOT NULL, checksum TEXT NOT NULL, applied_at REAL NOT NULL)")
        # Read again under the write lock: another process may have migrated meanwhile.
        done = {r[0] for r in db.execute("SELECT version FROM schema_migrations")}
        todo = [m for m in todo if m[0] not in done]
        at = time.time() if now is None else now
        for version, name, sql in todo:
            for stmt in statements(sql):
                db.execute(stmt)
            db.execute("INSERT INTO schema_migrations VALUES (?, ?, ?, ?)", (version, name, checksum(sql), at))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    for version, name, _ in todo:
        log.info("ledger %s: applied migration %d (%s)", path, version, name)
