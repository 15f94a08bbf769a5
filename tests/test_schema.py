"""The ledger's migrations: written in order, split into statements by SQLite's own rule, times
in Unix seconds, and a ledger whose recorded migration differs from this relay's refused at open,
unchanged, by every verb (relay doctor included)."""
import sqlite3

import pytest

from relay.errors import SchemaError
from relay.ledger import schema
from relay.ledger.ledger import Ledger


def test_migrations_are_written_in_order_of_their_numbers():
    versions = [v for v, _, _ in schema.MIGRATIONS]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    assert schema.SCHEMA_VERSION == versions[-1]


def test_a_semicolon_in_a_literal_or_a_trigger_does_not_end_a_statement():
    sql = """
CREATE TABLE t (a TEXT DEFAULT 'x;y');
CREATE TRIGGER tr AFTER INSERT ON t BEGIN UPDATE t SET a = 'p;q'; DELETE FROM t WHERE a = ';'; END;
INSERT INTO t VALUES ('one; two')
"""
    got = schema.statements(sql)
    assert len(got) == 3
    assert got[1].startswith("CREATE TRIGGER") and got[1].endswith("END;")
    db = sqlite3.connect(":memory:")
    for stmt in got:
        db.execute(stmt)
    assert db.execute("SELECT a FROM t").fetchall() == [("p;q",)]
    with pytest.raises(SchemaError, match="ends inside a statement"):
        schema.statements("CREATE TABLE u (a TEXT DEFAULT 'never closed;")


def test_every_migration_splits_into_whole_statements():
    for version, _, sql in schema.MIGRATIONS:
        parts = schema.statements(sql)
        assert parts and all(sqlite3.complete_statement(p if p.endswith(";") else p + ";") for p in parts), version


def test_migration_times_are_unix_seconds_and_old_julian_days_are_converted(tmp_path):
    path = tmp_path / "ledger.sqlite"
    Ledger(path).close()
    db = sqlite3.connect(path)
    rows = db.execute("SELECT version, applied_at FROM schema_migrations").fetchall()
    assert rows and all(1.7e9 < at < 4e9 for _, at in rows)          # seconds since 1970, not days
    # a ledger made before migration 54: its times are Julian days
    db.execute("UPDATE schema_migrations SET applied_at = 2461042.25 WHERE version < 54")   # 2026-01-01 18:00 UTC
    db.execute("DELETE FROM schema_migrations WHERE version >= 54")
    db.commit()
    db.close()
    Ledger(path).close()
    db = sqlite3.connect(path)
    old = {at for v, at in db.execute("SELECT version, applied_at FROM schema_migrations WHERE version < 54")}
    assert len(old) == 1 and old.pop() == pytest.approx(1767290400.0, abs=1e-3)
    db.close()


def test_a_changed_migration_is_refused_at_open_and_the_ledger_left_as_it_was(tmp_path, cli):
    cli("init", "--agent", "Ann")
    path = cli.state / "ledger.sqlite"
    db = sqlite3.connect(path)
    db.execute("UPDATE schema_migrations SET checksum = 'deadbeef' WHERE version = 50")
    db.commit()
    db.close()
    before = path.read_bytes()
    with pytest.raises(SchemaError, match=r"migration 50 \(agent registry\) does not match"):
        Ledger(path)
    r = cli("doctor", ok=False)
    assert r.exit_code == 1
    assert "migration 50 (agent registry) does not match this relay's" in r.output
    assert "Traceback" not in r.output
    assert path.read_bytes() == before
