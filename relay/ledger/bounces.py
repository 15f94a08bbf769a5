"""The ledger's part for bounces (core/bounces.py decides them and writes their files): what a
sender is owed for a message that failed, or was shed for some of its recipients, or refused by
another node, recorded once per (message, recipient set) in the very transaction that records the
failure; and, once the bounce's file is in the spool, the bounce registered as a message of its
own from System, in one transaction with its `emitted_at`. The writes are `ledger.bounces`
(BounceRecords), the reads `history.bounces` (BounceHistory)."""
import orjson

from relay.config import SYSTEM
from relay.ids import IdGenerator
from relay.ledger.part import Part
from relay.ledger.sql import chunks, insert_rows, with_rows

KIND = "bounce"         # the kind of a bounce, and the name of its file in the spool and the archive
REASON_CHARS = 4000     # a reason is cut to this many characters in a bounce

_ids = IdGenerator()


def _key(recipients):
    return orjson.dumps(sorted(dict.fromkeys(recipients))).decode()


class BounceRecords(Part):
    """The writes: what is owed (inside the caller's transaction), and what was emitted."""

    def owe(self, now, items):
        """Inside a transaction: record the bounces owed. items: (message id, sender, recipients,
        reason). A sender that is System (a bounce, a ping) is owed none, nor a bounce of System's
        (an agent's file of kind bounce, refused, is owed one); a (message, recipient set) owed one
        already is not owed another. Returns how many were recorded."""
        rows = [(mid, _key(recipients), _ids.new(now), sender, str(reason)[:REASON_CHARS], now)
                for mid, sender, recipients, reason in items if sender != SYSTEM]
        if not rows:
            return 0
        return with_rows(
            self.db, "message_id, recipients, id, sender, reason, at", rows,
            "INSERT INTO bounces (message_id, recipients, id, sender, reason, at) SELECT * FROM v "
            "WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE m.id = v.message_id AND m.kind IS 'bounce' "
            "AND m.sender IS 'System') ON CONFLICT DO NOTHING")

    def owe_refused(self, now, mid, node):
        """Inside a transaction: the bounce owed for a message another node refused (its
        outbound row to `node`, with the recipients and the reason recorded there)."""
        row = self.db.execute("SELECT m.sender, o.recipients, o.error FROM outbound o JOIN messages m ON m.id = "
                              "o.message_id WHERE o.message_id = ? AND o.node = ?", (mid, node)).fetchone()
        if row is not None:
            self.owe(now, [(mid, row[0], orjson.loads(row[1]), f"refused by node {node}: {row[2]}")])

    def bounced(self, now, emitted, skipped=()):
        """The bounces whose files are in the spool now, registered as messages from System
        (pending, spooled; one registered already, by recovery, is left as it is), each marked
        emitted, in one transaction. emitted: (bounce id, message id, sender); skipped: ids of
        bounce rows this build cannot read, marked emitted with no message."""
        with self.transaction():
            insert_rows(self.db, "INSERT INTO messages (id, sender, name, status, spooled, kind, sent_at, discovered_at, "
                                 "next_attempt_at)", [(bid, SYSTEM, KIND, KIND, now, now) for bid, _, _ in emitted],
                        "ON CONFLICT DO NOTHING", row="(?, ?, ?, 'pending', 1, ?, ?, ?, 0)")
            for chunk, marks in chunks([*skipped, *(bid for bid, _, _ in emitted)]):
                self.db.execute(f"UPDATE bounces SET emitted_at = ? WHERE id IN ({marks})", [now, *chunk])
            self.events([(mid, now, "bounced", f"bounce {bid} to {sender}") for bid, mid, sender in emitted]
                        + [(bid, now, "discovered", f"a bounce of {mid} to {sender}") for bid, mid, sender in emitted])


class BounceHistory(Part):
    """The reads."""

    def due(self, limit, before=None):
        """The bounces owed and not emitted yet (owed before `before`, when given), oldest first,
        with what the bounce says of the message (subject, thread) and whether a message row has
        the bounce's id already."""
        return self.db.execute(
            "SELECT b.*, m.subject, m.thread, EXISTS (SELECT 1 FROM messages x WHERE x.id = b.id) AS registered "
            "FROM bounces b INDEXED BY bounces_due LEFT JOIN messages m ON m.id = b.message_id "
            "WHERE b.emitted_at IS NULL AND b.at < ? ORDER BY b.at LIMIT ?",
            (before if before is not None else 1e18, limit)).fetchall()
