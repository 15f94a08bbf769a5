"""The claim budget: being handled when relay stopped counts as an attempt. A message left
processing by a stopped relay max_retries times is quarantined at recovery with that reason,
and `relay retry` brings it back. The state a kill -9 leaves is made deterministically: the
batch dies where the ledger would record it, or right after the claim."""
import json
import sqlite3

import pytest

from relay.operator.doctor import retry


class Killed(BaseException):
    """The process dying at this instant (nothing after it runs, no handler catches it)."""


def die_before_recording(relay):
    def record(*args, **kwargs):
        raise Killed()
    relay.ledger.messages.record = record


def crash_mid_batch(project, **config):
    """One relay that claims, delivers and moves the original, then dies before it records."""
    relay = project.relay(**config)
    relay.recover()
    die_before_recording(relay)
    with pytest.raises(Killed):
        relay.step()
    relay.close()
    project.relays.remove(relay)


def row(project, **config):
    relay = project.relay(**config)
    [r] = relay.history.audit()
    return relay, r


def test_a_message_that_stops_relay_again_and_again_is_quarantined_then_retried(project):
    project.drop("Ann", "m", "TO: Ben, Cy\n\nthe poison")
    for n in (1, 2):
        crash_mid_batch(project, max_retries=3)
        relay, r = row(project, max_retries=3)
        relay.recover()
        r = relay.history.get(r["id"])
        assert (r["status"], r["interrupted"], r["retries"]) == ("pending", n, n)
        relay.close()
        project.relays.remove(relay)
    crash_mid_batch(project, max_retries=3)
    relay, r = row(project, max_retries=3)
    relay.recover()
    r = relay.history.get(r["id"])
    assert r["status"] == "failed" and r["interrupted"] == 3
    assert "relay stopped while handling it 3 times" in r["error"] and f"relay retry {r['id']}" in r["error"]
    assert (project.state / r["failed_path"]).read_text() == "TO: Ben, Cy\n\nthe poison"
    report = json.loads((project.state / f"{r['failed_path']}.error.json").read_text())
    assert "relay stopped while handling it 3 times" in report["reason"] and report["attempts"] == 3
    assert [e["event"] for e in relay.history.events(r["id"])][-1] == "failed"
    again = relay.drain()                               # not claimed again (only its bounce to Ann): relay stays up
    assert again.claimed == again.bounced == 1 and relay.history.get(r["id"])["status"] == "failed"
    # The operator brings it back; its recipients then hold it once each, as if never stopped.
    result = retry(relay.ledger, relay.layout, [r["id"]])
    assert result.lines == [f"{r['id']}: back to pending"] and result.errors == [] and result.code == 0
    assert relay.history.get(r["id"])["interrupted"] == 0
    assert relay.drain().archived == 1
    assert len(project.inbox("Ben")) == len(project.inbox("Cy")) == 1


def test_rows_left_processing_right_after_the_claim(project, clock):
    """A kill -9 between the claim and custody: the file is still in the outbox."""
    project.drop("Ann", "m", "TO: Ben\n\nx")
    for n in range(2):
        relay = project.relay(max_retries=2)
        relay.recover()
        found = [(relay.ids.new(clock.now), f.sender, f.name, f.sent_at) for f in relay.outbox.scan_all(clock.now)]
        relay.ledger.messages.register_and_claim(found, clock.now, 10, lambda s, i, name: f"archive/d/{s}/{i}--{name}")
        relay.close()
        project.relays.remove(relay)
    relay = project.relay(max_retries=2)
    assert relay.recover() == 1
    [r] = relay.history.audit()
    assert r["status"] == "failed" and "stopped while handling it 2 times" in r["error"]
    assert not (project.state / "outbox/Ann/m").exists()
    assert (project.state / r["failed_path"]).read_text() == "TO: Ben\n\nx"


def test_one_interruption_is_recovered_and_delivered(project):
    project.drop("Ann", "m", "TO: Ben\n\nonce")
    crash_mid_batch(project)
    relay, r = row(project)
    assert relay.drain().archived == 1 and len(project.inbox("Ben")) == 1
    r = relay.history.get(r["id"])
    assert (r["status"], r["interrupted"]) == ("archived", 1)


def test_with_max_retries_0_the_first_interruption_quarantines(project):
    project.drop("Ann", "m", "TO: Ben\n\nx")
    crash_mid_batch(project, max_retries=0)
    relay, r = row(project, max_retries=0)
    relay.recover()
    assert relay.history.get(r["id"])["status"] == "failed"


def test_retry_through_the_cli_brings_it_back(project, cli):
    project.drop("Ann", "m", "TO: Ben\n\nx")
    crash_mid_batch(project, max_retries=1)
    relay, r = row(project, max_retries=1)
    relay.recover()
    relay.close()
    project.relays.remove(relay)
    assert f"{r['id']}: back to pending" in cli("retry", "--failed").stdout
    assert "relayed 1 message(s)" in cli("run", "--once", "-q").stdout
    assert len(project.inbox("Ben")) == 1


def test_recovery_resets_and_quarantines_only_rows_still_processing(project, clock):
    """Recovery's rows were read before its transaction: one that left processing since (an
    operator's command, another relay) is left as it is."""
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nx")
    relay.drain()
    [before] = relay.history.audit()
    assert before["status"] == "archived"
    relay.ledger.messages.reset([(before["id"], True)], clock.now)
    relay.ledger.messages.reset([], clock.now, stopped=[(before["id"], "stopped", f"failed/Ann/{before['id']}--m")])
    after = relay.history.get(before["id"])
    assert {k: after[k] for k in ("status", "retries", "interrupted", "archive_path", "error")} == \
        {k: before[k] for k in ("status", "retries", "interrupted", "archive_path", "error")}


def test_requeue_brings_back_only_failed_messages(project, clock):
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nx")
    project.drop("Ann", "bad", "TO: Nobody\n\nx")
    relay.drain()
    rows = {r["name"]: r for r in relay.history.audit()}
    assert (rows["m"]["status"], rows["bad"]["status"]) == ("archived", "failed")
    done = relay.ledger.operations.requeue([rows["m"]["id"], rows["bad"]["id"]], clock.now, "operator")
    assert done == [rows["bad"]["id"]]
    assert relay.history.get(rows["m"]["id"])["status"] == "archived"
    assert relay.history.get(rows["bad"]["id"])["status"] == "pending"


def test_killed_while_recovery_quarantines_it(project):
    """A kill -9 after recovery moved the file to failed/ but before the ledger said so: the next
    recovery finds it there, decides the same, and records it once."""
    project.drop("Ann", "m", "TO: Ben\n\nx")
    crash_mid_batch(project, max_retries=1)
    relay, r = row(project, max_retries=1)

    def reset(*args, **kwargs):
        raise Killed()
    relay.ledger.messages.reset = reset
    with pytest.raises(Killed):
        relay.recover()
    assert (project.state / f"failed/Ann/{r['id']}--m").exists()
    assert relay.history.get(r["id"])["status"] == "processing"
    relay.close()
    project.relays.remove(relay)
    relay, _ = row(project, max_retries=1)
    relay.recover()
    r = relay.history.get(r["id"])
    assert (r["status"], r["interrupted"]) == ("failed", 1) and "relay stopped while handling it once" in r["error"]
    assert sorted(p.name for p in (project.state / "failed/Ann").iterdir()) == [f"{r['id']}--m",
                                                                              f"{r['id']}--m.error.json"]
    assert not list((project.state / "spool").rglob("*--m"))


def test_the_claim_budget_quarantines_the_message_that_stops_relay_not_its_batch(project):
    """Every row of a batch a crash interrupted counted the interruption, so a message that
    kills relay took the whole batch into failed/ with it after max_retries crashes: innocent
    messages quarantined as 'it may be what stops relay'. A message interrupted before is now
    claimed alone, so the interruptions land on the one that causes them."""
    for n in range(4):
        project.drop("Ann", f"m{n}", f"TO: Ben\n\nmessage {n}")
    project.drop("Ann", "poison", "TO: Ben\n\nthe one that kills relay")
    for run in range(6):
        relay = project.relay(max_retries="3")
        real = relay.ledger.messages.record

        def record(now, outcomes, *args, real=real, **kwargs):
            if any(o.message is not None and o.message.body == "the one that kills relay" for o in outcomes):
                raise Killed()
            return real(now, outcomes, *args, **kwargs)
        relay.ledger.messages.record = record
        try:
            relay.drain()
        except Killed:
            pass
        relay.close()
        project.relays.remove(relay)
    relay = project.relay(max_retries="3")
    rows = {r["name"]: r for r in relay.history.audit()}
    assert rows["poison"]["status"] == "failed" and "relay stopped while handling it 3 times" in rows["poison"]["error"]
    assert {n: rows[f"m{n}"]["status"] for n in range(4)} == dict.fromkeys(range(4), "archived")
    got = sorted(m["body"] for m in project.inbox("Ben"))     # (the poison's envelope made it before each crash)
    assert [b for b in got if b.startswith("message")] == [f"message {n}" for n in range(4)]


def test_a_step_that_fails_on_the_ledger_does_not_spend_the_claim_budget(project):
    """After a failed step of the daemon's loop (the ledger locked past busy_timeout, its disk
    full for a moment) the loop recovers what the step had claimed, and that recovery counted an
    interruption, as if relay had been killed: three such moments quarantined the batch with
    'relay stopped while handling it 3 times', in seconds, where a transient failure is retried
    for retry_period. Only a stopped relay (recovery at start) spends the claim budget."""
    relay = project.relay(max_retries="3")
    relay.step_pause = 0.0
    relay.recover()
    project.drop("Ann", "m", "TO: Ben\n\nx")
    real = relay.ledger.messages.record
    fails = {"left": 4}

    def record(*args, **kwargs):
        if fails["left"]:
            fails["left"] -= 1
            raise sqlite3.OperationalError("database is locked")
        return real(*args, **kwargs)
    relay.ledger.messages.record = record
    for _ in range(4):
        relay.hint("rescan")
        relay.guarded_step()
    relay.hint("rescan")
    relay.guarded_step()
    [row] = relay.history.audit()
    assert (row["status"], row["interrupted"]) == ("archived", 0)
    assert [m["body"] for m in project.inbox("Ben")] == ["x"]


def test_a_message_past_its_claim_budget_whose_file_cannot_be_quarantined_goes_back_to_pending(
        project, monkeypatch, caplog):
    import errno
    project.drop("Ann", "m", "TO: Ben, Cy\n\nthe poison")
    for n in range(3):
        crash_mid_batch(project, max_retries=3)
        relay, r = row(project, max_retries=3)
        if n < 2:                           # the first two stops: back to pending, as the test above shows
            relay.recover()
            relay.close()
            project.relays.remove(relay)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(relay.archive, "quarantine", full)
    relay.recover()
    r = relay.history.get(r["id"])
    assert r["status"] == "pending" and r["failed_path"] is None
    assert f"{r['id']}: cannot quarantine its file" in caplog.text and "back to pending" in caplog.text
    assert not list((project.state / "failed").rglob("*--m"))
