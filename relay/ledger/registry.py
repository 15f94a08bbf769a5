"""The agents in the ledger: the first and last time each name was seen (table agents), and the
agent registry (table agent_registry, migration 50). The writes (AgentRegistry, `ledger.registry`)
are made inside the transaction that records the batch holding the `spawn` or `release` message
(or a delivery, for the agents seen); the reads (RegistryReads, `history.registry`). What a spawn
or release means, and what of a message goes into a row, core/registry.py decides.

A row per agent that a spawn or a release named: `state` active or inactive, `metadata` a JSON
object (what the last spawn said of the agent), who spawned and released it, when, and by which
message. A spawn (again) makes the row active with its metadata and forgets the last release; a
release makes it inactive and keeps its metadata; a release of an agent inactive already changes
nothing (the row says when it was released first). Each change is an event of the control
message (`agent-spawned`, `agent-released`) that `relay show` and `relay tail` show."""
import collections

import orjson

from relay.ledger.part import Part
from relay.ledger.sql import chunks, insert_rows

# One change of the registry: `kind` "spawn" or "release", the agent's `name`, the sender `by`,
# the control message's id `message_id`, and (a spawn's) `metadata`, a dict.
Change = collections.namedtuple("Change", "kind name by message_id metadata")


class AgentRegistry(Part):
    """The writes, inside the caller's transaction (a batch's record, one received)."""

    def seen(self, names, now):
        """These agents were seen now (a sender found, a recipient delivered to)."""
        insert_rows(self.db, "INSERT INTO agents (name, first_seen, last_seen)", [(n, now, now) for n in names],
                    "ON CONFLICT (name) DO UPDATE SET last_seen = excluded.last_seen")

    def apply(self, at, changes, events):
        """Apply `changes` (Change), in order, at `at`; their events are appended to `events`."""
        for c in changes:
            if c.kind == "spawn":
                self.db.execute(
                    "INSERT INTO agent_registry (name, state, metadata, spawned_at, spawned_by, spawn_id, updated_at) "
                    "VALUES (?, 'active', ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET state = 'active', "
                    "metadata = excluded.metadata, spawned_at = excluded.spawned_at, spawned_by = excluded.spawned_by, "
                    "spawn_id = excluded.spawn_id, released_at = NULL, released_by = NULL, release_id = NULL, "
                    "updated_at = excluded.updated_at",
                    (c.name, orjson.dumps(c.metadata or {}).decode(), at, c.by, c.message_id, at))
                events.append((c.message_id, at, "agent-spawned", f"{c.name}: active"))
            else:
                changed = self.db.execute(
                    "INSERT INTO agent_registry (name, state, metadata, released_at, released_by, release_id, "
                    "updated_at) VALUES (?, 'inactive', '{}', ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                    "state = 'inactive', released_at = excluded.released_at, released_by = excluded.released_by, "
                    "release_id = excluded.release_id, updated_at = excluded.updated_at WHERE state IS NOT 'inactive'",
                    (c.name, at, c.by, c.message_id, at)).rowcount
                events.append((c.message_id, at, "agent-released",
                               f"{c.name}: inactive" if changed else f"{c.name}: inactive already; nothing changed"))


class RegistryReads(Part):
    """The reads. Rows are returned as stored: the reader sifts them (rows.sift(rows, bad,
    "agent_registry"))."""

    def rows(self, names=None):
        """The registry's rows, by name (only those of `names`, when given)."""
        if names is None:
            return self.db.execute("SELECT * FROM agent_registry ORDER BY name").fetchall()
        names = sorted(set(names))
        out = []
        for chunk, marks in chunks(names):
            out += self.db.execute(f"SELECT * FROM agent_registry WHERE name IN ({marks}) "
                                   "ORDER BY name", chunk).fetchall()
        return out
