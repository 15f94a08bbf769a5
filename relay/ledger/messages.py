"""The pipeline's writes (`ledger.messages`): discovery and claims, each batch's outcomes in one
transaction (with their deliveries, sheds, search index, bounces owed, queued rows for other nodes
and the agent registry's changes), the archive moves retried, a file refused before any claim, the
rows a build cannot read, and crash recovery.

Every write here is one `BEGIN IMMEDIATE` transaction of the Ledger's; one covers a whole batch,
and writes each table's rows of the batch in one statement (one UPDATE per outcome), not one per
message (sql.py: insert_rows, with_rows)."""
import orjson

from relay.ledger.chain import link_hash
from relay.ledger.part import Part
from relay.ledger.sql import chunks, insert_rows, with_rows

# What a message said, as its row keeps it (Messages._said gives them in this order); a record
# that read nothing of it (None) keeps what the row holds (KEEP_SAID).
SAID_COLUMNS = ("kind", "thread", "subject", "body", "headers", "recipients", "content_type", "max_retries")
SAID = ", ".join(SAID_COLUMNS)
KEEP_SAID = ", ".join(f"{c} = coalesce(v.{c}, messages.{c})" for c in SAID_COLUMNS) + \
    ", size = coalesce(v.size, messages.size), sha256 = coalesce(v.sha256, messages.sha256)"


class Messages(Part):
    """The messages' lifecycle. What else of the ledger a batch's record writes, each given:
    `chain` (the hash chain), `search` (the index), `bounces` (what a sender is owed), `sheds`
    (what a message shed for everyone keeps), `remote` (rows queued for other nodes), `registry`
    (the agents seen, spawned and released) and `receipts` (what a message asks of its
    recipients)."""

    def __init__(self, store, chain, search, bounces, sheds, remote, registry, receipts):
        super().__init__(store)
        self.chain, self.search, self.bounces, self.sheds = chain, search, bounces, sheds
        self.remote, self.registry, self.receipts = remote, registry, receipts

    def register_and_claim(self, found, now, limit, plan, synced=True):
        """One transaction: insert newly found files as pending, claim up to `limit` due rows.

        `found` is a list of (id, sender, name, sent_at). A file already registered at the same
        outbox path (not yet in relay's custody) is skipped. Returns (registered ids, claimed
        rows). The commit is durable before the caller moves any file the claim refers to: at
        once, or with `synced` False (see transaction) by the caller's sync of the log.
        """
        db = self.db
        registered = []
        with self.transaction(synced):
            if found:
                added = insert_rows(
                    db, "INSERT INTO messages (id, sender, name, status, sent_at, discovered_at, next_attempt_at)",
                    [(mid, sender, name, sent_at, now) for mid, sender, name, sent_at in found],
                    "ON CONFLICT DO NOTHING", row="(?, ?, ?, 'pending', ?, ?, 0)")
                if added == len(found):
                    registered = [(mid, sender, name) for mid, sender, name, _ in found]
                else:   # some were registered already: find which rows are ours
                    ours = set()
                    ids = [f[0] for f in found]
                    for chunk, marks in chunks(ids):
                        ours.update(r[0] for r in db.execute(
                            f"SELECT id FROM messages WHERE id IN ({marks})", chunk))
                    registered = [(mid, sender, name) for mid, sender, name, _ in found if mid in ours]
            events = [(mid, now, "discovered", f"outbox/{s}/{n}") for mid, s, n in registered]
            if registered:
                self.registry.seen({s for _, s, _ in registered}, now)
            claimed = self._claim(now, limit, plan, events) if limit else []
            if events:
                self.events(events)        # one statement for the discoveries and the claims
        return registered, claimed

    def refuse_found(self, mid, sender, name, now, reason, failed_path, bounce=False):
        """A file refused before any claim (its name is unfit): recorded straight as failed
        (with `bounce`, its sender owed a bounce)."""
        with self.transaction():
            self.db.execute("INSERT INTO messages (id, sender, name, status, discovered_at, failed_at, error, "
                            "failed_path) VALUES (?, ?, ?, 'failed', ?, ?, ?, ?)",
                            (mid, sender, name, now, now, reason, failed_path))
            self.events([(mid, now, "discovered", f"outbox/{sender}/{name}"), (mid, now, "failed", reason)])
            return self.bounces.owe(now, [(mid, sender, [], reason)]) if bounce else 0

    def _claim(self, now, limit, plan, events):
        """Claim due rows; `plan(sender, id, name)` gives each its archive path, recorded with
        the claim so that recovery finds a file moved there before the batch was recorded.
        Their events are appended to `events`, for the caller to insert."""
        # Read, then one UPDATE that claims the rows and records each one's archive path together
        # (BEGIN IMMEDIATE holds the write lock: nothing changes the rows in between).
        columns = ("id, sender, name, spooled, retries, attempts + 1 AS attempts, discovered_at, failing_since, "
                   "spool_id, interrupted")
        due = ("FROM messages WHERE status = 'pending' AND next_attempt_at <= :now "
               "ORDER BY next_attempt_at, id LIMIT :limit")
        rows = self.db.execute(f"SELECT {columns}, interrupted > 0 {due}", {"now": now, "limit": limit}).fetchall()
        # A message that was being handled when relay stopped is claimed alone: if it is what
        # stops relay, the next interruption (and the claim budget) is its own, not its batch's.
        alone = next((r for r in rows if r[-1]), None)
        if alone is not None:
            rows = [alone]
        claimed = []
        keys = rows[0].keys()[:-1] if rows else ()     # one query: every row has the same columns
        for r in sorted(rows, key=lambda r: r["id"]):
            row = dict(zip(keys, r[:-1], strict=True))
            try:
                row["archive_path"] = plan(row["sender"], row["id"], row["name"])
            except (TypeError, ValueError, AttributeError):
                row["archive_path"] = None      # an unreadable row: reported by the caller
            claimed.append(row)
        with_rows(self.db, "id, archive_path", [(r["id"], r["archive_path"]) for r in claimed],
                  "UPDATE messages SET status = 'processing', claimed_at = ?, attempts = attempts + 1, "
                  "archive_path = v.archive_path FROM v WHERE messages.id = v.id", (now,))
        events.extend((r["id"], now, "claimed", None) for r in claimed)
        return claimed

    def record(self, now, outcomes, delivered=None, settled=None, bounces=(), registry=()):
        """One transaction recording what a batch did: each message's OutcomeRecord (outcome.py)
        by its status, and every recipient's delivery that became durable in it, each at the
        instant it happened: `delivered` (links into new/ made), `settled` (moves synced,
        retries decided), else `now`; the `bounces` owed (core/bounces.owed) and the agent
        registry's changes (core/registry.py), at `settled`. Returns how many bounces were recorded."""
        events = []
        delivered, settled = delivered or now, settled or now
        with self.transaction():
            kept = self.sheds.kept(now, [(o.id, o.sender, o.message.body, o.message.subject,
                                          orjson.dumps(o.message.headers).decode()) for o in outcomes if o.shed_whole])
            self.receipts.asked([(o.id, o.message.priority, o.message.ack_required) for o in outcomes
                                 if o.delivered and o.message is not None and o.message.priority])
            deliveries = [(o.id, r, delivered, size, sha) for o in outcomes for r, size, sha in o.delivered]
            if deliveries:
                insert_rows(self.db, "INSERT OR IGNORE INTO deliveries (message_id, recipient, delivered_at, size, "
                                     "sha256)", deliveries)
                events.extend((mid, delivered, "delivered", r) for mid, r, *_ in deliveries)
                self.registry.seen({d[1] for d in deliveries}, delivered)
            sheds = [(o.id, s.recipient, o.sender, s.reason, s.limit, s.observed, now) for o in outcomes for s in o.sheds]
            if sheds:
                # One record per (message, recipient); one released by `relay retry` and shed again is renewed.
                insert_rows(self.db, "INSERT INTO sheds (message_id, recipient, sender, reason, limit_value, observed, "
                                     "at)", sheds, "ON CONFLICT DO UPDATE SET reason = excluded.reason, "
                                     "limit_value = excluded.limit_value, observed = excluded.observed, at = excluded.at, "
                                     "released_at = NULL WHERE released_at IS NOT NULL")
                events.extend((o.id, now, "shed", f"{s.recipient}: {s}") for o in outcomes for s in o.sheds)
            by_status = {}
            for o in outcomes:
                by_status.setdefault(o.status, []).append(o)
            at = (delivered, settled)
            for status, group in by_status.items():
                if status == "failed":
                    self._record_failed(at, group, events, kept)
                else:
                    self.RECORD[status](self, at, group, events)
            self.remote.queue(now, [o for o in outcomes if o.queued], events)
            self.registry.apply(settled, registry, events)
            self.events(events)
            self.search.index([(o.id, *(kept[o.id][1::-1] if o.id in kept else (o.message.subject, o.message.body)))
                               for o in outcomes if o.message is not None and not o.duplicate])
            return self.bounces.owe(settled, bounces) if bounces else 0

    @staticmethod
    def _said(o):
        """The message's columns of a record (SAID, in order): what it said, and whom it was for."""
        m = o.message
        if m is None:
            return (None,) * len(SAID_COLUMNS)
        # a message refused before its recipients were resolved (one unknown): those it named, as written
        to = o.recipients or list(dict.fromkeys(m.to))
        return (m.kind, m.thread, m.subject, m.body, orjson.dumps(m.headers).decode(), orjson.dumps(to).decode(),
                m.content_type, m.max_retries)

    def _record_archived(self, at, outcomes, events):
        """The common case, in bulk: delivered to everyone and archived; chained for verify.
        `at`: (delivered, settled) instants of the batch, as for the other outcomes."""
        delivered, archived = at
        rows = []
        seq, prev = self.chain.head()     # read in this transaction: another connection (the federation's
        links = []                  # receiver) may have chained records since
        for o in outcomes:
            m, mid, rel = o.message, o.id, o.archive_rel
            sent = None if o.duplicate else delivered       # a duplicate is delivered to no one
            if m is None:
                recipients = kind = thread = subject = body = headers = content_type = budget = None
            else:       # as _said(o), with the recipients resolved
                recipients, kind, thread, subject, body = (orjson.dumps(list(o.recipients)).decode(), m.kind,
                                                           m.thread, m.subject, m.body)
                headers = orjson.dumps(m.headers).decode()
                content_type, budget = m.content_type, m.max_retries
            rows.append((recipients, kind, thread, subject, body, headers, content_type, budget, o.size, o.sha256,
                         o.sent_at, sent, archived, rel, mid))
            events.append((mid, archived, "archived", rel, "relay"))
            seq += 1
            prev = link_hash(prev, mid, o.sender, recipients, o.discovered_at, sent, archived, o.sha256, rel)
            links.append((seq, mid, prev))
        with_rows(self.db, "recipients, kind, thread, subject, body, headers, content_type, max_retries, size, sha256, "
                           "sent_at, delivered_at, archived_at, archive_path, id", rows,
                  "UPDATE messages SET status = 'archived', recipients = v.recipients, kind = v.kind, thread = v.thread, "
                  "subject = v.subject, body = v.body, headers = v.headers, content_type = v.content_type, "
                  "max_retries = v.max_retries, size = v.size, sha256 = v.sha256, sent_at = v.sent_at, "
                  "delivered_at = v.delivered_at, archived_at = v.archived_at, spooled = 0, error = NULL, "
                  "archive_path = v.archive_path, next_attempt_at = 0, failing_since = NULL "
                  "FROM v WHERE messages.id = v.id")
        insert_rows(self.db, "INSERT INTO chain (seq, message_id, hash)", links)

    def _record_delivered(self, at, outcomes, events):
        """Delivered to everyone, but the archive move failed: retried when history.delivered_due()
        returns it."""
        delivered, settled = at
        with_rows(self.db, f"id, {SAID}, size, sha256, sent_at, delivered_at, error, archive_path, next_attempt_at",
                  [(o.id, *self._said(o), o.size, o.sha256, o.sent_at, None if o.duplicate else delivered, o.error,
                    o.archive_rel, o.next_attempt_at) for o in outcomes],
                  "UPDATE messages SET status = 'delivered', recipients = v.recipients, kind = v.kind, "
                  "thread = v.thread, subject = v.subject, body = v.body, headers = v.headers, size = v.size, "
                  "content_type = v.content_type, max_retries = v.max_retries, sha256 = v.sha256, "
                  "sent_at = v.sent_at, delivered_at = v.delivered_at, spooled = 1, error = v.error, "
                  "archive_path = v.archive_path, next_attempt_at = v.next_attempt_at, failing_since = NULL "
                  "FROM v WHERE messages.id = v.id")
        events.extend((o.id, settled, "archive-failed", o.error) for o in outcomes)

    def _record_retry(self, at, outcomes, events):
        """Back to pending after a transient failure (of the message, or of some recipients)."""
        settled = at[1]
        with_rows(self.db, f"id, {SAID}, size, sha256, sent_at, retries, error, next_attempt_at, spooled",
                  [(o.id, *self._said(o), o.size or None, o.sha256, o.sent_at, o.retries + 1, o.error,
                    o.next_attempt_at, int(o.spooled)) for o in outcomes],
                  "UPDATE messages SET status = 'pending', retries = v.retries, error = v.error, "
                  "next_attempt_at = v.next_attempt_at, spooled = v.spooled, archive_path = NULL, "
                  f"failing_since = coalesce(messages.failing_since, ?), {KEEP_SAID}, "
                  "sent_at = coalesce(v.sent_at, messages.sent_at) FROM v WHERE messages.id = v.id", (settled,))
        events.extend((o.id, settled, "retried", o.error) for o in outcomes)

    def _record_defer(self, at, outcomes, events):
        settled = at[1]
        with_rows(self.db, "id, next_attempt_at, spooled", [(o.id, o.next_attempt_at, int(o.spooled)) for o in outcomes],
                  "UPDATE messages SET status = 'pending', next_attempt_at = v.next_attempt_at, spooled = v.spooled, "
                  "archive_path = NULL FROM v WHERE messages.id = v.id")
        events.extend((o.id, settled, "deferred", o.error) for o in outcomes)

    RECORD = {"archived": _record_archived, "delivered": _record_delivered, "retry": _record_retry,
              "defer": _record_defer}

    def _record_failed(self, at, outcomes, events, kept):
        settled = at[1]
        rows = []
        for o in outcomes:
            said = self._said(o)
            if o.id in kept:        # shed for every recipient: what audit needs (shed_keep.py)
                said = (*said[:2], kept[o.id][1], kept[o.id][0], kept[o.id][2], *said[5:])
            rows.append((o.id, *said, o.size or None, o.sha256, o.sent_at,
                         o.retries + (1 if o.error is not None else 0), o.refused, o.failed_rel))
        with_rows(self.db, f"id, {SAID}, size, sha256, sent_at, retries, error, failed_path", rows,
                  "UPDATE messages SET status = 'failed', failed_at = ?, error = v.error, failed_path = v.failed_path, "
                  f"spooled = 0, archive_path = NULL, {KEEP_SAID}, sent_at = coalesce(v.sent_at, messages.sent_at), "
                  "retries = v.retries FROM v WHERE messages.id = v.id", (settled,))
        events.extend((o.id, settled, "failed", o.refused) for o in outcomes)

    def fail_unreadable(self, now, problems):
        """Claimed rows this build cannot read: failed with the reason. problems: (id, reason)."""
        with self.transaction():
            self.db.executemany("UPDATE messages SET status = 'failed', failed_at = ?, error = ?, spooled = 0 "
                                "WHERE id = ?", [(now, reason, mid) for mid, reason in problems])
            self.events([(mid, now, "failed", reason) for mid, reason in problems])

    def archived_late(self, now, done, retry):
        """Archive moves retried after delivery. done: (id, archive_path); retry: (id, error,
        next_attempt_at, retries)."""
        with self.transaction():
            with_rows(self.db, "id, archive_path", done,
                      "UPDATE messages SET status = 'archived', archived_at = ?, spooled = 0, error = NULL, "
                      "archive_path = v.archive_path FROM v WHERE messages.id = v.id", (now,))
            self.events([(mid, now, "archived", rel) for mid, rel in done])
            if done:
                self.chain.extend([mid for mid, _ in done])
            with_rows(self.db, "id, error, next_attempt_at, retries", retry,
                      "UPDATE messages SET error = v.error, next_attempt_at = v.next_attempt_at, retries = v.retries "
                      "FROM v WHERE messages.id = v.id")

    # -- recovery ---------------------------------------------------------------------------

    def reset(self, rows, now, stopped=(), interrupted=True, bounces=()):
        """Crash recovery, one transaction. rows: (id, spooled) of processing rows back to pending;
        each was being handled when relay stopped, which counts as an attempt (`retries`) and,
        with `interrupted` (relay stopped, not a step of it failed), an interruption. stopped:
        (id, reason, failed_path) of processing rows whose interruptions used up the claim
        budget: failed (quarantined) instead, with the `bounces` their senders are owed."""
        with self.transaction():
            self.db.executemany("UPDATE messages SET status = 'pending', spooled = ?, archive_path = NULL, "
                                "next_attempt_at = 0, retries = retries + 1, interrupted = interrupted + ? "
                                "WHERE id = ? AND status = 'processing'",
                                [(int(s), int(interrupted), mid) for mid, s in rows])
            self.events([(mid, now, "recovered", "left processing by a stopped relay; back to pending")
                         for mid, _ in rows])
            self.db.executemany("UPDATE messages SET status = 'failed', failed_at = ?, error = ?, failed_path = ?, "
                                "spooled = 0, archive_path = NULL, retries = retries + 1, "
                                "interrupted = interrupted + 1 WHERE id = ? AND status = 'processing'",
                                [(now, reason, rel, mid) for mid, reason, rel in stopped])
            self.events([(mid, now, "failed", reason) for mid, reason, _ in stopped])
            return self.bounces.owe(now, bounces) if bounces else 0

    def readopt(self, found, now):
        """Spooled files with no ledger record (id, sender, name): registered again as pending,
        keeping their id so a recipient that already holds one is recognised."""
        if not found:
            return
        with self.transaction():
            self.db.executemany(
                "INSERT OR IGNORE INTO messages (id, sender, name, status, spooled, discovered_at, attempts) "
                "VALUES (?, ?, ?, 'pending', 1, ?, 1)", [(mid, s, n, now) for mid, s, n in found])
            self.events([(mid, now, "recovered", "found in the spool with no ledger record; registered again")
                         for mid, _, _ in found])
