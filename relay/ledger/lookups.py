"""Two lookups for people (`history.lookups`): the messages one outbox path has carried (`relay
show --path`: names are reused, so several, newest first) and the operator commands recorded in
the commands table (`relay commands`: newest first, or one by its id)."""
from relay.ledger.part import Part
from relay.ledger.parties import party


class Lookups(Part):
    """The lookups. Rows are returned as stored: a reader checks them (rows.py)."""

    def by_source(self, sender, name, visible_to=None):
        """The messages found at outbox/<sender>/<name>, newest first (by id: ids sort by time);
        with `visible_to`, only those that agent sent or received (parties.py)."""
        seen, seen_args = party(visible_to)
        return self.db.execute(f"SELECT * FROM messages m WHERE sender = ? AND name = ? AND {seen} ORDER BY id DESC",
                               (sender, name, *seen_args))

    def command(self, cid):
        """The operator command recorded under `cid`, or None."""
        return self.db.execute("SELECT * FROM commands WHERE id = ?", (cid,)).fetchone()

    def recent_commands(self, verb=None):
        """The operator commands recorded (of `verb`, when given), newest first."""
        where, args = (" WHERE verb = ?", (verb,)) if verb else ("", ())
        return self.db.execute(f"SELECT * FROM commands{where} ORDER BY at DESC, id DESC", args)
