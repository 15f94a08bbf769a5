"""What a scan reads ahead (Outbox.read_ahead, read by a file's writers' check before its claim)
is the message registered for that file and no other: attacks on the bytes read ahead that
outlive their claim, a name used again, and the bound on what is held."""
import os

from relay.core.daemon import Relay


def bodies(project, agent="Ben"):
    return sorted(e["body"] for e in project.inbox(agent))


def archived(project):
    """The agents' originals archived (a bounce to a sender, archived under System, aside)."""
    return sorted(p.read_text() for p in project.files("archive") if p.parent.name != "System")


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


# -- what the agent does between the scan's read and a later claim: held ---------------------

def queued(project, *names):
    """A relay that claims one message per step, after a step that read every file named and
    claimed the first: the others wait, read ahead, for their claims."""
    relay = Relay(project.config(agents=["Ann", "Ben"]), clock=project.clock, batch=1)
    project.relays.append(relay)
    now = project.clock.now - 100
    for i, name in enumerate(names):
        dated(project.drop("Ann", name, f"TO: Ben\n\n{name}"), now + i)
    relay.step()
    assert set(relay.outbox.read_ahead) == {("Ann", n) for n in names[1:]}
    return relay


def finish(relay, project):
    steps(relay, project, n=4)
    relay.hint("rescan")
    steps(relay, project, n=4)


def test_made_group_writable_after_the_read_is_delivered_once_and_archived_read_only(project):
    relay = queued(project, "a", "b")
    (project.state / "outbox/Ann/b").chmod(0o666)
    finish(relay, project)
    assert bodies(project) == ["a", "b"]
    [b] = [p for p in project.files("archive") if p.name.endswith("--b")]
    assert not b.stat().st_mode & 0o022


def test_hard_linked_outside_after_the_read_is_archived_as_a_private_copy(project):
    relay = queued(project, "a", "b")
    outside = project.root / "outside-b"
    os.link(project.state / "outbox/Ann/b", outside)
    finish(relay, project)
    assert bodies(project) == ["a", "b"]
    outside.write_text("changed through the other name")
    assert archived(project) == ["TO: Ben\n\na", "TO: Ben\n\nb"]
    assert outside.read_text() == "changed through the other name" and outside.stat().st_nlink == 1


def test_swapped_for_a_fifo_after_the_read_delivers_the_bytes_read_and_never_opens_the_fifo(project):
    relay = queued(project, "a", "b")
    box = project.state / "outbox/Ann"
    (box / "b").unlink()
    os.mkfifo(box / "b")
    finish(relay, project)          # opening the FIFO to read would block: the time limit fails it
    assert bodies(project) == ["a", "b"] and archived(project) == ["TO: Ben\n\na", "TO: Ben\n\nb"]
    assert [r["status"] for r in relay.history.audit()].count("failed") == 1
    assert not (box / "b").exists()


def test_swapped_for_a_symlink_after_the_read_leaves_its_target_alone(project):
    relay = queued(project, "a", "b")
    target = project.root / "target"
    target.write_text("TO: Ben\n\nnot relay's")
    box = project.state / "outbox/Ann"
    (box / "b").unlink()
    os.symlink(target, box / "b")
    finish(relay, project)
    assert bodies(project) == ["a", "b"]
    assert target.read_text() == "TO: Ben\n\nnot relay's"
    assert [r["status"] for r in relay.history.audit()].count("failed") == 1


def test_outbox_swapped_for_a_link_outside_after_the_read_moves_nothing_out_there(project):
    relay = queued(project, "a", "b")
    elsewhere = project.root / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "b").write_text("TO: Ben\n\nnot relay's")
    box = project.state / "outbox/Ann"
    os.rename(box, project.root / "moved-away")
    os.symlink(elsewhere, box)
    finish(relay, project)
    assert bodies(project) == ["a", "b"]
    assert (elsewhere / "b").read_text() == "TO: Ben\n\nnot relay's"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["b"]


def test_renamed_over_after_the_read_both_are_delivered_once(project):
    relay = queued(project, "a", "b")
    project.drop("Ann", "b", "TO: Ben\n\nb again")
    finish(relay, project)
    assert bodies(project) == ["a", "b", "b again"]
    assert archived(project) == ["TO: Ben\n\na", "TO: Ben\n\nb", "TO: Ben\n\nb again"]


def test_held_open_for_writing_after_the_read_waits_for_its_writer(project):
    relay = queued(project, "a", "b")
    with open(project.state / "outbox/Ann/b", "a") as writer:
        steps(relay, project, n=3)
        assert bodies(project) == ["a"]
        writer.write(" and more")
    finish(relay, project)
    assert bodies(project) == ["a", "b and more"]
    assert archived(project) == ["TO: Ben\n\na", "TO: Ben\n\nb and more"]


def test_deleted_and_written_again_after_the_read_delivers_both_once(project):
    relay = queued(project, "a", "b", "c")
    box = project.state / "outbox/Ann"
    (box / "b").unlink()
    (box / "c").write_text("TO: Ben\n\nc rewritten")        # in place, same inode
    relay.hint("closed", "Ann", "c")
    finish(relay, project)
    assert bodies(project) == ["a", "b", "c", "c rewritten"]


def test_a_relay_stopped_between_the_read_and_custody_delivers_what_is_there_once(project):
    # As kill -9 after the claim: nothing of the first relay's memory survives; the file was
    # written again before its claim was taken: the second relay delivers what is there.
    relay = queued(project, "a", "b")

    class Killed(BaseException):
        pass

    def deliver(*a, **k):
        raise Killed
    relay.inbox.deliver = deliver
    project.drop("Ann", "b", "TO: Ben\n\nb rewritten")
    try:
        relay.step()
    except Killed:
        pass
    second = project.relay(agents=["Ann", "Ben"])
    second.drain()
    assert bodies(project) == ["a", "b rewritten"]
    assert archived(project) == ["TO: Ben\n\na", "TO: Ben\n\nb rewritten"]


def test_what_is_read_ahead_stays_within_its_bound_and_is_counted_exactly(project):
    # Many files over the bound, claims deferred by the batch's byte budget, files looked at
    # again (hints of every kind) and rescans in between: the count is the sum of what is held,
    # it never passes the bound by more than one file, and nothing is held once all is done.
    from relay.core import readahead
    relay = Relay(project.config(agents=["Ann", "Ben"], batch_bytes=2000), clock=project.clock, batch=7)
    project.relays.append(relay)
    box = relay.outbox
    box.read_ahead.limit = 20 * (readahead.COST + 200)
    most = box.read_ahead.limit + readahead.COST + 300

    def held():
        assert box.read_ahead.held == sum(len(e[0]) + readahead.COST for e in box.read_ahead.values())
        assert box.read_ahead.held <= most and box.read_ahead.unbound == []

    for i in range(120):
        project.drop("Ann", f"m{i:03d}", f"TO: Ben\n\n{i:03d}" + "x" * (i % 3 * 100))
    for turn in range(40):
        project.clock.advance(1)
        relay.step()
        held()
        if turn % 5 == 1:
            relay.hint("rescan")
        if turn % 5 == 2:
            relay.hint("dir", "Ann")
        if turn % 5 == 3:
            for name in sorted(p.name for p in (project.state / "outbox/Ann").iterdir())[:5]:
                relay.hint("file", "Ann", name)
    relay.drain()
    assert len(project.inbox("Ben")) == 120 and len(set(bodies(project))) == 120
    assert box.read_ahead == {} and box.read_ahead.held == 0


def test_an_empty_file_read_ahead_then_swapped_for_a_fifo_never_opens_the_fifo(project):
    # The FIFO made after the empty file is deleted takes its inode number (ext4 reuses it at
    # once) and has its size, 0: custody's look at whether the name still holds the bytes
    # read must not open it (opening a device may act on it).
    relay = queued(project, "a", "c")
    box = project.state / "outbox/Ann"
    dated(project.drop("Ann", "b", b""), project.clock.now - 50)
    relay.hint("dir", "Ann")
    steps(relay, project, n=1)          # b found and read (empty); c's claim came first
    assert relay.outbox.read_ahead[("Ann", "b")][0] == b""
    ino = (box / "b").stat().st_ino
    (box / "b").unlink()
    os.mkfifo(box / "b")
    reused = (box / "b").stat().st_ino == ino
    opened = []
    real = relay.fs.open_read
    relay.fs.open_read = lambda rel: (opened.append(rel), real(rel))[1]
    finish(relay, project)
    assert "outbox/Ann/b" not in opened, f"inode reused: {reused}"
    assert bodies(project) == ["a", "c"]
    assert [r["status"] for r in relay.history.audit()].count("failed") == 2   # empty, and the FIFO
