"""Team state in the ledger: a coordinator's keys and values (table team_state, migration 51).
The writes (StateWrites, `ledger.state`) and the reads (StateReads, `history.state`).

Each key has a version that goes up by one at every change. A write is decided in one
`BEGIN IMMEDIATE` transaction: the key's row is read, the condition checked (`if_absent`: no
value now; `if_version`: the value now has that version), and the row and its event written, or
nothing is: of two processes setting one key on the same condition, exactly one does. A deleted
key keeps its row with no value and its version one up, so a version is never given twice (a
compare-and-set made on an old version fails even after a delete and a new set). Every change is
an event (message_id NULL, actor who made it): `state-set` and `state-deleted`, detail
`key=K version=N`, which `relay tail` shows."""
from relay.errors import LedgerError
from relay.ledger.part import Part
from relay.ledger.rows import STATE_KEY as KEY, STATE_KEY_RULE as KEY_RULE, BadRow  # noqa: F401 - state.KEY

MAX_VALUE_BYTES = 64 * 1024         # a value's size in UTF-8, at most


def unreadable_state(key, row):
    """LedgerError naming every column of the row of `key` this build cannot read (rows.py's
    BadRow, as every reader names them), or None."""
    problem = BadRow.of(row, "team_state") if row is not None else None
    if problem is None:
        return None
    return LedgerError(str(problem).removesuffix("; skipped") + "; nothing changed")


class StateWrites(Part):
    """The team state's writes."""

    def set(self, key, value, now, actor, if_version=None, if_absent=False):
        """Set `key` to `value` (text) when the condition holds: with `if_absent`, the key has
        no value now; with `if_version`, its value now has that version. Returns (True, the
        row written) or (False, the row as it is: None when the key has no value); raises
        LedgerError for a row this build cannot read."""
        with self.transaction():
            row, live = self._now(key)
            if (if_absent and live is not None) or (
                    if_version is not None and (live is None or live["version"] != if_version)):
                return False, live
            new = {"key": key, "value": value, "version": (row["version"] if row else 0) + 1,
                   "updated_at": now, "updated_by": actor}
            self.db.execute("INSERT INTO team_state (key, value, version, updated_at, updated_by) VALUES (:key, "
                            ":value, :version, :updated_at, :updated_by) ON CONFLICT (key) DO UPDATE SET "
                            "value = excluded.value, version = excluded.version, updated_at = excluded.updated_at, "
                            "updated_by = excluded.updated_by", new)
            detail = f"key={key} version={new['version']} bytes={len(value.encode('utf-8'))}"
            self.events([(None, now, "state-set", detail, actor)])
        return True, new

    def delete(self, key, now, actor, if_version=None):
        """Delete `key`'s value (with `if_version`, only when its value now has that version).
        Returns (True, the row deleted, as it was) or (False, the row as it is: None when the
        key has no value); raises LedgerError for a row this build cannot read."""
        with self.transaction():
            _, live = self._now(key)
            if live is None or (if_version is not None and live["version"] != if_version):
                return False, live
            version = live["version"] + 1
            self.db.execute("UPDATE team_state SET value = NULL, version = ?, updated_at = ?, updated_by = ? "
                            "WHERE key = ?", (version, now, actor, key))
            self.events([(None, now, "state-deleted", f"key={key} version={version}", actor)])
        return True, live

    def _now(self, key):
        """(the key's row or None, the same when it holds a value, else None)."""
        row = self.db.execute("SELECT * FROM team_state WHERE key = ?", (key,)).fetchone()
        bad = unreadable_state(key, row)
        if bad is not None:
            raise bad
        row = dict(row) if row is not None else None
        return row, row if row is not None and row["value"] is not None else None


class StateReads(Part):
    """The team state's reads. Rows are returned as stored: a reader checks them (rows.py's
    "team_state" checks)."""

    def get(self, key):
        """The row of `key` when it holds a value, else None."""
        return self.db.execute("SELECT * FROM team_state WHERE key = ? AND value IS NOT NULL", (key,)).fetchone()

    def entries(self, prefix=None):
        """The keys that hold a value (those starting with `prefix`, when given), by key."""
        if prefix:
            return self.db.execute("SELECT * FROM team_state WHERE value IS NOT NULL AND substr(key, 1, ?) = ? "
                                   "ORDER BY key", (len(prefix), prefix)).fetchall()
        return self.db.execute("SELECT * FROM team_state WHERE value IS NOT NULL ORDER BY key").fetchall()
