"""When a file in an outbox is ready to be taken: settled by relay's clock, no writer holding it
(found by a lease, before the claim and again on the spooled file after custody), a close hint
that skips the wait but not the look, and the size cap before anything is read. A file held open
is deferred, looked at less and less often, and named by run --once when its patience runs out."""
import contextlib
import os


@contextlib.contextmanager
def held_open_after_its_close_hint(project, relay):
    """outbox/Ann/m renamed in (and hinted closed) by a writer that still holds it open, with
    half its text; yields the writer's file."""
    box = project.state / "outbox/Ann"
    box.mkdir(parents=True, exist_ok=True)
    with open(box / ".m.tmp", "w") as f:
        f.write("TO: Ben\n\nhalf")
        f.flush()
        os.rename(box / ".m.tmp", box / "m")
        relay.hint("closed", "Ann", "m")
        yield f


def test_a_file_held_open_after_its_close_hint_is_looked_at_less_and_less_often(project, clock):
    """A hint that a file was closed (or renamed in) lets relay claim it without first looking
    for writers; the lease on the spooled file finds one still holding it, and defers it. An
    agent that never lets go must not make relay claim it, commit and log again every settle
    time for ever: the deferrals back off (as retries do), and the file is delivered whole,
    soon after the writer lets go."""
    relay = project.relay(settle="250ms")
    with held_open_after_its_close_hint(project, relay) as f:
        claims, start = 0, clock.now
        while clock.now - start < 60:           # a minute of the daemon's loop, woken when due
            claims += relay.step(clock.now).claimed
            clock.advance(max(0.25, relay.next_deadline(clock.now) - clock.now))
        assert project.inbox("Ben") == []
        assert claims <= 15, claims             # not one every 250 ms (240)
        f.write(" and whole")
    left = relay.history.next_due() - clock.now
    assert 0 < left <= 10.0                     # the longest wait between two looks
    relay.step(clock.advance(left))
    assert [e["body"] for e in project.inbox("Ben")] == ["half and whole"]


def test_run_once_waits_for_a_spooled_file_held_open_and_names_it_when_it_gives_up(project, clock):
    """A file the daemon claimed on a close hint and found held open several times waits
    longer and longer there; run --once (drain) still looks at it within its own horizon, and
    names it among what it left when its patience runs out, instead of ending silently."""
    relay = project.relay(settle="250ms")
    with held_open_after_its_close_hint(project, relay):
        for _ in range(5):                      # the daemon defers it five times
            relay.step(clock.now)
            clock.advance(relay.history.next_due() - clock.now)
        [mid] = [r["id"] for r in relay.history.audit()]
        waits = []

        def wait(seconds):
            waits.append(seconds)
            clock.advance(max(seconds, 0.05))
        relay.drain(wait=wait, patience=3.0)
        assert waits and project.inbox("Ben") == []
        assert [what for what, _ in relay.left] == [f"{mid} from Ann (spool)"]
