"""What a batch carries (relay/core/work.py): a claimed message's row facts (its Claim) and its
parsed Message are frozen values no stage can change; a Work is the wrapper for what the pipeline
learns about it."""
import dataclasses

import pytest

from relay.core.work import Claim, Work
from relay.ids import IdGenerator

ROW = {"id": "01KC3000000000000000000001", "sender": "Ann", "name": "m", "archive_path": "archive/d/Ann/x--m",
       "retries": 2, "attempts": 3, "spooled": 1, "discovered_at": 10.0, "failing_since": 11.0, "spool_id": None}


def test_a_claimed_works_row_facts_cannot_be_changed_by_a_stage():
    w = Work.claimed(ROW)
    assert w.claim == Claim.of(ROW) and (w.sender, w.retries, w.attempts, w.earlier_attempt) == ("Ann", 2, 3, True)
    for fact in ("sender", "name", "retries", "attempts", "discovered_at", "failing_since"):
        with pytest.raises(AttributeError):
            setattr(w, fact, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.claim.retries = 0
    with pytest.raises(AttributeError):
        w.anything_else = 1         # a wrapper of what the pipeline learns, nothing more
    with pytest.raises(TypeError, match="no 'colour'"):
        Work("i", "Ann", "m", colour="red")


class Listener:
    """Told of each recorded batch, as on_deliver's hooks are (Relay.hooks)."""

    def __init__(self):
        self.works = []

    def delivered(self, works):
        self.works.extend(works)

    def stop(self):
        pass


def test_a_delivered_message_is_frozen_and_a_sender_chosen_id_leaves_its_claim_as_claimed(project, clock):
    relay = project.relay()
    relay.hooks = heard = Listener()
    chosen = IdGenerator().new(clock.now)
    project.drop("Ann", "m", f"ID: {chosen}\nTO: Ben\n\nhi")
    assert relay.drain(now_fn=clock, wait=lambda s: None).archived == 1
    [w] = heard.works
    assert w.id == chosen != w.claim.id and w.spool_id == w.claim.id       # learned; the claim stands
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.message.body = "changed"
    assert w.message.body == "hi" and w.recipients == ["Ben"]
