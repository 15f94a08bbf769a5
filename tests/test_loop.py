"""The daemon's loop in-process: Relay.run() with the process's callbacks, the one deadline
that run() and drain() share, and a reload applied by reconfigure()."""
import os
import threading
import time

import pytest

from relay.errors import StateLost


def test_run_steps_until_stopped(project):
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nx")
    stop = threading.Event()
    turns = []

    def after(counts):
        turns.append(counts)
        if counts.archived:
            stop.set()
    total = relay.run(stop, before=lambda: turns.append("before"), after=after)
    assert total.archived == 1 and [e["body"] for e in project.inbox("Ben")] == ["x"]
    assert turns[0] == "before" and turns[1].archived == 1


def test_run_waits_until_woken(project):
    relay = project.relay()
    stop = threading.Event()
    steps = []

    def arrive():
        project.drop("Ann", "m", "TO: Ben\n\nx")
        relay.hint("rescan")

    def after(counts):
        steps.append(counts)
        if len(steps) == 1:             # nothing yet: the loop waits for the watcher's hint
            threading.Timer(0.05, arrive).start()
        elif counts.archived:
            stop.set()
    assert relay.run(stop, after=after).archived == 1
    assert steps[0].claimed == 0 and len(project.inbox("Ben")) == 1


def test_a_step_that_left_nothing_is_not_followed_by_an_empty_one(project):
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nx")
    stop = threading.Event()
    steps = []

    def end():
        stop.set()
        relay.wake.set()

    def after(counts):
        steps.append(counts)
        threading.Timer(0.05, end).start()
    relay.run(stop, after=after)
    # The message was claimed, delivered and recorded in one step; nothing was left, so the
    # loop waited for a wake instead of stepping (and opening a ledger transaction) again.
    assert [c.archived for c in steps] == [1]


def test_what_before_raises_ends_the_loop(project):
    relay = project.relay()

    def lost():
        raise StateLost("relay.lock was removed")
    with pytest.raises(StateLost):
        relay.run(threading.Event(), before=lost)


def test_one_deadline_for_the_loop_and_for_drain(project, clock):
    relay = project.relay(settle="1s", rescan_interval="30s")
    relay.step()
    now = clock.now
    assert relay.next_deadline(now) == now + 30                 # the next rescan
    assert relay.next_deadline(now, horizon=1.0) is None        # drain: nothing present
    path = project.drop("Ann", "m", "TO: Ben\n\nx", in_place=True)
    os.utime(path, (now, now))                                  # written just now: settling
    relay.hint("file", "Ann", "m")
    relay.step(now)
    assert relay.next_deadline(now) == now + 1
    assert relay.next_deadline(now, horizon=1.0) == now + 1
    relay.step(clock.advance(1))
    assert len(project.inbox("Ben")) == 1


def test_reconfigure_applies_a_reload(project):
    relay = project.relay()
    assert relay.history.pragmas()["synchronous"] == "FULL"
    relay.reconfigure(project.config(agents=["Ann", "Ben", "Cy"], durability="normal", settle="2s"))
    assert relay.history.pragmas()["synchronous"] == "NORMAL"
    assert relay.outbox.settle == 2.0 and not relay.syncer.durable and relay.config.durability == "normal"


@pytest.mark.timeout_s(10)
def test_the_wakers_wait_is_an_events_wait():
    """The loop's Waker waits as threading.Event does: a time already passed (0, or less) is no
    wait at all; a flag that is up ends a wait at once; down, a wait lasts its timeout."""
    from relay.core.waker import Waker
    w = Waker()
    try:
        start = time.monotonic()
        assert w.wait(-1) is False and w.wait(0) is False and w.poll(-0.5) == set()
        assert time.monotonic() - start < 1
        w.set()
        assert w.wait(5) is True and w.is_set()
        w.clear()
        start = time.monotonic()
        assert w.wait(0.05) is False and time.monotonic() - start >= 0.05
    finally:
        w.close()
