"""A hostile review of flow control and the operator's view: what the other tests missed. Each
test is one defect found by attacking relay as an operator, as an agent and as kill -9 would."""
import json
import sqlite3

import pytest


def mid(n):
    return f"01{'Y' * 23}{n}"


# -- rows this build cannot read in the tables flow control and the operator's commands added --

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


# -- what an agent can make flow control record ---------------------------------------------

def test_a_too_large_message_records_sheds_only_for_agents_relay_knows(project, caplog):
    """body_size sheds were recorded for every name as written, before the names were checked:
    an agent could make relay record sheds to paths, to names holding terminal escapes (written
    raw into the daemon's log) and to thousands of made-up names per file, each one an agent in
    `relay queues`. Only known agents (and System) are shed; the rest is `*`."""
    relay = project.relay(max_body_bytes="10")
    names = ", ".join(["../../etc", "Ben", "b\x1b[31mred", "Nobody", "System", "Ben"] + [f"x{i}" for i in range(3000)])
    project.drop("Ann", "m1", f"TO: {names}\n\n{'y' * 20}")
    project.drop("Ann", "m2", f"TO: ../../etc, Nobody\n\n{'y' * 20}")
    with caplog.at_level("WARNING", logger="relay"):
        total = relay.drain()
    assert total.failed == 2 and total.shed == 3
    got = {(r["message_id"], r["recipient"]) for r in relay.history.db.execute("SELECT * FROM sheds")}
    by_name = {name: mid for mid, name in got}
    assert set(by_name) == {"Ben", "System", "*"} and len(got) == 3
    assert "\x1b" not in caplog.text and "../../etc" not in caplog.text


def drop_at(project, sender, name, text, at):
    import os
    path = project.drop(sender, name, text)
    os.utime(path, (at - 10, at - 10))      # settled, and not in the future of a clock set back
    return path


def test_a_clock_set_back_does_not_hold_a_pair_past_its_window(project, clock):
    """Deliveries recorded before the clock was set back (NTP, a VM restored) lie in its future:
    the window kept them until the clock caught up again, so one sender was shed for a
    recipient for as long as the clock had jumped (an hour here), not for pair_window. The
    running relay counts them from the jump on; a start (run --once) cannot place them and
    leaves them out of its window."""
    relay = project.relay(pair_rate="2", pair_window="60s")
    relay.recover()
    for i in range(2):
        drop_at(project, "Ann", f"m{i}", "TO: Ben\n\nx", clock.now)
        relay.hint("file", "Ann", f"m{i}")
        assert relay.step().archived == 1
    clock.advance(-3600)
    drop_at(project, "Ann", "m2", "TO: Ben\n\nstill inside the window", clock.now)
    relay.hint("file", "Ann", "m2")
    assert relay.step().shed == 1                    # the window still holds: no one escapes it
    clock.advance(71)                                # m3 is written (at - 10) a window after the jump
    drop_at(project, "Ann", "m3", "TO: Ben\n\nafter the window", clock.now)
    relay.hint("file", "Ann", "m3")
    counts = relay.step()
    assert (counts.archived, counts.shed) == (1, 0)
    clock.advance(-3600)                             # again, and this time relay starts afresh
    relay.close()
    project.relays.remove(relay)
    relay = project.relay(pair_rate="2", pair_window="60s")
    for i in (4, 5, 6):
        drop_at(project, "Ann", f"m{i}", "TO: Ben\n\nx", clock.now)
        clock.advance(1)
    total = relay.drain()
    assert (total.archived, total.shed) == (2, 1)    # the window counts from the start


def test_queue_limit_counts_envelopes_not_what_was_planted_in_new(project, cli):
    """queue_limit counted every entry of new/ not starting with '.': a directory, a link, a FIFO
    or a note planted in a recipient's new/ made relay shed everyone's messages to it. Only
    envelopes count (regular files named <id>.json), in the flow's decision and in relay queues."""
    import os
    relay = project.relay(queue_limit="3")
    drop_at(project, "Ann", "m0", "TO: Ben\n\nthe one unread envelope", project.clock.now)
    assert relay.drain().archived == 1
    new = project.state / "inbox/Ben/new"
    (new / "junk").mkdir()
    (new / "01ZZZZZZZZZZZZZZZZZZZZZZZZ.json").symlink_to("/etc/passwd")
    os.mkfifo(new / "fifo.json")
    (new / "notes.txt").write_text("planted")
    for i in (1, 2):
        drop_at(project, "Cy", f"m{i}", "TO: Ben\n\nfrom someone else", project.clock.now)
        project.clock.advance(1)
    total = relay.drain()
    assert (total.archived, total.shed) == (2, 0)
    drop_at(project, "Cy", "m3", "TO: Ben\n\nnow the queue is full", project.clock.now)
    assert relay.drain().shed == 1                  # three envelopes: the limit still holds
    [ben] = [a for a in json.loads(cli("queues", "--json").stdout)["agents"] if a["agent"] == "Ben"]
    assert ben["unread"] == 3


# -- kill -9 -------------------------------------------------------------------------------

class Killed(BaseException):
    """The process dying at this instant (nothing after it runs, no handler catches it)."""


def test_the_claim_budget_quarantines_the_message_that_stops_relay_not_its_batch(project):
    """Every row of a batch a crash interrupted counted the interruption, so a message that
    kills relay took the whole batch into failed/ with it after max_retries crashes: innocent
    messages quarantined as 'it may be what stops relay'. A message interrupted before is now
    claimed alone, so the interruptions land on the one that causes them."""
    for n in range(4):
        project.drop("Ann", f"m{n}", f"TO: Ben\n\nmessage {n}")
    project.drop("Ann", "poison", "TO: Ben\n\nthe one that kills relay")
    for run in range(6):
        relay = project.relay(max_retries="3")
        real = relay.ledger.record

        def record(now, works, *args, real=real, **kwargs):
            if any(w.name == "poison" for w in works):
                raise Killed()
            return real(now, works, *args, **kwargs)
        relay.ledger.record = record
        try:
            relay.drain()
        except Killed:
            pass
        relay.close()
        project.relays.remove(relay)
    relay = project.relay(max_retries="3")
    rows = {r["name"]: r for r in relay.history.audit()}
    assert rows["poison"]["status"] == "failed" and "relay stopped while handling it 3 times" in rows["poison"]["error"]
    assert {n: rows[f"m{n}"]["status"] for n in range(4)} == dict.fromkeys(range(4), "archived")
    got = sorted(m["body"] for m in project.inbox("Ben"))     # (the poison's envelope made it before each crash)
    assert [b for b in got if b.startswith("message")] == [f"message {n}" for n in range(4)]


def killed_at(obj, name, when=lambda *a, **k: True):
    """obj.name raises Killed (the process dies there) the first time `when(*args)` holds."""
    real = getattr(obj, name)

    def dying(*args, **kwargs):
        if when(*args, **kwargs):
            setattr(obj, name, real)
            raise Killed()
        return real(*args, **kwargs)
    setattr(obj, name, dying)


def pending_in_spool(project):
    """A message relay has taken custody of (its file in the spool), pending after a full disk."""
    import errno

    from conftest import failing_create
    relay = project.relay()
    switch = failing_create(relay, OSError(errno.ENOSPC, "No space left on device"))
    project.drop("Ann", "m", "TO: Ben\n\nwaiting")
    assert relay.drain().retried == 1
    switch["on"] = False
    [row] = relay.history.audit()
    assert row["status"] == "pending" and row["spooled"]
    return relay, row["id"]


def test_an_expire_killed_after_its_record_finishes_when_run_again(project):
    """relay expire records the expiry, then moves the file to failed/. Killed in between, the
    file stayed in the spool with no failed_path: run again, expire said `expired already` and
    left it there, relay retry said `its file is gone`, and no relay run ever took it up again."""
    from relay.operator.doctor import expire, retry
    relay, mid = pending_in_spool(project)
    killed_at(relay.layout.fs, "rename")
    with pytest.raises(Killed):
        expire(relay.ledger, relay.layout, mid)
    result = expire(relay.ledger, relay.layout, mid)
    row = relay.history.get(mid)
    assert row["status"] == "failed" and row["failed_path"] and (project.state / row["failed_path"]).read_text() \
        == "TO: Ben\n\nwaiting"
    assert not list((project.state / "spool").rglob("*m")) and result.code == 0
    assert len([e for e in relay.history.events(mid) if e["event"] == "expired"]) == 1
    assert retry(relay.ledger, relay.layout, [mid]).code == 0
    assert relay.drain().archived == 1 and [m["body"] for m in project.inbox("Ben")] == ["waiting"]


def test_a_retry_killed_after_its_move_finishes_when_run_again(project):
    """relay retry moves the file back to the spool, then records the message pending. Killed in
    between, run again it said `its file is gone; write the message again`: the file was in the
    spool, under a failed row no relay run takes up. Run again it now finishes."""
    from relay.operator.doctor import retry
    relay = project.relay()
    project.drop("Ann", "m", "TO: Nobody\n\nto someone not there yet")
    assert relay.drain().failed == 1
    [row] = relay.history.audit(sender="Ann")
    (project.state / "inbox/Nobody/new").mkdir(parents=True)
    (project.state / "inbox/Nobody/tmp").mkdir()
    (project.state / "inbox/Nobody/cur").mkdir()
    killed_at(relay.ledger, "requeue")
    with pytest.raises(Killed):
        retry(relay.ledger, relay.layout, [row["id"]])
    result = retry(relay.ledger, relay.layout, [row["id"]])
    assert (result.code, result.errors) == (0, []), result.errors
    assert relay.drain().archived == 1 and [m["body"] for m in project.inbox("Nobody")] == ["to someone not there yet"]
    assert not list((project.state / "failed").rglob("*.json"))       # its old report went with it


# -- the operator's commands -----------------------------------------------------------------

def test_the_same_command_id_run_twice_at_once_runs_once(project):
    """Two processes given the same --command-id at the same time both ran the command: the
    second found the first's reservation unfinished, took it for a killed run and ran again
    (two pings in the inbox), and the last to finish overwrote the recorded result. While one
    runs a command id, another process waits for it (here: not at all) and is refused."""
    from relay.operator import commands
    from relay.operator import roster
    from relay.errors import RelayError
    from relay.ledger.ledger import Ledger
    relay = project.relay()
    other = Ledger(relay.layout.ledger)
    seen = []

    def first():
        with pytest.raises(RelayError, match="is being run by another process"):
            commands.run(other, "ping", {"agent": "Ben"}, "p-1", second, "operator:b",
                         lock=relay.layout.command_lock, wait=0)
        return roster.ping(relay.ledger, relay.layout, "Ben", "operator:a")

    def second():
        seen.append("ran")
        return roster.ping(other, relay.layout, "Ben", "operator:b")
    try:
        result = commands.run(relay.ledger, "ping", {"agent": "Ben"}, "p-1", first, "operator:a",
                              lock=relay.layout.command_lock)
        assert result.code == 0 and not result.existing and seen == []
        again = commands.run(other, "ping", {"agent": "Ben"}, "p-1", second, "operator:b",
                             lock=relay.layout.command_lock)
        assert again.existing and again.lines[1:] == result.lines and seen == []
    finally:
        other.close()
    assert len(list((project.state / "inbox/Ben/new").iterdir())) == 1


# -- the operator's set-up verbs --------------------------------------------------------------

def test_relay_config_and_its_warnings_write_no_control_character_to_the_terminal(cli, monkeypatch):
    """relay config printed each value as written: a C1 escape or a bidi override in relay.toml
    (which agents can write) or in the name of an environment variable reached the operator's
    terminal as it was (an 8-bit CSI clears the screen, U+202E turns the line around)."""
    cli("init", "--agent", "Ann")
    (cli.state / "relay.toml").write_text('on_deliver = "echo \\u009b2Jcleared \\u202eevil"\n')
    monkeypatch.setenv("RELAY_X\u202eY", "1")
    r = cli("config")
    assert "cleared" in r.stdout and "evil" in r.stdout and "RELAY_X" in r.stderr
    for c in ("\x9b", "\u202e"):
        assert c not in r.stdout and c not in r.stderr
    assert json.loads(cli("config", "--json").stdout)["values"]["on_deliver"]["value"] == "echo \x9b2Jcleared \u202eevil"


def test_a_systemd_unit_for_a_path_ending_in_a_space_names_that_path(tmp_path):
    """systemd strips the white space that ends a value: `WorkingDirectory=/p/my project ` named
    /p/my project, another directory (or none: the unit failed to start). No line of the unit
    may rely on white space at its end; ExecStart quotes the path and carries it whole."""
    from relay.operator import units
    root = tmp_path / "my project "
    root.mkdir()
    unit = units.systemd(["/usr/bin/relay"], root, user=True)
    assert all(line == line.rstrip() for line in unit.splitlines()), unit
    [start] = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert f'--root "{root}" run' in start


def test_a_reload_that_changes_the_federation_keeps_the_running_one_and_logs_no_password(project, caplog):
    """SIGHUP with a [federation] section added or changed: the log line naming what needs a
    restart printed the new Federation whole, its URL's password with it, and said the daemon
    ran "with" the new one, which the relay's config then held while the link kept the old."""
    from relay.service import Daemon
    project.relay().close()
    project.relays.clear()
    cfg = project.config(agents=["Ann", "Ben"])
    new = project.config(agents=["Ann", "Ben"], federation={"url": "redis://bob:s3cret@redis.example:6379/0",
                                                            "team": "t", "node": "n1"})
    daemon = Daemon(cfg, load=lambda: new)
    try:
        with caplog.at_level("INFO", logger="relay"):
            daemon.do_reload()
    finally:
        daemon.relay.close()
    assert daemon.relay.config.federation is None and daemon.cfg.federation is None
    assert "s3cret" not in caplog.text
    assert "federation changed (url redis://bob:***@redis.example:6379/0, team t, node n1, running with none" \
        in caplog.text


def test_per_pair_rate_sheds_the_latest_sent_not_whichever_was_listed_last(project, clock):
    """Files found in one scan got their ids, and so their claim order, in the order the
    directory listed them: with Ann over pair_rate, relay delivered her later messages to Bob
    and shed earlier ones (msg 2 shed, msg 3 delivered: a conversation with a hole). The files
    of a scan are taken in the order they were written (their mtime), so the latest are shed."""
    import os
    relay = project.relay(pair_rate="5", pair_window="10m")
    for n in range(10):
        path = project.drop("Ann", f"z{9 - n}-{n * 7919 % 10}", f"TO: Ben\n\nmessage {n}")
        os.utime(path, (clock.now - 100 + n, clock.now - 100 + n))
    total = relay.drain()
    assert (total.archived, total.shed) == (5, 5)
    assert sorted(m["body"] for m in project.inbox("Ben")) == [f"message {n}" for n in range(5)]


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


def test_a_federation_variable_or_value_relay_cannot_use_stops_no_agent(cli, monkeypatch):
    """RELAY_FEDERATION_<anything> was taken as a key of [federation]: one that names none
    (RELAY_FEDERATION_PASSWORD set for another tool) stopped every verb, an agent's relay send
    too, as did a bad [federation] value, which stops only the daemon anywhere else."""
    cli("init", "--agent", "Ann", "--agent", "Ben")
    monkeypatch.setenv("RELAY_FEDERATION_PASSWORD", "x")
    r = cli("status", ok=False)
    assert r.exit_code == 3 and "RELAY_FEDERATION_PASSWORD" in r.stderr and "names no relay configuration" in r.stderr
    monkeypatch.delenv("RELAY_FEDERATION_PASSWORD")
    (cli.state / "relay.toml").write_text('[federation]\nurl = "http://nowhere"\nteam = "t"\n')
    r = cli("send", "--from", "Ann", "--to", "Ben", "still sent")
    assert "bad value for 'federation'" in r.stderr and "ignored" in r.stderr
    assert len(list((cli.state / "outbox/Ann").iterdir())) == 1
    r = cli("run", "--once", ok=False)
    assert r.exit_code == 1 and "bad value for 'federation'" in r.stderr


def test_a_step_that_fails_on_the_ledger_does_not_spend_the_claim_budget(project):
    """After a failed step of the daemon's loop (the ledger locked past busy_timeout, its disk
    full for a moment) the loop recovers what the step had claimed, and that recovery counted an
    interruption, as if relay had been killed: three such moments quarantined the batch with
    'relay stopped while handling it 3 times', in seconds, where a transient failure is retried
    for retry_period. Only a stopped relay (recovery at start) spends the claim budget."""
    relay = project.relay(max_retries="3")
    relay.step_pause = 0.0
    relay.recover()
    project.drop("Ann", "m", "TO: Ben\n\nx")
    real = relay.ledger.record
    fails = {"left": 4}

    def record(*args, **kwargs):
        if fails["left"]:
            fails["left"] -= 1
            raise sqlite3.OperationalError("database is locked")
        return real(*args, **kwargs)
    relay.ledger.record = record
    for _ in range(4):
        relay.hint("rescan")
        relay.guarded_step()
    relay.hint("rescan")
    relay.guarded_step()
    [row] = relay.history.audit()
    assert (row["status"], row["interrupted"]) == ("archived", 0)
    assert [m["body"] for m in project.inbox("Ben")] == ["x"]


def test_json_log_lines_of_sheds_and_recoveries_carry_the_message_fields(cli):
    """The shed warning (for a message delivered to others the only line about its shed) and
    the recovery's 'registered again' lines carried the message id, sender and recipients only
    in their text: a log pipeline selecting event == "shed" or one id found nothing."""
    from click.testing import CliRunner

    from relay.cli import main
    cli("init", "--agent", "Ann", "--agent", "Ben", "--agent", "Cy")
    (cli.state / "relay.toml").write_text("pair_rate = 1\n")
    cli("send", "--from", "Ann", "--to", "Ben", "one")
    cli("send", "--from", "Ann", "--to", "Ben,Cy", "two")
    orphan = cli.state / "spool/Cy/01ZZZZZZZZZZZZZZZZZZZZZZZ7--lost"
    orphan.parent.mkdir(parents=True)
    orphan.write_text("TO: Ben\n\nfound in the spool")
    r = CliRunner().invoke(main, ["--root", str(cli.root), "run", "--once", "--log-format", "json"])
    lines = [json.loads(line) for line in r.stderr.strip().splitlines()]
    [shed] = [d for d in lines if "shed for" in d["msg"] and d["level"] == "warning"]
    assert shed["event"] == "shed" and shed["from"] == "Ann" and shed["to"] == ["Ben"] and shed["id"] in shed["msg"]
    [found] = [d for d in lines if "registered again" in d["msg"]]
    assert found["event"] == "recovered" and found["id"] == "01ZZZZZZZZZZZZZZZZZZZZZZZ7" and found["from"] == "Cy"


# -- doctor and verify ----------------------------------------------------------------------

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


def test_a_quarantine_cut_short_leaves_no_report_of_a_failure_that_did_not_stand(project, clock):
    """A message shed for every recipient is moved to failed/ and its .error.json written before
    the batch is recorded. Killed in between, recovery moved the file back to the spool but left
    the report: the message was then delivered (its window had passed), while failed/ still told
    the sender it was shed, and doctor named the report as a file no record knows."""
    from relay.operator.doctor import doctor
    relay = project.relay(pair_rate="1")
    drop_at(project, "Ann", "m1", "TO: Ben\n\none", clock.now)
    assert relay.drain().archived == 1
    drop_at(project, "Ann", "m2", "TO: Ben\n\ntwo", clock.now)
    killed_at(relay.ledger, "record")
    with pytest.raises(Killed):
        relay.drain()
    assert len(project.files("failed")) == 2            # the file and its report, not yet recorded
    relay.close()
    project.relays.remove(relay)
    clock.advance(700)
    relay = project.relay(pair_rate="1")
    assert relay.drain().archived == 1 and len(project.inbox("Ben")) == 2
    assert project.files("failed") == [] and doctor(relay.history, relay.layout, None)[0] == []
