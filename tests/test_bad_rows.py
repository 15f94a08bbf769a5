"""Stored rows this build cannot read (an unknown status, a time that is no number, a malformed
id, a path outside the state directory) are named with their id and column by every verb that
meets them, which goes on without them (a time out of every calendar too); no verb prints a
traceback, recovery follows no such path, and doctor counts them."""
import json
import sqlite3

import pytest

from relay.ledger.history import BadRow, unreadable


def mid(n):
    return f"01{'Z' * 23}{n}"


ZOMBIE, NOT_A_TIME, OUTSIDE, ETC = mid(1), mid(2), mid(3), mid(4)
MALFORMED = "../not-an-id"
BAD_MESSAGES = [      # (id, column named)
    (ZOMBIE, "status"), (NOT_A_TIME, "discovered_at"), (MALFORMED, "id"), (OUTSIDE, "archive_path"),
    (ETC, "failed_path")]


@pytest.fixture
def damaged(cli, tmp_path):
    """A project with two good messages and a ledger holding rows this build cannot read."""
    cli("init", "--agent", "Ann", "--agent", "Ben")
    cli("send", "--from", "Ann", "--to", "Ben", "--subject", "good one", "hello")
    cli("send", "--from", "Ben", "--to", "Ann", "--thread", "t", "back")
    cli("run", "--once", "-q")
    secret = tmp_path / "outside" / "secret"
    secret.parent.mkdir()
    secret.write_text("never touched")
    db = sqlite3.connect(cli.state / "ledger.sqlite", isolation_level=None)
    good = db.execute("SELECT id FROM messages ORDER BY id").fetchone()[0]
    insert = "INSERT INTO messages (id, sender, name, status, discovered_at, archive_path, failed_path) " \
             "VALUES (?, ?, ?, ?, ?, ?, ?)"
    db.execute(insert, (ZOMBIE, "Ann", "z", "zombie", 1, None, None))
    db.execute(insert, (NOT_A_TIME, "Ann", "t", "archived", "yesterday", None, None))
    db.execute(insert, (MALFORMED, "Ann", "m", "failed", 1, None, None))
    db.execute(insert, (OUTSIDE, "Ann", "o", "archived", 1, "archive/../../outside/secret", None))
    db.execute(insert, (ETC, "Ann", "e", "failed", 1, None, "/etc/passwd"))
    db.execute("INSERT INTO events (message_id, at, event) VALUES (?, 'noon', 'delivered')", (good,))
    db.execute("INSERT INTO deliveries (message_id, recipient, delivered_at) VALUES (?, '../x', 'later')", (good,))
    db.execute("INSERT INTO agents (name, first_seen, last_seen) VALUES ('../evil', 1, 'never')")
    db.close()
    cli.good, cli.secret = good, secret
    return cli


def named(text, key, column):
    return f"{key!r}" in text and f"column {column} holds" in text


def test_the_check_names_the_first_bad_column():
    row = {"id": mid(1), "sender": "Ann", "name": "x", "status": "pending", "discovered_at": "soon"}
    assert unreadable(row) == ("discovered_at", "soon")
    assert unreadable({**row, "discovered_at": 1.5}) is None
    assert unreadable({**row, "discovered_at": 1.5, "archive_path": None}, need=("archive_path",)) == \
        ("archive_path", None)
    for column, value in [("sender", "../x"), ("name", "a/b"), ("status", "lost"), ("retries", -1),
                          ("archive_path", "/etc/passwd"), ("archive_path", "failed/x"), ("failed_path", "failed/../x"),
                          ("recipients", "not json"), ("headers", "[1]"), ("sha256", "xyz"), ("id", "short")]:
        assert unreadable({**row, "discovered_at": 1, column: value}) == (column, value), column
    from relay.times import END, FIRST
    for at, readable in ((FIRST, True), (FIRST - 1, False), (END - 1, True), (END, False), (float("inf"), False),
                         (float("nan"), False)):
        assert (unreadable({**row, "discovered_at": at}) is None) is readable, at    # the years 1 to 9999, no more
    line = str(BadRow.of({**row, "id": "x\x1b[2J"}))
    assert "\x1b" not in line and "column id holds" in line         # shown escaped, one line


@pytest.mark.parametrize("value, readable", [("c", True), ("c" * 200, True), ("c" * 201, False), ("", False),
                                             ("a\x1fb", False), ("a\x7fb", False), ("a~b", True), (7, False)])
def test_a_commands_id_is_one_to_200_printable_characters(value, readable):
    """The operator's commands (relay retry, expire, ping, archive-agent) keep their id by
    commands.check_id's rule: a row whose id breaks it is named, not read."""
    row = {"id": value, "verb": "retry", "arguments": "{}"}
    assert (unreadable(row, table="commands") is None) is readable
    if not readable:
        assert unreadable(row, table="commands") == ("id", value)


def test_audit_in_every_format_names_them_and_lists_the_rest(damaged):
    for fmt in ([], ["--json"], ["--jsonl"], ["--format", "csv"]):
        r = damaged("audit", *fmt)
        for key, column in BAD_MESSAGES:
            assert named(r.stderr, key, column), (fmt, key, column, r.stderr)
        if fmt == ["--json"]:
            records = json.loads(r.stdout)
            assert len(records) == 2 and {x["from"] for x in records} == {"Ann", "Ben"}
    assert "good one" in damaged("audit").stdout


def test_show_tail_agents_and_report_name_what_they_meet(damaged, tmp_path):
    r = damaged("show", damaged.good, "--json")
    doc = json.loads(r.stdout)
    assert doc["id"] == damaged.good and len(doc["events"]) >= 3 and doc["deliveries"]
    assert "column at holds 'noon'" in r.stderr and "column recipient holds '../x'" in r.stderr
    r = damaged("show", NOT_A_TIME)
    assert named(r.stderr, NOT_A_TIME, "discovered_at") and "(unreadable: 'yesterday')" in r.stdout
    assert json.loads(damaged("show", NOT_A_TIME, "--json").stdout)["discovered_at"] == "(unreadable: 'yesterday')"
    r = damaged("tail", "-n", "100", "--json")
    assert "column at holds 'noon'" in r.stderr and all(json.loads(line) for line in r.stdout.splitlines())
    r = damaged("agents", "--json")
    assert named(r.stderr, "../evil", "name") and {a["agent"] for a in json.loads(r.stdout)} >= {"Ann", "Ben"}
    page = tmp_path / "report.html"
    r = damaged("report", "--html", str(page))
    for key, column in BAD_MESSAGES:
        assert named(r.stderr, key, column), (key, column)
    html = page.read_text()
    assert "Rows this relay cannot read (5)" in html and "discovered_at" in html


def test_verify_and_doctor_count_them_and_fail(damaged):
    r = damaged("verify", ok=False)
    assert r.exit_code == 1
    for key, column in BAD_MESSAGES:
        assert named(r.stdout, key, column)
    r = damaged("doctor", ok=False)
    assert r.exit_code == 1 and "unreadable: 8 ledger row(s) this relay cannot read" in r.stdout
    doc = json.loads(damaged("doctor", "--json", ok=False).stdout)
    assert doc["unreadable"] == 8 and sum("cannot read" in p for p in doc["problems"]) == 8
    assert damaged.secret.read_text() == "never touched"


def test_status_retry_expire_and_run_go_on(damaged):
    r = damaged("status", ok=False)
    assert r.exit_code == 3 and "1 with a status this relay cannot read" in r.stdout and named(r.stderr, ZOMBIE, "status")
    r = damaged("retry", ETC, ok=False)
    assert r.exit_code == 1 and "column failed_path holds '/etc/passwd'" in r.stderr and "not retried" in r.stderr
    r = damaged("expire", NOT_A_TIME, ok=False)
    assert r.exit_code == 1 and "column discovered_at holds 'yesterday'" in r.output
    damaged("send", "--from", "Ann", "--to", "Ben", "after the damage")
    assert "relayed 1 message(s)" in damaged("run", "--once", "-q").stdout
    assert damaged.secret.read_text() == "never touched"


def test_recovery_follows_no_stored_path_outside(project, tmp_path):
    """Rows left processing whose paths or names lead outside the state directory: failed with
    the reason, nothing outside touched, the good message delivered."""
    secret = tmp_path / "secret"
    secret.write_text("never touched")
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\ngood")
    db = relay.ledger.db
    for n, (column, value) in enumerate([("archive_path", "archive/../../secret"), ("sender", ".."),
                                         ("name", "../../secret"), ("archive_path", str(secret))]):
        row = {"id": mid(n), "sender": "Ann", "name": f"x{n}", "status": "processing", "discovered_at": 1, column: value}
        db.execute(f"INSERT INTO messages ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))
    total = relay.drain()
    assert total.archived == 1 and len(project.inbox("Ben")) == 1
    for n in range(4):
        row = relay.history.get(mid(n))
        assert row["status"] == "failed" and "which this relay cannot read" in row["error"], n
    assert secret.read_text() == "never touched" and sorted(p.name for p in tmp_path.iterdir()) == [".relay", "secret"]


def test_a_time_that_is_no_number_never_stops_the_loop(project, clock):
    """The loop's questions (what is due next, the latest archived day) leave such a row out."""
    relay = project.relay()
    relay.ledger.db.execute("INSERT INTO messages (id, sender, name, status, discovered_at, next_attempt_at) "
                            "VALUES (?, 'Ann', 'x', 'pending', 1, 'whenever')", (mid(1),))
    relay.ledger.db.execute("INSERT INTO messages (id, sender, name, status, discovered_at, archived_at) "
                            "VALUES (?, 'Ann', 'y', 'archived', 1, 'long ago')", (mid(2),))
    assert relay.history.next_due() is None and relay.history.latest_archived_at() is None
    assert relay.next_deadline(clock.now) is not None
    project.drop("Ann", "m", "TO: Ben\n\ngood")
    assert relay.drain().archived == 1


def test_blobs_and_a_chained_row_with_a_time_that_is_no_number(cli):
    """Values no JSON holds (blobs) and an archived row in the hash chain whose time is text:
    show, audit, verify and the retention sweep name or keep them; none stops."""
    cli("init", "--agent", "Ann", "--agent", "Ben")
    cli("send", "--from", "Ann", "--to", "Ben", "x")
    cli("run", "--once", "-q")
    db = sqlite3.connect(cli.state / "ledger.sqlite", isolation_level=None)
    [(chained,)] = db.execute("SELECT id FROM messages").fetchall()
    db.execute("UPDATE messages SET archived_at = 'then', subject = X'00ff', body = X'1b5b324a' WHERE id = ?",
               (chained,))
    db.close()
    r = cli("show", chained, "--json")
    doc = json.loads(r.stdout)
    assert doc["body"].startswith("(unreadable: b'") and doc["archived_at"] == "(unreadable: 'then')"
    assert named(r.stderr, chained, "subject")
    assert json.loads(cli("audit", "--json").stdout) == [] and named(cli("audit").stderr, chained, "subject")
    r = cli("verify", ok=False)
    assert named(r.stdout, chained, "subject") and f"{chained}: its ledger record was altered" in r.stdout
    r = cli("sweep", "--older-than", "0s")
    assert "deleted 0 archived" in r.stdout                # never deleted while unreadable
    assert "\x1b" not in cli("show", chained).stdout


def test_the_sql_that_narrows_the_scan_misses_no_row_the_checks_refuse(project):
    """bad_rows() looks at events and deliveries only where SQL finds a suspect value: every row
    the Python checks refuse must be among them."""
    from relay.ledger.rows import unreadable_rows
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nx")
    relay.drain()
    good = relay.history.audit().fetchone()["id"]
    db = sqlite3.connect(project.state / "ledger.sqlite", isolation_level=None)    # foreign keys off
    for column, values in {"message_id": ["short", "01" + "z" * 24, "01" + "Z" * 23 + "I", b"\x00" * 26, 7],
                           "at": ["noon", b"\x01"], "event": [5, b"x"], "detail": [5, 1.5, b"x"],
                           "actor": [1, b"x"]}.items():
        for v in values:
            row = {"message_id": good, "at": 1.0, "event": "delivered", "detail": None, "actor": "relay", column: v}
            db.execute("INSERT INTO events (message_id, at, event, detail, actor) VALUES (?, ?, ?, ?, ?)",
                       list(row.values()))
    n = 0
    for column, values in {"message_id": ["x", "01" + "Z" * 25], "recipient": [
            "../x", "", "a" * 65, "a b", "Ann\n", "-x", "Ånn", 5, b"Ann"], "delivered_at": ["x", b"1"],
            "size": [-1, "x", 1.5], "sha256": ["XYZ", "A" * 64, "0" * 63, 5]}.items():
        for v in values:
            n += 1
            row = {"message_id": good, "recipient": f"R{n}", "delivered_at": 1.0, "size": 1, "sha256": "0" * 64,
                   column: v}
            db.execute("INSERT INTO deliveries (message_id, recipient, delivered_at, size, sha256) "
                       "VALUES (?, ?, ?, ?, ?)", list(row.values()))
    db.close()
    for table in ("events", "deliveries"):
        every = list(unreadable_rows(relay.ledger.db.execute(f"SELECT * FROM {table}"), table))
        assert len(every) >= 10
        assert list(relay.history.bad_rows(tables=(table,))) == every


@pytest.fixture
def planted(cli, tmp_path):
    """A project with a delivered message, a ping and an archived agent, whose ledger holds rows
    this build cannot read in sheds, pings, archived_agents, commands and attestations: blobs,
    times that are text, names that are paths, a reason and a verb no build knows."""
    cli("init", "--agent", "Ann", "--agent", "Ben", "--agent", "Cy")
    cli("send", "--from", "Ann", "--to", "Ben", "--subject", "good one", "hello")
    cli("run", "--once", "-q")
    cli("ping", "Ben")
    cli("archive-agent", "Cy")
    outside = tmp_path / "outside"
    (outside / "new").mkdir(parents=True)
    db = sqlite3.connect(cli.state / "ledger.sqlite", isolation_level=None)
    good = db.execute("SELECT id FROM messages").fetchone()[0]
    sheds = "INSERT INTO sheds (message_id, recipient, sender, reason, limit_value, observed, at) VALUES (?, ?, ?, ?, ?, ?, ?)"
    db.execute(sheds, (good, b"\xff\x00bin", "Ann", "queue_limit", 1, 2, 1.0))
    db.execute(sheds, (good, "../../outside", "Ann", "per_pair_rate", 1, 2, 1.0))
    db.execute(sheds, (good, "Cy", "Ann", "7", 1, 2, 1.0))
    db.execute(sheds, (good, "Ben", "Ann", "queue_limit", "lots", 2, "noon"))
    db.execute("INSERT INTO pings VALUES (?, ?, ?, ?)", (mid(1), "../../outside", 1.0, "op"))
    db.execute("INSERT INTO pings VALUES (?, ?, ?, ?)", (mid(2), b"\xffBen", 1.0, "op"))
    db.execute("INSERT INTO pings VALUES (?, ?, ?, ?)", (mid(3), "Ben", "tomorrow", "op"))
    db.execute("INSERT INTO archived_agents VALUES (?, ?, ?)", ("../../evil", 1.0, "op"))
    db.execute("INSERT INTO archived_agents VALUES (?, ?, ?)", (b"\x01blob", 1.0, "op"))
    db.execute("INSERT INTO commands VALUES (?, ?, ?, ?, ?, ?)", ("c1", "retry", b"\xff", 3, "noon", b"\xfe"))
    db.execute("INSERT INTO commands VALUES (?, ?, ?, ?, ?, ?)", ("c2", "format-disk", "{}", "op", 1.0, None))
    db.execute("INSERT INTO attestations (at, pid, host, version, mode, event, durability, journal_mode, synchronous, "
               "busy_timeout_ms, foreign_keys) VALUES ('noon', 'abc', 5, X'ff', 'daemon', 'start', 'full', 'wal', "
               "'FULL', 'x', 'y')")
    db.close()
    cli.good, cli.outside = good, outside
    return cli


PLANTED = 12        # rows planted above that this build cannot read


def test_rows_of_the_new_tables_are_named_and_left_out_by_every_verb(planted, tmp_path):
    """Each verb names the rows it cannot read (one line each, never a traceback) and goes on:
    no path such a row holds becomes an agent, a ping or a place relay looks."""
    r = planted("status", "--json", ok=False)
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["sheds"] == {"body_size": 0, "per_pair_rate": 0, "queue_limit": 0,
                                                 "recipient_archived": 0}
    assert doc["durability"]["attested"] is False and "attestations row" in r.stderr
    assert "7 1" not in planted("status", ok=False).stdout
    for args in (["agents"], ["agents", "--json"], ["queues"], ["queues", "--json"]):
        r = planted(*args)
        assert "../../" not in r.stdout and "\\x01" not in r.stdout and "bin" not in r.stdout, args
        assert "pings row" in r.stderr and "archived_agents row" in r.stderr and "sheds row" in r.stderr, args
    agents = {a["agent"]: a for a in json.loads(planted("agents", "--json").stdout)}
    assert set(agents) == {"Ann", "Ben", "Cy", "System"} and agents["Cy"]["archived"]
    assert agents["Ben"]["ping"]["state"] == "waiting"
    queues = json.loads(planted("queues", "--json").stdout)
    assert {a["agent"] for a in queues["agents"]} == {"Ann", "Ben", "Cy", "System"}
    r = planted("show", planted.good, "--json")         # shown as stored, each marked and named
    sheds = json.loads(r.stdout)["sheds"]
    assert len(sheds) == 4 and r.stderr.count("sheds row") == 4
    assert {s["recipient"] for s in sheds} >= {"(unreadable: b'\\xff\\x00bin')", "../../outside"}
    assert "sheds row" in planted("show", planted.good).stderr
    for args in (["doctor"], ["doctor", "--json"], ["verify"]):
        r = planted(*args, ok=False)
        assert r.exit_code == 1 and r.output.count("cannot read") >= PLANTED, args
    assert json.loads(planted("doctor", "--json", ok=False).stdout)["unreadable"] == PLANTED
    r = planted("report", "--html", str(tmp_path / "report.html"))
    assert "sheds row" in r.stderr and "Rows this relay cannot read" in (tmp_path / "report.html").read_text()
    planted("audit", "--status", "shed")
    planted("tail", "-n", "50")
    # The operator's commands and the daemon go on beside them.
    planted("ping", "Ann")
    planted("archive-agent", "--undo", "Cy")
    planted("send", "--from", "Ann", "--to", "Cy", "after the damage")
    assert "relayed 1 message(s)" in planted("run", "--once", "-q").stdout
    assert list(planted.outside.rglob("*")) == [planted.outside / "new"]


def test_a_command_id_whose_record_cannot_be_read_is_refused_in_one_line(planted):
    for cid, args in (("c1", ["retry", "--failed"]), ("c2", ["expire", mid(9)])):
        r = planted(*args, "--command-id", cid, ok=False)
        assert r.exit_code == 1 and f"commands row '{cid}'" in r.stderr and "give this command a new id" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_archiving_an_agent_whose_archived_row_cannot_be_read_archives_it(planted):
    """An archived_agents row this build cannot read is left out, so its agent counts as not
    archived; `relay archive-agent` then said `archived` while its insert met that row and did
    nothing: the agent stayed unarchived. The command now replaces the unreadable row."""
    db = sqlite3.connect(planted.state / "ledger.sqlite", isolation_level=None)
    db.execute("INSERT INTO archived_agents VALUES ('Ben', 'noon', 'op')")
    db.close()
    assert "Ben: archived;" in planted("archive-agent", "Ben").stdout
    agents = {a["agent"]: a for a in json.loads(planted("agents", "--json").stdout)}
    assert agents["Ben"]["archived"] and "archived_agents row 'Ben'" not in planted("agents").stderr


def test_the_sql_that_leaves_sheds_out_refuses_exactly_what_the_checks_refuse(project):
    """shed_counts() and shed_pairs() leave out in SQL the rows bad_rows() names in Python: the
    two must agree row for row, or a count would hold a row no verb names (or lose a good one)."""
    from relay.ledger.rows import unreadable
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nx")
    relay.drain()
    good = relay.history.audit().fetchone()["id"]
    db = sqlite3.connect(project.state / "ledger.sqlite", isolation_level=None)     # foreign keys off
    base = {"message_id": good, "recipient": "Ben", "sender": "Ann", "reason": "queue_limit", "limit_value": 1,
            "observed": 2.5, "at": 1.0, "released_at": None}
    values = {"message_id": ["short", b"x" * 26, 7], "recipient": ["*", "../x", "", "a" * 65, "Ben\n", b"Ben", 5],
              "sender": ["*", "?", "-x", b"Ann"], "reason": ["7", "QUEUE_LIMIT", b"body_size", 7, "body_size"],
              "limit_value": ["lots", b"1", None], "observed": ["x", None, 3], "at": ["noon", b"1", 2],
              "released_at": ["later", 1.5]}
    n = 0
    for column, vs in values.items():
        for v in vs:
            n += 1
            db.execute("INSERT INTO sheds VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       list({**base, "recipient": f"R{n}", column: v}.values()))
    db.close()
    rows = relay.history.db.execute("SELECT * FROM sheds").fetchall()
    refused = sum(unreadable(r, "sheds") is not None for r in rows)
    assert refused == len(list(relay.history.bad_rows(tables=("sheds",))))
    assert sum(relay.history.shed_counts().values()) == len(rows) - refused
    assert sum(n for by in relay.history.shed_pairs().values() for n in by.values()) == len(rows) - refused
    assert 0 < refused < len(rows)


@pytest.fixture
def fresh(cli):
    cli("init")
    return cli


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


GOOD_ID = "01" + "Z" * 24
HEX = "0123456789abcdef" * 4


@pytest.mark.parametrize("table, column, good, bad", [
    ("messages", "id", [GOOD_ID], [GOOD_ID[:-1], GOOD_ID + "0", GOOD_ID.lower(), None, 7]),
    ("messages", "sender", ["Ann", "?"], ["a b", "", None, 7, "??"]),
    ("messages", "name", ["a1.md", "..x"], ["", ".", "..", "a/b", "a\0b", None, 7]),
    ("messages", "spooled", [0, 1], [2, -1, None, "1"]),
    ("messages", "retries", [0, 5], [-1, None, "1", 1.5]),
    ("messages", "size", [None, 0], [-1, "3"]),
    ("messages", "recipients", [None, '["Ben"]', "[]"], ['["Ben", 1]', '{"to": "Ben"}', '"Ben"', "[", 7]),
    ("messages", "headers", [None, "{}", '{"X": "1"}'], ["[]", "{", 7]),
    ("messages", "sha256", [None, HEX], [HEX[:-1], HEX.upper(), HEX + "0", 7]),
    ("messages", "discovered_at", [0, -62135596800, 253402300799.5], [None, "0", -62135596801, 253402300800]),
    ("messages", "sent_at", [None, 1.5], ["now", 253402300800, -62135596801]),
    ("messages", "subject", [None, "hi"], [7, b"hi"]),
    ("messages", "archive_path", [None, "archive/Ann/x"], ["archive", "failed/Ann/x", "../archive/x", 7]),
    ("messages", "failed_path", [None, "failed/Ann/x"], ["failed", "archive/Ann/x", 7]),
    ("messages", "max_retries", [None, 0], [-1, "2"]),
    ("events", "sender", [None, "Ann"], ["a b", 7]),
    ("events", "message_id", [None, GOOD_ID], ["x", 7]),
    ("sheds", "recipient", ["*", "Ben"], ["**", "a b", None]),
    ("sheds", "reason", ["body_size", "per_pair_rate", "queue_limit", "recipient_archived"], ["other", None, 7]),
    ("sheds", "limit_value", [None, 3, 2.5], ["3"]),
    ("commands", "id", ["a", "x" * 200, "a b"], ["", "x" * 201, "a\nb", "a\x7fb", "a\x1fb", None, 7]),
    ("commands", "verb", ["retry", "expire", "ping", "archive-agent"], ["release", None]),
    ("commands", "arguments", ["{}"], ["[]", None, "{"]),
    ("attestations", "foreign_keys", [0, 1], [2, None]),
    ("attestations", "mode", ["daemon", "once"], ["both"]),
    ("attestations", "synchronous", ["OFF", "NORMAL", "FULL", "EXTRA", "?"], ["off", None]),
    ("agent_registry", "state", ["active", "inactive"], ["gone", None]),
    ("agent_registry", "spawned_by", [None, "Ann"], ["a b"]),
    ("agent_registry", "spawn_id", [None, GOOD_ID], ["x"]),
    ("team_state", "key", ["a", "A1._:/-x", "a" * 128], ["", "-a", "a" * 129, "a b", None]),
    ("team_state", "value", [None, ""], [7]),
    ("team_state", "version", [0, 3], [-1, None, "1"]),
    ("team_state", "updated_by", ["Ann"], [None, 7]),
    ("checkpoints", "head", [HEX], [HEX[:-1], HEX.upper(), None, 7]),
    ("bounces", "recipients", ['["Ben"]', "[]"], [None, '["Ben", 2]', "{}"]),
])
def test_each_column_check_takes_each_value_it_allows_and_names_each_other(table, column, good, bad):
    for v in good:
        assert unreadable({column: v}, table) is None, v
    for v in bad:
        assert unreadable({column: v}, table) == (column, v), v


def test_a_needed_column_that_is_null_is_unreadable_and_only_a_needed_one():
    from relay.ledger.rows import every_unreadable
    row = {"sent_at": None, "subject": None, "retries": -1}
    assert unreadable({"sent_at": None, "subject": None}, need=("subject",)) == ("subject", None)
    assert unreadable({"sent_at": None, "subject": None}, need=("kind",)) is None
    assert unreadable({"sent_at": None, "retries": -1}, need=("kind",)) == ("retries", -1)
    assert every_unreadable(row) == [("retries", -1)]
    assert every_unreadable(row, need=("subject",)) == [("subject", None), ("retries", -1)]
    assert every_unreadable({"sent_at": 1.0, "retries": 0}, need=("subject",)) == []
    bad = BadRow.of(row, need=("subject",))
    assert bad.columns == (("subject", None), ("retries", -1))


def test_a_needed_column_holding_a_value_and_a_column_no_check_knows_are_readable():
    from relay.ledger.rows import every_unreadable
    assert unreadable({"subject": "hi", "origin": object()}, need=("subject",)) is None
    assert unreadable({"origin": None}, need=("subject",)) is None
    assert every_unreadable({"subject": "hi", "origin": object()}, need=("subject",)) == []
    assert every_unreadable({"subject": "hi", "kind": None}, need=("subject", "kind")) == [("kind", None)]
