"""Hostile review of the read-before-custody order: an agent acting on its file between the
read (in its outbox) and the custody rename, and crashes at each seam of that window."""
import errno
import hashlib
import os

import shutil

import pytest

from relay.errors import LogSyncError
from relay.files.sync import MAX_HELD


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


SWAPPED = ["outbox", "outbox/Ann", "spool", "spool/Ann", "inbox", "inbox/Ben", "inbox/Ben/new",
           "inbox/Ben/tmp", "archive", "archive/DAY", "archive/DAY/Ann", "failed", "failed/Ann"]


@pytest.mark.parametrize("how", ["a link outside", "another directory", "removed and made again"])
@pytest.mark.parametrize("which", SWAPPED)
def test_a_directory_swapped_between_two_steps_is_never_acted_in_outside(project, tmp_path, which, how):
    """Every directory relay held open in a step is swapped before the next: relay reads,
    writes, moves and removes nothing in the directory outside it now names."""
    relay = project.relay(sync_mode="file")
    project.drop("Ann", "m1", "TO: Ben\n\none")
    project.drop("Ann", "bad", b"\xff not a message")
    relay.drain()
    [day] = os.listdir(project.state / "archive")
    target = project.state / which.replace("DAY", day)
    out = tmp_path / "outside"
    out.mkdir()
    for sub in ("new", "tmp", "Ann", "Ben"):
        (out / sub).mkdir()
    (out / "m2").write_bytes(b"TO: Ben\n\noutside")
    before = _tree(out)
    if how == "removed and made again":
        shutil.rmtree(target)
    else:
        os.rename(target, tmp_path / "aside")
    if how == "a link outside":
        os.symlink(out, target)
    else:
        target.mkdir()
    if not (project.state / "outbox/Ann").is_symlink() and not (project.state / "outbox").is_symlink():
        project.drop("Ann", "m2", "TO: Ben\n\ntwo")
    for _ in range(3):
        relay.step(project.clock.advance(5))
    assert _tree(out) == before
