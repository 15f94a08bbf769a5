"""The seed items under hostile input: agent-relay ledgers planted with devices, forged paths and
times no clock gives; two imports at once; team state values past the limit; MAX-RETRIES past
any budget; ledger rows holding times out of every calendar."""
import hashlib
import json
import os
import sqlite3
import threading

import agent_relay_ledger
import pytest
from conftest import error_line

SMALL = {"archived": 2, "delivered": 1, "failed": 1, "processing": 1, "pending": 2}


@pytest.fixture
def old(tmp_path):
    return agent_relay_ledger.make(tmp_path / "old", counts=SMALL)


@pytest.fixture
def fresh(cli):
    cli("init")
    return cli


def add_record(made, file_id, agent, name, status, data, source, archive=None, discovered_ms=1_700_000_000_000,
               processed_ms=None):
    db = sqlite3.connect(made.ledger, isolation_level=None)
    try:
        db.execute("INSERT INTO relay_files (file_id, source_path, archive_path, agent_name, message_type, status, "
                   "discovered_at, processed_at, archived_at, file_size, content_hash) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                   (file_id, str(source), archive and str(archive), agent, name, status, discovered_ms,
                    processed_ms, processed_ms, len(data), hashlib.sha256(data).hexdigest()[:16]))
    finally:
        db.close()


@pytest.mark.timeout_s(20)
def test_a_wal_beside_the_ledger_that_is_a_device_or_fifo_is_refused_not_read_for_ever(fresh, old):
    wal = old.ledger.with_name(old.ledger.name + "-wal")
    wal.symlink_to("/dev/zero")
    r = fresh("import", "agent-relay", str(old.root), ok=False)
    assert r.exit_code == 1 and "not a regular file" in error_line(r)
    wal.unlink()
    os.mkfifo(wal)
    r = fresh("import", "agent-relay", str(old.root), ok=False)
    assert r.exit_code == 1 and "not a regular file" in error_line(r)


def test_a_ledger_named_as_a_device_is_refused(fresh):
    r = fresh("import", "agent-relay", "/dev/zero", ok=False)
    assert r.exit_code == 1 and "not a regular file" in error_line(r)


def test_two_imports_at_once_both_succeed_and_bring_each_record_over_once(fresh, old):
    from click.testing import CliRunner

    from relay.cli import main
    results = []

    def one():
        r = CliRunner().invoke(main, ["--root", str(fresh.root), "import", "agent-relay", str(old.root)])
        results.append(r)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.exit_code for r in results] == [0, 0], [r.output for r in results]
    fresh("run", "--once")
    pending = SMALL["pending"] + SMALL["processing"]
    assert sum(1 for _ in (fresh.state / "inbox").glob("*/new/*.json")) == pending
    fresh("verify")


def test_a_record_naming_another_agents_outbox_file_is_not_imported_as_its_own(fresh, old):
    """agent-relay's file of a record lies at outbox/<its agent>/<its name>: a record of Alice
    whose recorded path is Bob's file would deliver Bob's words as Alice's."""
    secret = b"TO: Carol\n\nBob's own words\n"
    (old.root / "outbox" / "Bob").mkdir(parents=True, exist_ok=True)
    (old.root / "outbox" / "Bob" / "secret").write_bytes(secret)
    add_record(old, "abcdefabcdef", "Alice", "innocent", "pending", secret, old.root / "outbox" / "Bob" / "secret")
    r = fresh("import", "agent-relay", str(old.root), ok=False)
    fresh("run", "--once")
    for p in (fresh.state / "inbox" / "Carol" / "new").glob("*.json"):
        env = json.loads(p.read_bytes())
        assert not (env["from"] == "Alice" and "Bob's own words" in env["body"]), env
    assert "abcdefabcdef" in r.output


@pytest.mark.parametrize("ms", [99_999_999_999_999_999, 1e308])
def test_a_record_dated_past_any_calendar_breaks_no_verb(fresh, old, ms):
    data = b"TO: Bob\n\nlate\n"
    (old.root / "outbox" / "Alice" / "late").write_bytes(data)
    add_record(old, "fedcbafedcba", "Alice", "late", "pending", data, old.root / "outbox" / "Alice" / "late",
               discovered_ms=ms)
    fresh("import", "agent-relay", str(old.root), ok=False)
    for verb in (("audit",), ("agents",), ("report", "--html", str(fresh.root / "r.html")), ("status", "--json")):
        r = fresh(*verb, ok=False)
        assert r.exit_code in (0, 1, 3), r.output
        assert "Traceback" not in r.output


@pytest.mark.parametrize("column", ["discovered_at", "delivered_at"])
def test_a_ledger_row_with_a_time_no_calendar_holds_is_named_not_a_traceback(fresh, column):
    fresh("init", "--agent", "Ann", "--agent", "Ben")
    fresh("send", "--from", "Ann", "--to", "Ben", "hello")
    fresh("run", "--once")
    db = sqlite3.connect(fresh.state / "ledger.sqlite")
    db.execute(f"UPDATE messages SET {column} = 1e300")
    db.commit()
    db.close()
    for verb in (("audit",), ("agents",), ("report", "--html", str(fresh.root / "r.html")), ("doctor", "--quick")):
        r = fresh(*verb, ok=False)
        assert "Traceback" not in r.output
        if verb[0] != "agents":
            assert column in r.output, r.output


def test_orchestrator_state_over_the_team_state_limit_is_not_imported(fresh, old):
    db = sqlite3.connect(old.ledger, isolation_level=None)
    db.execute("INSERT INTO orchestrator_state (key, value, updated_at) VALUES ('huge', ?, 1)", ("x" * (1 << 20),))
    db.close()
    r = fresh("import", "agent-relay", str(old.root))
    assert "huge" in r.output
    got = fresh("state", "get", "huge", ok=False)
    assert got.exit_code == 1
    fresh("state", "get", "lead")


@pytest.mark.parametrize("value, budget", [("10000000000", 3), ("99999999999999999999999", 3)])
def test_a_max_retries_larger_than_any_budget_counts_as_the_configured_one(project, value, budget):
    r = project.relay()
    project.drop("Ann", "m", f"TO: Ben\nMAX-RETRIES: {value}\n\nhi\n")
    r.drain()
    assert len(project.inbox("Ben")) == 1


@pytest.mark.parametrize("value", ["1_0", "\u0663"])
def test_max_retries_is_written_in_ascii_digits(project, value):
    r = project.relay()
    project.drop("Ann", "m", f"TO: Ben\nMAX-RETRIES: {value}\n\nhi\n")
    r.drain()
    assert project.inbox("Ben") == []
    assert len(list((project.state / "failed" / "Ann").glob("*.error.json"))) == 1
