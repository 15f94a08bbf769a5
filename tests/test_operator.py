"""retry, expire, verify, doctor, agents, tail through the CLI; audit's row limit said, `relay
status` as a health check, doctor running verify's checks, and the read-only verbs on a project
no one may write."""
import json
import os
import re
import sqlite3
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from relay.cli import main
from relay.files.layout import Layout
from relay.files.lock import DaemonLock
from relay.operator import doctor as operator


@pytest.fixture
def cli(tmp_path):
    runner = CliRunner()

    def run(*args, ok=True):
        r = runner.invoke(main, ["--root", str(tmp_path), *args], catch_exceptions=False)
        if ok:
            assert r.exit_code == 0, r.output
        assert "Traceback" not in r.output
        return r
    run.root = tmp_path
    run.state = tmp_path / ".relay"
    run("init", "--agent", "Ann", "--agent", "Ben")
    return run


def drop(cli, sender, name, text):
    box = cli.state / "outbox" / sender
    (box / name).write_text(text)
    os.utime(box / name, (1_700_000_000, 1_700_000_000))


def ids(cli, *args):
    return [r["id"] for r in json.loads(cli("audit", "--json", *args).output)]


def db(cli):
    return sqlite3.connect(cli.state / "ledger.sqlite", isolation_level=None)


@pytest.fixture
def relayed(cli):
    for i in range(3):
        drop(cli, "Ann", f"m{i}", f"TO: Ben\n\nbody {i}")
    drop(cli, "Ann", "bad", "TO: Zed\n\nnobody")
    cli("run", "--once", "-q")
    cli("run", "--once", "-q")      # the bounce the first pass owes its sender
    return cli


def files(cli, sub):
    return sorted(str(p.relative_to(cli.state)) for p in (cli.state / sub).rglob("*") if p.is_file())


def status(cli, mid):
    return json.loads(cli("show", mid, "--json").output)["status"]


def test_retry_failed_after_fixing_the_cause(relayed):
    cli = relayed
    [failed] = ids(cli, "--status", "failed")
    assert files(cli, "failed") == [f"failed/Ann/{failed}--bad", f"failed/Ann/{failed}--bad.error.json"]
    cli("init", "--agent", "Zed")
    assert f"{failed}: back to pending" in cli("retry", failed).output
    assert status(cli, failed) == "pending"
    assert files(cli, "failed") == []                       # the file and its .error.json are gone
    assert files(cli, "spool") == [f"spool/Ann/{failed}--bad"]
    cli("run", "--once", "-q")
    assert status(cli, failed) == "archived"
    [env] = json.loads(cli("inbox", "Zed", "--json").output)
    assert env["id"] == failed and env["body"] == "nobody"
    events = [e["event"] for e in json.loads(cli("show", failed, "--json").output)["events"]]
    # the retried delivery ends archived; listing Zed's inbox afterwards records it surfaced, once
    assert "retry" in events and events[-2:] == ["archived", "surfaced"]
    assert events.index("retry") < events.index("archived") and events.count("surfaced") == 1
    r = cli("retry", failed, ok=False)
    assert r.exit_code == 1 and "not failed" in r.output
    assert cli("retry", ok=False).exit_code == 2


def test_retry_all_failed(relayed):
    cli = relayed
    drop(cli, "Ben", "lost", "TO: Yan\n\nnobody either")
    cli("run", "--once", "-q")
    cli("run", "--once", "-q")      # and its bounce
    failed = ids(cli, "--status", "failed")
    archived = ids(cli, "--status", "archived")
    assert len(failed) == 2 and len(archived) == 3 + 2      # + the failures' bounces to their senders
    out = cli("retry", "--failed").output
    assert sorted(re.findall(r"^(\w+): back to pending$", out, re.M)) == sorted(failed)
    assert sorted(ids(cli, "--status", "pending")) == sorted(failed)
    assert ids(cli, "--status", "failed") == [] and ids(cli, "--status", "archived") == archived
    assert files(cli, "failed") == [] and len(files(cli, "spool")) == 2
    assert cli("retry", "--failed").output == "no failed messages\n"     # pending ones are left alone


def test_expire_pending_and_failed(relayed):
    cli = relayed
    # pending: its file leaves the outbox for failed/ and is never delivered
    drop(cli, "Ann", "m", "TO: Ben\n\nnot wanted")
    led = db(cli)
    led.execute("INSERT INTO messages (id, sender, name, status, discovered_at) VALUES "
                "('01AAAAAAAAAAAAAAAAAAAAAAAA', 'Ann', 'm', 'pending', 1)")
    led.close()
    assert "01AAAAAAAAAAAAAAAAAAAAAAAA: expired" in cli("expire", "01AAAAAAAAAAAAAAAAAAAAAAAA").output
    rec = json.loads(cli("show", "01AAAAAAAAAAAAAAAAAAAAAAAA", "--json").output)
    assert rec["status"] == "failed" and "expired by operator" in rec["error"]
    assert rec["events"][-1]["event"] == "expired" and rec["events"][-1]["actor"].startswith("operator")
    assert (cli.state / rec["failed_path"]).read_text() == "TO: Ben\n\nnot wanted"
    report = json.loads((cli.state / f"{rec['failed_path']}.error.json").read_text())
    assert report["id"] == rec["id"] and "expired by operator" in report["reason"]
    assert not (cli.state / "outbox/Ann/m").exists()
    inbox_before = json.loads(cli("inbox", "Ben", "--json").output)
    cli("run", "--once", "-q")
    assert status(cli, rec["id"]) == "failed"
    assert json.loads(cli("inbox", "Ben", "--json").output) == inbox_before
    # failed: it stays in failed/ where it is; the reason, event and .error.json say it was expired
    [failed] = [i for i in ids(cli, "--status", "failed") if i != rec["id"]]
    before = json.loads(cli("show", failed, "--json").output)
    assert "unknown recipient Zed" in before["error"]
    assert f"{failed}: expired" in cli("expire", failed).output
    rec = json.loads(cli("show", failed, "--json").output)
    assert rec["status"] == "failed" and "expired by operator" in rec["error"]
    assert rec["events"][-1]["event"] == "expired" and rec["events"][-1]["actor"].startswith("operator")
    assert rec["failed_path"] == before["failed_path"]
    assert (cli.state / rec["failed_path"]).read_text() == "TO: Zed\n\nnobody"
    report = json.loads((cli.state / f"{rec['failed_path']}.error.json").read_text())
    assert "expired by operator" in report["reason"] and "unknown recipient" not in report["reason"]
    assert files(cli, "failed") == sorted(["failed/Ann/01AAAAAAAAAAAAAAAAAAAAAAAA--m",
                                           "failed/Ann/01AAAAAAAAAAAAAAAAAAAAAAAA--m.error.json",
                                           rec["failed_path"], f"{rec['failed_path']}.error.json"])


def test_expire_refuses_archived(relayed):
    archived = ids(relayed, "--status", "archived")[0]
    r = relayed("expire", archived, ok=False)
    assert r.exit_code == 1 and "only pending or failed" in r.output


def test_verify_clean_then_catches_each_tampering(relayed):
    cli = relayed
    assert "verified 4 archived message(s): ok" in cli("verify").output      # the failure's bounce too
    rows = json.loads(cli("audit", "--json", "--status", "archived").output)
    a, b, c = [r for r in rows if r["kind"] != "bounce"]
    # a changed archive byte
    path = cli.state / a["archive_path"]
    path.write_bytes(path.read_bytes().replace(b"body", b"bodY"))
    # a removed archive file
    (cli.state / b["archive_path"]).unlink()
    r = cli("verify", ok=False)
    assert r.exit_code == 1
    assert f"{a['id']}: archive file {a['archive_path']} does not match its sha256" in r.output
    assert f"{b['id']}: archive file {b['archive_path']} is missing" in r.output
    assert c["id"] not in r.output


def test_verify_catches_edited_and_deleted_rows(relayed):
    cli = relayed
    a, b, c = [r for r in json.loads(cli("audit", "--json", "--status", "archived").output) if r["kind"] != "bounce"]
    led = db(cli)
    led.execute("UPDATE messages SET sender = 'Mallory' WHERE id = ?", (a["id"],))
    led.execute("PRAGMA foreign_keys = ON")
    led.execute("DELETE FROM messages WHERE id = ?", (b["id"],))
    led.close()
    r = cli("verify", ok=False)
    assert f"{a['id']}: its ledger record was altered" in r.output
    assert f"{b['id']}: its ledger record was deleted" in r.output


def test_verify_catches_an_archive_file_moved_with_its_recorded_path(relayed):
    """The hash chain covers where each original lies: an archive file renamed, with the ledger's
    archive_path changed to match (the bytes and their sha256 untouched), is an altered record."""
    cli = relayed
    a, b, c = [r for r in json.loads(cli("audit", "--json", "--status", "archived").output) if r["from"] != "System"]
    moved = a["archive_path"].rsplit("--", 1)[0] + "--elsewhere"
    os.rename(cli.state / a["archive_path"], cli.state / moved)
    led = db(cli)
    led.execute("UPDATE messages SET archive_path = ? WHERE id = ?", (moved, a["id"]))
    led.close()
    r = cli("verify", ok=False)
    assert r.exit_code == 1 and f"{a['id']}: its ledger record was altered" in r.output
    assert b["id"] not in r.output and c["id"] not in r.output


def test_verify_catches_inserted_record(relayed):
    led = db(relayed)
    led.execute("INSERT INTO messages (id, sender, name, status, discovered_at, archive_path) VALUES "
                "('01BBBBBBBBBBBBBBBBBBBBBBBB', 'Ann', 'x', 'archived', 1, NULL)")
    led.close()
    r = relayed("verify", ok=False)
    assert "01BBBBBBBBBBBBBBBBBBBBBBBB: archived record is not in the hash chain" in r.output


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


def test_verify_passes_after_a_sweep(relayed):
    cli = relayed
    drop(cli, "Ann", "later", "TO: Ben\n\nlater")
    cli("sweep", "--older-than", "0.001s")
    cli("run", "--once", "-q")
    out = cli("verify").output
    assert "verified 1 archived message(s): ok" in out


@pytest.mark.parametrize("upto", [10**9, "x"])
def test_a_checkpoint_row_cannot_hide_the_chain_from_verify(cli, upto):
    """verify walks the hash chain from the last checkpoint on. A checkpoint row beyond the chain
    (or one whose position is text) made it walk nothing: an altered record, with such a row
    added, verified `ok` and the chain head it printed stayed the one noted before. Links at or
    before the last checkpoint (a sweep deletes them) and a checkpoint this build cannot read
    are problems, for verify and doctor alike."""
    cli("init", "--agent", "Ann", "--agent", "Ben")
    cli("send", "--from", "Ann", "--to", "Ben", "x")
    cli("run", "--once", "-q")
    head = cli("verify").stdout.rsplit("chain head ", 1)[1]
    db = sqlite3.connect(cli.state / "ledger.sqlite", isolation_level=None)
    db.execute("UPDATE messages SET sender = 'Ben'")
    db.execute("INSERT INTO checkpoints (at, upto, head, removed) VALUES (1, ?, ?, 0)", (upto, "0" * 64))
    db.close()
    r = cli("verify", ok=False)
    assert r.exit_code == 1 and "checkpoint" in r.stdout and r.stdout.rsplit("chain head ", 1)[1] == head
    r = cli("doctor", ok=False)
    assert r.exit_code == 1 and "checkpoint" in r.stdout


def test_doctor_clean_then_reports_problems(relayed):
    cli = relayed
    assert "doctor: no problems" in cli("doctor").output
    (cli.state / "archive" / "stray").write_text("x")
    (cli.state / "archive" / "two\nlines").write_text("x")
    (cli.state / "outbox" / "bad name").mkdir()
    (cli.state / "outbox" / "bad\nname").mkdir()
    led = db(cli)
    led.execute("UPDATE messages SET status = 'processing' WHERE id = (SELECT min(id) FROM messages)")
    led.close()
    r = cli("doctor", ok=False)
    assert r.exit_code == 1
    assert "archive/stray: a file no ledger record knows" in r.output
    assert "outbox/bad name: invalid agent name" in r.output
    # A name with a newline stays on its problem's one line, the newline shown as an escape.
    assert "archive/two\\x0alines: a file no ledger record knows" in r.output
    assert "outbox/bad\\x0aname: invalid agent name" in r.output
    assert "left processing by a stopped relay" in r.output
    doc = json.loads(cli("doctor", "--json", ok=False).output)
    assert doc["ok"] is False and doc["migrations"][0]["checksum_ok"] is True


def test_agents(relayed):
    rows = {r["agent"]: r for r in json.loads(relayed("agents", "--json").output)}
    assert rows["Ann"]["sent"] == 4 and rows["Ben"]["received"] == 3 and rows["Ben"]["inbox_new"] == 3
    assert "unknown recipient Zed" in rows["Ann"]["last_error"]
    assert "Ann" in relayed("agents").output


def test_tail_and_follow_with_a_deadline(relayed):
    out = relayed("tail", "-n", "100").output
    assert "discovered" in out and "archived" in out and "failed" in out
    lines = relayed("tail", "--json", "-n", "3").output.strip().splitlines()
    assert len(lines) == 3 and json.loads(lines[-1])["event"]
    started = time.monotonic()
    followed = relayed("tail", "--follow", "--timeout", "0.3s", "-n", "1").output
    assert len(followed.strip().splitlines()) == 1 and time.monotonic() - started >= 0.3
    # --follow prints an event written while it runs (by another process), then stops at --timeout.
    [failed] = ids(relayed, "--status", "failed")
    tail = subprocess.Popen([sys.executable, "-m", "relay", "--root", str(relayed.state.parent), "tail",
                             "--follow", "--timeout", "2s", "--json", "-n", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = json.loads(tail.stdout.readline())        # tail is following from here on
        relayed("expire", failed)
        out, err = tail.communicate(timeout=30)
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.communicate()
    assert tail.returncode == 0, err
    later = [json.loads(line) for line in out.splitlines()]
    assert [(e["id"], e["event"]) for e in later] == [(failed, "expired")]
    assert later[0]["seq"] > first["seq"]


def many(cli, n):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    for i in range(n):
        cli("send", "--from", "Ann", "--to", "Ben", f"message {i} " + "x" * 200)
    cli("run", "--once", "-q")


def test_audit_says_when_it_stopped_at_its_limit(cli):
    many(cli, 4)
    r = cli("audit", "--limit", "3")
    assert len(r.stdout.strip().splitlines()) == 4          # the header and 3 rows
    assert "stopped at the limit of 3 message(s); more match" in r.stderr
    r = cli("audit", "--limit", "4", "--json")
    assert len(json.loads(r.stdout)) == 4 and "limit" not in r.stderr


@pytest.fixture
def held(cli):
    Layout(cli.root, cli.state).create()
    with DaemonLock(cli.state / "relay.lock") as lock:
        yield lock


def test_status_is_a_health_check(cli, held):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    r = cli("status", "--json")
    assert json.loads(r.stdout)["health"] == {"ok": True, "exit": 0, "problems": []}
    db = sqlite3.connect(cli.state / "ledger.sqlite", isolation_level=None)
    db.execute("INSERT INTO messages (id, sender, name, status, discovered_at) VALUES "
               "('01AAAAAAAAAAAAAAAAAAAAAAAA', 'Ann', 'm', 'pending', ?)", (time.time() - 3600,))
    db.close()
    r = cli("status", ok=False)
    assert r.exit_code == 4 and "more than --max-pending-age 10m" in r.stdout
    assert cli("status", "--max-pending-age", "2h").exit_code == 0
    assert cli("status", "--max-pending-age", "0").exit_code == 0
    held.release()
    r = cli("status", "--json", ok=False)
    assert r.exit_code == 0 and "no daemon is running" in json.loads(r.stdout)["health"]["problems"][0]
    assert json.loads(r.stdout)["health"]["exit"] == 3 and cli("status", ok=False).exit_code == 3
    assert cli("status", "--max-pending-age", "5", ok=False).exit_code == 3      # a bare number: seconds
    assert cli("status", "--max-pending-age", "soon", ok=False).exit_code == 2


def test_doctor_runs_verifys_archive_checks_unless_quick(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    cli("send", "--from", "Ann", "--to", "Ben", "x")
    cli("run", "--once", "-q")
    assert "verified 1 archived message(s)" in cli("doctor").stdout
    [original] = [p for p in (cli.state / "archive").rglob("*") if p.is_file()]
    original.write_text("TO: Ben\n\nforged")
    verify = cli("verify", ok=False)
    doctor = cli("doctor", ok=False)
    assert verify.exit_code == doctor.exit_code == 1
    [line] = [line for line in verify.stdout.splitlines() if "does not match its sha256" in line]
    assert line in doctor.stdout.splitlines()
    quick = cli("doctor", "--quick")
    assert "verify's checks not run (--quick)" in quick.stdout and "no problems" in quick.stdout


@pytest.fixture
def read_only(tmp_path):
    """A project whose state directory and ledger no one may write, root included: the
    immutable attribute (chattr +i), which root's permission checks do not pass over as they
    pass over the mode bits. Undone at the end. Each verb runs as a process of its own, as a
    person reading someone else's project does (in this process, a ledger mapped by an earlier
    verb and then made immutable is no project anyone reads)."""
    import shutil
    import sys

    class Ran:
        def __init__(self, r):
            self.exit_code, self.stdout, self.output = r.returncode, r.stdout, r.stdout + r.stderr

    def cli(*args, ok=True):
        r = Ran(subprocess.run([sys.executable, "-m", "relay", "--root", str(tmp_path), *args],
                               capture_output=True, text=True, timeout=120))
        if ok:
            assert r.exit_code == 0, r.output
        assert "Traceback" not in r.output
        return r
    cli.root, cli.state = tmp_path, tmp_path / ".relay"
    cli("init", "--agent", "Ann", "--agent", "Ben")
    cli("send", "--from", "Ann", "--to", "Ben", "--subject", "plan", "the zebra plan")
    cli("run", "--once", "-q")
    cli("state", "set", "build", "green", "--as", "Ann")
    held = [cli.state] + [p for p in cli.state.iterdir() if p.name.startswith("ledger.sqlite")]
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", *map(str, held)],
                                                        capture_output=True).returncode:
        subprocess.run(["chattr", "-i", *map(str, held)], capture_output=True)
        pytest.skip("cannot make the project immutable here (chattr +i)")
    try:
        yield cli
    finally:
        subprocess.run(["chattr", "-i", *map(str, held)], check=True)


def test_the_read_only_verbs_read_a_read_only_project(read_only):
    cli = read_only
    assert [d["subject"] for d in json.loads(cli("audit", "--json").stdout)] == ["plan"]
    assert "zebra" in cli("search", "zebra").stdout
    assert cli("state", "get", "build").stdout.strip().startswith("green")
    [mid] = [d["id"] for d in json.loads(cli("audit", "--json").stdout)]
    assert json.loads(cli("show", mid, "--json").stdout)["body"] == "the zebra plan"
    assert "Ann" in cli("agents").stdout
    r = cli("status", ok=False)
    assert r.exit_code == 3                                           # no daemon runs: the health check's 3
    assert f"ledger     read-only: {cli.state} cannot be written" in r.stdout
    doc = json.loads(cli("status", "--json").stdout)
    assert sum(doc["counts"].values()) == 1
    assert doc["ledger"] == {"path": str(cli.state / "ledger.sqlite"), "writable": False,
                             "unwritable": str(cli.state), "opened": "immutable"}
    assert "WAL" not in cli("doctor", "--quick", ok=False).stdout      # the file's header says WAL
    r = cli("send", "--from", "Ann", "--to", "Ben", "hi", ok=False)     # what writes says why it cannot
    assert r.exit_code == 1 and f"{cli.state} cannot be written (a read-only project" in r.output


def test_status_of_a_writable_project_says_its_ledger_is_writable(cli):
    cli("init", "--agent", "Ann")
    doc = json.loads(cli("status", "--json").stdout)
    assert doc["ledger"] == {"path": str(cli.state / "ledger.sqlite"), "writable": True, "unwritable": None,
                             "opened": "read-only"}
    assert "ledger     " not in cli("status", ok=False).stdout


def test_read_where_the_inbox_cannot_be_written_prints_the_message_and_notes_it_stays_unread(cli):
    """`relay read --agent Ben ID` in a project Ben's inbox cannot be written in (immutable, as a
    read-only mount is): the message printed, exit 0, one line on stderr saying it stays unread."""
    import shutil
    cli("init", "--agent", "Ann", "--agent", "Ben")
    cli("send", "--from", "Ann", "--to", "Ben", "--subject", "plan", "the zebra plan")
    cli("run", "--once", "-q")
    [mid] = [d["id"] for d in json.loads(cli("audit", "--json").stdout)]
    held = [cli.state / "inbox" / "Ben" / "new", cli.state / "inbox" / "Ben" / "cur"]
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", *map(str, held)],
                                                        capture_output=True).returncode:
        subprocess.run(["chattr", "-i", *map(str, held)], capture_output=True)
        pytest.skip("cannot make the inbox immutable here (chattr +i)")
    try:
        r = cli("read", "--agent", "Ben", mid)
    finally:
        subprocess.run(["chattr", "-i", *map(str, held)], check=True)
    assert "the zebra plan" in r.stdout and "Traceback" not in r.output
    [note] = r.stderr.splitlines()
    assert note.startswith(f"relay: {mid} could not be marked read (") and note.endswith("it stays new")
    assert [p.name for p in (cli.state / "inbox" / "Ben" / "new").iterdir()] == [f"{mid}.json"]
