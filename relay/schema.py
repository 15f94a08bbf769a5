"""The ledger's schema: its migrations in order. A migration once released never changes (its
checksum is recorded in the ledger and checked at open); a change of schema is a new one."""

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
]
# Versions are applied by number, each once: a ledger may lack a lower number that another
# line of work adds, and gets it at its next start.
SCHEMA_VERSION = max(v for v, _, _ in MIGRATIONS)
