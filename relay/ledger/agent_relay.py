"""agent-relay's ledger, read for `relay import agent-relay` (operator/importer.py): the SQLite file
agent-relay 2.0 (`@agent-relay/daemon`, relay-ledger.ts) keeps at `<its directory>/meta/ledger.sqlite`.

Nothing here writes to it, or beside it. The file (and its write-ahead log, when one is there)
is copied by plain reads into a private temporary directory, and the copy is opened read-only
(`mode=ro`): SQLite writes nothing next to the source, not even the -shm it makes for a reader
of a ledger in WAL mode. A ledger that changed while it was copied (agent-relay still running)
is refused, so what is read is one consistent state.

The tables read (agent-relay's schema, migrations 0001_initial and 0002_symlink_paths):
`relay_files` (one row per outbox file: file_id, source_path, archive_path, agent_name,
message_type, status, retries, discovered_at, processed_at, archived_at, error, content_hash,
file_size; times in milliseconds), `agents` (agent_name, created_at, last_seen_at, status,
metadata) and `orchestrator_state` (key, value, updated_at). A ledger whose `__migrations` names
one this relay does not know is refused: its meaning may have changed.
"""
import os
import sqlite3
import stat
import tempfile
import urllib.parse

from relay.errors import RelayError

LEDGER = ("meta", "ledger.sqlite")      # where agent-relay keeps it, under its directory
MIGRATIONS = ("0001_initial", "0002_symlink_paths")
STATUSES = ("pending", "processing", "delivered", "failed", "archived")
COLUMNS = {
    "relay_files": ("id", "file_id", "source_path", "archive_path", "agent_name", "message_type", "status",
                    "retries", "discovered_at", "processed_at", "archived_at", "error", "content_hash",
                    "file_size"),
    "agents": ("agent_name", "created_at", "last_seen_at", "status"),
    "orchestrator_state": ("key", "value", "updated_at"),
}


def _stat(path):
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


def _copy(src, dst, size):
    """Copy the regular file `src` (`size` bytes when it was looked at) to `dst`. Opened without
    blocking and checked to be a regular file first: a FIFO would hang the read and a device
    (/dev/zero) would fill the disk; no more than `size` bytes are read."""
    fd = os.open(src, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RelayError(f"{src} is not a regular file (a FIFO, a device or a directory); "
                             "give agent-relay's ledger file")
        with open(dst, "wb") as out:
            left = size
            while left > 0 and (chunk := f.read(min(left, 1 << 20))):
                out.write(chunk)
                left -= len(chunk)


def snapshot(path, into):
    """Copy the ledger at `path` and its -wal (when there is one) into the directory `into` by
    reading them; the copy's path. RelayError when either changed while it was read."""
    names = [path, f"{path}-wal"]
    before = [_stat(p) for p in names]
    copy = os.path.join(into, "ledger.sqlite")
    for src, dst, st in zip(names, (copy, f"{copy}-wal"), before, strict=True):
        if st is not None:
            _copy(src, dst, st[0])
    if [_stat(p) for p in names] != before:
        raise RelayError(f"{path} changed while it was read: agent-relay is still running; stop it, "
                         "then run the import again")
    return copy


class AgentRelayLedger:
    """A read-only view of one agent-relay ledger. RelayError when `path` is not one this relay
    can read (not SQLite, tables or columns missing, a migration it does not know)."""

    def __init__(self, path):
        self.path = str(path)
        self.tmp = tempfile.TemporaryDirectory(prefix="relay-import-")
        self.db = None
        try:
            copy = snapshot(self.path, self.tmp.name)
            self.db = sqlite3.connect(f"file:{urllib.parse.quote(copy)}?mode=ro", uri=True)
            self.db.row_factory = sqlite3.Row
            self.tables = self._check()
        except sqlite3.DatabaseError as e:
            self.close()
            raise RelayError(f"{self.path} is not an agent-relay ledger that relay can read: {e}") from None
        except BaseException:
            self.close()
            raise

    def close(self):
        if self.db is not None:
            self.db.close()
            self.db = None
        self.tmp.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check(self):
        """The tables of COLUMNS the ledger has; RelayError naming what is missing or unknown."""
        tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "relay_files" not in tables:
            shown = ", ".join(sorted(tables)) or "none"
            raise RelayError(f"{self.path} is not an agent-relay ledger: it has no table relay_files "
                             f"(its tables: {shown})")
        found = tables & set(COLUMNS)
        for table in sorted(found):
            have = {r[1] for r in self.db.execute(f"PRAGMA table_info({table})")}
            missing = [c for c in COLUMNS[table] if c not in have]
            if missing:
                raise RelayError(f"{self.path}: agent-relay's table {table} has no column {', '.join(missing)}; "
                                 "this relay imports the ledgers of agent-relay 2.0")
        if "__migrations" in tables:
            names = [r[0] for r in self.db.execute("SELECT name FROM __migrations ORDER BY id")]
            unknown = [n for n in names if n not in MIGRATIONS]
            if unknown:
                raise RelayError(f"{self.path} has agent-relay schema migration {', '.join(map(str, unknown))}, "
                                 f"newer than this relay knows ({', '.join(MIGRATIONS)}): upgrade relay, or "
                                 "import with the agent-relay 2.0 that made the ledger")
        return found

    def files(self):
        """relay_files, oldest first (by agent-relay's row id)."""
        columns = ", ".join(COLUMNS["relay_files"])
        return self.db.execute(f"SELECT {columns} FROM relay_files ORDER BY id").fetchall()

    def agents(self):
        if "agents" not in self.tables:
            return []
        return self.db.execute("SELECT agent_name, created_at, last_seen_at, status, metadata FROM agents "
                               "ORDER BY id").fetchall()

    def state(self):
        if "orchestrator_state" not in self.tables:
            return []
        return self.db.execute("SELECT key, value, updated_at FROM orchestrator_state ORDER BY key").fetchall()
