"""What a scan reads ahead (Outbox.read_ahead, read by a file's writers' check before its claim)
is the message registered for that file and no other: attacks on the bytes read ahead that
outlive their claim, a name used again, and the bound on what is held."""
import os

from relay.daemon import Relay


def bodies(project, agent="Ben"):
    return sorted(e["body"] for e in project.inbox(agent))


def archived(project):
    return sorted(p.read_text() for p in project.files("archive"))


def dated(path, when):
    os.utime(path, (when, when))
    return path


def steps(relay, project, n=6):
    """Steps without a recovery (drain() recovers, and so rescans): hints and due rows only."""
    for _ in range(n):
        project.clock.advance(1)
        relay.step()


def test_bytes_read_ahead_for_a_message_claimed_without_them_are_not_delivered_for_the_next_one(project):
    # The second file's claim is deferred (the batch holds enough bytes), so its claim reads it
    # again later from the spool and the bytes the scan read for it stay behind. The agent then
    # writes the same name again: that new message must be its own bytes, not the old ones.
    relay = project.relay(batch_bytes=1)
    now = project.clock.now - 100
    dated(project.drop("Ann", "a", "TO: Ben\n\nfirst"), now)
    dated(project.drop("Ann", "msg", "TO: Ben\n\nold"), now + 1)
    relay.step()
    steps(relay, project)
    assert bodies(project) == ["first", "old"]
    project.drop("Ann", "msg", "TO: Ben\n\nnew")
    relay.hint("closed", "Ann", "msg")
    steps(relay, project)
    assert bodies(project) == ["first", "new", "old"]
    assert archived(project) == ["TO: Ben\n\nfirst", "TO: Ben\n\nnew", "TO: Ben\n\nold"]


def test_bytes_read_ahead_for_a_path_already_registered_are_not_delivered_for_a_later_message(project):
    # The first claim cannot take the file into the spool (a transient error): its row waits
    # for a retry with the file in the outbox. A look at the file then reads it, and its Found
    # registers nothing (the path has its row). The retry delivers it; then the agent puts a
    # symbolic link at the name: quarantined, never delivered as the old bytes.
    relay = project.relay()
    project.drop("Ann", "msg", "TO: Ben\n\nold")
    real = relay.fs.rename
    refused = []

    def rename(src, dst, *a, **k):
        if dst.startswith("spool/"):
            refused.append(dst)
            raise PermissionError(13, "Permission denied")
        return real(src, dst, *a, **k)

    relay.fs.rename = rename
    relay.step()
    relay.fs.rename = real
    assert refused and bodies(project) == []
    assert (project.state / "outbox/Ann/msg").exists()
    relay.hint("file", "Ann", "msg")            # looked at again: read, registered already
    steps(relay, project)                       # its retry after the backoff
    assert bodies(project) == ["old"]
    outside = project.root / "outside"
    outside.write_text("TO: Ben\n\nsecret")
    os.symlink(outside, project.state / "outbox/Ann/msg")
    relay.hint("closed", "Ann", "msg")
    steps(relay, project)
    assert bodies(project) == ["old"] and outside.read_text() == "TO: Ben\n\nsecret"
    assert [r["status"] for r in relay.history.audit()].count("failed") == 1
