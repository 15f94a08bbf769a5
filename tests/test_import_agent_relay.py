"""relay import agent-relay: a ledger made with agent-relay 2.0's own schema and statements
(agent_relay_ledger.py), with rows in every state, brought over into relay and delivered."""
import hashlib
import json
import os
import shutil
import sqlite3
import time

import agent_relay_ledger
import pytest
from conftest import error_line

from relay.files.layout import Layout
from relay.ledger.ledger import Ledger
from relay.operator.importer import import_agent_relay, message_id

COUNTS = agent_relay_ledger.COUNTS
PENDING = COUNTS["pending"] + COUNTS["processing"]
ARCHIVED = COUNTS["archived"] + COUNTS["delivered"]


@pytest.fixture
def old(tmp_path):
    """An agent-relay project beside the relay project (tmp_path is relay's root)."""
    return agent_relay_ledger.make(tmp_path / "old")


@pytest.fixture
def fresh(cli):
    cli("init")
    return cli


def rows(cli, sql, args=()):
    db = sqlite3.connect(cli.state / "ledger.sqlite")
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


def snapshot(cli):
    """Everything an import may change: the tables' rows and every file under .relay/."""
    tables = ("messages", "events", "chain", "agents", "imports", "deliveries", "search_docs", "agent_registry",
              "team_state")
    out = {t: rows(cli, f"SELECT * FROM {t} ORDER BY 1") for t in tables}
    out["files"] = agent_relay_ledger.fingerprint(cli.state)
    return out


def envelopes(cli):
    """id -> [recipient, ...] of every envelope in every inbox (new/ and cur/)."""
    out = {}
    for p in (cli.state / "inbox").glob("*/*/*.json"):
        out.setdefault(p.stem, []).append(p.parent.parent.name)
    return out


@pytest.mark.timeout_s(30)
def test_every_state_comes_over_once_and_the_source_is_untouched(fresh, old):
    before = agent_relay_ledger.fingerprint(old.root)
    doc = json.loads(fresh("import", "agent-relay", str(old.root.parent), "--json").stdout)
    assert agent_relay_ledger.fingerprint(old.root) == before      # not a byte, not an mtime, no -shm
    assert doc["ok"] and doc["problems"] == [] and doc["ledger"] == str(old.ledger)
    assert doc["imported"] == COUNTS and doc["skipped"] == {"already_imported": 0}
    assert doc["became"] == {"archived": ARCHIVED, "failed": COUNTS["failed"], "pending": PENDING}
    assert doc["agents"] == sorted(agent_relay_ledger.AGENTS)

    counts = dict(rows(fresh, "SELECT status, count(*) FROM messages GROUP BY status"))
    assert counts == {"archived": ARCHIVED, "failed": COUNTS["failed"], "pending": PENDING}
    # every record marked imported, naming the source and its id there; one imports row each
    imported = rows(fresh, "SELECT message_id, detail FROM events WHERE event = 'imported' AND message_id IS NOT NULL")
    assert len(imported) == sum(COUNTS.values())
    by_source = dict(rows(fresh, "SELECT source_id, message_id FROM imports WHERE source = 'agent-relay'"))
    details = dict(imported)
    for status, ids in old.ids.items():
        for fid in ids:
            detail = details[by_source[fid]]
            assert str(old.ledger) in detail and fid in detail and f"{status} there" in detail
    # archived and delivered: their bytes in relay's archive, as agent-relay recorded them
    for fid in old.ids["archived"] + old.ids["delivered"]:
        (status, path, sha, recipients, body), = rows(
            fresh, "SELECT status, archive_path, sha256, recipients, body FROM messages WHERE id = ?", (by_source[fid],))
        data = (fresh.state / path).read_bytes()
        assert status == "archived" and data == old.bodies[fid] and sha == hashlib.sha256(data).hexdigest()
        assert json.loads(recipients) == [old.recipients[fid]] and body.startswith(("archived body", "delivered body"))
    # failed: quarantined with the reason agent-relay gave, ready for `relay retry`
    for fid in old.ids["failed"]:
        (path, error), = rows(fresh, "SELECT failed_path, error FROM messages WHERE id = ?", (by_source[fid],))
        assert (fresh.state / path).read_bytes() == old.bodies[fid] and error.startswith("ENOENT")
        assert json.loads((fresh.state / f"{path}.error.json").read_bytes())["reason"] == error
    # the agents, with agent-relay's first and last seen
    assert [r[0] for r in rows(fresh, "SELECT name FROM agents ORDER BY name")] == sorted(agent_relay_ledger.AGENTS)
    assert json.loads(fresh("verify", "--json").stdout)["ok"]

    # relay delivers the pending and processing ones, each once; nothing archived goes out again
    fresh("run", "--once", "-q")
    got = envelopes(fresh)
    assert sorted(got) == sorted(by_source[f] for f in old.ids["pending"] + old.ids["processing"])
    for fid in old.ids["pending"] + old.ids["processing"]:
        assert got[by_source[fid]] == [old.recipients[fid]]
    counts = dict(rows(fresh, "SELECT status, count(*) FROM messages GROUP BY status"))
    assert counts == {"archived": ARCHIVED + PENDING, "failed": COUNTS["failed"]}
    fresh("run", "--once", "-q")
    assert envelopes(fresh) == got

    # run again, the import changes nothing: rows, events, files
    state = snapshot(fresh)
    again = json.loads(fresh("import", "agent-relay", str(old.root), "--json").stdout)
    assert again["skipped"] == {"already_imported": sum(COUNTS.values())} and again["agents"] == []
    assert set(again["imported"].values()) == {0} and again["ok"]
    assert snapshot(fresh) == state
    fresh("run", "--once", "-q")
    assert envelopes(fresh) == got
    assert agent_relay_ledger.fingerprint(old.root) == before
    verify = fresh("verify", "--json")
    assert json.loads(verify.stdout)["ok"], verify.stdout
    assert "no problems" in fresh("doctor").output


def test_the_ids_and_paths_each_run_gives_are_the_same(fresh, old):
    fid, = old.ids["archived"][:1]
    mid = message_id(fid, rows_of(old, "SELECT discovered_at FROM relay_files WHERE file_id = ?", (fid,))[0][0])
    fresh("import", "agent-relay", str(old.ledger))
    (path,), = rows(fresh, "SELECT archive_path FROM messages WHERE id = ?", (mid,))
    assert path.startswith("archive/") and path.endswith(f"/Alice/{mid}--msg")
    # the text summary: a line per state there, and what it became here
    out = fresh("import", "agent-relay", str(old.ledger), "--dry-run").output
    assert "pending" in out and "-> pending (relay delivers them)" in out and "skipped (imported before): 340" in out


def rows_of(made, sql, args=()):
    db = sqlite3.connect(f"file:{made.ledger}?mode=ro", uri=True)
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


def test_a_missing_or_altered_archive_file_is_named_not_imported_as_good(fresh, old):
    gone, altered = old.ids["archived"][3], old.ids["archived"][4]
    (gone_path, gone_agent), (altered_path, altered_agent) = (
        rows_of(old, "SELECT archive_path, agent_name FROM relay_files WHERE file_id = ?", (f,))[0]
        for f in (gone, altered))
    os.unlink(gone_path)
    with open(altered_path, "ab") as f:
        f.write(b"tampered\n")
    stray = old.root / "outbox" / "Bob" / "written-while-agent-relay-was-down"
    stray.write_text("TO: Alice\n\nhello\n")
    r = fresh("import", "agent-relay", str(old.root), "--json", ok=False)
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and not doc["ok"] and doc["imported"]["archived"] == COUNTS["archived"] - 2
    problems = "\n".join(doc["problems"])
    assert f"{gone} (archived, {gone_agent}/msg): archive file {gone_path} is missing" in problems
    assert f"{altered} (archived, {altered_agent}/msg): archive file {altered_path} does not match" in problems
    assert f"{stray}: a file agent-relay never recorded" in problems
    assert json.loads(fresh("verify", "--json").stdout)["ok"]
    # named again by every run until it is dealt with; the rest is not imported twice
    doc = json.loads(fresh("import", "agent-relay", str(old.root), "--json", ok=False).stdout)
    assert len(doc["problems"]) == 3 and doc["skipped"]["already_imported"] == sum(COUNTS.values()) - 2
    stray.unlink()
    doc = json.loads(fresh("import", "agent-relay", str(old.root), "--json", "--accept-missing").stdout)
    assert doc["ok"] and doc["imported"]["archived"] == 2 and doc["without_file"] == 2
    for fid in (gone, altered):
        (status, path, error), = rows(fresh, "SELECT m.status, m.archive_path, m.error FROM messages m JOIN imports i "
                                             "ON i.message_id = m.id WHERE i.source_id = ?", (fid,))
        assert status == "archived" and path is None and error.startswith("imported without its original")
    assert json.loads(fresh("verify", "--json").stdout)["ok"]


def test_dry_run_writes_nothing(fresh, old):
    before = snapshot(fresh)
    doc = json.loads(fresh("import", "agent-relay", str(old.root), "--dry-run", "--json").stdout)
    assert doc["dry_run"] and doc["imported"] == COUNTS and doc["ok"]
    assert doc["agents"] == sorted(agent_relay_ledger.AGENTS) and doc["state"]["note"] is None
    after = snapshot(fresh)
    assert after == before and after["messages"] == [] and after["imports"] == []


@pytest.mark.parametrize("case", ["missing", "empty dir", "not sqlite", "relay's own ledger", "newer schema",
                                  "columns missing", "relay's state dir", "no project"])
def test_bad_sources_are_one_clear_line(fresh, old, tmp_path, case):
    path, expect = old.root, None
    if case == "missing":
        path, expect = tmp_path / "nowhere", "nowhere: no such file or directory"
    elif case == "empty dir":
        path = tmp_path / "empty"
        path.mkdir()
        expect = "no agent-relay ledger in"
    elif case == "not sqlite":
        path = tmp_path / "notes.txt"
        path.write_text("not a database\n" * 100)
        expect = "is not an agent-relay ledger that relay can read"
    elif case == "relay's own ledger":
        path, expect = tmp_path / "relay.sqlite", "is not an agent-relay ledger: it has no table relay_files"
        shutil.copy(fresh.state / "ledger.sqlite", path)
    elif case == "newer schema":
        db = sqlite3.connect(old.ledger)
        db.execute("INSERT INTO __migrations (name, applied_at, checksum) VALUES ('0003_future', 0, '0')")
        db.commit()
        db.close()
        expect = "has agent-relay schema migration 0003_future, newer than this relay knows"
    elif case == "columns missing":
        db = sqlite3.connect(old.ledger)
        db.execute("ALTER TABLE relay_files DROP COLUMN content_hash")
        db.commit()
        db.close()
        expect = "agent-relay's table relay_files has no column content_hash"
    elif case == "relay's state dir":
        shutil.copytree(old.root / "meta", fresh.state / "meta")
        path, expect = fresh.state, "is relay's own state directory"
    elif case == "no project":
        shutil.rmtree(fresh.state)
        expect = "run `relay init`"
    before = snapshot_or_none(fresh)
    r = fresh("import", "agent-relay", str(path), ok=False)
    assert r.exit_code == 1 and expect in error_line(r), r.output
    assert snapshot_or_none(fresh) == before


def snapshot_or_none(cli):
    return snapshot(cli) if (cli.state / "ledger.sqlite").exists() else None


def test_orchestrator_state_comes_over_into_team_state(fresh, old):
    fresh("state", "set", "lead", "Bob")          # a key set here already stays as it is
    doc = json.loads(fresh("import", "agent-relay", str(old.root), "--json").stdout)
    assert doc["state"] == {"imported": ["plan/next", "round"], "skipped": 1, "note": None}
    got = rows(fresh, "SELECT key, value, version, updated_by FROM team_state ORDER BY key")
    assert [g[:3] for g in got] == [("lead", "Bob", 1), ("plan/next", "review", 1), ("round", '{"n": 3}', 1)]
    assert got[1][3].startswith("operator:")
    assert len(rows(fresh, "SELECT 1 FROM events WHERE event = 'imported' AND detail LIKE 'team state key=%'")) == 2
    assert json.loads(fresh("state", "get", "round", "--json").stdout)["value"] == '{"n": 3}'
    doc = json.loads(fresh("import", "agent-relay", str(old.root), "--json").stdout)
    assert doc["state"] == {"imported": [], "skipped": 3, "note": None}


class Interrupted(Exception):
    pass


def test_an_import_interrupted_before_its_records_delivers_nothing_twice(fresh, old, monkeypatch):
    """Stopped after its files were written, before the transaction that records them: relay's
    recovery delivers the pending ones from the spool (under the ids the import gave them) and
    leaves the archive copies alone (they have their hidden names); the import run again
    records everything and sends nothing twice."""
    def stop(*args, **kwargs):
        raise Interrupted()
    monkeypatch.setattr(Ledger, "record_imports", stop)
    layout = Layout(fresh.root, fresh.state)
    with Ledger(layout.ledger) as led, pytest.raises(Interrupted):
        import_agent_relay(led, layout, old.root, now=time.time())
    monkeypatch.undo()
    staged = list((fresh.state / "archive").rglob(".*.import"))
    assert len(staged) == ARCHIVED
    fresh("run", "--once", "-q")
    got = envelopes(fresh)
    assert len(got) == PENDING and all(len(r) == 1 for r in got.values())     # from the spool, once each
    doc = json.loads(fresh("import", "agent-relay", str(old.root), "--json").stdout)
    assert doc["ok"] and doc["became"]["pending"] == PENDING
    assert not list((fresh.state / "archive").rglob(".*.import"))
    fresh("run", "--once", "-q")
    assert envelopes(fresh) == got
    counts = dict(rows(fresh, "SELECT status, count(*) FROM messages GROUP BY status"))
    assert counts == {"archived": ARCHIVED + PENDING, "failed": COUNTS["failed"]}
    assert json.loads(fresh("verify", "--json").stdout)["ok"]
    assert "no problems" in fresh("doctor").output


def test_a_ledger_agent_relay_holds_open_is_read_whole_and_left_as_it_is(fresh, old):
    """agent-relay's last commits may still be in its write-ahead log: they come over too, and
    nothing beside the ledger is touched (SQLite's reader makes no -shm there)."""
    db = sqlite3.connect(old.ledger, isolation_level=None)
    db.execute("PRAGMA wal_autocheckpoint = 0")
    db.execute("UPDATE relay_files SET error = 'late' WHERE file_id = ?", (old.ids["failed"][0],))
    try:
        assert (old.ledger.parent / "ledger.sqlite-wal").stat().st_size > 0
        before = agent_relay_ledger.fingerprint(old.root)
        fresh("import", "agent-relay", str(old.root))
        assert agent_relay_ledger.fingerprint(old.root) == before
    finally:
        db.close()
    assert rows(fresh, "SELECT m.error FROM messages m JOIN imports i ON i.message_id = m.id WHERE i.source_id = ?",
                (old.ids["failed"][0],)) == [("late",)]


def test_history_past_retention_is_swept_like_relays_own_and_never_comes_back(fresh, tmp_path):
    """Imported records keep their times: the retention sweep takes those older than `retention`
    (7 days here), leaving its checkpoint of the chain; an import run again brings none back."""
    month_ago = agent_relay_ledger.make(tmp_path / "older", now_ms=int((time.time() - 30 * 86400) * 1000))
    fresh("import", "agent-relay", str(month_ago.root))
    fresh("sweep")
    counts = dict(rows(fresh, "SELECT status, count(*) FROM messages GROUP BY status"))
    # delivered ones were archived by the import (now); failed and archived ones are a month old
    assert counts == {"archived": COUNTS["delivered"], "pending": PENDING}
    assert not list((fresh.state / "failed").rglob("*")) and rows(fresh, "SELECT count(*) FROM checkpoints") == [(1,)]
    again = json.loads(fresh("import", "agent-relay", str(month_ago.root), "--json").stdout)
    assert again["skipped"] == {"already_imported": sum(COUNTS.values())} and set(again["imported"].values()) == {0}
    assert dict(rows(fresh, "SELECT status, count(*) FROM messages GROUP BY status")) == counts
    assert json.loads(fresh("verify", "--json").stdout)["ok"]


def test_agents_come_into_the_registry_with_their_status_and_metadata(fresh, old):
    fresh.state.joinpath("outbox", "Bob").mkdir(parents=True)      # relay's own word on Bob: released here
    fresh.state.joinpath("outbox", "Bob", "release.json").write_text('{"kind": "release", "name": "Bob"}')
    fresh.state.joinpath("inbox", "Bob", "new").mkdir(parents=True)
    fresh("run", "--once")
    doc = json.loads(fresh("import", "agent-relay", str(old.root), "--json").stdout)
    assert doc["registry"] == ["Alice", "Carol", "Lead"]               # Bob's row is relay's: left as it is
    agents = {a["agent"]: a for a in json.loads(fresh("agents", "--json").stdout)}
    assert agents["Carol"]["state"] == "inactive" and agents["Alice"]["state"] == "active"
    assert agents["Alice"]["metadata"] == {"cli": "claude", "imported_from": "agent-relay"}
    assert agents["Bob"]["state"] == "inactive" and agents["Bob"]["released_by"] == "Bob"
    active = [a["agent"] for a in json.loads(fresh("agents", "--active", "--json").stdout)]
    assert "Carol" not in active and "Alice" in active
    assert len(rows(fresh, "SELECT 1 FROM events WHERE event = 'imported' AND detail LIKE 'agent % (%'")) == 3
    again = json.loads(fresh("import", "agent-relay", str(old.root), "--json").stdout)
    assert again["registry"] == []


@pytest.mark.parametrize("name", ["system", "SYSTEM", "sYsTeM", "System", "broadcast", "BROADCAST", "Broadcast"])
def test_an_agent_relay_agent_named_as_relay_keeps_for_itself_is_not_imported_as_an_agent(fresh, old, name):
    """Carol, renamed in agent-relay's ledger to a reserved name in some case: her records are
    problems, she is no agent, her name no directory; agent-relay's Lead is an agent as any."""
    db = sqlite3.connect(old.ledger)
    db.execute("UPDATE relay_files SET agent_name = ? WHERE agent_name = 'Carol'", (name,))
    db.execute("UPDATE agents SET agent_name = ? WHERE agent_name = 'Carol'", (name,))
    db.commit()
    db.close()
    r = fresh("import", "agent-relay", str(old.root), "--json", ok=False)
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and doc["problems"]
    assert all(f", {name}/" in p and "keeps for itself" in p for p in doc["problems"])
    assert doc["registry"] == ["Alice", "Bob", "Lead"]
    assert not {name.lower()} & {p.name.lower() for p in (fresh.state / "outbox").iterdir()}
    assert rows(fresh, "SELECT count(*) FROM agents WHERE lower(name) = lower(?)", (name,)) == [(0,)]
    assert rows(fresh, "SELECT count(*) FROM messages WHERE lower(sender) = lower(?)", (name,)) == [(0,)]
