"""agent-relay's ledger, read for `relay import agent-relay` (operator/importer.py): the SQLite file
agent-relay 2.0 (`@agent-relay/daemon`, relay-ledger.ts) keeps at `<its directory>/meta/file-ledger.sqlite`
(the daemon's) or `meta/ledger.sqlite` (its watchdog's default); operator/agent_relay_places.py finds it.

Nothing here writes to it, or beside it. What the file is, is looked at before anything is
copied: a regular file beginning with SQLite's header (Source). Then it (and its write-ahead
log, when there is one SQLite reads) is copied by plain reads into a private temporary
directory, its data only (a hole stays a hole, so a copy takes no more than the blocks the
source holds), once the disk there has room for it; the copy is opened read-only (`mode=ro`):
SQLite writes nothing next to the source, not even the -shm it makes for a reader of a ledger in
WAL mode. A ledger that changed while it was copied (agent-relay still running) is refused, so
what is read is one consistent state.

The tables read (agent-relay's schema, migrations 0001_initial and 0002_symlink_paths):
`relay_files` (one row per outbox file: file_id, source_path, archive_path, agent_name,
message_type, status, retries, discovered_at, processed_at, archived_at, error, content_hash,
file_size; times in milliseconds), `agents` (agent_name, created_at, last_seen_at, status,
metadata) and `orchestrator_state` (key, value, updated_at). A ledger whose `__migrations` names
one this relay does not know is refused: its meaning may have changed.
"""
import errno
import os
import shutil
import sqlite3
import stat
import tempfile
import urllib.parse

from relay.errors import RelayError

MIGRATIONS = ("0001_initial", "0002_symlink_paths")
STATUSES = ("pending", "processing", "delivered", "failed", "archived")
COLUMNS = {
    "relay_files": ("id", "file_id", "source_path", "archive_path", "agent_name", "message_type", "status",
                    "retries", "discovered_at", "processed_at", "archived_at", "error", "content_hash",
                    "file_size"),
    "agents": ("agent_name", "created_at", "last_seen_at", "status"),
    "orchestrator_state": ("key", "value", "updated_at"),
}


HEADER = b"SQLite format 3\x00"     # the first 16 bytes of every SQLite database
WAL_MAGIC = (b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83")     # the first 4 of a write-ahead log SQLite reads
RESERVE = 1 << 20                   # room left beside a copy (SQLite's -shm for the reader)
CHUNK = 1 << 20


def disk_free(path):
    """The bytes free for this user on the disk holding `path`."""
    return shutil.disk_usage(path).free


def _stat(path):
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


def _extents(fd, size):
    """The (start, end) ranges of the open file that hold data; a hole (read as zeros) is left
    out, so that what is copied is bounded by the blocks the file holds (st_blocks), not by its
    apparent size. The whole file where the file system cannot tell (no SEEK_DATA)."""
    out, pos = [], 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:          # nothing but a hole after pos
                break
            return [(0, size)]
        if start >= size:
            break
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        out.append((start, end))
        pos = end
    return out


class Source:
    """agent-relay's ledger file and its -wal, opened and looked at before anything is copied:
    each a regular file (opened without blocking: a FIFO would hang the read, a device such as
    /dev/zero would fill the disk), the ledger beginning with SQLite's header, the -wal copied
    only when it begins as a log SQLite reads (SQLite ignores another). RelayError saying what
    the file is not."""

    def __init__(self, path):
        self.path = str(path)
        self.files = []             # (source path, fd or None, its stat then, its data extents)
        try:
            for name in (self.path, f"{self.path}-wal"):
                self.files.append(self._look(name))
        except BaseException:
            self.close()
            raise

    def _look(self, name):
        """(name, fd or None, its (size, mtime, inode), the extents to copy) of one file."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            if name == self.path:
                raise RelayError(f"{name}: no such file (give agent-relay's ledger file)") from None
            return name, None, None, []
        except OSError as e:
            raise RelayError(f"cannot read {name}: {e.strerror or e}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise RelayError(f"{name} is not a regular file (a FIFO, a device or a directory); "
                                 "give agent-relay's ledger file")
            head = os.pread(fd, len(HEADER), 0)
            if name == self.path and head != HEADER:
                raise RelayError(f"{name} is not an SQLite database (its first bytes are not SQLite's header; "
                                 f"{st.st_size} bytes): give agent-relay's ledger file")
            wanted = name == self.path or head[:4] in WAL_MAGIC
            return name, fd, (st.st_size, st.st_mtime_ns, st.st_ino), _extents(fd, st.st_size) if wanted else []
        except BaseException:
            os.close(fd)
            raise

    def need(self):
        """The bytes a copy writes: the data the files hold, and room for SQLite beside it."""
        return sum(end - start for *_, extents in self.files for start, end in extents) + RESERVE

    def copy_into(self, into, free_space=disk_free):
        """Copy the files into the directory `into` (their holes left holes); the ledger's copy.
        RelayError, before a byte is written, when the disk there has not room for them; after,
        when either file changed while it was read."""
        free = free_space(into)
        if self.need() > free:
            raise RelayError(f"{self.path}: its copy needs {self.need()} bytes and {into} has {free} bytes free; "
                             "make room there, or point TMPDIR at a disk with room")
        copy = os.path.join(into, "ledger.sqlite")
        for (name, fd, st, extents), dst in zip(self.files, (copy, f"{copy}-wal"), strict=True):
            if fd is not None and (extents or name == self.path):
                self._copy(fd, st[0], extents, dst)
        if [_stat(name) for name, *_ in self.files] != [st for _, _, st, _ in self.files]:
            raise RelayError(f"{self.path} changed while it was read: agent-relay is still running; stop it, "
                             "then run the import again")
        return copy

    @staticmethod
    def _copy(fd, size, extents, dst):
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            for start, end in extents:
                pos = start
                while pos < end and (chunk := os.pread(fd, min(end - pos, CHUNK), pos)):
                    os.pwrite(out, chunk, pos)
                    pos += len(chunk)
            os.ftruncate(out, size)         # the holes after the last data
        finally:
            os.close(out)

    def close(self):
        for _, fd, *_ in self.files:
            if fd is not None:
                os.close(fd)
        self.files = []


def snapshot(path, into, free_space=disk_free):
    """Copy the ledger at `path` and its -wal (when there is one SQLite reads) into the
    directory `into`; the copy's path (see Source)."""
    src = Source(path)
    try:
        return src.copy_into(into, free_space)
    finally:
        src.close()


class AgentRelayLedger:
    """A read-only view of one agent-relay ledger. RelayError when `path` is not one this relay
    can read (not SQLite, tables or columns missing, a migration it does not know)."""

    def __init__(self, path, free_space=disk_free):
        self.path = str(path)
        self.tmp = self.db = None
        src = Source(self.path)         # what the file is, looked at before a temporary directory is made
        try:
            self.tmp = tempfile.TemporaryDirectory(prefix="relay-import-")
            copy = src.copy_into(self.tmp.name, free_space)
            self.db = sqlite3.connect(f"file:{urllib.parse.quote(copy)}?mode=ro", uri=True)
            self.db.row_factory = sqlite3.Row
            self.tables = self._check()
        except sqlite3.DatabaseError as e:
            self.close()
            raise RelayError(f"{self.path} is not an agent-relay ledger that relay can read: {e}") from None
        except BaseException:
            self.close()
            raise
        finally:
            src.close()

    def close(self):
        if self.db is not None:
            self.db.close()
            self.db = None
        if self.tmp is not None:
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
