"""The ledger's hash chain: each archived message's record hashed with the hash before it, so that
an altered, removed or inserted record shows (relay verify); a retention sweep leaves a
checkpoint. The one definition the writes (messages.py, remote.py, imports.py) and the reads
share, and the part that reads the chain's head and appends records to it (`ledger.chain`)."""
import hashlib

import orjson

from relay.ledger.part import Part
from relay.ledger.sql import chunks, insert_rows

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

    def extend(self, ids):
        """Append the archived records `ids` to the chain, in order (a batch's record chains its
        own as it writes them)."""
        seq, prev = self.head()
        rows = {}
        for chunk, marks in chunks(ids):
            rows.update((r["id"], r) for r in self.db.execute(f"SELECT * FROM messages WHERE id IN ({marks})", chunk))
        links = []
        for mid in ids:
            seq, prev = seq + 1, chain_hash(prev, rows[mid])
            links.append((seq, mid, prev))
        insert_rows(self.db, "INSERT INTO chain (seq, message_id, hash)", links)
