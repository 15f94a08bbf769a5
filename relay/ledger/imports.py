"""Records brought over from another system's ledger (`relay import agent-relay`; the operator's
importer, operator/importer.py, decides what each becomes): the writes (Imports,
`ledger.imports`) and the reads (ImportReads, `history.imports`).

Each record imported is a message row like relay's own, written in one transaction with its row
in `imports` (source, its id there, its id here; migration 52) and its `imported` event naming
the source and that id; an archived one enters the hash chain as relay's own do, in the same
transaction. A record whose source id is in `imports` is never written again; a message whose id
is taken already (its spool file, written before a crash, registered again by recovery) gets its
`imports` row and event only. Agents widen the agents table's first and last seen, and come into the agent registry with their
state and metadata (a name the registry knows stays as it is); orchestrator
state goes into `team_state` when this ledger has that table, each key only when it has none."""
import re

import orjson

from relay.ledger.chain import chain_hash
from relay.ledger.part import Part
from relay.ledger.state import MAX_VALUE_BYTES
from relay.ledger.sql import chunks

# What one imported message row may set; the others keep their defaults.
COLUMNS = ("id", "sender", "name", "status", "spooled", "recipients", "kind", "thread", "subject", "body", "headers",
           "size", "sha256", "sent_at", "discovered_at", "delivered_at", "archived_at", "failed_at", "retries",
           "attempts", "next_attempt_at", "error", "archive_path", "failed_path")
# A key of relay's team state (relay state): keys that are not are left out, and said so.
STATE_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}\Z")
NO_STATE = "this relay's ledger has no team_state table (relay state)"


def _what(source, origin, source_id, status):
    return f"from {source} {origin}: {status} there, its id {source_id}"


class Imports(Part):
    """The imports' writes. `chain`: the ledger's hash chain (an archived record enters it);
    `search`: its search index (what is imported is indexed)."""

    def __init__(self, store, chain, search):
        super().__init__(store)
        self.chain, self.search = chain, search

    def record(self, items, source, origin, now, actor):
        """One transaction: each of `items` (dicts of COLUMNS, with `source_id` and
        `source_status`) recorded as a message with its `imports` row and events; an item with
        `duplicate_of` (the source id of a record of the same file) gets only its `imports` row
        and its event, on the message `id` that record became. Returns the ids recorded (an item
        imported meanwhile, by another run, is left out)."""
        done, events, docs = [], [], []
        columns = ", ".join(COLUMNS)
        insert = f"INSERT INTO messages ({columns}) VALUES ({', '.join(':' + c for c in COLUMNS)})"
        with self.transaction():
            seq, prev = self.chain.head()
            for it in items:
                mid = it["id"]
                claimed = self.db.execute(
                    "INSERT INTO imports (source, source_id, message_id, status, origin, at) VALUES (?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT DO NOTHING RETURNING message_id",
                    (source, it["source_id"], mid, it["source_status"], origin, now)).fetchone()
                if claimed is None:
                    continue
                done.append(mid)
                what = _what(source, origin, it["source_id"], it["source_status"])
                if it.get("duplicate_of"):      # another record of the file `mid` holds: no message of its own
                    events.append((mid, now, "imported", f"{what}: a duplicate of its id {it['duplicate_of']} (the "
                                   "same outbox file), one message with it, not delivered again", actor))
                    continue
                events.append((mid, now, "imported", what, actor))
                if self.db.execute("SELECT 1 FROM messages WHERE id = ?", (mid,)).fetchone():
                    continue            # registered by recovery from its spool file: it stays as it is
                self.db.execute(insert, {c: it.get(c) for c in COLUMNS})
                if it["status"] != "pending":   # a pending one is indexed once relay has delivered it
                    docs.append((mid, it.get("subject"), it.get("body")))
                if it["status"] == "archived":
                    row = self.db.execute("SELECT * FROM messages WHERE id = ?", (mid,)).fetchone()
                    seq, prev = seq + 1, chain_hash(prev, row)
                    self.db.execute("INSERT INTO chain (seq, message_id, hash) VALUES (?, ?, ?)", (seq, mid, prev))
                    events.append((mid, now, "archived", it.get("archive_path"), actor))
                elif it["status"] == "failed":
                    events.append((mid, now, "failed", it.get("error"), actor))
            self.events(events)
            self.search.index(docs)
        return done

    def agents(self, agents, source, origin, now, actor):
        """agents: (name, first_seen, last_seen). Each added, or its first and last seen widened
        to cover these; the names changed, each with an `imported` event."""
        changed = []
        with self.transaction():
            for name, first, last in agents:
                row = self.db.execute(
                    "INSERT INTO agents (name, first_seen, last_seen) VALUES (?, ?, ?) ON CONFLICT (name) DO UPDATE "
                    "SET first_seen = min(first_seen, excluded.first_seen), last_seen = max(last_seen, excluded.last_seen) "
                    "WHERE excluded.first_seen < agents.first_seen OR excluded.last_seen > agents.last_seen "
                    "RETURNING name", (name, first, last)).fetchone()
                if row is not None:
                    changed.append(name)
            self.events([(None, now, "imported", f"agent {name} {_what(source, origin, name, 'known')}", actor)
                         for name in changed])
        return changed

    def registry(self, agents, source, origin, now, actor):
        """agents: (name, state "active"/"inactive", metadata dict, created_at, last_seen_at) of
        another system's agent registry. Each name the registry has no row for gets one (a row
        relay wrote, by a spawn or release here, stays as it is): active with its metadata and
        `spawned_at` its creation, or inactive with `released_at` its last seen. Returns the
        names written, each with an `imported` event."""
        done = []
        with self.transaction():
            for name, state, metadata, created, last in agents:
                row = self.db.execute(
                    "INSERT INTO agent_registry (name, state, metadata, spawned_at, released_at, updated_at) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING RETURNING name",
                    (name, state, orjson.dumps(metadata).decode(), created,
                     (last or created) if state == "inactive" else None, now)).fetchone()
                if row is not None:
                    done.append(name)
            self.events([(None, now, "imported", f"agent {name} ({state}) {_what(source, origin, name, state)}",
                          actor) for name, state, *_ in agents if name in done])
        return done

    def state(self, entries, source, origin, now, actor):
        """entries: (key, value, updated_at) of another system's coordinator. Into team_state,
        when this ledger has it, each key this ledger has no row for (a key set or deleted here
        stays as it is here). Returns (keys imported, keys left out with why, why none could be:
        None when the table is there)."""
        columns = {r[1]: r for r in self.db.execute("PRAGMA table_info(team_state)")}
        if not columns:
            return [], [], NO_STATE
        fill = {"key", "value", "version", "updated_at", "updated_by"}
        unknown = sorted(c for c, r in columns.items() if r[3] and r[4] is None and c not in fill)
        if unknown or "key" not in columns or "value" not in columns:
            return [], [], f"its team_state table has columns this relay does not fill ({', '.join(unknown) or 'key'})"
        use = [c for c in ("key", "value", "version", "updated_at", "updated_by") if c in columns]
        sql = (f"INSERT INTO team_state ({', '.join(use)}) VALUES ({', '.join(':' + c for c in use)}) "
               "ON CONFLICT DO NOTHING RETURNING key")
        done, left = [], []
        with self.transaction():
            for key, value, at in entries:
                if not isinstance(key, str) or not STATE_KEY.match(key) or not isinstance(value, str):
                    left.append((key, "not a key and text value relay's team state holds"))
                    continue
                size = len(value.encode("utf-8", "surrogatepass"))
                if size > MAX_VALUE_BYTES:
                    left.append((key, f"its value is {size} bytes, over the {MAX_VALUE_BYTES} (64 KiB) a key of "
                                      "relay's team state holds"))
                    continue
                row = self.db.execute(sql, {"key": key, "value": value, "version": 1, "updated_at": at,
                                            "updated_by": actor}).fetchone()
                if row is not None:
                    done.append(key)
            self.events([(None, now, "imported", f"team state key={key} {_what(source, origin, key, 'set')}", actor)
                         for key in done])
        return done, left, None


class ImportReads(Part):
    """The imports' reads."""

    def imported(self, source, source_ids):
        """{source id: message id} of those of `source_ids` imported from `source` already."""
        out = {}
        ids = list(source_ids)
        for chunk, marks in chunks(ids):
            out.update((r[0], r[1]) for r in self.db.execute(
                f"SELECT source_id, message_id FROM imports WHERE source = ? AND source_id IN "
                f"({marks})", [source, *chunk]))
        return out

    def has_table(self, name):
        return self.db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() \
            is not None
