"""The durability in force is attested by the relay that runs, not assumed by the reader:
status and doctor show what the daemon's (or run --once's) writer connection reported, say when
nobody attested or when the attesting process is gone, and doctor flags a daemon running with
less than the configured durability."""
import json
import os
import signal
import subprocess
import sys

import pytest

from relay.files.layout import Layout
from relay.files.lock import DaemonLock

from test_daemon_e2e import Daemon, wait_for


@pytest.fixture
def held(project):
    """relay.lock held by this process, as a running daemon holds it."""
    Layout(project.root, project.state).create()
    with DaemonLock(project.state / "relay.lock") as lock:
        yield lock


def status(cli, *args):
    """(the health check's exit code, the document): --json itself exits 0 with the verdict in it."""
    r = cli("status", "--json", *args, ok=False)
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    return doc["health"]["exit"], doc


def test_a_daemon_at_normal_is_shown_as_it_runs_and_flagged_by_doctor(project, held, cli):
    relay = project.relay(durability="normal")
    facts = relay.attest("daemon")
    assert facts["synchronous"] == "NORMAL" and facts["pid"] == os.getpid()
    code, doc = status(cli)
    assert code == 0                                    # a daemon runs, nothing waits
    att = doc["durability"]
    assert (att["synchronous"], att["configured"], att["journal_mode"]) == ("NORMAL", "normal", "wal")
    assert att["attested"] and att["running"] and att["pid"] == os.getpid() and att["mode"] == "daemon"
    assert att["setting"] == "full"                     # what relay.toml says; not what is shown
    assert "synchronous=NORMAL" in cli("status").output and ", running" in cli("status").output
    r = cli("doctor", ok=False)
    assert r.exit_code == 1
    assert f"the running daemon (pid {os.getpid()}) runs with durability normal (synchronous=NORMAL), " \
           "less than the configured full" in r.output
    doc = json.loads(cli("doctor", "--json", ok=False).stdout)
    assert doc["durability"]["synchronous"] == "NORMAL" and not doc["ok"]


def test_a_reload_attests_again(project, held, cli):
    relay = project.relay(durability="normal")
    relay.attest("daemon")
    applied, restart = relay.reconfigure(project.config(agents=["Ann", "Ben", "Cy"], durability="full"))
    assert applied == ["durability"] and restart == []
    relay.attest("daemon", "reload")
    _, doc = status(cli)
    assert (doc["durability"]["synchronous"], doc["durability"]["event"]) == ("FULL", "reload")
    assert cli("doctor").exit_code == 0


def test_a_daemon_that_never_attested_is_said_so(project, held, cli):
    project.relay().close()                             # a ledger, but no attestation in it
    code, doc = status(cli)
    assert code == 0 and doc["durability"]["attested"] is False and doc["durability"]["synchronous"] is None
    assert "not attested: the running daemon" in cli("status").output
    r = cli("doctor", ok=False)
    assert r.exit_code == 1 and "has not attested its ledger settings" in r.output


def test_no_daemon_and_an_attestation_of_a_process_gone(cli):
    cli("init", "--agent", "Ann")
    code, doc = status(cli)
    assert code == 3 and doc["durability"]["attested"] is False
    assert "not attested: no relay has recorded" in cli("status", ok=False).output
    cli("run", "--once", "-q", "--durability", "normal")
    code, doc = status(cli)
    assert code == 3 and doc["durability"]["synchronous"] == "NORMAL" and doc["durability"]["mode"] == "once"
    assert doc["durability"]["running"] is False
    assert "which is not running" in cli("status", ok=False).output
    assert cli("doctor").exit_code == 0         # no daemon runs with less than configured


@pytest.mark.timeout_s(40)
def test_the_real_daemon_attests_at_start_and_at_reload(tmp_path):
    d = Daemon(tmp_path, "--durability", "normal")
    try:
        d.ready()

        def relay(*args):
            return subprocess.run([sys.executable, "-m", "relay", "--root", str(tmp_path), *args],
                                  capture_output=True, text=True, env=dict(os.environ, RELAY_AGENTS="Ann"))
        r = relay("status", "--json")
        att = json.loads(r.stdout)["durability"]
        assert r.returncode == 0, r.stderr
        assert (att["synchronous"], att["pid"], att["running"]) == ("NORMAL", d.proc.pid, True)
        r = relay("doctor")
        assert r.returncode == 1 and "less than the configured full" in r.stdout
        # SIGHUP: every key it can is applied; state_dir needs a restart and says so.
        (d.state / "relay.toml").write_text('retention = "2d"\nstate_dir = "elsewhere"\nlog_level = "debug"\n')
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "configuration reloaded" in d.log(), what="the reload")
        # (relay.toml names another state directory now: a fresh reader is pointed at this one)
        wait_for(lambda: json.loads(relay("status", "--json", "--state-dir", ".relay").stdout)["durability"]
                 ["event"] == "reload", what="the attestation of the reload")
        log = d.log()
        assert "applied retention, log_level" in log
        assert "state_dir changed" in log and "only when relay is restarted" in log
        assert not (tmp_path / "elsewhere").exists()
        code, _ = d.stop()
        assert code == 0
        r = relay("status", "--json", "--state-dir", ".relay")
        assert r.returncode == 0 and json.loads(r.stdout)["health"]["exit"] == 3
        assert json.loads(r.stdout)["durability"]["running"] is False
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()
        d.sock.close()


def _attested(**over):
    att = {"attested": True, "running": True, "synchronous": "FULL", "configured": "full", "journal_mode": "wal",
           "foreign_keys": 1, "busy_timeout_ms": 5000}
    return {**att, **over}


@pytest.mark.parametrize("over, said", [
    ({}, []),
    ({"journal_mode": "WAL"}, []),
    ({"journal_mode": "delete"}, ["the running daemon (pid 77) has its ledger in journal mode delete, not WAL; "
                                  "readers may block it; restart it"]),
    ({"foreign_keys": 0}, ["the running daemon (pid 77) runs with foreign keys off; restart it"]),
    ({"journal_mode": "truncate", "foreign_keys": False},
     ["the running daemon (pid 77) has its ledger in journal mode truncate, not WAL; readers may block it; restart it",
      "the running daemon (pid 77) runs with foreign keys off; restart it"]),
])
def test_doctor_flags_a_daemons_journal_that_is_not_wal_and_its_foreign_keys_off_each(over, said):
    from relay.core import health
    assert health.problems(_attested(**over), "full", 77) == said
    assert health.problems(_attested(**over), "full", None) == []


def test_status_says_nothing_of_a_ledger_it_may_write_and_names_what_it_may_not():
    from relay.core import health
    assert health.describe_access({"writable": True, "unwritable": None, "opened": None}) is None
    assert health.describe_access({"writable": False, "unwritable": "/s/ledger.sqlite-wal", "opened": "read-only"}) == (
        "read-only: /s/ledger.sqlite-wal cannot be written; the read-only verbs read the ledger, a relay cannot run here")
    assert health.describe_access({"writable": False, "unwritable": "/s", "opened": "immutable"}) == (
        "read-only: /s cannot be written; the read-only verbs read the ledger as it stands (immutable: no -shm "
        "could be made), a relay cannot run here")


@pytest.mark.parametrize("pid, oldest, max_age, code, said", [
    (7, None, 60, 0, []),
    (7, 60, 60, 0, []),
    (7, 61, 60, 4, ["the oldest pending message waits for 61s, more than --max-pending-age 1m"]),
    (7, 10_000, 0, 0, []),
    (None, None, 60, 3, ["no daemon is running (relay.lock is not held)"]),
    (None, 61, 60, 3, ["no daemon is running (relay.lock is not held)",
                       "the oldest pending message waits for 61s, more than --max-pending-age 1m"]),
])
def test_the_health_check_is_down_before_stale_and_stale_only_past_the_age_given(pid, oldest, max_age, code, said):
    from relay.core import health
    assert health.check(pid, oldest, max_age) == (code, said)
    assert (health.EXIT_OK, health.EXIT_STALE, health.EXIT_DOWN) == (0, 4, 3)


LESS = ("the running daemon (pid 77) runs with durability {c} (synchronous={s}), less than the configured {want}: what "
        "it acknowledges may not survive a power cut; restart it (without --durability {c} or RELAY_DURABILITY)")


@pytest.mark.parametrize("synchronous, attested, configured, flagged", [
    ("FULL", "full", "full", False), ("EXTRA", "full", "full", False),
    ("NORMAL", "full", "full", True),           # a level below what full needs
    ("FULL", "normal", "full", True),           # the level is there, but the daemon was told normal
    ("NORMAL", "normal", "normal", False), ("FULL", "normal", "normal", False), ("FULL", "full", "normal", False),
    ("OFF", "normal", "normal", True), ("odd", "full", "full", True),
])
def test_doctor_flags_a_daemon_whose_synchronous_level_or_durability_is_below_the_configured_one(
        synchronous, attested, configured, flagged):
    from relay.core import health
    said = health.problems(_attested(synchronous=synchronous, configured=attested), configured, 77)
    assert said == ([LESS.format(c=attested, s=synchronous, want=configured)] if flagged else [])


def test_doctor_flags_a_running_daemon_that_has_not_attested_whatever_the_row_says():
    from relay.core import health
    assert health.problems(_attested(running=False), "full", 77) == [
        "the running daemon (pid 77) has not attested its ledger settings, so what it runs with is unknown; restart "
        "it with this relay to have it recorded"]


@pytest.mark.parametrize("waiting, now, ack_timeout, said", [
    ({"unacked_since": 100.0, "waiting": 3}, 130.0, 30.0, None),            # exactly the timeout: not yet
    ({"unacked_since": 100.0, "waiting": 3}, 131.0, 30.0,
     "node n2 is not acknowledging: 3 message(s) wait for it, the oldest for 31s, more than ack_timeout (30s)"),
    ({"unacked_since": 100.0, "waiting": 3, "published": 2}, 200.0, 30.0,
     "node n2 is not acknowledging: 2 message(s) wait for it, the oldest for 100s, more than ack_timeout (30s)"),
    ({"unacked_since": 100.0, "waiting": 3}, 10_000.0, 0, None),             # no timeout known
    ({"unacked_since": None, "waiting": 3}, 10_000.0, 30.0, None),           # nothing published unanswered
])
def test_a_node_is_said_not_to_acknowledge_only_past_the_ack_timeout(waiting, now, ack_timeout, said):
    from relay.core import health
    assert health.unanswered("n2", waiting, now, ack_timeout) == said


def test_names_other_nodes_claim_twice_are_said_but_fail_no_health_check_and_a_link_down_says_its_reason():
    from relay.core import health
    doc = {"link": {"connected": True, "error": None}, "directory": {"error": None}, "conflicts": [],
           "others_conflicts": [("Zed", "n3", "n4")], "outbound": {"by_node": {}}}
    assert health.federation(doc, True, 1000.0, 600) == (0, [
        "federation: 1 name(s) of other nodes are listed by more than one node (relay status shows them); not this "
        "node's to mend"])
    down = {**doc, "others_conflicts": [], "link": {"connected": False, "error": None}}
    assert health.federation(down, True, 1000.0, 600) == (
        health.EXIT_FEDERATION, ["federation: the link to the team's server is down (no reason recorded)"])
    late = {**doc, "others_conflicts": [], "ack_warn": 30.0,
            "outbound": {"by_node": {"n2": {"waiting": 1, "oldest_at": 900.0, "unacked_since": 900.0}}}}
    code, said = health.federation(late, True, 1000.0, 600)
    assert code == health.EXIT_STALE and said == [
        "federation: node n2 is not acknowledging: 1 message(s) wait for it, the oldest for 100s, more than "
        "ack_timeout (30s)"]
    assert health.federation(late, False, 1000.0, 600) == (0, [])     # no daemon: nothing reads what came


def test_an_attestation_is_the_running_daemons_only_for_its_pid_on_this_host(project):
    import os
    import socket

    from relay.core import health
    relay = project.relay()
    assert health.attestation(relay.history, os.getpid()) == {"attested": False, "running": False}
    health.attest(relay.ledger, relay.history, relay.config, "daemon", "start", project.clock())
    att = health.attestation(relay.history, os.getpid())
    assert att["attested"] and att["running"] and (att["pid"], att["host"]) == (os.getpid(), socket.gethostname())
    assert (att["mode"], att["event"], att["configured"]) == ("daemon", "start", "full")
    assert health.attestation(relay.history, os.getpid() + 1)["running"] is False
    assert health.attestation(relay.history, None)["running"] is False
    project.clock.advance(1)
    relay.ledger.attest(project.clock(), {"pid": os.getpid(), "host": socket.gethostname() + "-elsewhere",
                                          "version": att["version"], "mode": "once", "event": "start",
                                          "durability": "full", **relay.history.checks.pragmas()})
    other = health.attestation(relay.history, os.getpid())
    assert other["host"].endswith("-elsewhere") and other["running"] is False
