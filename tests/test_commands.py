"""The operator's commands, each twice with and without --command-id: retry, expire, ping,
archive-agent (and its undo); retry --failed never revives what an operator expired; an
archived agent in the pipeline; sheds in status, audit, show, the report and agents."""
import json
import os
import subprocess
import sys

import pytest

from relay.ledger.history import History
from relay.ledger.ledger import Ledger
from test_claim_budget import Killed
from test_daemon_e2e import daemon, rename_in, wait_for  # noqa: F401  (daemon: the fixture)


def drop(cli, sender, name, text):
    box = cli.state / "outbox" / sender
    box.mkdir(parents=True, exist_ok=True)
    (box / f".{name}.tmp").write_text(text)
    os.rename(box / f".{name}.tmp", box / name)
    os.utime(box / name, (1_700_000_000, 1_700_000_000))


def audit(cli, *args):
    return json.loads(cli("audit", "--json", *args).output)


def by_name(cli):
    return {r["source_path"].rsplit("/", 1)[1]: r for r in audit(cli)}


def events(cli, mid, kind):
    return [e for e in json.loads(cli("show", mid, "--json").output)["events"] if e["event"] == kind]


def commands(cli):
    with History(Ledger(cli.state / "ledger.sqlite", readonly=True)) as h:
        return {r["id"]: dict(r) for r in h.commands()}


@pytest.fixture
def team(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben", "--agent", "Cy")
    return cli


def test_expire_twice_without_and_with_an_id(team):
    cli = team
    drop(cli, "Ann", "bad", "TO: Zed\n\nnobody")
    cli("run", "--once", "-q")
    mid = by_name(cli)["bad"]["id"]
    assert f"{mid}: expired" in cli("expire", mid).output
    again = cli("expire", mid)
    assert "expired already; nothing changed" in again.output
    assert len(events(cli, mid, "expired")) == 1
    drop(cli, "Ann", "bad2", "TO: Zed\n\nnobody")
    cli("run", "--once", "-q")
    other = by_name(cli)["bad2"]["id"]
    first = cli("expire", other, "--command-id", "op-1")
    second = cli("expire", other, "--command-id", "op-1")
    assert "existing" in second.output and first.output.strip() in second.output
    assert len(events(cli, other, "expired")) == 1
    r = cli("expire", mid, "--command-id", "op-1", ok=False)        # the same id for another command
    assert r.exit_code == 1 and "was first used for `relay expire`" in r.output
    recorded = commands(cli)
    assert recorded["op-1"]["verb"] == "expire" and json.loads(recorded["op-1"]["arguments"]) == {"id": other}
    assert json.loads(recorded["op-1"]["result"])["code"] == 0 and recorded["op-1"]["actor"].startswith("operator")
    assert len(recorded) == 3       # the two runs without an id are recorded under ids of their own


def test_retry_twice_without_and_with_an_id(team):
    cli = team
    drop(cli, "Ann", "bad", "TO: Zed\n\nnobody")
    cli("run", "--once", "-q")
    mid = by_name(cli)["bad"]["id"]
    cli("init", "--agent", "Zed")
    assert f"{mid}: back to pending" in cli("retry", mid).output
    again = cli("retry", mid)                       # pending: says so, exit 0, nothing changes
    assert f"{mid}: is pending already; nothing to retry" in again.output
    assert len(events(cli, mid, "retry")) == 1
    cli("run", "--once", "-q")
    drop(cli, "Ann", "bad2", "TO: Yan\n\nnobody")
    cli("run", "--once", "-q")
    other = by_name(cli)["bad2"]["id"]
    cli("init", "--agent", "Yan")
    first = cli("retry", other, "--command-id", "r-1", "--json")
    second = cli("retry", other, "--command-id", "r-1", "--json")
    a, b = json.loads(first.output), json.loads(second.output)
    assert a["existing"] is False and b["existing"] is True and b["command_id"] == "r-1"
    assert b["lines"][1:] == a["lines"] == [f"{other}: back to pending"]
    assert len(events(cli, other, "retry")) == 1


def test_retry_failed_never_revives_an_expired_message(team):
    cli = team
    drop(cli, "Ann", "a", "TO: Zed\n\none")
    drop(cli, "Ann", "b", "TO: Zed\n\ntwo")
    cli("run", "--once", "-q")
    a, b = by_name(cli)["a"]["id"], by_name(cli)["b"]["id"]
    cli("expire", a)
    out = cli("retry", "--failed").output
    assert f"{b}: back to pending" in out and a not in out
    assert "1 message(s) an operator expired stay failed" in out
    assert by_name(cli)["a"]["status"] == "failed" and by_name(cli)["b"]["status"] == "pending"
    assert "an operator had expired it" in cli("retry", a).output       # by name it is revived


def test_ping_twice_without_and_with_an_id_and_its_read_time(team):
    cli = team
    first = cli("ping", "Ben").output
    assert first.startswith("pinged Ben: inbox/Ben/new/")
    cli("ping", "Ben")
    assert len(list((cli.state / "inbox/Ben/new").iterdir())) == 2       # a repeat without an id pings again
    cli("ping", "Cy", "--command-id", "p-1")
    assert "existing" in cli("ping", "Cy", "--command-id", "p-1").output
    [env] = [json.loads(p.read_text()) for p in (cli.state / "inbox/Cy/new").iterdir()]
    assert env["from"] == "System" and env["kind"] == "ping" and env["to"] == ["Cy"]
    ping = {r["agent"]: r["ping"] for r in json.loads(cli("agents", "--json").output)}["Cy"]
    assert ping["id"] == env["id"] and ping["state"] == "waiting" and ping["age_s"] >= 0
    cli("inbox", "Cy", "--ack")                     # Cy reads it
    [taken] = (cli.state / "inbox/Cy/cur").iterdir()
    sent = History(Ledger(cli.state / "ledger.sqlite", readonly=True)).last_pings()["Cy"][1]
    rows = {r["agent"]: r for r in json.loads(cli("queues", "--json").output)["agents"]}
    assert rows["Cy"]["ping"]["state"] == "read"
    assert rows["Cy"]["ping"]["read_after_s"] == pytest.approx(max(0.0, taken.stat().st_ctime - sent), abs=0.002)
    assert "read in" in cli("agents").output
    os.unlink(taken)
    assert {r["agent"]: r for r in json.loads(cli("queues", "--json").output)["agents"]}["Cy"]["ping"]["state"] == "gone"
    for bad, why in (("Nobody", "no agent 'Nobody'"), ("System", "relay's own inbox"), ("../x", "invalid agent name")):
        r = cli("ping", bad, ok=False)
        assert r.exit_code == 1 and why in r.output


def test_ping_never_writes_through_a_planted_link(team, tmp_path):
    cli = team
    outside = tmp_path / "outside"
    outside.mkdir()
    new = cli.state / "inbox/Ben/new"
    new.rmdir()
    new.symlink_to(outside)
    r = cli("ping", "Ben", ok=False)
    assert r.exit_code == 1 and "could not put a ping" in r.output and len(r.output.strip().splitlines()) == 1
    assert list(outside.iterdir()) == [] and list((cli.state / "inbox/Ben/tmp").iterdir()) == []


def test_archive_agent_twice_its_undo_and_the_pipeline(team):
    cli = team
    drop(cli, "Ben", "waiting", "TO: Ann\n\nfrom Ben, waiting in its outbox")
    assert "Ben: archived" in cli("archive-agent", "Ben").output
    assert "archived already" in cli("archive-agent", "Ben").output
    assert "existing" not in cli("archive-agent", "Ben", "--command-id", "a-1").output
    assert "existing" in cli("archive-agent", "Ben", "--command-id", "a-1").output
    drop(cli, "Ann", "to-both", "TO: Ben, Cy\n\nfor Ben and Cy")
    drop(cli, "Ann", "to-ben", "TO: Ben\n\nfor Ben only")
    drop(cli, "Ann", "to-all", "TO: *\n\nfor everyone")
    cli("run", "--once", "-q")
    rows = by_name(cli)
    assert rows["waiting"]["status"] == "failed" and "agent Ben is archived" in rows["waiting"]["error"]
    assert (cli.state / rows["waiting"]["failed_path"]).read_text().startswith("TO: Ann")
    assert rows["to-both"]["status"] == "archived" and rows["to-ben"]["status"] == "failed"
    assert "recipient_archived" in rows["to-ben"]["error"]
    assert rows["to-all"]["to"] == ["Cy"] and rows["to-all"]["status"] == "archived"      # left out of a broadcast
    assert list((cli.state / "inbox/Ben/new").iterdir()) == []
    assert sorted(json.loads(p.read_text())["body"] for p in (cli.state / "inbox/Cy/new").iterdir()) == [
        "for Ben and Cy", "for everyone"]
    agents = {r["agent"]: r for r in json.loads(cli("agents", "--json").output)}
    assert agents["Ben"]["archived"] and agents["Ben"]["shed_to"]["recipient_archived"] == 2
    assert "Ben (archived)" in cli("agents").output
    r = cli("ping", "Ben", ok=False)
    assert r.exit_code == 1 and "archived" in r.output
    # undo, twice
    assert "Ben: restored" in cli("archive-agent", "--undo", "Ben").output
    assert "not archived; nothing changed" in cli("archive-agent", "--undo", "Ben").output
    drop(cli, "Ann", "after", "TO: Ben\n\nwelcome back")
    cli("run", "--once", "-q")
    assert [json.loads(p.read_text())["body"] for p in (cli.state / "inbox/Ben/new").iterdir()] == ["welcome back"]
    assert cli("archive-agent", "Nobody", ok=False).exit_code == 1
    assert cli("archive-agent", "System", ok=False).exit_code == 1


def test_a_command_whose_first_run_never_finished_runs_again(team):
    cli = team
    with Ledger(cli.state / "ledger.sqlite") as led:
        assert led.operations.begin_command("k-1", "ping", '{"agent":"Ben"}', "operator:x", 1.0) is None
    out = cli("ping", "Ben", "--command-id", "k-1").output
    assert out.startswith("pinged Ben") and "existing" not in out
    assert "existing" in cli("ping", "Ben", "--command-id", "k-1").output
    assert len(list((cli.state / "inbox/Ben/new").iterdir())) == 1


def test_a_bad_command_id_is_one_line(team):
    r = team("ping", "Ben", "--command-id", "bad\x1bid", ok=False)
    assert r.exit_code == 1 and "invalid command id" in r.output and len(r.output.strip().splitlines()) == 1


def test_a_command_id_of_200_characters_is_one_and_of_201_is_refused(team):
    longest = "k" * 200
    assert team("ping", "Ben", "--command-id", longest).output.startswith("pinged Ben")
    assert "existing" in team("ping", "Ben", "--command-id", longest).output
    r = team("ping", "Ben", "--command-id", longest + "k", ok=False)
    assert r.exit_code == 1 and "invalid command id" in r.output and "1 to 200 printable characters" in r.output
    assert len(list((team.state / "inbox/Ben/new").iterdir())) == 1


def test_sheds_show_in_status_audit_show_report_and_agents(team, tmp_path):
    cli = team
    (cli.state / "relay.toml").write_text("pair_rate = 1\n")
    drop(cli, "Ann", "one", "TO: Ben\n\none")
    drop(cli, "Ann", "two", "TO: Ben\n\ntwo")
    assert "1 failed, 0 to retry, 1 delivery(ies) shed by flow control" in cli("run", "--once", "-q").output
    doc = json.loads(cli("status", "--json", ok=False).output)
    assert doc["sheds"] == {"body_size": 0, "per_pair_rate": 1, "queue_limit": 0, "recipient_archived": 0}
    assert "per_pair_rate 1" in cli("status", ok=False).output
    [shed] = audit(cli, "--status", "shed")
    assert shed["status"] == "failed" and "per_pair_rate" in shed["error"]
    shown = json.loads(cli("show", shed["id"], "--json").output)
    assert [(s["recipient"], s["reason"], s["limit"], s["observed"]) for s in shown["sheds"]] == [
        ("Ben", "per_pair_rate", 1, 2)]
    assert "shed (not delivered to):" in cli("show", shed["id"]).output
    page = tmp_path / "r.html"
    cli("report", "--html", str(page))
    html = page.read_text()
    assert "Shed by flow control" in html and '<td class="err">per_pair_rate</td>' in html
    agents = {r["agent"]: r for r in json.loads(cli("agents", "--json").output)}
    assert agents["Ann"]["shed_from"]["per_pair_rate"] == 1 and agents["Ben"]["shed_to"]["per_pair_rate"] == 1


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
    killed_at(relay.ledger.operations, "requeue")
    with pytest.raises(Killed):
        retry(relay.ledger, relay.layout, [row["id"]])
    result = retry(relay.ledger, relay.layout, [row["id"]])
    assert (result.code, result.errors) == (0, []), result.errors
    assert relay.drain().archived == 1 and [m["body"] for m in project.inbox("Nobody")] == ["to someone not there yet"]
    assert not list((project.state / "failed").rglob("*.json"))       # its old report went with it


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


def test_a_running_daemon_honours_an_archive_at_once(daemon, tmp_path):  # noqa: F811
    state = tmp_path / ".relay"
    state.mkdir()
    (state / "relay.toml").write_text('rescan_interval = "1h"\nagents = ["Ann", "Ben", "Cy"]\n')
    d = daemon()
    d.ready()
    r = subprocess.run([sys.executable, "-m", "relay", "--root", str(tmp_path), "archive-agent", "Ben"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "Ben: archived" in r.stdout, r.stderr
    rename_in(state / "outbox" / "Ann", "m", "TO: Ben, Cy\n\nfor Ben and Cy")
    rename_in(state / "outbox" / "Ben", "b", "TO: Cy\n\nBen is retired")
    wait_for(lambda: len(d.inbox("Cy")) == 1 and list((state / "failed/Ben").glob("*.error.json")),
             timeout=20, what="Cy's copy and Ben's message quarantined")
    assert d.inbox("Ben") == [] and d.inbox("Cy")[0]["body"] == "for Ben and Cy"
    [report] = (state / "failed/Ben").glob("*.error.json")
    assert "agent Ben is archived" in json.loads(report.read_text())["reason"]
    code, _ = d.stop()
    assert code == 0


def test_messages_expired_before_the_upgrade_stay_expired(tmp_path):
    """Migration 4 marks what an operator expired before it (its last word an `expired` event)."""
    import sqlite3
    from relay.ledger.ledger import checksum
    from relay.ledger.schema import MIGRATIONS
    path = tmp_path / "ledger.sqlite"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
               "checksum TEXT NOT NULL, applied_at REAL NOT NULL)")
    for version, name, sql in MIGRATIONS[:2]:
        db.executescript(sql)
        db.execute("INSERT INTO schema_migrations VALUES (?, ?, ?, 0)", (version, name, checksum(sql)))
    for mid, events in (("E", ["failed", "expired"]), ("R", ["expired", "retry", "failed"]), ("F", ["failed"])):
        db.execute("INSERT INTO messages (id, sender, name, status, discovered_at, failed_at) "
                   "VALUES (?, 'Ann', 'm', 'failed', 1, 2)", (mid,))
        for event in events:
            db.execute("INSERT INTO events (message_id, at, event) VALUES (?, 2, ?)", (mid, event))
    db.close()
    with Ledger(path) as led:
        expired = {r["id"]: r["expired_at"] for r in History(led).audit()}
    assert expired == {"E": 2.0, "R": None, "F": None}


@pytest.mark.parametrize("result, row_unreadable", [('{"lines": []}', False),
                                                    ('{"lines": [], "errors": [], "code": "x"}', False),
                                                    ("not json", True), ("[]", True)])
def test_a_command_whose_recorded_result_is_unreadable_says_so_and_fails_without_running_again(
        team, result, row_unreadable):
    """A result recorded as an object this build cannot take apart is named as the first run's
    result; one that is no object at all makes the row unreadable: the id cannot be checked.
    Either way the command fails and is not run again."""
    import sqlite3
    cli = team
    drop(cli, "Ann", "bad", "TO: Zed\n\nnobody")
    cli("run", "--once", "-q")
    mid = by_name(cli)["bad"]["id"]
    cli("expire", mid, "--command-id", "op-9")
    with sqlite3.connect(cli.state / "ledger.sqlite") as db:
        db.execute("UPDATE commands SET result = ? WHERE id = 'op-9'", (result,))
    db.close()
    r = cli("expire", mid, "--command-id", "op-9", ok=False)
    assert r.exit_code == 1
    if row_unreadable:
        assert r.output == (f"relay: ledger commands row 'op-9': column result holds {result!r}, which this relay "
                            "cannot read; skipped: command id 'op-9' cannot be checked; give this command a new id\n")
    else:
        assert "command op-9: existing (first run " in r.output and "nothing changed. Its result then:" in r.output
        assert f"the recorded result is unreadable: {result!r}" in r.output
    assert len(events(cli, mid, "expired")) == 1


@pytest.mark.parametrize("cid, ok", [("k", True), ("a b~", True), ("k" * 200, True), ("", False),
                                     ("k" * 201, False), ("a\x7fb", False), ("a\x1fb", False), ("a\tb", False),
                                     ("\x00", False)])
def test_a_command_id_is_one_to_200_characters_none_of_them_a_control_or_delete(cid, ok):
    from relay.errors import RelayError
    from relay.operator.commands import check_id
    if ok:
        assert check_id(cid) == cid
    else:
        with pytest.raises(RelayError) as e:
            check_id(cid)
        assert str(e.value) == f"invalid command id {cid[:200]!r}: give 1 to 200 printable characters"
