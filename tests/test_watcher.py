"""The daemon's file watcher (relay's own inotify reader): only the events relay needs, names it
ignores dropped before they cost a hint, new agent directories watched before they are scanned."""
import contextlib
import os
import sys
import threading

import pytest

from relay.core import watcher
from relay.core.watcher import (IN_CLOSE_WRITE, IN_CREATE, IN_IGNORED, IN_ISDIR, IN_MOVED_TO, IN_Q_OVERFLOW,
                           hints_of, parse)

pytestmark = pytest.mark.skipif(watcher.inotify_init is None or not sys.platform.startswith("linux"),
                                reason="relay reads inotify itself on Linux only")


class Hints:
    """A relay's seam for hints (hint_many), with the layout and config the watcher reads."""

    def __init__(self, relay):
        self.layout, self.config = relay.layout, relay.config
        self.got = []

    def hint_many(self, hints):
        self.got.extend(hints)


def pump_until(ino, hints, n, rounds=10):
    """Read events (each read blocks in poll() for the kernel, up to 5 s) until `n` hints came."""
    for _ in range(rounds):
        if len(hints.got) >= n:
            break
        assert ino.pump(5.0)
    return hints.got


@contextlib.contextmanager
def watching(project):
    """(inotify watcher, the hints it gave) over a new relay's outboxes, read by the caller."""
    hints = Hints(project.relay())
    ino = watcher.Inotify(hints)
    ino.start(thread=False)
    try:
        yield ino, hints
    finally:
        ino.stop()


def test_a_message_written_the_agents_way_costs_one_hint(project):
    with watching(project) as (ino, hints):
        project.drop("Ann", "m1", "TO: Ben\n\nx")          # .m1.tmp created, written, closed, renamed
        (project.state / "outbox" / "Ann" / "draft.tmp").write_text("ignored")
        (project.state / "outbox" / "Ann" / "inplace").write_text("TO: Ben\n\ny")   # create + close
        got = pump_until(ino, hints, 3)
    assert got == [("closed", "Ann", "m1"), ("file", "Ann", "inplace"), ("closed", "Ann", "inplace")]


def test_a_new_agent_directory_is_watched_before_the_loop_scans_it(project):
    with watching(project) as (ino, hints):
        os.mkdir(project.state / "outbox" / "Dee")
        assert pump_until(ino, hints, 1) == [("dir", "Dee", None)]
        project.drop("Dee", "m", "TO: Ben\n\nx")
        assert pump_until(ino, hints, 2)[1] == ("closed", "Dee", "m")
        os.symlink(project.root, project.state / "outbox" / "Eve")     # not a directory: no hint, no watch
        os.mkdir(project.state / "outbox" / "Fay")
        assert pump_until(ino, hints, 3)[2:] == [("dir", "Fay", None)]
        assert sorted(ino.names.values()) == ["Ann", "Ben", "Cy", "Dee", "Fay"]


def test_hints_of_events():
    names = {2: "Ann"}
    events = [(2, IN_CREATE, b".m.tmp"), (2, IN_CLOSE_WRITE, b".m.tmp"), (2, IN_MOVED_TO, b"m"),
              (2, IN_MOVED_TO, b"x.part"), (2, IN_CREATE | IN_ISDIR, b"sub"), (3, IN_MOVED_TO, b"unknown-wd"),
              (1, IN_CREATE | IN_ISDIR, b"Bob"), (1, IN_CREATE, b"stray-file"), (2, IN_CREATE, b"w"),
              (0xFFFFFFFF & -1, IN_Q_OVERFLOW, b""), (2, IN_IGNORED, b"")]
    hints, watch, gone, lost = hints_of(events, names, root_wd=1)
    assert hints == [("closed", "Ann", "m"), ("dir", "Bob", None), ("file", "Ann", "w"), ("rescan", None, None)]
    assert watch == ["Bob"] and gone == [2] and not lost


def test_parse_reads_the_kernels_records():
    rec = watcher.HEADER.pack(4, IN_MOVED_TO, 0, 16) + b"msg-1".ljust(16, b"\0")
    rec += watcher.HEADER.pack(5, IN_Q_OVERFLOW, 0, 0)
    assert parse(rec) == [(4, IN_MOVED_TO, b"msg-1"), (5, IN_Q_OVERFLOW, b"")]


def test_the_daemons_loop_reads_the_watcher_itself_and_wakes_on_its_events(project):
    """Relay.run with `watch`: no watcher thread; a message renamed in while the loop sleeps in
    its poll wakes it at once (the next step, not the next scheduled one) and is delivered."""
    import threading
    relay = project.relay()
    w = watcher.Watcher(relay, thread=False)
    w.start()
    threads = threading.active_count()
    stop = threading.Event()
    steps = []

    def after(counts):
        steps.append(counts)
        if len(steps) == 1:         # the loop is about to sleep: a message arrives the agents' way
            project.drop("Ann", "m", "TO: Ben\n\nx")
        elif counts.archived:
            stop.set()
    checks = []         # called for each second the loop's wait lasts: none, it was woken at once
    try:
        relay.run(stop, after=after, check=lambda: checks.append(1), max_wait=30, watch=w)
    finally:
        w.stop()
    assert [c.archived for c in steps] == [0, 1] and checks == [] and threading.active_count() == threads
    assert [e["body"] for e in project.inbox("Ben")] == ["x"]


def test_a_lost_watcher_read_by_the_loop_wakes_it_and_is_no_longer_waited_on(project):
    """The outbox moved away under a watcher the loop reads itself: the read that sees it marks
    the watcher lost, wakes the loop (whose daemon then starts a new watcher) and takes its
    descriptor out of the idle wait, which would otherwise find it readable for ever."""
    relay = project.relay()
    w = watcher.Watcher(relay, thread=False)
    w.start()
    try:
        relay.wake.clear()
        os.rename(project.state / "outbox", project.state / "outbox.moved")
        w.pump(5.0)
        assert not w.alive() and w.fileno() is None and relay.wake.is_set()
        w.pump(0)                   # nothing more is read from a lost watcher
    finally:
        w.stop()


# -- the watcher under a running loop: its outbox moved away, a start that failed, a burst ---------

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


def test_the_constants_come_from_watchdogs_documented_module():
    """relay's masks are watchdog's own InotifyConstants, taken through watchdog.observers.inotify
    (the documented Linux observer's module), and the move grouper relay sets to no delay is the
    one that module uses: a watchdog that moves either fails here, not by a silent fallback."""
    from watchdog.observers import inotify
    from relay.files import inotify as relays
    k = inotify.InotifyConstants
    assert relays.available and relays.Constants is k
    assert (watcher.IN_CLOSE_WRITE, watcher.IN_MOVED_TO, watcher.IN_CREATE, watcher.IN_ISDIR) == \
        (k.IN_CLOSE_WRITE, k.IN_MOVED_TO, k.IN_CREATE, k.IN_ISDIR) == (0x8, 0x80, 0x100, 0x40000000)
    assert watcher.ROOT_MASK & k.IN_DONT_FOLLOW and watcher.AGENT_MASK & k.IN_ONLYDIR
    assert watcher.InotifyMoveEventGrouper is not None
    assert watcher.InotifyMoveEventGrouper is inotify.InotifyMoveEventGrouper


class Recorded:
    """A relay's seam for the Observer path: hint() per event, an Event set on the one awaited."""

    def __init__(self, relay, awaited):
        self.layout, self.config = relay.layout, relay.config
        self.wake = threading.Event()
        self.got, self.awaited, self.seen = [], awaited, threading.Event()

    def hint(self, kind, sender=None, name=None):
        self.got.append((kind, sender, name))
        if (kind, sender, name) == self.awaited:
            self.seen.set()


@pytest.mark.parametrize("own_reader", [True, False], ids=["relays-own-reader", "watchdog-observer"])
def test_both_watchers_hint_a_renamed_message(project, own_reader):
    """The portable path (watchdog's Observer) and relay's own reader both turn an agent's rename
    into the hint that the message is complete; the daemon's Watcher chooses between them."""
    relay = project.relay()
    if own_reader:
        got = []
        relay.hint_many = got.extend
        w = watcher.Watcher(relay, thread=False)
        w.start()
        try:
            assert w.inotify is not None and w.observer is None
            project.drop("Ann", "m1", "TO: Ben\n\nx")
            for _ in range(10):
                if ("closed", "Ann", "m1") in got:
                    break
                w.pump(5.0)
        finally:
            w.stop()
        assert ("closed", "Ann", "m1") in got
        return
    seam = Recorded(relay, ("closed", "Ann", "m1"))
    w = watcher.Watcher(seam, own_reader=False)
    w.start()
    try:
        assert w.observer is not None and w.inotify is None and w.alive()
        project.drop("Ann", "m1", "TO: Ben\n\nx")
        assert seam.seen.wait(10), seam.got
    finally:
        w.stop()
    assert ("file", "Ann", ".m1.tmp") not in seam.got     # a write in progress is no hint


def test_hints_of_the_outbox_itself_moved_or_deleted_and_of_what_is_no_agent_directory():
    from relay.core.watcher import IN_DELETE_SELF, IN_MOVE_SELF
    names = {2: "Ann"}
    for mask in (IN_DELETE_SELF, IN_MOVE_SELF):
        assert hints_of([(1, mask, b"")], names, root_wd=1) == ([], [], [], True)
    assert hints_of([(2, IN_DELETE_SELF, b"")], names, root_wd=1)[3] is False
    events = [(1, IN_MOVED_TO, b"a-file"), (1, IN_CREATE | IN_ISDIR, b""), (1, IN_MOVED_TO | IN_ISDIR, b"Cy"),
              (2, IN_MOVED_TO | IN_ISDIR, b"sub"), (2, IN_CLOSE_WRITE, b""), (2, IN_CLOSE_WRITE, b".hidden"),
              (2, IN_CLOSE_WRITE, b"done"), (2, IN_CREATE, b"\xffraw")]
    hints, watch, gone, lost = hints_of(events, names, root_wd=1)
    assert hints == [("dir", "Cy", None), ("closed", "Ann", "done"), ("file", "Ann", os.fsdecode(b"\xffraw"))]
    assert (watch, gone, lost) == (["Cy"], [], False)


class _Said:
    def __init__(self):
        self.got = []

    def hint(self, *hint):
        self.got.append(hint)


def test_the_watchdog_handler_hints_each_kind_of_event_in_an_agents_outbox_and_nothing_else(tmp_path):
    from watchdog.events import (DirCreatedEvent, DirMovedEvent, FileClosedEvent, FileCreatedEvent,
                                 FileDeletedEvent, FileModifiedEvent, FileMovedEvent)
    outbox = tmp_path / "outbox"
    (outbox / "Ann").mkdir(parents=True)
    said = _Said()
    handler = watcher.Handler(said, outbox)
    box = str(outbox / "Ann")
    for event in [FileMovedEvent(f"{box}/.m.tmp", f"{box}/moved"), FileClosedEvent(f"{box}/closed"),
                  FileCreatedEvent(f"{box}/created"), FileModifiedEvent(f"{box}/modified"),
                  FileDeletedEvent(f"{box}/deleted"), FileCreatedEvent(f"{box}/.tmp-file"),
                  FileClosedEvent(f"{box}/x.tmp"), FileMovedEvent(f"{box}/gone", ""),
                  FileClosedEvent(os.fsencode(f"{box}/bytes")),
                  DirCreatedEvent(str(outbox / "Bob")), DirMovedEvent(str(tmp_path / "Cy"), str(outbox / "Cy")),
                  DirCreatedEvent(f"{box}/sub"), FileClosedEvent(f"{box}/sub/deeper"),
                  FileClosedEvent(str(tmp_path / "elsewhere")), FileClosedEvent(str(outbox / "at-the-top"))]:
        handler.dispatch(event)
    assert said.got == [("closed", "Ann", "moved"), ("closed", "Ann", "closed"), ("file", "Ann", "created"),
                        ("file", "Ann", "modified"), ("closed", "Ann", "bytes"), ("dir", "Bob"), ("dir", "Cy")]


def test_a_directory_whose_name_is_no_agents_is_not_watched_at_start_or_when_made(project):
    outbox = project.state / "outbox"
    project.relay().close()
    os.mkdir(outbox / "bad name")
    (outbox / "plain-file").write_text("x")
    with watching(project) as (ino, hints):
        assert sorted(ino.names.values()) == ["Ann", "Ben", "Cy"]
        os.mkdir(outbox / "also bad")
        os.mkdir(outbox / "Dee")
        got = pump_until(ino, hints, 2)
        assert ("dir", "Dee", None) in got
        assert sorted(ino.names.values()) == ["Ann", "Ben", "Cy", "Dee"]
        (outbox / "also bad" / "m").write_text("TO: Ben\n\nx")
        (outbox / "Dee" / "m").write_text("TO: Ben\n\nx")
        got = pump_until(ino, hints, len(got) + 2)
        assert all(h[1] != "also bad" or h[0] == "dir" for h in got)
