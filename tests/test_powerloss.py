"""States a power cut can leave (files in outbox, spool, archive or inbox, with or without their
ledger rows), each built by hand, each recovered with every recipient holding the message
exactly once. Existence of a file proves nothing: an envelope counts when it is complete."""
import errno
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from relay.files.sync import FEW
from relay.operator import doctor as operator


class Crash(BaseException):
    """Stands for the power going: nothing after it runs."""


def die(*a, **k):
    raise Crash()


def crash_before_record(project, text="TO: Ben, Cy\n\npower"):
    """A batch that delivered and archived, cut before its ledger record."""
    relay = project.relay()
    project.drop("Ann", "m", text)
    relay.ledger.messages.record = die
    with pytest.raises(Crash):
        relay.step()
    [row] = relay.history.audit()
    relay.close()
    project.relays.remove(relay)
    return row["id"]


def held(project, agent, mid):
    """The envelopes of `mid` the agent holds, parsed (new/ and cur/)."""
    out = []
    for sub in ("new", "cur"):
        for p in (project.state / "inbox" / agent / sub).iterdir():
            if p.name.startswith(mid):
                out.append(json.loads(p.read_bytes()))
    return out


def once_each(project, mid, agents=("Ben", "Cy")):
    for a in agents:
        got = held(project, a, mid)
        assert len(got) == 1 and got[0]["body"] == "power", (a, got)


@pytest.mark.parametrize("damage", [b"", b'{"id": "01', b"garbage"])
def test_an_empty_or_truncated_envelope_in_new_is_written_again(project, damage):
    mid = crash_before_record(project)
    (project.state / f"inbox/Ben/new/{mid}.json").write_bytes(damage)
    relay = project.relay()
    relay.drain()
    once_each(project, mid)
    assert relay.history.get(mid)["status"] == "archived"
    assert operator.verify(relay.history, relay.layout)[1] == []


def test_an_archived_file_with_no_row_is_delivered_once(project):
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben, Cy\n\npower")
    project.drop("Cy", "other", "TO: Ann\n\nkept")
    relay.drain()
    mid = next(r["id"] for r in relay.history.audit() if r["name"] == "m")
    (project.state / f"inbox/Cy/new/{mid}.json").unlink()       # Cy's copy never reached the disk
    db = relay.ledger.db
    for table, column in (("chain", "message_id"), ("events", "message_id"), ("deliveries", "message_id"),
                          ("messages", "id")):
        db.execute(f"DELETE FROM {table} WHERE {column} = ?", (mid,))
    relay.close()
    project.relays.remove(relay)
    again = project.relay()
    again.drain()
    once_each(project, mid)
    row = again.history.get(mid)
    assert row["status"] == "archived" and row["sender"] == "Ann" and row["name"] == "m"
    assert len(project.files("archive")) == 2 and not project.files("spool")


def test_a_new_ledger_beside_a_full_archive_delivers_nothing_again(project, caplog):
    """The ledger deleted (or replaced): the archive's originals were delivered and read long
    ago; relay warns and does not deliver them all again."""
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nonce")
    relay.drain()
    for p in (project.state / "inbox/Ben/new").iterdir():
        p.unlink()                                  # read and deleted
    relay.close()
    project.relays.remove(relay)
    for p in project.state.glob("ledger.sqlite*"):
        p.unlink()
    again = project.relay()
    again.drain()
    assert project.inbox("Ben") == [] and len(project.files("archive")) == 1
    assert any("ledger records no archived message" in r.getMessage() for r in caplog.records)


def test_a_spooled_file_whose_row_says_outbox_is_delivered_once(project):
    relay = project.relay()
    path = project.drop("Ann", "m", "TO: Ben, Cy\n\npower")
    mid = relay.ids.new(relay.clock())
    relay.ledger.messages.register_and_claim([(mid, "Ann", "m", 0.0)], relay.clock(), 0, None)
    spool = project.state / "spool/Ann"
    spool.mkdir(parents=True, exist_ok=True)
    path.rename(spool / f"{mid}--m")
    assert relay.history.get(mid)["spooled"] == 0
    relay.drain()
    once_each(project, mid)
    assert relay.history.get(mid)["status"] == "archived" and not project.files("spool")


def test_a_claimed_row_whose_file_is_in_the_archive_is_delivered_once(project):
    mid = crash_before_record(project)
    assert len(project.files("archive")) == 1
    (project.state / f"inbox/Cy/new/{mid}.json").unlink()
    relay = project.relay()
    assert relay.history.get(mid)["status"] == "processing"
    relay.drain()
    once_each(project, mid)
    assert relay.history.get(mid)["status"] == "archived" and len(project.files("archive")) == 1


def test_a_recorded_recipient_is_never_written_again_even_after_deleting_it(project):
    """The ledger recorded Ben's delivery (an earlier batch), Ben read and deleted it, then the
    power went before the message was archived: recovery writes Cy's copy only."""
    mid = crash_before_record(project)
    relay = project.relay()
    relay.ledger.db.execute("INSERT INTO deliveries (message_id, recipient, delivered_at, size, sha256) "
                            "VALUES (?, 'Ben', 0, 1, 'x')", (mid,))
    (project.state / f"inbox/Ben/new/{mid}.json").unlink()
    (project.state / f"inbox/Cy/new/{mid}.json").unlink()
    relay.drain()
    assert held(project, "Ben", mid) == [] and len(held(project, "Cy", mid)) == 1
    assert relay.history.get(mid)["status"] == "archived"


def test_doctor_and_verify_name_an_envelope_that_does_not_match(project, cli_in):
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nx")
    relay.drain()
    [env] = (project.state / "inbox/Ben/new").iterdir()
    env.write_bytes(env.read_bytes()[:10])
    _, problems = operator.verify(relay.history, relay.layout)
    assert len(problems) == 1 and f"inbox/Ben/new/{env.name} is not the envelope relay delivered" in problems[0]
    assert any("is not the envelope relay delivered" in p for p in operator.doctor(relay.history, relay.layout, None)[0])
    r = cli_in(project.root, "verify")
    assert r.exit_code == 1 and "is not the envelope relay delivered" in r.output


def test_deliveries_record_each_envelopes_size_and_hash(project):
    import hashlib
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben, Cy\n\nx")
    relay.drain()
    [row] = relay.history.audit()
    for d in relay.history.deliveries(row["id"]):
        data = (project.state / f"inbox/{d['recipient']}/new/{row['id']}.json").read_bytes()
        assert (d["size"], d["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())


@pytest.fixture
def cli_in():
    from click.testing import CliRunner

    from relay.cli import main

    def run(root, *args):
        return CliRunner().invoke(main, ["--root", str(root), *args])
    return run


def recording_fsync(log):
    """An fsync seam that notes which file or directory each call synced."""
    def fsync(fd):
        log.append(os.readlink(f"/proc/self/fd/{fd}"))
        os.fsync(fd)
    return fsync


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name descriptors")
def test_file_mode_syncs_each_envelope_and_directory_before_the_record(project):
    """Where syncfs is not trusted (FUSE, network file systems): every envelope and every
    directory the batch changed is fsynced, and all of it before the ledger records anything."""
    relay = project.relay(sync_mode="file")
    synced = []
    relay.syncer.fsync = recording_fsync(synced)
    real = relay.ledger.messages.record
    relay.ledger.messages.record = lambda *a, **k: (synced.append("RECORD"), real(*a, **k))[1]
    project.drop("Ann", "m", "TO: Ben, Cy\n\nx")
    relay.step()
    [row] = relay.history.audit()
    state = str(project.state.resolve())
    before = [p[len(state) + 1:] for p in synced[:synced.index("RECORD")] if p.startswith(state)]
    day = row["archive_path"].split("/")[1]
    for rel in (f"inbox/Ben/tmp/{row['id']}.json", f"inbox/Cy/tmp/{row['id']}.json", "inbox/Ben/new",
                "inbox/Cy/new", f"archive/{day}/Ann", "outbox/Ann", "spool/Ann"):
        assert rel in before, (rel, before)
    assert relay.history.get(row["id"])["status"] == "archived"


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name descriptors")
def test_an_fsync_error_on_new_fails_the_message_and_is_not_retried(project):
    relay = project.relay(sync_mode="file")

    def eio_on_new(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("/inbox/Ben/new"):
            raise OSError(errno.EIO, "Input/output error")
        os.fsync(fd)

    relay.syncer.fsync = eio_on_new
    project.drop("Ann", "m", "TO: Ben\n\nx")
    counts = relay.step()
    [row] = relay.history.audit(sender="Ann")
    assert counts.failed == 1 and counts.retried == 0 and counts.archived == 0
    assert row["status"] == "failed" and "Input/output error" in row["error"]
    assert relay.history.deliveries(row["id"]) == []


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name descriptors")
def test_a_deferred_message_is_durable_in_the_spool_before_the_record_says_so(project):
    """A file taken into the spool and found still open for writing stays there; the ledger
    records it as spooled only after both directories of the custody rename are synced."""
    relay = project.relay(sync_mode="file")
    synced = []
    relay.syncer.fsync = recording_fsync(synced)
    real_record, real_rename = relay.ledger.messages.record, relay.fs.rename
    relay.ledger.messages.record = lambda *a, **k: (synced.append("RECORD"), real_record(*a, **k))[1]
    held = []

    def rename(src, dst, **k):
        real_rename(src, dst, **k)
        if src.startswith("outbox/"):
            held.append(open(project.state / dst, "a"))

    relay.fs.rename = rename
    project.drop("Ann", "m", "TO: Ben\n\nx")
    try:
        assert relay.step().deferred == 1
    finally:
        held[0].close()
    state = str(project.state.resolve())
    before = [p[len(state) + 1:] for p in synced[:synced.index("RECORD")] if p.startswith(state)]
    assert "spool/Ann" in before and "outbox/Ann" in before, before


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name descriptors")
def test_a_late_archive_move_syncs_both_directories_before_the_record(project, clock):
    relay = project.relay(sync_mode="file", retry_backoff="1s")
    real_store = relay.archive.store

    def full(src, rel):
        raise OSError(errno.ENOSPC, "No space left on device")

    relay.archive.store = full
    project.drop("Ann", "m", "TO: Ben\n\nx")
    relay.step()
    relay.archive.store = real_store
    synced = []
    relay.syncer.fsync = recording_fsync(synced)
    real = relay.ledger.messages.archived_late
    relay.ledger.messages.archived_late = lambda *a, **k: (synced.append("RECORD"), real(*a, **k))[1]
    relay.step(clock.advance(60))
    [row] = relay.history.audit()
    assert row["status"] == "archived"
    state = str(project.state.resolve())
    before = [p[len(state) + 1:] for p in synced[:synced.index("RECORD")] if p.startswith(state)]
    day = row["archive_path"].split("/")[1]
    assert "spool/Ann" in before and f"archive/{day}/Ann" in before, before


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


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names descriptors through /proc")
def test_the_private_copy_of_a_hard_linked_file_is_synced_before_it_is_renamed_into_the_spool(project, tmp_path):
    """A file with another hard link is delivered from a private copy relay writes in the spool:
    its bytes are synced before the rename that gives it the message's name there, or a power
    cut could leave the spool holding an empty file under a name the ledger trusts."""
    relay, events = recording_relay(project)
    path = project.drop("Ann", "m", "TO: Ben\n\nlinked")
    os.link(path, tmp_path / "elsewhere")
    relay.step()
    mid = relay.history.audit().fetchone()["id"]
    copy = f"spool/Ann/.copy-{mid}"
    renamed = next(i for i, e in enumerate(events) if e[0] == "rename" and e[1] == copy)
    assert ("fsync", copy) in events[:renamed], events
    assert [e["body"] for e in project.inbox("Ben")] == ["linked"]


@pytest.mark.parametrize("where, ordered", [("the test directory", None), ("/dev/shm", False)])
def test_a_flush_of_three_directories_is_made_by_fsyncs_only_where_one_fsync_orders_them_all(
        tmp_path, where, ordered):
    """Three directories (a message for another node: outbox, spool, archive day) are synced one
    by one only on ext4 and XFS, where a directory's fsync makes every change before it durable;
    on another file system (tmpfs here, Btrfs in the field) they take one syncfs."""
    from relay.files.fs import StateDir
    from relay.files.sync import FEW_DIRS, FEW_DIRS_ELSEWHERE, ORDERED, Syncer, fs_type
    base = tmp_path if ordered is None else Path(where)
    if not base.is_dir():
        pytest.skip(f"no {where} here")
    state = Path(tempfile.mkdtemp(dir=base))
    try:
        fs = StateDir(state)
        ordered = fs_type(fs.fd) in ORDERED if ordered is None else ordered
        syncer = Syncer("full", fs, mode="fs", fsync=lambda fd: None)
        whole = []
        syncer.syncfs = whole.append
        for d in ("a", "b", "c"):
            (state / d).mkdir()
            syncer.dir_changed(d)
        syncer.flush("three directories")
        assert syncer.few_dirs == (FEW_DIRS if ordered else FEW_DIRS_ELSEWHERE)
        assert len(whole) == (0 if ordered else 1)
        syncer.close()
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names descriptors through /proc")
def test_file_mode_flush_syncs_every_file_and_directory_noted(tmp_path):
    from relay.files.fs import StateDir
    from relay.files.sync import Syncer
    state = tmp_path / "state"
    state.mkdir()
    fs = StateDir(state)
    synced = []
    syncer = Syncer("full", fs, mode="file", fsync=lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")))
    for d in ("a", "b", "c"):
        (state / d).mkdir()
        syncer.dir_changed(d)
    syncer.file_written(os.open(state / "a" / "f", os.O_WRONLY | os.O_CREAT, 0o644))
    syncer.flush("three directories and a file")
    assert sorted(os.path.relpath(p, state.resolve()) for p in synced) == ["a", "a/f", "b", "c"]
    syncer.close()
    fs.close()


def test_file_mode_syncs_the_files_it_holds_once_it_holds_max_held(tmp_path):
    from relay.files.fs import StateDir
    from relay.files.sync import MAX_HELD, Syncer
    fs = StateDir(tmp_path)
    synced = []
    syncer = Syncer("full", fs, mode="file", fsync=synced.append)
    try:
        for i in range(MAX_HELD):
            assert len(synced) == 0
            syncer.file_written(os.open(tmp_path / f"f{i}", os.O_WRONLY | os.O_CREAT, 0o644))
        assert len(synced) == MAX_HELD            # synced and closed before the flush
    finally:
        syncer.close()
        fs.close()


@pytest.mark.parametrize("files, whole", [(FEW, False), (FEW + 1, True)])
def test_fs_mode_syncs_up_to_few_files_one_by_one_and_more_by_syncfs(tmp_path, files, whole):
    from relay.files.fs import StateDir
    from relay.files.sync import Syncer
    fs = StateDir(tmp_path)
    synced, calls = [], []
    syncer = Syncer("full", fs, mode="fs", fsync=synced.append)
    syncer.syncfs = calls.append
    try:
        for i in range(files):
            syncer.file_written(os.open(tmp_path / f"f{i}", os.O_WRONLY | os.O_CREAT, 0o644))
        syncer.flush("the files")
        assert (len(synced), len(calls)) == ((0, 1) if whole else (files, 0))
    finally:
        syncer.close()
        fs.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names descriptors through /proc")
def test_the_ledger_syncs_its_log_once_after_a_commit_made_without_a_sync(tmp_path, monkeypatch):
    from relay.ledger import ledger as ledger_mod
    synced = []
    real = ledger_mod.fdatasync
    monkeypatch.setattr(ledger_mod, "fdatasync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")),
                                                             real(fd))[1])
    with ledger_mod.Ledger(tmp_path / "ledger.sqlite") as led:
        with led.transaction(synced=False):
            pass
        assert led.unsynced
        led.sync()
        led.sync()                                  # nothing left to sync
        assert synced == [str((tmp_path / "ledger.sqlite-wal").resolve())] and not led.unsynced


@pytest.mark.skipif(not os.path.isdir("/dev/shm") or not sys.platform.startswith("linux"), reason="Linux's tmpfs")
def test_the_file_system_type_is_read_from_statfs():
    from relay.files.sync import SYNCFS_HONOURED, fs_type
    fd = os.open("/dev/shm", os.O_RDONLY)
    try:
        assert SYNCFS_HONOURED.get(fs_type(fd)) == "tmpfs"
    finally:
        os.close(fd)


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


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name descriptors")
def test_recovery_syncs_its_moves_before_the_ledger_resets_the_row(project):
    """A batch archived its original and the power went before the record: recovery moves the
    file back from the archive to the spool and resets the row to pending. Both directories of
    that move are synced before the reset is committed: a reset row whose file the power cut
    left in the archive would be looked for in the spool and not found."""
    mid = crash_before_record(project)
    [archived] = project.files("archive")
    day = archived.relative_to(project.state).parts[1]
    relay = project.relay(sync_mode="file")
    synced = []
    relay.syncer.fsync = recording_fsync(synced)
    real = relay.ledger.messages.reset
    relay.ledger.messages.reset = lambda *a, **k: (synced.append("RESET"), real(*a, **k))[1]
    assert relay.recover() == 1
    state = str(project.state.resolve())
    before = [p[len(state) + 1:] for p in synced[:synced.index("RESET")] if p.startswith(state)]
    assert "spool/Ann" in before and f"archive/{day}/Ann" in before, before
    assert relay.history.get(mid)["status"] == "pending"
    assert [p.name for p in project.files("spool")] == [f"{mid}--m"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name descriptors")
@pytest.mark.parametrize("read_first", [True, False], ids=["read-before-custody", "taken-then-read"])
def test_file_mode_syncs_outbox_and_spool_before_the_archive_move(project, read_first):
    """File by file, a synced directory says nothing of another: the move into the archive takes
    the file out of the spool, so outbox/<a> and spool/<a> (the custody rename) are synced
    before it, whether the file was read in the outbox before custody or, not being a plain
    file (writable by its group), taken into the spool first and read there."""
    relay = project.relay(sync_mode="file")
    events = []

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        os.fsync(fd)

    relay.syncer.fsync = fsync
    real = relay.fs.rename
    relay.fs.rename = lambda src, dst, **k: (real(src, dst, **k), events.append(("rename", src, dst)))[0]
    path = project.drop("Ann", "m", "TO: Ben\n\nx")
    if not read_first:
        path.chmod(0o664)
    relay.step()
    custody = next(i for i, e in enumerate(events) if e[0] == "rename" and e[1] == "outbox/Ann/m")
    move = next(i for i, e in enumerate(events) if e[0] == "rename" and e[2].startswith("archive/"))
    state = str(project.state.resolve())
    synced = {e[1][len(state) + 1:] for e in events[custody:move] if e[0] == "fsync"}
    assert {"outbox/Ann", "spool/Ann"} <= synced, events
    assert relay.history.audit().fetchone()["status"] == "archived"


def test_an_envelope_with_the_id_but_another_original_is_written_again(project):
    """A recipient's new/ holds a complete envelope under the message's id whose sha256 is not
    this message's (another original under that id): it is no copy of this message, so recovery
    writes the right one over it; only an envelope matching both id and sha256 counts as held."""
    mid = crash_before_record(project)
    path = project.state / f"inbox/Ben/new/{mid}.json"
    doc = json.loads(path.read_bytes())
    path.write_text(json.dumps({**doc, "body": "another", "sha256": "0" * 64}))
    relay = project.relay()
    relay.drain()
    once_each(project, mid)
    assert relay.history.get(mid)["status"] == "archived"
    assert operator.verify(relay.history, relay.layout)[1] == []
