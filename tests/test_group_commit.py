"""Group commit (daemon.py finish()): a batch's last sync runs while the next batch is claimed
and read; the batch is recorded only after that sync, and before the next batch is
admitted or written into an inbox. Driven step by step, the sync held by a seam (`submit`).
And a batch's claim and record are each a fixed number of statements, however many messages
the batch holds."""
import errno
import os
import sqlite3

import pytest
from conftest import failing_create

from relay.core.daemon import Relay
from relay.errors import DurabilityError


class Held:
    """An executor's submit whose work runs only when its result is first asked for: the test
    sees what the relay did while the sync was still 'running'."""

    def __init__(self, on_run=None, fail=None):
        self.submitted, self.ran = 0, []
        self.on_run, self.fail = on_run, fail

    def __call__(self, fn, *args):
        self.submitted += 1
        n = self.submitted
        held = self

        class Result:
            done = False

            def result(self):
                if not self.done:
                    self.done = True
                    held.ran.append(n)
                    if held.on_run is not None:
                        held.on_run(n)
                    if held.fail == n:      # what the syncer's wait raises for a failed fsync
                        raise DurabilityError("fsync of the batch failed: Input/output error")
                    fn(*args)
        return Result()


def relay_with(project, held, batch=2, **values):
    relay = Relay(project.config(agents=["Ann", "Ben", "Cy"], **values), clock=project.clock, batch=batch,
                  submit=held, sync_mode="fs")
    project.relays.append(relay)
    return relay


def statuses(relay, ids):
    return [relay.history.get(mid)["status"] for mid in ids]


def spooled(project):
    return sorted(p.name.split("--", 1)[1] for p in (project.state / "spool").rglob("*--*"))


def test_the_next_batch_is_read_while_the_last_sync_of_one_runs(project):
    seen = {}
    relay = None
    held = Held(on_run=lambda n: seen.setdefault(n, sorted(
        r["name"] for r in relay.history.audit() if r["status"] == "processing")))
    relay = relay_with(project, held)
    for i in range(4):
        project.drop("Ann", f"m{i}", f"TO: Ben\n\nbody {i}")
    first = relay.step()
    assert first.claimed == 2 and first.archived == 0          # a full batch: more is ready
    assert held.submitted == 1 and held.ran == []              # its last sync still "runs"
    ids = sorted(e["id"] for e in project.inbox("Ben"))
    assert len(ids) == 2 and statuses(relay, ids) == ["processing", "processing"]

    second = relay.step()
    # The second batch was claimed (and read) before the first one's sync ran ...
    assert seen[1] == sorted({"m0", "m1", "m2", "m3"}) and spooled(project) == []
    # ... and the first was recorded (archived) before the second was delivered.
    assert second.claimed == 2 and second.archived == 2 and statuses(relay, ids) == ["archived", "archived"]
    assert held.ran == [1] and held.submitted == 2

    third = relay.step()                                       # nothing left to overlap with
    assert third.claimed == 0 and third.archived == 2 and held.ran == [1, 2]
    assert relay.history.counts()["archived"] == 4 and relay.history.counts()["processing"] == 0
    assert sorted(e["body"] for e in project.inbox("Ben")) == [f"body {i}" for i in range(4)]


def test_a_batch_alone_is_recorded_in_its_own_step(project):
    held = Held()
    relay = relay_with(project, held, batch=256)
    project.drop("Ann", "m", "TO: Ben\n\nx")
    counts = relay.step()
    # Nothing more was ready: its last sync ran on the loop's thread, not handed to the seam.
    assert counts.claimed == 1 and counts.archived == 1 and held.submitted == 0
    assert relay.history.counts()["archived"] == 1


def test_a_failed_sync_fails_its_batch_and_not_the_next(project):
    held = Held(fail=1)
    relay = relay_with(project, held)
    for i in range(4):
        project.drop("Ann", f"m{i}", f"TO: Ben\n\nbody {i}")
    relay.step()
    relay.step()
    relay.step()
    counts = relay.history.counts()
    assert counts["failed"] == 2 and counts["archived"] == 2
    failed = list(relay.history.audit(status="failed"))
    assert len(failed) == 2 and all("Input/output error" in row["error"] for row in failed)


def stepped_with_sync_held(project, messages):
    """A relay (its last sync held) that stepped once over `messages` files from Ann to Ben."""
    relay = relay_with(project, Held())
    for i in range(messages):
        project.drop("Ann", f"m{i}", f"TO: Ben\n\nbody {i}")
    relay.step()
    return relay


def test_a_batch_dropped_after_a_failed_step_is_recovered_and_delivered_once(project):
    relay = stepped_with_sync_held(project, 4)
    relay.abandon()         # what a failed step does before recovery: the batch is not recorded
    assert relay.history.counts()["processing"] == 2
    relay.recover()
    relay.drain()
    assert relay.history.counts()["archived"] == 4
    bodies = [e["body"] for e in project.inbox("Ben")]
    assert sorted(bodies) == [f"body {i}" for i in range(4)]            # each once


def test_a_stop_records_the_batch_whose_sync_runs(project):
    relay = stepped_with_sync_held(project, 3)
    assert relay.history.counts()["processing"] == 2
    relay.close()
    project.relays.remove(relay)
    again = relay_with(project, Held())
    assert again.history.counts()["archived"] == 2


def test_a_repeat_in_the_next_batch_is_delivered_when_the_first_failed_at_its_sync(project):
    """A request id repeated in the next batch: the first's failure (its sync) is recorded
    before the repeat is judged, so the repeat is delivered, not archived as its duplicate."""
    held = Held(fail=1)
    relay = relay_with(project, held, batch=1)
    project.drop("Ann", "a", "TO: Ben\nREQUEST-ID: q\n\nsame")
    project.drop("Ann", "b", "TO: Ben\nREQUEST-ID: q\n\nsame")
    relay.drain()
    counts = relay.history.counts()
    assert counts["failed"] == 1 and counts["archived"] == 1 + 1      # + the failure's bounce to Ann
    archived = [relay.history.get(row["id"]) for row in relay.history.audit(status="archived", sender="Ann")]
    assert len(archived) == 1 and archived[0]["duplicate_of"] is None and archived[0]["request_id"] == "q"
    assert held.ran == [1, 2, 3]        # 3: the batch of the failure's bounce


def test_a_recovery_while_a_batch_is_in_flight_records_it_first(project):
    # run --once (drain) after a step left its batch's sync running: recovery must not take
    # that batch for one a stopped relay left, or it is delivered and chained twice.
    held = Held()
    relay = relay_with(project, held)
    for i in range(4):
        project.drop("Ann", f"m{i}", f"TO: Ben\n\nbody {i}")
    assert relay.step().claimed == 2 and held.ran == []
    relay.drain()
    assert sorted(e["body"] for e in project.inbox("Ben")) == [f"body {i}" for i in range(4)]
    assert relay.history.counts()["archived"] == 4
    assert all(r["retries"] == 0 for r in relay.history.audit())


def statements_by_transaction(relay, step):
    """The ledger's statements while `step` runs, counted with the connection's trace
    callback: [the count inside each write transaction (BEGIN IMMEDIATE ... COMMIT)], and the
    count outside any. Each row an executemany writes is a statement of its own here, as
    SQLite runs it; the statements SQLite's FTS5 index runs inside one of relay's (traced
    with a leading "--", one per row it indexes) are the index's, not relay's, and not
    counted."""
    seen = []
    relay.ledger.db.set_trace_callback(seen.append)
    try:
        step()
    finally:
        relay.ledger.db.set_trace_callback(None)
    inside, outside, current = [], 0, None
    for sql in seen:
        if sql.startswith("--"):
            continue
        if sql == "BEGIN IMMEDIATE":
            current = 0
        elif sql in ("COMMIT", "ROLLBACK"):
            inside.append(current)
            current = None
        elif current is None:
            outside += 1
        else:
            current += 1
    return inside, outside


def batch_of(project, relay, n, first, text):
    for i in range(n):
        sender = ("Ann", "Ben")[i % 2]
        written = project.clock() - 60         # settled, as a file written a minute before
        os.utime(project.drop(sender, f"m{first + i}", text(i)), (written, written))
    relay.hint("rescan")
    return statements_by_transaction(relay, relay.step)


@pytest.mark.parametrize("outcome, text", [
    ("archived", lambda i: f"TO: {('Ben', 'Cy')[i % 2]}\nSUBJECT: s{i}\n\nbody {i}"),
    ("failed", lambda i: f"TO: Nobody{i % 3}\nSUBJECT: s{i}\n\nbody {i}"),       # an unknown recipient
    ("retry", lambda i: f"TO: Cy\nSUBJECT: s{i}\n\nbody {i}"),                  # Cy's inbox refuses it
])
def test_a_batch_is_claimed_and_recorded_in_as_many_statements_for_10_messages_as_for_100(project, outcome, text):
    """One statement per table and state for a whole batch (its rows in one statement), not one
    per message: the claim's and the record's transactions, and the reads around them, run as
    many statements for a batch of 100 messages as for a batch of 10."""
    relay = relay_with(project, Held(), batch=256, bounces=False)     # a failure's bounce: test_bounces.py
    if outcome == "retry":
        failing_create(relay, OSError(errno.ENOSPC, "No space left on device"), when=lambda rel: rel.startswith("inbox/Cy/"))
    batch_of(project, relay, 1, 0, text)          # the first step's own work (recovery, the first looks)
    small = batch_of(project, relay, 10, 100, text)
    large = batch_of(project, relay, 100, 200, text)
    assert relay.history.counts()[outcome if outcome != "retry" else "pending"] >= 111
    assert len(small[0]) == 2, small             # the claim, then the record
    assert small == large, f"10 messages: {small}, 100 messages: {large} (statements per transaction, outside)"


def test_a_ledger_on_a_sqlite_built_for_999_parameters_claims_records_and_recovers_600_messages(project):
    """SQLite before 3.32 (and builds that keep its old default) bind at most 999 parameters a
    statement: a batch of 600, and the first look after a restart at 600 archived originals of
    one sender (each id looked for as a row's id and as a spool file's), stay within it."""
    def limited(relay):
        relay.ledger.db.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
        return relay

    relay = limited(relay_with(project, Held(), batch=1024, bounces=False))
    for i in range(600):
        written = project.clock() - 60
        os.utime(project.drop("Ann", f"m{i}", f"TO: Ben, Cy\nSUBJECT: s{i}\n\nbody {i}"), (written, written))
    relay.drain()
    assert relay.history.counts()["archived"] == 600
    relay.close()
    again = limited(relay_with(project, Held(), batch=1024, bounces=False))
    again.drain()       # recovery looks at each archived original of the day
    assert again.history.counts()["archived"] == 600
    assert len(list((project.state / "inbox" / "Cy" / "new").iterdir())) == 600
