"""The ledger's writes for operators and retention (`ledger.operations`): a failed message put back
(requeue), a message expired, each operator command recorded (begun, finished), a ping, an agent
archived or restored, a quarantine's path, the retention sweep and its checkpoint, and originals
added to the archive by hand."""
import orjson

from relay.ledger.part import Part


class Operations(Part):
    """See the module's docstring. `search`: the ledger's search index (the sweep takes its
    messages out of it)."""

    def __init__(self, store, search):
        super().__init__(store)
        self.search = search

    def requeue(self, ids, now, actor):
        """Failed messages back to pending (relay retry). The file is put back in the spool by the
        caller first. A recipient the message was shed for is released: the operator's retry
        delivers to it past the limits. Returns the ids changed."""
        done = []
        with self.transaction():
            for mid in ids:
                row = self.db.execute(
                    "UPDATE messages SET status = 'pending', retries = 0, interrupted = 0, next_attempt_at = 0, "
                    "error = NULL, failed_at = NULL, failed_path = NULL, spooled = 1, expired_at = NULL WHERE id = ? "
                    "AND status = 'failed' RETURNING id", (mid,)).fetchone()
                if row:
                    done.append(mid)
                    self.db.execute("UPDATE sheds SET released_at = ? WHERE message_id = ? AND released_at IS NULL",
                                    (now, mid))
            self.events([(mid, now, "retry", "put back to pending by an operator", actor) for mid in done])
        return done

    def expire(self, mid, now, reason, actor):
        """A pending or failed message will not be delivered: failed with `reason`, and its
        outbound rows not yet published are dropped (relay retry queues them again). False when
        it is neither (claimed meanwhile) or was expired already: nothing changed."""
        with self.transaction():
            changed = self.db.execute("UPDATE messages SET status = 'failed', failed_at = ?, error = ?, expired_at = ? "
                                      "WHERE id = ? AND status IN ('pending', 'failed') AND expired_at IS NULL "
                                      "RETURNING spooled", (now, reason, now, mid)).fetchone()
            if changed is None:
                return False
            dropped = self.db.execute("DELETE FROM outbound WHERE message_id = ? AND status = 'pending' RETURNING node",
                                      (mid,)).fetchall()
            self.events([(mid, now, "expired", reason, actor)]
                        + [(mid, now, "unqueued", f"for node {r[0]}: not published (expired)", actor) for r in dropped])
        return True

    def begin_command(self, cid, verb, arguments, actor, now):
        """Reserve the command id `cid` for a verb and its arguments (JSON). Returns the row
        recorded under `cid` before (result None: it never finished), or None for a new id."""
        with self.transaction():
            row = self.db.execute("SELECT * FROM commands WHERE id = ?", (cid,)).fetchone()
            if row is None:
                self._command(cid, verb, arguments, actor, now, None)
        return row

    def finish_command(self, cid, verb, arguments, actor, now, result):
        """Record a command and its result (JSON)."""
        with self.transaction():
            self._command(cid, verb, arguments, actor, now, result)

    def _command(self, *row):
        self.db.execute("INSERT INTO commands (id, verb, arguments, actor, at, result) VALUES (?, ?, ?, ?, ?, ?) "
                        "ON CONFLICT (id) DO UPDATE SET result = excluded.result", row)

    def ping(self, pid, agent, now, actor):
        """A ping envelope `pid` is in the agent's inbox."""
        with self.transaction():
            self.db.execute("INSERT INTO pings (id, agent, sent_at, actor) VALUES (?, ?, ?, ?)", (pid, agent, now, actor))
            self.events([(pid, now, "ping", f"inbox/{agent}/new/{pid}.json", actor)])

    def archive_agent(self, name, now, actor, undo=False):
        """The agent is archived (with `undo`, restored). False when it already was (was not)."""
        # A row the caller found archived is not written again; one it could not read (a time
        # that is no number: left out by History.archived_agents) is replaced.
        sql = ("DELETE FROM archived_agents WHERE name = :name RETURNING name" if undo else
               "INSERT INTO archived_agents VALUES (:name, :now, :actor) ON CONFLICT (name) DO UPDATE SET "
               "at = excluded.at, actor = excluded.actor WHERE typeof(archived_agents.at) NOT IN ('integer', 'real') "
               "OR typeof(archived_agents.actor) != 'text' RETURNING name")
        with self.transaction():
            changed = self.db.execute(sql, {"name": name, "now": now, "actor": actor}).fetchone()
            if changed:
                self.events([(None, now, "agent-restored" if undo else "agent-archived", name, actor)])
        return changed is not None

    def quarantined(self, mid, rel):
        """A failed message's file is now at `rel` in failed/ (relay expire moved it there)."""
        with self.transaction():
            self.db.execute("UPDATE messages SET failed_path = ?, spooled = 0 WHERE id = ?", (rel, mid))

    # -- retention --------------------------------------------------------------------------

    def sweep(self, now, archived, failed):
        """Delete swept rows (their files are already gone) and leave a checkpoint of the chain
        head. archived: (seq, hash, id) rows, a prefix of the chain; failed: rows with an id."""
        ids = [r["id"] for r in archived] + [r["id"] for r in failed]
        if not ids:
            return
        with self.transaction():
            self.search.unindex(ids)
            self.db.executemany("DELETE FROM events WHERE message_id = ?", [(i,) for i in ids])
            self.db.executemany("DELETE FROM messages WHERE id = ?", [(i,) for i in ids])
            self.db.executemany("DELETE FROM sent_ids WHERE id = ?", [(i,) for i in ids])
            if archived:
                last = archived[-1]
                self.db.execute("DELETE FROM chain WHERE seq <= ?", (last["seq"],))
                self.db.execute("INSERT INTO checkpoints (at, upto, head, removed) VALUES (?, ?, ?, ?)",
                                (now, last["seq"], last["hash"], len(archived)))
            detail = orjson.dumps({"archived": len(archived), "failed": len(failed),
                                   "first": min(ids), "last": max(ids)}).decode()
            self.events([(None, now, "swept", detail)])

    def add_archived(self, rows):
        """Archived records as they are, with their event (relay bench's long-running ledger).
        rows: (id, sender, name, recipients, kind, subject, body, size, sha256, at, archive_path)."""
        rows = list(rows)
        with self.transaction():
            self.db.executemany(
                "INSERT INTO messages (id, sender, name, status, recipients, kind, subject, body, size, "
                "sha256, sent_at, discovered_at, claimed_at, delivered_at, archived_at, attempts, archive_path) "
                "VALUES (?, ?, ?, 'archived', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?)",
                [(*r[:9], r[9], r[9], r[9], r[9], r[9], r[10]) for r in rows])
            self.events([(r[0], r[9], "archived", None) for r in rows])
