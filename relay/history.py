"""What the ledger says: every read-only query, for the relay's loop (what is due, what a
recovery must look at) and for people (audit, show, tail, status, agents, the report's figures,
the hash chain walked by verify, doctor's integrity checks). Nothing here writes; the writes are
in ledger.py.

A History reads through a Ledger's connection: the relay's own (so the loop reads what its
writes left), or one a read-only verb opened beside a running daemon.
"""
from .errors import NotFound, RelayError
from .layout import valid_id
from .ledger import GENESIS, STATUSES, Status, chain_hash, checksum
from .schema import MIGRATIONS

CHUNK = 500         # ids per `IN (...)` query


class History:
    def __init__(self, ledger):
        self.ledger = ledger
        self.db = ledger.db

    def close(self):
        self.ledger.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- one message ------------------------------------------------------------------------

    def get(self, mid):
        return self.db.execute("SELECT * FROM messages WHERE id = ?", (mid,)).fetchone()

    def find(self, mid):
        """A message by id or unique id prefix (any case); NotFound or RelayError otherwise."""
        prefix = mid.upper()
        rows = self.db.execute("SELECT * FROM messages WHERE id >= ? AND id < ? ORDER BY id LIMIT 2",
                               (prefix, prefix + "\x7f")).fetchall()
        if len(rows) == 1 or (rows and rows[0]["id"] == prefix):
            return rows[0]
        if rows:
            raise RelayError(f"{mid!r} matches more than one message; give more of the id")
        if valid_id(prefix):
            # The id `relay send` printed is in the file, read when relay parses it: a message
            # failed or held back before that (too large, unreadable, not yet read) is still
            # under the id relay gave it when found, but its file name carries the printed one.
            rows = self.db.execute("SELECT * FROM messages WHERE name = ? ORDER BY discovered_at, id LIMIT 2",
                                   (f"msg-{prefix.lower()}",)).fetchall()
            if len(rows) == 1:
                return rows[0]
        raise NotFound(f"no message with id {mid!r} in the ledger")

    def by_request(self, sender, request_id):
        """The id of the sender's message with this request id that did not fail, or None."""
        row = self.db.execute("SELECT id FROM messages WHERE sender = ? AND request_id = ? AND duplicate_of IS NULL "
                              "AND status != 'failed' ORDER BY discovered_at, id LIMIT 1",
                              (sender, request_id)).fetchone()
        return row[0] if row else None

    def events(self, mid):
        return self.db.execute("SELECT * FROM events WHERE message_id = ? ORDER BY seq", (mid,)).fetchall()

    def deliveries(self, mid):
        return self.db.execute("SELECT * FROM deliveries WHERE message_id = ? ORDER BY recipient",
                               (mid,)).fetchall()

    # -- the loop's questions ---------------------------------------------------------------

    def delivered_to(self, ids):
        """{id: {recipient: (size, sha256)}} of the deliveries recorded for these messages."""
        out = {}
        for i in range(0, len(ids), CHUNK):
            chunk = ids[i:i + CHUNK]
            for r in self.db.execute("SELECT message_id, recipient, size, sha256 FROM deliveries WHERE message_id "
                                     f"IN ({','.join('?' * len(chunk))})", chunk):
                out.setdefault(r[0], {})[r[1]] = (r[2], r[3])
        return out

    def processing(self):
        return self.db.execute("SELECT * FROM messages WHERE status = 'processing' ORDER BY id").fetchall()

    def unknown(self, ids):
        """The ids among `ids` that no row holds, as its id or as the id its spool file is
        named by."""
        known = set()
        for i in range(0, len(ids), CHUNK):
            chunk = ids[i:i + CHUNK]
            marks = ','.join('?' * len(chunk))
            known.update(r[0] for r in self.db.execute(
                f"SELECT id FROM messages WHERE id IN ({marks}) UNION "
                f"SELECT spool_id FROM messages WHERE spool_id IN ({marks})", chunk + chunk))
        return set(ids) - known

    def latest_archived_at(self):
        return self.db.execute("SELECT max(archived_at) FROM messages WHERE status = 'archived'").fetchone()[0]

    def waiting(self, now, horizon):
        """(what, why) of pending messages due within `horizon` seconds (what run --once left)."""
        return [(f"{r['id']} from {r['sender']} (spool)" if r["spooled"] else f"outbox/{r['sender']}/{r['name']}",
                 r["error"] or "pending")
                for r in self.db.execute("SELECT id, sender, name, spooled, error FROM messages WHERE status = "
                                         "'pending' AND next_attempt_at <= ? ORDER BY id", (now + horizon,))]

    def delivered_due(self, now, limit):
        return self.db.execute("SELECT * FROM messages WHERE status = 'delivered' AND next_attempt_at <= ? "
                               "ORDER BY next_attempt_at LIMIT ?", (now, limit)).fetchall()

    def next_archive_due(self):
        return self.db.execute("SELECT min(next_attempt_at) FROM messages WHERE status = 'delivered'"
                               ).fetchone()[0]

    def next_due(self):
        row = self.db.execute("SELECT min(next_attempt_at) FROM messages WHERE status = 'pending'").fetchone()
        return row[0]

    # -- retention --------------------------------------------------------------------------

    def sweepable(self, cutoff, limit):
        """(archived rows in chain order, failed rows) older than `cutoff`, at most `limit` of each.

        Archived rows are taken as a prefix of the hash chain, so a checkpoint can stand for them.
        """
        archived = []
        for row in self.db.execute("SELECT c.seq, c.hash, m.id, m.archived_at, m.archive_path FROM chain c "
                                   "JOIN messages m ON m.id = c.message_id ORDER BY c.seq LIMIT ?", (limit,)):
            if row["archived_at"] is None or row["archived_at"] >= cutoff:
                break
            archived.append(row)
        failed = self.db.execute("SELECT id, failed_path FROM messages WHERE status = 'failed' AND failed_at < ? "
                                 "ORDER BY failed_at LIMIT ?", (cutoff, limit)).fetchall()
        return archived, failed

    def count_sweepable(self, cutoff):
        """(archived, failed) entries older than `cutoff` (what a dry run would delete)."""
        archived = self.db.execute("SELECT count(*) FROM messages WHERE status = 'archived' AND archived_at < ?",
                                   (cutoff,)).fetchone()[0]
        failed = self.db.execute("SELECT count(*) FROM messages WHERE status = 'failed' AND failed_at < ?",
                                 (cutoff,)).fetchone()[0]
        return archived, failed

    # -- for people -------------------------------------------------------------------------

    def counts(self):
        counts = dict.fromkeys(STATUSES, 0)
        for row in self.db.execute("SELECT status, count(*) AS n FROM messages GROUP BY status"):
            counts[row["status"]] = row["n"]
        return counts

    def oldest_pending(self):
        row = self.db.execute("SELECT min(discovered_at) FROM messages WHERE status IN ('pending', 'processing')"
                              ).fetchone()
        return row[0]

    def agents(self):
        return self.db.execute("SELECT * FROM agents ORDER BY name").fetchall()

    def agent_figures(self, name):
        """(messages sent, deliveries received, the row of the last failed message sent or None)."""
        sent = self.db.execute("SELECT count(*) FROM messages WHERE sender = ?", (name,)).fetchone()[0]
        received = self.db.execute("SELECT count(*) FROM deliveries WHERE recipient = ?", (name,)).fetchone()[0]
        err = self.db.execute("SELECT id, error FROM messages WHERE sender = ? AND status = 'failed' "
                              "ORDER BY id DESC LIMIT 1", (name,)).fetchone()
        return sent, received, err

    def audit(self, sender=None, recipient=None, status=None, kind=None, thread=None, since=None,
              until=None, grep=None, limit=None, oldest_first=False, since_id=None):
        where, args = [], []
        if sender:
            where.append("m.sender = ?"); args.append(sender)
        if recipient:
            where.append("m.id IN (SELECT message_id FROM deliveries WHERE recipient = ?"
                         " UNION SELECT id FROM messages WHERE recipients LIKE ?)")
            args += [recipient, f'%"{recipient}"%']
        if status:
            where.append("m.status = ?"); args.append(str(status))
        if kind:
            where.append("m.kind = ?"); args.append(kind)
        if thread:
            where.append("m.thread = ?"); args.append(thread)
        if since is not None:
            where.append("m.discovered_at >= ?"); args.append(since)
        if until is not None:
            where.append("m.discovered_at < ?"); args.append(until)
        if since_id:
            where.append("m.id > ?"); args.append(since_id)
        if grep:
            where.append("(instr(lower(coalesce(m.subject, '')), lower(?)) OR instr(lower(coalesce(m.body, '')), lower(?))"
                         " OR instr(lower(m.name), lower(?)))")
            args += [grep, grep, grep]
        sql = "SELECT m.* FROM messages m"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY m.id " + ("ASC" if oldest_first else "DESC")
        if limit:
            sql += " LIMIT ?"; args.append(int(limit))
        return self.db.execute(sql, args)

    def last_event(self):
        """The seq of the newest lifecycle event (0 when there is none)."""
        return self.db.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0]

    def events_after(self, seq):
        """Lifecycle events after `seq`, oldest first, with their message's sender and recipients."""
        return self.db.execute("SELECT e.*, m.sender, m.recipients FROM events e LEFT JOIN messages m "
                               "ON m.id = e.message_id WHERE e.seq > ? ORDER BY e.seq", (seq,)).fetchall()

    def figures(self, since=None):
        """The numbers of `relay report`: counts, who told whom, messages per hour, failures, threads."""
        db = self.db
        since = since or 0
        data = {"since": since}
        data["counts"] = {r[0]: r[1] for r in db.execute(
            "SELECT status, count(*) FROM messages WHERE discovered_at >= ? GROUP BY status", (since,))}
        data["matrix"] = db.execute(
            "SELECT m.sender, d.recipient, count(*) AS n FROM deliveries d JOIN messages m ON m.id = d.message_id "
            "WHERE m.discovered_at >= ? GROUP BY m.sender, d.recipient", (since,)).fetchall()
        data["hours"] = db.execute(
            "SELECT CAST(discovered_at / 3600 AS INTEGER) AS h, count(*) AS n FROM messages WHERE discovered_at >= ? "
            "GROUP BY h ORDER BY h", (since,)).fetchall()
        data["failures"] = db.execute(
            "SELECT id, sender, name, error, failed_at FROM messages WHERE status = 'failed' AND discovered_at >= ? "
            "ORDER BY id DESC LIMIT 200", (since,)).fetchall()
        data["threads"] = db.execute(
            "SELECT thread, count(*) AS n, min(discovered_at) AS first, max(discovered_at) AS last, "
            "group_concat(DISTINCT sender) AS senders FROM messages WHERE thread IS NOT NULL AND discovered_at >= ? "
            "GROUP BY thread ORDER BY last DESC LIMIT 100", (since,)).fetchall()
        return data

    # -- verification -----------------------------------------------------------------------

    def head(self):
        """(seq, hash) of the chain's last record, or of the last checkpoint when it is empty."""
        return self.ledger.head()

    def chain(self):
        """The hash chain from the last checkpoint, link by link: (link, row, gap, intact) where
        `gap` is (first, last) of the links missing before this one or None, `row` the link's
        message record (None when it was deleted) and `intact` whether that record is archived
        and still hashes to the link."""
        cp = self.db.execute("SELECT upto, head FROM checkpoints ORDER BY seq DESC LIMIT 1").fetchone()
        seq, prev = (cp["upto"], cp["head"]) if cp else (0, GENESIS)
        for link in self.db.execute("SELECT seq, message_id, hash FROM chain WHERE seq > ? ORDER BY seq", (seq,)):
            gap = (seq + 1, link["seq"] - 1) if link["seq"] != seq + 1 else None
            seq = link["seq"]
            row = self.get(link["message_id"])
            intact = row is not None and row["status"] == Status.ARCHIVED and chain_hash(prev, row) == link["hash"]
            prev = link["hash"]
            yield link, row, gap, intact

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
