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


def _fed_doc(**parts):
    doc = {"node": "n1", "team": "crew", "url": "redis://127.0.0.1:6379/0",
           "link": {"connected": True, "since": 1_700_000_000.0, "error": None},
           "server": {"reachable": True, "error": None, "incoming": 3},
           "outbound": {"pending": 0, "published": 0, "acknowledged": 0, "refused": 0, "oldest_pending_at": None,
                        "by_node": {}},
           "directory": {"error": None, "read_at": None}, "received": {"delivered": 0, "refused": 0},
           "conflicts": [], "ack_warn": 30.0}
    for k, v in parts.items():
        doc[k] = {**doc[k], **v} if isinstance(doc.get(k), dict) else v
    return doc


def test_status_says_the_links_state_connected_disconnected_not_yet_or_no_daemon():
    from relay.core.message import iso
    from relay.operator.views import federation
    since = iso(1_700_000_000.0)

    def link(doc, running=True):
        return federation(doc, running, 1_700_000_100.0).splitlines()[1]
    assert federation(_fed_doc(), True, 0).splitlines()[0] == \
        "federation node n1 of team crew at redis://127.0.0.1:6379/0"
    assert link(_fed_doc()) == f"  link       connected since {since}"
    assert link(_fed_doc(), running=False) == "  link       daemon not running"
    assert link(_fed_doc(link={"connected": None})) == "  link       not connected yet"
    assert link(_fed_doc(link={"connected": False, "error": "refused"})) == \
        f"  link       DISCONNECTED since {since} (refused)"
    assert link(_fed_doc(link={"connected": True, "error": "slow"})) == f"  link       connected since {since} (slow)"


def test_status_says_the_directory_and_the_server_each_way_they_can_stand():
    from relay.operator.views import federation
    now = 1_700_000_100.0

    def lines(**parts):
        return federation(_fed_doc(**parts), True, now).splitlines()
    assert not any(ln.startswith("  directory") for ln in lines())          # never read: no line
    assert "  directory  read 2.5s ago" in lines(directory={"read_at": now - 2.5})
    assert "  directory  read 0.0s ago" in lines(directory={"read_at": now + 5})      # a clock behind: never negative
    assert ("  directory  CANNOT BE READ: gone; names this node does not know wait"
            in lines(directory={"error": "gone", "read_at": now - 1}))
    assert "  server     reachable; 3 entries wait to be read by this node" in lines()
    assert "  server     reachable; 0 entries wait to be read by this node" in lines(server={"incoming": None})
    assert "  server     reachable, but: NOAUTH" in lines(server={"error": "NOAUTH"})
    assert "  server     unreachable: Connection refused" in lines(server={"reachable": False,
                                                                           "error": "Connection refused"})
    assert ("  server     not asked from here: no URL in this environment (the daemon's holds it)"
            in lines(server={"asked": False, "reachable": False, "error": "x"}))


def test_status_says_each_nodes_unacknowledged_rows_and_warns_only_past_ack_timeout():
    from relay.operator.views import federation
    now = 1_700_000_100.0

    def lines(by_node, **out):
        return federation(_fed_doc(outbound={"by_node": by_node, **out}), True, now).splitlines()
    assert ("  outbound   2 waiting to be published, oldest 7.5s, 1 waiting for their node's acknowledgement, "
            "4 acknowledged, 5 refused") in lines({}, pending=2, published=1, acknowledged=4, refused=5,
                                                  oldest_pending_at=now - 7.5)
    assert ("  outbound   0 waiting to be published, 0 waiting for their node's acknowledgement, 0 acknowledged, "
            "0 refused") in lines({})
    at_edge = lines({"n2": {"waiting": 1, "oldest_at": now - 40, "unacked_since": now - 30.0},
                     "n3": {"waiting": 2, "oldest_at": None, "unacked_since": now - 30.5},
                     "n4": {"waiting": 3, "oldest_at": now - 1, "unacked_since": None}})
    assert f"    {'n2':<20} 1 unacknowledged, oldest 40.0s" in at_edge
    assert f"    {'n3':<20} 2 unacknowledged, oldest 0.0s  NOT ACKNOWLEDGING for 30s (ack_timeout 30s)" in at_edge
    assert f"    {'n4':<20} 3 unacknowledged, oldest 1.0s" in at_edge
    doc = _fed_doc(outbound={"by_node": {"n2": {"waiting": 1, "oldest_at": now - 40, "unacked_since": now - 31}}})
    assert f"    {'n2':<20} 1 unacknowledged, oldest 40.0s  NOT ACKNOWLEDGING for 31s (ack_timeout 30s)" in \
        federation(doc, True, now).splitlines()
    doc["ack_warn"] = 60.0
    assert f"    {'n2':<20} 1 unacknowledged, oldest 40.0s" in federation(doc, True, now).splitlines()


def test_status_names_this_nodes_conflicts_and_other_nodes_ones_apart():
    from relay.operator.views import federation
    text = federation(_fed_doc(conflicts=[("Ann", "n2")], others_conflicts=[("Bob", "n3")],
                               received={"delivered": 7, "refused": 1}), True, 0)
    assert text.splitlines()[-3:] == [
        "  received   7 delivered, 1 refused",
        "  CONFLICT   agent Ann is also listed by node n2: rename one of them",
        "  conflict   agent Bob (another node's) is also listed by node n3"]
    assert "conflict" not in federation(_fed_doc(), True, 0).lower()


def test_verify_names_an_envelope_altered_in_new_or_in_cur_and_neither_one_deleted_nor_one_intact(relayed):
    """Each delivered envelope still in its inbox is re-hashed, in new/ or once read in cur/
    (under its Maildir name); one the agent deleted is no problem; a directory in its place
    cannot be read, and says so."""
    cli = relayed
    rows = [r for r in json.loads(cli("audit", "--json", "--status", "archived").output) if r["kind"] != "bounce"]
    a, b, c = (r["id"] for r in rows)
    new = cli.state / "inbox/Ben/new"
    sizes = {m: (new / f"{m}.json").stat().st_size for m in (a, b, c)}
    with (new / f"{a}.json").open("ab") as f:
        f.write(b" ")
    os.rename(new / f"{b}.json", cli.state / "inbox/Ben/cur" / f"{b}.json:2,S")
    with (cli.state / "inbox/Ben/cur" / f"{b}.json:2,S").open("ab") as f:
        f.write(b"  ")
    (new / f"{c}.json").unlink()
    r = cli("verify", ok=False)
    assert r.exit_code == 1
    assert (f"{a}: inbox/Ben/new/{a}.json is not the envelope relay delivered ({sizes[a] + 1} bytes, expected "
            f"{sizes[a]}); `relay retry` cannot help, restore it from the archive") in r.output
    assert (f"{b}: inbox/Ben/cur/{b}.json:2,S is not the envelope relay delivered ({sizes[b] + 2} bytes, expected "
            f"{sizes[b]}); `relay retry` cannot help, restore it from the archive") in r.output
    assert c not in r.output
    (new / f"{c}.json").mkdir()
    r = cli("verify", ok=False)
    assert f"{c}: cannot read inbox/Ben/new/{c}.json: Is a directory" in r.output


def test_doctor_names_a_missing_quarantined_file_a_stray_spool_file_and_an_old_orphan_not_a_young_one(relayed):
    cli = relayed
    assert "doctor: no problems" in cli("doctor").output
    [failed] = ids(cli, "--status", "failed")
    quarantined = next((cli.state / "failed" / "Ann").glob(f"{failed}--bad"))
    quarantined.unlink()
    stray = "01M95MNQH6F8RCGWYDRQHFBBC0--lost"
    (cli.state / "spool" / "Ann").mkdir(parents=True, exist_ok=True)
    (cli.state / "spool" / "Ann" / stray).write_text("TO: Ben\n\nlost")
    tmp = cli.state / "inbox/Ben/tmp"
    now = time.time()
    for name, age in (("old", 86400 + 600), ("young", 86400 - 600)):
        (tmp / name).write_text("half")
        os.utime(tmp / name, (now - age, now - age))
    r = cli("doctor", ok=False)
    assert r.exit_code == 1
    assert f"{failed}: quarantined file failed/Ann/{failed}--bad is missing; `relay expire` or ignore" in r.output
    assert (f"spool/Ann/{stray}: a spooled file with no pending message; `relay run` registers it again, or move it "
            "into an outbox to send it") in r.output
    assert "inbox/Ben/tmp/old: orphaned temporary file; `relay run` removes it" in r.output
    assert "young" not in r.output


def test_doctor_quick_names_an_archived_file_missing_without_rehashing_the_others(relayed):
    cli = relayed
    rows = [r for r in json.loads(cli("audit", "--json", "--status", "archived").output) if r["kind"] != "bounce"]
    (cli.state / rows[0]["archive_path"]).unlink()
    forged = cli.state / rows[1]["archive_path"]
    forged.write_bytes(forged.read_bytes() + b"forged")
    r = cli("doctor", "--quick", ok=False)
    assert r.exit_code == 1
    assert (f"{rows[0]['id']}: archived file {rows[0]['archive_path']} is missing; `relay verify` for detail"
            in r.output)
    assert rows[1]["id"] not in r.output            # a changed byte is verify's to find, not --quick's


def test_retry_of_a_failed_message_whose_file_is_gone_says_to_write_it_again(relayed):
    cli = relayed
    [failed] = ids(cli, "--status", "failed")
    error = json.loads(cli("show", failed, "--json").output)["error"]
    next((cli.state / "failed" / "Ann").glob(f"{failed}--bad")).unlink()
    r = cli("retry", failed, ok=False)
    assert r.exit_code == 1
    assert f"{failed}: its file is gone ({error}); write the message again" in r.output
    assert status(cli, failed) == "failed"


def test_doctor_lists_20_unreadable_rows_and_counts_the_rest_in_one_line(cli):
    for i in range(21):
        drop(cli, "Ann", f"m{i:02d}", f"TO: Ben\n\nbody {i}")
    cli("run", "--once", "-q")
    mids = sorted(ids(cli))
    assert len(mids) == 21
    led = db(cli)
    for mid in mids[:20]:
        led.execute("UPDATE messages SET subject = X'00ff' WHERE id = ?", (mid,))
    r = cli("doctor", "--quick", ok=False)
    assert sum(mid in r.output for mid in mids) == 20 and "more ledger row(s)" not in r.output
    assert json.loads(cli("doctor", "--quick", "--json", ok=False).output)["unreadable"] == 20
    led.execute("UPDATE messages SET subject = X'00ff' WHERE id = ?", (mids[20],))
    led.close()
    r = cli("doctor", "--quick", ok=False)
    assert r.exit_code == 1
    assert sum(mid in r.output for mid in mids) == 20
    assert "... and 1 more ledger row(s) this relay cannot read (`relay verify` lists them all)" in r.output
    assert json.loads(cli("doctor", "--quick", "--json", ok=False).output)["unreadable"] == 21


@pytest.mark.parametrize("raw, to", [(None, []), ("", []), ("[]", []), ('["Bob", "Cy"]', ["Bob", "Cy"]),
                                     ('"Bob"', ["Bob"]), ("[1, null]", ["1", "None"]),
                                     ("Bob, Cy", ["(unreadable: 'Bob, Cy')"]),
                                     (b"\xff", ["(unreadable: b'\\xff')"])])
def test_a_rows_recipients_are_its_json_list_and_one_no_json_reads_is_shown_marked(raw, to):
    from relay.operator.views import recipients
    assert recipients({"recipients": raw}) == to


@pytest.mark.parametrize("raw, shown", [(None, {}), ("", {}), ('{"X-Tag": "a"}', {"X-Tag": "a"}),
                                        ('["x"]', {"(unreadable)": '["x"]'}), ("{oops", {"(unreadable)": "{oops"}),
                                        (7, {"(unreadable)": "7"})])
def test_a_rows_unknown_headers_are_its_json_object_and_anything_else_is_shown_marked(raw, shown):
    from relay.operator.views import headers
    assert headers({"headers": raw}) == shown


def test_a_short_time_in_a_table_is_month_day_and_seconds_utc_and_one_no_number_is_marked():
    from relay.operator.views import short_time
    assert short_time(None) == ""
    assert short_time(1_700_000_000) == "11-14 22:13:20"
    assert short_time(0.0) == "01-01 00:00:00"
    assert short_time("later") == "(unreadable: 'later')"


def test_a_remote_copys_state_is_said_for_each_status_with_its_node_time_entry_and_error():
    from relay.core.message import iso
    from relay.operator.views import remote_state
    base = {"node": "n2", "acked_at": 1_700_000_000.0, "published_at": 1_700_000_001.0, "ack_deadline": 1_700_000_031.0,
            "entry_id": "17-0", "attempts": 3, "error": None}
    at, pub, due = iso(1_700_000_000.0), iso(1_700_000_001.0), iso(1_700_000_031.0)
    assert remote_state({**base, "status": "acknowledged"}) == f"acknowledged by node n2 {at} (published as entry 17-0)"
    assert remote_state({**base, "status": "acknowledged", "entry_id": None}) == f"acknowledged by node n2 {at}"
    assert remote_state({**base, "status": "refused", "error": "no agent Bob"}) == \
        f"refused by node n2 {at}: no agent Bob"
    assert remote_state({**base, "status": "refused"}) == f"refused by node n2 {at}: "
    assert remote_state({**base, "status": "published"}) == (
        f"published {pub} as entry 17-0, waiting for node n2 to acknowledge it (published again after {due})")
    assert remote_state({**base, "status": "pending"}) == "waiting for the server (attempt 3): not tried yet"
    assert remote_state({**base, "status": "pending", "error": "Connection refused"}) == \
        "waiting for the server (attempt 3): Connection refused"


def test_doctor_says_a_ledger_not_in_wal_mode_needs_a_run_and_the_run_sets_it(relayed):
    cli = relayed
    led = db(cli)
    assert led.execute("PRAGMA journal_mode = DELETE").fetchone() == ("delete",)
    led.close()
    r = cli("doctor", ok=False)
    assert r.exit_code == 1 and "the ledger is not in WAL mode; start `relay run` once to set it" in r.output
    cli("run", "--once", "-q")
    assert "WAL" not in cli("doctor").output


def test_verify_takes_an_inbox_without_cur_as_holding_no_read_envelope(relayed):
    cli = relayed
    import shutil
    for p in (cli.state / "inbox/Ben/new").iterdir():
        p.unlink()
    shutil.rmtree(cli.state / "inbox/Ben/cur")
    r = cli("verify")
    assert "verified 4 archived message(s): ok" in r.output


def test_a_stored_value_json_holds_is_kept_as_it_is_and_a_blob_is_shown_marked():
    from relay.operator.views import value
    assert value(None) is None
    assert [value(v) for v in ("s", "", 0, 7, 1.5)] == ["s", "", 0, 7, 1.5]
    assert value(b"\x00\xff") == "(unreadable: b'\\x00\\xff')"
    assert value(b"x" * 100) == "(unreadable: b'" + "x" * 58 + ")"


def test_a_records_content_type_is_the_one_sent_or_text_plain_when_none_was(cli):
    plain = cli("send", "--from", "Ann", "--to", "Ben", "hello").stdout.split()[0]
    marked = cli("send", "--from", "Ann", "--to", "Ben", "--content-type", "text/markdown", "# hi").stdout.split()[0]
    cli("run", "--once", "-q")
    got = {r["id"]: r["content_type"] for r in json.loads(cli("audit", "--json").output)}
    assert got == {plain: "text/plain", marked: "text/markdown"}
    assert json.loads(cli("show", plain, "--json").output)["content_type"] == "text/plain"


def test_an_excerpt_is_the_subject_else_the_body_on_one_line_else_the_error_clipped_at_exactly_its_width():
    from relay.operator.views import clip, excerpt

    def row(subject=None, body=None, error=None):
        return {"subject": subject, "body": body, "error": error}
    assert excerpt(row("subj", "body", "err"), 20) == "subj"
    assert excerpt(row(None, "  two\nlines \n", "err"), 20) == "two lines"
    assert excerpt(row("", "body"), 20) == "body"
    assert excerpt(row(None, "  \n", "the error"), 20) == "the error"
    assert excerpt(row(None, b"\x00blob", "the error"), 20) == "the error"
    assert excerpt(row(), 20) == ""
    assert clip("abcde", 5) == "abcde"
    assert clip("abcdef", 5) == "abcd…"
    assert clip("ab", 0) == "…"
    assert clip("a\x1bb", 10) == "a\\eb"


def test_the_audit_table_names_recipients_on_other_nodes_with_their_node_and_a_remote_sender_with_its():
    from relay.operator.views import route, table
    row = {"id": "01M95MNQH6F8RCGWYDRQHFBBC0", "sender": "Ann", "node": None, "recipients": '["Bob", "Cy"]',
           "discovered_at": 1_700_000_000.0, "kind": "message", "thread": "t", "duplicate_of": None,
           "status": "archived", "subject": "hello", "body": "b", "error": None}
    assert route(row) == "Ann → Bob,Cy"
    assert route(row, {"Bob": "n2"}) == "Ann → Bob@n2,Cy"
    assert route({**row, "node": "n3", "recipients": None}) == "Ann@n3 → ?"
    lines = table([row], width=120, remote={row["id"]: {"Bob": "n2"}}).splitlines()
    assert lines[0].split() == ["ID", "TIME", "(UTC)", "FROM", "→", "TO", "KIND", "THREAD", "STATUS", "SUBJECT", "/",
                                "BODY"]
    assert lines[1].split() == [row["id"], "11-14", "22:13:20", "Ann", "→", "Bob@n2,Cy", "message", "t", "archived",
                                "hello"]
    assert "Ann → Bob,Cy " in table([row], width=120) and "Bob,Cy" in table([row], width=120, remote={})
    assert table([{**row, "duplicate_of": "X"}], width=120).splitlines()[1].split()[-2:] == ["duplicate", "hello"]


def test_a_shed_records_numbers_read_as_people_write_them_and_a_blob_as_its_repr():
    from relay.operator.views import num, shed
    assert num(600.0) == 600 and isinstance(num(600.0), int)
    assert num(2.5) == 2.5 and num(7) == 7 and num(None) is None and num("lots") == "lots"
    assert num(b"\x00" * 50) == repr(b"\x00" * 50)[:80]
    assert num(True) is True
    got = shed({"recipient": "Bob", "reason": "queue_full", "limit_value": 100.0, "observed": 101.0,
                "at": 1_700_000_000.0, "released_at": None})
    assert got["limit"] == 100 and got["observed"] == 101 and got["released_at"] is None
    assert got["at"].startswith("2023-11-14T22:13:20")


def test_the_audit_table_shows_no_thread_as_blank_not_none():
    from relay.operator.views import table
    row = {"id": "01M95MNQH6F8RCGWYDRQHFBBC0", "sender": "Ann", "node": None, "recipients": '["Bob"]',
           "discovered_at": 1_700_000_000.0, "kind": None, "thread": None, "duplicate_of": None,
           "status": "archived", "subject": "hello", "body": "b", "error": None}
    line = table([row], width=120).splitlines()[1]
    assert "None" not in line and line.split() == [row["id"], "11-14", "22:13:20", "Ann", "→", "Bob", "archived",
                                                   "hello"]


def test_an_agents_registry_lines_say_its_spawn_or_import_its_task_and_its_release():
    from relay.operator.views import registered
    assert registered({}) == [] and registered({"metadata": None, "spawned_at": None}) == []
    assert registered({"spawned_at": "T1", "metadata": None}) == ["registered at T1"]
    assert registered({"spawned_at": "T1", "spawned_by": "Ann", "metadata": {"cli": "claude", "model": "",
                                                                               "cwd": "/w", "task": " fix\n the  bug "}}) \
        == ["spawned by Ann at T1: cli=claude  cwd=/w", "task: fix the bug"]
    assert registered({"spawned_at": "T1", "metadata": {"imported_from": "agent-relay /old"},
                       "released_at": "T2", "released_by": "Bob"}) == [
        "imported from agent-relay /old, known there since T1", "released by Bob at T2"]


def test_show_prints_a_duplicate_as_such_and_leaves_out_fields_that_hold_nothing():
    from relay.operator.views import show
    row = {"id": "01M95MNQH6F8RCGWYDRQHFBBC0", "sender": "Ann", "node": None, "recipients": '["Bob"]',
           "discovered_at": 1_700_000_000.0, "delivered_at": None, "archived_at": None, "failed_at": None,
           "sent_at": None, "kind": "message", "thread": "", "duplicate_of": None, "status": "pending",
           "subject": "hello", "body": "b", "error": None, "retries": 0, "max_retries": None, "name": "m",
           "archive_path": None, "failed_path": None, "sha256": None, "size": None, "request_id": "r1",
           "entry_id": None, "content_type": None}
    text = show(row, [], [], {}, "b")
    lines = text.splitlines()
    assert lines[0] == "message 01M95MNQH6F8RCGWYDRQHFBBC0"
    assert "  status         pending" in lines and "  retries        0" in lines
    assert not any(ln.split()[0] in ("thread", "error", "sha256", "max_retries") for ln in lines[1:] if ln.strip())
    dup = show({**row, "duplicate_of": "01M95MNQH6F8RCGWYDRQHFBBC1"}, [], [], {}, None).splitlines()
    assert ("  status         pending: a duplicate of 01M95MNQH6F8RCGWYDRQHFBBC1 (request id 'r1'), not delivered "
            "again") in dup
    assert "  duplicate_of   01M95MNQH6F8RCGWYDRQHFBBC1" in dup and dup[-1] == "  (not recorded)"


def test_show_prints_each_shed_with_its_limit_only_when_it_has_one_and_an_events_actor_unless_relay():
    from relay.core.message import iso
    from relay.operator.views import show
    row = {"id": "01M95MNQH6F8RCGWYDRQHFBBC0", "sender": "Ann", "node": None, "recipients": '["Bob", "Cy"]',
           "discovered_at": 1_700_000_000.0, "delivered_at": None, "archived_at": None, "failed_at": None,
           "sent_at": None, "kind": "message", "thread": None, "duplicate_of": None, "status": "archived",
           "subject": "s", "body": "b", "error": None, "retries": 0, "max_retries": None, "name": "m",
           "archive_path": None, "failed_path": None, "sha256": None, "size": None, "request_id": None,
           "entry_id": None, "content_type": None}
    sheds = [{"recipient": "Bob", "reason": "queue_full", "limit": 100.0, "observed": 101.0, "at": "T1",
              "released_at": None},
             {"recipient": "Cy", "reason": "muted", "limit": None, "observed": None, "at": "T2", "released_at": "T3"}]
    events = [{"at": 1_700_000_000.0, "event": "found", "actor": "relay", "detail": None},
              {"at": 1_700_000_001.0, "event": "expired", "actor": "operator:kim", "detail": "by hand"}]
    deliveries = [{"recipient": "Bob", "delivered_at": 1_700_000_002.0},
                  {"recipient": "Cy", "delivered_at": 1_700_000_003.0}]
    lines = show(row, deliveries, events, {"Bob": "inbox/Bob/cur/x.json:2,S"}, "b", sheds=sheds).splitlines()
    assert f"  {'Bob':<20} {iso(1_700_000_002.0)}  inbox/Bob/cur/x.json:2,S" in lines
    assert f"  {'Cy':<20} {iso(1_700_000_003.0)}  (taken from the inbox)" in lines
    assert f"  {'Bob':<20} queue_full, limit 100, observed 101  at T1" in lines
    assert f"  {'Cy':<20} muted  at T2; released by relay retry at T3" in lines
    assert f"  {iso(1_700_000_000.0)}  {'found':<10}" in lines
    assert f"  {iso(1_700_000_001.0)}  {'expired':<10} [operator:kim]  by hand" in lines
    assert lines[-2:] == ["body:", "b"]


def test_a_message_printed_whole_says_its_state_in_words_and_only_the_fields_that_differ_from_the_usual():
    import types

    from relay.operator.views import message_text

    def m(**k):
        base = dict(id="01M95MNQH6F8RCGWYDRQHFBBC0", state="new", error=None, sender="Ann", to=["Bob", "Cy"],
                    thread=None, subject=None, kind="message", content_type="text/plain", sent_at="T", body="hi\r\nthere\n\n")
        return types.SimpleNamespace(**{**base, **k})
    assert message_text(m(), 2, 3).splitlines() == [
        "--- message 2 of 3: 01M95MNQH6F8RCGWYDRQHFBBC0 (unread) ---", "from:    Ann", "to:      Bob, Cy",
        "sent:    T", "id:      01M95MNQH6F8RCGWYDRQHFBBC0", "", "hi", "there"]
    text = message_text(m(state="cur", kind="ping", content_type="text/markdown", thread="t", subject="s"))
    assert text.splitlines()[0] == "--- message 1 of 1: 01M95MNQH6F8RCGWYDRQHFBBC0 (read) ---"
    assert "kind:    ping" in text and "type:    text/markdown" in text and "thread:  t" in text
    assert "subject: s" in text
    assert message_text(m(state="archived")).splitlines()[0].endswith("(archived) ---")
    assert message_text(m(), state="cur").splitlines()[0].endswith("(read) ---")
    assert message_text(m(error="cannot read it")).splitlines() == [
        "--- message 1 of 1: 01M95MNQH6F8RCGWYDRQHFBBC0 (unread) ---", "error:   cannot read it"]


@pytest.mark.parametrize("rows, said", [([(0, 0), (1, -1)], "row 2 missing from index junk_ix"),
                                        ([(0, 0), (1, -1), (2, -2)], "row 2 missing from index junk_ix (and 1 more)")])
def test_doctor_names_the_first_finding_of_a_failed_integrity_check_and_counts_the_rest(relayed, rows, said):
    """An index that no longer matches its table (its definition rewritten): the ledger is said
    damaged, with SQLite's first finding, the others counted, and how to recover."""
    cli = relayed
    led = db(cli)
    led.execute("CREATE TABLE junk (a, b)")
    led.execute("CREATE INDEX junk_ix ON junk(a)")
    led.executemany("INSERT INTO junk VALUES (?, ?)", rows)     # row 1: a == b, in the index either way
    led.execute("PRAGMA writable_schema = ON")
    led.execute("UPDATE sqlite_master SET sql = 'CREATE INDEX junk_ix ON junk(b)' WHERE name = 'junk_ix'")
    led.close()
    r = cli("doctor", "--quick", ok=False)
    assert r.exit_code == 1
    assert (f"the ledger {cli.state / 'ledger.sqlite'} is damaged (integrity check: {said}); the archive and "
            "inboxes are intact.") in r.output


def test_doctor_knows_a_shed_report_by_its_recorded_sheds_and_names_one_whose_message_has_none(cli):
    (cli.state / "relay.toml").write_text('agents = ["Ann", "Ben", "Cy"]\npair_rate = 1\n')
    drop(cli, "Ann", "one", "TO: Ben\n\none")
    drop(cli, "Ann", "two", "TO: Ben, Cy\n\ntwo")          # shed for Ben, delivered to Cy: a report
    os.utime(cli.state / "outbox/Ann/two", (1_700_000_001, 1_700_000_001))      # sent after "one"
    cli("run", "--once", "-q")
    [report] = list((cli.state / "failed").rglob("*.shed.json"))
    assert "doctor: no problems" in cli("doctor").output
    stray = report.with_name("01M95MNQH6F8RCGWYDRQHFBBC0--x.shed.json")
    stray.write_bytes(report.read_bytes())
    r = cli("doctor", ok=False)
    assert r.exit_code == 1
    assert (f"{stray.relative_to(cli.state)}: a file no ledger record knows; move it away or delete it"
            in r.output)
    assert str(report.relative_to(cli.state)) not in r.output


def test_the_headline_counts_delivered_whether_archived_yet_or_not_and_each_other_state_once():
    from relay.operator.views import headline
    counts = {"pending": 1, "processing": 2, "delivered": 4, "archived": 8, "failed": 16}
    assert headline(counts) == {"delivered": 12, "on_the_way": 3, "failed": 16}
    assert headline({"delivered": 5}) == {"delivered": 5, "on_the_way": 0, "failed": 0}
    assert headline({}) == {"delivered": 0, "on_the_way": 0, "failed": 0}


def test_the_audit_tables_excerpt_takes_the_width_left_by_the_columns_at_least_16_and_the_terminals_when_none_given(
        monkeypatch):
    from relay.operator.views import table
    row = {"id": "01M95MNQH6F8RCGWYDRQHFBBC0", "sender": "Ann", "node": None, "recipients": '["Bob"]',
           "discovered_at": 1_700_000_000.0, "kind": "message", "thread": "t", "duplicate_of": None,
           "status": "archived", "subject": "x" * 60, "body": "b", "error": None}
    # the columns: 26 + 14 + 9 ("FROM → TO") + 7 + 6 + 8 = 70, and 2 spaces after each of the 6: 82
    assert table([row], width=100).splitlines()[1].split()[-1] == "x" * 17 + "…"
    assert table([row], width=142).splitlines()[1].split()[-1] == "x" * 60
    assert table([row], width=141).splitlines()[1].split()[-1] == "x" * 58 + "…"
    assert table([row], width=90).splitlines()[1].split()[-1] == "x" * 15 + "…"
    monkeypatch.setenv("COLUMNS", "110")
    assert table([row]).splitlines()[1].split()[-1] == "x" * 27 + "…"


def test_a_body_for_the_terminal_keeps_its_lines_drops_trailing_blank_ones_and_none_is_empty():
    from relay.operator.views import body_text
    assert body_text(None) == ""
    assert body_text("") == ""
    assert body_text("a\r\nb\n\n") == "a\nb"
    assert body_text("one\n\x1b[31mtwo\n  ") == "one\n\\e[31mtwo\n  "


def test_doctor_names_an_unreadable_directory_and_a_link_down_only_when_each_is_so():
    from types import SimpleNamespace

    from relay.cli.inspect import federation_problems
    fed = SimpleNamespace(url=None)
    directory = ("federation: the team's directory cannot be read: no such key; messages to names this node does "
                 "not know wait, then fail")
    down = "federation: the link to the server is down: connection refused"
    for link, said in (
            (None, []),
            ({"directory_error": None, "connected": True, "error": None}, []),
            ({"directory_error": None, "connected": True, "error": "connection refused"}, []),   # up again
            ({"directory_error": None, "connected": False, "error": None}, []),     # not connected yet
            ({"directory_error": None, "connected": False, "error": "connection refused"}, [down]),
            ({"directory_error": "no such key", "connected": True, "error": None}, [directory]),
            ({"directory_error": "no such key", "connected": False, "error": "connection refused"}, [directory, down])):
        assert federation_problems(fed, link) == said, link
    said = federation_problems(SimpleNamespace(url="redis://h:6379/0?ssl_cert_reqs=Optional"), None)
    assert len(said) == 1 and said[0].startswith("ssl_cert_reqs=Optional in the federation url: the server's TLS")
    assert federation_problems(SimpleNamespace(url="redis://h:6379/0?ssl_cert_reqs=required"), None) == []


def test_tail_says_from_whom_a_messages_event_is_and_by_whom_an_operators_event_without_a_message_is(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    mid = cli("send", "--from", "Ann", "--to", "Ben", "hi").stdout.strip()
    cli("run", "--once", "-q")
    cli("archive-agent", "Ben")
    pinged = cli("ping", "Ann").stdout.split("inbox/Ann/new/", 1)[1].split(".json", 1)[0]
    events = [json.loads(line) for line in cli("tail", "-n", "50", "--json").stdout.splitlines()]
    lines = cli("tail", "-n", "50").stdout.splitlines()
    assert len(lines) == len(events) == 6
    when = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z  "
    assert re.fullmatch(when + f"{mid}  discovered from Ann: outbox/Ann/msg-{mid.lower()}", lines[0])
    assert re.fullmatch(when + f"{mid}  claimed    from Ann", lines[1])
    assert re.fullmatch(when + f"{mid}  delivered  from Ann: Ben", lines[2])
    assert re.fullmatch(when + r"-                           agent-archived by operator\S*: Ben", lines[4])
    assert re.fullmatch(when + f"{pinged}  ping      : inbox/Ann/new/{pinged}.json", lines[5])   # no sender, an id
    assert events[4]["id"] is None and events[4]["actor"].startswith("operator") and events[4]["from"] is None
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)
    assert cli("tail", "-n", "0").stdout == ""
    assert [json.loads(x)["seq"] for x in cli("tail", "-n", "1", "--json").stdout.splitlines()] == [events[-1]["seq"]]


def test_verify_names_an_archive_file_it_cannot_read_with_the_reason_apart_from_one_that_is_missing(relayed):
    cli = relayed
    a, b, c = [r for r in json.loads(cli("audit", "--json", "--status", "archived").output) if r["kind"] != "bounce"]
    path = cli.state / a["archive_path"]
    path.unlink()
    path.mkdir()                # a directory where the archive file was: there, but no file to read
    r = cli("verify", ok=False)
    assert r.exit_code == 1
    assert f"{a['id']}: archive file {a['archive_path']} cannot be read: Is a directory" in r.output
    assert f"{a['id']}: archive file {a['archive_path']} is missing" not in r.output
    assert b["id"] not in r.output and c["id"] not in r.output


def test_the_agents_table_counts_reservations_marking_exclusive_ones_and_clips_the_last_error_to_60(relayed):
    relayed("reserve", "--agent", "Ben", "src", "--exclusive")
    relayed("reserve", "--agent", "Ben", "docs")
    relayed("reserve", "--agent", "Ann", "notes")
    rows = {line.split()[0]: line for line in relayed("agents").stdout.splitlines()[1:] if line[:1].isupper()
            and not line.startswith("STATE:")}
    assert re.match(r"Ben +active +0 +3 +0 +0 +3 +0/0 +2 \(1x\)  ", rows["Ben"])
    assert re.match(r"Ann +active +0 +1 +0 +4 +1 +0/0 +1  ", rows["Ann"])
    assert re.match(r"System +active +0 +0 +0 +1 +0 +0/0 +-  ", rows["System"])
    error = json.loads(relayed("agents", "Ann", "--json").stdout)["last_error"]
    assert len(error) > 60 and rows["Ann"].endswith(" " + error[:59] + "…")
    assert rows["Ben"].endswith(" ")          # no error: nothing after the last column


def test_tail_names_no_actor_for_relays_own_event_without_a_message(cli):
    from relay.ledger.ledger import Ledger
    cli("init", "--agent", "Ann")
    with Ledger(cli.state / "ledger.sqlite") as led:
        with led.transaction():
            led.events([(None, 1_800_000_000.0, "swept", "3 entries"),
                        (None, 1_800_000_001.0, "noted", "by hand", "operator:root")])
    lines = cli("tail", "-n", "2").stdout.splitlines()
    assert lines == ["2027-01-15T08:00:00.000000Z  -                           swept     : 3 entries",
                     "2027-01-15T08:00:01.000000Z  -                           noted      by operator:root: by hand"]
