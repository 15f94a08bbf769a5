"""The ledger's reads for the federation (`history.remote`): outbound rows due, waiting for an
acknowledgement or late, the ids received from other nodes, the directory as last resolved and
the link's state."""
import orjson

from relay.ledger.part import Part
from relay.ledger.sql import chunks



class RemoteHistory(Part):
    """See the module's docstring."""

    def outbound_due(self, now, limit, max_bytes=None):
        """Outbound rows to publish now, oldest due first: at most `limit`, and no more once
        their envelopes reach `max_bytes` (one at least)."""
        rows, held = [], 0
        for row in self.db.execute("SELECT o.message_id, o.node, o.recipients, o.envelope, o.attempts, o.queued_at, "
                                   "m.sender FROM outbound o LEFT JOIN messages m ON m.id = o.message_id WHERE "
                                   "o.status = 'pending' AND o.next_attempt_at <= ? ORDER BY o.next_attempt_at LIMIT ?",
                                   (now, limit)):
            rows.append(row)
            held += len(row["envelope"])
            if max_bytes is not None and held >= max_bytes:
                break
        return rows

    def next_outbound_due(self):
        return self.db.execute("SELECT min(next_attempt_at) FROM outbound WHERE status = 'pending'").fetchone()[0]

    def outbound(self, mid):
        """One message's outbound rows (relay show)."""
        return self.db.execute("SELECT * FROM outbound WHERE message_id = ? ORDER BY node", (mid,)).fetchall()

    def routes(self, ids):
        """{id: {recipient: node}} of the recipients on other nodes (relay audit)."""
        out = {}
        for chunk, marks in chunks(ids):
            for r in self.db.execute("SELECT message_id, node, recipients FROM outbound WHERE message_id "
                                     f"IN ({marks})", chunk):
                out.setdefault(r[0], {}).update(dict.fromkeys(orjson.loads(r[2]), r[1]))
        return out

    def outbound_counts(self):
        """{'pending': n, 'published': n (waiting for their node's acknowledgement),
        'acknowledged': n, 'refused': n, 'oldest_pending_at', 'by_node': {node: {'waiting': n (pending
        or published), 'oldest_at': t, 'published': n (published before, maybe being published again),
        'unacked_since': when the oldest of those was queued}}}."""
        doc = {"pending": 0, "published": 0, "acknowledged": 0, "refused": 0}
        doc.update({r[0]: r[1] for r in self.db.execute("SELECT status, count(*) FROM outbound GROUP BY status")})
        doc["oldest_pending_at"] = self.db.execute(
            "SELECT min(queued_at) FROM outbound WHERE status = 'pending'").fetchone()[0]
        doc["by_node"] = {r[0]: {"waiting": r[1], "oldest_at": r[2], "published": r[3], "unacked_since": r[4]}
                          for r in self.db.execute(
            "SELECT node, count(*), min(queued_at), sum(published_at IS NOT NULL), "
            "min(CASE WHEN published_at IS NOT NULL THEN queued_at END) FROM outbound WHERE status IN ('pending', "
            "'published') GROUP BY node ORDER BY node")}
        return doc

    def unacknowledged(self, node=None):
        """{node: count} of rows published and not yet acknowledged (counted by node on its
        index; the nodes found by seeks, waiting_nodes())."""
        nodes = [node] if node is not None else self.waiting_nodes()
        out = {}
        for n in nodes:
            count = self.db.execute("SELECT count(*) FROM outbound WHERE node = ? AND status = 'published'",
                                    (n,)).fetchone()[0]
            if count:
                out[n] = count
        return out

    def any_unacknowledged(self):
        """Whether a row published waits for its acknowledgement (one seek)."""
        return self.db.execute("SELECT 1 FROM outbound WHERE status = 'published' LIMIT 1").fetchone() is not None

    def unacknowledged_since(self):
        """{node: (rows published and not yet acknowledged, being published again included; when
        the oldest of them was queued)}: by node, its oldest found by a seek."""
        out = {}
        for node in self.waiting_nodes():
            published, oldest = self.db.execute(
                "SELECT count(*), (SELECT min(queued_at) FROM outbound WHERE node = ?1 AND status = 'published') "
                "FROM outbound WHERE node = ?1 AND status = 'published'", (node,)).fetchone()
            again, first = self.db.execute(
                "SELECT count(*), min(queued_at) FROM outbound WHERE node = ? AND status = 'pending' AND "
                "published_at IS NOT NULL", (node,)).fetchone()
            if published or again:
                out[node] = (published + again, min(t for t in (oldest, first) if t is not None))
        return out

    def overdue(self, now, limit, node=None):
        """(message_id, node, entry_id, recipients) of published rows whose acknowledgement is
        late, the latest deadline last; with `node`, that node's only (by its index)."""
        if node is not None:
            return self.db.execute("SELECT message_id, node, entry_id, recipients FROM outbound WHERE node = ? AND "
                                   "status = 'published' AND ack_deadline <= ? ORDER BY ack_deadline LIMIT ?",
                                   (node, now, limit)).fetchall()
        return self.db.execute("SELECT message_id, node, entry_id, recipients FROM outbound WHERE status = 'published' "
                               "AND ack_deadline <= ? ORDER BY ack_deadline LIMIT ?", (now, limit)).fetchall()

    def waiting_for(self, node, limit, pending=False):
        """(message_id, node, entry_id, recipients) of a node's rows published and not
        acknowledged (with `pending`, those not yet published too)."""
        states = "('pending', 'published')" if pending else "('published')"
        return self.db.execute("SELECT message_id, node, entry_id, recipients FROM outbound WHERE node = ? AND "
                               f"status IN {states} LIMIT ?", (node, limit)).fetchall()

    def settled_entries(self, window, limit):
        """{node: entry ids} of the rows each node settled (acknowledged or refused) within
        `window` seconds before the last it settled, the newest `limit` a node: the entries a
        deletion cut before a stop may have left in this node's streams."""
        out = {}
        for node, eid in self.db.execute(
                "SELECT o.node, o.entry_id FROM outbound o JOIN (SELECT node, max(acked_at) AS last FROM outbound "
                "WHERE status IN ('acknowledged', 'refused') GROUP BY node) l ON o.node = l.node WHERE o.status IN "
                "('acknowledged', 'refused') AND o.entry_id IS NOT NULL AND o.acked_at >= l.last - ? "
                "ORDER BY o.acked_at DESC", (window,)):
            ids = out.setdefault(node, [])
            if len(ids) < limit:
                ids.append(eid)
        return out

    def outbound_states(self, node, mids):
        """{message id: status} of a node's outbound rows among `mids` (looked up by key)."""
        out = {}
        ids = sorted(set(mids))
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            out.update(self.db.execute("SELECT message_id, status FROM outbound WHERE node = ? AND message_id IN "
                                       f"({','.join('?' * len(chunk))})", [node, *chunk]).fetchall())
        return out

    def published_entries(self, node):
        """(message_id, entry_id, envelope bytes) of a node's rows published and not acknowledged."""
        return self.db.execute("SELECT message_id, entry_id, length(envelope) FROM outbound WHERE node = ? AND "
                               "status = 'published'", (node,)).fetchall()

    def waiting_nodes(self):
        """The nodes that have rows waiting (to be published or acknowledged): one seek per node
        ever sent to, never a walk of the rows (a node may leave thousands unacknowledged)."""
        return [r[0] for r in self.db.execute(
            "WITH RECURSIVE n(node) AS (SELECT min(node) FROM outbound UNION ALL SELECT (SELECT min(node) FROM "
            "outbound WHERE node > n.node) FROM n WHERE n.node IS NOT NULL) SELECT node FROM n WHERE node IS NOT NULL "
            "AND EXISTS (SELECT 1 FROM outbound o WHERE o.node = n.node AND o.status IN ('pending', 'published'))")]

    def received_before(self, pairs):
        """{(node, id): (sha256, local id, why it failed or None)} of the (node, id) pairs
        received before (kept past the retention sweep; why it failed while its row is kept).
        Looked up by node, on the key: the table holds 30 days of ids."""
        by_node = {}
        for node, mid in pairs:
            by_node.setdefault(node, []).append(mid)
        out = {}
        for node, ids in by_node.items():
            for chunk, marks in chunks(ids):
                out.update({(node, r[0]): (r[1], r[2], r[3]) for r in self.db.execute(
                    "SELECT r.id, r.sha256, r.local_id, CASE WHEN m.status = 'failed' THEN coalesce(m.error, 'failed') "
                    "END FROM received_ids r LEFT JOIN messages m ON m.id = r.local_id WHERE r.node = ? AND r.id IN "
                    f"({marks})", [node, *chunk])})
        return out

    def outbound_recorded(self, pairs):
        """Of (message id, node) pairs, those with an outbound row (recorded, whatever its status)."""
        ids = sorted({mid for mid, _ in pairs})
        found = set()
        for chunk, marks in chunks(ids):
            found.update((r[0], r[1]) for r in self.db.execute(
                f"SELECT message_id, node FROM outbound WHERE message_id IN ({marks})", chunk))
        return found & set(pairs)

    def received_counts(self):
        """{'delivered': n, 'refused': n} of the messages received from other nodes."""
        rows = dict(self.db.execute("SELECT status, count(*) FROM messages WHERE node IS NOT NULL GROUP BY status"
                                    ).fetchall())
        return {"delivered": rows.get("archived", 0), "refused": rows.get("failed", 0)}

    def agents(self):
        """{name: (node, node's last seen)} of the agents the directory puts on other nodes."""
        return {r[0]: (r[1], r[2]) for r in self.db.execute("SELECT name, node, last_seen FROM remote_agents")}

    def link(self):
        """The link's last recorded state (relay status), or None."""
        return self.db.execute("SELECT * FROM link WHERE id = 1").fetchone()
