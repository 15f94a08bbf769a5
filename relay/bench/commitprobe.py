"""A probe of what one commit costs on a disk: a ledger of its own (WAL, synchronous FULL, as
relay's), one small row per commit. relay bench's floor runs it beside an envelope's fsync. Its
database is its own, never the ledger: the one module outside relay/ledger/ that holds SQL
(tests/test_house.py names it)."""
import sqlite3


class CommitProbe:
    def __init__(self, path):
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode = WAL")
        self.db.execute("PRAGMA synchronous = FULL")
        self.db.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT)")

    def commit(self, value):
        """One transaction writing one row, synced."""
        self.db.execute("BEGIN IMMEDIATE")
        self.db.execute("INSERT INTO t (v) VALUES (?)", (str(value),))
        self.db.execute("COMMIT")

    def close(self):
        self.db.close()
