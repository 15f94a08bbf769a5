"""Waiting for a message to be delivered (`relay send --wait-delivered`, `Agent.send(...,
wait_delivered=)`, MCP `send(wait_delivered_s=)`): the ledger, read-only, is looked at until
the message is delivered to every recipient (here, and acknowledged by every other node that has
some), has failed for one (failed, shed, refused by a node), or the time is up.

The look is a few indexed reads; it starts at every 10 ms and backs off to every 250 ms, so a
wait costs the daemon nothing and learns of a delivery within a quarter of a second."""
import dataclasses
import math
import time

import orjson

from relay.config import show_duration
from relay.errors import DeliveryTimeout, NotDelivered, NotFound, RelayError

FIRST_PAUSE = 0.01
MAX_PAUSE = 0.25


@dataclasses.dataclass(frozen=True)
class Delivery:
    """Where a message stands: `delivered` (True: every recipient has it; False: it failed for
    one, `reason` says why; None: not yet, `reason` says what it waits for)."""
    id: str
    delivered: object
    reason: str = None


def standing(history, mid):
    """The Delivery of message `mid` as the ledger has it now."""
    try:
        row = history.find(mid)
    except NotFound:
        return Delivery(mid, None, "relay has not taken it from the outbox yet")
    if row["duplicate_of"]:         # a repeat of a request id: the first one's delivery
        return dataclasses.replace(standing(history, row["duplicate_of"]), id=mid)
    status = row["status"]
    if status == "failed":
        return Delivery(mid, False, row["error"] or "failed")
    if status not in ("delivered", "archived"):
        return Delivery(mid, None, f"{status}{': ' + row['error'] if row['error'] else ''}")
    shed = [s for s in history.sheds(row["id"]) if s["released_at"] is None]
    if shed:
        return Delivery(mid, False, "; ".join(f"shed for {s['recipient']} ({s['reason']})" for s in shed))
    remote = history.remote.outbound(row["id"])
    refused = [o for o in remote if o["status"] == "refused"]
    if refused:
        return Delivery(mid, False, "; ".join(f"refused by node {o['node']} for {', '.join(orjson.loads(o['recipients']))}"
                                              f": {o['error']}" for o in refused))
    waiting = [o["node"] for o in remote if o["status"] != "acknowledged"]
    if waiting:
        return Delivery(mid, None, f"waiting for node(s) {', '.join(waiting)} to acknowledge it")
    return Delivery(mid, True)


def wait_delivered(project, mid, timeout, pause=time.sleep, clock=time.monotonic):
    """Look at message `mid` until it is delivered or failed, or `timeout` seconds pass (None:
    for ever); returns its last Delivery (`delivered` None when the time ran out). `pause(s)`
    waits between two looks."""
    return poll(project, lambda history: standing(history, mid), Delivery(mid, None, "the project has no ledger yet"),
                lambda outcome: outcome.delivered is not None, timeout, pause, clock)


def poll(project, look, no_ledger, settled, timeout, pause=time.sleep, clock=time.monotonic):
    """`look(history)` again and again, read-only (each look sees the latest commit), until
    `settled(result)` or `timeout` seconds pass (None: for ever), the pause between two looks
    doubling up to MAX_PAUSE; returns the last result (`no_ledger` while the project has none)."""
    deadline = None if timeout is None else clock() + timeout
    wait, history = FIRST_PAUSE, None
    try:
        while True:
            history = history or project.history()
            result = no_ledger if history is None else look(history)
            if settled(result):
                return result
            left = None if deadline is None else deadline - clock()
            if left is not None and left <= 0:
                return result
            pause(wait if left is None else min(wait, left))
            wait = min(wait * 2, MAX_PAUSE)
    finally:
        if history is not None:
            history.close()


def seconds_of(value):
    """`value` as float seconds, NaN for what is no number (text that is none, a list, None)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def wait_seconds(timeout):
    """A time to wait as float seconds (None: for ever); RelayError for what is no number of
    seconds from 0 (text, a negative number, NaN)."""
    if timeout is None:
        return None
    seconds = seconds_of(timeout)
    if not seconds >= 0:
        raise RelayError(f"the time to wait must be a number of seconds, not {timeout!r}")
    return seconds


def delivered(project, mid, timeout):
    """Wait (wait_delivered) for message `mid`, `timeout` seconds or None for ever: returns when
    every recipient has it; NotDelivered with the reason when it failed, DeliveryTimeout when
    the time ran out first."""
    timeout = wait_seconds(timeout)
    outcome = wait_delivered(project, mid, timeout)
    if outcome.delivered is None:
        raise DeliveryTimeout(mid, outcome.reason, show_duration(timeout) if timeout else "0s")
    if not outcome.delivered:
        raise NotDelivered(mid, outcome.reason)
