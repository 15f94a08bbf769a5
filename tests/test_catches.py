"""Small bugs an earlier suite let through, each pinned by a test that fails when it returns:
the claim's condition, the hash chain's fields, the lease re-check after custody, hint kinds,
each link guard on its own, the size cap before reading, the batch sync in both modes, the
backoff's doubling and cap, future times, create() never writing through a hard link, and the
retention sweep's checkpoint and empty directories."""
import errno
import json
import os

import pytest

from relay.operator import doctor as operator
from relay.core.work import MAX_BACKOFF, backoff
from relay.files.fs import StateDir
from relay.core.outbox import HEADER_ALLOWANCE
from relay.files.sync import FEW


def test_a_row_already_processing_is_never_claimed_again(project):
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nx")
    now = project.clock.now
    _, claimed = relay.ledger.register_and_claim([], now, 10, lambda *a: "archive/x")
    assert claimed == []
    relay.ledger.register_and_claim([(relay.ids.new(now), "Ann", "m", now)], now, 10, lambda s, i, n: f"archive/d/{s}/{i}--{n}")
    _, again = relay.ledger.register_and_claim([], now + 1, 10, lambda s, i, n: f"archive/d/{s}/{i}--{n}")
    assert again == []                               # the first claim is still processing


@pytest.mark.parametrize("tamper", ["bytes-and-sha", "recipients"])
def test_verify_sees_an_archived_record_altered_with_its_file(project, tamper):
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\noriginal")
    relay.drain()
    [row] = relay.history.audit()
    db = relay.ledger.db
    if tamper == "bytes-and-sha":
        import hashlib
        forged = b"TO: Ben\n\nforged"
        (project.state / row["archive_path"]).write_bytes(forged)
        db.execute("UPDATE messages SET sha256 = ? WHERE id = ?", (hashlib.sha256(forged).hexdigest(), row["id"]))
    else:
        db.execute("UPDATE messages SET recipients = ? WHERE id = ?", ('["Mallory"]', row["id"]))
    _, problems = operator.verify(relay.history, relay.layout)
    assert any(row["id"] in p and "hash chain" in p for p in problems), problems


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


def test_a_file_hint_is_not_a_closed_hint(project):
    relay = project.relay(settle="5s")
    path = project.drop("Ann", "m", "TO: Ben\n\nslow", in_place=True)
    now = os.stat(path).st_mtime
    relay.hint("file", "Ann", "m")
    assert relay.step(now + 0.1).registered == 0          # may still be written
    path2 = project.drop("Ann", "n", "TO: Ben\n\ndone", in_place=True)
    relay.hint("closed", "Ann", "n")
    assert relay.step(os.stat(path2).st_mtime + 0.1).archived == 1


def test_open_read_never_follows_a_link(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("secret")
    state = tmp_path / "state"
    state.mkdir()
    (state / "link").symlink_to(outside)
    fs = StateDir(state)
    try:
        with pytest.raises(OSError) as e:
            fs.open_read("link")
        assert e.value.errno == errno.ELOOP
    finally:
        fs.close()


def test_create_never_writes_through_a_hard_link(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("keep")
    state = tmp_path / "state"
    state.mkdir()
    os.link(outside, state / "planted")
    fs = StateDir(state)
    try:
        fd = fs.create("planted")
        os.write(fd, b"relay's")
        os.close(fd)
    finally:
        fs.close()
    assert outside.read_text() == "keep" and (state / "planted").read_text() == "relay's"


def test_a_file_over_the_cap_is_refused_by_its_size_before_it_is_read(project):
    relay = project.relay(max_body_bytes=1000)
    project.drop("Ann", "big", b"TO: Ben\n\n" + b"x" * (1000 + HEADER_ALLOWANCE))
    relay.drain()
    [row] = relay.history.audit(sender="Ann")      # (its bounce to Ann aside)
    assert row["status"] == "failed" and "bytes, over max_body_bytes (1000) plus room for headers" in row["error"]


def test_fs_mode_syncs_a_few_envelopes_by_fsync_and_a_batch_by_syncfs_and_an_error_fails(project):
    fsyncs, calls = [], []
    relay = project.relay(sync_mode="fs", fsync=fsyncs.append)
    relay.syncer.syncfs = calls.append
    logs = []
    relay.syncer.log_sync = logs.append
    project.drop("Ann", "m", "TO: Ben\n\nx")
    relay.step()
    # One envelope: its own fsync and the ledger log's (the claim, committed without a sync)
    # before the link; then one syncfs for the links, the archive move and the outbox and spool
    # directories.
    assert len(fsyncs) == 1 and len(logs) == 1 and len(calls) == 1
    for i in range(FEW + 1):
        project.drop("Ann", f"b{i}", f"TO: Ben, Cy\n\nb{i}")
    relay.hint("rescan")
    relay.step(project.clock.advance(1))
    assert len(fsyncs) == 1 and len(logs) == 1 and len(calls) == 3     # more than a few envelopes: one syncfs per phase

    def eio(fd):
        raise OSError(errno.EIO, "Input/output error")

    relay.syncer.syncfs = eio
    project.drop("Ann", "n", "TO: Ben\n\ny")
    relay.hint("rescan")
    relay.step(project.clock.advance(1))
    failed = [r for r in relay.history.audit() if r["name"] == "n"]
    assert failed[0]["status"] == "failed" and "Input/output error" in failed[0]["error"]


def test_fs_mode_an_envelope_fsync_error_fails_the_message(project):
    def eio(fd):
        raise OSError(errno.EIO, "Input/output error")

    relay = project.relay(sync_mode="fs", fsync=eio)
    relay.syncer.syncfs = lambda fd: None
    project.drop("Ann", "m", "TO: Ben\n\nx")
    relay.step()
    [row] = relay.history.audit()
    assert row["status"] == "failed" and "Input/output error" in row["error"]
    assert project.inbox("Ben") == []


def test_backoff_doubles_and_is_capped():
    assert [backoff(1.0, n) for n in range(4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff(1.0, 20) == MAX_BACKOFF and backoff(1.0, 10_000) == MAX_BACKOFF


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


def test_a_partial_sweep_leaves_a_chain_that_verifies(project, clock):
    relay = project.relay()
    for i in range(3):
        project.drop("Ann", f"m{i}", f"TO: Ben\n\n{i}")
        relay.hint("rescan")
        relay.step(clock.advance(3600))
    assert relay.history.counts()["archived"] == 3
    relay.sweep_all(now=clock.now, older_than=3600 - 1)         # the two oldest
    assert relay.history.counts()["archived"] == 1
    checked, problems = operator.verify(relay.history, relay.layout)
    assert checked == 1 and problems == []


def test_a_sweep_that_empties_a_day_removes_the_day(project, clock):
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nx")
    relay.drain()
    [day] = (project.state / "archive").iterdir()
    relay.sweep_all(now=clock.advance(30 * 86400))
    assert not day.exists() and (project.state / "archive").is_dir()


def test_inbox_json_is_one_document(project):
    """Guards the JSON the agents' side reads: a list of whole envelopes."""
    from click.testing import CliRunner

    from relay.cli import main
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nhello")
    relay.drain()
    r = CliRunner().invoke(main, ["--root", str(project.root), "inbox", "Ben", "--json"])
    assert r.exit_code == 0 and [d["body"] for d in json.loads(r.output)] == ["hello"]


def test_a_cached_directory_swapped_between_steps_is_looked_up_again(tmp_path):
    """recheck() (each step) keeps directory descriptors, but a directory swapped since (for a
    link out, for another directory, or removed and made again) is walked again, never used."""
    outside = tmp_path / "outside"
    (outside / "b").mkdir(parents=True)
    state = tmp_path / "state"
    (state / "a" / "b").mkdir(parents=True)
    fs = StateDir(state)
    try:
        os.close(fs.create("a/b/one"))              # a and a/b cached
        os.rename(state / "a" / "b", tmp_path / "moved-b")  # the cached a/b moved out ...
        (state / "a" / "b").symlink_to(outside / "b")       # ... and a link put in its place
        fs.recheck()
        with pytest.raises(OSError) as e:
            fs.create("a/b/two")
        assert e.value.errno in (errno.ELOOP, errno.ENOTDIR)
        assert not (outside / "b" / "two").exists() and not (tmp_path / "moved-b" / "two").exists()

        (state / "a" / "b").unlink()
        (state / "a" / "b").mkdir()
        fs.recheck()
        os.close(fs.create("a/b/three"))            # the directory there now, not the one moved
        assert (state / "a" / "b" / "three").exists() and not (tmp_path / "moved-b" / "three").exists()

        os.rename(state / "a", tmp_path / "moved-a")        # a parent swapped for another directory
        (state / "a" / "b").mkdir(parents=True)
        fs.recheck()
        os.close(fs.create("a/b/four"))
        assert (state / "a" / "b" / "four").exists() and not (tmp_path / "moved-a" / "b" / "four").exists()

        (state / "a" / "b" / "four").unlink()
        (state / "a" / "b").rmdir()
        (state / "a" / "b").mkdir()                 # removed and made again: another inode
        fs.recheck()
        os.close(fs.create("a/b/five"))
        assert (state / "a" / "b" / "five").exists()
        assert len(os.listdir("/proc/self/fd")) < 64       # every dropped descriptor closed
    finally:
        fs.close()


def test_a_directory_not_swapped_keeps_its_descriptor_across_steps(tmp_path):
    state = tmp_path / "state"
    (state / "a" / "b").mkdir(parents=True)
    fs = StateDir(state)
    try:
        first = fs.dir("a/b")
        fs.recheck()
        assert fs.dir("a/b") == first and fs.dir("a") == fs._dirs["a"]
    finally:
        fs.close()


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
