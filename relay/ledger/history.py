"""What the ledger says: every read-only query, for the relay's loop (what is due, what a
recovery must look at) and for people (audit, show, tail, status, agents, the report's figures,
the hash chain walked by verify, doctor's integrity checks, the flow control's sheds and the
queues' figures, operator commands, pings and archived agents). Nothing here writes; the writes
are the Ledger's (ledger.py). Its parts, each a Part (part.py) on the same connection:

    history.remote        the federation's rows, the ids received, the directory, the link (remote_history.py)
    history.checks        verify's and doctor's: the chain, envelopes, paths, migrations, settings (checks.py)
    history.reservations  the leases held and the notices due (reservations.py)
    history.bounces       the bounces due (bounces.py)
    history.search        the full-text search (search.py)
    history.registry      the agent registry's rows (registry.py)
    history.state         the team state's keys (state.py)
    history.lookups       an outbox path's messages, the operator commands (lookups.py)
    history.imports       what was imported from another system (imports.py)
    history.receipts      receipts, acknowledgements, priority (receipts.py)
    history.web           the web view's and /metrics' reads (web.py)

A History reads through a Ledger's connection: the relay's own (so the loop reads what its
writes left), or one a read-only verb opened beside a running daemon.

A stored row this build cannot read (an unknown status, a time that is no number, a malformed
id or name, a path outside its place in the state directory) is never fatal: the helpers of
rows.py, offered here for every reader (`unreadable`, `BadRow`, `sift`), name it with its id
and column and pass on the others; `bad_rows()` walks the whole ledger that way (doctor, verify,
report), and the loop's questions leave out a time that is no number.
"""
import collections

import orjson

from relay.errors import NotFound, RelayError
from relay.times import END, FIRST
from relay.ledger.schema import REASONS
from relay.files.layout import valid_id
from relay.ledger.bounces import BounceHistory
from relay.ledger.checks import Checks
from relay.ledger.registry import RegistryReads
from relay.ledger.imports import ImportReads
from relay.ledger.remote_history import RemoteHistory
from relay.ledger.reservations import ReservationReads
from relay.ledger.lookups import Lookups
from relay.ledger.parties import hidden, party
from relay.ledger.receipts import Receipts
from relay.ledger.search import SearchReads
from relay.ledger.state import StateReads
from relay.ledger.ledger import STATUSES
from relay.ledger.rows import BadRow, sift, unreadable, unreadable_rows  # noqa: F401  (offered to every reader)
from relay.ledger.sql import SQLITE_MAX_VARS, chunks
from relay.ledger.web import WebReads

NUMBER = "typeof({0}) IN ('integer', 'real')"
# a column that holds a time: a number of seconds within the years 1 to 9999 (relay/times.py)
NUMERIC = "(" + NUMBER + f" AND {{0}} >= {FIRST} AND {{0}} < {END})"
_ID = "(typeof({0}) != 'text' OR length({0}) != 26 OR {0} GLOB '*[^0-9A-HJKMNP-TV-Z]*')"
_AGENT = ("(typeof({0}) != 'text' OR length({0}) > 64 OR {0} NOT GLOB '[A-Za-z0-9]*' "
          "OR {0} GLOB '*[^A-Za-z0-9._-]*')")
_NOT_NUMBER = f"NOT {NUMERIC}"
_MAYBE_NOT_NUMBER = "({0} IS NOT NULL AND NOT " + NUMBER + ")"
_MAYBE_NOT_TIME = "({0} IS NOT NULL AND NOT " + NUMERIC + ")"
SUSPECT = {     # rows.CHECKS for the largest tables, as SQL: true for every row they refuse
    "events": " OR ".join([
        "typeof(seq) != 'integer' OR seq < 0", f"(message_id IS NOT NULL AND {_ID.format('message_id')})",
        f"NOT {NUMERIC.format('at')}", "typeof(event) != 'text'", "(detail IS NOT NULL AND typeof(detail) != 'text')",
        "typeof(actor) != 'text'"]),
    "deliveries": " OR ".join([
        _ID.format("message_id"), _AGENT.format("recipient"), f"NOT {NUMERIC.format('delivered_at')}",
        "(size IS NOT NULL AND (typeof(size) != 'integer' OR size < 0))",
        "(sha256 IS NOT NULL AND (typeof(sha256) != 'text' OR length(sha256) != 64 OR sha256 GLOB '*[^0-9a-f]*'))"]),
    "sheds": " OR ".join([
        _ID.format("message_id"), f"(recipient IS NOT '*' AND {_AGENT.format('recipient')})", _AGENT.format("sender"),
        "typeof(reason) != 'text' OR reason NOT IN (" + ", ".join(f"'{r}'" for r in REASONS) + ")",
        _NOT_NUMBER.format("at"), _MAYBE_NOT_NUMBER.format("limit_value"), _MAYBE_NOT_NUMBER.format("observed"),
        _MAYBE_NOT_TIME.format("released_at")]),
}
NEW_TABLES = ("sheds", "pings", "archived_agents", "commands", "attestations", "checkpoints",   # flow control, the operator's
              "agent_registry", "team_state")


# A message with an outbound row still waiting to be published (a row `m` of messages).
UNPUBLISHED = "EXISTS (SELECT 1 FROM outbound o WHERE o.message_id = m.id AND o.status IN ('pending', 'published'))"


class History:
    """The reads of one Ledger's connection, and its parts (see the module's docstring)."""

    def __init__(self, ledger):
        self.ledger = ledger
        self.db = ledger.db
        self.remote = RemoteHistory(self)
        self.checks = Checks(self, ledger=ledger)
        self.reservations = ReservationReads(self)
        self.bounces = BounceHistory(self)
        self.search = SearchReads(self)
        self.registry = RegistryReads(self)
        self.state = StateReads(self)
        self.lookups = Lookups(self)
        self.imports = ImportReads(self)
        self.receipts = Receipts(self)      # receipts, acknowledgements, priority (receipts.py): reads
        self.web = WebReads(self)       # the web view's and /metrics' reads (web.py)

    def close(self):
        self.ledger.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- one message ------------------------------------------------------------------------

    def get(self, mid):
        return self.db.execute("SELECT * FROM messages WHERE id = ?", (mid,)).fetchone()

    def find(self, mid, visible_to=None):
        """A message by id or unique id prefix (any case); NotFound or RelayError otherwise. An
        id `relay send` gave a sender names that sender's message only: never another's, even
        one whose file was named after it; what cannot be told apart is refused. With
        `visible_to`, only the messages that agent sent or received (parties.py) are looked at."""
        prefix = mid.upper()
        owner = self.id_owner(prefix) if valid_id(prefix) else None
        seen, seen_args = party(visible_to)
        rows = self.db.execute(f"SELECT * FROM messages m WHERE id >= ? AND id < ? AND {seen} ORDER BY id LIMIT 2",
                               (prefix, prefix + "\x7f", *seen_args)).fetchall()
        if len(rows) == 1 or (rows and rows[0]["id"] == prefix):
            if owner is not None and rows[0]["id"] == prefix and rows[0]["sender"] != owner:
                raise RelayError(f"the id {prefix} was given to {owner} by relay send, but the message recorded "
                                 f"under it is from {rows[0]['sender']}; relay will not say which is meant")
            return rows[0]
        if rows:
            raise RelayError(f"{mid!r} matches more than one message; give more of the id")
        if valid_id(prefix):
            # The id `relay send` printed is in the file, read when relay parses it: a message
            # failed or held back before that (too large, unreadable, not yet read) is still
            # under the id relay gave it when found, but its file name carries the printed one
            # (in its sender's outbox: any agent may name a file so).
            sql = f"SELECT * FROM messages m WHERE name = ? AND {seen}" + (" AND sender = ?" if owner else "")
            rows = self.db.execute(sql + " ORDER BY discovered_at, id LIMIT 2",
                                   (f"msg-{prefix.lower()}", *seen_args, *([owner] if owner else []))).fetchall()
            if len(rows) == 1:
                return rows[0]
            if rows and rows[0]["sender"] != rows[1]["sender"]:
                raise RelayError(f"no message has the id {prefix}, and files of more than one agent are named "
                                 f"msg-{prefix.lower()}; relay will not say which is meant")
        raise NotFound(hidden(mid, visible_to) if visible_to else f"no message with id {mid!r} in the ledger")

    def declared_agents(self):
        """The names of the agents declared as senders (senders.py)."""
        return {r[0] for r in self.db.execute("SELECT name FROM declared_agents") if isinstance(r[0], str)}

    def id_owner(self, mid):
        """The agent `relay send` gave the id `mid` to, or None (an id relay gave at discovery,
        one chosen by hand, one given before the retention sweep forgot it)."""
        row = self.db.execute("SELECT sender FROM sent_ids WHERE id = ?", (mid,)).fetchone()
        return row[0] if row is not None and isinstance(row[0], str) else None

    def by_request(self, sender, request_id):
        """The id of the sender's message with this request id that did not fail (one relay
        read, or one `relay send` gave whose file still waits), or None."""
        return self.ledger.senders.first_request(sender, request_id)

    def events(self, mid):
        return self.db.execute("SELECT * FROM events WHERE message_id = ? ORDER BY at, seq", (mid,)).fetchall()

    def deliveries(self, mid):
        return self.db.execute("SELECT * FROM deliveries WHERE message_id = ? ORDER BY recipient",
                               (mid,)).fetchall()

    # -- the loop's questions ---------------------------------------------------------------

    def delivered_to(self, ids):
        """{id: {recipient: (size, sha256)}} of the deliveries recorded for these messages."""
        out = {}
        for chunk, marks in chunks(ids):
            for r in self.db.execute("SELECT message_id, recipient, size, sha256 FROM deliveries WHERE message_id "
                                     f"IN ({marks})", chunk):
                out.setdefault(r[0], {})[r[1]] = (r[2], r[3])
        return out

    def processing(self):
        return self.db.execute("SELECT * FROM messages WHERE status = 'processing' ORDER BY id").fetchall()

    def senders_of(self, ids):
        """{id: sender} of the messages among `ids` the ledger has (flow control's shares)."""
        out = {}
        for chunk, marks in chunks(ids):
            out.update((r[0], r[1]) for r in self.db.execute(
                f"SELECT id, sender FROM messages WHERE id IN ({marks})", chunk))
        return out

    def unknown(self, ids):
        """The ids among `ids` that no row holds, as its id or as the id its spool file is
        named by."""
        known = set()
        for chunk, marks in chunks(ids, SQLITE_MAX_VARS // 2):        # each id is bound twice
            known.update(r[0] for r in self.db.execute(
                f"SELECT id FROM messages WHERE id IN ({marks}) UNION "
                f"SELECT spool_id FROM messages WHERE spool_id IN ({marks})", chunk + chunk))
        return set(ids) - known

    def latest_archived_at(self):
        return self.db.execute("SELECT max(archived_at) FROM messages WHERE status = 'archived' AND "
                               + NUMERIC.format("archived_at")).fetchone()[0]

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
        return self.db.execute("SELECT min(next_attempt_at) FROM messages WHERE status = 'delivered' AND "
                               + NUMERIC.format("next_attempt_at")).fetchone()[0]

    def next_due(self):
        """When the next pending message is due (a row whose time is no number never is)."""
        row = self.db.execute("SELECT min(next_attempt_at) FROM messages WHERE status = 'pending' AND "
                              + NUMERIC.format("next_attempt_at")).fetchone()
        return row[0]

    # -- retention --------------------------------------------------------------------------

    def sweepable(self, cutoff, limit):
        """(archived rows in chain order, failed rows) older than `cutoff`, at most `limit` of each.

        Archived rows are taken as a prefix of the hash chain, so a checkpoint can stand for them.
        """
        archived = []
        for row in self.db.execute(f"SELECT c.seq, c.hash, m.id, m.archived_at, m.archive_path, {UNPUBLISHED} AS unpublished "
                                   "FROM chain c JOIN messages m ON m.id = c.message_id ORDER BY c.seq LIMIT ?",
                                   (limit,)):
            # A time that is no number stops the prefix too: a row this build cannot read is
            # never deleted (doctor names it); so does a message still waiting to be published.
            if not isinstance(row["archived_at"], (int, float)) or row["archived_at"] >= cutoff or row["unpublished"]:
                break
            archived.append(row)
        # A failed message may have been delivered to some recipients and queued for other
        # nodes: its outbound rows go with it (ON DELETE CASCADE), so it waits for them too.
        failed = self.db.execute("SELECT id, failed_path FROM messages m WHERE status = 'failed' AND failed_at < ? "
                                 f"AND NOT {UNPUBLISHED} ORDER BY failed_at LIMIT ?", (cutoff, limit)).fetchall()
        return archived, failed

    def count_sweepable(self, cutoff):
        """(archived, failed) entries older than `cutoff` (what a dry run would delete; a message
        still waiting to be published to another node is not)."""
        archived = self.db.execute("SELECT count(*) FROM messages m WHERE status = 'archived' AND archived_at < ? "
                                   f"AND NOT {UNPUBLISHED}", (cutoff,)).fetchone()[0]
        failed = self.db.execute("SELECT count(*) FROM messages m WHERE status = 'failed' AND failed_at < ? "
                                 f"AND NOT {UNPUBLISHED}", (cutoff,)).fetchone()[0]
        return archived, failed

    # -- for people -------------------------------------------------------------------------

    def counts(self):
        """Messages per state this build knows (`unknown_statuses()` counts the others)."""
        counts = dict.fromkeys(STATUSES, 0)
        for row in self.db.execute("SELECT status, count(*) AS n FROM messages GROUP BY status"):
            if row["status"] in counts:
                counts[row["status"]] = row["n"]
        return counts

    def unknown_statuses(self, limit=20):
        """(count, [BadRow...] of at most `limit`) of messages whose status this build does not know."""
        marks = ",".join("?" * len(STATUSES))
        n = self.db.execute(f"SELECT count(*) FROM messages WHERE status NOT IN ({marks})", STATUSES).fetchone()[0]
        rows = self.db.execute(f"SELECT * FROM messages WHERE status NOT IN ({marks}) ORDER BY id LIMIT ?",
                               (*STATUSES, limit)) if n else []
        return n, [BadRow.of(r) for r in rows]      # every column of the row this build cannot read

    def oldest_pending(self):
        """The discovery time of the oldest message on its way (a time that is no number is left out)."""
        row = self.db.execute("SELECT min(discovered_at) FROM messages WHERE status IN ('pending', 'processing') "
                              "AND " + NUMERIC.format("discovered_at")).fetchone()
        return row[0]

    def agents(self):
        return self.db.execute("SELECT * FROM agents ORDER BY name").fetchall()

    def attestation(self):
        """The newest attestation a relay recorded of its writer connection's settings, or None
        (whether this build can read it: rows.BadRow.of(row, "attestations"))."""
        return self.db.execute("SELECT * FROM attestations ORDER BY seq DESC LIMIT 1").fetchone()

    def bad_rows(self, since=None, tables=("messages", "deliveries", "events", "agents") + NEW_TABLES):
        """Every stored row of `tables` this build cannot read, as BadRows (messages: those
        discovered since `since`, when given). The many rows of deliveries, events and sheds
        are looked at only when SQL finds a value of a type or form rows.py refuses (SUSPECT:
        the same checks, written in SQL), then checked as every row is."""
        where, args = ("", ()) if since is None else (" WHERE discovered_at >= ?", (since,))
        for table in tables:
            if table == "messages":
                rows = self.db.execute("SELECT * FROM messages" + where, args)
            else:
                rows = self.db.execute(f"SELECT * FROM {table}" + (f" WHERE {SUSPECT[table]}" if table in SUSPECT else ""))
            yield from unreadable_rows(rows, table)

    def agent_figures(self, name):
        """(messages sent, deliveries received, the row of the last failed message sent or None)."""
        sent = self.db.execute("SELECT count(*) FROM messages WHERE sender = ?", (name,)).fetchone()[0]
        received = self.db.execute("SELECT count(*) FROM deliveries WHERE recipient = ?", (name,)).fetchone()[0]
        err = self.db.execute("SELECT id, error FROM messages WHERE sender = ? AND status = 'failed' "
                              "ORDER BY id DESC LIMIT 1", (name,)).fetchone()
        return sent, received, err

    # -- flow control and the operator's view ------------------------------------------------

    def deliveries_since(self, since):
        """(sender, recipient, delivered_at, sent_at) of every delivery at or after `since` (the
        flow control's per-pair windows); each part is served by an index."""
        sql = ("SELECT m.sender, d.recipient, d.delivered_at, m.sent_at FROM messages m {} JOIN deliveries d "
               "ON d.message_id = m.id WHERE {} AND d.delivered_at >= :since")
        out = []
        for hint, where in (("INDEXED BY messages_archived_at", "m.status = 'archived' AND m.archived_at >= :since"),
                            ("INDEXED BY messages_failed_at", "m.status = 'failed' AND m.failed_at >= :since"),
                            ("", "m.status IN ('pending', 'processing', 'delivered')")):
            out += self.db.execute(sql.format(hint, where), {"since": since}).fetchall()
        return out

    # A shed, ping or archived agent this build cannot read is left out of the answers below
    # (bad_rows() names it).

    def sheds_of(self, ids):
        """{id: {recipient: (reason, released)}} of the sheds recorded for these messages."""
        out = {}
        for chunk, marks in chunks(ids):
            for r in self.db.execute("SELECT message_id, recipient, reason, released_at FROM sheds WHERE message_id "
                                     f"IN ({marks})", chunk):
                if unreadable(r, "sheds") is None:
                    out.setdefault(r[0], {})[r[1]] = (r[2], r[3] is not None)
        return out

    def sheds(self, mid):
        """One message's shed records, every one (the reader sifts them: rows.sift(rows, bad, "sheds"))."""
        return self.db.execute("SELECT * FROM sheds WHERE message_id = ? ORDER BY recipient", (mid,)).fetchall()

    def shed_counts(self, since=None):
        """{reason: sheds recorded} (at or after `since`)."""
        return dict(self.db.execute(f"SELECT reason, count(*) FROM sheds WHERE NOT ({SUSPECT['sheds']}) AND at >= ? "
                                    "GROUP BY reason", (since or 0,)).fetchall())

    def shed_pairs(self):
        """{(sender, recipient): {reason: n}} of every shed recorded."""
        out = collections.defaultdict(dict)
        for r in self.db.execute(f"SELECT sender, recipient, reason, count(*) FROM sheds WHERE NOT ({SUSPECT['sheds']}) "
                                 "GROUP BY sender, recipient, reason"):
            out[(r[0], r[1])][r[2]] = r[3]
        return out

    def archived_agents(self):
        """{name: (archived_at, actor)} of the agents an operator archived."""
        return {r["name"]: (r["at"], r["actor"]) for r in sift(self.db.execute("SELECT * FROM archived_agents"), [],
                                                                 "archived_agents")}

    def pending_pairs(self):
        """{(sender, recipient): n} of messages relay holds (pending, processing) that a
        recipient has not had yet; a message not yet read has no recipients yet and is not counted."""
        rows = self.db.execute("SELECT id, sender, recipients FROM messages WHERE status IN ('pending', 'processing') "
                               "AND recipients IS NOT NULL").fetchall()
        ids = [r["id"] for r in rows]
        done, shed = self.delivered_to(ids), self.sheds_of(ids)
        out = collections.Counter()
        for r in rows:
            try:
                to = orjson.loads(r["recipients"])
            except orjson.JSONDecodeError:
                continue
            for name in to if isinstance(to, list) else []:
                if isinstance(name, str) and name not in done.get(r["id"], {}) and name not in shed.get(r["id"], {}):
                    out[(r["sender"], name)] += 1
        return out

    def last_deliveries(self):
        """{(sender, recipient): time of the last delivery} (reads every delivery: for people)."""
        return {(r[0], r[1]): r[2] for r in self.db.execute(
            "SELECT m.sender, d.recipient, max(d.delivered_at) FROM deliveries d JOIN messages m ON m.id = d.message_id "
            "GROUP BY m.sender, d.recipient")}

    def unread_senders(self, recipient, ids):
        """{id: (sender, delivered_at)} of these envelope ids delivered to `recipient`; a ping's
        sender is System."""
        out = {}
        for chunk, marks in chunks(ids):
            for r in self.db.execute(f"SELECT d.message_id, m.sender, d.delivered_at FROM deliveries d JOIN messages m "
                                     f"ON m.id = d.message_id WHERE d.recipient = ? AND d.message_id IN ({marks})",
                                     [recipient, *chunk]):
                out[r[0]] = (r[1], r[2])
            for r in self.db.execute(f"SELECT id, sent_at FROM pings WHERE id IN ({marks})", chunk):
                out[r[0]] = ("System", r[1])
        return out

    def last_pings(self):
        """{agent: (ping id, sent_at)} of each agent's latest ping."""
        out = {}
        for r in sift(self.db.execute("SELECT * FROM pings ORDER BY sent_at, id"), [], "pings"):
            out[r["agent"]] = (r["id"], r["sent_at"])
        return out

    def commands(self):
        """Every operator command recorded, oldest first."""
        return self.db.execute("SELECT * FROM commands ORDER BY at, id").fetchall()

    def audit(self, sender=None, recipient=None, status=None, kind=None, thread=None, since=None,
              until=None, grep=None, limit=None, oldest_first=False, since_id=None, visible_to=None):
        """The messages that match, newest first; with `visible_to`, only those that agent sent or
        received (parties.py)."""
        where, args = [], []
        if visible_to is not None:
            seen, seen_args = party(visible_to)
            where.append(seen); args += seen_args
        if sender:
            where.append("m.sender = ?"); args.append(sender)
        if recipient:
            where.append("m.id IN (SELECT message_id FROM deliveries WHERE recipient = ?"
                         " UNION SELECT id FROM messages WHERE recipients LIKE ?)")
            args += [recipient, f'%"{recipient}"%']
        if str(status) == "shed":
            where.append("m.id IN (SELECT message_id FROM sheds)")
        elif status:
            where.append("m.status = ?"); args.append(str(status))
        if kind:
            where.append("m.kind = ?"); args.append(kind)
        if thread:     # a thread named by a message's id (a reply's, to a message with none) holds it first
            where.append("(m.thread = ? OR m.id = ?)"); args += [thread, thread]
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

    def thread_size(self, thread, visible_to=None):
        """How many messages `audit(thread=..., visible_to=...)` lists."""
        seen, seen_args = party(visible_to)
        return self.db.execute(f"SELECT count(*) FROM messages m WHERE (m.thread = ? OR m.id = ?) AND {seen}",
                               (thread, thread, *seen_args)).fetchone()[0]

    def last_event(self):
        """The seq of the newest lifecycle event (0 when there is none)."""
        return self.db.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0]

    def events_after(self, seq):
        """Lifecycle events after `seq`, oldest first, with their message's sender and recipients."""
        return self.db.execute("SELECT e.*, m.sender, m.recipients FROM events e LEFT JOIN messages m "
                               "ON m.id = e.message_id WHERE e.seq > ? ORDER BY e.seq", (seq,)).fetchall()

    def figures(self, since=None):
        """The numbers of `relay report`: counts, who told whom, messages per hour, failures, threads.
        A row whose status or times this build cannot read counts in none of them;
        `data["unreadable"]` lists every BadRow of the period (`bad_rows()`)."""
        db = self.db
        since = since or 0
        data = {"since": since, "unreadable": list(self.bad_rows(since or None, tables=("messages",)))
                + list(self.bad_rows(tables=("sheds",)))}
        known = "m.status IN (" + ",".join("?" * len(STATUSES)) + ") AND " + NUMERIC.format("m.discovered_at") \
            + " AND m.discovered_at >= ?"
        args = (*STATUSES, since)
        data["counts"] = {r[0]: r[1] for r in db.execute(
            f"SELECT status, count(*) FROM messages m WHERE {known} GROUP BY status", args)}
        data["matrix"] = db.execute(
            "SELECT m.sender, d.recipient, count(*) AS n FROM deliveries d JOIN messages m ON m.id = d.message_id "
            f"WHERE {known} GROUP BY m.sender, d.recipient", args).fetchall()
        data["hours"] = db.execute(
            f"SELECT CAST(discovered_at / 3600 AS INTEGER) AS h, count(*) AS n FROM messages m WHERE {known} "
            "GROUP BY h ORDER BY h", args).fetchall()
        data["failures"] = list(sift(db.execute(
            f"SELECT id, sender, name, subject, error, failed_at FROM messages m WHERE m.status = 'failed' AND {known} "
            "ORDER BY id DESC LIMIT 200", args), []))
        data["shed_counts"] = self.shed_counts(since)
        data["sheds"] = list(sift(db.execute(
            "SELECT message_id, sender, recipient, reason, limit_value, observed, at FROM sheds WHERE at >= ? "
            "ORDER BY at DESC LIMIT 200", (since,)), [], "sheds"))      # named in data["unreadable"]
        data["threads"] = db.execute(
            "SELECT thread, count(*) AS n, min(discovered_at) AS first, max(discovered_at) AS last, "
            f"group_concat(DISTINCT sender) AS senders FROM messages m WHERE thread IS NOT NULL AND {known} "
            "GROUP BY thread ORDER BY last DESC LIMIT 100", args).fetchall()
        return data

