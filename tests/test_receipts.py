"""Receipts, acknowledgements and priority (contract §3): each recipient's copy moves through
delivered, surfaced, read and acknowledged, each step seen by the sender with its time; a plain
Maildir client's rename from new/ to cur/ is noticed by the daemon; urgent mail comes first."""
import os

import pytest

import relay
from relay.errors import NotFound


@pytest.fixture
def trio(crew, project):
    """Alice, Bob and Carol as relay.Agents, and `trio.relay`: a daemon's pipeline on the same clock."""
    crew.relay = project.relay(agents=("Alice", "Bob", "Carol"))
    return crew


def steps(receipts, name):
    r = next(r for r in receipts["recipients"] if r["recipient"] == name)
    return {k: r[k] for k in ("delivered_at", "surfaced_at", "read_at", "acked_at")}


def test_one_message_walks_every_step_for_two_recipients_one_read_by_a_plain_maildir_rename(trio):
    alice, bob, carol = trio.agent("Alice"), trio.agent("Bob"), trio.agent("Carol")
    mid = alice.send(["Bob", "Carol"], "merge it?", subject="merge", ack_required=True)
    assert alice.receipts(mid)["status"] == "outbox" and alice.receipts(mid)["recipients"] == []
    trio.relay.drain()
    got = alice.receipts(mid)
    assert got["ack_required"] is True and got["priority"] == "normal"
    for name in ("Bob", "Carol"):
        s = steps(got, name)
        assert s["delivered_at"] and not (s["surfaced_at"] or s["read_at"] or s["acked_at"])

    # Bob's agent is given it (surfaced), then marks it read through relay
    [m] = bob.inbox()
    assert m.ack_required is True and m.priority == "normal"
    assert steps(alice.receipts(mid), "Bob")["surfaced_at"] and not steps(alice.receipts(mid), "Bob")["read_at"]
    bob.ack([m])
    assert steps(alice.receipts(mid), "Bob")["read_at"]

    # Carol's Maildir client renames the envelope itself; the daemon notices it at its next look
    box = trio.state / "inbox" / "Carol"
    os.rename(box / "new" / f"{mid}.json", box / "cur" / f"{mid}.json:2,S")
    assert steps(alice.receipts(mid), "Carol")["read_at"] is None
    trio.relay.step(trio.clock.advance(2))
    carol_steps = steps(alice.receipts(mid), "Carol")
    assert carol_steps["read_at"] and carol_steps["surfaced_at"] == carol_steps["read_at"]
    assert not carol_steps["acked_at"]

    # both acknowledge; Bob's note comes back to Alice as a reply in the thread
    done = bob.ack_message(mid, note="merged at 4f2c")
    assert done["acked"] is True and done["reply_id"]
    assert bob.ack_message(mid, note="again")["acked"] is False       # once: nothing sent again
    assert carol.ack_message(mid)["acked"] is True
    final = alice.receipts(mid)
    for name in ("Bob", "Carol"):
        s = steps(final, name)
        assert all(s.values()), (name, s)
        assert s["delivered_at"] <= s["read_at"] <= s["acked_at"]
    bob_row = next(r for r in final["recipients"] if r["recipient"] == "Bob")
    assert bob_row["note"] == "merged at 4f2c" and bob_row["reply_id"] == done["reply_id"]
    trio.relay.drain()
    [reply] = alice.inbox()
    assert reply.id == done["reply_id"] and reply.thread == mid and reply.body == "merged at 4f2c"
    assert reply.subject == "Re: merge"

    # only the sender sees a message's receipts
    with pytest.raises(NotFound, match="that Bob sent"):
        bob.receipts(mid)
    events = [e["event"] for e in trio.relay.history.events(mid)]
    assert events.count("surfaced") == 1 and events.count("read") == 2 and events.count("acked") == 2


def test_inboxes_put_urgent_first_then_high_normal_low_oldest_first_within(trio):
    alice, bob = trio.agent("Alice"), trio.agent("Bob")
    sent = [alice.send("Bob", f"m{i}", priority=p) for i, p in
            enumerate(["low", "normal", "urgent", "high", "normal", "urgent"])]
    trio.relay.drain()
    order = [m.id for m in bob.inbox()]
    assert order == [sent[2], sent[5], sent[3], sent[1], sent[4], sent[0]]
    assert [m.id for m in bob.inbox(limit=2)] == [sent[2], sent[5]]
    assert bob.inbox()[0].priority == "urgent"


def test_a_bad_priority_or_ack_value_fails_the_message_with_the_reason(trio):
    box = trio.state / "outbox" / "Alice"
    (box / ".a").write_text("TO: Bob\nPRIORITY: soon\n\nx")
    os.rename(box / ".a", box / "a")
    (box / ".b").write_text('{"to": "Bob", "ack_required": "maybe", "body": "x"}')
    os.rename(box / ".b", box / "b")
    trio.relay.drain()
    errors = [r["error"] for r in trio.relay.history.audit(status="failed")]
    assert any("PRIORITY 'soon' is not one of urgent, high, normal, low" in e for e in errors)
    assert any("ACK 'maybe'" in e for e in errors)
    with pytest.raises(relay.RelayError, match="PRIORITY 'soon'"):
        trio.agent("Alice").send("Bob", "x", priority="soon")


def test_overdue_lists_unacknowledged_copies_past_the_limit_and_the_stop_check_names_them(trio):
    alice, bob = trio.agent("Alice"), trio.agent("Bob")
    asked = alice.send(["Bob", "Carol"], "sign off?", ack_required=True)
    alice.send("Bob", "fyi")
    trio.relay.drain()
    assert [u["id"] for u in bob.unacknowledged()] == [asked]
    history = trio.relay.history
    at = trio.clock.now
    assert history.receipts.overdue(at - 1800) == []
    late = history.receipts.overdue(at + 1, sender="Alice")
    assert [(r["id"], r["recipient"]) for r in late] == [(asked, "Bob"), (asked, "Carol")]
    bob.ack_message(asked)
    assert bob.unacknowledged() == []
    assert [r["recipient"] for r in history.receipts.overdue(at + 1)] == ["Carol"]
    assert history.receipts.overdue(at + 1, sender="Bob") == []
