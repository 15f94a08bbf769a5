"""The ledger's reads for verify and doctor (`history.checks`): the hash chain and its checkpoint,
the envelopes and paths recorded, SQLite's own integrity check, the migrations applied and the
connection's settings."""
from relay.ledger.chain import GENESIS, chain_hash
from relay.ledger.ledger import Status
from relay.ledger.opening import IMMUTABLE, journal_mode_on_disk
from relay.ledger.part import Part
from relay.ledger.rows import BadRow
from relay.ledger.schema import MIGRATIONS, checksum


class Checks(Part):
    """See the module's docstring. `ledger`: the Ledger whose connection the History reads (its
    chain's head, how it was opened and its path)."""

    def __init__(self, store, ledger):
        super().__init__(store)
        self.ledger = ledger

    def head(self):
        """(seq, hash) of the chain's last record, or of the last checkpoint when it is empty."""
        return self.ledger.chain.head()

    def chain(self):
        """The hash chain from the last checkpoint, link by link: (link, row, gap, intact) where
        `gap` is (first, last) of the links missing before this one or None, `row` the link's
        message record (None when it was deleted) and `intact` whether that record is archived
        and still hashes to the link."""
        cp = self.checkpoint()
        # One this build cannot read stands for nothing (verify says so): walked from the start.
        seq, prev = (cp["upto"], cp["head"]) if cp and BadRow.of(cp, "checkpoints") is None else (0, GENESIS)
        for link in self.db.execute("SELECT seq, message_id, hash FROM chain WHERE seq > ? ORDER BY seq", (seq,)):
            gap = (seq + 1, link["seq"] - 1) if link["seq"] != seq + 1 else None
            seq = link["seq"]
            row = self.db.execute("SELECT * FROM messages WHERE id = ?", (link["message_id"],)).fetchone()
            try:
                intact = row is not None and row["status"] == Status.ARCHIVED and chain_hash(prev, row) == link["hash"]
            except TypeError:       # a value no record of relay's holds (a blob): not what was chained
                intact = False
            prev = link["hash"]
            yield link, row, gap, intact

    def checkpoint(self):
        """The last checkpoint a retention sweep left of the chain (seq, at, upto, head, removed), or None."""
        return self.db.execute("SELECT * FROM checkpoints ORDER BY seq DESC LIMIT 1").fetchone()

    def links_upto(self, seq):
        """How many chain records lie at or before position `seq` (a sweep deletes them all)."""
        return self.db.execute("SELECT count(*) FROM chain WHERE seq <= ?", (seq,)).fetchone()[0]

    def unchained(self):
        """Ids of archived records that are not in the hash chain."""
        return [row["id"] for row in self.db.execute(
            "SELECT id FROM messages WHERE status = 'archived' AND id NOT IN (SELECT message_id FROM chain)")]

    def recorded_envelopes(self):
        """(message_id, recipient, size, sha256) of every delivery recorded with its envelope's digest."""
        return self.db.execute("SELECT message_id, recipient, size, sha256 FROM deliveries "
                               "WHERE sha256 IS NOT NULL ORDER BY recipient, message_id")

    def integrity_check(self):
        """SQLite's own check of the ledger file: ['ok'] or what is damaged."""
        return [r[0] for r in self.db.execute("PRAGMA integrity_check")]

    def migrations(self):
        """(version, name, checksum ok) for doctor."""
        known = {v: checksum(sql) for v, _, sql in MIGRATIONS}
        return [(r["version"], r["name"], known.get(r["version"]) == r["checksum"])
                for r in self.db.execute("SELECT * FROM schema_migrations ORDER BY version")]

    def journal_mode(self):
        if getattr(self.ledger, "access", None) == IMMUTABLE:      # opened with no log: the file's header
            return journal_mode_on_disk(self.ledger.path)
        return self.db.execute("PRAGMA journal_mode").fetchone()[0]

    def pragmas(self):
        db = self.db
        sync = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
        return {"journal_mode": self.journal_mode(),
                "synchronous": sync.get(db.execute("PRAGMA synchronous").fetchone()[0], "?"),
                "busy_timeout_ms": db.execute("PRAGMA busy_timeout").fetchone()[0],
                "foreign_keys": bool(db.execute("PRAGMA foreign_keys").fetchone()[0])}

    def archived(self):
        """(id, archive_path) of every archived message."""
        return self.db.execute("SELECT id, archive_path FROM messages WHERE status = 'archived'")

    def quarantined(self):
        """(id, failed_path) of every failed message whose file was quarantined."""
        return self.db.execute("SELECT id, failed_path FROM messages WHERE status = 'failed' AND failed_path IS NOT NULL")

    def recorded_paths(self):
        """Every archive and quarantine path a record holds."""
        known = {r[0] for r in self.db.execute("SELECT archive_path FROM messages WHERE archive_path IS NOT NULL")}
        known |= {r[0] for r in self.db.execute("SELECT failed_path FROM messages WHERE failed_path IS NOT NULL")}
        return known

    def active_ids(self):
        """Ids of messages still on their way (pending, processing, delivered), and the ids
        their spool files are named by where a sender chose another (`spool_id`)."""
        return {r[0] for r in self.db.execute(
            "SELECT id FROM messages WHERE status IN ('pending', 'processing', 'delivered') UNION "
            "SELECT spool_id FROM messages WHERE status IN ('pending', 'processing', 'delivered') "
            "AND spool_id IS NOT NULL")}

    def explain(self, sql, args=()):
        return [r[-1] for r in self.db.execute("EXPLAIN QUERY PLAN " + sql, args)]

    # -- federation -------------------------------------------------------------------------
