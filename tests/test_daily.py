"""The operator's daily use: `relay config`, warnings instead of refusals where an agent is
concerned, each lifecycle event at its own instant, JSON log lines with the message's fields,
a reload that applies what it can, audit's row limit said, a pipe closed early, `relay status`
as a health check, and doctor running verify's checks."""
import json
import sqlite3
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from relay.cli import main
from relay.ids import IdGenerator
from relay.files.layout import Layout
from relay.ledger.ledger import Ledger
from relay.files.lock import DaemonLock
from relay.operator import doctor as operator


def test_relay_config_says_where_each_value_came_from(cli):
    cli("init")
    (cli.state / "relay.toml").write_text("retention = '2d'\n")
    r = CliRunner().invoke(main, ["--root", str(cli.root), "config", "--json"], env={"RELAY_SETTLE": "1s"})
    assert r.exit_code == 0, r.output
    values = json.loads(r.stdout)["values"]
    assert values["retention"]["text"] == "2d" and values["retention"]["from"].startswith("relay.toml (")
    assert values["settle"] == {"value": 1.0, "text": "1s", "from": "env RELAY_SETTLE"}
    assert values["root"]["from"] == "flag" and values["durability"] == {"value": "full", "text": "full",
                                                                          "from": "default"}
    text = cli("config").stdout
    assert "retention" in text and "2d" in text and "(relay.toml (" in text and "(default)" in text


def test_an_unknown_relay_variable_warns_once_and_stops_no_verb(cli):
    runner = CliRunner()
    env = {"RELAY_NOT_A_KEY_OF_RELAYS": "x"}
    first = runner.invoke(main, ["--root", str(cli.root), "init", "--agent", "Ann"], env=env)
    assert first.exit_code == 0 and "RELAY_NOT_A_KEY_OF_RELAYS is set in the environment" in first.stderr
    again = runner.invoke(main, ["--root", str(cli.root), "config"], env=env)
    assert again.exit_code == 0 and "RELAY_NOT_A_KEY_OF_RELAYS" not in again.stderr     # once per process


def test_a_misspelt_key_stops_the_daemon_not_an_agents_send_or_inbox(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    (cli.state / "relay.toml").write_text("retension_typo = '7d'\n")
    r = cli("run", "--once", ok=False)
    assert r.exit_code == 1 and "unknown configuration key 'retension_typo'" in r.output
    r = cli("send", "--from", "Ann", "--to", "Ben", "still goes")
    assert (cli.state / f"outbox/Ann/msg-{r.stdout.strip().lower()}").is_file()
    (cli.state / "relay.toml").write_text("retension_typo2 = '7d'\n")        # a new warning: printed
    r = cli("inbox", "Ben")
    assert "no new messages" in r.stdout and "unknown configuration key 'retension_typo2'" in r.stderr
    assert cli("status", ok=False).exit_code == 3       # a read-only verb warns and carries on (issue 27)


class Ticking:
    """An injected clock that moves one second each time it is read."""

    def __init__(self, start):
        self.now = start

    def __call__(self):
        self.now += 1.0
        return self.now


def test_each_lifecycle_event_keeps_its_own_instant(project):
    from relay.core.daemon import Relay
    clock = Ticking(time.time() + 10)
    relay = Relay(project.config(agents=["Ann", "Ben", "Cy"]), clock=clock)
    project.relays.append(relay)
    project.drop("Ann", "m", "TO: Ben, Cy\n\nx")
    relay.step()
    [row] = relay.history.audit()
    at = {e["event"]: e["at"] for e in relay.history.events(row["id"])}
    assert at["discovered"] == at["claimed"] == row["discovered_at"]
    assert at["discovered"] < at["delivered"] < at["archived"]
    assert (row["delivered_at"], row["archived_at"]) == (at["delivered"], at["archived"])
    assert {d["delivered_at"] for d in relay.history.deliveries(row["id"])} == {at["delivered"]}
    assert operator.verify(relay.history, relay.layout) == (1, [])      # the chain covers those times


def test_json_log_lines_carry_the_message_fields(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben", "--agent", "Cy")
    cli("send", "--from", "Ann", "--to", "Ben,Cy", "x")
    r = CliRunner().invoke(main, ["--root", str(cli.root), "run", "--once", "--log-format", "json"],
                           env={"RELAY_LOG_LEVEL": "DEBUG"})      # "discovered" is a DEBUG line
    lines = [json.loads(line) for line in r.stderr.strip().splitlines()]
    [archived] = [d for d in lines if d.get("event") == "archived"]
    assert archived["from"] == "Ann" and archived["to"] == ["Ben", "Cy"] and archived["id"] in archived["msg"]
    [discovered] = [d for d in lines if d.get("event") == "discovered"]
    [identified] = [d for d in lines if d.get("event") == "identified"]     # relay send chose the id
    assert identified["id"] == archived["id"] and identified["msg"].startswith(discovered["id"])
    assert discovered["from"] == identified["from"] == "Ann"


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


def test_a_reload_applies_what_it_can_and_names_what_needs_a_restart(project, clock):
    relay = project.relay(agents=("Ann", "Ben"), rescan_interval="1h")
    relay.step()
    new = project.config(agents=["Ann", "Ben", "Dee"], rescan_interval="10s", settle="2s")
    moved = type(new)(**{**{f: getattr(new, f) for f in new.__dataclass_fields__},
                         "state_dir": project.root / "elsewhere"})
    applied, restart = relay.reconfigure(moved)
    assert applied == ["settle", "rescan_interval", "agents"] and restart == ["state_dir"]
    assert relay.config.state_dir == project.state and relay.outbox.settle == 2.0
    assert (project.state / "inbox/Dee/new").is_dir() and "Dee" in relay.known_agents()
    assert relay.next_deadline(clock.now) <= clock.now + 10
    assert not (project.root / "elsewhere").exists()


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


@pytest.mark.timeout_s(60)
def test_a_pipe_closed_early_ends_quietly(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    ids = IdGenerator()
    with Ledger(cli.state / "ledger.sqlite") as led:       # more records than a pipe holds
        led.add_archived([(ids.new(1e9 + i), "Ann", f"m{i}", '["Ben"]', "message", "s", "b", 1, "0" * 64,
                           1e9 + i, f"archive/2001-09-09/Ann/m{i}") for i in range(1000)])
    for verb in (["audit", "--json"], ["audit", "--jsonl"], ["tail", "-n", "2000"]):
        p = subprocess.Popen([sys.executable, "-m", "relay", "--root", str(cli.root), *verb],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        p.stdout.read(100)
        p.stdout.close()                                     # `| head -c 100`
        err = p.stderr.read().decode()
        p.wait(timeout=30)
        # 141 (as if killed by SIGPIPE) when a write met the closed pipe; 0 when the interpreter's
        # buffered writer took the last write whole. Never a traceback or an error line.
        assert p.returncode in (0, 141) and err == "", (verb, p.returncode, err)


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
    assert cli("status", "--max-pending-age", "5", ok=False).exit_code == 3      # a bare number: seconds (issue 27)
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
def read_only(cli):
    """A project whose state directory and ledger no one may write, root included: the
    immutable attribute (chattr +i), which root's permission checks do not pass over as they
    pass over the mode bits. Undone at the end."""
    import shutil
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
