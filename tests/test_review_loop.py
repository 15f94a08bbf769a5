"""Hostile review of the daemon's loop that reads inotify itself and sleeps in its Waker's poll:
wake-ups racing with the loop's clear(), idle spinning, and the watcher's descriptors."""
import os
import threading

from relay.core.waker import Waker


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


def test_a_set_whose_byte_lands_after_the_clear_is_a_set():
    """Another thread's set() reads the flag down, the loop's clear() runs (flag down, pipe
    drained), then the thread writes its byte: the flag is down with a byte in the pipe. That
    byte is a wake-up (what the thread hinted came after the clear): wait() says so at once,
    instead of returning False at once, for ever, while the pipe stays readable."""
    w = Waker()
    try:
        os.write(w.w, b"x")             # the late half of a set() that raced with clear()
        assert w.wait(5.0) is True
        assert w.is_set()
        w.clear()
        assert w.wait(0) is False       # cleared for good: nothing left in the pipe
    finally:
        w.close()


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


def test_the_outbox_moved_away_and_back_under_a_running_daemon(project, caplog):
    """`mv .relay/outbox elsewhere` under `relay run`: the loop saw its watcher lost and started
    a new one; relay's reader could not watch the missing outbox, the watchdog fallback could not
    either and raised out of the loop, and stopping the watcher then raised again (joining an
    observer never started): the daemon died with a traceback. It must run on without a watcher,
    say so once, try again after its steps without spinning, and watch the outbox once it is back."""
    from relay.service import Daemon
    from relay.core.work import Counts
    project.relay().close()
    project.relays.clear()
    d = Daemon(project.config(agents=["Ann", "Ben"]))
    outbox, away = project.state / "outbox", project.state / "outbox.away"
    try:
        d.watcher.start()
        os.rename(outbox, away)
        d.watcher.pump(5.0)                 # the loop reads the move: the watcher is lost
        assert not d.watcher.alive() and d.relay.wake.is_set()
        d.relay.hints.clear()
        with caplog.at_level("WARNING", logger="relay"):
            for _ in range(3):              # steps while the outbox is away: each tries again, quietly
                d.stepped(Counts())
        assert not d.watcher.alive() and d.watcher.fileno() is None
        assert not d.relay.hints            # a failed start asks for no rescan: no step follows it at once
        missing = [r for r in caplog.records if "is missing" in r.getMessage()]
        assert len(missing) == 1 and str(outbox) in missing[0].getMessage()
        os.rename(away, outbox)
        d.stepped(Counts())                 # the next try watches it again, and rescans
        assert d.watcher.alive() and d.watcher.fileno() is not None
        assert ("rescan", None, None) in d.relay.hints
        d.relay.hints.clear()
        d.relay.wake.clear()
        project.drop("Ann", "m", "TO: Ben\n\nx")
        d.watcher.pump(5.0)
        assert ("closed", "Ann", "m") in d.relay.hints
    finally:
        d.watcher.stop()
        d.relay.close()


def test_a_watcher_that_never_started_stops_without_error(project):
    """stop() after a start() that failed (no outbox at all) raises nothing: it runs in the
    daemon's `finally`, where an error hides the real one and prints a traceback."""
    from relay.core import watcher
    relay = project.relay()
    os.rename(project.state / "outbox", project.state / "outbox.away")
    w = watcher.Watcher(relay, thread=False)
    assert w.start() is False and not w.alive()
    w.stop()
    w.stop()


def test_a_closed_waker_touches_no_descriptor_that_reuses_its_numbers():
    """Relay.close() closes the waker; a signal handler (SIGHUP while the daemon shuts down) or
    the federation's link thread may still set() it, and a second close() may follow. The pipe's
    numbers are free by then, and the next descriptor opened takes them (the lowest free): set()
    wrote a byte into that file, and a second close() closed it."""
    w = Waker()
    old = (w.r, w.w)
    w.close()
    r2, w2 = os.pipe()                  # the lowest free numbers: the waker's
    try:
        assert {r2, w2} == set(old)
        os.set_blocking(r2, False)      # a clear() that reads it would otherwise hang the test
        w.clear()
        w.set()
        w.close()
        os.write(w2, b"y")              # still open, and nothing but this byte in it
        assert os.read(r2, 16) == b"y"
    finally:
        for fd in (r2, w2):
            try:
                os.close(fd)
            except OSError:
                pass



def test_a_burst_beyond_one_read_and_an_agent_made_mid_step_are_all_delivered(project):
    """Events that arrive while a step runs, more of them than one 64 KiB read holds (long
    names: about 240 events a read), and an agent directory created, and written to at once,
    while the loop is busy: every message is delivered by the events alone (the rescan is an
    hour away), and the loop then sleeps."""
    from relay.core import watcher
    relay = project.relay(agents=["Ann", "Ben", "Dee"], rescan_interval="1h")
    project.drop("Ann", "first", "TO: Ben\n\nfirst")
    w = watcher.Watcher(relay, thread=False)
    w.start()
    stop = threading.Event()
    steps = []
    n = 500                             # under the default pair_rate (600 per 10m)

    def after(counts):
        steps.append(counts)
        if len(steps) == 1:             # during the loop's turn: a burst, and a new agent
            for i in range(n):
                project.drop("Ann", f"{i:04d}-" + "x" * 200, f"TO: Ben\n\n{i}")
            project.drop("Dee", "hello", "TO: Ben\n\nfrom Dee")
        if len(project.files("archive")) == n + 2:
            stop.set()
    checks = []
    try:
        relay.run(stop, after=after, check=lambda: checks.append(1), max_wait=30, watch=w)
    finally:
        w.stop()
    bodies = {e["body"] for e in project.inbox("Ben")}
    assert len(bodies) == n + 2 and "from Dee" in bodies and checks == []
