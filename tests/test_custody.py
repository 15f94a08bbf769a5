"""The window between reading a claimed file in the outbox and taking custody of it (daemon.py:
the claim's log is synced with the envelopes, then each file is renamed into the spool). Whatever
the agent does to its file in that window, the message claimed is the bytes relay read: delivered
once, archived as delivered; what the agent put at the name since is a new message; nothing
outside the state directory is touched. Driven by wrapping Inbox.deliver, which takes custody
through its `custody` callback after the envelopes' sync."""
import errno
import hashlib
import os
import stat

import pytest

from relay.errors import LogSyncError
from relay.files.sync import MAX_HELD


def before_custody(relay, act):
    """Run `act()` inside the batch, after the files are read and before custody."""
    real = relay.inbox.deliver

    def deliver(works, custody=None):
        act()
        return real(works, custody=custody)

    relay.inbox.deliver = deliver


def bodies(project, agent="Ben"):
    return sorted(e["body"] for e in project.inbox(agent))


def archived(project):
    return sorted(p.read_text() for p in project.files("archive"))


def test_written_again_before_custody_the_bytes_read_are_the_message(project, clock):
    relay = project.relay()
    project.drop("Ann", "msg", "TO: Ben\n\nfirst")
    before_custody(relay, lambda: project.drop("Ann", "msg", "TO: Ben\n\nsecond"))
    assert relay.step().archived == 1
    assert bodies(project) == ["first"] and archived(project) == ["TO: Ben\n\nfirst"]
    assert (project.state / "outbox/Ann/msg").read_text() == "TO: Ben\n\nsecond"   # a new message
    relay.inbox.deliver = type(relay.inbox).deliver.__get__(relay.inbox)
    relay.hint("rescan")
    relay.drain()
    assert bodies(project) == ["first", "second"]
    assert archived(project) == ["TO: Ben\n\nfirst", "TO: Ben\n\nsecond"]
    assert [p for p in (project.state / "spool").rglob("*") if not p.is_dir()] == []


def test_appended_to_in_place_before_custody_the_bytes_read_are_the_message(project):
    relay = project.relay()
    path = project.drop("Ann", "msg", "TO: Ben\n\nfirst")

    def append():
        with open(path, "a") as f:
            f.write(" and more")

    before_custody(relay, append)
    relay.step()
    assert bodies(project) == ["first"] and archived(project) == ["TO: Ben\n\nfirst"]
    assert path.read_text() == "TO: Ben\n\nfirst and more"      # the agent's file, left as it is


def test_hard_linked_out_before_custody_the_archive_holds_relays_own_copy(project, tmp_path):
    relay = project.relay()
    path = project.drop("Ann", "msg", "TO: Ben\n\nfirst")
    outside = tmp_path / "outside-link"
    before_custody(relay, lambda: os.link(path, outside))
    relay.step()
    [kept] = project.files("archive")
    assert kept.read_text() == "TO: Ben\n\nfirst" and bodies(project) == ["first"]
    assert os.stat(kept).st_ino != os.stat(outside).st_ino and os.stat(outside).st_nlink == 1
    with open(outside, "a") as f:                   # the outside name cannot change the archive
        f.write("tampered")
    assert kept.read_text() == "TO: Ben\n\nfirst"


def test_swapped_for_a_link_before_custody_nothing_outside_is_touched(project, tmp_path):
    relay = project.relay()
    path = project.drop("Ann", "msg", "TO: Ben\n\nfirst")
    secret = tmp_path / "secret"
    secret.write_text("TO: Ben\n\nsecret")

    def swap():
        path.unlink()
        path.symlink_to(secret)

    before_custody(relay, swap)
    relay.step()
    assert bodies(project) == ["first"] and archived(project) == ["TO: Ben\n\nfirst"]
    assert secret.read_text() == "TO: Ben\n\nsecret" and path.is_symlink()
    relay.inbox.deliver = type(relay.inbox).deliver.__get__(relay.inbox)
    relay.hint("rescan")
    relay.drain()                                   # the link is a new "message": refused, moved aside
    assert bodies(project) == ["first"] and secret.read_text() == "TO: Ben\n\nsecret"
    assert any("symbolic link" in (r["error"] or "") for r in relay.history.audit())


def test_made_group_writable_before_custody_the_archive_is_not(project):
    relay = project.relay()
    path = project.drop("Ann", "msg", "TO: Ben\n\nfirst")
    before_custody(relay, lambda: os.chmod(path, 0o666))
    relay.step()
    [kept] = project.files("archive")
    assert stat.S_IMODE(os.stat(kept).st_mode) & 0o022 == 0 and bodies(project) == ["first"]


def test_opened_for_writing_before_custody_is_deferred_then_delivered_whole(project, clock):
    relay = project.relay(settle="1s")
    path = project.drop("Ann", "msg", "TO: Ben\n\nfirst")
    held = []
    before_custody(relay, lambda: held.append(open(path, "a")))
    counts = relay.step()
    assert counts.deferred == 1 and project.inbox("Ben") == []
    assert list((project.state / "inbox/Ben/tmp").iterdir()) == []      # its envelope not left
    held[0].write(" and whole")
    held[0].close()
    relay.inbox.deliver = type(relay.inbox).deliver.__get__(relay.inbox)
    relay.drain(wait=clock.advance)
    assert bodies(project) == ["first and whole"] and archived(project) == ["TO: Ben\n\nfirst and whole"]


def test_swapped_between_the_look_and_the_rename_is_read_again(project, clock):
    """A file renamed over the name in the instant between take()'s look and its rename is the
    one moved: it is read again from the spool next time, never delivered as the bytes read."""
    relay = project.relay(retry_backoff="1s")
    path = project.drop("Ann", "msg", "TO: Ben\n\nfirst")
    real = relay.fs.rename

    def rename(src, dst, **k):
        if src == "outbox/Ann/msg" and path.read_text().endswith("first"):
            project.drop("Ann", "msg", "TO: Ben\n\nsecond")
        return real(src, dst, **k)

    relay.fs.rename = rename
    counts = relay.step()
    assert counts.retried == 1 and project.inbox("Ben") == []
    relay.fs.rename = real
    relay.drain(wait=clock.advance)
    assert bodies(project) == ["second"] and archived(project) == ["TO: Ben\n\nsecond"]


@pytest.mark.parametrize("mode", ["fs", "file"])
def test_a_step_failing_at_custody_leaves_it_to_recovery_exactly_once(project, mode):
    """The process dies (a step that raises) right after the envelopes' sync, before any file is
    taken: recovery on the same state directory delivers each message once."""
    relay = project.relay(sync_mode=mode)
    for i in range(3):
        project.drop("Ann", f"m{i}", f"TO: Ben\n\nbody {i}")

    def die():
        raise RuntimeError("killed")

    real = relay.inbox.deliver
    relay.inbox.deliver = lambda works, custody=None: real(works, custody=die)
    with pytest.raises(RuntimeError):
        relay.step()
    relay.close()
    project.relays.remove(relay)
    again = project.relay(sync_mode=mode)
    again.recover()
    again.drain()
    assert bodies(project) == ["body 0", "body 1", "body 2"]
    assert len(project.files("archive")) == 3 and again.history.counts()["archived"] == 3


def test_a_file_that_is_not_regular_is_never_opened(project):
    """A FIFO (or a device an agent could make) in the outbox is refused by its type alone: it
    is neither read before custody nor after (opening a device may act on it)."""
    relay = project.relay()
    os.mkfifo(project.state / "outbox/Ann/pipe")
    opened = []
    real = relay.fs.open_read
    relay.fs.open_read = lambda rel: (opened.append(rel), real(rel))[1]
    relay.hint("rescan")
    relay.drain()
    assert not any(rel.endswith("pipe") for rel in opened)
    assert any("FIFO" in (r["error"] or "") for r in relay.history.audit())


# -- between the read and custody, once per batch; crashes and syncs at its seams ----------------

def _window(relay, act):
    """Run `act()` after the batch's read and before the envelopes' sync and custody."""
    real = relay.inbox.deliver
    once = [act]

    def deliver(works, **k):
        if once:
            once.pop()()
        return real(works, **k)

    relay.inbox.deliver = deliver
    return real


def _delivered_as_archived(project, agent="Ben"):
    """Every envelope an agent holds has its original archived with the same bytes."""
    archived = {hashlib.sha256(p.read_bytes()).hexdigest() for p in project.files("archive")}
    got = project.inbox(agent)
    for e in got:
        assert e["sha256"] in archived, (e, archived)
    return sorted(e["body"] for e in got)


def test_same_size_rewrite_with_its_mtime_put_back_is_not_archived_for_the_bytes_read(project):
    """An agent writes other bytes of the same length into the file after relay read it and
    sets its mtime back: the name still gives the same inode, size and mtime. What is archived
    is what was delivered (the envelope's sha256), and the bytes written later are not lost."""
    relay = project.relay()
    path = project.drop("Ann", "m", "TO: Ben\n\nfirst")
    st = os.stat(path)

    def rewrite():
        with open(path, "r+b") as f:
            f.write(b"TO: Ben\n\nSECND")
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))

    real = _window(relay, rewrite)
    relay.step()
    relay.inbox.deliver = real
    relay.step(project.clock.advance(60))
    relay.drain()
    assert _delivered_as_archived(project) == ["SECND", "first"]
    assert len(project.files("archive")) == 2


def _after_custody_rename(relay, act):
    """Run `act()` just after the custody rename of a file out of an outbox."""
    real = relay.fs.rename
    once = [act]

    def rename(src, dst, **k):
        out = real(src, dst, **k)
        if src.startswith("outbox/") and once:
            once.pop()()
        return out

    relay.fs.rename = rename


@pytest.mark.parametrize("put_back", [False, True])
def test_a_writer_that_opened_the_file_before_custody_and_wrote_and_closed_after_it(project, put_back):
    """The file is opened for writing after relay read it, the rename into the spool comes,
    then the writer writes (and sets the mtime back) and closes before relay looks for
    writers: what was delivered is what is archived, and nothing is delivered twice."""
    relay = project.relay()
    path = project.drop("Ann", "m", "TO: Ben\n\nfirst")
    st = os.stat(path)
    held = {}
    _window(relay, lambda: held.setdefault("f", open(path, "r+b")))

    def write_and_close():
        held["f"].write(b"TO: Ben\n\nSECND")
        held["f"].flush()
        if put_back:
            os.utime(held["f"].fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))
        held["f"].close()

    _after_custody_rename(relay, write_and_close)
    relay.step()
    relay.step(project.clock.advance(60))
    relay.drain()
    bodies = _delivered_as_archived(project)
    assert len(bodies) == 1 and len(project.files("archive")) == 1, bodies


@pytest.mark.parametrize("change", ["chmod", "hard link"])
def test_a_change_of_mode_or_links_after_the_read_delivers_the_message_once(project, tmp_path, change):
    """A chmod or a hard link made after the read moves the file's change time, not its bytes:
    the message is delivered once (a private copy, or the file made not writable), not kept
    as read and then delivered again as a new message."""
    relay = project.relay()
    path = project.drop("Ann", "m", "TO: Ben\n\nfirst")
    elsewhere = tmp_path / "elsewhere"
    _window(relay, lambda: os.chmod(path, 0o666) if change == "chmod" else os.link(path, elsewhere))
    relay.step()
    relay.drain()
    assert _delivered_as_archived(project) == ["first"]
    [archived] = project.files("archive")
    assert not archived.stat().st_mode & 0o022 and not list((project.state / "outbox/Ann").iterdir())
    if change == "hard link":
        assert elsewhere.read_bytes() == b"TO: Ben\n\nfirst" and archived.stat().st_ino != elsewhere.stat().st_ino


def test_a_failed_sync_of_the_claims_log_fails_the_step_and_is_never_retried(project):
    """"file" mode flushes early once MAX_HELD descriptors are held; the ledger's log, noted
    with the envelopes, is synced by the flush before custody alone, first. Its fsync failing
    (EIO) fails the step: no file is moved into the spool on the strength of that claim, the
    log's sync is not tried again on another descriptor (which would not see the error), and
    recovery then delivers every message once."""
    order = []

    def fail_once(fd):
        if "wal failed" not in order:
            order.append("wal failed")
            raise OSError(errno.EIO, "Input/output error")
        os.fsync(fd)

    relay = project.relay(sync_mode="file")
    relay.syncer.log_sync = fail_once
    real_sync = relay.ledger.sync
    relay.ledger.sync = lambda: (order.append("ledger sync") if relay.ledger.unsynced else None, real_sync())[1]
    for i in range(MAX_HELD // 2 + 2):      # two envelopes each: past MAX_HELD
        project.drop("Ann", f"m{i}", f"TO: Ben, Cy\n\n{i}")
    real = relay.fs.rename
    relay.fs.rename = lambda src, dst, **k: (order.append("take") if src.startswith("outbox/") else None,
                                             real(src, dst, **k))[1]
    with pytest.raises(LogSyncError):
        relay.step()
    assert order == ["wal failed"]          # no take, no second try of the log's sync
    assert list((project.state / "inbox/Ben/new").iterdir()) == []
    relay.fs.rename = real
    relay.recover(stopped=False)
    relay.drain()
    n = MAX_HELD // 2 + 2
    assert len(project.inbox("Ben")) == n and len(project.inbox("Cy")) == n
    assert relay.history.counts()["archived"] == n


def _tree(d):
    """Every entry under `d`: bytes of a file, target of a link, or "dir"."""
    return {str(p.relative_to(d)): os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else "dir"
            for p in sorted(d.rglob("*"))}


WINDOW_ACTS = {
    "deleted": (lambda path, out: path.unlink(), ["first"]),
    "renamed over": (lambda path, out: ((out / "new").write_bytes(b"TO: Ben\n\nsecond"),
                                        os.rename(out / "new", path)), ["first", "second"]),
    "a link to a file outside": (lambda path, out: os.symlink(out / "secret", path.parent / ".l")
                                 or os.rename(path.parent / ".l", path), ["first"]),
    "linked outside": (lambda path, out: os.link(path, out / "hl"), ["first"]),
    "linked outside and deleted": (lambda path, out: os.link(path, out / "hl") or path.unlink(), ["first"]),
    "a FIFO": (lambda path, out: path.unlink() or os.mkfifo(path), ["first"]),
    "appended to": (lambda path, out: open(path, "ab").write(b" more"), ["first", "first more"]),
    "its outbox a link outside": (lambda path, out: os.rename(path.parent, out / "moved")
                                  or os.symlink(out, path.parent), ["first"]),
    "its outbox made again": (lambda path, out: os.rename(path.parent, out / "moved")
                              or path.parent.mkdir(), ["first"]),
}


@pytest.mark.parametrize("mode", ["fs", "file"])
@pytest.mark.parametrize("act", sorted(WINDOW_ACTS))
def test_what_an_agent_does_between_the_read_and_custody(project, tmp_path, act, mode):
    """Each message is delivered once, with the bytes archived; nothing outside the state
    directory is read into a message, written or removed: a file the agent moved there with its
    outbox directory, after relay read it, stays there (custody looks the outbox up again by
    name; the bytes read are delivered from a private copy)."""
    relay = project.relay(sync_mode=mode)
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret").write_bytes(b"TO: Ben\n\nsecret")
    path = project.drop("Ann", "m", "TO: Ben\n\nfirst")
    do, expected = WINDOW_ACTS[act]
    before = _tree(out)
    _window(relay, lambda: do(path, out))
    relay.step()
    for _ in range(3):      # the retries and rescans that come
        relay.step(project.clock.advance(600))
    relay.drain()
    assert _delivered_as_archived(project) == expected
    after = _tree(out)
    assert {k: v for k, v in after.items() if k in before} == before
    assert set(after) - set(before) <= {"hl", "moved", "moved/m"}
    if act.startswith("its outbox"):
        assert (out / "moved" / "m").read_bytes() == b"TO: Ben\n\nfirst"


def test_a_file_opened_for_writing_just_after_custody_is_deferred(project, clock):
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nwhole")
    held = []
    real = relay.fs.rename

    def rename(src, dst, **k):
        real(src, dst, **k)
        if src.startswith("outbox/"):
            held.append(open(project.state / dst, "a"))     # a writer still at it

    relay.fs.rename = rename
    counts = relay.step()
    assert counts.deferred == 1 and project.inbox("Ben") == []
    [row] = relay.history.audit()
    assert row["status"] == "pending" and row["spooled"] == 1
    held[0].close()
    relay.step(clock.advance(1))
    assert [e["body"] for e in project.inbox("Ben")] == ["whole"]


# -- read by a scan's check, before the claim (Outbox.read_ahead) ------------------------------

def before_claim(relay, act):
    """Run `act()` once, after the step's scan has read the files it found, before their claim."""
    real = relay.ledger.messages.register_and_claim

    def claim(*a, **k):
        relay.ledger.messages.register_and_claim = real
        act()
        return real(*a, **k)

    relay.ledger.messages.register_and_claim = claim


def test_read_by_the_scan_then_deleted_before_the_claim_is_delivered_as_read(project):
    relay = project.relay()
    path = project.drop("Ann", "msg", "TO: Ben\n\nfirst")
    before_claim(relay, path.unlink)
    assert relay.step().archived == 1
    assert bodies(project) == ["first"] and archived(project) == ["TO: Ben\n\nfirst"]


def test_read_by_the_scan_then_written_again_before_the_claim_both_are_delivered(project):
    relay = project.relay()
    project.drop("Ann", "msg", "TO: Ben\n\nfirst")
    before_claim(relay, lambda: project.drop("Ann", "msg", "TO: Ben\n\nsecond", in_place=True))
    relay.step()
    assert bodies(project) == ["first"] and archived(project) == ["TO: Ben\n\nfirst"]
    relay.hint("rescan")
    relay.drain()
    assert bodies(project) == ["first", "second"]
    assert archived(project) == ["TO: Ben\n\nfirst", "TO: Ben\n\nsecond"]


def test_files_read_by_a_scan_wait_for_their_claim_and_are_delivered_as_read(project):
    from relay.core.daemon import Relay
    relay = Relay(project.config(agents=["Ann", "Ben"]), clock=project.clock, batch=1)
    project.relays.append(relay)
    for name in ("a", "b", "c"):
        project.drop("Ann", name, f"TO: Ben\n\n{name}")
    relay.step()            # all three found and read, one claimed
    assert len(relay.outbox.read_ahead) == 2
    [(sender, later)] = [k for k in relay.outbox.read_ahead][:1]
    project.drop("Ann", later, "TO: Ben\n\nchanged", in_place=True)
    relay.step()
    relay.step()            # the two others claimed: each delivered as the scan read it
    assert bodies(project) == ["a", "b", "c"] and relay.outbox.read_ahead == {}
    relay.hint("rescan")
    relay.drain()           # what the agent wrote since is a new message
    assert bodies(project) == ["a", "b", "c", "changed"]


def test_a_file_over_the_read_ahead_bound_is_read_at_its_claim(project):
    from relay.core.readahead import FILE as READ_AHEAD_FILE
    relay = project.relay()
    body = "x" * (READ_AHEAD_FILE + 10)
    project.drop("Ann", "big", f"TO: Ben\n\n{body}")
    real = relay.ledger.messages.register_and_claim

    def claim(*a, **k):
        assert relay.outbox.read_ahead == {}
        return real(*a, **k)

    relay.ledger.messages.register_and_claim = claim
    relay.step()
    assert bodies(project) == [body]


def test_a_file_held_open_for_writing_is_not_read_by_the_scan(project):
    relay = project.relay()
    path = project.drop("Ann", "msg", "TO: Ben\n\npartial")
    with open(path, "a") as writer:
        relay.step()
        assert relay.outbox.read_ahead == {} and bodies(project) == []
        writer.write(" and the rest")
    project.clock.advance(5)
    relay.drain()
    assert bodies(project) == ["partial and the rest"]


def test_what_a_scan_reads_ahead_is_bounded_and_given_back_as_claims_take_it(project):
    from relay.core import readahead
    from relay.core.daemon import Relay
    relay = Relay(project.config(agents=["Ann", "Ben"]), clock=project.clock, batch=4)
    project.relays.append(relay)
    bound = 10 * (readahead.COST + 100)
    relay.outbox.read_ahead.limit = bound
    for i in range(30):
        project.drop("Ann", f"m{i:02d}", f"TO: Ben\n\n{i:02d}" + "x" * 80)
    relay.step()
    assert 0 < relay.outbox.read_ahead.held <= bound + readahead.COST + 100
    assert len(relay.outbox.read_ahead) < 30
    while relay.step().claimed:
        assert relay.outbox.read_ahead.held <= bound + readahead.COST + 100
    # every claim took what was read for it, and gave its room back
    assert len(project.inbox("Ben")) == 30 and relay.outbox.read_ahead == {}
    assert relay.outbox.read_ahead.held == 0


def test_bytes_read_ahead_for_a_message_expired_before_its_claim_are_not_a_later_one_at_its_name(project, clock):
    """A scan reads a file ahead for the message registered for it; that message is expired by
    an operator before any claim took it (its file goes to failed/), and the agent writes a new
    file under the same name. The new message is the new file's bytes: what was read ahead
    belongs to the expired message only."""
    from relay.core.daemon import Relay
    from relay.operator.doctor import expire
    relay = Relay(project.config(agents=["Ann", "Ben"]), clock=clock, batch=1)     # one claim per step
    project.relays.append(relay)
    first = project.drop("Ann", "a", "TO: Ben\n\nfirst")
    later = project.drop("Ann", "m", "TO: Ben\n\nold")
    os.utime(first, (clock.now - 20, clock.now - 20))
    os.utime(later, (clock.now - 10, clock.now - 10))
    assert relay.step().claimed == 1                        # both read by the scan, "a" claimed
    [pending] = [r for r in relay.history.audit() if r["status"] == "pending"]
    assert pending["name"] == "m"
    expire(relay.ledger, relay.layout, pending["id"])
    assert not later.exists()
    project.drop("Ann", "m", "TO: Ben\n\nnew")
    relay.hint("file", "Ann", "m")
    for _ in range(3):
        relay.step(clock.advance(1))
    assert bodies(project) == ["first", "new"]
    assert archived(project) == ["TO: Ben\n\nfirst", "TO: Ben\n\nnew"]
    assert relay.history.get(pending["id"])["status"] == "failed"


def test_bytes_read_for_a_file_whose_path_has_a_message_already_are_not_kept(project, clock):
    """A file whose claim could not take it into the spool waits in the outbox for its retry; a
    look at it then reads it, and registers nothing (the path has its message). Those bytes are
    no message's: dropped at once, their room given back, not held until the next full scan."""
    relay = project.relay(retry_backoff="1h")
    project.drop("Ann", "msg", "TO: Ben\n\nx")
    real = relay.fs.rename

    def refuse_the_spool(src, dst, *a, **k):
        if dst.startswith("spool/"):
            raise PermissionError(13, "Permission denied")
        return real(src, dst, *a, **k)

    relay.fs.rename = refuse_the_spool
    assert relay.step().retried == 1
    relay.fs.rename = real
    relay.hint("file", "Ann", "msg")
    assert relay.step(clock.advance(1)).registered == 0
    assert dict(relay.outbox.read_ahead) == {} and relay.outbox.read_ahead.held == 0
    relay.step(clock.advance(7200))                 # the retry, once due
    assert bodies(project) == ["x"]
