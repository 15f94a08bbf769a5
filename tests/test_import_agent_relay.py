"""relay import agent-relay: a ledger made with agent-relay 2.0's own schema and statements
(agent_relay_ledger.py), with rows in every state, brought over into relay and delivered; and
under hostile input: a WAL or ledger that is a device, a record naming another agent's file or
dated past any calendar, team state past its limit, two imports at once."""
import hashlib
import json
import os
import shutil
import sqlite3
import tempfile
import threading
import time

import agent_relay_ledger
import pytest
from conftest import error_line

from relay import names
from relay.core.message import iso
from relay.errors import RelayError
from relay.files.layout import Layout
from relay.ledger import agent_relay
from relay.ledger.ledger import Ledger
from relay.ledger.imports import Imports
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
        expect = "notes.txt is not an SQLite database (its first bytes are not SQLite's header"
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
    monkeypatch.setattr(Imports, "record", stop)
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
    db = sqlite3.connect(f"file:{old.ledger}?mode=ro", uri=True)
    try:
        created = dict(db.execute("SELECT agent_name, created_at FROM agents"))
    finally:
        db.close()
    for name in ("Alice", "Carol", "Lead"):          # each spawned when agent-relay first saw it
        assert agents[name]["spawned_at"] == iso(created[name] / 1000), name
    active = [a["agent"] for a in json.loads(fresh("agents", "--active", "--json").stdout)]
    assert "Carol" not in active and "Alice" in active
    assert len(rows(fresh, "SELECT 1 FROM events WHERE event = 'imported' AND detail LIKE 'agent % (%'")) == 3
    again = json.loads(fresh("import", "agent-relay", str(old.root), "--json").stdout)
    assert again["registry"] == []


# -- one outbox file, one message -------------------------------------------------------------

def test_two_records_of_one_outbox_file_are_one_message_delivered_once(fresh, project, tmp_path):
    """A crash of agent-relay leaves a file with two records, one processing, one pending: it
    comes over as one message; the second record is recorded as a duplicate of the first (its
    own id in its `imported` event) and is never delivered."""
    made = agent_relay_ledger.make(tmp_path / "old", counts=dict.fromkeys(COUNTS, 0))
    d = agent_relay_ledger.Driver(made.root, int(time.time() * 1000))
    first = d.register("Alice", "work", agent_relay_ledger.message("Bob", 1))
    d.claim(first)
    second = d.rediscover(first)
    d.close()
    doc = json.loads(fresh("import", "agent-relay", str(made.root), "--json").stdout)
    assert doc["ok"] and doc["imported"]["processing"] == 1 and doc["imported"]["pending"] == 1
    assert doc["became"]["pending"] == 1 and doc["duplicates"] == 1
    imported = dict(rows(fresh, "SELECT source_id, message_id FROM imports"))
    assert imported[first] == imported[second]
    details = [d for (d,) in rows(fresh, "SELECT detail FROM events WHERE event = 'imported' AND message_id = ?",
                                  (imported[first],))]
    assert len(details) == 2 and any(second in d and "duplicate" in d and first in d for d in details)
    assert rows(fresh, "SELECT count(*) FROM messages") == [(1,)]
    r = project.relay(agents=agent_relay_ledger.AGENTS)
    r.drain()
    r.drain()
    assert envelopes(fresh) == {imported[first]: ["Bob"]}
    # run again: nothing changes, nothing goes out again
    again = json.loads(fresh("import", "agent-relay", str(made.root), "--json").stdout)
    assert again["skipped"] == {"already_imported": 2} and again["duplicates"] == 0
    r.drain()
    assert envelopes(fresh) == {imported[first]: ["Bob"]}


@pytest.mark.parametrize("twin", ["pending", "processing"])
def test_a_record_on_the_way_of_a_file_delivered_there_is_its_duplicate_never_delivered_again(
        fresh, project, tmp_path, twin):
    """agent-relay delivered a file (its archive move never happened) and a restarted watcher
    registered it again: the later record (same path, same hash) is a duplicate of the
    delivered one, and the delivered one is no problem ("holds a later message")."""
    made = agent_relay_ledger.make(tmp_path / "old", counts=dict.fromkeys(COUNTS, 0))
    d = agent_relay_ledger.Driver(made.root, int(time.time() * 1000))
    first = d.register("Alice", "dup2", agent_relay_ledger.message("Bob", 2))
    d.claim(first)
    d.delivered(first)
    second = d.rediscover(first)
    if twin == "processing":
        d.claim(second)
    d.close()
    doc = json.loads(fresh("import", "agent-relay", str(made.root), "--json").stdout)
    assert doc["ok"] and not doc["problems"], doc["problems"]
    assert doc["imported"]["delivered"] == 1 and doc["imported"][twin] == 1 and doc["duplicates"] == 1
    imported = dict(rows(fresh, "SELECT source_id, message_id FROM imports"))
    assert imported[first] == imported[second]
    details = [d for (d,) in rows(fresh, "SELECT detail FROM events WHERE event = 'imported' AND message_id = ?",
                                  (imported[first],))]
    assert any(second in d and "duplicate" in d and first in d for d in details), details
    assert rows(fresh, "SELECT status, count(*) FROM messages GROUP BY status") == [("archived", 1)]
    r = project.relay(agents=agent_relay_ledger.AGENTS)
    r.drain()
    r.drain()
    assert envelopes(fresh) == {}           # delivered there: nothing goes out again here
    assert json.loads(fresh("import", "agent-relay", str(made.root), "--json").stdout)["skipped"] == \
        {"already_imported": 2}


def test_a_record_on_the_way_listed_before_the_delivered_record_of_its_file_is_still_its_duplicate(
        fresh, project, tmp_path):
    """The record on the way of a delivered file comes first in agent-relay's row order (a
    ledger whose row ids do not follow the watcher's order): it is still the delivered one's
    duplicate, not a problem, and nothing goes out again."""
    made = agent_relay_ledger.make(tmp_path / "old", counts=dict.fromkeys(COUNTS, 0))
    d = agent_relay_ledger.Driver(made.root, int(time.time() * 1000))
    first = d.register("Alice", "dup3", agent_relay_ledger.message("Bob", 3))
    d.claim(first)
    d.delivered(first)
    second = d.rediscover(first)
    d.db.execute("UPDATE relay_files SET id = -id WHERE file_id = ?", (second,))     # listed first
    d.close()
    doc = json.loads(fresh("import", "agent-relay", str(made.root), "--json").stdout)
    assert doc["ok"] and not doc["problems"], doc["problems"]
    assert doc["imported"]["delivered"] == 1 and doc["imported"]["pending"] == 1 and doc["duplicates"] == 1
    imported = dict(rows(fresh, "SELECT source_id, message_id FROM imports"))
    assert imported[first] == imported[second]
    assert rows(fresh, "SELECT status, count(*) FROM messages GROUP BY status") == [("archived", 1)]
    r = project.relay(agents=agent_relay_ledger.AGENTS)
    r.drain()
    assert envelopes(fresh) == {}


# -- what the file is, before it is copied ----------------------------------------------------

def sparse(path, head=b""):
    """A 2 GiB file holding nothing but `head` (its blocks: a few KiB)."""
    with open(path, "wb") as f:
        f.write(head)
    os.truncate(path, 2 << 30)
    return path


def test_a_2_gib_sparse_file_that_is_no_sqlite_database_is_refused_before_anything_is_copied(
        fresh, tmp_path, monkeypatch):
    """The file's first bytes are read before any copy is made: the temporary directory the
    copy would go into is never even made (tempfile.tempdir names one that is not there)."""
    big = sparse(tmp_path / "ledger.sqlite", b"not a database\n")
    nowhere = tmp_path / "no-temp-dir"
    monkeypatch.setattr(tempfile, "tempdir", str(nowhere))
    r = fresh("import", "agent-relay", str(big), ok=False)
    assert r.exit_code == 1 and "is not an SQLite database" in error_line(r), r.output
    assert not nowhere.exists()


def test_the_copy_of_a_sparse_ledger_is_bounded_by_the_blocks_it_holds(tmp_path):
    """A file with SQLite's header and 2 GiB of holes: only its data is copied (the copy keeps
    the holes), so the copy takes the blocks the source holds, not 2 GB."""
    head = b"SQLite format 3\x00" + bytes(84)
    big = sparse(tmp_path / "ledger.sqlite", head)
    into = tmp_path / "copy"
    into.mkdir()
    copy = agent_relay.snapshot(str(big), str(into))
    st = os.stat(copy)
    assert st.st_size == 2 << 30 and st.st_blocks * 512 <= max(big.stat().st_blocks * 512, 1 << 20)
    with open(copy, "rb") as f:
        assert f.read(100) == head


def test_a_copy_the_disk_has_no_room_for_is_refused_before_it_starts(old, tmp_path):
    into = tmp_path / "copy"
    into.mkdir()
    need = old.ledger.stat().st_size
    with pytest.raises(RelayError) as e:
        agent_relay.snapshot(str(old.ledger), str(into), free_space=lambda d: need // 2)
    assert f"has {need // 2} bytes free" in str(e.value) and str(into) in str(e.value)
    assert list(into.iterdir()) == []


def test_a_ledger_whose_wal_grows_while_it_is_copied_is_refused(fresh, old):
    """agent-relay still running: it commits between the look at the files and their copy (the
    free-space probe is the moment it is given); the import is refused and writes nothing."""
    db = sqlite3.connect(old.ledger, isolation_level=None)
    db.execute("PRAGMA wal_autocheckpoint = 0")
    db.execute("UPDATE relay_files SET error = 'first' WHERE file_id = ?", (old.ids["failed"][0],))
    wal = old.ledger.parent / "ledger.sqlite-wal"

    def agent_relay_commits(d):
        before = wal.stat().st_size
        db.execute("INSERT INTO orchestrator_state (key, value, updated_at) VALUES ('late', 'x', 1)")
        assert wal.stat().st_size > before
        return 1 << 40
    try:
        with pytest.raises(RelayError) as e:
            agent_relay.AgentRelayLedger(old.ledger, free_space=agent_relay_commits)
    finally:
        db.close()
    assert "changed while it was read: agent-relay is still running" in str(e.value)


# -- what an import reads: hashes, whose file -------------------------------------------------

def test_a_hash_agent_relay_recorded_in_capitals_still_matches(fresh, old):
    db = sqlite3.connect(old.ledger)
    db.execute("UPDATE relay_files SET content_hash = upper(content_hash)")
    db.commit()
    db.close()
    doc = json.loads(fresh("import", "agent-relay", str(old.root), "--json").stdout)
    assert doc["ok"] and doc["imported"] == COUNTS and doc["without_file"] == 0


def test_a_record_naming_another_agents_file_does_not_bring_it_over_as_its_own(fresh, old):
    """Bob's records point at Alice's files (an archive file; a file in her outbox, under its
    own name): Bob's archived record is a problem, his pending one comes over failed with
    nothing to deliver; Alice's words never go out as Bob's, and her own record of that file
    still delivers it, once, as hers."""
    db = sqlite3.connect(old.ledger)
    alice_archived, = db.execute("SELECT archive_path FROM relay_files WHERE agent_name = 'Alice' AND "
                                 "status = 'archived' LIMIT 1").fetchone()
    alice_pending, = db.execute("SELECT source_path FROM relay_files WHERE agent_name = 'Alice' AND "
                                "status = 'pending' LIMIT 1").fetchone()
    bob_archived, = db.execute("SELECT file_id FROM relay_files WHERE agent_name = 'Bob' AND status = 'archived' "
                               "LIMIT 1").fetchone()
    bob_pending, bob_file = db.execute("SELECT file_id, source_path FROM relay_files WHERE agent_name = 'Bob' "
                                       "AND status = 'pending' LIMIT 1").fetchone()
    os.unlink(bob_file)
    db.execute("UPDATE relay_files SET archive_path = ? WHERE file_id = ?", (alice_archived, bob_archived))
    db.execute("UPDATE relay_files SET source_path = ?, message_type = ? WHERE file_id = ?",
               (alice_pending, os.path.basename(alice_pending), bob_pending))      # her file's name too
    db.commit()
    db.close()
    r = fresh("import", "agent-relay", str(old.root), "--json", ok=False)
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and len(doc["problems"]) == 1
    assert doc["problems"][0].startswith(f"{bob_archived} (archived, Bob/msg): archive file {alice_archived} is "
                                         "not where agent-relay keeps its files")
    (status, error), = rows(fresh, "SELECT m.status, m.error FROM messages m JOIN imports i ON i.message_id = m.id "
                                   "WHERE i.source_id = ?", (bob_pending,))
    assert status == "failed" and "is not where agent-relay keeps its files" in error
    fresh("run", "--once", "-q")
    alice_body = old.bodies[rows_of(old, "SELECT file_id FROM relay_files WHERE source_path = ? AND agent_name = "
                                         "'Alice'", (alice_pending,))[0][0]]
    sent = [json.loads(p.read_bytes()) for p in (fresh.state / "inbox").glob("*/*/*.json")]
    assert [e["from"] for e in sent if e["body"] == alice_body.decode().partition("\n\n")[2]] == ["Alice"]


# -- where agent-relay keeps its ledger -------------------------------------------------------

def test_the_daemons_file_ledger_is_found_in_the_project_and_the_summary_says_which(fresh, tmp_path):
    made = agent_relay_ledger.make(tmp_path / "old", name=agent_relay_ledger.DAEMON)
    out = fresh("import", "agent-relay", str(made.root.parent)).output
    found = [ln for ln in out.splitlines() if ln.startswith("ledger found:")]
    assert found == [f"ledger found: {made.ledger} (agent-relay daemon's meta/file-ledger.sqlite, in "
                     f"{made.root.parent}/.agent-relay)"]
    assert rows(fresh, "SELECT count(*) FROM imports") == [(sum(COUNTS.values()),)]


def test_of_two_ledgers_in_one_place_the_daemons_is_taken_and_the_other_named(fresh, tmp_path):
    made = agent_relay_ledger.make(tmp_path / "old", name=agent_relay_ledger.DAEMON)
    shutil.copy(made.ledger, made.ledger.parent / "ledger.sqlite")
    doc = json.loads(fresh("import", "agent-relay", str(made.root), "--dry-run", "--json").stdout)
    assert doc["ledger"] == str(made.ledger)
    assert doc["found"].endswith(f"also found: {made.ledger.parent / 'ledger.sqlite'} (give it as PATH to import it)")


@pytest.mark.parametrize("place", ["project", "AGENT_RELAY_DATA_DIR", "XDG_DATA_HOME", "HOME"])
@pytest.mark.parametrize("name", [agent_relay_ledger.DAEMON, agent_relay_ledger.WATCHDOG])
def test_without_a_path_the_ledger_is_found_where_agent_relay_keeps_it(fresh, tmp_path, monkeypatch, place, name):
    home, xdg, data = tmp_path / "home", tmp_path / "xdg", tmp_path / "data"
    for var, where in (("HOME", home), ("XDG_DATA_HOME", xdg), ("AGENT_RELAY_DATA_DIR", data)):
        monkeypatch.setenv(var, str(where))
    if place != "AGENT_RELAY_DATA_DIR":
        monkeypatch.delenv("AGENT_RELAY_DATA_DIR")
    if place != "XDG_DATA_HOME":
        monkeypatch.delenv("XDG_DATA_HOME")
    where, top = {"project": (tmp_path, ".agent-relay"), "AGENT_RELAY_DATA_DIR": (tmp_path, "data"),
                  "XDG_DATA_HOME": (xdg, "agent-relay"), "HOME": (home, ".agent-relay")}[place]
    made = agent_relay_ledger.make(where, name=name, top=top, counts=dict.fromkeys(COUNTS, 1))
    doc = json.loads(fresh("import", "agent-relay", "--json").stdout)
    assert doc["ok"] and doc["ledger"] == str(made.ledger) and doc["imported"] == dict.fromkeys(COUNTS, 1)
    assert doc["found"].startswith(f"{made.ledger} (agent-relay ")


def test_without_a_path_and_no_ledger_anywhere_one_line_says_where_it_looked(fresh, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("AGENT_RELAY_DATA_DIR", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    r = fresh("import", "agent-relay", ok=False)
    line = error_line(r)
    assert r.exit_code == 1 and "no agent-relay ledger found: looked for meta/file-ledger.sqlite" in line
    assert str(tmp_path / ".agent-relay") in line and str(tmp_path / "home" / ".agent-relay") in line
    monkeypatch.setenv("HOME", str(tmp_path))           # the project is the home directory: named once
    assert error_line(fresh("import", "agent-relay", ok=False)).count(str(tmp_path / ".agent-relay")) == 1


# -- what the views show of what came over ----------------------------------------------------

def test_imported_agents_have_no_empty_spawned_by_line(fresh, old):
    fresh("import", "agent-relay", str(old.root))
    out = fresh("agents").output
    assert "spawned by" not in out
    assert "imported from agent-relay" in out
    assert "spawned by" not in fresh("agents", "Alice").output


def test_pending_imported_records_show_their_sender_and_recipients_in_audit(fresh, old):
    fresh("import", "agent-relay", str(old.root))
    out = fresh("audit", "--status", "pending", "--limit", "1000").output
    assert "→ ?" not in out
    for fid in old.ids["pending"][:5]:
        sender, = rows_of(old, "SELECT agent_name FROM relay_files WHERE file_id = ?", (fid,))[0]
        assert f"{sender} → {old.recipients[fid]}" in out
    # delivered later, each once, with the same recipients
    fresh("run", "--once", "-q")
    assert len(envelopes(fresh)) == PENDING


@pytest.mark.parametrize("name", ["system", "SYSTEM", "sYsTeM", "System", "broadcast", "BROADCAST", "Broadcast"])
def test_an_agent_relay_agent_named_as_relay_keeps_for_itself_is_not_imported_as_an_agent(fresh, old, name):
    """Carol, renamed in agent-relay's ledger to a reserved name in some case: she is named as a
    problem in one line, and so is each of her records; she is no agent, her name no directory;
    agent-relay's Lead is an agent as any."""
    db = sqlite3.connect(old.ledger)
    db.execute("UPDATE relay_files SET agent_name = ? WHERE agent_name = 'Carol'", (name,))
    db.execute("UPDATE agents SET agent_name = ? WHERE agent_name = 'Carol'", (name,))
    db.commit()
    db.close()
    r = fresh("import", "agent-relay", str(old.root), "--json", ok=False)
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and doc["problems"]
    agent = [p for p in doc["problems"] if p.startswith("agent ")]
    assert agent == [f"agent {name}: {name!r} is a name relay keeps for itself ({names.reserved(name)}: "
                     f"{names.meaning(names.reserved(name))}), in any case; not imported"]
    assert all(f", {name}/" in p and "keeps for itself" in p for p in doc["problems"] if p not in agent)
    assert len(doc["problems"]) > 1
    assert doc["registry"] == ["Alice", "Bob", "Lead"]
    assert not {name.lower()} & {p.name.lower() for p in (fresh.state / "outbox").iterdir()}
    assert rows(fresh, "SELECT count(*) FROM agents WHERE lower(name) = lower(?)", (name,)) == [(0,)]
    assert rows(fresh, "SELECT count(*) FROM messages WHERE lower(sender) = lower(?)", (name,)) == [(0,)]


def test_an_agent_relay_agent_named_as_a_relay_agent_in_another_case_is_a_problem_not_an_agent(fresh, old):
    """relay knows `bob`; agent-relay's Bob would share its directories on a file system that
    folds case: named in one line as a problem (and each record of his), not imported."""
    fresh("init", "--agent", "bob")
    r = fresh("import", "agent-relay", str(old.root), "--json", ok=False)
    doc = json.loads(r.stdout)
    line = ("agent Bob: 'Bob' would be the same as the agent 'bob' on a case-insensitive file system; use 'bob'; "
            "neither it nor its messages are imported")
    assert r.exit_code == 1 and line in doc["problems"]
    assert all(", Bob/" in p and "'bob'" in p for p in doc["problems"] if p != line)
    assert "Bob" not in doc["registry"] and "Alice" in doc["registry"]
    assert sorted(p.name for p in (fresh.state / "outbox").iterdir()) == ["Alice", "Carol", "Lead", "bob"]
    assert rows(fresh, "SELECT count(*) FROM messages WHERE sender = 'Bob'") == [(0,)]


SMALL = {"archived": 2, "delivered": 1, "failed": 1, "processing": 1, "pending": 2}


@pytest.fixture
def small_old(tmp_path):
    return agent_relay_ledger.make(tmp_path / "old", counts=SMALL)


def add_record(made, file_id, agent, name, status, data, source, archive=None, discovered_ms=1_700_000_000_000,
               processed_ms=None, checked=True):
    """A record in agent-relay's relay_files (`checked=False`: past its CHECK constraints, as a
    ledger edited by hand may hold)."""
    db = sqlite3.connect(made.ledger, isolation_level=None)
    try:
        if not checked:
            db.execute("PRAGMA ignore_check_constraints = ON")
        db.execute("INSERT INTO relay_files (file_id, source_path, archive_path, agent_name, message_type, status, "
                   "discovered_at, processed_at, archived_at, file_size, content_hash) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                   (file_id, str(source), archive and str(archive), agent, name, status, discovered_ms,
                    processed_ms, processed_ms, len(data), hashlib.sha256(data).hexdigest()[:16]))
    finally:
        db.close()


@pytest.mark.timeout_s(20)
def test_a_wal_beside_the_ledger_that_is_a_device_or_fifo_is_refused_not_read_for_ever(fresh, small_old):
    wal = small_old.ledger.with_name(small_old.ledger.name + "-wal")
    wal.symlink_to("/dev/zero")
    r = fresh("import", "agent-relay", str(small_old.root), ok=False)
    assert r.exit_code == 1 and "not a regular file" in error_line(r)
    wal.unlink()
    os.mkfifo(wal)
    r = fresh("import", "agent-relay", str(small_old.root), ok=False)
    assert r.exit_code == 1 and "not a regular file" in error_line(r)


def test_a_ledger_named_as_a_device_is_refused(fresh):
    r = fresh("import", "agent-relay", "/dev/zero", ok=False)
    assert r.exit_code == 1 and "not a regular file" in error_line(r)


def test_two_imports_at_once_both_succeed_and_bring_each_record_over_once(fresh, small_old):
    from click.testing import CliRunner

    from relay.cli import main
    results = []

    def one():
        r = CliRunner().invoke(main, ["--root", str(fresh.root), "import", "agent-relay", str(small_old.root)])
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


def test_a_record_naming_another_agents_outbox_file_is_not_imported_as_its_own(fresh, small_old):
    """agent-relay's file of a record lies at outbox/<its agent>/<its name>: a record of Alice
    whose recorded path is Bob's file would deliver Bob's words as Alice's."""
    secret = b"TO: Carol\n\nBob's own words\n"
    (small_old.root / "outbox" / "Bob").mkdir(parents=True, exist_ok=True)
    (small_old.root / "outbox" / "Bob" / "secret").write_bytes(secret)
    add_record(small_old, "abcdefabcdef", "Alice", "innocent", "pending", secret,
               small_old.root / "outbox" / "Bob" / "secret")
    r = fresh("import", "agent-relay", str(small_old.root), ok=False)
    fresh("run", "--once")
    for p in (fresh.state / "inbox" / "Carol" / "new").glob("*.json"):
        env = json.loads(p.read_bytes())
        assert not (env["from"] == "Alice" and "Bob's own words" in env["body"]), env
    assert "abcdefabcdef" in r.output


@pytest.mark.parametrize("ms", [99_999_999_999_999_999, 1e308])
def test_a_record_dated_past_any_calendar_breaks_no_verb(fresh, small_old, ms):
    data = b"TO: Bob\n\nlate\n"
    (small_old.root / "outbox" / "Alice" / "late").write_bytes(data)
    add_record(small_old, "fedcbafedcba", "Alice", "late", "pending", data,
               small_old.root / "outbox" / "Alice" / "late", discovered_ms=ms)
    fresh("import", "agent-relay", str(small_old.root), ok=False)
    for verb in (("audit",), ("agents",), ("report", "--html", str(fresh.root / "r.html")), ("status", "--json")):
        r = fresh(*verb, ok=False)
        assert r.exit_code in (0, 1, 3), r.output
        assert "Traceback" not in r.output


def test_orchestrator_state_over_the_team_state_limit_is_not_imported(fresh, small_old):
    db = sqlite3.connect(small_old.ledger, isolation_level=None)
    db.execute("INSERT INTO orchestrator_state (key, value, updated_at) VALUES ('huge', ?, 1)", ("x" * (1 << 20),))
    db.close()
    r = fresh("import", "agent-relay", str(small_old.root))
    assert "huge" in r.output
    got = fresh("state", "get", "huge", ok=False)
    assert got.exit_code == 1
    fresh("state", "get", "lead")


@pytest.mark.parametrize("dropped", ["agents", "orchestrator_state", "__migrations"])
def test_a_ledger_without_one_of_its_optional_tables_imports_the_rest(fresh, small_old, dropped):
    """relay_files is the one table an agent-relay ledger must have: without its agents table
    no agent comes over, without orchestrator_state no team state, without __migrations no
    schema check; the files come over all the same."""
    db = sqlite3.connect(small_old.ledger)
    db.execute(f"DROP TABLE {dropped}")
    db.commit()
    db.close()
    doc = json.loads(fresh("import", "agent-relay", str(small_old.root), "--json").stdout)
    assert doc["ok"] and doc["imported"] == SMALL
    assert (doc["registry"] == []) is (dropped == "agents")
    assert (doc["state"]["imported"] == []) is (dropped == "orchestrator_state")
    if dropped == "orchestrator_state":
        assert doc["state"] == {"imported": [], "skipped": 0, "note": None}


@pytest.mark.parametrize("name", ["..", ".", "", "a\\b\x01"])
def test_a_record_whose_file_name_relay_does_not_take_is_a_problem_not_imported(fresh, small_old, name):
    data = b"TO: Bob\n\nodd\n"
    add_record(small_old, "0123456789ab", "Alice", name, "pending", data, small_old.root / "outbox" / "Alice" / "odd")
    r = fresh("import", "agent-relay", str(small_old.root), "--json", ok=False)
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and not doc["ok"]
    [problem] = [p for p in doc["problems"] if "0123456789ab" in p]
    assert problem.startswith("0123456789ab (pending, Alice/") and problem.endswith(
        "): its file name is not one relay takes; not imported")
    assert rows(fresh, "SELECT count(*) FROM imports WHERE source_id = '0123456789ab'") == [(0,)]


def test_a_failed_record_whose_file_is_gone_comes_over_failed_with_a_notice_and_nothing_to_retry(fresh, small_old):
    data = b"TO: Bob\n\ngone\n"
    add_record(small_old, "ba9876543210", "Alice", "gone", "failed", data,
               small_old.root / "outbox" / "Alice" / "gone", processed_ms=1_700_000_100_000)
    doc = json.loads(fresh("import", "agent-relay", str(small_old.root), "--json").stdout)
    assert doc["ok"] and doc["problems"] == []
    [(mid,)] = rows(fresh, "SELECT message_id FROM imports WHERE source_id = 'ba9876543210'")
    [notice] = [n for n in doc["notices"] if "ba9876543210" in n]
    assert notice == (f"{mid} (agent-relay's ba9876543210, failed): file "
                      f"{small_old.root / 'outbox' / 'Alice' / 'gone'} is missing; imported as failed with no file "
                      "to retry")
    [(status, path, error, failed_at)] = rows(fresh, "SELECT status, failed_path, error, failed_at FROM messages "
                                                     "WHERE id = ?", (mid,))
    assert (status, path, error, failed_at) == ("failed", None, "failed in agent-relay", 1_700_000_100.0)
    assert f"{mid}: its file is gone (failed in agent-relay); write the message again" in \
        fresh("retry", mid, ok=False).output


def test_an_archive_file_that_is_a_directory_is_named_not_imported(fresh, small_old):
    fid = small_old.ids["archived"][0]
    [(path,)] = rows_of(small_old, "SELECT archive_path FROM relay_files WHERE file_id = ?", (fid,))
    os.unlink(path)
    os.mkdir(path)
    doc = json.loads(fresh("import", "agent-relay", str(small_old.root), "--json", ok=False).stdout)
    [problem] = [p for p in doc["problems"] if fid in p]
    assert f"archive file {path} is not a regular file of at most " in problem and problem.endswith(
        "; not imported (restore it and run the import again, or import it without its archive file: "
        "--accept-missing)")
    assert doc["imported"]["archived"] == SMALL["archived"] - 1


def test_an_agent_relay_time_is_taken_from_1970_up_to_before_the_year_10000_and_nothing_else():
    from relay.operator.agent_relay_records import LAST_MS, seconds
    assert seconds(0) == 0.0 and seconds(1_700_000_000_500) == 1_700_000_000.5
    assert seconds(LAST_MS - 1) == (LAST_MS - 1) / 1000.0
    for bad in (-1, LAST_MS, float("inf"), float("nan"), True, "1700000000000", None):
        assert seconds(bad) is None, bad


def test_a_recorded_path_is_taken_only_as_its_top_and_the_names_after_it():
    from relay.operator.agent_relay_records import tail
    assert tail("/old/place/outbox/Alice/msg", "outbox", 2) == "outbox/Alice/msg"
    assert tail("/x/archive/Alice/2024-01-01/ab-msg", "archive", 3) == "archive/Alice/2024-01-01/ab-msg"
    for bad in ("/old/inbox/Alice/msg", "outbox/Alice", "/x/outbox/Alice/..", "/x/outbox/../msg",
                "/x/outbox/Alice/./", None, 7, b"/x/outbox/Alice/msg"):
        assert tail(bad, "outbox", 2) is None, bad


def test_a_files_bytes_mismatch_its_record_by_short_hash_in_any_case_or_by_size():
    import hashlib as h
    from relay.operator.agent_relay_records import mismatch
    data = b"TO: Bob\n\nhi\n"
    short = h.sha256(data).hexdigest()[:16]
    assert mismatch(data, {"content_hash": short, "file_size": len(data)}) is None
    assert mismatch(data, {"content_hash": short.upper(), "file_size": len(data)}) is None
    assert mismatch(data, {"content_hash": None, "file_size": None}) is None
    assert mismatch(data, {"content_hash": "", "file_size": 0}) is None
    assert mismatch(data, {"content_hash": "0" * 16, "file_size": len(data)}) == \
        "does not match the sha256 agent-relay recorded"
    assert mismatch(data, {"content_hash": short, "file_size": len(data) + 1}) == \
        f"is {len(data)} bytes, agent-relay recorded {len(data) + 1}"
    assert mismatch(data, {"content_hash": None, "file_size": len(data) - 1}) == \
        f"is {len(data)} bytes, agent-relay recorded {len(data) - 1}"


def test_the_import_summary_in_words_counts_duplicates_and_archived_files_gone(fresh, tmp_path):
    made = agent_relay_ledger.make(tmp_path / "old", counts=dict.fromkeys(COUNTS, 0))
    d = agent_relay_ledger.Driver(made.root, int(time.time() * 1000))
    first = d.register("Alice", "work", agent_relay_ledger.message("Bob", 1))
    d.claim(first)
    d.rediscover(first)
    d.close()
    lines = fresh("import", "agent-relay", str(made.root)).stdout.splitlines()
    assert ("  1 of them record(s) of an outbox file an earlier record holds: recorded as its duplicates, one "
            "message, delivered once") in lines
    assert not any("without their archive file" in ln for ln in lines)


def test_the_import_summary_in_words_counts_archived_records_brought_over_without_their_file(fresh, small_old):
    gone = small_old.ids["archived"][:2]
    for fid in gone:
        [(path,)] = rows_of(small_old, "SELECT archive_path FROM relay_files WHERE file_id = ?", (fid,))
        os.unlink(path)
    lines = fresh("import", "agent-relay", str(small_old.root), "--accept-missing").stdout.splitlines()
    assert "  2 of them archived without their archive file (--accept-missing)" in lines
    assert not any("record(s) of an outbox file an earlier record holds" in ln for ln in lines)
    assert f"  {'archived':<10} {SMALL['archived']:>6} -> archived" in lines


@pytest.mark.parametrize("stored, kept", [("not json", {"metadata": "not json"}), ("[1, 2]", {"metadata": [1, 2]}),
                                          ('"cli"', {"metadata": "cli"}), (None, {}),
                                          ('{"model": "m"}', {"model": "m"})])
def test_an_agents_metadata_that_is_no_json_object_comes_over_kept_under_metadata(fresh, small_old, stored, kept):
    db = sqlite3.connect(small_old.ledger, isolation_level=None)
    db.execute("UPDATE agents SET metadata = ? WHERE agent_name = 'Alice'", (stored,))
    db.close()
    fresh("import", "agent-relay", str(small_old.root))
    agents = {a["agent"]: a for a in json.loads(fresh("agents", "--json").stdout)}
    assert agents["Alice"]["metadata"] == {**kept, "imported_from": "agent-relay"}


def test_more_than_20_files_agent_relay_never_recorded_are_named_20_and_the_rest_counted(fresh, small_old):
    box = small_old.root / "outbox" / "Alice"
    for i in range(22):
        (box / f"stray{i:02d}").write_text("TO: Bob\n\nstray\n")
    doc = json.loads(fresh("import", "agent-relay", str(small_old.root), "--json", ok=False).stdout)
    named = [p for p in doc["problems"] if p.endswith("a file agent-relay never recorded; not imported: move it "
                                                      "into relay's outbox to send it")]
    assert len(named) == 20
    assert doc["problems"][-1] == f"... and 2 more such file(s) in {small_old.root}/outbox"
    (box / "stray00").unlink()
    (box / "stray01").unlink()
    doc = json.loads(fresh("import", "agent-relay", str(small_old.root), "--json", ok=False).stdout)
    assert len([p for p in doc["problems"] if "never recorded" in p]) == 20
    assert not any(p.startswith("... and") for p in doc["problems"])


def test_orchestrator_state_of_a_key_or_value_relay_does_not_hold_is_named_and_not_imported(fresh, small_old):
    db = sqlite3.connect(small_old.ledger, isolation_level=None)
    db.execute("INSERT INTO orchestrator_state (key, value, updated_at) VALUES ('bad key', 'v', 1)")
    db.execute("INSERT INTO orchestrator_state (key, value, updated_at) VALUES ('blob', X'0001', 1)")
    db.execute("INSERT INTO orchestrator_state (key, value, updated_at) VALUES (?, 'v', 1)", ("k" * 129,))
    db.execute("INSERT INTO orchestrator_state (key, value, updated_at) VALUES (?, 'kept', 1)", ("k" * 128,))
    db.close()
    r = fresh("import", "agent-relay", str(small_old.root))
    for key in ("bad key", "blob", "k" * 129):
        assert f"notice: orchestrator state key {key}: not a key and text value relay's team state holds; " \
               "not imported" in r.output
    for key in ("bad key", "blob", "k" * 129):
        assert fresh("state", "get", key, ok=False).exit_code == 1
    assert "kept" in fresh("state", "get", "k" * 128).output


@pytest.mark.parametrize("status, discovered_ms", [("queued", 1_700_000_000_000), ("PENDING", 1_700_000_000_000),
                                                   ("pending", -5), ("pending", "yesterday")])
def test_a_record_of_a_status_or_time_agent_relay_never_writes_is_a_problem_not_imported(
        fresh, small_old, status, discovered_ms):
    data = b"TO: Bob\n\nodd\n"
    add_record(small_old, "fedcba987654", "Alice", "odd", status, data, small_old.root / "outbox" / "Alice" / "odd",
               discovered_ms=discovered_ms, checked=False)
    r = fresh("import", "agent-relay", str(small_old.root), "--json", ok=False)
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and not doc["ok"]
    [problem] = [p for p in doc["problems"] if "fedcba987654" in p]
    assert problem.endswith("): a record agent-relay 2.0 does not write (status, time or id); not imported"), problem
    assert rows(fresh, "SELECT count(*) FROM imports WHERE source_id = 'fedcba987654'") == [(0,)]


def test_a_record_owns_only_its_agents_file_by_its_name_in_the_outbox_and_its_id_and_name_in_the_archive():
    from relay.operator.agent_relay_records import file_key, on_the_way, own
    r = {"agent_name": "Alice", "message_type": "msg", "file_id": "f1", "content_hash": "ABCdef", "file_size": 12,
         "source_path": "/old/place/outbox/Alice/msg"}
    assert own("outbox/Alice/msg", r) is True
    assert own("archive/Alice/2024-01-01/f1-msg", r) is True
    assert own("outbox/Bob/msg", r) is False
    assert own("outbox/Alice/other", r) is False
    assert own("outbox/Alice/f1-msg", r) is False
    assert own("archive/Alice/2024-01-01/msg", r) is False
    assert own("archive/Bob/2024-01-01/f1-msg", r) is False
    assert on_the_way(r) == "outbox/Alice/msg"
    assert file_key(r) == ("outbox/Alice/msg", "abcdef", 12)
    assert on_the_way({**r, "source_path": "/old/place/outbox/Bob/msg"}) is None
    assert on_the_way({**r, "source_path": "/old/place/archive/Alice/msg"}) is None
    assert on_the_way({**r, "source_path": None}) is None
    assert file_key({**r, "source_path": "/old/place/outbox/Bob/msg"}) is None
    assert file_key({**r, "content_hash": ""}) is None
    assert file_key({**r, "content_hash": None}) is None
    assert file_key({**r, "content_hash": 7}) is None


def test_a_recorded_path_needs_more_names_than_its_depth_and_no_dot_among_them():
    from relay.operator.agent_relay_records import tail
    assert tail("outbox/Alice/msg", "outbox", 2) == "outbox/Alice/msg"
    assert tail("/outbox/Alice/msg", "outbox", 2) == "outbox/Alice/msg"
    assert tail("Alice/msg", "outbox", 2) is None
    assert tail("/x/outbox/./msg", "outbox", 2) is None
    assert tail("/x/outbox/Alice/..", "outbox", 2) is None
    assert tail("/x/archive/Alice/msg", "outbox", 2) is None


def test_a_recorded_hash_that_is_no_text_is_no_hash_to_check_the_bytes_against():
    from relay.operator.agent_relay_records import mismatch
    data = b"TO: Bob\n\nhi\n"
    assert mismatch(data, {"content_hash": 7, "file_size": len(data)}) is None
    assert mismatch(data, {"content_hash": b"00", "file_size": "12"}) is None
    assert mismatch(data, {"content_hash": 7, "file_size": len(data) + 1}) == \
        f"is {len(data)} bytes, agent-relay recorded {len(data) + 1}"


def test_a_file_on_the_way_comes_over_as_it_is_now_whether_pending_or_processing_and_a_delivered_one_must_match(
        fresh, tmp_path):
    """agent-relay had still to read a pending or processing record's file: what its outbox holds
    now is the message (its recorded hash and size are not held against it); a delivered record's
    file must be the bytes agent-relay recorded."""
    made = agent_relay_ledger.make(tmp_path / "old", counts=dict.fromkeys(COUNTS, 0))
    d = agent_relay_ledger.Driver(made.root, int(time.time() * 1000))
    waiting = d.register("Alice", "waiting", agent_relay_ledger.message("Bob", 1))
    taken = d.register("Alice", "taken", agent_relay_ledger.message("Bob", 2))
    d.claim(taken)
    done = d.register("Alice", "done", agent_relay_ledger.message("Bob", 3))
    d.claim(done)
    d.delivered(done)
    d.close()
    for name in ("waiting", "taken", "done"):
        (made.root / "outbox/Alice" / name).write_bytes(f"TO: Bob\n\n{name}, edited since\n".encode())
    doc = json.loads(fresh("import", "agent-relay", str(made.root), "--json", ok=False).stdout)
    assert doc["imported"]["pending"] == 1 and doc["imported"]["processing"] == 1
    assert doc["imported"]["delivered"] == 0
    [problem] = doc["problems"]
    assert problem.startswith(f"{done} (delivered, Alice/done): file ") and \
        "does not match the sha256 agent-relay recorded" in problem
    assert not any(waiting in p or taken in p for p in doc["problems"])


@pytest.mark.parametrize("name", ["a/b", "x\0y"])
def test_a_record_whose_file_name_holds_a_slash_or_a_nul_is_a_problem_not_imported(fresh, small_old, name):
    data = b"TO: Bob\n\nodd\n"
    add_record(small_old, "0123456789ab", "Alice", name, "pending", data, small_old.root / "outbox" / "Alice" / "odd",
               checked=False)
    doc = json.loads(fresh("import", "agent-relay", str(small_old.root), "--json", ok=False).stdout)
    [problem] = [p for p in doc["problems"] if "0123456789ab" in p]
    assert problem.endswith("): its file name is not one relay takes; not imported"), problem
    assert rows(fresh, "SELECT count(*) FROM imports WHERE source_id = '0123456789ab'") == [(0,)]


def test_a_record_whose_file_id_is_no_text_is_a_problem_not_imported(fresh, small_old):
    data = b"TO: Bob\n\nodd\n"
    add_record(small_old, b"0123456789ab", "Alice", "odd", "pending", data,        # a blob: no text affinity makes it text
               small_old.root / "outbox" / "Alice" / "odd", checked=False)
    doc = json.loads(fresh("import", "agent-relay", str(small_old.root), "--json", ok=False).stdout)
    [problem] = [p for p in doc["problems"] if p.startswith("b'0123456789ab' (pending, Alice/odd)")]
    assert problem.endswith("): a record agent-relay 2.0 does not write (status, time or id); not imported"), problem
    assert doc["imported"] == SMALL
