"""The daemon's loop in-process: Relay.run() with the process's callbacks, the one deadline
that run() and drain() share, and a reload applied by reconfigure(): what it can apply, what needs
a restart, a changed federation kept as it runs and logged without its password."""
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


def test_the_relay_holds_its_loop_pipeline_and_schedule_as_parts(project, clock):
    """Relay is none of its parts (no mixin base): it holds them, each built with what it uses;
    the loop drives the relay through its public faces and the schedule it was given, and no
    part reads another's private fields."""
    import inspect
    import re
    from relay.core import intake, loop, pipeline, reading, schedule, settle
    relay = project.relay(rescan_interval="30s")
    assert type(relay).__bases__ == (object,)
    assert isinstance(relay.loop, loop.Loop) and isinstance(relay.pipeline, pipeline.Pipeline)
    assert isinstance(relay.schedule, schedule.Schedule) and relay.loop.schedule is relay.schedule
    assert relay.pipeline.s.router is relay.reader.router is relay.router
    project.drop("Ann", "m", "TO: Ben\n\nx")
    assert relay.drain(now_fn=clock, wait=lambda s: None).archived == 1
    assert relay.schedule.rescan_at == clock.now + 30        # the schedule the step kept
    assert relay.next_deadline(clock.now) == relay.schedule.next_deadline(clock.now) <= clock.now + 30
    reaching = [f"{m.__name__}: {hit}" for m in (intake, loop, pipeline, reading, schedule, settle)
                for hit in re.findall(r"\b(?:self\.)?\w+\.(?:relay|s|schedule|intake|router|known)\._\w+",
                                      inspect.getsource(m))]
    assert not reaching, reaching


def test_the_federation_meets_the_pipeline_at_one_seam(project, clock):
    """One machine: the relay's router is Alone (every recipient local, a name nobody knows
    refused at once), the same object the reader and the pipeline call; no part of core asks
    whether there is a router."""
    import pathlib
    import re
    import relay as package
    from relay.core.routes import Alone
    relay = project.relay()
    assert isinstance(relay.router, Alone) and relay.reader.router is relay.router is relay.pipeline.s.router
    core = pathlib.Path(package.__file__).parent / "core"
    asks = [f"{p.name}:{n}" for p in sorted(core.glob("*.py"))
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if re.search(r"\brouter is (not )?None", line)]
    assert not asks, asks
    project.drop("Ann", "m", "TO: Ben\n\nx")
    project.drop("Ann", "n", "TO: Nobody\n\nx")
    counts = relay.drain(now_fn=clock, wait=lambda s: None)
    assert (counts.archived, counts.failed) == (1, 1) and len(project.inbox("Ben")) == 1


def test_reconfigure_applies_a_reload(project):
    relay = project.relay()
    assert relay.history.checks.pragmas()["synchronous"] == "FULL"
    relay.reconfigure(project.config(agents=["Ann", "Ben", "Cy"], durability="normal", settle="2s"))
    assert relay.history.checks.pragmas()["synchronous"] == "NORMAL"
    assert relay.outbox.settle == 2.0 and not relay.syncer.durable and relay.config.durability == "normal"


# -- wake-ups racing with the loop's clear() ---------------------------------------------------------

class CountingStop:
    """Relay.run's `stop`: counts how often the loop looks at it, and stops the loop after
    `turns` steps or when the idle wait looks at it more than `most` times (a spin)."""

    def __init__(self, most=1000):
        self.looks = 0
        self.most = most
        self.stop = False

    def is_set(self):
        self.looks += 1
        return self.stop or self.looks > self.most


def test_the_idle_wait_does_not_spin_on_a_byte_left_by_a_racing_set(project):
    """The same race inside Relay.run: the idle wait found the pipe readable with the flag down,
    returned from poll() with nothing, and polled again at once until its deadline: 100% CPU
    for up to an hour. It must end the wait instead (one more step, whose clear() drains it)."""
    relay = project.relay()
    stop = CountingStop()
    steps = []

    def after(counts):
        steps.append(counts)
        if len(steps) == 1:
            os.write(relay.wake.w, b"x")    # a thread's set() whose byte came after this turn's clear()
        else:
            stop.stop = True
    relay.run(stop, after=after, max_wait=30)
    assert len(steps) == 2 and stop.looks < 10, f"the idle wait looked at stop {stop.looks} times"


def test_hints_from_another_thread_racing_the_loop_are_never_slept_past(project):
    """The federation's link calls relay.hint("dir") from its own thread: many of them, racing
    with the loop's clear() at every point; each one is followed by a step that sees it."""
    relay = project.relay()
    stop = threading.Event()
    sent = 100
    seen, checks = [], []

    def link():
        for _ in range(sent):
            relay.hint("dir")
            while relay.hints:          # the loop took it: the next one races with the next turn
                if stop.is_set():
                    return
        done.set()
        relay.wake.set()                # the loop sees `done` at its next turn
    done = threading.Event()

    def after(counts):
        seen.append(1)
        if done.is_set() and not relay.hints:
            stop.set()
    t = threading.Thread(target=link)
    t.start()
    try:
        relay.run(stop, after=after, check=lambda: checks.append(1), max_wait=30)
    finally:
        stop.set()
        t.join(5)
    # check() runs once a wait has lasted a second: no hint was slept past.
    assert done.is_set() and not relay.hints and checks == []


@pytest.mark.parametrize("values", [{}, {"batch_bytes": 1}])
def test_the_loop_steps_on_while_a_step_leaves_work_due_without_a_wake(project, values):
    """The loop steps again only when hints, a rescan or a batch whose sync runs remain, or
    when next_deadline() comes. A full claim (batch 2, five files) and messages left for the
    next batch by the byte budget are due at once: the loop goes on without any wake-up (a
    guard timer ends it, and fails the test, if it waits)."""
    relay = project.relay(**values)
    relay.batch = 2
    for i in range(5):
        project.drop("Ann", f"m{i}", f"TO: Ben\n\nm{i}")
    stop, waited = threading.Event(), []

    def guard():
        waited.append(True)
        stop.set()
        relay.wake.set()

    def after(counts):
        if len(project.inbox("Ben")) == 5:
            stop.set()
    timer = threading.Timer(5.0, guard)
    timer.start()
    try:
        relay.run(stop, after=after)
    finally:
        timer.cancel()
    assert not waited and sorted(e["body"] for e in project.inbox("Ben")) == [f"m{i}" for i in range(5)]


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


def test_a_reload_applies_what_it_can_and_names_what_needs_a_restart(project, clock):
    relay = project.relay(agents=("Ann", "Ben"), rescan_interval="1h")
    relay.step()
    new = project.config(agents=["Ann", "Ben", "Dee"], rescan_interval="10s", settle="2s")
    moved = type(new)(**{**{f: getattr(new, f) for f in new.__dataclass_fields__},
                         "state_dir": project.root / "elsewhere"})
    applied, restart = relay.reconfigure(moved)
    assert applied == ["settle", "rescan_interval", "agents"] and restart == ["state_dir"]
    assert relay.config.state_dir == project.state and relay.outbox.settle == 2.0
    assert (project.state / "inbox/Dee/new").is_dir() and "Dee" in relay.known_agents()
    assert relay.next_deadline(clock.now) <= clock.now + 10
    assert not (project.root / "elsewhere").exists()


def test_a_reload_that_changes_the_federation_keeps_the_running_one_and_logs_no_password(project, caplog):
    """SIGHUP with a [federation] section added or changed: the log line naming what needs a
    restart printed the new Federation whole, its URL's password with it, and said the daemon
    ran "with" the new one, which the relay's config then held while the link kept the old."""
    from relay.service import Daemon
    project.relay().close()
    project.relays.clear()
    cfg = project.config(agents=["Ann", "Ben"])
    new = project.config(agents=["Ann", "Ben"], federation={"url": "redis://bob:s3cret@redis.example:6379/0",
                                                            "team": "t", "node": "n1"})
    daemon = Daemon(cfg, load=lambda: new)
    try:
        with caplog.at_level("INFO", logger="relay"):
            daemon.do_reload()
    finally:
        daemon.relay.close()
    assert daemon.relay.config.federation is None and daemon.cfg.federation is None
    assert "s3cret" not in caplog.text
    assert "federation changed (url redis://bob:***@redis.example:6379/0, team t, node n1, running with none" \
        in caplog.text


@pytest.mark.parametrize("key", ["sweep_interval", "rescan_interval"])
def test_a_reload_that_shortens_an_interval_brings_its_next_run_forward_and_a_longer_one_does_not(project, clock, key):
    base = {"agents": ["Ann", "Ben", "Cy"], "retention": "1h", "sweep_interval": "1d", "rescan_interval": "1d"}
    relay = project.relay(**base)
    relay.step(clock.now)
    at = {"sweep_interval": lambda: relay.schedule.sweep_at, "rescan_interval": lambda: relay.schedule.rescan_at}[key]
    assert at() == clock.now + 86400
    start = clock.now
    clock.advance(3600)
    applied, _ = relay.reconfigure(project.config(**{**base, key: "2d"}))
    assert applied == [key] and at() == start + 86400
    applied, _ = relay.reconfigure(project.config(**{**base, key: "10m"}))
    assert applied == [key] and at() == clock.now + 600


def test_a_reload_that_shortens_the_sweep_interval_sweeps_at_the_new_one(project, clock):
    relay = project.relay(retention="1h", sweep_interval="1d")
    project.drop("Ann", "a", "TO: Ben\n\nx")
    relay.drain()
    clock.advance(2 * 3600)
    relay.step(clock.now)
    assert len(project.files("archive")) == 1          # the next sweep is a day after the first
    relay.reconfigure(project.config(agents=["Ann", "Ben", "Cy"], retention="1h", sweep_interval="10m"))
    relay.step(clock.advance(601))
    assert project.files("archive") == []


def test_a_reload_applies_what_it_can_and_names_what_needs_a_restart_keeping_the_old_value(project, clock, tmp_path):
    relay = project.relay(settle="1s")
    before = relay.config.state_dir
    import dataclasses
    new = dataclasses.replace(project.config(agents=["Ann", "Ben", "Cy", "Dee"], settle="3s"),
                              state_dir=tmp_path / "elsewhere")
    applied, restart = relay.reconfigure(new)
    assert sorted(applied) == ["agents", "settle"] and restart == ["state_dir"]
    assert relay.config.state_dir == before and relay.config.settle == 3.0 and relay.outbox.settle == 3.0
    assert (project.state / "outbox" / "Dee").is_dir() and (project.state / "inbox" / "Dee" / "new").is_dir()
    assert not (tmp_path / "elsewhere").exists()
    project.drop("Ann", "m", "TO: Dee\n\nto the agent listed by the reload")
    assert relay.drain().archived == 1
    assert [e["body"] for e in project.inbox("Dee")] == ["to the agent listed by the reload"]
    assert relay.reconfigure(project.config(agents=["Ann", "Ben", "Cy", "Dee"], settle="3s")) == ([], [])


def test_a_reload_listing_an_agent_whose_outbox_cannot_be_made_warns_and_makes_the_others(project, caplog):
    relay = project.relay(agents=("Ann", "Ben"))
    relay.step()
    (project.state / "outbox" / "Dee").write_text("a file where Dee's outbox would be")
    applied, _ = relay.reconfigure(project.config(agents=["Ann", "Ben", "Dee", "Eve"]))
    assert applied == ["agents"]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "outbox/Dee" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("outbox/Dee is a symbolic link or not a directory")
    assert (project.state / "outbox" / "Dee").is_file() and (project.state / "outbox" / "Eve").is_dir()
    assert (project.state / "inbox" / "Eve" / "new").is_dir()
