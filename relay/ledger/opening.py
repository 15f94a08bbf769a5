"""Opening the ledger to read it, in a project this user may not write as well.

A reader opens the ledger with SQLite's `mode=ro`: beside a running daemon it reads through the
daemon's -wal and -shm. A WAL database read that way needs its -shm file, which SQLite makes
when it is not there; in a state directory this user may not write (a project of another user,
a read-only mount, a backup) it cannot, and every read failed with "unable to open database
file". The reader then opens the file with `immutable=1`: as it stands, with no lock and no
-shm. That is what the last writer left when it closed (a clean close checkpoints the log and
removes it); writes still in a -wal that could not be read that way are not seen.
"""
import os
import sqlite3
import urllib.parse

READ_WRITE = "read-write"       # a writer's connection
READ_ONLY = "read-only"         # mode=ro: beside a writer, through its -wal and -shm
IMMUTABLE = "immutable"         # immutable=1: the file as it stands, no lock, no -shm


def cannot_open(error):
    """True when SQLite could not open a file it needs (SQLITE_CANTOPEN)."""
    name = getattr(error, "sqlite_errorname", None)
    return name == "SQLITE_CANTOPEN" if name else "unable to open database file" in str(error)


def connect_reader(path, busy_timeout_ms):
    """(a read-only connection to the ledger at `path`, how it was opened: READ_ONLY or IMMUTABLE)."""
    uri = f"file:{urllib.parse.quote(str(path))}?"

    def connect(how):
        return sqlite3.connect(uri + how, uri=True, isolation_level=None, check_same_thread=False,
                               timeout=busy_timeout_ms / 1000)

    db = connect("mode=ro")
    try:
        db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()     # the file and its -shm opened
        return db, READ_ONLY
    except sqlite3.OperationalError as e:
        db.close()
        if not cannot_open(e):
            raise
    return connect("mode=ro&immutable=1"), IMMUTABLE


def journal_mode_on_disk(path):
    """"wal" or "delete", as the database file's header says (bytes 18 and 19: 2 for WAL). A
    connection opened immutable says "delete" of a WAL database: it reads no log."""
    with open(path, "rb") as f:
        header = f.read(20)
    return "wal" if header[18:20] == b"\x02\x02" else "delete"


def unwritable(path):
    """The first of the ledger's directory, the ledger and its -wal and -shm (those there) that
    this process may not write, or None."""
    path = str(path)
    for p in (os.path.dirname(path) or ".", path, f"{path}-wal", f"{path}-shm"):
        if os.path.exists(p) and not os.access(p, os.W_OK):
            return p
    return None
