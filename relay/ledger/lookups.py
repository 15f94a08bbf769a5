"""Two lookups for people, mixed into History: the messages one outbox path has carried (`relay
show --path`: names are reused, so several, newest first) and the operator commands recorded in
the commands table (`relay commands`: newest first, or one by its id)."""


class Lookups:
    """History's part for the lookups (uses self.db). Rows are returned as stored: a reader
    checks them (rows.py)."""

    def by_source(self, sender, name):
        """The messages found at outbox/<sender>/<name>, newest first (by id: ids sort by time)."""
        return self.db.execute("SELECT * FROM messages WHERE sender = ? AND name = ? ORDER BY id DESC",
                               (sender, name))

    def command(self, cid):
        """The operator command recorded under `cid`, or None."""
        return self.db.execute("SELECT * FROM commands WHERE id = ?", (cid,)).fetchone()

    def recent_commands(self, verb=None):
        """The operator commands recorded (of `verb`, when given), newest first."""
        where, args = (" WHERE verb = ?", (verb,)) if verb else ("", ())
        return self.db.execute(f"SELECT * FROM commands{where} ORDER BY at DESC, id DESC", args)
