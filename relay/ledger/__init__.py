"""The SQLite ledger, the only place SQL is written: the connection, its transactions and every
write (ledger.py, with the ids bound to their senders in senders.py, the federation's rows in
remote.py, the file reservations in reservations.py and the team state in state.py), the
read-only queries every verb uses (history.py, with lookups.py), the schema and its migrations
(schema.py), what came over from another system (imports.py, and agent-relay's ledger read by
agent_relay.py), and the checks that name each column of
a row this relay cannot read (rows.py)."""
