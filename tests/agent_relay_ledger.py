"""A real agent-relay 2.0 project for the import tests: its ledger made with agent-relay's own
schema and statements, its outbox and archive laid out as its watchdog lays them.

The schema below is agent-relay's, verbatim: the embedded migrations of `@agent-relay/daemon`
2.0.29 (packages/daemon/src/migrations/index.ts, applied by RelayLedger in relay-ledger.ts), with
the `__migrations` table its runner keeps (names and checksums as the runner records them). The
statements that fill it are RelayLedger's (relay-ledger.ts), and what happens to files is what
its RelayWatchdog (relay-watchdog.ts) does: a file is registered at its canonical absolute path
with the first 16 hex digits of its sha256, claimed (retries + 1), marked delivered, then moved
to `archive/<agent>/<YYYY-MM-DD>/<file_id>-<name>` and marked archived with that absolute path; a
failed file stays in the outbox, as does a delivered one whose archive move did not happen.

`make(tmp_path)` builds `<tmp_path>/.agent-relay/` with rows in every state and returns a
`Made` naming them. The ledger is `meta/ledger.sqlite`, where RelayWatchdog keeps it by default
(`name=DAEMON` gives `meta/file-ledger.sqlite`, where the daemon of 2.0.29 has its watchdog keep it).
"""
import dataclasses
import hashlib
import os
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

# -- agent-relay's schema (verbatim) --------------------------------------------------------

# migrations/index.ts, ensureMigrationsTable()
MIGRATIONS_TABLE = """
    CREATE TABLE IF NOT EXISTS __migrations (
      id INTEGER PRIMARY KEY AUTOINCREMENT,
      name TEXT NOT NULL UNIQUE,
      applied_at INTEGER NOT NULL,
      checksum TEXT NOT NULL
    );
  """

# migrations/index.ts, EMBEDDED_MIGRATIONS
MIGRATIONS = [
    ("0001_initial", """
-- Relay Ledger - Initial Schema
-- Migration 0001: Initial tables for relay file tracking

-- Main relay files table
CREATE TABLE IF NOT EXISTS relay_files (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  file_id TEXT NOT NULL UNIQUE,
  source_path TEXT NOT NULL,
  archive_path TEXT,
  agent_name TEXT NOT NULL,
  message_type TEXT NOT NULL,
  status TEXT NOT NULL DEFAULT 'pending',
  retries INTEGER NOT NULL DEFAULT 0,
  max_retries INTEGER NOT NULL DEFAULT 3,
  discovered_at INTEGER NOT NULL,
  processed_at INTEGER,
  archived_at INTEGER,
  error TEXT,
  content_hash TEXT,
  file_size INTEGER NOT NULL DEFAULT 0,
  file_mtime_ns INTEGER,
  file_inode INTEGER,
  CONSTRAINT valid_status CHECK (status IN ('pending', 'processing', 'delivered', 'failed', 'archived'))
);

CREATE INDEX IF NOT EXISTS idx_relay_files_status ON relay_files(status);
CREATE INDEX IF NOT EXISTS idx_relay_files_agent ON relay_files(agent_name);
CREATE INDEX IF NOT EXISTS idx_relay_files_discovered ON relay_files(discovered_at);
CREATE INDEX IF NOT EXISTS idx_relay_files_source ON relay_files(source_path);

-- Agents registry table
CREATE TABLE IF NOT EXISTS agents (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  agent_name TEXT NOT NULL UNIQUE,
  created_at INTEGER NOT NULL,
  last_seen_at INTEGER NOT NULL,
  status TEXT NOT NULL DEFAULT 'active',
  metadata TEXT,
  CONSTRAINT valid_agent_status CHECK (status IN ('active', 'inactive'))
);

CREATE INDEX IF NOT EXISTS idx_agents_status ON agents(status);
CREATE INDEX IF NOT EXISTS idx_agents_last_seen ON agents(last_seen_at);

-- Orchestrator state table (key-value store for crash recovery)
CREATE TABLE IF NOT EXISTS orchestrator_state (
  key TEXT PRIMARY KEY,
  value TEXT NOT NULL,
  updated_at INTEGER NOT NULL
);

-- Pending operations table (crash recovery atomicity)
CREATE TABLE IF NOT EXISTS pending_operations (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  operation_type TEXT NOT NULL,
  target_id TEXT NOT NULL,
  payload TEXT,
  created_at INTEGER NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0,
  last_attempt_at INTEGER,
  error TEXT,
  CONSTRAINT valid_operation_type CHECK (operation_type IN ('process', 'archive', 'cleanup'))
);

CREATE INDEX IF NOT EXISTS idx_pending_ops_type ON pending_operations(operation_type);
CREATE INDEX IF NOT EXISTS idx_pending_ops_target ON pending_operations(target_id);
    """),
    ("0002_symlink_paths", """
-- Migration 0002: Add symlink path tracking for production workspace support
-- Workspaces in cloud/production may be symlinked for isolation.
-- We store both the original symlink path (for debugging) and canonical path (for operations).

-- Add symlink_path column to track original path (may be symlink)
ALTER TABLE relay_files ADD COLUMN symlink_path TEXT;

-- Create index for symlink lookups
CREATE INDEX IF NOT EXISTS idx_relay_files_symlink ON relay_files(symlink_path);
    """),
]

# relay-ledger.ts, RelayLedger.prepareStatements() and its agent and state methods
INSERT = """
      INSERT INTO relay_files (file_id, source_path, symlink_path, agent_name, message_type, discovered_at, file_size, content_hash, file_mtime_ns, file_inode)
      VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
      ON CONFLICT(file_id) DO NOTHING
    """
CLAIM = """
      UPDATE relay_files
      SET status = 'processing', retries = retries + 1
      WHERE file_id = ? AND status = 'pending' AND retries < max_retries
      RETURNING *
    """
UPDATE_STATUS = """
      UPDATE relay_files SET status = ? WHERE file_id = ?
    """
MARK_DELIVERED = """
      UPDATE relay_files
      SET status = 'delivered', processed_at = ?
      WHERE file_id = ?
    """
MARK_FAILED = """
      UPDATE relay_files
      SET status = 'failed', processed_at = ?, error = ?
      WHERE file_id = ?
    """
MARK_ARCHIVED = """
      UPDATE relay_files
      SET status = 'archived', archive_path = ?, archived_at = ?
      WHERE file_id = ?
    """
REGISTER_AGENT = """
      INSERT INTO agents (agent_name, created_at, last_seen_at, status, metadata)
      VALUES (?, ?, ?, 'active', ?)
      ON CONFLICT(agent_name) DO UPDATE SET
        last_seen_at = excluded.last_seen_at,
        status = 'active',
        metadata = COALESCE(excluded.metadata, agents.metadata)
    """
MARK_INACTIVE = """
      UPDATE agents SET status = 'inactive' WHERE agent_name = ?
    """
SAVE_STATE = """
      INSERT INTO orchestrator_state (key, value, updated_at)
      VALUES (?, ?, ?)
      ON CONFLICT(key) DO UPDATE SET
        value = excluded.value,
        updated_at = excluded.updated_at
    """
ADD_OPERATION = """
      INSERT INTO pending_operations (operation_type, target_id, payload, created_at)
      VALUES (?, ?, ?, ?)
    """


def checksum(sql):
    """migrations/index.ts, calculateChecksum(): a 32-bit string hash, as hex."""
    h = 0
    for ch in sql:
        h = (h * 31 + ord(ch)) & 0xFFFFFFFF
    if h >= 1 << 31:
        h -= 1 << 32
    return format(abs(h), "x").rjust(8, "0")


def open_ledger(path, now_ms, migrations=MIGRATIONS):
    """RelayLedger's constructor: the pragmas, then runMigrations()."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA busy_timeout = 5000")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute("PRAGMA foreign_keys = ON")
    db.executescript(MIGRATIONS_TABLE)
    applied = {r[0] for r in db.execute("SELECT name FROM __migrations")}
    for name, sql in migrations:
        if name not in applied:
            db.executescript(sql)
            db.execute("INSERT INTO __migrations (name, applied_at, checksum) VALUES (?, ?, ?)",
                       (name, now_ms, checksum(sql)))
    return db


# -- a project driven as agent-relay drives one -------------------------------------------------

AGENTS = ("Alice", "Bob", "Carol", "Lead")
WATCHDOG = "ledger.sqlite"          # RelayWatchdog's default: <its directory>/meta/ledger.sqlite
DAEMON = "file-ledger.sqlite"       # the daemon's (2.0.29): <relayDir>/meta/file-ledger.sqlite
COUNTS = {"archived": 180, "delivered": 40, "failed": 40, "processing": 20, "pending": 60}


@dataclasses.dataclass
class Made:
    root: Path                  # the agent-relay directory (.agent-relay)
    ledger: Path                # root / meta / ledger.sqlite (or the name given)
    ids: dict                   # status -> [file_id, ...] as agent-relay left them
    bodies: dict                # file_id -> the file's bytes
    recipients: dict            # file_id -> the agent it was written to
    state: dict                 # orchestrator_state key -> value


class Driver:
    """RelayLedger and RelayWatchdog's steps over one project, with a clock in milliseconds."""

    def __init__(self, root, now_ms, name=WATCHDOG):
        self.root = root
        self.now = now_ms
        self.db = open_ledger(root / "meta" / name, now_ms)
        self.n = 0

    def tick(self, ms=997):
        self.now += ms
        return self.now

    def file_id(self):
        self.n += 1
        return hashlib.sha256(f"file {self.n}".encode()).hexdigest()[:12]      # 12 hex, as generateFileId()

    def write(self, agent, name, data):
        path = self.root / "outbox" / agent / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.utime(path, ns=(self.now * 1_000_000, self.now * 1_000_000))
        return path

    def register(self, agent, name, data):
        """processDiscoveredFile(): the file at its canonical path, its size and short hash."""
        path = self.write(agent, name, data)
        fid = self.file_id()
        self.db.execute(INSERT, (fid, str(path), None, agent, name, self.tick(), len(data),
                                 hashlib.sha256(data).hexdigest()[:16], None, None))
        return fid

    def rediscover(self, fid):
        """The file of record `fid` registered again under a new file id, as a restarted watchdog
        that missed the record does: two records of one outbox file."""
        new = self.file_id()
        self.db.execute("INSERT INTO relay_files (file_id, source_path, agent_name, message_type, discovered_at, "
                        "file_size, content_hash) SELECT ?, source_path, agent_name, message_type, ?, file_size, "
                        "content_hash FROM relay_files WHERE file_id = ?", (new, self.tick(), fid))
        return new

    def claim(self, fid):
        return self.db.execute(CLAIM, (fid,)).fetchone()

    def delivered(self, fid):
        self.db.execute(MARK_DELIVERED, (self.tick(3), fid))

    def archive(self, fid):
        """archiveFile(): the rename into archive/<agent>/<day>/<file_id>-<name>, then markArchived."""
        source, agent, name = self.db.execute("SELECT source_path, agent_name, message_type FROM relay_files "
                                              "WHERE file_id = ?", (fid,)).fetchone()
        day = datetime.fromtimestamp(self.now / 1000, UTC).strftime("%Y-%m-%d")
        target = self.root / "archive" / agent / day / f"{fid}-{name}"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(source, target)
        self.db.execute(MARK_ARCHIVED, (str(target), self.tick(2), fid))
        return target

    def fail(self, fid, error):
        """markFailed(): back to pending while retries are left, else failed."""
        retries, most = self.db.execute("SELECT retries, max_retries FROM relay_files WHERE file_id = ?",
                                        (fid,)).fetchone()
        if retries >= most:
            self.db.execute(MARK_FAILED, (self.tick(), error, fid))
        else:
            self.db.execute(UPDATE_STATUS, ("pending", fid))

    def close(self):
        self.db.close()


def message(to, i, kind="msg"):
    return f"TO: {to}\nTHREAD: t{i % 7}\nSUBJECT: {kind} {i}\n\n{kind} body {i}\n".encode()


def make(where, now_ms=None, counts=None, name=WATCHDOG, top=".agent-relay"):
    """An agent-relay project under `where`/`top` with `counts` rows per state (COUNTS by
    default), dated over the day before `now_ms`, its ledger `meta/<name>`."""
    import time
    counts = {**COUNTS, **(counts or {})}
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    root = Path(where) / top
    d = Driver(root, now_ms - 86_400_000, name)
    ids = {s: [] for s in COUNTS}
    bodies, recipients = {}, {}

    def new(i, name, kind):
        sender, to = AGENTS[i % len(AGENTS)], AGENTS[(i + 1) % len(AGENTS)]
        data = message(to, i, kind)
        fid = d.register(sender, name, data)
        bodies[fid], recipients[fid] = data, to
        return fid

    for i in range(counts["archived"]):        # agents write `msg` again and again
        fid = new(i, "msg", "archived")
        d.claim(fid)
        d.delivered(fid)
        d.archive(fid)
        ids["archived"].append(fid)
    for i in range(counts["delivered"]):       # delivered, then the archive move failed
        fid = new(i, f"note-{i}", "delivered")
        d.claim(fid)
        d.delivered(fid)
        ids["delivered"].append(fid)
    for i in range(counts["failed"]):          # failed after max_retries claims
        fid = new(i, f"bad-{i}", "failed")
        for _ in range(3):
            d.claim(fid)
            d.fail(fid, "ENOENT: no such file or directory, open 'attachment'")
        ids["failed"].append(fid)
    for i in range(counts["processing"]):      # claimed when agent-relay stopped
        fid = new(i, f"work-{i}", "processing")
        d.claim(fid)
        ids["processing"].append(fid)
    for i in range(counts["pending"]):         # found, not yet claimed (some after a retry)
        fid = new(i, f"todo-{i}", "pending")
        if i % 5 == 0:
            d.claim(fid)
            d.fail(fid, "EBUSY: resource busy")
        ids["pending"].append(fid)
    for i, agent in enumerate(AGENTS):
        d.db.execute(REGISTER_AGENT, (agent, now_ms - 86_400_000 + i, d.tick(), '{"cli": "claude"}'))
    d.db.execute(MARK_INACTIVE, ("Carol",))
    state = {"lead": "Lead", "round": '{"n": 3}', "plan/next": "review"}
    for key, value in state.items():
        d.db.execute(SAVE_STATE, (key, value, d.tick()))
    d.db.execute(ADD_OPERATION, ("archive", ids["delivered"][0] if ids["delivered"] else "none", None, d.now))
    d.close()
    return Made(root, root / "meta" / name, ids, bodies, recipients, state)


def fingerprint(path):
    """What must not change in a source that is read: every file under `path`, with its bytes'
    hash, size and mtime (nanoseconds)."""
    out = {}
    for p in sorted(Path(path).rglob("*")):
        if p.is_file() or p.is_symlink():
            st = p.lstat()
            out[str(p.relative_to(path))] = (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None,
                                              st.st_size, st.st_mtime_ns)
    return out
