"""The reads of the web view and of /metrics (relay/web/), a part of the History (`history.web`):
a page of messages by keyset (newest first, filtered, with the full-text index), a thread with
its bounces, one message's link of the hash chain, and the figures a scrape reads. Nothing here
writes; every query is bounded by an index or a LIMIT so that a page stays fast on a large
ledger (benchmarks/web_page.py)."""
from relay.ledger.chain import GENESIS, chain_hash
from relay.ledger.part import Part
from relay.ledger.search import match
from relay.ledger.schema import REASONS

PAGE = 50           # messages in a page unless asked for fewer
COMMON = ("archived", "delivered")      # the statuses most messages have
SPARSE = 2000       # messages in a time span read through the time index and sorted (more: walked by id)
# Latency buckets (seconds) of the envelope histogram: rename into the outbox -> envelope written.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class WebReads(Part):
    """See the module's docstring."""

    def messages(self, agent=None, sender=None, recipient=None, status=None, kind=None, thread=None,
                 since=None, until=None, query=None, before=None, limit=PAGE, priority=None):
        """At most `limit` messages matching every filter given, newest first, older than the id
        `before` (the next page's cursor). `agent`: sent or received by it; `query`: the
        full-text index (search.match; RelayError for a query it refuses); `priority`: what the
        message asked for (receipts.py's asks: a message with no row there is `normal`)."""
        where, args = [], []

        def to(name):
            where.append("(EXISTS (SELECT 1 FROM deliveries d WHERE d.message_id = m.id AND d.recipient = ?) "
                         "OR m.recipients LIKE ?)")
            args.extend([name, f'%"{name}"%'])
        if agent:
            where.append("(m.sender = ? OR EXISTS (SELECT 1 FROM deliveries d WHERE d.message_id = m.id AND "
                         "d.recipient = ?) OR m.recipients LIKE ?)")
            args += [agent, agent, f'%"{agent}"%']
        if sender:
            where.append("m.sender = ?"); args.append(sender)
        if recipient:
            to(recipient)
        if status == "shed":
            where.append("EXISTS (SELECT 1 FROM sheds s WHERE s.message_id = m.id)")
        elif status in COMMON:     # walked in the page's id order (the status index would sort them all)
            where.append("+m.status = ?"); args.append(status)
        elif status:                # few (failed, on their way): found by the index, then sorted
            where.append("m.status = ?"); args.append(status)
        if kind:
            where.append("m.kind = ?"); args.append(kind)
        if thread:
            where.append("(m.thread = ? OR m.id = ?)"); args += [thread, thread]
        if priority == "normal":
            where.append("m.id NOT IN (SELECT message_id FROM asks WHERE priority != 'normal')")
        elif priority:
            where.append("m.id IN (SELECT message_id FROM asks WHERE priority = ?)"); args.append(priority)
        span = self._span(since, until)
        if since is not None:
            where.append(f"{span}m.discovered_at >= ?"); args.append(since)
        if until is not None:
            where.append(f"{span}m.discovered_at < ?"); args.append(until)
        if query:
            where.append("m.id IN (SELECT d.message_id FROM search JOIN search_docs d ON d.seq = search.rowid "
                         "WHERE search MATCH ?)")
            args.append(match(query))
        if before:
            where.append("m.id < ?"); args.append(before)
        sql = ("SELECT m.id, m.sender, m.recipients, m.kind, m.thread, m.subject, m.status, m.discovered_at, "
               "m.node, m.duplicate_of, m.error FROM messages m")
        if span == "":
            sql += " INDEXED BY messages_discovered_at"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY m.id DESC LIMIT ?"
        return self.db.execute(sql, [*args, int(limit)]).fetchall()

    def _span(self, since, until):
        """How a page filtered by time reads: "" (by the time index, then sorted) when the span
        holds at most SPARSE messages, so that a span matching few or none is not a walk of every
        message; "+" (the walk in id order, the index unused) when it holds more, found soon."""
        if since is None and until is None:
            return "+"
        n = self.db.execute("SELECT count(*) FROM (SELECT 1 FROM messages WHERE discovered_at >= ? AND "
                            "discovered_at < ? LIMIT ?)", (-1e18 if since is None else since,
                                                           1e18 if until is None else until, SPARSE + 1)).fetchone()[0]
        return "" if n <= SPARSE else "+"

    def bounces_of(self, ids):
        """{message id: [bounce rows]} of the bounces owed for these messages."""
        out = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            marks = ",".join("?" * len(chunk))
            for r in self.db.execute(f"SELECT * FROM bounces WHERE message_id IN ({marks}) ORDER BY at", chunk):
                out.setdefault(r["message_id"], []).append(r)
        return out

    def acks_of(self, ids):
        """{message id: [{recipient, acked_at, note, reply_id}]} of the acknowledgements given
        for these messages, oldest first."""
        out = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            marks = ",".join("?" * len(chunk))
            for r in self.db.execute("SELECT message_id, recipient, acked_at, note, reply_id FROM receipts WHERE "
                                     f"message_id IN ({marks}) AND acked_at IS NOT NULL ORDER BY acked_at", chunk):
                out.setdefault(r["message_id"], []).append(dict(r))
        return out

    def recent_bounces(self, limit=50):
        """The newest bounces, with the failed message's subject."""
        return self.db.execute("SELECT b.*, m.subject, m.sender AS original_sender FROM bounces b JOIN messages m "
                               "ON m.id = b.message_id ORDER BY b.at DESC LIMIT ?", (limit,)).fetchall()

    def recent_failures(self, limit=50):
        """The newest failed messages (subject, error), newest first."""
        return self.db.execute("SELECT id, sender, name, subject, error, failed_at FROM messages INDEXED BY "
                               "messages_failed_at WHERE status = 'failed' ORDER BY failed_at DESC LIMIT ?",
                               (limit,)).fetchall()

    def per_hour(self, since):
        """[(hour number since the epoch, messages discovered in it)] from `since` on."""
        return self.db.execute("SELECT CAST(discovered_at / 3600 AS INTEGER) AS h, count(*) AS n FROM messages "
                               "WHERE discovered_at >= ? GROUP BY h ORDER BY h", (since,)).fetchall()

    def chained(self, mid):
        """One message's place in the hash chain: (None, why) when it has none; else (intact,
        why): its record hashes to its link, over the link before it (or the checkpoint's head,
        or the start), with no link missing between them."""
        link = self.db.execute("SELECT seq, hash FROM chain WHERE message_id = ?", (mid,)).fetchone()
        if link is None:
            return None, "not in the hash chain (a message is chained once archived)"
        prev = self.db.execute("SELECT seq, hash FROM chain WHERE seq < ? ORDER BY seq DESC LIMIT 1",
                               (link["seq"],)).fetchone()
        cp = self.db.execute("SELECT upto, head FROM checkpoints ORDER BY seq DESC LIMIT 1").fetchone()
        if prev is not None:
            before_seq, before = prev["seq"], prev["hash"]
        elif cp is not None:
            before_seq, before = cp["upto"], cp["head"]
        else:
            before_seq, before = 0, GENESIS
        if before_seq != link["seq"] - 1:
            return False, f"chain records {before_seq + 1}..{link['seq'] - 1} before it are missing"
        row = self.db.execute("SELECT * FROM messages WHERE id = ?", (mid,)).fetchone()
        try:
            intact = row["status"] == "archived" and chain_hash(before, row) == link["hash"]
        except TypeError:
            intact = False
        return intact, (f"link {link['seq']} of the hash chain holds" if intact else
                        f"link {link['seq']} of the hash chain does not match the record: it was altered")

    # -- the figures of /metrics -----------------------------------------------------------------

    def delivery_count(self):
        return self.db.execute("SELECT count(*) FROM deliveries").fetchone()[0]

    def bounce_count(self):
        return self.db.execute("SELECT count(*) FROM bounces").fetchone()[0]

    def shed_reasons(self):
        """{reason: sheds recorded} for every reason flow control knows (0 when none)."""
        out = dict.fromkeys(REASONS, 0)
        for r in self.db.execute("SELECT reason, count(*) FROM sheds GROUP BY reason"):
            if r[0] in out:
                out[r[0]] = r[1]
        return out

    def failed_errors(self):
        """[(error text, failed messages)] of the failed messages."""
        return self.db.execute("SELECT coalesce(error, ''), count(*) FROM messages INDEXED BY messages_failed_at "
                               "WHERE status = 'failed' GROUP BY 1").fetchall()

    def latency(self, buckets=LATENCY_BUCKETS):
        """(cumulative counts per bucket bound, count, sum) of the seconds from a message's
        sending (its rename into the outbox, else its discovery) to each envelope written."""
        lat = "(d.delivered_at - coalesce(m.sent_at, m.discovered_at))"
        cols = ", ".join(f"sum({lat} <= {float(b)!r})" for b in buckets)
        row = self.db.execute(f"SELECT {cols}, count(*), coalesce(sum(max({lat}, 0)), 0) FROM deliveries d "
                              "JOIN messages m ON m.id = d.message_id").fetchone()
        n = len(buckets)
        return [int(v or 0) for v in row[:n]], row[n], float(row[n + 1])
