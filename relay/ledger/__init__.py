"""The SQLite ledger, the only place SQL is written: the connection, its transactions and its
parts that write (ledger.py: `ledger.messages` in messages.py, `ledger.senders` in senders.py,
`ledger.remote` in remote.py, `ledger.reservations`, `ledger.state`, ...; each a Part of part.py),
the read-only queries every verb uses (history.py, with its parts: `history.remote`,
`history.checks`, `history.search`, ...), the schema and its migrations
(schema.py), what came over from another system (imports.py, and agent-relay's ledger read by
agent_relay.py), and the checks that name each column of
a row this relay cannot read (rows.py)."""
