"""Receipts and acknowledgements for agents (contract §3), for api.Agent (its `steps`): what became of a
message's copies after delivery, the steps an agent's reads record, and its acknowledgements.

    mid = me.send("bob", "merge it?", ack_required=True, priority="high")
    me.receipts(mid)            # {"id", "priority", "ack_required", "recipients": [{recipient, delivered_at,
                                #   surfaced_at, read_at, acked_at, note, reply_id}, ...]}
    me.wait_receipts(mid, "read", 60)     # blocks until every recipient read it (NotDelivered, DeliveryTimeout)
    bob.ack_message(mid, note="merged")   # the note goes back to the sender as a reply in the thread

The steps an agent's own reads take are recorded here: surfaced when inbox(), wait() or read()
give a message to the agent, read when ack() moves it to cur/. A recording that fails (a
read-only project, a ledger locked past its timeout) is logged and never fails the read. Only a
message's sender (or an operator, relay show) sees its receipts: docs/agents.md "What an agent
sees"."""
import logging
import os
import sqlite3
import time

import orjson

from relay.agent.delivery import poll, standing, wait_seconds
from relay.config import show_duration
from relay.core.message import PRIORITIES, iso
from relay.errors import DeliveryTimeout, NotDelivered, NotFound, RelayError
from relay.files.layout import valid_id

log = logging.getLogger(__name__)

RANK = {p: i for i, p in enumerate(PRIORITIES)}     # urgent first
STEPS = {"read": "read_at", "acked": "acked_at", "surfaced": "surfaced_at"}
MAX_NOTE = 64 * 1024


def by_priority(items):
    """Messages (Received) urgent first, then high, normal, low; oldest first within each (the
    order given)."""
    return sorted(items, key=lambda m: RANK.get(m.priority, RANK["normal"]))


def shown(receipt):
    """A receipt row with its times in ISO 8601 (None where the step has not happened)."""
    return {k: (iso(v) if k.endswith("_at") and isinstance(v, (int, float)) else v) for k, v in receipt.items()}


def receipts_of(history, row):
    """{id, status, priority, ack_required, recipients} of message `row`: each recipient named
    (broadcast expanded) with its steps, delivered or not yet."""
    got = {r["recipient"]: r for r in history.receipts.of(row["id"])}
    try:
        named = [n for n in orjson.loads(row["recipients"] or "[]") if isinstance(n, str)]
    except ValueError:
        named = []
    empty = dict.fromkeys(("delivered_at", "surfaced_at", "read_at", "acked_at", "note", "reply_id"))
    recipients = [shown(got.get(n) or {"recipient": n, **empty}) for n in dict.fromkeys(named + sorted(got))]
    priority, ack = history.receipts.asks(row["id"])
    return {"id": row["id"], "status": row["status"], "priority": priority, "ack_required": ack,
            "recipients": recipients}


def wait_step(project, mid, step, timeout, pause=time.sleep, clock=time.monotonic):
    """Look at message `mid` until every recipient's copy has reached `step` ("read" or
    "acked"; a later step counts), it failed for one, or `timeout` seconds pass (None: for ever).
    Returns (done: True, False (failed) or None (time ran out), reason)."""
    column = STEPS[step]
    return poll(project, lambda history: _where(history, mid, column), (None, "the project has no ledger yet"),
                lambda result: result[0] is not None, timeout, pause, clock)


def _where(history, mid, column):
    outcome = standing(history, mid)
    if outcome.delivered is False:
        return False, outcome.reason
    if outcome.delivered is None:
        return None, f"not delivered yet ({outcome.reason})"
    row = history.find(mid)
    copies = history.receipts.of(row["duplicate_of"] or row["id"])
    waiting = [c["recipient"] for c in copies if c[column] is None]
    if waiting:
        what = "read" if column == "read_at" else "acknowledged"
        return None, f"not {what} yet by {', '.join(waiting)}"
    return True, None


class AgentReceipts:
    """One Agent's receipts (api.Agent's `steps`; its receipts(), wait_receipts(), ack_message()
    and unacknowledged() are these) and the steps its reads record (ranked(), record())."""

    def __init__(self, agent):
        self.agent = agent

    @property
    def name(self):
        return self.agent.name

    @property
    def project(self):
        return self.agent.project

    @property
    def layout(self):
        return self.agent.layout

    def receipts(self, mid):
        """The receipts of a message this agent sent (by id or unique prefix): {id, status,
        priority, ack_required, recipients: [{recipient, delivered_at, surfaced_at, read_at,
        acked_at, note, reply_id}]}, times in ISO 8601 or None; status `outbox` (and no
        recipients yet) while relay has not taken it. Another's message is NotFound."""
        history = self.project.history()
        if history is None:
            raise NotFound(f"no message {mid!r} that {self.name} sent: the project has no ledger yet")
        with history:
            try:
                row = history.find(mid, visible_to=self.name)
            except NotFound:
                row = None
            if row is None and history.id_owner(mid.upper()) == self.name:     # sent, not taken by relay yet
                return {"id": mid.upper(), "status": "outbox", "priority": None, "ack_required": None,
                        "recipients": []}
            if row is None or row["sender"] != self.name:
                raise NotFound(f"no message {mid!r} that {self.name} sent")
            return receipts_of(history, row)

    def wait_receipts(self, mid, step, timeout=None):
        """Block until every recipient of message `mid` has `step` ("read" or "acked") it;
        NotDelivered with the reason when it failed for one, DeliveryTimeout when `timeout`
        seconds (None: for ever) ran out first."""
        if step not in ("read", "acked"):
            raise RelayError(f"the step to wait for is 'read' or 'acked', not {step!r}")
        timeout = wait_seconds(timeout)
        done, reason = wait_step(self.project, mid, step, timeout)
        if done is None:
            raise DeliveryTimeout(mid, reason, show_duration(timeout) if timeout else "0s")
        if done is False:
            raise NotDelivered(mid, reason)

    def ack_message(self, mid, note=None):
        """Acknowledge a message of this agent's inbox (by id or unique prefix): it is marked
        read, and `note` (text) goes back to its sender as a reply in its thread. Returns {id,
        acked (False: acknowledged before, nothing sent again), reply_id}."""
        if note is not None and (not isinstance(note, str) or len(note.encode("utf-8")) > MAX_NOTE):
            raise RelayError(f"the note must be text of at most {MAX_NOTE} bytes")
        m = self.agent.read(mid)
        if m.error:
            raise RelayError(f"{m.id} in the inbox of {self.name} is not an envelope relay can read: {m.error}")
        history = self.project.history()
        copy = None
        if history is not None:
            with history:
                copy = next((c for c in history.receipts.of(m.id) if c["recipient"] == self.name), None)
        if copy is None:
            raise RelayError(f"the ledger records no delivery of {m.id} to {self.name} yet; try again in a moment")
        if copy["acked_at"] is not None:
            return {"id": m.id, "acked": False, "reply_id": copy["reply_id"]}
        # The note first: a reply refused (its sender archived since, say) marks nothing read
        # and records nothing, and the same ack can be given again, with or without a note.
        reply_id = self.agent.reply(m, note) if note else None
        self.agent.ack([m])
        with self.project.writing() as ledger:
            acked = ledger.receipts.acked(m.id, self.name, self.project.clock(), note, reply_id)
        return {"id": m.id, "acked": acked, "reply_id": reply_id}

    def unacknowledged(self):
        """The messages this agent received that ask for an acknowledgement it has not given,
        oldest first: dicts with id, sender, subject, thread, delivered_at (ISO 8601)."""
        history = self.project.history()
        if history is None:
            return []
        with history:
            return [shown(r) for r in history.receipts.unacknowledged(self.name)]

    def ranked(self, names):
        """The names of new/'s envelopes ("<id>.json"), urgent first, by the priorities the ledger
        recorded (as they are when it has none to tell). Only names that are an id and ".json"
        are asked about: another name (not UTF-8, planted) is no message the ledger knows."""
        ids = [n[:-5] for n in names if n.endswith(".json") and valid_id(n[:-5])]
        try:
            history = self.project.history() if ids and self.layout.ledger.exists() else None
            if history is None:
                return names
            with history:
                found = history.receipts.priorities(ids)
        except (sqlite3.Error, RelayError) as e:
            log.warning("could not read the priorities of %s's messages: %s", self.name, e)
            return names
        if not found:
            return names
        return sorted(names, key=lambda n: RANK.get(found.get(n.split(".")[0]), RANK["normal"]))

    def record(self, step, items):
        """Record `step` of these messages of this agent's inbox (its own copies, readable)."""
        mine = os.path.join(str(self.layout.inbox), self.name)
        pairs = [(m.id, self.name) for m in items
                 if not m.error and m.path and os.path.dirname(os.path.dirname(str(m.path))) == mine]
        if not pairs or not self.layout.ledger.exists():
            return
        try:
            with self.project.writing() as ledger:
                ledger.receipts.step(step, pairs, self.project.clock())
        except (sqlite3.Error, RelayError, OSError) as e:
            log.warning("could not record %s for %d message(s) of %s: %s", step, len(pairs), self.name, e)
