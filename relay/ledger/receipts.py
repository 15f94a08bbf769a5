"""Receipts, acknowledgements and priority (contract §3): what became of each recipient's copy
of a message after its delivery, and what its sender asked of it.

A recipient's copy moves through delivered (the `deliveries` row), surfaced (given to the agent
by a hook, MCP, the API or `relay inbox`), read (moved from new/ to cur/, by relay or by any
Maildir client) and acknowledged (`relay ack`). Each step is recorded once, at its first time,
with an event (`surfaced`, `read`, `acked`; detail the recipient, the actor the recipient); a
later step stands for the earlier ones it implies (an acknowledged copy was read, a read one
surfaced), so every step has a time once a later one has. A step is recorded only for a copy
the ledger records as delivered.

The `asks` table holds a message's priority and whether it asks for acknowledgements, for the
messages that ask for either (a message with no row is `normal` and asks nothing).

    ledger.receipts.surfaced([(mid, "Bob")], now)       # a store that writes (Ledger)
    history.receipts.of(mid)                            # a store that reads (History)
"""
from relay.ledger.part import Part
from relay.ledger.sql import chunks, insert_rows

PRIORITIES = ("urgent", "high", "normal", "low")     # most urgent first
STEPS = ("surfaced", "read", "acked")
# A step's column, and the earlier steps' columns it fills when they have no time yet.
_FILLS = {"surfaced": ("surfaced_at",), "read": ("surfaced_at", "read_at"),
          "acked": ("surfaced_at", "read_at", "acked_at")}


class Receipts(Part):
    """The receipts part of a Ledger (writes) or a History (reads)."""

    # -- writes -------------------------------------------------------------------------------

    def asked(self, rows):
        """Inside the caller's transaction (a batch's record): (message id, priority,
        ack_required) of the messages that ask for something (not `normal`, or acknowledgements)."""
        rows = [(mid, p, int(bool(a))) for mid, p, a in rows if p != "normal" or a]
        if rows:
            insert_rows(self.db, "INSERT OR IGNORE INTO asks (message_id, priority, ack_required)", rows)

    def step(self, step, pairs, now, detail=None):
        """Record `step` ("surfaced", "read", "acked") of each (message id, recipient[, at])
        delivered copy at `at` (default `now`), and the earlier steps it implies that have no time yet. Returns the pairs
        this call recorded the step for (the others had it already, or are no delivered copy)."""
        with self.transaction():
            return self._step(step, pairs, now, detail)

    def _step(self, step, pairs, now, detail=None):
        columns = _FILLS[step]
        sets = ", ".join(f"{c} = coalesce({c}, excluded.{c})" for c in columns)
        done, events = [], []
        for mid, recipient, *at in dict.fromkeys(pairs):
            # never before the delivery (a client's clock, a file's time): at its time at the earliest
            row = self.db.execute(
                f"INSERT INTO receipts (message_id, recipient, {', '.join(columns)}) "
                f"SELECT message_id, recipient, {', '.join('max(:at, delivered_at)' for _ in columns)} "
                "FROM deliveries WHERE message_id = :mid AND recipient = :r "
                f"ON CONFLICT (message_id, recipient) DO UPDATE SET {sets} WHERE {columns[-1]} IS NULL "
                f"RETURNING {columns[-1]}", {"mid": mid, "r": recipient, "at": at[0] if at else now}).fetchone()
            if row is not None:
                done.append((mid, recipient))
                events.append((mid, row[0], step, recipient if detail is None else f"{recipient} ({detail})",
                               recipient))
        self.events(events)
        return done

    def acked(self, mid, recipient, now, note=None, reply_id=None):
        """The recipient acknowledges its delivered copy (with the note it gave and the id of the
        reply that carries it). True when recorded now, False when acknowledged before or no
        delivered copy of it is recorded."""
        with self.transaction():
            done = self._step("acked", [(mid, recipient)], now)
            if done and (note is not None or reply_id is not None):
                self.db.execute("UPDATE receipts SET note = ?, reply_id = ? WHERE message_id = ? AND recipient = ?",
                                (note, reply_id, mid, recipient))
        return bool(done)

    # -- reads --------------------------------------------------------------------------------

    def asks(self, mid):
        """(priority, ack_required) that message `mid` asked for."""
        row = self.db.execute("SELECT priority, ack_required FROM asks WHERE message_id = ?", (mid,)).fetchone()
        return ("normal", False) if row is None else (row["priority"], bool(row["ack_required"]))

    def priorities(self, ids):
        """{id: priority} of those of `ids` that are not `normal`."""
        out = {}
        for chunk, marks in chunks(list(ids)):
            out.update((r[0], r[1]) for r in self.db.execute(
                f"SELECT message_id, priority FROM asks WHERE message_id IN ({marks}) AND priority != 'normal'", chunk))
        return out

    def of(self, mid):
        """Each delivered recipient's receipt of message `mid`, by recipient: dicts with
        recipient, delivered_at, surfaced_at, read_at, acked_at (epoch seconds or None), note and
        reply_id."""
        rows = self.db.execute(
            "SELECT d.recipient, d.delivered_at, r.surfaced_at, r.read_at, r.acked_at, r.note, r.reply_id "
            "FROM deliveries d LEFT JOIN receipts r ON r.message_id = d.message_id AND r.recipient = d.recipient "
            "WHERE d.message_id = ? ORDER BY d.recipient", (mid,))
        return [dict(r) for r in rows]

    def unacknowledged(self, agent, limit=100):
        """The messages delivered to `agent` that ask for an acknowledgement it has not given,
        oldest first: dicts with id, sender, subject, thread, delivered_at."""
        rows = self.db.execute(
            "SELECT m.id, m.sender, m.subject, m.thread, d.delivered_at FROM deliveries d "
            "JOIN asks a ON a.message_id = d.message_id AND a.ack_required = 1 "
            "JOIN messages m ON m.id = d.message_id "
            "LEFT JOIN receipts r ON r.message_id = d.message_id AND r.recipient = d.recipient "
            "WHERE d.recipient = ? AND r.acked_at IS NULL ORDER BY d.message_id LIMIT ?", (agent, limit))
        return [dict(r) for r in rows]

    def overdue(self, cutoff, sender=None, limit=1000):
        """The copies of messages asking for acknowledgement, delivered at or before `cutoff` and
        not acknowledged, oldest first (of `sender`'s messages only, when given): dicts with id,
        sender, recipient, subject, thread, delivered_at, surfaced_at, read_at."""
        rows = self.db.execute(
            "SELECT m.id, m.sender, d.recipient, m.subject, m.thread, d.delivered_at, r.surfaced_at, r.read_at "
            "FROM asks a JOIN deliveries d ON d.message_id = a.message_id JOIN messages m ON m.id = a.message_id "
            "LEFT JOIN receipts r ON r.message_id = d.message_id AND r.recipient = d.recipient "
            "WHERE a.ack_required = 1 AND r.acked_at IS NULL AND d.delivered_at <= :cutoff "
            "AND (:sender IS NULL OR m.sender = :sender) ORDER BY d.delivered_at, m.id, d.recipient LIMIT :limit",
            {"cutoff": cutoff, "sender": sender, "limit": limit})
        return [dict(r) for r in rows]

    def overdue_count(self, cutoff):
        """How many copies overdue() would list, all senders."""
        return self.db.execute(
            "SELECT count(*) FROM asks a JOIN deliveries d ON d.message_id = a.message_id "
            "LEFT JOIN receipts r ON r.message_id = d.message_id AND r.recipient = d.recipient "
            "WHERE a.ack_required = 1 AND r.acked_at IS NULL AND d.delivered_at <= ?", (cutoff,)).fetchone()[0]

    def unread_of(self, agent, limit=200, window=10000):
        """The ids of the newest `limit` copies delivered to `agent` with no read recorded, among
        its newest `window` deliveries, oldest first: what its new/ may hold (the caller looks
        each up). Bounded whatever the inbox or the ledger holds."""
        rows = self.db.execute(
            "SELECT d.message_id FROM (SELECT message_id, recipient FROM deliveries WHERE recipient = ? "
            "ORDER BY message_id DESC LIMIT ?) d LEFT JOIN receipts r "
            "ON r.message_id = d.message_id AND r.recipient = d.recipient "
            "WHERE r.read_at IS NULL ORDER BY d.message_id DESC LIMIT ?", (agent, window, limit))
        return [r[0] for r in rows][::-1]

    def unread_since(self, lowest, limit=10000):
        """(message id, recipient) of delivered copies with no read recorded, of messages whose id
        is `lowest` or later (ids sort by time), oldest first: what a Maildir client may have
        read while no daemon watched."""
        return [(r[0], r[1]) for r in self.db.execute(
            "SELECT d.message_id, d.recipient FROM deliveries d LEFT JOIN receipts r "
            "ON r.message_id = d.message_id AND r.recipient = d.recipient "
            "WHERE d.message_id >= ? AND r.read_at IS NULL ORDER BY d.message_id LIMIT ?", (lowest, limit))]
