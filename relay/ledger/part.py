"""The shape of a part of the ledger (huey's BaseSqlStorage, sqlite-utils' Table): a small class
with an explicit interface that holds its own statements and shares its store's one connection
and one transaction. A store is a Ledger (writes) or a History (reads), built of its parts; a part
that uses another is given it in its constructor (`Imports(ledger, chain=ledger.chain,
search=ledger.search)`) and says so in its docstring, never reaching for an attribute it was not
given; nothing outside relay/ledger/ holds a statement.

    class Receipts(Part):
        def surfaced(self, ids, agent, now):
            with self.transaction():
                self.db.executemany(...)
                self.events([(mid, now, "surfaced", agent) for mid in ids])

    ledger.receipts = Receipts(ledger)

A part holds its store's connection, and the store itself only weakly: the store holds its parts,
and a Ledger dropped without close() closes its connection at once, as a connection does, not at
the next garbage collection; a part's reads go on working while its connection is open.
"""
import weakref


class Part:
    """One part of the ledger, on its store's connection (`db`), transaction (`transaction()`,
    a store that writes) and event log (`events(rows)`: (message id or None, at, event, detail[,
    actor]) rows, written inside the caller's transaction)."""

    def __init__(self, store):
        self.store = weakref.proxy(store)
        self.db = store.db

    def transaction(self, synced=True):
        return self.store.transaction(synced=synced)

    def events(self, rows):
        self.store.events(rows)
