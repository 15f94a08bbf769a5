"""A sender's messages wait until its name is claimed: no node reads a name before its claim.

A node claims each of its agents' names (SETNX) before the entry that lists them (claims.py),
so no other node can read a new name in the directory before the claim exists. A message can
name its sender too: an agent new since the node's last announcement could write to another
node's agent before the node announced it (up to a second later), and the receiving node, if
hostile, could read the sender in its stream and claim the name first. So a row whose sender
this node has not announced yet is not published: it waits (HOLD_STEP at a time, counted as no
attempt), the link announces at once (claims first), and the rows held go the moment it has.
The loop writes a sender's messages itself only once that sender is announced and none of its
rows is held (one sender's messages keep their order).

A row waits at most HOLD_MAX after it was queued: an announcement that cannot be made (the
server refusing writes) keeps the publish from working too, and a name that is no agent's any
more (its directory removed) would otherwise hold its rows for good.
"""
from relay.names import reserved

HOLD_STEP = 0.25            # seconds a held row waits before it is looked at again ...
HOLD_MAX = 30.0             # ... at most this long after it was queued
HELD_KEPT = 25_600          # rows remembered as held, at most (then those past HOLD_MAX are forgotten)


class Speakers:
    """The publisher's: which senders it may publish (its thread)."""

    def __init__(self, ledger):
        self.ledger = ledger
        self.announced = set()      # case-folded names this node announced, their claims made
        self.held = {}              # (message id, node) -> (case-folded sender, when first held)
        self.unheard = False        # rows were held since the link last announced

    def only(self, now, rows):
        """The rows (outbound_due's) whose sender this node announced; the others wait."""
        held = []
        for r in rows:
            sender = r["sender"]
            folded = sender.casefold() if sender else None
            key = (r["message_id"], r["node"])
            if folded and folded not in self.announced and not reserved(sender) and now - r["queued_at"] < HOLD_MAX:
                held.append(key)
                self.held.setdefault(key, (folded, now))
            else:
                self.held.pop(key, None)
        if not held:
            return rows
        self.ledger.remote.hold(held, now + HOLD_STEP)
        self.unheard = True
        if len(self.held) > HELD_KEPT:      # settled some other way since (rerouted, retired): forgotten
            self.held = {k: v for k, v in self.held.items() if now - v[1] < HOLD_MAX}
        kept = set(held)
        return [r for r in rows if (r["message_id"], r["node"]) not in kept]

    def release(self, now, announced):
        """Names just announced, their claims made: the rows held for them are due now."""
        self.announced |= {n.casefold() for n in announced}
        free = [key for key, (folded, _) in self.held.items() if folded in self.announced]
        if free:
            self.ledger.remote.hold(free, now)

    def free(self):
        """The case-folded names whose messages the loop may write itself: announced, with no row
        of theirs held."""
        return frozenset(self.announced - {folded for folded, _ in self.held.values()})
