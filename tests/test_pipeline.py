"""The pipeline driven by step()/drain() on a real directory with an injected clock; each lifecycle
event recorded at its own instant."""
import errno
import hashlib
import json
import os
import stat
import time

import orjson
import pytest
from conftest import failing_create

from relay.core.work import MAX_BACKOFF, backoff
from relay.ledger.ledger import Ledger
from relay.operator import doctor as operator


def events(relay, mid):
    return [e["event"] for e in relay.history.events(mid)]


def only_row(relay):
    """The one message an agent sent (a bounce from System to a failed message's sender aside:
    test_bounces.py)."""
    rows = [r for r in relay.history.audit() if r["sender"] != "System"]
    assert len(rows) == 1
    return rows[0]


def test_header_message_delivered_archived_and_recorded(project):
    relay = project.relay()
    project.drop("Ann", "msg", "TO: Ben\nTHREAD: t1\nSUBJECT: hi\n\nhello ben")
    total = relay.drain()
    assert (total.archived, total.failed) == (1, 0)
    [env] = project.inbox("Ben")
    assert env["from"] == "Ann" and env["to"] == ["Ben"] and env["body"] == "hello ben"
    assert env["thread"] == "t1" and env["subject"] == "hi" and env["source"] == "msg"
    row = only_row(relay)
    assert row["status"] == "archived" and row["id"] == env["id"]
    archived = project.state / row["archive_path"]
    assert archived.read_text() == "TO: Ben\nTHREAD: t1\nSUBJECT: hi\n\nhello ben"
    assert env["sha256"] == row["sha256"] == hashlib.sha256(archived.read_bytes()).hexdigest()
    assert archived.name == f"{row['id']}--msg" and archived.parent.name == "Ann"
    assert not list((project.state / "outbox/Ann").iterdir())
    assert events(relay, row["id"]) == ["discovered", "claimed", "delivered", "archived"]
    assert stat.S_IMODE(os.stat(project.state / "inbox/Ben/new" / f"{row['id']}.json").st_mode) & 0o022 == 0


def test_broadcast_reaches_every_known_agent_but_the_sender(project):
    relay = project.relay(agents=("Ann", "Ben", "Cy", "Dee"))
    project.drop("Ann", "all", '{"to": "*", "body": "to everyone"}')
    relay.drain()
    assert [len(project.inbox(a)) for a in ("Ann", "Ben", "Cy", "Dee")] == [0, 1, 1, 1]
    assert project.inbox("Ben")[0]["to"] == ["*"]          # the same envelope for every agent
    assert orjson.loads(only_row(relay)["recipients"]) == ["Ben", "Cy", "Dee"]


def test_control_kind_goes_to_system(project):
    relay = project.relay()
    project.drop("Ann", "spawn", "NAME: Dana\nCLI: claude\n\nreview please")
    relay.drain()
    [env] = project.inbox("System")
    assert env["kind"] == "spawn" and env["name"] == "Dana" and env["cli"] == "claude"


def test_unknown_recipient_quarantined_with_reason(project):
    relay = project.relay()
    project.drop("Ann", "oops", "TO: Nobody\n\nlost")
    total = relay.drain()
    assert total.failed == 1
    row = only_row(relay)
    assert row["status"] == "failed" and "unknown recipient Nobody" in row["error"]
    moved = project.state / row["failed_path"]
    assert moved.read_text() == "TO: Nobody\n\nlost"
    report = json.loads(moved.with_name(moved.name + ".error.json").read_text())
    assert report["id"] == row["id"] and "Nobody" in report["reason"] and "Ann, Ben, Cy" in report["reason"]
    assert "relay retry" in report["what_to_do"]
    assert events(relay, row["id"])[-2:] == ["failed", "bounced"]      # the sender is told (test_bounces.py)


def test_unknown_recipient_created_when_configured(project):
    relay = project.relay(unknown_recipient="create")
    project.drop("Ann", "m", "TO: Zed\n\nhi new agent")
    relay.drain()
    assert project.inbox("Zed")[0]["body"] == "hi new agent"


def test_name_reuse_is_a_new_message(project):
    relay = project.relay()
    project.drop("Ann", "msg", "TO: Ben\n\none")
    relay.drain()
    project.drop("Ann", "msg", "TO: Ben\n\ntwo")
    relay.drain()
    bodies = sorted(e["body"] for e in project.inbox("Ben"))
    assert bodies == ["one", "two"]
    rows = list(relay.history.audit())
    assert len({r["id"] for r in rows}) == 2 and all(r["status"] == "archived" for r in rows)


def test_in_place_file_waits_for_settle(project, clock):
    relay = project.relay(settle="5s")
    path = project.drop("Ann", "m", "TO: Ben\n\npart", in_place=True)
    now = os.stat(path).st_mtime
    counts = relay.step(now + 1)
    assert counts.registered == 0 and relay.outbox.next_deadline() == pytest.approx(now + 5)
    counts = relay.step(now + 5.01)
    assert counts.archived == 1


def test_rewritten_while_held_stays_as_a_new_message(project):
    """Content written to the same path after relay took the file is a new message."""
    relay = project.relay()
    project.drop("Ann", "msg", "TO: Ben\n\nfirst")
    real_deliver = relay.inbox.deliver

    def deliver_then_agent_writes_again(items, **k):
        out = real_deliver(items, **k)
        project.drop("Ann", "msg", "TO: Ben\n\nsecond")
        return out

    relay.inbox.deliver = deliver_then_agent_writes_again
    relay.step()
    relay.inbox.deliver = real_deliver
    archived = project.files("archive")
    assert [p.read_text() for p in archived] == ["TO: Ben\n\nfirst"]
    assert (project.state / "outbox/Ann/msg").read_text() == "TO: Ben\n\nsecond"
    relay.drain()
    assert sorted(e["body"] for e in project.inbox("Ben")) == ["first", "second"]


def test_in_progress_names_and_subdirectories_ignored(project):
    relay = project.relay()
    for name in (".hidden", "x.tmp", "x.part", "x.pending", "x.swp", "x~"):
        project.drop("Ann", name, "TO: Ben\n\nno", in_place=True)
    (project.state / "outbox/Ann/sub").mkdir()
    (project.state / "outbox/Ann/sub/m").write_text("TO: Ben\n\nno")
    total = relay.drain()
    assert total.registered == 0 and project.inbox("Ben") == []


def test_invalid_agent_directory_never_read(project):
    relay = project.relay()
    bad = project.state / "outbox" / "bad name"
    bad.mkdir(parents=True)
    (bad / "m").write_text("TO: Ben\n\nx")
    assert relay.drain().registered == 0
    assert (bad / "m").exists()


def test_symlink_and_fifo_quarantined_never_opened(project, tmp_path):
    relay = project.relay()
    secret = tmp_path.parent / "outside-secret"
    secret.write_text("TO: Ben\n\nsecret")
    box = project.state / "outbox/Ann"
    box.mkdir(parents=True, exist_ok=True)
    os.symlink(secret, box / "link")
    os.mkfifo(box / "fifo")
    total = relay.drain()
    assert total.failed == 2 and project.inbox("Ben") == []
    reasons = sorted(r["error"] for r in relay.history.audit() if r["sender"] == "Ann")
    assert "a FIFO" in reasons[0] and "symbolic link" in reasons[1]
    assert os.path.islink(project.state / "failed/Ann" / next(
        p.name for p in (project.state / "failed/Ann").iterdir() if p.name.endswith("--link")))
    secret.unlink()


def test_transient_error_backs_off_then_delivers(project, clock, monkeypatch):
    relay = project.relay(retry_backoff="10s")
    project.drop("Ann", "m", "TO: Ben\n\nx")
    full = failing_create(relay, OSError(errno.ENOSPC, "No space left on device"))
    counts = relay.step()
    assert counts.retried == 1
    row = only_row(relay)
    assert row["status"] == "pending" and row["retries"] == 1 and "No space left" in row["error"]
    assert row["next_attempt_at"] == pytest.approx(clock.now + 10)
    assert relay.step().claimed == 0            # not due yet
    full["on"] = False
    clock.advance(10)
    assert relay.step().archived == 1
    assert len(project.inbox("Ben")) == 1
    assert "retried" in events(relay, row["id"])


def test_retries_exhausted_fails(project, clock, monkeypatch):
    relay = project.relay(retry_backoff="1s", max_retries=2, retry_period="0s")
    project.drop("Ann", "m", "TO: Ben\n\nx")
    failing_create(relay, OSError(errno.EACCES, "Permission denied"))
    for _ in range(3):
        relay.step()
        clock.advance(100)
    row = only_row(relay)
    assert row["status"] == "failed" and "gave up after 3 attempts" in row["error"]
    assert "Permission denied" in row["error"]
    assert project.files("failed")


def test_fsync_eio_fails_and_is_not_retried(project, monkeypatch):
    def eio(fd):
        raise OSError(errno.EIO, "Input/output error")

    relay = project.relay(sync_mode="file")
    relay.syncer.fsync = eio
    project.drop("Ann", "m", "TO: Ben\n\nx")
    counts = relay.step()
    assert counts.failed == 1 and counts.retried == 0
    row = only_row(relay)
    assert row["status"] == "failed" and "fsync" in row["error"] and "Input/output error" in row["error"]
    assert project.inbox("Ben") == []
    assert not list((project.state / "inbox/Ben/tmp").iterdir())


def archive_disk_full(relay, monkeypatch):
    """Every move into the archive fails with ENOSPC from now on; gives the real move."""
    real = relay.archive.store

    def full(src, rel):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(relay.archive, "store", full)
    return real


def test_archive_move_failure_keeps_delivered_then_archives(project, clock, monkeypatch):
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nx")
    real = archive_disk_full(relay, monkeypatch)
    relay.step()
    row = only_row(relay)
    assert row["status"] == "delivered" and len(project.inbox("Ben")) == 1
    monkeypatch.setattr(relay.archive, "store", real)
    clock.advance(60)
    relay.step()
    assert only_row(relay)["status"] == "archived" and len(project.inbox("Ben")) == 1


class Crash(BaseException):
    """Stands for the process dying: nothing after it runs."""


def test_crash_between_inbox_link_and_ledger_update_redelivers_once(project, clock, monkeypatch):
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben, Cy\n\nx")

    def die(*a, **k):
        raise Crash()

    monkeypatch.setattr(relay.ledger.messages, "record", die)
    with pytest.raises(Crash):
        relay.step()
    assert len(project.inbox("Ben")) == 1
    assert only_row(relay)["status"] == "processing"
    relay.close()
    project.relays.remove(relay)
    again = project.relay()
    total = again.drain()
    assert total.archived == 1
    assert len(project.inbox("Ben")) == 1 and len(project.inbox("Cy")) == 1
    row = only_row(again)
    assert row["status"] == "archived" and "recovered" in events(again, row["id"])
    assert len(project.files("archive")) == 1 and not project.files("spool")


def test_redelivery_skips_a_recipient_that_already_took_it(project, monkeypatch):
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nx")
    monkeypatch.setattr(relay.ledger.messages, "record", lambda *a, **k: (_ for _ in ()).throw(Crash()))
    with pytest.raises(Crash):
        relay.step()
    [new] = (project.state / "inbox/Ben/new").iterdir()
    os.rename(new, project.state / "inbox/Ben/cur" / (new.name + ":2,S"))
    relay.close()
    project.relays.remove(relay)
    again = project.relay()
    again.drain()
    assert project.inbox("Ben") == [] and len(project.inbox("Ben", "cur")) == 1


def vanish_when_claimed(relay, path, monkeypatch):
    """The file at `path` deleted as soon as the relay's next claim returns; gives the real claim."""
    real = relay.ledger.messages.register_and_claim

    def claim_then_vanish(*a, **k):
        out = real(*a, **k)
        path.unlink()
        return out

    monkeypatch.setattr(relay.ledger.messages, "register_and_claim", claim_then_vanish)
    return real


def test_vanished_before_claim_fails_with_reason(project, monkeypatch):
    relay = project.relay()
    path = project.drop("Ann", "m", "TO: Ben\n\nx")
    path.chmod(0o664)       # writable by its group: not read before custody (Outbox.peek)
    real = vanish_when_claimed(relay, path, monkeypatch)
    relay.step()
    row = only_row(relay)
    assert row["status"] == "failed" and "disappeared before relay could read it" in row["error"]


def test_a_row_already_processing_is_never_claimed_again(project):
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nx")
    now = project.clock.now
    _, claimed = relay.ledger.messages.register_and_claim([], now, 10, lambda *a: "archive/x")
    assert claimed == []
    relay.ledger.messages.register_and_claim([(relay.ids.new(now), "Ann", "m", now)], now, 10, lambda s, i, n: f"archive/d/{s}/{i}--{n}")
    _, again = relay.ledger.messages.register_and_claim([], now + 1, 10, lambda s, i, n: f"archive/d/{s}/{i}--{n}")
    assert again == []                               # the first claim is still processing


def test_backoff_doubles_and_is_capped():
    assert [backoff(1.0, n) for n in range(4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff(1.0, 20) == MAX_BACKOFF and backoff(1.0, 10_000) == MAX_BACKOFF


def test_sweep_by_injected_clock(project, clock):
    relay = project.relay(retention="7d")
    project.drop("Ann", "a", "TO: Ben\n\nx")
    project.drop("Ann", "b", "TO: Nobody\n\nx")
    relay.drain()
    # the second's bounce to Ann is archived beside the first
    assert len(project.files("archive")) == 2 and len(project.files("failed")) == 2
    assert relay.sweep(clock.now + 6 * 86400).archived == 0
    dry = relay.sweep(clock.now + 8 * 86400, dry_run=True)
    assert (dry.archived, dry.failed) == (2, 1) and len(project.files("archive")) == 2
    result = relay.sweep(clock.now + 8 * 86400)
    assert (result.archived, result.failed) == (2, 1)
    assert project.files("archive") == [] and project.files("failed") == []
    assert list(relay.history.audit()) == []
    assert relay.ledger.db.execute("SELECT count(*) FROM checkpoints").fetchone()[0] == 1


def test_a_sweep_batch_full_of_failed_rows_says_another_is_due(project, clock):
    """A batch is bounded by `limit` for archived and for failed rows alike: a batch that took
    `limit` failed rows says more is due, whatever the archived ones, so the daemon sweeps again
    at once and `relay sweep` goes on until none is left."""
    relay = project.relay(retention="1d", bounces=False)     # (the senders' bounces are rows of their own)
    for i in range(3):
        project.drop("Ann", f"f{i}", "TO: Nobody\n\nx")
    project.drop("Ann", "kept", "TO: Ben\n\nx")
    relay.drain()
    later = clock.now + 2 * 86400
    first = relay.sweep(later, limit=2)
    assert (first.archived, first.failed, first.more) == (1, 2, True)
    second = relay.sweep(later, limit=2)
    assert (second.archived, second.failed, second.more) == (0, 1, False)
    assert project.files("failed") == [] and list(relay.history.audit()) == []


def test_a_row_whose_file_the_sweep_cannot_remove_stays_with_its_file(project, clock, tmp_path):
    """A row goes only with its file: where the file cannot be removed (a link planted in its
    path), the row stays, so that the file is never one the ledger lost; archived rows stop at
    the first such one (the rest of the chain waits behind it), failed rows are each on their
    own. Nothing outside is touched; once the path is clear again, the next sweep takes them."""
    relay = project.relay(retention="1d", bounces=False)     # (the senders' bounces are rows of their own)
    for sender in ("Ann", "Ben", "Cy"):
        project.drop(sender, "m", "TO: Ann, Ben, Cy\n\nx")
        project.drop(sender, "f", "TO: Nobody\n\nx")
    relay.drain()
    chained = [row["id"] for _, row, _, _ in relay.history.checks.chain()]
    rows = {r["id"]: r for r in relay.history.audit()}
    stuck = rows[chained[1]]                    # one archived message from each sender
    dirs = [stuck["archive_path"].rsplit("/", 1)[0], f"failed/{stuck['sender']}"]
    for rel in dirs:
        (project.state / rel).rename(tmp_path / rel.replace("/", "-"))
        (project.state / rel).symlink_to(tmp_path / rel.replace("/", "-"))     # an agent's link
    outside = sorted(p.name for rel in dirs for p in (tmp_path / rel.replace("/", "-")).iterdir())
    result = relay.sweep(clock.now + 2 * 86400)
    kept_failed = {mid for mid, r in rows.items() if r["status"] == "failed" and r["sender"] == stuck["sender"]}
    assert {r["id"] for r in relay.history.audit()} == set(chained[1:]) | kept_failed
    assert (result.archived, result.failed, result.more) == (1, 2, False)
    assert sorted(p.name for rel in dirs for p in (tmp_path / rel.replace("/", "-")).iterdir()) == outside
    for rel in dirs:
        (project.state / rel).unlink()
        (tmp_path / rel.replace("/", "-")).rename(project.state / rel)
    from relay.operator import doctor as operator
    assert operator.verify(relay.history, relay.layout)[1] == []
    again = relay.sweep(clock.now + 2 * 86400)
    assert (again.archived, again.failed) == (2, 1) and list(relay.history.audit()) == []
    assert project.files("archive") == [] and project.files("failed") == []


def test_retention_zero_keeps_forever(project, clock):
    relay = project.relay(retention="0")
    project.drop("Ann", "a", "TO: Ben\n\nx")
    relay.drain()
    assert relay.sweep(clock.now + 10**9).archived == 0 and len(project.files("archive")) == 1


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


def test_orphan_tmp_files_removed_after_a_day(project, clock):
    relay = project.relay()
    tmp = project.state / "inbox/Ben/tmp/OLD.json"
    tmp.write_text("{}")
    os.utime(tmp, (clock.now - 2 * 86400, clock.now - 2 * 86400))
    young = project.state / "inbox/Ben/tmp/YOUNG.json"
    young.write_text("{}")
    relay.recover()
    assert not tmp.exists() and young.exists()


def test_every_transition_recorded(project, clock):
    relay = project.relay(retry_backoff="1s")
    project.drop("Ann", "m", "TO: Ben\n\nx")
    full = failing_create(relay, OSError(errno.ENOSPC, "No space left on device"))
    relay.step()
    full["on"] = False
    clock.advance(5)
    relay.step()
    mid = only_row(relay)["id"]
    assert events(relay, mid) == ["discovered", "claimed", "retried", "claimed", "delivered", "archived"]


def test_batches_commit_once_per_phase(project):
    """A backlog is registered, claimed and finished in a handful of transactions."""
    relay = project.relay(agents=("Ann", "Ben"))
    for i in range(50):
        project.drop("Ann", f"m{i}", "TO: Ben\n\nx")
    commits = []
    relay.ledger.db.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)
    total = relay.drain()
    assert total.archived == 50 and 1 <= len(commits) <= 4


def test_newer_schema_refused_and_untouched(project):
    relay = project.relay()
    relay.ledger.db.execute("INSERT INTO schema_migrations VALUES (99, 'future', 'x', 0)")
    relay.close()
    project.relays.remove(relay)
    before = (project.state / "ledger.sqlite").read_bytes()
    from relay.errors import SchemaError
    with pytest.raises(SchemaError, match="schema version 99, newer"):
        Ledger(project.state / "ledger.sqlite")
    assert (project.state / "ledger.sqlite").read_bytes() == before


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name descriptors")
@pytest.mark.parametrize("mode", ["fs", "file"])
def test_claim_is_durable_before_custody(project, mode):
    """The custody rename depends on the claim's record. The claim commits without a sync of
    its own (synchronous = NORMAL for that one commit); its log is fsynced with the envelopes,
    and that sync comes before any file moves, whatever the file system's sync mode. Every
    other commit stays at FULL."""
    order = []

    def fsync(fd):
        order.append("fsync " + os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[-1])
        os.fsync(fd)

    relay = project.relay(sync_mode=mode, fsync=fsync)
    relay.syncer.syncfs = lambda fd: order.append("syncfs")
    relay.syncer.log_sync = fsync
    project.drop("Ann", "m", "TO: Ben\n\nx")
    order.clear()
    relay.ledger.db.set_trace_callback(lambda sql: order.append(sql))
    real = relay.fs.rename
    relay.fs.rename = lambda src, dst, **k: (order.append(f"rename {src}"), real(src, dst, **k))[1]
    relay.step()
    relay.ledger.db.set_trace_callback(None)
    claim = order.index("COMMIT")
    assert order[:2] == ["PRAGMA synchronous = NORMAL", "BEGIN IMMEDIATE"]
    assert order[claim + 1] == "PRAGMA synchronous = FULL"
    assert claim < order.index("fsync ledger.sqlite-wal") < order.index("rename outbox/Ann/m")
    assert order.count("PRAGMA synchronous = NORMAL") == 1       # T2 (the record) is synced itself
    assert relay.history.checks.pragmas()["synchronous"] == "FULL"


def test_an_envelope_sync_failing_after_the_claims_log_synced_fails_its_message(project):
    """The flush before custody syncs the claim's log first, then the envelopes: an envelope's
    sync that fails (EIO) fails its message, which is quarantined; the claim is durable (its log
    synced), so the file is taken into custody first and moved to failed/."""
    logs = []

    def eio(fd):
        raise OSError(errno.EIO, "Input/output error")

    relay = project.relay(sync_mode="file")
    relay.syncer.fsync = eio
    relay.syncer.log_sync = lambda fd: (logs.append(os.readlink(f"/proc/self/fd/{fd}")), os.fsync(fd))
    project.drop("Ann", "m", "TO: Ben\n\nx")
    relay.step()
    [row] = relay.history.audit()
    assert row["status"] == "failed" and "Input/output error" in row["error"]
    assert len(logs) == 1 and logs[0].endswith("ledger.sqlite-wal")
    assert relay.ledger.unsynced is False and project.files("failed")
    assert not (project.state / "outbox/Ann/m").exists() and project.inbox("Ben") == []


def test_archive_failure_in_a_later_step_is_retried(project, clock, monkeypatch):
    relay = project.relay(retry_backoff="5s")
    relay.step()                     # an idle step first: nothing was waiting to be archived
    project.drop("Ann", "m", "TO: Ben\n\nx")
    relay.hint("rescan")
    real = archive_disk_full(relay, monkeypatch)
    relay.step(clock.advance(1))
    assert only_row(relay)["status"] == "delivered"
    monkeypatch.setattr(relay.archive, "store", real)
    relay.step(clock.advance(10))
    assert only_row(relay)["status"] == "archived" and len(project.inbox("Ben")) == 1


def test_a_very_long_file_name_is_fitted_in_the_archive(project):
    relay = project.relay()
    name = "n" * 250
    project.drop("Ann", name, "TO: Ben\n\nlong name")
    assert relay.drain().archived == 1
    [archived] = project.files("archive")
    assert len(archived.name.encode()) <= 255 and archived.name.startswith(only_row(relay)["id"] + "--nnn")
    assert project.inbox("Ben")[0]["source"] == name


class Ticking:
    """An injected clock that moves one second each time it is read."""

    def __init__(self, start):
        self.now = start

    def __call__(self):
        self.now += 1.0
        return self.now


def test_each_lifecycle_event_keeps_its_own_instant(project):
    from relay.core.daemon import Relay
    clock = Ticking(time.time() + 10)
    relay = Relay(project.config(agents=["Ann", "Ben", "Cy"]), clock=clock)
    project.relays.append(relay)
    project.drop("Ann", "m", "TO: Ben, Cy\n\nx")
    relay.step()
    [row] = relay.history.audit()
    at = {e["event"]: e["at"] for e in relay.history.events(row["id"])}
    assert at["discovered"] == at["claimed"] == row["discovered_at"]
    assert at["discovered"] < at["delivered"] < at["archived"]
    assert (row["delivered_at"], row["archived_at"]) == (at["delivered"], at["archived"])
    assert {d["delivered_at"] for d in relay.history.deliveries(row["id"])} == {at["delivered"]}
    assert operator.verify(relay.history, relay.layout) == (1, [])      # the chain covers those times


def test_the_deliveries_of_a_message_are_listed_by_recipient(project):
    relay = project.relay()
    project.drop("Ann", "m", "TO: Cy, Ben\n\nx")
    relay.drain()
    [row] = relay.history.audit()
    assert [d["recipient"] for d in relay.history.deliveries(row["id"])] == ["Ben", "Cy"]


def test_the_chain_goes_on_from_the_last_of_several_checkpoints(project, clock):
    """Two sweeps emptied the chain in turn: a message archived after the second chains on from
    the second checkpoint, and verify finds nothing wrong."""
    relay = project.relay(retention="7d")
    for name in ("a", "b"):
        project.drop("Ann", name, "TO: Ben\n\nx")
        relay.drain()
        clock.advance(8 * 86400)
        assert relay.sweep(clock.now).archived == 1
    project.drop("Ann", "c", "TO: Ben\n\nx")
    relay.drain()
    assert relay.ledger.db.execute("SELECT count(*) FROM checkpoints").fetchone()[0] == 2
    assert operator.verify(relay.history, relay.layout) == (1, [])


def test_a_messages_link_of_the_hash_chain_is_checked_from_the_start_a_checkpoint_or_the_link_before_it(project, clock):
    """history.web.chained (the web view's word on one message): none for a message never
    archived; intact from the chain's start, from the last checkpoint when a sweep took every
    link before it, or from the link before it; records missing before it or a record altered
    are said so."""
    relay = project.relay(retention="7d", bounces=False)
    project.drop("Ann", "a", "TO: Ben\n\nx")
    project.drop("Ann", "lost", "TO: Nobody\n\nx")
    relay.drain()
    ids = {r["name"]: r["id"] for r in relay.history.audit()}
    assert relay.history.web.chained(ids["lost"]) == (None, "not in the hash chain (a message is chained once archived)")
    assert relay.history.web.chained(ids["a"]) == (True, "link 1 of the hash chain holds")
    clock.advance(8 * 86400)
    assert relay.sweep(clock.now).archived == 1
    project.drop("Ann", "c", "TO: Ben\n\nx")
    relay.drain()
    project.drop("Ann", "d", "TO: Ben\n\nx")
    relay.drain()
    ids = {r["name"]: r["id"] for r in relay.history.audit()}
    assert relay.history.web.chained(ids["c"]) == (True, "link 2 of the hash chain holds")
    assert relay.history.web.chained(ids["d"]) == (True, "link 3 of the hash chain holds")
    relay.ledger.db.execute("UPDATE messages SET recipients = '[\"Cy\"]' WHERE id = ?", (ids["c"],))
    assert relay.history.web.chained(ids["c"]) == (False, "link 2 of the hash chain does not match the record: it was altered")
    assert relay.history.web.chained(ids["d"]) == (True, "link 3 of the hash chain holds")
    relay.ledger.db.execute("DELETE FROM chain WHERE message_id = ?", (ids["c"],))
    assert relay.history.web.chained(ids["d"]) == (False, "chain records 2..2 before it are missing")


def test_a_retention_of_0_keeps_everything_in_a_batch_and_in_a_whole_sweep(project, clock):
    relay = project.relay(retention="0")
    project.drop("Ann", "a", "TO: Ben\n\nx")
    project.drop("Ann", "b", "TO: Nobody\n\nx")
    relay.drain()
    far = clock.now + 10 * 365 * 86400
    for result in (relay.sweep(far), relay.sweep_all(far), relay.sweep_all(far, dry_run=True)):
        assert (result.archived, result.failed, result.ids, result.more) == (0, 0, [], False)
    assert len(project.files("archive")) == 2 and len(project.files("failed")) == 2
    result = relay.sweep_all(far, older_than=1)
    assert (result.archived, result.failed) == (2, 1)
    assert project.files("archive") == [] and project.files("failed") == []


def test_ack_moves_an_envelope_of_an_inboxs_new_only(project):
    """Inbox.ack (Maildir's 'seen'): new/<id>.json goes to cur/<id>.json:2,S; a path in cur/,
    in tmp/, in an outbox or one level too deep or too shallow is refused, nothing moved."""
    from relay.files.fs import Unsafe
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nx")
    relay.drain()
    [(sub, path, env)] = relay.inbox.list("Ben")
    assert sub == "new"
    seen = relay.inbox.ack(path)
    assert str(seen) == str(project.state / "inbox/Ben/cur" / f"{env['id']}.json:2,S") == relay.inbox.read_path(path)
    assert os.path.exists(seen) and not os.path.exists(path)
    (project.state / "inbox/Ben/tmp/t.json").write_text("{}")
    (project.state / "inbox/Ben/new/deep").mkdir()
    (project.state / "inbox/Ben/new/deep/d.json").write_text("{}")
    for odd in (seen, project.state / "inbox/Ben/tmp/t.json", project.state / "outbox/Ann/x",
                project.state / "inbox/Ben/new/deep/d.json", project.state / "inbox/Ben/new"):
        with pytest.raises(Unsafe, match="is not an envelope in an inbox's new/"):
            relay.inbox.ack(odd)
    assert os.path.exists(seen) and os.path.exists(project.state / "inbox/Ben/new/deep/d.json")


def test_an_inbox_lists_its_files_in_order_an_unreadable_one_said_and_not_counted_toward_a_limit(project):
    relay = project.relay()
    for i in range(3):
        project.drop("Ann", f"m{i}", f"TO: Ben\n\nbody {i}")
        relay.drain()
    ids = [env["id"] for _, _, env in relay.inbox.list("Ben")]
    assert len(ids) == 3 and ids == sorted(ids)
    new = project.state / "inbox/Ben/new"
    (new / f"{ids[0]}.json").rename(new / "0-list.json")       # sorts first: not an object
    (new / "0-list.json").write_text("[1, 2]")
    (new / ".hidden.json").write_text("{}")
    (new / "adir").mkdir()
    assert relay.inbox.names("Ben") == ["0-list.json", f"{ids[1]}.json", f"{ids[2]}.json"]
    listed = relay.inbox.list("Ben", limit=1)
    assert [env for _, _, env in listed][0] == {"id": "0-list", "error": "unreadable envelope: not a JSON object"}
    assert [env["id"] for _, _, env in listed] == ["0-list", ids[1]]
    assert [env["id"] for _, _, env in relay.inbox.list("Ben", limit=2)] == ["0-list", ids[1], ids[2]]
    assert [env["id"] for _, _, env in relay.inbox.list("Ben", skip={f"{ids[1]}.json"})] == ["0-list", ids[2]]
    assert relay.inbox.names("Nobody") == [] and relay.inbox.list("Nobody") == []


def test_pending_pairs_count_only_the_recipients_a_pending_message_has_not_reached_nor_shed_for(project, clock):
    relay = project.relay(agents=("Ann", "Ben", "Cy", "Dee"), pair_rate=1, pair_window="1h")
    project.drop("Ann", "first", "TO: Cy\n\nfirst")
    assert relay.step().archived == 1
    failing_create(relay, OSError(errno.ENOSPC, "No space left on device"), when=lambda rel: rel.startswith("inbox/Dee"))
    project.drop("Ann", "both", "TO: Ben, Cy, Dee\n\nx")    # Cy: over the pair rate; Dee: no room
    relay.hint("rescan")
    assert relay.step(clock.advance(1)).retried == 1
    row = next(r for r in relay.history.audit() if r["name"] == "both")
    assert row["status"] == "pending"
    assert [d["recipient"] for d in relay.history.deliveries(row["id"])] == ["Ben"]
    assert relay.history.pending_pairs() == {("Ann", "Dee"): 1}


def test_an_archive_move_tried_again_keeps_failing_then_finds_the_original_in_neither_place_then_in_the_archive(
        project, clock, monkeypatch):
    relay = project.relay(retry_backoff="5s")
    project.drop("Ann", "m", "TO: Ben\n\nx")
    real = archive_disk_full(relay, monkeypatch)
    relay.step()
    first = only_row(relay)
    assert first["status"] == "delivered"
    relay.step(clock.advance(60))
    row = only_row(relay)
    assert (row["status"], row["error"]) == ("delivered", "archive: No space left on device")
    assert row["retries"] == first["retries"] + 1
    monkeypatch.setattr(relay.archive, "store", real)
    [spooled] = project.files("spool")
    kept = spooled.read_bytes()
    spooled.unlink()
    relay.step(clock.advance(600))
    row = only_row(relay)
    assert (row["status"], row["error"]) == ("delivered", "archive: the original is in neither the spool nor the archive")
    assert row["retries"] == first["retries"] + 2
    archived = project.state / row["archive_path"]
    archived.parent.mkdir(parents=True, exist_ok=True)
    archived.write_bytes(kept)             # moved there before a crash the row did not see
    relay.step(clock.advance(3600))
    row = only_row(relay)
    assert (row["status"], row["error"]) == ("archived", None) and archived.read_bytes() == kept
    assert len(project.inbox("Ben")) == 1


def test_audit_grep_finds_a_word_in_the_subject_the_body_or_the_file_name_in_any_case(project):
    relay = project.relay()
    project.drop("Ann", "a", "TO: Ben\nSUBJECT: the NEEDLE here\n\nplain")
    project.drop("Ann", "b", "TO: Ben\nSUBJECT: plain\n\nthe body holds a NeEdLe")
    project.drop("Ann", "needle-file", "TO: Ben\nSUBJECT: plain\n\nplain")
    project.drop("Ann", "d", "TO: Ben\nSUBJECT: plain\n\nnothing")
    relay.drain()
    assert sorted(r["name"] for r in relay.history.audit(grep="needle")) == ["a", "b", "needle-file"]
    assert [r["name"] for r in relay.history.audit(grep="NEEDLE-FILE")] == ["needle-file"]
    assert [r["name"] for r in relay.history.audit(grep="nothing")] == ["d"]


@pytest.mark.parametrize("status", ["archived", "failed"])
def test_a_message_archived_or_failed_exactly_at_the_cutoff_is_kept_and_a_moment_before_it_is_swept(project, status):
    relay = project.relay(bounces=False)
    project.drop("Ann", "m", "TO: Ben\n\nx" if status == "archived" else "TO: Nobody\n\nx")
    relay.drain()
    row = only_row(relay)
    assert row["status"] == status
    at = row["archived_at" if status == "archived" else "failed_at"]
    keep = 1024.0
    for dry in (True, False):
        result = relay.sweep(at + keep, older_than=keep, dry_run=dry)
        assert (result.archived, result.failed, result.ids) == (0, 0, [])
        assert relay.sweep_all(at + keep, older_than=keep, dry_run=dry).ids == []
    dry = relay.sweep_all(at + keep + 0.001, older_than=keep, dry_run=True)
    assert (dry.archived, dry.failed) == ((1, 0) if status == "archived" else (0, 1))
    result = relay.sweep(at + keep + 0.001, older_than=keep)
    assert result.ids == [row["id"]] and list(relay.history.audit()) == []


def test_a_steps_counts_tell_a_duplicate_archived_undelivered_and_a_bounce_apart_from_the_agents_messages(project):
    relay = project.relay()
    project.drop("Ann", "a", "TO: Ben\nREQUEST-ID: r-1\n\nonce")
    project.drop("Ann", "b", "TO: Ben\nREQUEST-ID: r-1\n\nonce, again")
    project.drop("Ann", "c", "TO: Nobody\n\nlost")
    total = relay.drain()
    assert (total.archived, total.delivered, total.failed, total.bounced) == (2, 2, 1, 1)
    assert [e["body"] for e in project.inbox("Ben")] == ["once"]
    assert [e["kind"] for e in project.inbox("Ann")] == ["bounce"]


def test_a_failed_message_with_no_file_left_is_swept_with_the_others(project, clock, monkeypatch):
    relay = project.relay(bounces=False, retention="1d")
    path = project.drop("Ann", "m", "TO: Ben\n\nx")
    path.chmod(0o664)       # writable by its group: not read before custody (Outbox.peek)
    real = vanish_when_claimed(relay, path, monkeypatch)
    relay.step()
    monkeypatch.setattr(relay.ledger.messages, "register_and_claim", real)
    row = only_row(relay)
    assert row["status"] == "failed" and not (project.state / row["failed_path"]).exists()
    assert [p.name for p in project.files("failed")] == [f"{row['failed_path'].rsplit('/', 1)[1]}.error.json"]
    result = relay.sweep(clock.now + 2 * 86400)
    assert (result.failed, result.ids, result.more) == (1, [row["id"]], False)
    assert list(relay.history.audit()) == [] and project.files("failed") == []


def test_what_waits_in_the_ledger_is_said_by_where_its_file_is_and_why_within_the_horizon(project, clock):
    relay = project.relay(retry_backoff="10s")
    failing_create(relay, OSError(errno.ENOSPC, "No space left on device"))
    project.drop("Ann", "m", "TO: Ben\n\nx")
    assert relay.step().retried == 1
    row = only_row(relay)
    due = row["next_attempt_at"]
    assert relay.history.waiting(due - 5, 5) == [(f"{row['id']} from Ann (spool)", row["error"])]
    assert "No space left on device" in row["error"]
    assert relay.history.waiting(due - 5, 4.999) == []


def test_the_web_views_page_filters_by_agent_recipient_kind_and_thread_each_alone(project):
    relay = project.relay()
    project.drop("Ann", "a", "TO: Ben\nTHREAD: t-1\n\na")
    project.drop("Ben", "b", "TO: Cy\nKIND: review\n\nb")
    project.drop("Cy", "c", "TO: Nobody\n\nc")              # failed: its recipients written, none delivered
    relay.drain()
    ids = {r["name"]: r["id"] for r in relay.history.audit() if r["sender"] != "System"}
    project.drop("Cy", "reply", f"TO: Ann\nTHREAD: {ids['b']}\n\nreply")
    relay.drain()
    ids = {r["name"]: r["id"] for r in relay.history.audit() if r["sender"] != "System"}
    web = relay.history.web

    def names(**filters):
        by_id = {v: k for k, v in ids.items()}
        return sorted(by_id[r["id"]] for r in web.messages(**filters) if r["id"] in by_id)
    assert names(agent="Ben") == ["a", "b"]
    assert names(agent="Nobody") == ["c"] and names(recipient="Nobody") == ["c"]
    assert names(recipient="Ben") == ["a"] and names(sender="Cy") == ["c", "reply"]
    assert names(kind="review") == ["b"]
    assert names(thread="t-1") == ["a"] and names(thread=ids["b"]) == ["b", "reply"]
    assert names(status="failed") == ["c"]


def test_a_badly_named_file_that_cannot_be_quarantined_stays_in_its_outbox_unrecorded_until_it_can(
        project, clock, monkeypatch, caplog):
    relay = project.relay()
    project.drop("Ann", "tab\there", "TO: Ben\n\nx")
    real = relay.archive.move

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(relay.archive, "move", full)
    assert relay.step().failed == 0
    assert (project.state / "outbox" / "Ann" / "tab\there").exists()
    assert list(relay.history.audit()) == [] and project.files("failed") == []
    assert "outbox/Ann/tab\\x09here: " in caplog.text and "cannot quarantine it" in caplog.text
    monkeypatch.setattr(relay.archive, "move", real)
    clock.advance(60)
    assert relay.step().failed == 1
    [row] = relay.history.audit(status="failed")
    assert row["name"] == "tab\\x09here" and "rename it with a plain UTF-8 name" in row["error"]
    assert not (project.state / "outbox" / "Ann" / "tab\there").exists()


def test_an_inbox_moves_only_an_envelope_of_an_inboxs_new_to_cur(project):
    from relay.files.fs import Unsafe
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nx")
    relay.drain()
    [new] = list((project.state / "inbox" / "Ben" / "new").iterdir())
    cur = project.state / "inbox" / "Ben" / "cur"
    (cur / "sub").mkdir()
    (cur / "sub" / new.name).write_text("{}")
    for path in (project.state / "outbox" / "Ann" / new.name, cur / "sub" / new.name, cur / "sub",
                 project.state / "inbox" / "Ben" / "new" / "sub" / new.name, project.state / "spool" / "Ben" / "new" / new.name):
        with pytest.raises(Unsafe, match="is not an envelope in an inbox's new/"):
            relay.inbox.ack(path)
    assert new.exists() and (cur / "sub").is_dir()
    moved = relay.inbox.ack(new)
    assert str(moved) == str(cur / f"{new.name}:2,S") == relay.inbox.read_path(new)
    assert not new.exists() and json.loads(open(moved).read())["body"] == "x"


def test_a_notice_is_put_once_in_its_recipients_new_and_one_that_cannot_be_put_says_where(tmp_path):
    from relay.core.notices import deliver
    from relay.errors import RelayError
    from relay.files.layout import Layout
    layout = Layout(tmp_path, tmp_path / ".relay")
    layout.init(["Ann", "Ben"])
    nid = "01JAAAAAAAAAAAAAAAAAAAAAAA"
    args = ("reservation-refused", "your paths", "Ben holds src/", {"paths": ["src/"]}, 1000.0, 1001.0)
    assert deliver(layout, nid, "Ann", *args) == f"inbox/Ann/new/{nid}.json"
    assert deliver(layout, nid, "Ann", *args) == f"inbox/Ann/new/{nid}.json"        # again: not twice
    new = tmp_path / ".relay" / "inbox" / "Ann" / "new"
    [doc] = [json.loads(p.read_text()) for p in new.iterdir()]
    assert (doc["from"], doc["to"], doc["kind"], doc["subject"], doc["body"]) == (
        "System", ["Ann"], "reservation-refused", "your paths", "Ben holds src/")
    tmp = tmp_path / ".relay" / "inbox" / "Ben" / "tmp"
    tmp.rmdir()
    tmp.symlink_to(tmp_path)
    with pytest.raises(RelayError, match="could not put a notice in inbox/Ben: "):
        deliver(layout, nid, "Ben", *args)
    assert list((tmp_path / ".relay" / "inbox" / "Ben" / "new").iterdir()) == []


def test_the_copy_of_an_envelope_found_for_a_recipient_is_the_first_that_is_a_json_object(project):
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nx")
    relay.drain()
    box = project.state / "inbox" / "Ben"
    [new] = list((box / "new").iterdir())
    mid = new.name[:-len(".json")]
    os.rename(new, box / "cur" / f"{new.name}:2,S")
    new.write_text("[1, 2]")                       # planted where the unread copy would be
    state, path, doc = relay.inbox.envelope("Ben", mid)
    assert (state, doc["id"], doc["body"]) == ("cur", mid, "x") and path.endswith(f"cur/{mid}.json:2,S")
    new.write_text("not json")
    assert relay.inbox.envelope("Ben", mid)[0] == "cur"
    os.unlink(box / "cur" / f"{new.name}:2,S")
    assert relay.inbox.envelope("Ben", mid) is None
    assert relay.inbox.envelope("Cy", mid) is None


@pytest.mark.parametrize("error, said", [
    (OSError(errno.ENOSPC, "No space left on device"), "No space left on device"),     # its words, no [Errno 28]
    (OSError("the inbox is on a disk that went away"), "the inbox is on a disk that went away"),  # no strerror
])
def test_a_failed_envelope_write_is_told_in_the_errors_own_words(project, error, said):
    relay = project.relay(retry_backoff="10s")
    project.drop("Ann", "m", "TO: Ben\n\nx")
    failing_create(relay, error)
    assert relay.step().retried == 1
    row = only_row(relay)
    assert row["status"] == "pending" and f"writing the envelope for Ben: {said}" in row["error"]
    assert "[Errno" not in row["error"] and "None" not in row["error"]


def test_a_copy_that_is_json_but_no_object_is_written_again_after_a_crash(project):
    """Delivered to Ben, then the process died before the record; Ben's copy was replaced by
    JSON that is no envelope (a list). Tried again, that copy is no complete envelope of the
    message: it is written again, and the message archived."""
    copy, _ = crashed_after_the_links(project)
    copy.write_text("[1, 2]")
    again = project.relay()
    assert again.drain().archived == 1
    assert only_row(again)["status"] == "archived"
    assert [e["body"] for e in project.inbox("Ben")] == ["x"]


def test_a_copy_of_the_same_bytes_under_another_id_is_written_again_after_a_crash(project):
    """After the crash Ben's copy holds an envelope of the same file (same sha256) but another
    message's id: no copy of this message, so it is written again under its own id."""
    copy, doc = crashed_after_the_links(project)
    mid = doc["id"]
    copy.write_text(json.dumps({**doc, "id": "01JAAAAAAAAAAAAAAAAAAAAAAA"}))
    again = project.relay()
    assert again.drain().archived == 1
    assert only_row(again)["id"] == mid
    assert [(e["id"], e["body"]) for e in project.inbox("Ben")] == [(mid, "x")]


def crashed_after_the_links(project):
    """Ann's `m` to Ben delivered, then the process died before the record: (Ben's copy, the
    envelope in it). The relay is closed; the caller starts another."""
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nx")
    real = relay.ledger.messages.record
    relay.ledger.messages.record = lambda *a, **k: (_ for _ in ()).throw(Crash())
    try:
        with pytest.raises(Crash):
            relay.step()
    finally:
        relay.ledger.messages.record = real
    relay.close()
    project.relays.remove(relay)
    [copy] = list((project.state / "inbox" / "Ben" / "new").iterdir())
    return copy, json.loads(copy.read_bytes())


def test_a_copy_under_the_id_of_other_bytes_is_written_again_after_a_crash(project):
    """Ben's copy names this message's id but another file's sha256 (and body): no complete
    envelope of this message, so it is written again."""
    copy, doc = crashed_after_the_links(project)
    copy.write_text(json.dumps({**doc, "sha256": "0" * 64, "body": "other bytes"}))
    again = project.relay()
    assert again.drain().archived == 1
    assert [(e["id"], e["body"], e["sha256"]) for e in project.inbox("Ben")] == [(doc["id"], "x", doc["sha256"])]


def test_a_read_copy_under_a_name_relays_readers_never_make_is_no_copy_after_a_crash(project):
    """Ben moved the copy into cur/ under a name with a control character: relay's readers
    never make it, so it does not stand for the message, which is delivered into new/ again."""
    copy, doc = crashed_after_the_links(project)
    os.rename(copy, project.state / "inbox" / "Ben" / "cur" / f"{copy.name}:2,S\x01")
    again = project.relay()
    assert again.drain().archived == 1
    assert [(e["id"], e["body"]) for e in project.inbox("Ben")] == [(doc["id"], "x")]
