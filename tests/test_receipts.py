"""Receipts, acknowledgements and priority (contract §3): each recipient's copy moves through
delivered, surfaced, read and acknowledged, each step seen by the sender with its time; a plain
Maildir client's rename from new/ to cur/ is noticed by the daemon; urgent mail comes first."""
import json
import os
import threading
import time

import pytest
from mcp_client import deliver, until

import relay
from relay.errors import NotFound


@pytest.fixture
def trio(crew, project):
    """Alice, Bob and Carol as relay.Agents, and `trio.relay`: a daemon's pipeline on the same clock."""
    crew.relay = project.relay(agents=("Alice", "Bob", "Carol"))
    return crew


@pytest.fixture
def shell(cli, project):
    """Alice, Bob and Carol made through the CLI; `project` drives the relay."""
    cli("init", "--agent", "Alice", "--agent", "Bob", "--agent", "Carol")
    return project


def read_by_rename(trio, name, mid):
    """`name`'s Maildir client marks message `mid` read itself: new/ -> cur/ with the S flag."""
    box = trio.state / "inbox" / name
    os.rename(box / "new" / f"{mid}.json", box / "cur" / f"{mid}.json:2,S")


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
    read_by_rename(trio, "Carol", mid)
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


# -- the daemon's noticing of reads (core/reads.py) ---------------------------------------------


def _read_at(trio, mid, name):
    return steps(trio.agent("Alice").receipts(mid), name)["read_at"]


@pytest.mark.parametrize("fault", ["link", "file", "gone"])
def test_a_failed_look_at_new_records_no_read_and_the_ids_stay_watched(trio, fault):
    alice = trio.agent("Alice")
    sent = [alice.send("Bob", f"m{i}") for i in range(3)]
    trio.relay.drain()
    new = trio.state / "inbox" / "Bob" / "new"
    real = new.with_name("new.real")
    os.rename(new, real)
    if fault == "link":
        os.symlink("new.real", new)
    elif fault == "file":
        new.write_text("not a directory")
    trio.relay.step(trio.clock.advance(2))
    trio.relay.step(trio.clock.advance(2))
    assert [_read_at(trio, mid, "Bob") for mid in sent] == [None, None, None]
    new.unlink(missing_ok=True)
    os.rename(real, new)
    trio.relay.step(trio.clock.advance(2))
    assert [_read_at(trio, mid, "Bob") for mid in sent] == [None, None, None]
    os.rename(new / f"{sent[1]}.json", new.with_name("cur") / f"{sent[1]}.json:2,S")
    trio.relay.step(trio.clock.advance(2))          # still watched: the read is noticed once it happens
    assert [_read_at(trio, mid, "Bob") is not None for mid in sent] == [False, True, False]


def test_noticing_reads_costs_the_watched_ids_not_what_else_is_planted_in_new(trio):
    alice = trio.agent("Alice")
    bob_mid, carol_mid = alice.send("Bob", "real"), alice.send("Carol", "real")
    trio.relay.drain()
    new = trio.state / "inbox" / "Bob" / "new"
    for i in range(300):
        (new / f"zz{i:07d}.json").write_bytes(b"")
    reads = trio.relay.reads
    reads.looked = 0
    trio.relay.step(trio.clock.advance(2))
    assert reads.looked == 2            # one name each for Bob's and Carol's one watched envelope
    box = trio.state / "inbox" / "Carol"
    os.rename(box / "new" / f"{carol_mid}.json", box / "cur" / f"{carol_mid}.json:2,S")
    trio.relay.step(trio.clock.advance(2))
    assert _read_at(trio, carol_mid, "Carol") is not None and _read_at(trio, bob_mid, "Bob") is None


def test_noticing_reads_is_bounded_per_look_and_goes_round_the_recipients(trio):
    alice = trio.agent("Alice")
    bobs = [alice.send("Bob", f"b{i}") for i in range(6)]
    carol_mid = alice.send("Carol", "c")
    trio.relay.drain()
    for name, mid in (("Carol", carol_mid), ("Bob", bobs[5])):
        read_by_rename(trio, name, mid)
    reads = trio.relay.reads
    reads.budget = 3
    looks = []
    for _ in range(3):
        reads.looked = 0
        trio.relay.step(trio.clock.advance(2))
        looks.append(reads.looked)
        if len(looks) == 1:             # Bob's six do not keep Carol waiting
            assert _read_at(trio, carol_mid, "Carol") is not None
    assert looks == [3, 3, 3]
    assert _read_at(trio, bobs[5], "Bob") is not None       # Bob's ids taken in turn, three a look
    assert [_read_at(trio, mid, "Bob") for mid in bobs[:5]] == [None] * 5


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


def test_a_note_of_64_kib_in_utf8_is_taken_and_one_byte_more_is_refused(trio):
    alice, bob = trio.agent("Alice"), trio.agent("Bob")
    mid = alice.send("Bob", "sign off?", ack_required=True)
    trio.relay.drain()
    for note in ("x" * 65537, "\u00e9" * 32768 + "x"):
        with pytest.raises(relay.RelayError, match="the note must be text of at most 65536 bytes"):
            bob.ack_message(mid, note=note)
    assert bob.ack_message(mid, note="\u00e9" * 32768)["acked"] is True


def test_overdue_lists_unacknowledged_copies_past_the_limit_and_the_stop_check_names_them(trio):
    alice, bob = trio.agent("Alice"), trio.agent("Bob")
    asked = alice.send(["Bob", "Carol"], "sign off?", ack_required=True)
    alice.send("Bob", "fyi")
    alice.send("Bob", "fyi, quickly", priority="urgent")       # a priority alone asks for no acknowledgement
    trio.relay.drain()
    assert [u["id"] for u in bob.unacknowledged()] == [asked]
    [waiting] = bob.unacknowledged()            # its time in ISO 8601, as the receipts show it
    assert waiting["delivered_at"] == steps(alice.receipts(asked), "Bob")["delivered_at"]
    assert isinstance(waiting["delivered_at"], str) and waiting["delivered_at"].endswith("Z")
    history = trio.relay.history
    at = trio.clock.now
    assert history.receipts.overdue(at - 1800) == []
    late = history.receipts.overdue(at + 1, sender="Alice")
    assert [(r["id"], r["recipient"]) for r in late] == [(asked, "Bob"), (asked, "Carol")]
    bob.ack_message(asked)
    assert bob.unacknowledged() == []
    assert [r["recipient"] for r in history.receipts.overdue(at + 1)] == ["Carol"]
    assert history.receipts.overdue(at + 1, sender="Bob") == []


def test_the_counts_and_lists_of_copies_leave_out_the_acknowledged_and_the_read(trio):
    alice, bob, carol = trio.agent("Alice"), trio.agent("Bob"), trio.agent("Carol")
    asked = alice.send(["Bob", "Carol"], "sign off?", ack_required=True)
    later = [alice.send("Bob", f"fyi {i}") for i in range(2)]
    trio.relay.drain()
    history, at = trio.relay.history, trio.clock.now
    assert history.receipts.overdue_count(at + 1) == 2
    bob.ack_message(asked)                                  # acknowledged, so read too
    assert history.receipts.overdue_count(at + 1) == 1
    assert history.receipts.unread_since(asked) == [(asked, "Carol")] + [(mid, "Bob") for mid in later]
    assert history.receipts.unread_of("Bob", window=2) == later       # the newest two deliveries to Bob
    assert history.receipts.unread_of("Bob", window=3) == later
    assert history.receipts.unread_of("Bob", limit=1) == later[1:]
    assert history.receipts.unread_of("Carol") == [asked]


# -- from the shell ---------------------------------------------------------------------------

def _written(project, agent="Alice"):
    box = project.state / "outbox" / agent
    until(lambda: any(p.name.startswith("msg-") for p in box.iterdir()), "the message is written")


def test_send_wait_read_exits_0_once_both_read_it_one_by_a_maildir_rename(shell, cli):
    def recipients_read():
        _written(shell)
        deliver(shell, ("Alice", "Bob", "Carol"))
        bob = relay.Agent("Bob", root=shell.root)
        bob.inbox(ack=True)
        bob.close()
        box = shell.state / "inbox" / "Carol"
        [env] = list((box / "new").iterdir())
        os.rename(env, box / "cur" / f"{env.name}:2,S")
        deliver(shell, ("Alice", "Bob", "Carol"))     # a daemon's pass notices the rename
    t = threading.Thread(target=recipients_read)
    t.start()
    r = cli("send", "--from", "Alice", "--to", "Bob,Carol", "--wait-read", "30", "hello")
    t.join()
    assert r.exit_code == 0 and r.stdout.strip()


def test_send_wait_acked_exits_0_once_both_acknowledged_and_124_while_one_has_not(shell, cli):
    def acknowledge(names):
        _written(shell)
        deliver(shell, ("Alice", "Bob", "Carol"))
        for name in names:
            me = relay.Agent(name, root=shell.root)
            [m] = me.inbox()
            me.ack_message(m.id)
            me.close()
    t = threading.Thread(target=acknowledge, args=(["Bob", "Carol"],))
    t.start()
    r = cli("send", "--from", "Alice", "--to", "Bob,Carol", "--ack-required", "--wait-acked", "30", "sign off?")
    t.join()
    assert r.exit_code == 0
    t = threading.Thread(target=acknowledge, args=(["Bob"],))
    t.start()
    r = cli("send", "--from", "Alice", "--to", "Bob,Carol", "--ack-required", "--wait-acked", "1s", "again?", ok=False)
    t.join()
    mid = r.stdout.strip()
    assert r.exit_code == 124 and f"relay: {mid} was not acknowledged by every recipient in 1s" in r.stderr
    assert "not acknowledged yet by Carol" in r.stderr


def test_send_wait_read_exits_1_with_the_reason_when_it_was_shed(shell, cli):
    with open(shell.state / "relay.toml", "a") as f:
        f.write("\nqueue_limit = 1\n")
    cli("send", "--from", "Alice", "--to", "Carol", "first")
    deliver(shell, ("Alice", "Bob", "Carol"))          # Carol's new/ is full now
    t = threading.Thread(target=lambda: (_written(shell), deliver(shell, ("Alice", "Bob", "Carol"))))
    t.start()
    r = cli("send", "--from", "Alice", "--to", "Carol", "--wait-read", "30", "second", ok=False)
    t.join()
    assert r.exit_code == 1 and "was not delivered: shed for Carol (queue_limit: " in r.stderr


def test_relay_ack_overdue_status_and_show_from_the_shell(shell, cli, monkeypatch):
    mid = cli("send", "--from", "Alice", "--to", "Bob,Carol", "--ack-required", "--priority", "high",
              "--subject", "sign off", "ship it?").stdout.strip()
    past = time.time() - 7210                 # delivered two hours ago: past ack_overdue (30m)
    for f in (shell.state / "outbox" / "Alice").iterdir():
        os.utime(f, (past, past))
    shell.clock.now = past + 10
    r = shell.relay(agents=("Alice", "Bob", "Carol"))
    r.drain()
    out = cli("overdue", "--agent", "Alice").stdout
    assert f"{mid}  Alice -> Bob  waiting 2h" in out and f"{mid}  Alice -> Carol" in out
    assert json.loads(cli("status", "--json").stdout)["acks_overdue"] == 2
    assert cli("overdue", "--agent", "Bob").stdout.startswith("no acknowledgement waits longer than 30m")
    monkeypatch.setenv("RELAY_AGENT", "Bob")         # an agent's shell: its own messages only
    assert cli("overdue").stdout.startswith("no acknowledgement waits longer than 30m")
    monkeypatch.setenv("RELAY_AGENT", "Alice")
    assert f"{mid}  Alice -> Bob  waiting 2h" in cli("overdue").stdout
    monkeypatch.delenv("RELAY_AGENT")
    done = cli("ack", mid, "--agent", "Bob", "--note", "shipped").stdout
    assert f"{mid}: acknowledged; the note went back as " in done
    assert cli("ack", mid, "--agent", "Bob").stdout.strip() == f"{mid}: acknowledged before; nothing sent again"
    rows = json.loads(cli("overdue", "--json").stdout)
    assert [(x["id"], x["recipient"]) for x in rows] == [(mid, "Carol")]
    shown = cli("show", mid).stdout
    assert "priority       high" in shown and "ack_required   yes" in shown and "note: shipped" in shown
    doc = json.loads(cli("show", mid, "--json").stdout)
    bob = next(x for x in doc["receipts"] if x["recipient"] == "Bob")
    assert bob["acked_at"] and bob["read_at"] and bob["note"] == "shipped"
    assert "receipts" not in json.loads(cli("show", mid, "--agent", "Bob", "--json").stdout)   # the sender's only
    r = cli("ack", "01KC0000000000000000000000", "--agent", "Bob", ok=False)
    assert r.exit_code == 1 and "relay: no message" in r.stderr and "Traceback" not in r.output


def test_an_ack_whose_note_cannot_go_marks_nothing_and_a_thread_of_two_lines_is_answered_in_the_messages_own(
        shell, cli):
    """A JSON message may carry a thread of two lines, which no reply can name: the note goes
    back in the message's own thread (its id). A note that cannot go (its sender archived since)
    leaves the copy unread and unacknowledged, and the ack can be given again without it."""
    for i, thread in enumerate(("plan\nB", "plan\rC")):
        (shell.state / "outbox" / "Alice" / f"m{i}.json").write_text(json.dumps(
            {"to": ["Bob"], "body": f"two-line thread {i}", "thread": thread, "ack_required": True}))
    r = shell.relay(agents=("Alice", "Bob", "Carol"))
    r.drain()
    with relay.Agent("Bob", root=shell.root) as bob:
        first, second = bob.inbox()
    done = cli("ack", first.id, "--agent", "Bob", "--note", "seen").stdout
    assert f"{first.id}: acknowledged; the note went back as " in done
    r.drain()
    with relay.Agent("Alice", root=shell.root) as alice:
        [note] = alice.inbox()
    assert (note.body, note.thread) == ("seen", first.id)
    cli("archive-agent", "Alice")
    refused = cli("ack", second.id, "--agent", "Bob", "--note", "seen", ok=False)
    assert refused.exit_code == 1 and "Alice" in refused.stderr and "Traceback" not in refused.output
    with relay.Agent("Bob", root=shell.root) as bob:
        assert [m.id for m in bob.inbox()] == [second.id]                  # still unread
    assert cli("ack", second.id, "--agent", "Bob").stdout.strip() == f"{second.id}: acknowledged"


def test_status_counts_as_overdue_only_what_waits_longer_than_ack_overdue(shell, cli):
    cli("send", "--from", "Alice", "--to", "Bob", "--ack-required", "just now")
    r = shell.relay(agents=("Alice", "Bob", "Carol"))
    r.drain()
    assert json.loads(cli("status", "--json").stdout)["acks_overdue"] == 0
    assert cli("overdue").stdout.startswith("no acknowledgement waits longer than 30m")


def test_inbox_from_the_shell_puts_urgent_first(shell, cli):
    low = cli("send", "--from", "Alice", "--to", "Bob", "--priority", "low", "later").stdout.strip()
    urgent = cli("send", "--from", "Alice", "--to", "Bob", "--priority", "urgent", "now").stdout.strip()
    deliver(shell, ("Alice", "Bob", "Carol"))
    got = json.loads(cli("inbox", "Bob", "--json").stdout)
    assert [m["id"] for m in got] == [urgent, low] and got[0]["priority"] == "urgent"


# -- over MCP ---------------------------------------------------------------------------------

def test_mcp_send_with_priority_and_ack_then_acknowledge_and_receipts(crew, project):
    anyio = pytest.importorskip("anyio")
    from relay.agent import mcp_server
    alice = mcp_server.build(relay.Agent("Alice", root=project.root))
    bob = mcp_server.build(relay.Agent("Bob", root=project.root))

    async def call(server, tool, **args):
        return (await server.call_tool(tool, args)).structured_content

    async def main():
        low = (await call(alice, "send", to="Bob", body="later", priority="low"))["id"]
        asked = (await call(alice, "send", to="Bob,Carol", body="ship?", subject="ship", ack_required=True,
                            priority="urgent"))["id"]
        deliver(project, ("Alice", "Bob", "Carol"))
        got = await call(bob, "inbox")
        assert [m["id"] for m in got["messages"]] == [asked, low]
        assert got["messages"][0]["priority"] == "urgent" and got["messages"][0]["ack_required"] is True
        done = await call(bob, "acknowledge", id=asked, note="shipped")
        assert done["acked"] is True and done["reply_id"]
        seen = await call(alice, "receipts", id=asked, wait_for="acked", wait_s=0)
        assert seen["done"] is None and seen["timed_out"] is True       # Carol has not
        rows = {r["recipient"]: r for r in seen["recipients"]}
        assert rows["Bob"]["acked_at"] and rows["Bob"]["note"] == "shipped" and rows["Carol"]["acked_at"] is None
        assert rows["Bob"]["surfaced_at"] and rows["Bob"]["read_at"]
        with pytest.raises(Exception, match="that Bob sent"):
            await call(bob, "receipts", id=asked)
    anyio.run(main)


@pytest.mark.parametrize("seconds, said", [(-5, "0s"), (59.9, "59s"), (60, "1m"), (3599, "59m"), (3600, "1h00m"),
                                           (86399, "23h59m"), (86400, "1d0h"), (90000, "1d1h")])
def test_relay_overdue_says_how_long_a_copy_waits_in_its_largest_units(seconds, said):
    from relay.cli import receipts
    assert receipts._age(seconds) == said


def test_each_step_keeps_the_time_it_first_happened_when_a_later_one_is_recorded(trio):
    """Surfaced, read and acknowledged at three times: each keeps its own, a later step never
    moves an earlier one (it fills only the earlier steps that have no time yet)."""
    alice, bob = trio.agent("Alice"), trio.agent("Bob")
    mid = alice.send("Bob", "merge it?", ack_required=True)
    trio.relay.drain()
    delivered = steps(alice.receipts(mid), "Bob")["delivered_at"]
    trio.clock.advance(5)
    [m] = bob.inbox()                               # surfaced
    trio.clock.advance(5)
    bob.ack([m])                                    # read
    trio.clock.advance(5)
    assert bob.ack_message(mid)["acked"] is True    # acknowledged
    s = steps(alice.receipts(mid), "Bob")
    times = [s["delivered_at"], s["surfaced_at"], s["read_at"], s["acked_at"]]
    assert times[0] == delivered and times == sorted(times) and len(set(times)) == 4, s


def test_waiting_for_receipts_takes_only_read_or_acked_and_a_time_of_zero_or_more(trio):
    alice = trio.agent("Alice")
    mid = alice.send("Bob", "hello")
    for step in ("delivered", "surfaced", "Read", None):
        with pytest.raises(relay.RelayError) as e:
            alice.wait_receipts(mid, step, 0)
        assert str(e.value) == f"the step to wait for is 'read' or 'acked', not {step!r}"
    for timeout in (-1, -0.001, float("nan")):
        with pytest.raises(relay.RelayError) as e:
            alice.wait_receipts(mid, "read", timeout)
        assert str(e.value) == f"the time to wait must be a number of seconds, not {timeout!r}"


def test_a_wait_for_receipts_that_runs_out_says_who_has_not_read_or_acknowledged_yet(trio):
    alice, bob, carol = trio.agent("Alice"), trio.agent("Bob"), trio.agent("Carol")
    mid = alice.send(["Bob", "Carol"], "sign off?", ack_required=True)
    with pytest.raises(relay.errors.DeliveryTimeout) as e:
        alice.wait_receipts(mid, "read", 0)
    assert str(e.value).startswith(f"{mid} was not delivered to every recipient in 0s: not delivered yet (")
    trio.relay.drain()
    with pytest.raises(relay.errors.DeliveryTimeout) as e:
        alice.wait_receipts(mid, "read", 0)
    assert str(e.value) == f"{mid} was not delivered to every recipient in 0s: not read yet by Bob, Carol"
    bob.ack(bob.inbox())
    with pytest.raises(relay.errors.DeliveryTimeout) as e:
        alice.wait_receipts(mid, "read", 0)
    assert e.value.reason == "not read yet by Carol"
    with pytest.raises(relay.errors.DeliveryTimeout) as e:
        alice.wait_receipts(mid, "acked", 0)
    assert e.value.reason == "not acknowledged yet by Bob, Carol"
    carol.ack_message(mid)                                  # acknowledged: read as well
    assert alice.wait_receipts(mid, "read", 0) is None
    with pytest.raises(relay.errors.DeliveryTimeout) as e:
        alice.wait_receipts(mid, "acked", 0)
    assert e.value.reason == "not acknowledged yet by Bob"
    bob.ack_message(mid)
    assert alice.wait_receipts(mid, "acked", 0) is None and alice.wait_receipts(mid, "read") is None


def test_a_wait_for_receipts_of_a_message_that_failed_says_why_at_once(trio):
    alice = trio.agent("Alice")
    box = trio.state / "outbox" / "Alice"
    (box / ".z").write_text("TO: Zed\n\nto no one")
    os.rename(box / ".z", box / "z")
    trio.relay.drain()
    [row] = trio.relay.history.audit(status="failed")
    mid = row["id"]
    with pytest.raises(relay.errors.NotDelivered) as e:
        alice.wait_receipts(mid, "read")                    # for ever: it failed, so no wait
    assert not e.value.timed_out and str(e.value).startswith(f"{mid} was not delivered: ")
    assert "Zed" in e.value.reason


def test_the_receipts_of_a_message_another_agent_sent_are_not_found(trio):
    alice, bob = trio.agent("Alice"), trio.agent("Bob")
    mid = alice.send("Bob", "hello")
    with pytest.raises(NotFound) as e:
        bob.receipts(mid)                   # still in Alice's outbox
    assert str(e.value) == f"no message {mid!r} that Bob sent"
    trio.relay.drain()
    with pytest.raises(NotFound) as e:
        bob.receipts(mid)                   # delivered to Bob, sent by Alice
    assert str(e.value) == f"no message {mid!r} that Bob sent"
    assert alice.receipts(mid)["status"] == "archived"


def test_a_look_whose_budget_is_spent_leaves_the_next_recipient_first_for_the_next_look(trio):
    """A budget of one name a look, two recipients: a look takes one name of the first and
    stops; the next begins with the other recipient, not the first again."""
    alice = trio.agent("Alice")
    bobs = [alice.send("Bob", f"b{i}") for i in range(2)]
    carol_mid = alice.send("Carol", "c")
    trio.relay.drain()
    for name, mid in (("Carol", carol_mid), ("Bob", bobs[1])):
        read_by_rename(trio, name, mid)
    reads = trio.relay.reads
    reads.budget = 1
    reads.looked = 0
    trio.relay.step(trio.clock.advance(2))
    assert reads.looked == 1
    assert (_read_at(trio, carol_mid, "Carol"), _read_at(trio, bobs[1], "Bob")) == (None, None)
    trio.relay.step(trio.clock.advance(2))
    assert reads.looked == 2
    assert _read_at(trio, carol_mid, "Carol") is not None and _read_at(trio, bobs[1], "Bob") is None
    trio.relay.step(trio.clock.advance(2))
    assert _read_at(trio, bobs[1], "Bob") is not None and _read_at(trio, bobs[0], "Bob") is None


@pytest.mark.parametrize("flag, step, wait, waited", [("--wait-read", "read", "0", "0s"),
                                                       ("--wait-acked", "acknowledged", "0", "0s"),
                                                       ("--wait-read", "read", "0.25", "250ms")])
def test_send_waiting_for_a_step_with_no_daemon_times_out_naming_the_step_and_the_missing_daemon(
        shell, cli, flag, step, wait, waited):
    r = cli("send", "--from", "Alice", "--to", "Bob", "--ack-required", flag, wait, "hello", ok=False)
    assert r.exit_code == 124
    mid = r.stdout.strip()
    assert r.stderr.strip() == (f"relay: {mid} was not {step} by every recipient in {waited} (not delivered yet "
                                "(relay has not taken it from the outbox yet); no relay daemon is running)")


def test_a_copy_delivered_exactly_at_the_cutoff_is_overdue_and_one_a_moment_later_is_not(trio):
    alice = trio.agent("Alice")
    asked = alice.send("Bob", "sign off?", ack_required=True)
    trio.relay.drain()
    history = trio.relay.history
    [d] = [r for r in history.receipts.of(asked)]
    at = d["delivered_at"]
    assert [r["id"] for r in history.receipts.overdue(at)] == [asked] and history.receipts.overdue_count(at) == 1
    assert history.receipts.overdue(at - 0.001) == [] and history.receipts.overdue_count(at - 0.001) == 0


def test_a_step_recorded_before_the_delivery_is_dated_at_it_and_a_later_step_dates_the_earlier_ones(trio):
    alice = trio.agent("Alice")
    mid = alice.send(["Bob", "Carol"], "x")
    trio.relay.drain()
    ledger, history = trio.relay.ledger, trio.relay.history
    at = {r["recipient"]: r["delivered_at"] for r in history.receipts.of(mid)}
    assert ledger.receipts.step("read", [(mid, "Bob", at["Bob"] - 100)], at["Bob"] + 5) == [(mid, "Bob")]
    assert ledger.receipts.step("read", [(mid, "Bob")], at["Bob"] + 9) == []        # once, at its first time
    assert ledger.receipts.step("surfaced", [(mid, "Nobody")], at["Bob"] + 9) == []   # no delivered copy
    assert ledger.receipts.acked(mid, "Carol", at["Carol"] + 7, note="ok") is True
    assert ledger.receipts.acked(mid, "Carol", at["Carol"] + 8) is False
    got = {r["recipient"]: r for r in history.receipts.of(mid)}
    assert (got["Bob"]["surfaced_at"], got["Bob"]["read_at"], got["Bob"]["acked_at"]) == (at["Bob"], at["Bob"], None)
    assert (got["Carol"]["surfaced_at"], got["Carol"]["read_at"], got["Carol"]["acked_at"], got["Carol"]["note"]) == (
        at["Carol"] + 7, at["Carol"] + 7, at["Carol"] + 7, "ok")


@pytest.mark.parametrize("flag", ["--wait-read", "--wait-acked", "--wait-delivered"])
def test_a_wait_flag_followed_by_a_body_must_be_a_duration_and_names_itself_when_not(shell, cli, flag):
    r = cli("send", "--from", "Alice", "--to", "Bob", flag, "soon", "hello", ok=False)
    assert r.exit_code == 2 and r.output.splitlines()[-1] == (
        f"relay: Invalid value for {flag}: 'soon' is not a duration (use e.g. 250ms, 90s, 15m, 12h, 7d) (or a bare "
        "number of seconds)")
    assert list((cli.state / "outbox" / "Alice").iterdir()) == []


def test_the_web_views_priority_filter_takes_a_message_asking_none_for_normal(trio):
    alice = trio.agent("Alice")
    sent = {p: alice.send("Bob", f"{p} one", priority=p) for p in ("urgent", "high", "normal", "low")}
    acked = alice.send("Bob", "normal, asks for an ack", ack_required=True)
    trio.relay.drain()
    web = trio.relay.history.web
    for p in ("urgent", "high", "low"):
        assert [r["id"] for r in web.messages(priority=p)] == [sent[p]]
    assert sorted(r["id"] for r in web.messages(priority="normal")) == sorted([sent["normal"], acked])
    assert len(web.messages()) == 5


def test_reads_are_looked_for_once_a_second_at_most_and_only_while_some_are_awaited(trio):
    alice = trio.agent("Alice")
    mid = alice.send("Bob", "x")
    trio.relay.drain()
    reads = trio.relay.reads
    t = trio.clock.advance(5)
    trio.relay.step(t)
    assert reads.due() == t + 1.0                   # Bob's copy is awaited
    reads.looked = 0
    trio.relay.step(t + 0.5)
    assert reads.looked == 0                        # within the second: no look
    read_by_rename(trio, "Bob", mid)
    trio.relay.step(t + 1.0)                        # exactly a second later: a look
    assert reads.looked == 1 and _read_at(trio, mid, "Bob") is not None
    assert reads.due() is None                      # nothing awaited: no deadline of its own


def test_relay_ack_without_a_note_says_acknowledged_alone_and_json_says_no_reply(shell, cli):
    first = cli("send", "--from", "Alice", "--to", "Bob", "--ack-required", "sign off?").stdout.strip()
    second = cli("send", "--from", "Alice", "--to", "Bob", "and this?").stdout.strip()
    cli("run", "--once", "-q")
    assert cli("ack", first, "--agent", "Bob").stdout == f"{first}: acknowledged\n"
    assert json.loads(cli("ack", second, "--agent", "Bob", "--json").stdout) == {"id": second, "acked": True,
                                                                                  "reply_id": None}
    assert json.loads(cli("ack", second, "--agent", "Bob", "--json").stdout)["acked"] is False


def test_an_acknowledgement_keeps_a_reply_id_given_without_a_note_and_a_note_given_without_a_reply(trio):
    alice = trio.agent("Alice")
    mid = alice.send(["Bob", "Carol"], "x", ack_required=True)
    trio.relay.drain()
    ledger, history = trio.relay.ledger, trio.relay.history
    at = {r["recipient"]: r["delivered_at"] for r in history.receipts.of(mid)}
    reply = "01" + "Z" * 24
    assert ledger.receipts.acked(mid, "Bob", at["Bob"] + 1, reply_id=reply) is True
    assert ledger.receipts.acked(mid, "Carol", at["Carol"] + 1, note="fine") is True
    got = {r["recipient"]: (r["note"], r["reply_id"]) for r in history.receipts.of(mid)}
    assert got == {"Bob": (None, reply), "Carol": ("fine", None)}


def test_a_message_asks_for_something_when_its_priority_is_not_normal_or_it_wants_an_ack_and_only_then(trio):
    alice = trio.agent("Alice")
    plain = alice.send("Bob", "plain")
    urgent = alice.send("Bob", "now", priority="urgent")
    low = alice.send("Bob", "later", priority="low")
    acked = alice.send("Bob", "sign off", ack_required=True)
    both = alice.send("Bob", "both", priority="high", ack_required=True)
    trio.relay.drain()
    receipts = trio.relay.history.receipts
    assert [receipts.asks(m) for m in (plain, urgent, low, acked, both)] == [
        ("normal", False), ("urgent", False), ("low", False), ("normal", True), ("high", True)]
    assert receipts.priorities([plain, urgent, low, acked, both]) == {urgent: "urgent", low: "low", both: "high"}
    rows = trio.relay.ledger.db.execute("SELECT message_id FROM asks ORDER BY message_id").fetchall()
    assert sorted(r[0] for r in rows) == sorted([urgent, low, acked, both])


def test_an_ack_of_a_planted_envelope_the_ledger_never_delivered_to_the_agent_is_refused(trio):
    alice, bob = trio.agent("Alice"), trio.agent("Bob")
    mid = alice.send("Bob", "sign off?", ack_required=True)
    other = alice.send("Carol", "not for Bob", ack_required=True)
    trio.relay.drain()
    new = trio.state / "inbox" / "Bob" / "new"
    doc = json.loads((new / f"{mid}.json").read_text())
    (new / f"{other}.json").write_text(json.dumps({**doc, "id": other}))     # planted: relay never gave it Bob
    with pytest.raises(relay.RelayError) as e:
        bob.ack_message(other)
    assert str(e.value) == f"the ledger records no delivery of {other} to Bob yet; try again in a moment"
    assert (new / f"{other}.json").exists()                                 # not marked read
    assert bob.ack_message(mid)["acked"] is True                            # its own copy: acknowledged


@pytest.mark.parametrize("flag", ["--wait-read", "--wait-acked"])
def test_a_step_wait_given_no_duration_but_the_body_takes_it_as_the_body_and_waits_for_ever(shell, cli, flag):
    """`--wait-read "the body"` (no BODY after it): the words are the body, the wait for ever; a
    --wait-delivered of 0 before it ends the command first, so the message is seen as sent."""
    r = cli("send", "--from", "Alice", "--to", "Bob", "--wait-delivered", "0", flag, "the body itself", ok=False)
    assert r.exit_code == 124
    mid = r.stdout.strip()
    [sent] = (cli.state / "outbox" / "Alice").iterdir()
    assert sent.name == f"msg-{mid.lower()}" and sent.read_text().endswith("\n\nthe body itself")
    assert r.stderr.splitlines() == [
        f"relay: no relay daemon is running; {mid} is delivered when one runs",
        f"relay: {mid} was not delivered to every recipient in 0s (relay has not taken it from the outbox yet; "
        "no relay daemon is running)"]


def test_overdue_says_of_each_copy_whether_it_was_read_surfaced_or_not_seen_oldest_first(shell, cli, monkeypatch):
    first = cli("send", "--from", "Alice", "--to", "Bob,Carol", "--ack-required", "--subject", "sign off",
                "ship it?").stdout.strip()
    past = time.time() - 4000                 # an hour and more ago: past ack_overdue (30m)
    for f in (shell.state / "outbox" / "Alice").iterdir():
        os.utime(f, (past, past))
    shell.clock.now = past + 10
    shell.relay(agents=("Alice", "Bob", "Carol")).drain()
    cli("inbox", "Bob", "--ack")             # Bob's copy read
    cli("inbox", "Carol")                    # Carol's shown to it, not marked read: surfaced
    second = cli("send", "--from", "Carol", "--to", "Bob", "--ack-required", "no subject here").stdout.strip()
    then = time.time() - 1910                # 31m40s ago, once settled
    for f in (shell.state / "outbox" / "Carol").iterdir():
        os.utime(f, (then, then))
    shell.clock.now = then + 10
    shell.relay(agents=("Alice", "Bob", "Carol")).drain()
    lines = cli("overdue").stdout.splitlines()
    assert lines == [f"{first}  Alice -> Bob  waiting 1h06m  (read)  sign off",
                     f"{first}  Alice -> Carol  waiting 1h06m  (surfaced)  sign off",
                     f"{second}  Carol -> Bob  waiting 31m  (not seen)"]
    rows = json.loads(cli("overdue", "--json").stdout)
    assert [(r["id"], r["recipient"]) for r in rows] == [(first, "Bob"), (first, "Carol"), (second, "Bob")]
    assert 1890 <= rows[2]["waiting_s"] <= 1990
    assert cli("overdue", "--agent", "Carol").stdout.splitlines() == lines[2:]
    monkeypatch.setenv("RELAY_ACK_OVERDUE", "1h")
    assert [r["recipient"] for r in json.loads(cli("overdue", "--json").stdout)] == ["Bob", "Carol"]


@pytest.mark.parametrize("flags", ["S", "", "RS", "FS"])
def test_a_read_is_dated_when_the_envelope_reached_cur_under_each_usual_maildir_name(trio, flags):
    alice = trio.agent("Alice")
    mid = alice.send("Bob", "m")
    trio.relay.drain()
    box = trio.state / "inbox" / "Bob"
    os.rename(box / "new" / f"{mid}.json", box / "cur" / f"{mid}.json:2,{flags}")
    now = trio.clock.advance(1000)
    trio.relay.step(now)
    read_at = _read_at(trio, mid, "Bob")
    assert read_at is not None and read_at < _read_at_of(now - 900)     # the rename's time (or its delivery's), not now


def test_an_envelope_gone_from_new_but_not_to_cur_is_read_when_relay_noticed_it(trio):
    alice = trio.agent("Alice")
    mid, other = alice.send("Bob", "m"), alice.send("Bob", "n")
    trio.relay.drain()
    box = trio.state / "inbox" / "Bob"
    (box / "new" / f"{mid}.json").unlink()
    os.rename(box / "new" / f"{other}.json", box / "cur" / f"{other}.json:2,T")     # a flag relay does not look for
    now = trio.clock.advance(1000)
    trio.relay.step(now)
    assert _read_at(trio, mid, "Bob") == _read_at(trio, other, "Bob") == _read_at_of(now)


def _read_at_of(ts):
    from relay.core.message import iso
    return iso(ts)


def test_a_second_acknowledgement_changes_neither_the_note_nor_the_reply_of_the_first(trio):
    alice = trio.agent("Alice")
    mid = alice.send("Bob", "x", ack_required=True)
    trio.relay.drain()
    ledger, history = trio.relay.ledger, trio.relay.history
    [d] = history.receipts.of(mid)
    first, second = "01" + "Y" * 24, "01" + "Z" * 24
    assert ledger.receipts.acked(mid, "Bob", d["delivered_at"] + 1, note="first", reply_id=first) is True
    assert ledger.receipts.acked(mid, "Bob", d["delivered_at"] + 2, note="second", reply_id=second) is False
    [got] = history.receipts.of(mid)
    assert (got["note"], got["reply_id"], got["acked_at"]) == ("first", first, d["delivered_at"] + 1)


@pytest.mark.parametrize("flag", ["--wait-read", "--wait-acked"])
@pytest.mark.parametrize("value", [(), ("5s",)])
def test_a_step_wait_bare_or_with_a_duration_and_no_body_argument_reads_the_body_from_stdin(shell, cli, flag, value):
    r = cli("send", "--from", "Alice", "--to", "Bob", "--wait-delivered", "0", flag, *value, input="from stdin",
            ok=False)
    assert r.exit_code == 124
    mid = r.stdout.strip()
    [sent] = (cli.state / "outbox" / "Alice").iterdir()
    assert sent.name == f"msg-{mid.lower()}" and sent.read_text().endswith("\n\nfrom stdin")
