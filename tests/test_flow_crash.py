"""A hard crash (os._exit, like kill -9) at step boundaries of a batch that sheds, then a
restart: each (message, recipient) is delivered exactly once or shed with one record, never
both, and the pair's limit holds; a quarantine cut short before its record leaves no report."""
import collections
import json

import pytest

from relay.ledger.history import History
from relay.ledger.ledger import Ledger
from test_claim_budget import Killed
from test_commands import killed_at
from test_crash import crash, restart
from test_flow import drop_at

BOUNDARIES = ["tmp-synced", "link-1", "batch-synced", "before-commit", "after-commit"]


def setup(root):
    state = root / ".relay"
    (state / "outbox/Ann").mkdir(parents=True)
    (state / "relay.toml").write_text('pair_rate = 2\npair_window = "1h"\n')
    for i in range(4):
        (state / "outbox/Ann" / f"m{i}").write_text(f"TO: Ben, Cy\n\nm{i}")
    (state / "outbox/Ann/solo").write_text("TO: Ben\n\nsolo")


@pytest.mark.parametrize("lowered", [False, True], ids=["same-limits", "limit-lowered-before-restart"])
@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_sheds_survive_a_crash_at(tmp_path, boundary, lowered):
    setup(tmp_path)
    crash(tmp_path, boundary)
    if lowered:     # what the cut attempt delivered is kept, never shed: the recipient has it
        (tmp_path / ".relay/relay.toml").write_text('pair_rate = 1\npair_window = "1h"\n')
    restart(tmp_path).close()
    state = tmp_path / ".relay"
    held = collections.Counter()
    for agent in ("Ben", "Cy"):
        for p in (state / "inbox" / agent / "new").iterdir():
            held[(json.loads(p.read_bytes())["id"], agent)] += 1
    assert set(held.values()) == {1}, f"{boundary}: a recipient holds a message twice"
    # Ann is told of the sheds: a bounce per pair and window (one more at most, the window being
    # kept in memory, across the restart), each held once
    told = [json.loads(p.read_bytes()) for p in (state / "inbox/Ann/new").iterdir()]
    assert 1 <= len(told) <= 4 and all(e["kind"] == "bounce" for e in told), boundary
    assert len({e["headers"]["bounce_of"] for e in told}) == len(told), f"{boundary}: a bounce held twice"
    with History(Ledger(state / "ledger.sqlite", readonly=True)) as h:
        rows = list(h.audit(sender="Ann"))
        assert {r["status"] for r in rows} <= {"archived", "failed"} and len(rows) == 5
        assert {r["status"] for r in h.audit(sender="System")} == {"archived"}
        shed = {(r["id"], s["recipient"]) for r in rows for s in h.sheds(r["id"])}
        delivered = {(r["id"], d["recipient"]) for r in rows for d in h.deliveries(r["id"])}
        every = {(r["id"], who) for r in rows for who in json.loads(r["recipients"])}
    assert not shed & delivered and shed | delivered == every, boundary
    assert delivered == set(held), boundary
    per_recipient = collections.Counter(who for _, who in delivered)
    if not lowered:
        assert per_recipient == {"Ben": 2, "Cy": 2}, f"{boundary}: {per_recipient}"
    else:
        assert 1 <= per_recipient["Ben"] <= 2 and 1 <= per_recipient["Cy"] <= 2, f"{boundary}: {per_recipient}"


def test_a_quarantine_cut_short_leaves_no_report_of_a_failure_that_did_not_stand(project, clock):
    """A message shed for every recipient is moved to failed/ and its .error.json written before
    the batch is recorded. Killed in between, recovery moved the file back to the spool but left
    the report: the message was then delivered (its window had passed), while failed/ still told
    the sender it was shed, and doctor named the report as a file no record knows."""
    from relay.operator.doctor import doctor
    relay = project.relay(pair_rate="1")
    drop_at(project, "Ann", "m1", "TO: Ben\n\none", clock.now)
    assert relay.drain().archived == 1
    drop_at(project, "Ann", "m2", "TO: Ben\n\ntwo", clock.now)
    killed_at(relay.ledger.messages, "record")
    with pytest.raises(Killed):
        relay.drain()
    assert len(project.files("failed")) == 2            # the file and its report, not yet recorded
    relay.close()
    project.relays.remove(relay)
    clock.advance(700)
    relay = project.relay(pair_rate="1")
    assert relay.drain().archived == 1 and len(project.inbox("Ben")) == 2
    assert project.files("failed") == [] and doctor(relay.history, relay.layout, None)[0] == []
