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
