"""What relay's Claude Code hooks told each session of an agent (agent/claude_hooks.py), a part
of the Ledger (`ledger.hook_sessions`): per (agent, session, message), when the message was given
to the session in a hook's context (by its body, or by its id and subject) and when a stop the
hook blocked named it. A message is given to a session once; a stop is blocked once for it.

Kept in the ledger rather than a file of the hook's own: the hooks of one session may run at the
same time (PostToolUse of tools run in parallel, a subagent's stop), and the ledger's transaction
makes "what was not given yet, now given" one step for each of them. Rows are kept HOOK_KEEP
seconds (a session's day and more), then dropped at the next session's start."""
from relay.ledger.part import Part
from relay.ledger.sql import chunks

HOOK_KEEP = 14 * 86400.0


class HookSessions(Part):
    """See the module's docstring."""

    def marks(self, agent, session, ids):
        """{id: (given_at, blocked_at)} of those of `ids` this session was told of."""
        out = {}
        for part, marks in chunks(ids):
            for row in self.db.execute(
                    f"SELECT message_id, given_at, blocked_at FROM hook_marks WHERE agent = ? AND session_id = ? "
                    f"AND message_id IN ({marks})", (agent, session, *part)):
                out[row["message_id"]] = (row["given_at"], row["blocked_at"])
        return out

    def give(self, agent, session, ids, now):
        """Record `ids` given to the session now (the first time counts); returns those that
        were not given before (another hook of the session may have given some meanwhile)."""
        return self._mark("given_at", agent, session, ids, now)

    def block(self, agent, session, ids, now):
        """Record that a stop of the session was blocked for `ids`; returns those not named by
        a block before."""
        return self._mark("blocked_at", agent, session, ids, now)

    def _mark(self, column, agent, session, ids, now):
        ids = list(dict.fromkeys(ids))
        if not ids:
            return []
        with self.transaction(synced=False):        # lost at a power cut: a message told twice
            before = self.marks(agent, session, ids)
            fresh = [m for m in ids if before.get(m, (None, None))[column == "blocked_at"] is None]
            self.db.executemany(
                f"INSERT INTO hook_marks (agent, session_id, message_id, at, {column}) VALUES (?, ?, ?, ?, ?) "
                f"ON CONFLICT (agent, session_id, message_id) DO UPDATE SET {column} = coalesce({column}, "
                f"excluded.{column})", [(agent, session, m, now, now) for m in fresh])
        return fresh

    def last_block(self, agent, session):
        """When a stop of the session was last blocked, or None."""
        row = self.db.execute("SELECT max(blocked_at) FROM hook_marks WHERE agent = ? AND session_id = ?",
                              (agent, session)).fetchone()
        return row[0]

    def prune(self, now, keep=HOOK_KEEP):
        """Drop the rows older than `keep` seconds; returns how many."""
        with self.transaction(synced=False):
            return self.db.execute("DELETE FROM hook_marks WHERE at < ?", (now - keep,)).rowcount
