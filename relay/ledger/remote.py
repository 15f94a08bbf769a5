"""The ledger's writes for the federation (relay/federation/): outbound rows (queued in a batch's
own transaction, published, acknowledged end to end, published again or rerouted), messages
received from other nodes with the ids that make a replay known, the team's directory and the
state of the link: `ledger.remote`, a part on the Ledger's connection and transactions."""
import orjson

from relay.ledger.chain import chain_hash
from relay.ledger.part import Part

ACK_CAP = 600.0             # seconds: the longest wait for an acknowledgement before publishing again


class FederationRecords(Part):
    """The federation's writes. What else of the ledger they use, each given: `chain` (a message
    received enters the hash chain), `search` (and the index), `bounces` (a sender owed a bounce
    for a message another node refused), `sheds` (what a message shed for everyone keeps) and
    `registry` (the agents seen)."""

    def __init__(self, store, chain, search, bounces, sheds, registry):
        super().__init__(store)
        self.chain, self.search, self.bounces, self.sheds, self.registry = chain, search, bounces, sheds, registry

    def queue(self, now, outcomes, events):
        """Recipients on other nodes (of each OutcomeRecord, outcome.py): one outbound row per
        (message, node), in the batch's own transaction; the link publishes it later. A message
        tried again is queued once."""
        first, again = [], []       # a first attempt has no row yet: inserted in bulk
        for o in outcomes:
            by_node = {}
            for r, node in o.remote:
                by_node.setdefault(node, []).append(r)
            for node, names in sorted(by_node.items()):
                row = (o.id, node, orjson.dumps(sorted(names)).decode(), o.envelope, now)
                (again if o.earlier_attempt else first).append(row)
        sql = ("INSERT INTO outbound (message_id, node, recipients, envelope, status, queued_at) "
               "VALUES (?, ?, ?, ?, 'pending', ?) ON CONFLICT DO NOTHING")
        if first:
            self.db.executemany(sql, first)
        queued = first + [row for row in again if self.db.execute(sql + " RETURNING node", row).fetchone()]
        events.extend((mid, now, "queued", f"for node {node}: {', '.join(orjson.loads(names))}")
                      for mid, node, names, _, _ in queued)

    def published(self, now, done, ack_timeout, quiet=()):
        """Outbound rows now in their node's stream, waiting for its acknowledgement (at the
        latest by now + ack_timeout, doubled with each publish of the same row up to ACK_CAP).
        done: (message_id, node, entry_id); those in `quiet` ((message_id, node): published
        again past the per-node bound of events) leave no event."""
        with self.transaction():
            self.db.executemany(
                "UPDATE outbound SET status = 'published', entry_id = ?, published_at = ?, "
                "ack_deadline = ? + min(?, ? * (1 << min(attempts, 10))), attempts = attempts + 1, error = NULL "
                "WHERE message_id = ? AND node = ? AND status = 'pending'",
                [(eid, now, now, ACK_CAP, ack_timeout, mid, node) for mid, node, eid in done])
            self.events([(mid, now, "published", f"to node {node} as entry {eid}") for mid, node, eid in done
                         if (mid, node) not in quiet])

    def publish_failed(self, now, failed, error):
        """Outbound rows not published (the server unreachable): tried again at their time.
        failed: (message_id, node, attempts so far, next_attempt_at). The first failure is an event."""
        with self.transaction():
            self.db.executemany("UPDATE outbound SET attempts = attempts + 1, error = ?, next_attempt_at = ? "
                                "WHERE message_id = ? AND node = ?",
                                [(error, at, mid, node) for mid, node, _, at in failed])
            self.events([(mid, now, "publish-failed", f"to node {node}: {error}; retrying")
                         for mid, node, attempts, _ in failed if attempts == 0])

    def hold(self, rows, until):
        """Outbound rows not to be published before `until` (their sender's name not announced
        yet, publisher.py): no attempt counted, no event. rows: (message_id, node)."""
        with self.transaction():
            self.db.executemany("UPDATE outbound SET next_attempt_at = ? WHERE message_id = ? AND node = ? AND "
                                "status = 'pending'", [(until, mid, node) for mid, node in rows])

    def publish_now(self, now):
        """The link is back: every outbound row waiting is due now."""
        with self.transaction():
            self.db.execute("UPDATE outbound SET next_attempt_at = ? WHERE status = 'pending' AND next_attempt_at > ?",
                            (now, now))

    def acknowledged(self, now, node, acks, bounce=True, missed=None, entries=None):
        """What `node` acknowledged: acks are (message_id, refusal or None). A row is done: its
        node recorded the durable delivery (`acknowledged`), or refused it with a reason
        (`refused`, the message failed for those recipients). Returns the entry ids the rows had
        (for the sender to delete from its stream); acks for rows not waiting change nothing,
        and are appended to `missed` when given (the caller tells those of rows not recorded
        yet, a batch published from its offer, from those of rows settled before). `entries`:
        {message id: the entry the node says it read}, kept for a row acknowledged before it
        was marked published. With `bounce`, the sender of a message refused is owed a bounce
        (bounces.py)."""
        named, entries = entries or {}, []
        with self.transaction():
            for mid, refusal in acks:
                row = self.db.execute(
                    "UPDATE outbound SET status = ?, acked_at = ?, error = ?, entry_id = coalesce(entry_id, ?) "
                    "WHERE message_id = ? AND node = ? AND status IN ('pending', 'published') RETURNING entry_id",
                    ("refused" if refusal else "acknowledged", now, refusal, named.get(mid), mid, node)).fetchone()
                if row is None:
                    if missed is not None:
                        missed.append((mid, refusal))
                    continue
                if row[0]:
                    entries.append(row[0])
                self.events([(mid, now, "refused-by-node" if refusal else "acknowledged",
                              f"by node {node}" + (f": {refusal}" if refusal else ""))])
                if refusal and bounce:
                    self.bounces.owe_refused(now, mid, node)
        return entries

    def republish(self, now, rows, why, quiet=()):
        """Published rows whose acknowledgement did not come (the server lost them, a failover,
        the deadline): published again now. rows: (message_id, node). Returns the entry ids they
        had, as (node, entry id) (deleted from the stream by the caller, when still there). Rows
        in `quiet` (past the per-node bound of events) leave no event of their own: one summary
        event per node, on the first of them, counts them."""
        entries, hushed = [], {}
        with self.transaction():
            for mid, node in rows:
                row = self.db.execute("UPDATE outbound SET status = 'pending', next_attempt_at = ? WHERE "
                                      "message_id = ? AND node = ? AND status = 'published' RETURNING entry_id",
                                      (now, mid, node)).fetchone()
                if row is None:
                    continue
                entries.append((node, row[0]))
                if (mid, node) in quiet:
                    hushed.setdefault(node, []).append(mid)
                else:
                    self.events([(mid, now, "republished", f"to node {node}: {why}")])
            self.events([(mids[0], now, "republished", f"to node {node} with {len(mids) - 1} others whose events "
                          f"are not kept one by one (over the bound a minute): {why}")
                         for node, mids in hushed.items()])
        return entries

    def reroute(self, now, moves, bounce=True):
        """Rows whose recipients another node holds now (a node renamed, or one that dropped
        them): moves are (message_id, old node, new node, recipients JSON). The row is queued for
        the new node, or merged into one there not yet published; the old one is dropped. A row
        the new node already got for other recipients cannot take them (the node knows the
        message by its id): the old row is refused with that reason, never dropped unsaid.
        Returns the entry ids the moved rows had (for the caller to delete)."""
        entries = []
        with self.transaction():
            for mid, old, new, names in moves:
                row = self.db.execute("SELECT entry_id FROM outbound WHERE message_id = ? AND node = ?",
                                      (mid, old)).fetchone()
                if row is None:
                    continue
                there = self.db.execute("SELECT status, recipients FROM outbound WHERE message_id = ? AND node = ?",
                                        (mid, new)).fetchone()
                listed = ", ".join(orjson.loads(names))
                if there is not None and there[0] != "pending":
                    why = (f"{listed} moved to node {new}, which already has this message for "
                           f"{', '.join(orjson.loads(there[1]))}: not delivered to {listed}; send it again")
                    self.db.execute("UPDATE outbound SET status = 'refused', acked_at = ?, error = ? WHERE "
                                    "message_id = ? AND node = ?", (now, why, mid, old))
                    self.events([(mid, now, "refused-by-node", why)])
                    if bounce:
                        self.bounces.owe_refused(now, mid, old)
                    continue
                if there is not None:
                    merged = sorted(set(orjson.loads(there[1])) | set(orjson.loads(names)))
                    self.db.execute("UPDATE outbound SET recipients = ? WHERE message_id = ? AND node = ?",
                                    (orjson.dumps(merged).decode(), mid, new))
                else:
                    self.db.execute("INSERT INTO outbound (message_id, node, recipients, envelope, status, queued_at) "
                                    "SELECT message_id, ?, ?, envelope, 'pending', ? FROM outbound WHERE "
                                    "message_id = ? AND node = ?", (new, names, now, mid, old))
                self.db.execute("DELETE FROM outbound WHERE message_id = ? AND node = ?", (mid, old))
                entries.append((old, row[0]))
                self.events([(mid, now, "rerouted", f"from node {old} to node {new}: {listed}")])
        return entries

    def received(self, now, items, refused, sheds=(), failed=()):
        """One transaction for a batch read from this node's stream: each message delivered here
        (a row like any other, chained, with its node and entry id), each entry refused, each
        message this node gave up or shed for every recipient, and each recipient this node's
        limits shed. items: dicts (id, sender, name, node, entry_id, recipients, kind, thread,
        subject, body, headers, sha256, sent_at, got {recipient: (size, sha256)}, note); failed:
        such dicts with an `error`, recorded failed with the deliveries they had; refused: (id,
        sender, name, node, entry_id, reason) of entries that are no message for this node;
        sheds: (id, recipient, sender, reason, limit, observed) of messages among the others. A
        failed message shed for every recipient keeps what a local one does (shed_keep.py)."""
        with self.transaction():
            shed = {s[0] for s in sheds}
            kept = self.sheds.kept(now, [(m["id"], m["sender"], m["body"], m["subject"], m["headers"])
                                         for m in failed if m["id"] in shed and not m["delivered"]])
            failed = [dict(m, **dict(zip(("body", "subject", "headers"), kept[m["id"]]))) if m["id"] in kept else m
                      for m in failed]
            events, links = [], []
            seq, prev = self.chain.head()
            rows = [{"remote_id": None, "content_type": None, **m, "recipients": orjson.dumps(m["recipients"]).decode(),
                     "now": now} for m in items]
            self.db.executemany(
                "INSERT INTO messages (id, sender, name, status, recipients, kind, thread, subject, body, headers, "
                "content_type, sha256, sent_at, discovered_at, claimed_at, delivered_at, archived_at, attempts, node, "
                "entry_id, remote_id) "
                "VALUES (:id, :sender, :name, 'archived', :recipients, :kind, :thread, :subject, :body, :headers, "
                ":content_type, :sha256, :sent_at, :now, :now, :now, :now, 1, :node, :entry_id, :remote_id)", rows)
            self.db.executemany(
                "INSERT INTO messages (id, sender, name, status, recipients, kind, thread, subject, body, headers, "
                "content_type, sha256, sent_at, discovered_at, claimed_at, failed_at, error, attempts, node, entry_id, "
                "remote_id) "
                "VALUES (:id, :sender, :name, 'failed', :recipients, :kind, :thread, :subject, :body, :headers, "
                ":content_type, :sha256, :sent_at, :now, :now, :now, :error, 1, :node, :entry_id, :remote_id)",
                [{"remote_id": None, "content_type": None, **m, "recipients": orjson.dumps(m["recipients"]).decode(),
                  "now": now} for m in failed])
            self.db.executemany("INSERT OR IGNORE INTO deliveries (message_id, recipient, delivered_at, size, sha256) "
                                "VALUES (?, ?, ?, ?, ?)",
                                [(m["id"], r, now, *got) for m in (*items, *failed) for r, got in m["delivered"].items()])
            for m in (*items, *failed):
                events.append((m["id"], now, "received", f"from node {m['node']} as entry {m['entry_id']}"
                               + (f"; {m['note']}" if m.get("note") else "")
                               + (f"; its id there, {m['remote_id']}, names another message here"
                                  if m.get("remote_id") else "")))
                events.extend((m["id"], now, "delivered", r) for r in sorted(m["delivered"]))
            events.extend((m["id"], now, "failed", m["error"]) for m in failed)
            for m, row in zip(items, rows, strict=True):
                seq += 1
                prev = chain_hash(prev, {**row, "discovered_at": now, "delivered_at": now, "archived_at": now,
                                         "archive_path": None})
                links.append((seq, m["id"], prev))
            self.db.executemany("INSERT INTO chain (seq, message_id, hash) VALUES (?, ?, ?)", links)
            self.db.executemany("INSERT INTO messages (id, sender, name, status, discovered_at, failed_at, error, "
                                "node, entry_id) VALUES (?, ?, ?, 'failed', ?, ?, ?, ?, ?)",
                                [(mid, sender, name, now, now, reason, node, eid)
                                 for mid, sender, name, node, eid, reason in refused])
            events.extend((mid, now, "refused", f"entry {eid} from node {node}: {reason}")
                          for mid, _, _, node, eid, reason in refused)
            self.db.executemany("INSERT OR IGNORE INTO sheds (message_id, recipient, sender, reason, limit_value, "
                                "observed, at) VALUES (?, ?, ?, ?, ?, ?, ?)", [(*s, now) for s in sheds])
            events.extend((mid, now, "shed", f"{r}: {reason}") for mid, r, _, reason, _, _ in sheds)
            self.events(events)
            self.db.executemany("INSERT OR REPLACE INTO received_ids (node, id, sha256, at, local_id) "
                                "VALUES (?, ?, ?, ?, ?)",
                                [(m["node"], m.get("remote_id") or m["id"], m["sha256"], now, m["id"])
                                 for m in (*items, *failed)])
            self.search.index([(m["id"], m["subject"], m["body"]) for m in (*items, *failed)])
            got = {r for m in (*items, *failed) for r in m["delivered"]}
            if got:
                self.registry.seen(got, now)

    def directory(self, now, node, agents, conflicts):
        """The team's directory as read from the server: agents of other nodes (name, node,
        node's last seen), and the names in conflict (name, other node)."""
        with self.transaction():
            self.db.execute("DELETE FROM remote_agents")
            self.db.executemany("INSERT OR REPLACE INTO remote_agents (name, node, last_seen) VALUES (?, ?, ?)", agents)
            self._row(now, node)
            self.db.execute("UPDATE link SET directory_at = ?, directory_error = NULL, conflicts = ?",
                            (now, orjson.dumps(conflicts).decode()))

    def directory_read(self, now):
        """The team's directory was read whole now (what a name not yet known waits for)."""
        with self.transaction():
            self.db.execute("UPDATE link SET directory_at = ?, directory_error = NULL", (now,))

    def directory_failed(self, now, node, error):
        """The team's directory could not be read (relay status and doctor say why)."""
        with self.transaction():
            self._row(now, node)
            self.db.execute("UPDATE link SET directory_error = ?", (error,))

    def forget_received(self, before):
        """Received ids older than the replay window (entries that old are refused by their id)."""
        with self.transaction():
            return self.db.execute("DELETE FROM received_ids WHERE at < ?", (before,)).rowcount

    def link_state(self, now, node, connected, error=None):
        """Whether the link to the server works now (relay status), and why not."""
        with self.transaction():
            self._link(now, node, connected, error, None)

    def _row(self, now, node):
        """The link's row, made (not connected yet) if there is none."""
        self.db.execute("INSERT INTO link (id, node, connected, since, updated_at) VALUES (1, ?, 0, ?, ?) "
                        "ON CONFLICT (id) DO NOTHING", (node, now, now))

    def _link(self, now, node, connected, error, conflicts):
        self.db.execute("INSERT INTO link (id, node, connected, since, error, conflicts, updated_at) "
                        "VALUES (1, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET node = excluded.node, "
                        "connected = excluded.connected, since = CASE WHEN link.connected = excluded.connected "
                        "THEN link.since ELSE excluded.since END, error = excluded.error, "
                        "conflicts = coalesce(excluded.conflicts, link.conflicts), updated_at = excluded.updated_at",
                        (node, int(connected), now, error, conflicts, now))
