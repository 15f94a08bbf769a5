"""Hostile and malformed input: each gets the behaviour docs/contract.md gives, the relay keeps going, and nothing
is read or written outside the project root."""
import json
import os
import socket
import stat
import threading


from relay.ledger.ledger import Ledger


def reasons(relay):
    return {r["name"]: (r["status"], r["error"]) for r in relay.history.audit()}


def test_hostile_batch_never_stops_the_relay(project, tmp_path):
    """Every malformed message in one batch is quarantined with its reason; the good one goes."""
    relay = project.relay(max_body_bytes=1000)
    cases = {
        "empty": b"",
        "latin1": b"TO: Ben\n\ncaf\xe9",
        "huge": b"TO: Ben\n\n" + b"x" * 5000,
        "nobody": b"SUBJECT: hi\n\nno TO",
        "dotdot": b"TO: ../../etc\n\nx",
        "slash": b"TO: Ben/../../x\n\nx",
        "many.json": json.dumps({"to": [f"a{i}" for i in range(3000)], "body": "x"}).encode(),
        "trunc.json": b'{"to": "Ben", "body": "cut',
        "deep.json": b'{"to": "Ben", "body": "x", "n": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "wrongto.json": b'{"to": {"name": "Ben"}, "body": "x"}',
        "bigheader": b"TO: Ben\nX-Junk: " + b"j" * 3_000_000 + b"\n\nx",
        "cwd": b"KIND: spawn\nCWD: ../../outside\n\nstart",
        "good": b"TO: Ben\n\nfine",
    }
    for name, data in cases.items():
        project.drop("Ann", name, data)
    total = relay.drain()
    got = reasons(relay)
    assert got["good"][0] == "archived" and [e["body"] for e in project.inbox("Ben")] == ["fine"]
    assert total.failed == len(cases) - 1
    expect = {
        "empty": "empty", "latin1": "not UTF-8", "huge": "over max_body_bytes", "nobody": "no recipient",
        "dotdot": "invalid recipient name", "slash": "invalid recipient name",
        "many.json": "unknown recipient a0, a1", "trunc.json": "invalid JSON", "deep.json": "invalid JSON",
        "wrongto.json": "'to' must be a name or a list", "bigheader": "over max_body_bytes",
        "cwd": "outside the project root",
    }
    for name, fragment in expect.items():
        status, error = got[name]
        assert status == "failed" and fragment in error, (name, error)
        assert len(error) < 2000, f"{name}: the reason should stay readable"
    reports = list((project.state / "failed/Ann").glob("*.error.json"))
    assert len(reports) == len(expect)


def test_file_names_with_spaces_newlines_and_non_ascii(project):
    """Spaces and any UTF-8 are fine; a control character (newline, tab) would forge log lines
    and breaks tools, so such a name is quarantined with the name shown escaped."""
    relay = project.relay()
    names = ["with space", "ünïcødé-名前"]
    bad = ["new\nline", "tab\there", "del\x7fete", "c1\x85next"]
    for n in names + bad:
        project.drop("Ann", n, f"TO: Ben\n\n{n}")
    total = relay.drain()
    assert total.archived == 2 and total.failed == 4
    assert sorted(e["source"] for e in project.inbox("Ben")) == sorted(names)
    assert {p.name.split("--", 1)[1] for p in project.files("archive") if p.parent.name != "System"} == set(names)
    quarantined = {p.name.split("--", 1)[1] for p in project.files("failed") if not p.name.endswith(".json")}
    assert quarantined == {"new\\x0aline", "tab\\x09here", "del\\x7fete", "c1\\x85next"}
    errors = {r["name"]: r["error"] for r in relay.history.audit(status="failed")}
    assert "control characters" in errors["new\\x0aline"]


def test_symlink_to_a_file_inside_the_root_is_quarantined_too(project):
    relay = project.relay()
    inside = project.root / "note.txt"
    inside.write_text("TO: Ben\n\ninside")
    box = project.state / "outbox/Ann"
    os.symlink(inside, box / "link")
    relay.drain()
    assert "symbolic link" in reasons(relay)["link"][1]
    assert inside.read_text() == "TO: Ben\n\ninside"          # the target is left alone


def test_socket_and_device_files_never_opened(project):
    relay = project.relay()
    box = project.state / "outbox/Ann"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(box / "sock"))
    try:
        os.mknod(box / "dev", stat.S_IFCHR | 0o600, os.makedev(1, 3))
        has_dev = True
    except PermissionError:
        has_dev = False
    relay.drain()
    sock.close()
    got = reasons(relay)
    assert "a socket" in got["sock"][1]
    if has_dev:
        assert "a device file" in got["dev"][1]


def test_symlinked_agent_directory_outside_the_root_is_not_read(project, tmp_path_factory):
    relay = project.relay()
    outside = tmp_path_factory.mktemp("elsewhere")
    (outside / "m").write_text("TO: Ben\n\nfrom outside")
    os.symlink(outside, project.state / "outbox" / "Evil")
    assert relay.drain().registered == 0
    assert (outside / "m").exists() and project.inbox("Ben") == []


def test_symlinked_agent_directory_inside_the_root_is_not_followed(project):
    relay = project.relay()
    target = project.root / "agents" / "dee-outbox"
    target.mkdir(parents=True)
    os.symlink(target, project.state / "outbox" / "Dee")
    (target / "m").write_text("TO: Ben\n\nfrom Dee")
    os.utime(target / "m", (1_700_000_000, 1_700_000_000))
    assert relay.drain().registered == 0
    assert project.inbox("Ben") == [] and (target / "m").exists()
    assert "Dee" not in relay.known_agents(refresh=True)


def test_deleted_from_outbox_after_claim_is_still_delivered(project, monkeypatch):
    """Once claimed and read, the message is relay's: the agent deleting the outbox name before
    custody changes nothing (the bytes read are delivered and archived, from a private copy)."""
    relay = project.relay()
    path = project.drop("Ann", "m", "TO: Ben\n\nx")
    real = relay.inbox.deliver

    def agent_deletes(items, **k):
        path.unlink()                       # read already, not yet taken
        return real(items, **k)

    monkeypatch.setattr(relay.inbox, "deliver", agent_deletes)
    assert relay.drain().archived == 1
    [archived] = project.files("archive")
    assert archived.read_text() == "TO: Ben\n\nx" and [e["body"] for e in project.inbox("Ben")] == ["x"]
    assert [p for p in (project.state / "spool").rglob("*") if not p.is_dir()] == []


def test_archived_and_inbox_files_not_group_or_other_writable(project):
    relay = project.relay()
    path = project.drop("Ann", "m", "TO: Ben\n\nx")
    os.chmod(path, 0o666)
    relay.drain()
    [archived] = project.files("archive")
    assert stat.S_IMODE(os.stat(archived).st_mode) & 0o022 == 0
    [env] = (project.state / "inbox/Ben/new").iterdir()
    assert stat.S_IMODE(os.stat(env).st_mode) & 0o022 == 0


def test_envelopes_carry_no_paths_outside_the_project(project):
    relay = project.relay()
    project.drop("Ann", "spawn", "CWD: worktrees/dana\nNAME: Dana\n\nstart")
    relay.drain()
    [env] = project.inbox("System")
    assert env["cwd"] == "worktrees/dana" and env["source"] == "spawn"


def test_another_process_holding_the_write_lock_is_waited_for(project):
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nx")
    other = Ledger(project.state / "ledger.sqlite")
    other.db.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.3, lambda: other.db.execute("COMMIT"))
    release.start()
    try:
        assert relay.drain().archived == 1     # waited busy_timeout, no "database is locked"
    finally:
        release.join()
        other.close()


def test_a_row_this_build_cannot_read_is_reported_and_skipped(project, caplog):
    caplog.set_level("ERROR", logger="relay")
    relay = project.relay()
    relay.ledger.db.execute(
        "INSERT INTO messages (id, sender, name, status, discovered_at, retries) "
        "VALUES ('01CCCCCCCCCCCCCCCCCCCCCCCC', 'Ann', 'x', 'pending', 1, 'many')")
    project.drop("Ann", "m", "TO: Ben\n\ngood")
    total = relay.drain()
    assert total.archived == 1 and len(project.inbox("Ben")) == 1
    row = relay.history.get("01CCCCCCCCCCCCCCCCCCCCCCCC")
    assert row["status"] == "failed" and "column retries holds 'many'" in row["error"]
    assert "01CCCCCCCCCCCCCCCCCCCCCCCC" in caplog.text and "column retries" in caplog.text


def test_daemon_step_outlives_a_ledger_locked_too_long(project, monkeypatch):
    """A step of the daemon's loop that fails (here: the ledger locked past busy_timeout) is
    logged and waited out; what it had claimed is recovered and delivered by the next step."""
    import sqlite3

    relay = project.relay(agents=("Ann", "Ben"))
    relay.step_pause = 0.0
    project.drop("Ann", "m", "TO: Ben\n\nx")
    real = relay.ledger.messages.record
    calls = {"n": 0}

    def locked(*a, **k):
        calls["n"] += 1
        if calls["n"] == 1:
            raise sqlite3.OperationalError("database is locked")
        return real(*a, **k)

    monkeypatch.setattr(relay.ledger.messages, "record", locked)
    assert relay.guarded_step().archived == 0
    assert relay.history.counts()["processing"] == 0        # recovered
    relay.hint("rescan")
    assert relay.guarded_step().archived == 1
    assert len(project.inbox("Ben")) == 1
