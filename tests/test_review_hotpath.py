"""Attacks on the daemon's hot path: the order of its syncs against a power cut, completeness of
a file hinted closed, the loop's wake-ups, and the parsers' edge cases."""
import os

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


def test_a_file_held_open_after_its_close_hint_is_looked_at_less_and_less_often(project, clock):
    """A hint that a file was closed (or renamed in) lets relay claim it without first looking
    for writers; the lease on the spooled file finds one still holding it, and defers it. An
    agent that never lets go must not make relay claim it, commit and log again every settle
    time for ever: the deferrals back off (as retries do), and the file is delivered whole,
    soon after the writer lets go."""
    relay = project.relay(settle="250ms")
    box = project.state / "outbox/Ann"
    box.mkdir(parents=True, exist_ok=True)
    with open(box / ".m.tmp", "w") as f:
        f.write("TO: Ben\n\nhalf")
        f.flush()
        os.rename(box / ".m.tmp", box / "m")
        relay.hint("closed", "Ann", "m")
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
