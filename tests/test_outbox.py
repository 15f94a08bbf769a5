"""When a file in an outbox is ready to be taken: settled by relay's clock, no writer holding it
(found by a lease, before the claim and again on the spooled file after custody), a close hint
that skips the wait but not the look, and the size cap before anything is read. A file held open
is deferred, looked at less and less often, and named by run --once when its patience runs out."""
import contextlib
import os

import pytest

from relay.core.outbox import HEADER_ALLOWANCE


def test_a_file_hint_is_not_a_closed_hint(project):
    relay = project.relay(settle="5s")
    path = project.drop("Ann", "m", "TO: Ben\n\nslow", in_place=True)
    now = os.stat(path).st_mtime
    relay.hint("file", "Ann", "m")
    assert relay.step(now + 0.1).registered == 0          # may still be written
    path2 = project.drop("Ann", "n", "TO: Ben\n\ndone", in_place=True)
    relay.hint("closed", "Ann", "n")
    assert relay.step(os.stat(path2).st_mtime + 0.1).archived == 1


def test_a_file_dated_in_the_future_waits_for_settle_by_relays_clock(project, clock):
    relay = project.relay(settle="1s")
    path = project.drop("Ann", "m", "TO: Ben\n\nlater", in_place=True)
    os.utime(path, (clock.now + 3600, clock.now + 3600))
    assert relay.step(clock.now).registered == 0
    with open(path, "a") as f:                      # changed: the wait starts again
        f.write(" more")
    os.utime(path, (clock.now + 3600, clock.now + 3600))
    assert relay.step(clock.advance(0.9)).registered == 0
    assert relay.step(clock.advance(0.5)).registered == 0
    assert relay.step(clock.advance(1.0)).archived == 1
    assert [e["body"] for e in project.inbox("Ben")] == ["later more"]


@pytest.mark.parametrize("settle, dated, wait", [("1s", -1.0, 0), ("1s", -0.5, 0.5), ("250ms", 0.5, 0.25)])
def test_a_file_is_taken_once_settle_has_passed_by_relays_clock(project, clock, settle, dated, wait):
    """A file dated a whole settle ago is settled; one dated half of it ago waits for the other
    half; one dated ahead of relay's clock waits one settle from when relay first saw it."""
    relay = project.relay(settle=settle)
    clock.now = float(int(clock.now))           # whole seconds: the file's time is kept exactly
    path = project.drop("Ann", "m", "TO: Ben\n\nx", in_place=True)
    os.utime(path, (clock.now + dated, clock.now + dated))
    if wait:
        assert relay.step(clock.now).registered == 0
        assert relay.step(clock.advance(wait / 2)).registered == 0
        clock.advance(wait / 2)
    assert relay.step(clock.now).registered == 1


def test_a_held_open_file_is_found_busy_before_any_claim(project):
    relay = project.relay()
    path = project.state / "outbox/Ann/m"
    with open(path, "w") as f:
        f.write("TO: Ben\n\nhalf")
        f.flush()
        assert relay.outbox.check("Ann", "m", project.clock.now + 100) is None
        assert relay.outbox.waiting[("Ann", "m")][1] == "held open for writing"


def test_a_file_renamed_in_while_still_held_open_is_deferred_then_delivered_whole(project, clock):
    # A hint that it was closed or renamed in skips the look for writers before the claim; the
    # lease taken on the spooled file finds the writer, and nothing half-written is delivered.
    relay = project.relay(settle="1s")
    box = project.state / "outbox/Ann"
    with open(box / ".m.tmp", "w") as f:
        f.write("TO: Ben\n\nhalf")
        f.flush()
        os.rename(box / ".m.tmp", box / "m")
        relay.hint("closed", "Ann", "m")
        counts = relay.step(clock.now)
        assert counts.claimed == 1 and counts.deferred == 1 and project.inbox("Ben") == []
        f.write(" and whole")
    relay.step(clock.advance(2))
    assert [e["body"] for e in project.inbox("Ben")] == ["half and whole"]


def test_no_lease_is_left_on_a_file_relay_looked_at(project, clock):
    """The read lease that finds writers goes with the descriptor: once a step has looked at
    files (held by a writer or not), relay holds no lease, so no agent's open waits on one."""
    relay = project.relay(settle="1s")
    project.drop("Ann", "done", b"TO: Ben\n\nwhole")
    box = project.state / "outbox/Ann"
    with open(box / "held", "w") as f:
        f.write("TO: Ben\n\nhalf")
        f.flush()
        relay.step(clock.advance(5))        # a rescan: the look for writers, then the read
        leases = [line for line in open("/proc/locks") if "LEASE" in line and f" {os.getpid()} " in line]
        assert leases == [] and project.inbox("Ben") != []


def test_a_file_over_the_cap_is_refused_by_its_size_before_it_is_read(project):
    relay = project.relay(max_body_bytes=1000)
    project.drop("Ann", "big", b"TO: Ben\n\n" + b"x" * (1000 + HEADER_ALLOWANCE))
    relay.drain()
    [row] = relay.history.audit(sender="Ann")      # (its bounce to Ann aside)
    assert row["status"] == "failed" and "bytes, over max_body_bytes (1000) plus room for headers" in row["error"]


@pytest.mark.parametrize("mode", [0o644, 0o664], ids=["plain", "group-writable"])  # read in the outbox, or in the spool
def test_a_file_of_exactly_the_cap_is_read_and_delivered(project, mode):
    """max_body_bytes of body after headers that fill HEADER_ALLOWANCE: the largest file taken."""
    relay = project.relay(max_body_bytes=1000)
    lines = [b"TO: Ben\n"] + [b"X-Pad: " + b"p" * (65534 - 8) + b"\n"] * 3
    pad = HEADER_ALLOWANCE - 1 - sum(map(len, lines))           # the blank line ends the headers
    data = b"".join(lines) + b"X-Pad: " + b"p" * (pad - 8) + b"\n\n" + b"b" * 1000
    assert len(data) == 1000 + HEADER_ALLOWANCE
    project.drop("Ann", "m", data).chmod(mode)
    relay.drain()
    [row] = relay.history.audit(sender="Ann")
    assert row["status"] == "archived", row["error"]
    assert [len(e["body"]) for e in project.inbox("Ben")] == [1000]


@pytest.mark.parametrize("mode", [0o644, 0o664], ids=["plain", "group-writable"])
def test_a_file_with_one_link_is_archived_by_rename_and_keeps_its_inode(project, mode):
    relay = project.relay()
    path = project.drop("Ann", "m", "TO: Ben\n\nx")
    path.chmod(mode)
    inode = path.stat().st_ino
    relay.drain()
    [archived] = project.files("archive")
    assert archived.stat().st_ino == inode and archived.read_text() == "TO: Ben\n\nx"
    assert archived.stat().st_mode & 0o777 == 0o644             # made writable by its owner alone


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


@pytest.mark.parametrize("make, what", [
    (lambda path: os.mkfifo(path), "a FIFO (named pipe)"),
    (lambda path: __import__("socket").socket(__import__("socket").AF_UNIX).bind(str(path)), "a socket"),
    (lambda path: os.mknod(path, 0o600 | __import__("stat").S_IFCHR, os.makedev(1, 3)), "a device file"),
])
def test_a_fifo_a_socket_or_a_device_in_an_outbox_is_refused_naming_what_it_is(project, make, what):
    relay = project.relay()
    try:
        make(project.state / "outbox/Ann/odd")
    except PermissionError:
        pytest.skip("no right to make it here")
    relay.hint("rescan")
    relay.drain()
    [row] = [r for r in relay.history.audit() if r["sender"] == "Ann"]
    assert row["status"] == "failed"
    assert row["error"].endswith(f"{what}: relay only relays regular files and never opens these; "
                                 "write the message as a plain file")
    assert project.inbox("Ben") == []


def test_a_file_dated_in_the_future_looked_at_again_before_settle_still_waits(project, clock):
    """Seen unchanged again before a settle time has passed since relay first saw it (a file
    hint, not a close): it still waits; once the settle time has passed, it is taken."""
    relay = project.relay(settle="1s")
    path = project.drop("Ann", "m", "TO: Ben\n\nlater", in_place=True)
    os.utime(path, (clock.now + 3600, clock.now + 3600))
    assert relay.step(clock.now).registered == 0
    relay.hint("file", "Ann", "m")
    assert relay.step(clock.advance(0.5)).registered == 0
    relay.hint("file", "Ann", "m")
    assert relay.step(clock.advance(0.4)).registered == 0
    relay.hint("file", "Ann", "m")
    assert relay.step(clock.advance(0.2)).archived == 1
    assert [e["body"] for e in project.inbox("Ben")] == ["later"]


@pytest.mark.parametrize("sender", ["System", "system", "System.", "broadcast", "_Broadcast", "bad name"])
def test_a_close_hint_for_a_file_of_no_served_outbox_takes_nothing(project, clock, sender):
    """Hints are hints: one naming an outbox the rescan does not read (a name relay keeps for
    itself, in any case or with '.', '_' or '-' at its ends, or an invalid agent name) takes
    nothing, while one for a served agent's file is taken in the same step."""
    relay = project.relay(rescan_interval="1h")
    relay.step(clock.now)                   # the rescan at start
    odd = project.state / "outbox" / sender
    odd.mkdir(exist_ok=True)
    (odd / "m").write_text("TO: Ben\n\nnot from an agent")
    project.drop("Ann", "m", "TO: Ben\n\nfrom Ann")
    relay.hint("closed", sender, "m")
    relay.hint("closed", "Ann", "m")
    counts = relay.step(clock.advance(1))
    assert counts.registered == 1 and counts.archived == 1
    assert [e["body"] for e in project.inbox("Ben")] == ["from Ann"]
    assert (odd / "m").exists() and [r["sender"] for r in relay.history.audit()] == ["Ann"]


def test_what_waits_in_an_outbox_is_said_with_why_and_for_how_long(project, clock):
    relay = project.relay(settle="5s", rescan_interval="1h")
    now = clock.now
    plain = project.drop("Ann", "plain", "TO: Ben\n\nx", in_place=True)
    os.utime(plain, (now - 1, now - 1))
    linked = project.drop("Ann", "linked", "TO: Ben\n\nx", in_place=True)
    os.link(linked, project.root / "elsewhere")
    os.utime(linked, (now - 1, now - 1))
    future = project.drop("Ann", "future", "TO: Ben\n\nx", in_place=True)
    os.utime(future, (now + 3600, now + 3600))
    assert relay.step(now).registered == 0
    assert relay.outbox.left(now, 0) == [("outbox/Ann/future", "settling (dated in the future)", 0.0),
                                         ("outbox/Ann/linked", "has other hard links", 0.0),
                                         ("outbox/Ann/plain", "settling", 0.0)]
    assert relay.outbox.left(now + 2, 2) == [(p, why, 2.0) for p, why, _ in relay.outbox.left(now, 0)]
    assert relay.outbox.left(now + 2, 2.001) == []
    assert relay.step(now + 4.5).registered == 2                   # five seconds past their mtime
    assert [p for p, _, _ in relay.outbox.left(now + 4.5, 0)] == ["outbox/Ann/future"]


def test_a_directory_or_a_name_being_written_in_an_outbox_is_never_taken_by_a_hint_or_a_rescan(project, clock):
    relay = project.relay()
    box = project.state / "outbox/Ann"
    box.mkdir(parents=True, exist_ok=True)
    (box / "adir").mkdir()
    (box / "adir" / "inner").write_text("TO: Ben\n\nx")
    for name in (".m.tmp", "m.tmp", ".hidden"):
        (box / name).write_text("TO: Ben\n\nbeing written")
    for name in ("adir", ".m.tmp", "m.tmp", ".hidden"):
        relay.hint("closed", "Ann", name)
    relay.hint("rescan")
    assert relay.step(clock.advance(1)).registered == 0
    assert list(relay.history.audit()) == [] and relay.outbox.left(clock.now, 0) == []
    assert sorted(p.name for p in box.iterdir()) == [".hidden", ".m.tmp", "adir", "m.tmp"]


def test_a_hard_linked_file_is_taken_at_exactly_settle_and_one_dated_now_is_settling_not_future(project, clock):
    relay = project.relay(settle="5s", rescan_interval="1h")
    now = float(int(clock.now))
    linked = project.drop("Ann", "linked", "TO: Ben\n\nlinked", in_place=True)
    os.link(linked, project.root / "elsewhere")
    os.utime(linked, (now - 1, now - 1))
    dated_now = project.drop("Ann", "now", "TO: Ben\n\nnow", in_place=True)
    os.utime(dated_now, (now, now))
    assert relay.step(now).registered == 0
    assert relay.outbox.left(now, 0) == [("outbox/Ann/linked", "has other hard links", 0.0),
                                         ("outbox/Ann/now", "settling", 0.0)]
    assert relay.step(now + 3.999).registered == 0
    assert relay.step(now + 4).registered == 1                     # exactly five seconds past its mtime
    assert [e["body"] for e in project.inbox("Ben")] == ["linked"]
    assert relay.step(now + 5).registered == 1


@pytest.mark.parametrize("links", [1, 2])
def test_a_file_its_writer_closed_is_taken_at_once_whatever_the_settle_time_and_one_only_seen_waits(project, links):
    relay = project.relay(settle="1h")
    now_file = project.drop("Ann", "closed", "TO: Ben\n\nclosed", in_place=True)
    seen_file = project.drop("Ann", "seen", "TO: Ben\n\nseen", in_place=True)
    if links == 2:                  # another name for each: taken all the same once closed (a private copy)
        os.link(now_file, project.root / "closed-link")
        os.link(seen_file, project.root / "seen-link")
    relay.hint("closed", "Ann", "closed")
    relay.hint("file", "Ann", "seen")
    assert relay.step().archived == 1
    assert [e["body"] for e in project.inbox("Ben")] == ["closed"]
    assert seen_file.exists()


def test_a_file_dated_in_relays_future_is_taken_at_once_when_closed_and_waits_the_settle_time_when_only_seen(
        project, clock):
    relay = project.relay(settle="30s")
    closed = project.drop("Ann", "closed", "TO: Ben\n\nclosed", in_place=True)
    seen = project.drop("Ann", "seen", "TO: Ben\n\nseen", in_place=True)
    for p in (closed, seen):
        os.utime(p, (clock.now + 3600, clock.now + 3600))
    relay.hint("closed", "Ann", "closed")
    relay.hint("file", "Ann", "seen")
    assert relay.step().archived == 1 and [e["body"] for e in project.inbox("Ben")] == ["closed"]
    clock.advance(29)
    relay.hint("file", "Ann", "seen")
    assert relay.step().archived == 0
    clock.advance(2)
    relay.hint("file", "Ann", "seen")
    assert relay.step().archived == 1
    assert [e["body"] for e in project.inbox("Ben")] == ["closed", "seen"]
