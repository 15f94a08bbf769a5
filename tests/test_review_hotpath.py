"""Attacks on the daemon's hot path: the order of its syncs against a power cut, completeness of
a file hinted closed, the loop's wake-ups, and the parsers' edge cases."""
import contextlib
import os
import threading

import pytest


def recorder(relay_box):
    """An fsync seam that records the path (relative to the state directory) of each descriptor
    it is given, in order, into relay_box["events"] beside the renames the test records."""
    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        relay_box["events"].append(("fsync", os.path.relpath(path, relay_box["state"])))
    return fsync


def recording_relay(project, **values):
    box = {"events": [], "state": os.path.realpath(project.state)}
    relay = project.relay(sync_mode="file", fsync=recorder(box), **values)
    real = relay.fs.rename

    def rename(src, dst, **k):
        real(src, dst, **k)
        box["events"].append(("rename", src, dst))

    relay.fs.rename = rename
    return relay, box["events"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names descriptors through /proc")
@pytest.mark.parametrize("text, to", [("TO: Ben\n\nx", "archive/"), ("TO: Nobody\n\nx", "failed/")])
def test_file_mode_syncs_the_custody_rename_before_the_move_that_depends_on_it(project, text, to):
    """File by file (any POSIX file system), a directory synced says nothing of another one. The
    archive (or quarantine) move takes the file from the spool, where the custody rename put it:
    were archive/ synced and outbox/ not when the power went, the file would come back in both
    places, and the copy in the outbox would be taken as a new message and delivered twice. So
    outbox/<a> and spool/<a> are synced before the move out of the spool."""
    relay, events = recording_relay(project)
    project.drop("Ann", "m", text)
    relay.step()
    custody = next(i for i, e in enumerate(events) if e[0] == "rename" and e[1] == "outbox/Ann/m")
    move = next(i for i, e in enumerate(events) if e[0] == "rename" and e[2].startswith(to))
    synced = {e[1] for e in events[custody:move] if e[0] == "fsync"}
    assert {"outbox/Ann", "spool/Ann"} <= synced, events



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


def test_a_close_hint_on_a_fifo_a_link_or_a_hard_link_opens_and_changes_nothing_outside(project, tmp_path):
    """A hint skips the settle time and the look for writers: it must not skip the checks on
    what the entry is. A FIFO is quarantined unopened (opening it would block on a writer),
    a symbolic link is quarantined as one (its target untouched), and a hard link to a file
    outside is delivered from a private copy, the outside file left as it was."""
    relay = project.relay()
    box = project.state / "outbox/Ann"
    box.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "secret"
    outside.write_text("TO: Ben\n\nsecret")
    outside.chmod(0o666)
    before = outside.stat()
    os.mkfifo(box / "fifo")
    os.symlink(outside, box / "link")
    os.link(outside, box / "hard")
    for name in ("fifo", "link", "hard"):
        relay.hint("closed", "Ann", name)
    relay.step()
    rows = {r["name"]: r for r in relay.history.audit()}
    assert rows["fifo"]["status"] == "failed" and "FIFO" in rows["fifo"]["error"]
    assert rows["link"]["status"] == "failed" and "symbolic link" in rows["link"]["error"]
    assert rows["hard"]["status"] == "archived"
    assert [e["body"] for e in project.inbox("Ben")] == ["secret"]
    after = outside.stat()
    assert (after.st_mode, after.st_nlink, after.st_mtime_ns) == (before.st_mode, before.st_nlink, before.st_mtime_ns)
    assert outside.read_text() == "TO: Ben\n\nsecret"
    assert sorted(os.listdir(box)) == []


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


def test_the_parsers_shortcuts_at_their_edges():
    """Inputs at the edges of parse()'s shortcuts (the same outcomes as the plain rules give,
    checked against the previous parser over 200,000 random files while reviewing them)."""
    from relay.errors import MessageRefused, TooLarge
    from relay.core.message import parse

    def body(data, limit=1000):
        return parse(data, "m", limit).body

    assert body(b"TO: Ben\r\n\r\na\rb\r\nc") == "a\rb\nc"       # a lone CR stays, CRLF becomes LF
    with pytest.raises(MessageRefused, match="invalid recipient name"):
        parse(b"TO: Ben\r\rbody", "m", 1000)                     # CR alone ends no line
    assert parse(b"\n \t{\"to\": \"Ben\", \"body\": \"j\"}", "m", 1000).format == "json"
    assert body(b"TO: Ben\n\n" + "é".encode() * 500) == "é" * 500      # 1,000 bytes: fits
    with pytest.raises(TooLarge, match="1002 bytes"):
        parse(b"TO: Ben\n\n" + "é".encode() * 501, "m", 1000)
    with pytest.raises(MessageRefused, match="empty"):
        parse(b" \t\r\n\x0b\x0c", "m", 1000)
    assert parse(b"TO:  Ben ,Ben,  \n\nx", "m", 1000).to == ("Ben",)
    assert parse(b"TO: Ben\n \t\nx", "m", 1000).body == "x"          # a blank line of spaces ends the headers
