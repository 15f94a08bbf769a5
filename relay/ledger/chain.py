"""The ledger's hash chain: each archived message's record hashed with the hash before it, so that
an altered, removed or inserted record shows (relay verify); a retention sweep leaves a
checkpoint. The one definition the writes (messages.py, remote.py, imports.py) and the reads
share, and the part that reads the chain's head and appends one record to it (`ledger.chain`)."""
import hashlib

import orjson

from relay.ledger.part import Part

GENESIS = "0" * 64


def chain_hash(prev, row):
    """The hash of one archived record, covering the previous hash (relay verify)."""
    return link_hash(prev, row["id"], row["sender"], row["recipients"], row["discovered_at"], row["delivered_at"],
                     row["archived_at"], row["sha256"], row["archive_path"])


def link_hash(prev, *record):
    """chain_hash of a record given as its values: id, sender, recipients (JSON), discovered_at,
    delivered_at, archived_at, sha256, archive_path."""
    return hashlib.sha256(orjson.dumps([prev, *record])).hexdigest()


class Chain(Part):
    """The chain's head, and one record appended (inside the caller's transaction)."""

    def head(self):
        """(seq, hash) of the chain's last record, or of the last checkpoint when it is empty."""
        row = self.db.execute("SELECT seq, hash FROM chain ORDER BY seq DESC LIMIT 1").fetchone()
        if row:
            return row["seq"], row["hash"]
        cp = self.db.execute("SELECT upto, head FROM checkpoints ORDER BY seq DESC LIMIT 1").fetchone()
        return (cp["upto"], cp["head"]) if cp else (0, GENESIS)

    def append(self, mid):
        """Append the archived record `mid` to the chain (a batch's record chains its own in bulk)."""
        seq, prev = self.head()
        row = self.db.execute("SELECT * FROM messages WHERE id = ?", (mid,)).fetchone()
        self.db.execute("INSERT INTO chain (seq, message_id, hash) VALUES (?, ?, ?)", (seq + 1, mid, chain_hash(prev, row)))
