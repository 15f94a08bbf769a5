"""The ledger's hash chain: each archived message's record hashed with the hash before it, so that
an altered, removed or inserted record shows (relay verify); a retention sweep leaves a
checkpoint. The one definition the writes (ledger.py, remote.py) and the reads share."""
import hashlib

import orjson

GENESIS = "0" * 64


def chain_hash(prev, row):
    """The hash of one archived record, covering the previous hash (relay verify)."""
    return link_hash(prev, row["id"], row["sender"], row["recipients"], row["discovered_at"], row["delivered_at"],
                     row["archived_at"], row["sha256"], row["archive_path"])


def link_hash(prev, *record):
    """chain_hash of a record given as its values: id, sender, recipients (JSON), discovered_at,
    delivered_at, archived_at, sha256, archive_path."""
    return hashlib.sha256(orjson.dumps([prev, *record])).hexdigest()
