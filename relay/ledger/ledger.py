"""The SQLite ledger: one connection and its settings, the schema and its migrations, the
transaction every write happens in, the sync of the write-ahead log, the attestation of the
connection's settings and the event log; and the parts that write, each a Part (part.py) on this
connection, built here and given explicitly the other parts it uses (huey's BaseSqlStorage,
sqlite-utils' Database and its Tables):

    ledger.messages      the pipeline: discovery and claims, each batch's outcomes, recovery (messages.py)
    ledger.chain         the hash chain's head and records (chain.py)
    ledger.senders       the agents declared as senders, the ids given and settled (senders.py)
    ledger.sheds         what a message shed for every recipient keeps (shed_keep.py)
    ledger.search        the full-text index (search.py)
    ledger.bounces       the bounces owed and emitted (bounces.py)
    ledger.registry      the agents seen, spawned and released (registry.py)
    ledger.remote        the federation's rows, directory and link (remote.py)
    ledger.operations    operators' changes, their commands, the retention sweep (operations.py)
    ledger.reservations  file reservations (reservations.py)
    ledger.state         the team state's keys (state.py)
    ledger.imports       what was imported from another system (imports.py)
    ledger.receipts      receipts, acknowledgements, priority (receipts.py)
    ledger.hook_sessions what Claude Code hooks told each session (hook_sessions.py)

The read-only queries are the History's (history.py), with parts of its own.

The ledger knows rows and states, nothing about files. Every write happens in an explicit
`BEGIN IMMEDIATE` transaction on the connection's own thread; one transaction covers a whole
batch.
"""
import contextlib
import os
import sqlite3
import stat

import orjson

from relay.errors import LedgerError
from relay.ledger.chain import GENESIS, Chain, chain_hash, link_hash  # noqa: F401  (the chain's, offered here too)
from relay.ledger.bounces import BounceRecords
from relay.ledger.imports import Imports
from relay.ledger.hook_sessions import HookSessions
from relay.ledger.messages import Messages
from relay.ledger.opening import READ_WRITE, cannot_open, connect_reader, unwritable
from relay.ledger.operations import Operations
from relay.ledger.receipts import Receipts
from relay.ledger.senders import Senders
from relay.ledger.shed_keep import ShedKeep
from relay.ledger.sql import insert_rows
from relay.files.sync import fdatasync
from relay.ledger.schema import MIGRATIONS, SCHEMA_VERSION, STATUSES, Status, checksum, migrate  # noqa: F401  (offered here)
from relay.ledger.registry import AgentRegistry
from relay.ledger.remote import FederationRecords
from relay.ledger.reservations import Reservations
from relay.ledger.search import SearchIndex
from relay.ledger.state import StateWrites



ATTESTATIONS_KEPT = 100     # the newest attestations kept in the ledger


def _refuse_links(path):
    """The ledger and its -wal and -shm lie where agents can write: a link there would make
    SQLite write elsewhere. Refused, with what to do."""
    for p in (path, f"{path}-wal", f"{path}-shm"):
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else \
                "not a regular file" if not stat.S_ISREG(st.st_mode) else "a file with other hard links"
            raise LedgerError(f"{p} is {what}; relay never opens its ledger through one. Move the real "
                              "ledger file there (no daemon running), or remove the link")


class Ledger:
    """One connection to the ledger, and its parts (see the module's docstring). Not shared
    between threads."""

    def __init__(self, path, durability="full", readonly=False, busy_timeout_ms=5000):
        self.path = str(path)
        self.readonly = readonly
        self.durability = durability
        self.busy_timeout_ms = busy_timeout_ms
        self.unsynced = False       # a commit made without a sync, not yet synced (transaction())
        _refuse_links(self.path)
        try:
            if readonly:        # opening.py: mode=ro, or immutable=1 where not even a -shm can be made
                self.db, self.access = connect_reader(self.path, busy_timeout_ms)
            else:
                self.db, self.access = sqlite3.connect(self.path, isolation_level=None,
                                                       check_same_thread=False), READ_WRITE
            self.db.row_factory = sqlite3.Row
            self.db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            self.db.execute("PRAGMA foreign_keys = ON")
            if not readonly:
                mode = self.db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if mode.lower() != "wal":
                    raise LedgerError(f"{self.path}: could not switch the ledger to WAL (got {mode})")
                self.set_durability(durability)
            self._migrate()
            self._parts()
        except sqlite3.DatabaseError as e:
            if getattr(self, "db", None) is not None:
                self.db.close()         # no file descriptor left open on a ledger refused
            blocked = None if readonly or not cannot_open(e) else unwritable(self.path)
            if blocked is not None:
                raise LedgerError(f"cannot write the ledger {self.path}: {blocked} cannot be written (a read-only "
                                  "project: relay status, audit, search, show read it all the same)") from None
            raise LedgerError.opening(self.path, e) from None

    def _parts(self):
        """The parts, each given the others it uses."""
        self.chain = Chain(self)
        self.senders = Senders(self)
        self.sheds = ShedKeep(self)
        self.search = SearchIndex(self)
        self.bounces = BounceRecords(self)
        self.registry = AgentRegistry(self)
        self.receipts = Receipts(self)
        self.hook_sessions = HookSessions(self)
        self.reservations = Reservations(self)
        self.state = StateWrites(self)
        self.operations = Operations(self, search=self.search)
        self.imports = Imports(self, chain=self.chain, search=self.search)
        self.remote = FederationRecords(self, chain=self.chain, search=self.search, bounces=self.bounces,
                                        sheds=self.sheds, registry=self.registry)
        self.messages = Messages(self, chain=self.chain, search=self.search, bounces=self.bounces, sheds=self.sheds,
                                 remote=self.remote, registry=self.registry, receipts=self.receipts)

    def close(self):
        self.db.close()

    def set_durability(self, durability):
        """"full": every commit is on disk when it returns (synchronous = FULL); "normal": not."""
        self.durability = durability
        self.db.execute(f"PRAGMA synchronous = {'FULL' if durability == 'full' else 'NORMAL'}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- attestation ------------------------------------------------------------------------

    def attest(self, now, facts):
        """Record what this (writer) connection reports about its settings, with the process
        that holds it: `facts` has pid, host, version, mode (daemon | once), event (start |
        reload), durability (configured), journal_mode, synchronous, busy_timeout_ms and
        foreign_keys. The newest ATTESTATIONS_KEPT are kept."""
        with self.transaction():
            self.db.execute(
                "INSERT INTO attestations (at, pid, host, version, mode, event, durability, journal_mode, "
                "synchronous, busy_timeout_ms, foreign_keys) VALUES (:at, :pid, :host, :version, :mode, :event, "
                ":durability, :journal_mode, :synchronous, :busy_timeout_ms, :foreign_keys)",
                {**facts, "at": now, "foreign_keys": int(bool(facts["foreign_keys"]))})
            self.db.execute("DELETE FROM attestations WHERE seq <= (SELECT max(seq) FROM attestations) - ?",
                            (ATTESTATIONS_KEPT,))

    # -- schema -----------------------------------------------------------------------------

    def _migrate(self):
        migrate(self.db, self.path, self.readonly)

    # -- transactions -----------------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self, synced=True):
        """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK when the block raises. With `synced` False
        and durability "full", the commit is not synced (synchronous = NORMAL for it: in WAL
        mode the ledger stays whole, only this commit may be lost): `unsynced` says so until the
        caller syncs the write-ahead log (`wal_fd`) or a later commit of this connection, synced,
        does (the log is one file, synced to its end)."""
        quick = not synced and self.durability == "full"
        changes = self.db.total_changes
        if quick:
            self.db.execute("PRAGMA synchronous = NORMAL")
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                try:
                    self.db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                raise
            self.db.execute("COMMIT")
        finally:
            if quick:
                self.db.execute("PRAGMA synchronous = FULL")
        if quick:
            self.unsynced = True
        elif self.db.total_changes != changes and self.durability == "full":
            self.unsynced = False       # a commit that wrote is synced to the log's end

    def wal_fd(self):
        """A read-only descriptor of the ledger's write-ahead log (never through a link): an
        fsync of it makes every commit so far durable. The caller closes it."""
        return os.open(self.path + "-wal", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)

    def synced(self):
        """The log was synced by someone else (the syncer, with a batch's envelopes)."""
        self.unsynced = False

    def sync(self):
        """Make every commit so far durable, as a synced commit would: the log's fdatasync (its
        error is raised, as SQLite's own would fail the commit)."""
        if self.unsynced:
            fd = self.wal_fd()
            try:
                fdatasync(fd)
            finally:
                os.close(fd)
            self.unsynced = False

    def events(self, rows):
        """Inside a transaction: append lifecycle events, in one statement; rows: (message_id, at,
        event, detail[, actor])."""
        insert_rows(self.db, "INSERT INTO events (message_id, at, event, detail, actor)",
                    [r if len(r) == 5 else (*r, "relay") for r in rows])
