"""A message's content type and retry budget (CONTENT-TYPE:, MAX-RETRIES:, in ASCII digits, past
any budget held to the configured one), every unreadable column of a stored row named, and the
migrations a ledger gets, logged."""
import errno
import json
import logging
import sqlite3

import pytest
from conftest import failing_create

import relay
from relay.ledger.history import BadRow
from relay.ledger.ledger import Ledger
from relay.ledger.schema import MIGRATIONS


def row_of(r, sender="Ann"):
    [row] = [row for row in r.history.audit() if row["sender"] == sender]
    return row


# -- content type --------------------------------------------------------------------------

def test_a_content_type_header_reaches_the_envelope_the_ledger_and_show(project, cli):
    r = project.relay()
    project.drop("Ann", "m", "TO: Ben\nCONTENT-TYPE: text/markdown; charset=utf-8\n\n# plan\n")
    project.drop("Cy", "j.json", json.dumps({"to": "Ben", "content_type": "application/json", "body": "{}"}))
    project.drop("Ben", "plain", "TO: Ann\n\nno type named")
    r.drain()
    by_sender = {e["from"]: e for e in project.inbox("Ben") + project.inbox("Ann")}
    assert by_sender["Ann"]["content_type"] == "text/markdown; charset=utf-8"
    assert by_sender["Cy"]["content_type"] == "application/json"
    assert by_sender["Ben"]["content_type"] == "text/plain"            # the default
    assert "content_type" not in by_sender["Cy"]["headers"]            # a field, not a header passed through
    row = row_of(r)
    assert row["content_type"] == "text/markdown; charset=utf-8"
    shown = cli("show", row["id"]).output
    assert "content_type   text/markdown; charset=utf-8" in shown
    assert json.loads(cli("show", row["id"], "--json").output)["content_type"] == "text/markdown; charset=utf-8"
    read = cli("read", "--agent", "Ben", row["id"]).output
    assert "type:    text/markdown; charset=utf-8" in read


def test_a_content_type_that_is_no_media_type_fails_the_message_with_the_reason(project):
    r = project.relay()
    project.drop("Ann", "m", "TO: Ben\nCONTENT-TYPE: markdown please\n\nx")
    assert r.drain().failed == 1
    row = row_of(r)
    assert row["status"] == "failed" and "'markdown please' is not a media type" in row["error"]
    assert project.inbox("Ben") == []


def test_send_and_the_api_take_a_content_type_and_refuse_a_bad_one_before_writing(cli, tmp_path):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    mid = cli("send", "--from", "Ann", "--to", "Ben", "--content-type", "text/markdown", "# hi").stdout.strip()
    bad = cli("send", "--from", "Ann", "--to", "Ben", "--content-type", "nope", "x", ok=False)
    assert bad.exit_code == 1 and "'nope' is not a media type" in bad.output
    with relay.Agent("Ann", root=tmp_path) as ann:
        with pytest.raises(relay.RelayError, match="not a whole number"):
            ann.send("Ben", "x", max_retries=-1)
        second = ann.send("Ben", "{}", content_type="application/json", max_retries=2)
    cli("run", "--once", "-q")
    with relay.Agent("Ben", root=tmp_path) as ben:
        got = {m.id: m for m in ben.inbox()}
    assert got[mid].content_type == "text/markdown" and got[second].content_type == "application/json"
    assert got[second].as_dict()["content_type"] == "application/json"
    assert len(got) == 2        # the refused ones wrote nothing


# -- retry budget --------------------------------------------------------------------------

def test_max_retries_of_a_message_bounds_its_retries_without_the_retry_period(project, clock):
    r = project.relay(max_retries=5)        # retry_period stays 1h: the configured budget would wait it out
    switch = failing_create(r, OSError(errno.EACCES, "Permission denied"), lambda rel: rel.startswith("inbox/Ben/"))
    project.drop("Ann", "once", "TO: Ben\nMAX-RETRIES: 1\n\nretried once")
    project.drop("Cy", "never", json.dumps({"to": "Ben", "max_retries": 0, "body": "not retried"}))
    project.drop("Ann", "default", "TO: Ben\n\nthe configured budget")
    for _ in range(8):
        r.step()
        clock.advance(120)
    rows = {row["name"]: row for row in r.history.audit()}
    assert rows["never"]["status"] == "failed" and rows["never"]["retries"] == 1
    assert "MAX-RETRIES: 0" in rows["never"]["error"] and "Permission denied" in rows["never"]["error"]
    assert rows["once"]["status"] == "failed" and rows["once"]["retries"] == 2
    assert rows["once"]["max_retries"] == 1 and "gave up after 2 attempts (MAX-RETRIES: 1)" in rows["once"]["error"]
    assert rows["default"]["status"] == "pending"          # still retried: within retry_period
    switch["on"] = False
    clock.advance(3600)
    r.drain()
    assert [e["body"] for e in project.inbox("Ben")] == ["the configured budget"]


def test_max_retries_above_the_configured_one_is_held_to_it(project, clock):
    r = project.relay(max_retries=1, retry_period="0s")
    failing_create(r, OSError(errno.EACCES, "Permission denied"), lambda rel: rel.startswith("inbox/Ben/"))
    project.drop("Ann", "m", "TO: Ben\nMAX-RETRIES: 99\n\nx")
    for _ in range(6):
        r.step()
        clock.advance(120)
    row = row_of(r)
    assert row["status"] == "failed" and row["retries"] == 2      # the configured 1, not 99


@pytest.mark.parametrize("value", ["-1", "two", "1.5", "1_0"])
def test_a_max_retries_that_is_no_count_fails_the_message(project, value):
    r = project.relay()
    project.drop("Ann", "m", f"TO: Ben\nMAX-RETRIES: {value}\n\nx")
    assert r.drain().failed == 1
    assert "is not a whole number from 0 up" in row_of(r)["error"]


# -- every bad column named ------------------------------------------------------------------

def test_a_row_with_three_bad_columns_names_all_three(project, cli):
    r = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nhello")
    r.drain()
    mid = row_of(r)["id"]
    r.close()
    db = sqlite3.connect(project.state / "ledger.sqlite")
    db.execute("UPDATE messages SET status = 'lost', retries = -2, sent_at = 'yesterday' WHERE id = ?", (mid,))
    db.commit()
    db.close()
    with Ledger(project.state / "ledger.sqlite") as led:
        row = led.db.execute("SELECT * FROM messages WHERE id = ?", (mid,)).fetchone()
    bad = BadRow.of(row)
    assert [c for c, _ in bad.columns] == ["status", "sent_at", "retries"]
    text = str(bad)
    assert "column status holds 'lost'" in text and "column sent_at holds 'yesterday'" in text
    assert "column retries holds -2" in text
    status = cli("status", ok=False).output
    assert "column status holds 'lost'" in status and "column retries holds -2" in status


# -- migrations ------------------------------------------------------------------------------

def test_each_migration_applied_is_logged(tmp_path, caplog):
    path = tmp_path / "ledger.sqlite"
    with caplog.at_level(logging.INFO, logger="relay.ledger.schema"):
        Ledger(path).close()
    applied = [r.getMessage() for r in caplog.records if "applied migration" in r.getMessage()]
    assert len(applied) == len(MIGRATIONS)
    assert any(a.endswith("applied migration 53 (content type and retry budget per message)") for a in applied)
    assert applied[-1].endswith(f"applied migration {MIGRATIONS[-1][0]} ({MIGRATIONS[-1][1]})")     # in order
    db = sqlite3.connect(path)          # a ledger from before the last migration
    db.executescript("DELETE FROM schema_migrations WHERE version = 53;"
                     "ALTER TABLE messages DROP COLUMN content_type; ALTER TABLE messages DROP COLUMN max_retries;")
    db.close()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="relay.ledger.schema"):
        Ledger(path).close()
        Ledger(path).close()            # nothing left to apply: nothing logged
    applied = [r.getMessage() for r in caplog.records if "applied migration" in r.getMessage()]
    assert applied == [f"ledger {path}: applied migration 53 (content type and retry budget per message)"]


def test_read_names_the_type_only_when_it_is_not_plain_text(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    plain = cli("send", "--from", "Ann", "--to", "Ben", "plain words").stdout.strip()
    cli("run", "--once", "-q")
    out = cli("read", "--agent", "Ben", plain).output
    assert "type:" not in out
    assert json.loads(cli("read", "--agent", "Ben", plain, "--json").output)["content_type"] == "text/plain"


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
