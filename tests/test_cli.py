"""Every verb through click's CliRunner, in-process; what a shell sees of them in a process of its
own: Ctrl-C ending `relay inbox --wait` (130, no "Aborted!"), a pipe closed early ending quietly.
Also `relay inbox --wait [DURATION] AGENT`, read and unread as --ack and `read` label them, and the
JSON log lines with the message's fields."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from relay.cli import main
from relay.ids import IdGenerator
from relay.ledger.ledger import Ledger




def drop(cli, sender, name, text):
    box = cli.state / "outbox" / sender
    box.mkdir(parents=True, exist_ok=True)
    (box / f".{name}.tmp").write_text(text)
    os.rename(box / f".{name}.tmp", box / name)


def test_every_verb_has_help_and_is_in_the_docs_command_table():
    """Every verb has help, a row of its own in docs/operating.md's table, and is named in the
    first column of the contract's command table (§5)."""
    docs = Path(__file__).parent.parent / "docs"
    table = (docs / "operating.md").read_text()
    contract = (docs / "contract.md").read_text().split("## 5. Command line", 1)[1].split("\n## ", 1)[0]
    verbs = " ".join(row.split(" | ")[0] for row in contract.splitlines() if row.startswith("| `relay "))
    runner = CliRunner()
    for name, cmd in main.commands.items():
        assert cmd.help, f"relay {name} has no help text"
        result = runner.invoke(main, [name, "--help"])
        assert result.exit_code == 0 and "Usage" in result.output
        assert re.search(rf"^\| `relay {name}\b", table, flags=re.M), f"relay {name} is not in docs/operating.md's table"
        assert re.search(rf"`relay {name}\b", verbs), f"relay {name} is not in docs/contract.md's table (§5)"


def test_init_is_idempotent(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    cli("init", "--agent", "Ann")
    for d in ("outbox/Ann", "inbox/Ann/new", "inbox/Ben/cur", "inbox/System/tmp", "archive", "failed"):
        assert (cli.state / d).is_dir()
    assert (cli.state / "ledger.sqlite").exists()
    r = cli("init", "--agent", "../x", ok=False)
    assert r.exit_code == 1 and "invalid agent name" in r.output


def test_send_run_inbox_ack(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    mid = cli("send", "--from", "Ann", "--to", "Ben", "--thread", "t", "--subject", "s", "hello").stdout.strip()
    assert [p.name for p in (cli.state / "outbox/Ann").iterdir()] == [f"msg-{mid.lower()}"]
    cli("send", "--from", "Ann", "--to", "Ben", "-", input="from stdin\n")
    assert "relayed 2 message(s)" in cli("run", "--once", "-q").output
    assert json.loads(cli("show", mid, "--json").output)["id"] == mid
    listing = cli("inbox", "Ben").output
    assert listing.count("from:    Ann") == 2 and "thread:  t" in listing and "subject: s" in listing
    assert "\nhello\n" in listing and f"id:      {mid}" in listing and "from stdin" in listing
    assert "no new messages" not in cli("inbox", "Ben").output     # printing marked nothing read
    docs = json.loads(cli("inbox", "Ben", "--json", "--ack").output)
    assert sorted(d["body"] for d in docs) == ["from stdin\n", "hello"]
    assert all(d["state"] == "cur" and Path(d["path"]).exists() for d in docs)
    assert "no new messages" in cli("inbox", "Ben").output
    assert json.loads(cli("inbox", "Ben", "--all", "--json").output)[0]["state"] == "cur"
    r = cli("inbox", "Nobody", ok=False)
    assert r.exit_code == 1 and "unknown agent 'Nobody'" in r.output


def test_send_refuses_multiline_header(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    r = cli("send", "--from", "Ann", "--to", "Ben", "--subject", "a\nb", "x", ok=False)
    assert r.exit_code == 1 and "one line" in r.output


def test_status_json_has_the_spec_keys(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    drop(cli, "Ann", "m", "TO: Ben\n\nx")
    drop(cli, "Ann", "bad", "TO: Zed\n\nx")
    cli("run", "--once", "-q")
    cli("run", "--once", "-q")      # the bounce the first pass owes Ann
    r = cli("status", "--json", ok=False)
    assert r.exit_code == 0 and json.loads(r.stdout)["health"]["exit"] == 3     # no daemon runs: said inside
    doc = json.loads(r.stdout)
    assert doc["root"] == str(cli.root) and doc["state_dir"] == str(cli.state)
    assert doc["daemon"] == {"running": False, "pid": None}
    # archived: the message, and the failure's bounce to Ann
    assert doc["counts"] == {"pending": 0, "processing": 0, "delivered": 0, "failed": 1, "archived": 2}
    assert doc["agents"] == ["Ann", "Ben"] and doc["oldest_pending_age_s"] is None
    assert doc["durability"]["journal_mode"] == "wal" and doc["durability"]["synchronous"] == "FULL"
    assert doc["durability"]["foreign_keys"] is True and doc["durability"]["busy_timeout_ms"] > 0
    assert "archived 2" in cli("status", ok=False).output


def test_status_headlines_a_message_delivered_and_archived_since_as_delivered(cli):
    """39 messages delivered and archived read "delivered 0": the ledger's state `delivered` is
    only a delivered message whose file is not archived yet. The headline counts what people
    mean; the ledger's states are named on a line of their own."""
    cli("init", "--agent", "Ann", "--agent", "Ben")
    (cli.state / "relay.toml").write_text("bounces = false\n")
    for i in range(3):
        drop(cli, "Ann", f"m{i}", f"TO: Ben\n\nx{i}")
    drop(cli, "Ann", "bad", "TO: Zed\n\nx")
    cli("run", "--once", "-q")
    drop(cli, "Ann", "later", "TO: Ben\n\nnot yet")
    doc = json.loads(cli("status", "--json", ok=False).stdout)
    assert doc["messages"] == {"delivered": 3, "on_the_way": 0, "failed": 1}
    assert doc["counts"]["archived"] == 3 and doc["counts"]["delivered"] == 0
    lines = cli("status", ok=False).stdout.splitlines()
    assert "messages   3 delivered, 0 on the way, 1 failed" in lines
    assert any(ln.startswith("states     archived 3, delivered 0 (") and "pending 0, processing 0, failed 1" in ln
               for ln in lines), lines


@pytest.mark.parametrize("args,code", [
    (["send", "--from", "Ann", "--to", "Zed", "x"], 1),            # relay's own refusal (handle_errors)
    (["send", "--from", "Ann", "x"], 2),                           # a usage error of the verb's
    (["show", "01ARZ3NDEKTSV4RRFFQ69G5FAV"], 1),
    (["status", "--max-pending-age", "soon"], 2),                  # a bad value for an option
    (["audit", "--bogus"], 2),                                     # no such option
    (["bogus"], 2),                                                # no such verb
    (["--bogus"], 2),                                              # the group's own options
    (["send", "--from", "../x", "--to", "Ben", "x"], 1),           # a callback's refusal
])
def test_every_error_line_starts_with_relay_never_error(cli, args, code):
    """Some refusals read `relay: ...`, click's read `Error: ...`: one way for all."""
    cli("init", "--agent", "Ann", "--agent", "Ben")
    r = cli(*args, ok=False)
    assert r.exit_code == code and r.stdout == ""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("relay: ") and "Error" not in r.stderr, r.stderr


def test_audit_shows_whom_a_failed_message_was_for(cli):
    """A message that failed on `TO: Zed, Bob` (Zed unknown) read `Ann → ?` in the audit: the
    recipients it named are recorded, as written, and shown, its --to filter finds it."""
    cli("init", "--agent", "Ann", "--agent", "Bob")
    (cli.state / "relay.toml").write_text("bounces = false\n")
    drop(cli, "Ann", "m", "TO: Zed, Bob\n\nhello")
    cli("run", "--once", "-q")
    [record] = json.loads(cli("audit", "--json").stdout)
    assert (record["status"], record["to"]) == ("failed", ["Zed", "Bob"])
    table = cli("audit").stdout
    assert "Ann → Zed,Bob" in table and "→ ?" not in table
    assert [r["id"] for r in json.loads(cli("audit", "--to", "Zed", "--json").stdout)] == [record["id"]]


def test_audit_filters_json_and_table(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben", "--agent", "Cy")
    (cli.state / "relay.toml").write_text("bounces = false\n")     # the filters over the agents' messages only
    drop(cli, "Ann", "a", "TO: Ben\nTHREAD: t1\nSUBJECT: first\n\nalpha")
    drop(cli, "Ben", "b", "TO: Ann, Cy\nTHREAD: t1\nKIND: note\n\nbeta needle")
    drop(cli, "Cy", "c", "TO: Nobody\n\ngamma")
    cli("run", "--once", "-q")
    records = json.loads(cli("audit", "--json").output)
    keys = {"id", "from", "to", "kind", "thread", "subject", "status", "retries", "error", "discovered_at",
            "delivered_at", "archived_at", "source_path", "archive_path", "sha256", "size"}
    assert len(records) == 3 and keys <= set(records[0])
    assert [r["id"] for r in records] == sorted((r["id"] for r in records), reverse=True)

    def ids(*args):
        return [r["from"] for r in json.loads(cli("audit", "--json", *args).stdout)]

    assert ids("--from", "Ann") == ["Ann"]
    assert ids("--to", "Cy") == ["Ben"]
    assert ids("--status", "failed") == ["Cy"]
    assert ids("--kind", "note") == ["Ben"]
    assert ids("--thread", "t1") == ["Ann", "Ben"]        # a conversation reads oldest first
    assert ids("--grep", "NEEDLE") == ["Ben"]
    assert ids("--limit", "1") == ["Cy"]
    assert len(ids("--since", "1h")) == 3 and ids("--until", "2000-01-01") == []
    table = cli("audit").output
    assert "FROM → TO" in table and "Ann → Ben" in table and "first" in table
    lines = cli("audit", "--jsonl").output.strip().splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["from"] == "Cy"
    csv_out = cli("audit", "--format", "csv").output.splitlines()
    assert csv_out[0].startswith("id,from,to") and len(csv_out) == 4
    r = cli("audit", "--since", "yesterday-ish", ok=False)
    assert r.exit_code == 2 and "--since" in r.output


def test_audit_to_matches_the_whole_recipient_name(cli):
    """--to Bob lists the messages for Bob, delivered or not, and none for Bobby: a name is
    matched whole, in the deliveries and in the recipients a message names."""
    cli("init", "--agent", "Ann", "--agent", "Bob", "--agent", "Bobby")
    drop(cli, "Ann", "bob", "TO: Bob\n\nx")
    drop(cli, "Ann", "bobby", "TO: Bobby\n\nx")
    drop(cli, "Ann", "both", "TO: Bob, Bobby\n\nx")
    cli("run", "--once", "-q")
    cli("archive-agent", "Bobby")
    drop(cli, "Ann", "bobby-shed", "TO: Bobby\n\nx")        # shed: no delivery, Bobby named
    cli("run", "--once", "-q")

    def names(*args):
        return sorted(r["source_path"].rsplit("/", 1)[1] for r in json.loads(cli("audit", "--json", *args).stdout))

    assert names("--status", "failed") == ["bobby-shed"]
    assert names("--to", "Bob") == ["bob", "both"]
    assert names("--to", "Bobby") == ["bobby", "bobby-shed", "both"]
    assert names("--to", "Bo") == []


def test_show_one_message(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    drop(cli, "Ann", "m", "TO: Ben\nSUBJECT: hello\n\nthe body text")
    cli("run", "--once", "-q")
    mid = json.loads(cli("audit", "--json").output)[0]["id"]
    text = cli("show", mid[:20]).output
    assert mid in text and "the body text" in text and "archived" in text
    assert re.search(r"Ben\s+\S+Z\s+\S+inbox/Ben/new/" + mid, text)
    doc = json.loads(cli("show", mid, "--json").output)
    assert [e["event"] for e in doc["events"]] == ["discovered", "claimed", "delivered", "archived"]
    assert doc["deliveries"][0]["inbox_path"].endswith(f"inbox/Ben/new/{mid}.json")
    r = cli("show", "01NOPE", ok=False)
    assert r.exit_code == 1 and "no message" in r.output


def test_sweep_verb(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    drop(cli, "Ann", "m", "TO: Ben\n\nx")
    cli("run", "--once", "-q")
    assert "would delete 0 archived" in cli("sweep", "--dry-run").output
    out = cli("sweep", "--older-than", "0.001s", "--dry-run").output
    assert "would delete 1 archived" in out
    assert len(list((cli.state / "archive").rglob("*--m"))) == 1
    assert "deleted 1 archived" in cli("sweep", "--older-than", "0.001s").output
    assert list((cli.state / "archive").rglob("*--m")) == []


def test_bad_config_is_one_clear_line(cli):
    cli("init")
    (cli.state / "relay.toml").write_text("retension = '7d'\n")
    r = cli("run", "--once", ok=False)
    assert r.exit_code == 1 and "unknown configuration key 'retension'" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_read_only_verbs_without_ledger_say_what_to_do(cli):
    r = cli("audit", ok=False)
    assert r.exit_code == 1 and "relay init" in r.output
    assert "no ledger yet" in cli("status", ok=False).output


def test_bad_usage_exits_2(cli):
    assert cli("audit", "--status", "lost", ok=False).exit_code == 2
    assert cli("send", "--to", "Ben", ok=False).exit_code == 2


def test_demo_runs_the_examples(tmp_path):
    examples = Path(__file__).parent.parent / "examples" / "outboxes"
    r = CliRunner().invoke(main, ["demo", str(examples)])
    assert r.exit_code == 0, r.output
    assert "relayed 5 message(s)" in r.output and "1 quarantined, 1 bounce(s) to their senders" in r.output
    assert "inbox/System/new: 1 message(s)" in r.output and "unknown recipient Zed" in r.output
    # Dana, spawned by the run and a recipient of the stand-up, is shown with the others
    assert "inbox/Dana/new: 1 message(s)\n  from Lead     [message] stand-up in 10 minutes" in r.output


@pytest.mark.soak
def test_bench_prints_every_figure(tmp_path):
    r = CliRunner().invoke(main, ["bench", "--dir", str(tmp_path), "--messages", "40", "--agents", "4",
                                  "--rate", "50", "--seconds", "0.5", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert not (tmp_path / ".relay-bench-done").exists() and doc["create_us"] > 0
    for key in ("disk", "naive_durable_per_s", "naive_nosync_per_s", "relay_full_per_s", "relay_normal_per_s",
                "ratio_full_to_naive_durable", "ratio_normal_to_naive_nosync", "flow_control", "latency", "peak_rss_mb"):
        assert key in doc, key
    assert doc["latency"]["delivered"] == doc["latency"]["messages"] == 25
    assert doc["relay_full_per_s"] > 0 and doc["disk"]["fsync_creates_per_s"] > 0
    pairs = doc["full_naive_pairs"]
    assert len(pairs) == 3 and all(p["ratio"] == round(p["relay_per_s"] / p["naive_per_s"], 2) for p in pairs)
    assert sorted(p["relay_per_s"] for p in pairs)[1] == doc["relay_full_per_s"]
    fc = doc["flow_control"]
    assert len(fc["runs_on"]) == len(fc["runs_off"]) == 3 and fc["ratio"] == round(max(fc["runs_on"]) / max(fc["runs_off"]), 3)
    assert 0 < fc["own_seconds"] < fc["run_seconds"]
    # own_share is the unrounded ratio of the two (rounded to 4 and 3 places): within what that rounding allows
    own, run = fc["own_seconds"], fc["run_seconds"]
    assert (own - 5e-5) / (run + 5e-4) - 5e-5 <= fc["own_share"] <= (own + 5e-5) / max(run - 5e-4, 1e-9) + 5e-5


def test_json_logs_one_object_per_line(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    drop(cli, "Ann", "m", "TO: Ben\n\nx")
    drop(cli, "Ann", "n", "TO: Ben\n\ny")
    r = CliRunner().invoke(main, ["--root", str(cli.root), "run", "--once", "--log-format", "json"],
                           env={"RELAY_LOG_LEVEL": "DEBUG"})
    assert r.exit_code == 0, r.output
    lines = [json.loads(line) for line in r.stderr.strip().splitlines()]
    [mid] = [row["id"] for row in json.loads(cli("audit", "--json").output) if row["source_path"] == "outbox/Ann/m"]
    assert any(d["msg"].startswith(f"{mid} discovered: outbox/Ann/m") and d["level"] == "debug" for d in lines)
    # At INFO (the default) one line per message: its outcome, which names the file too.
    [outcome] = [d for d in lines if mid in d["msg"] and "delivered from Ann to Ben" in d["msg"]]
    assert outcome["level"] == "info" and f"{mid}--m" in outcome["msg"] and outcome["id"] == mid
    assert all({"ts", "level", "logger", "msg"} <= set(d) for d in lines)


def test_state_dir_after_the_verb_for_agent_relay_projects(cli):
    """`relay run --state-dir .agent-relay` works on an agent-relay 2.x layout."""
    box = cli.root / ".agent-relay" / "outbox"
    for agent in ("Alice", "Bob"):
        (box / agent).mkdir(parents=True)
    (box / "Alice" / "msg").write_text("TO: Bob\nKIND: message\n\nfrom agent-relay")
    os.utime(box / "Alice" / "msg", (1_700_000_000, 1_700_000_000))
    assert "relayed 1 message(s)" in cli("run", "--once", "-q", "--state-dir", ".agent-relay").output
    [env] = (cli.root / ".agent-relay" / "inbox" / "Bob" / "new").iterdir()
    assert json.loads(env.read_text())["body"] == "from agent-relay"
    assert json.loads(cli("status", "--json", "--state-dir", ".agent-relay", ok=False).stdout)["counts"]["archived"] == 1
    assert not (cli.root / ".relay").exists()


# -- relay inbox --wait -----------------------------------------------------------------------

def test_inbox_wait_followed_by_a_name_waits_for_that_agent(team):
    team("send", "--from", "Alice", "--to", "Bob", "--subject", "s", "for Bob")
    team("run", "--once")
    r = team("inbox", "--wait", "Bob")
    assert "for Bob" in r.stdout
    r = team("inbox", "--wait", "5s", "Bob")
    assert "for Bob" in r.stdout


def test_inbox_wait_without_an_agent_is_a_usage_error(team):
    for args in (["--wait"], ["--wait", "5m"], []):
        r = team("inbox", *args, ok=False)
        # (RELAY_AGENT, unset here, would name it: the error says both ways)
        assert r.exit_code == 2 and "name the agent: AGENT, or set RELAY_AGENT=NAME" in r.output


def test_inbox_help_says_a_bare_wait_waits_for_ever(team):
    text = " ".join(team("inbox", "--help").stdout.split())
    assert "for ever" in text and "--wait" in text


def wait_until_watching(proc, deadline=20.0):
    """The process holds an inotify watch (its wait has begun), by its descriptors' fdinfo."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        assert proc.poll() is None, proc.communicate()
        try:
            for fd in os.listdir(f"/proc/{proc.pid}/fdinfo"):
                with open(f"/proc/{proc.pid}/fdinfo/{fd}") as f:
                    if "inotify wd:" in f.read():
                        return
        except (FileNotFoundError, ProcessLookupError):
            pass
        time.sleep(0.01)
    raise AssertionError("the wait never began")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fdinfo"), reason="needs Linux's /proc fdinfo")
def test_ctrl_c_ends_a_wait_with_130_and_no_aborted(team):
    # SIGINT as a terminal's foreground job has it: a runner started in the background by a
    # shell without job control ignores it, and a child would inherit that (and never see Ctrl-C).
    proc = subprocess.Popen([sys.executable, "-m", "relay", "--root", str(team.root), "inbox", "Bob", "--wait"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_until_watching(proc)
        for _ in range(20):             # Ctrl-C, again if the first came before the wait could see it
            proc.send_signal(signal.SIGINT)
            try:
                out, err = proc.communicate(timeout=1)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            raise AssertionError("relay inbox --wait did not end on Ctrl-C")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, (out, err)
    assert "Aborted" not in out + err and "Traceback" not in err


# -- read and unread ----------------------------------------------------------------------------

def test_ack_labels_what_it_printed_as_read(team):
    team("send", "--from", "Alice", "--to", "Bob", "--subject", "s", "hello")
    team("run", "--once")
    r = team("inbox", "Bob", "--ack")
    assert "(read)" in r.stdout and "(unread)" not in r.stdout
    r = team("inbox", "Bob", "--all")
    assert "(read)" in r.stdout and "cur" not in r.stdout


def test_read_says_read_or_unread(team):
    mid = team("send", "--from", "Alice", "--to", "Bob", "--subject", "s", "hello").stdout.strip()
    team("run", "--once")
    assert "(unread)" in team("read", mid).stdout
    assert "(read)" in team("read", mid, "--agent", "Bob").stdout
    r = team("read", mid)
    assert "(read)" in r.stdout and "cur" not in r.stdout


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


@pytest.mark.timeout_s(60)
def test_a_pipe_closed_early_ends_quietly(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    ids = IdGenerator()
    with Ledger(cli.state / "ledger.sqlite") as led:       # more records than a pipe holds
        led.operations.add_archived([(ids.new(1e9 + i), "Ann", f"m{i}", '["Ben"]', "message", "s", "b", 1, "0" * 64,
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


def test_the_audit_table_shows_the_newest_50_unless_told_and_says_more_match(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    for i in range(51):
        drop(cli, "Ann", f"m{i:02d}", f"TO: Ben\nSUBJECT: s{i:02d}\n\nx")
    cli("run", "--once", "-q")
    r = cli("audit")
    shown = [line for line in r.stdout.splitlines() if "Ann → Ben" in line]
    assert len(shown) == 50 and "s50" in shown[0] and not any("s00" in line for line in shown)
    assert "stopped at the limit of 50 message(s); more match" in r.stderr
    assert len([line for line in cli("audit", "--limit", "51").stdout.splitlines() if "Ann → Ben" in line]) == 51
    # the machine-readable forms give every match unless --limit says otherwise
    for form, count in ((["--json"], lambda out: len(json.loads(out))), (["--jsonl"], lambda out: len(out.splitlines())),
                        (["--format", "csv"], lambda out: len(out.splitlines()) - 1)):
        r = cli("audit", *form)
        assert count(r.stdout) == 51 and "stopped at the limit" not in r.stderr, form
        assert count(cli("audit", *form, "--limit", "2").stdout) == 2, form


# -- the edge's own checks (relay/arguments.py): one line per failure, durations and dates ----------

def test_a_full_disk_and_a_used_up_quota_are_each_said_as_what_they_are():
    import errno
    from relay.arguments import explain
    full = OSError(errno.ENOSPC, "No space left on device", "/p/inbox/Ann")
    quota = OSError(errno.EDQUOT, "Disk quota exceeded", "/p/inbox/Ann")
    assert explain(full) == ("the disk is full: No space left on device (/p/inbox/Ann); "
                             "free some space, then run the command again")
    assert explain(quota) == ("the disk quota is used up: Disk quota exceeded (/p/inbox/Ann); "
                              "free some space, then run the command again (or raise the quota)")
    assert explain(OSError(errno.EACCES, "Permission denied")) == "Permission denied"       # no file: no ()


@pytest.mark.parametrize("text, code, said", [
    ("database or disk is full", None,
     "the disk holding /p/ledger.sqlite (or the temporary directory) is full (database or disk is full); "
     "free some space, then run the command again"),
    ("anything", 13,
     "the disk holding /p/ledger.sqlite (or the temporary directory) is full (anything); "
     "free some space, then run the command again"),
    ("database is locked", None,
     "ledger error: database is locked (is another process holding the ledger locked?)"),
    ("database is busy", None, "ledger error: database is busy (is another process holding the ledger locked?)"),
    ("anything", 5, "ledger error: anything (is another process holding the ledger locked?)"),
    ("anything", 6, "ledger error: anything (is another process holding the ledger locked?)"),
    ("no such table: x", None, "ledger error: no such table: x"),
])
def test_each_sqlite_failure_a_verb_meets_is_said_by_its_cause(text, code, said):
    import sqlite3
    from relay.arguments import explain
    error = sqlite3.OperationalError(text)
    if code is not None:
        error.sqlite_errorcode = code
    assert explain(error, "/p/ledger.sqlite") == said


@pytest.mark.parametrize("text, code", [("file is not a database", None), ("database disk image is malformed", None),
                                        ("x", 11), ("x", 26)])
def test_a_damaged_ledger_is_said_with_how_to_recover_it_naming_the_ledger(text, code):
    import sqlite3
    from relay.arguments import explain
    error = sqlite3.DatabaseError(text)
    if code is not None:
        error.sqlite_errorcode = code
    said = explain(error, "/p/ledger.sqlite")
    assert said.startswith(f"the ledger /p/ledger.sqlite is damaged ({text}); the archive and inboxes are intact")
    assert "sqlite3 /p/ledger.sqlite \".recover\"" in said
    assert explain(error).startswith(f"the ledger ledger.sqlite is damaged ({text})")


def test_a_full_disk_without_a_known_ledger_says_the_ledger():
    import sqlite3
    from relay.arguments import explain
    assert explain(sqlite3.OperationalError("database or disk is full")).startswith(
        "the disk holding the ledger (or the temporary directory) is full (")


@pytest.mark.parametrize("value, seconds", [("600", 600.0), ("0.5", 0.5), (" 90s ", 90.0), ("0", 0.0),
                                            ("250ms", 0.25), ("15m", 900.0), ("12h", 43200.0), ("7d", 604800.0)])
def test_a_duration_flag_takes_a_bare_number_or_one_with_its_unit(value, seconds):
    from relay.arguments import seconds as read
    assert read(value) == seconds


@pytest.mark.parametrize("value", ["1.2.3", "-5", "5x", "", "s", ".", "1..5"])
def test_a_duration_flag_refuses_what_is_no_duration(value):
    from relay.arguments import seconds as read
    with pytest.raises(ValueError):
        read(value)


def test_a_bad_duration_flag_is_a_usage_error_naming_the_flag():
    import click
    from relay.arguments import duration, setting
    with pytest.raises(click.BadParameter) as e:
        duration("soon", "--settle")
    assert "'soon' is not a duration" in e.value.format_message() and "(or a bare number of seconds)" in str(e.value)
    assert e.value.param_hint == "--settle"
    assert setting(None, "--settle") is None
    assert setting("90", "--settle") == "90.000000s" and setting("2m", "--settle") == "120.000000s"


@pytest.mark.parametrize("value, at", [("2026-11-30", 1795996800.0), ("2026-11-30T10:00", 1796032800.0),
                                       ("2026-11-30T10:00Z", 1796032800.0), ("2026-11-30T10:00+01:00", 1796029200.0)])
def test_a_date_flag_without_a_zone_is_utc_and_one_with_a_zone_keeps_it(value, at):
    from relay.arguments import moment
    assert moment(value, "--since") == at


def test_a_date_flag_that_is_neither_says_both_forms_and_names_the_flag():
    import click
    from relay.arguments import moment
    assert moment(None, "--since") is None
    with pytest.raises(click.BadParameter) as e:
        moment("yesterday", "--until")
    assert e.value.param_hint == "--until"
    assert "'yesterday' is neither a date (2026-11-30, 2026-11-30T10:00) nor a duration" in str(e.value)


@pytest.mark.parametrize("value", ["", " , ", ","])
def test_a_to_without_any_name_is_refused_saying_how_to_name_one(value):
    from relay.arguments import recipient_names
    from relay.errors import InvalidName
    with pytest.raises(InvalidName) as e:
        recipient_names(value, "--to")
    assert str(e.value) == f"no recipient in {value!r} (--to): give NAME[,NAME...], '*' or System"


def test_a_to_takes_star_and_system_as_relay_spells_them_but_not_in_another_case():
    from relay.arguments import recipient_names
    from relay.errors import InvalidName
    assert recipient_names("Ann, *,System", "--to") == "Ann, *,System"
    for odd in ("Ann,system", "SYSTEM", "broadcast"):
        with pytest.raises(InvalidName) as e:
            recipient_names(odd, "--to")
        assert "is a name relay keeps for itself" in str(e.value) and str(e.value).endswith("(--to)")
    with pytest.raises(InvalidName) as e:
        recipient_names("Ann,../x", "--to")
    assert str(e.value).startswith("invalid agent name '../x' (--to)")


@pytest.mark.parametrize("args, where", [
    (["ping", "../x"], "AGENT"), (["agents", "../x"], "NAME"), (["adopt", "../x"], "AGENT"),
    (["send", "--from", "Alice", "--to", "../x", "hi"], "--to"), (["send", "--from", "../x", "--to", "Bob", "hi"], "--from"),
    (["audit", "--from", "../x"], "--from"), (["audit", "--to", "../x"], "--to"),
])
def test_a_bad_name_is_refused_naming_the_option_or_the_argument_it_was_given_as(team, args, where):
    from conftest import error_line
    r = team(*args, ok=False)
    assert r.exit_code == 1
    assert error_line(r) == f"invalid agent name '../x' ({where}): agent names match [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}"


def test_a_verb_that_needs_an_agent_takes_relay_agent_and_an_empty_one_is_none(team, monkeypatch):
    monkeypatch.setenv("RELAY_AGENT", "")
    r = team("send", "--to", "Bob", "hi", ok=False)
    assert r.exit_code == 2 and "name the agent: --from NAME, or set RELAY_AGENT=NAME" in r.output
    monkeypatch.setenv("RELAY_AGENT", "../x")
    r = team("send", "--to", "Bob", "hi", ok=False)
    assert r.exit_code == 1 and "invalid agent name '../x' (--from)" in r.output
    monkeypatch.setenv("RELAY_AGENT", "Alice")
    team("send", "--to", "Bob", "hi")
    assert len(list((team.state / "outbox" / "Alice").iterdir())) == 1


def test_status_says_the_acks_overdue_and_each_undeclared_outbox_with_what_waits_in_it(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    lines = cli("status", ok=False).stdout.splitlines()
    assert not [ln for ln in lines if ln.startswith(("acks overdue", "undeclared"))]
    (cli.state / "relay.toml").write_text('ack_overdue = "1ms"\nsenders = "declared"\n')
    cli("send", "--from", "Ann", "--to", "Ben", "--ack-required", "sign off?")
    cli("send", "--from", "Ann", "--to", "Ben", "fyi")
    cli("run", "--once", "-q")
    for name, files in (("Zed", 2), ("Yan", 1)):
        (cli.state / "outbox" / name).mkdir()
        for i in range(files):
            (cli.state / "outbox" / name / f"m{i}").write_text("TO: Ann\n\nx")
    lines = cli("status", ok=False).stdout.splitlines()
    assert "acks overdue 1 (waiting longer than ack_overdue, 1ms: relay overdue)" in lines
    assert ('undeclared Yan (1 waiting), Zed (2 waiting): not read (senders = "declared"; relay init --agent NAME '
            'declares one)') in lines


def test_a_json_log_line_carries_the_messages_fields_it_has_and_the_exception_when_there_is_one():
    import logging

    from relay.cli.context import JsonFormatter
    record = logging.LogRecord("relay.work", logging.WARNING, __file__, 1, "delivered %s", ("01ABC",), None)
    record.relay_id, record.relay_to = "01ABC", ["Bob"]
    doc = json.loads(JsonFormatter().format(record))
    assert (doc["level"], doc["logger"], doc["msg"], doc["id"], doc["to"]) == ("warning", "relay.work", "delivered 01ABC",
                                                                              "01ABC", ["Bob"])
    assert "from" not in doc and "event" not in doc and "exc" not in doc and doc["ts"].endswith("+00:00")
    try:
        raise OSError("disk gone")
    except OSError:
        failed = logging.LogRecord("relay", logging.ERROR, __file__, 1, "step failed", (), sys.exc_info())
    doc = json.loads(JsonFormatter().format(failed))
    assert doc["exc"].startswith("Traceback (most recent call last):") and doc["exc"].endswith("OSError: disk gone")


def test_a_ledger_that_cannot_be_opened_is_said_by_its_cause():
    import sqlite3

    from relay.errors import LedgerCorrupt, LedgerError
    full = LedgerError.opening("/p/l.sqlite", sqlite3.OperationalError("database or disk is full"))
    assert type(full) is LedgerError and str(full) == (
        "cannot open the ledger /p/l.sqlite: the disk holding it (or the temporary directory) is full (database or "
        "disk is full); free some space, then run the command again")
    bad = LedgerError.opening("/p/l.sqlite", sqlite3.DatabaseError("file is not a database"))
    assert isinstance(bad, LedgerCorrupt) and str(bad).startswith("the ledger /p/l.sqlite is damaged (file is not a "
                                                                  "database)")
    other = LedgerError.opening("/p/l.sqlite", sqlite3.OperationalError("unable to open database file"))
    assert type(other) is LedgerError and str(other) == "cannot open the ledger /p/l.sqlite: unable to open database file"
    busy = LedgerError.opening("/p/l.sqlite", sqlite3.OperationalError("database is locked"))
    assert str(busy) == "cannot open the ledger /p/l.sqlite: database is locked"


def test_demo_outside_a_checkout_without_an_outboxes_argument_says_what_to_pass(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["demo"])
    assert r.exit_code == 1 and r.output == ("relay: no examples/outboxes here: pass the path of an outboxes directory "
                                             "(examples/outboxes in the checkout)\n")
    r = CliRunner().invoke(main, ["demo", str(tmp_path / "none")])
    assert r.exit_code == 2 and "does not exist" in r.output


def test_inbox_wait_with_all_or_recent_lists_the_read_messages_too_once_mail_is_there(team):
    team("send", "--from", "Alice", "--to", "Bob", "--subject", "first", "read already")
    team("run", "--once")
    team("inbox", "Bob", "--ack")
    team("send", "--from", "Alice", "--to", "Bob", "--subject", "second", "new")
    team("run", "--once")
    subjects = lambda *args: [d["subject"] for d in json.loads(team("inbox", "Bob", "--wait", "5s", *args, "--json").stdout)]
    assert subjects() == ["second"]
    assert sorted(subjects("--all")) == ["first", "second"]
    assert sorted(subjects("--recent", "1")) == ["first", "second"]


def test_demo_without_a_bounce_says_none_and_keep_leaves_the_project_it_names(tmp_path):
    import shutil
    src = tmp_path / "outboxes"
    for agent in ("Ann", "Ben"):
        (src / agent).mkdir(parents=True)
    (src / "Ann" / "hello.txt").write_text("TO: Ben\nSUBJECT: hi there\n\nhello Ben")
    r = CliRunner().invoke(main, ["demo", str(src), "--keep"])
    assert r.exit_code == 0, r.output
    assert "relayed 1 message(s) from 2 agents; 0 quarantined\n" in r.output and "bounce" not in r.output
    assert "inbox/Ben/new: 1 message(s)\n  from Ann      [message] hi there" in r.output
    assert "inbox/Ann/new: 0 message(s)" in r.output and "quarantined:" not in r.output
    kept = re.search(r"\nproject kept at (\S+)\n\Z", r.output)
    assert kept and Path(kept.group(1)).is_dir()
    assert len(list(Path(kept.group(1)).rglob("*.json"))) >= 1     # the delivered copy, still there
    shutil.rmtree(kept.group(1))
    r = CliRunner().invoke(main, ["demo", str(src)])
    assert r.exit_code == 0 and "project kept" not in r.output


def test_sweep_with_a_retention_of_0_keeps_everything_unless_older_than_says_otherwise_even_0s(cli, monkeypatch):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    drop(cli, "Ann", "m", "TO: Ben\n\nx")
    cli("run", "--once", "-q")
    monkeypatch.setenv("RELAY_RETENTION", "0")
    for args in ((), ("--dry-run",), ("--json",)):
        r = cli("sweep", *args)
        assert r.stdout == "retention is 0 (keep forever): nothing to sweep\n", args
    assert len(list((cli.state / "archive").rglob("*--m"))) == 1
    r = cli("sweep", "--older-than", "0", "--dry-run", "--json")
    doc = json.loads(r.stdout)
    assert (doc["dry_run"], doc["archived"], doc["failed"], len(doc["ids"])) == (True, 1, 0, 1)
    r = cli("sweep", "--older-than", "0s")
    assert r.stdout.startswith("deleted 1 archived and 0 failed message(s) older than 0s from ")
    assert list((cli.state / "archive").rglob("*--m")) == []


def test_status_of_a_project_with_no_agent_says_none_and_exits_3_with_no_daemon(cli):
    cli("init")
    r = cli("status", ok=False)
    assert r.exit_code == 3
    lines = r.stdout.splitlines()
    assert "agents     (none)" in lines and "daemon     not running" in lines
    assert lines[-1] == "health     no daemon is running (relay.lock is not held)"
    doc = json.loads(cli("status", "--json").stdout)
    assert doc["agents"] == [] and doc["health"] == {"ok": False, "exit": 3,
                                                      "problems": ["no daemon is running (relay.lock is not held)"]}


def test_search_prints_each_match_on_two_lines_its_thread_and_subject_only_when_it_has_them(team):
    plan = team("send", "--from", "Alice", "--to", "Bob,Carol", "--thread", "plan", "--subject", "the zebra plan",
                "a zebra   crossing\nhere").stdout.strip()
    bare = team("send", "--from", "Bob", "--to", "Alice", "zebra without subject").stdout.strip()
    team("run", "--once", "-q")
    at = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z"
    lines = team("search", "zebra").stdout.splitlines()
    assert len(lines) == 4
    assert re.fullmatch(f"{bare}  {at}  Bob -> Alice", lines[0])                  # newest first, nothing trailing
    assert lines[1] == "    **zebra** without subject"
    assert re.fullmatch(f"{plan}  {at}  Alice -> Bob, Carol  \\[plan\\]  the zebra plan", lines[2])
    assert lines[3] == "    a **zebra** crossing here"                           # the snippet's spaces folded
    assert team("search", "zebra", "--from", "Alice").stdout.splitlines()[0].startswith(plan)
    assert team("search", "nothinghere").stdout == "no messages match\n"
    assert team("search", "nothinghere", "--json").stdout.strip() == "[]"
    [doc] = json.loads(team("search", "zebra", "--limit", "1", "--json").stdout)
    assert (doc["id"], doc["thread"], doc["subject"], doc["to"]) == (bare, None, None, ["Alice"])


def test_inbox_says_no_new_messages_or_no_messages_with_all_and_its_jsonl_is_one_object_a_line(team):
    assert team("inbox", "Bob").stdout == "no new messages for Bob\n"
    assert team("inbox", "Bob", "--all").stdout == "no messages for Bob\n"
    assert team("inbox", "Bob", "--jsonl").stdout == "" and team("inbox", "Bob", "--json").stdout.strip() == "[]"
    one = team("send", "--from", "Alice", "--to", "Bob", "--subject", "first", "one").stdout.strip()
    two = team("send", "--from", "Carol", "--to", "Bob", "--subject", "second", "two").stdout.strip()
    team("run", "--once", "-q")
    docs = [json.loads(line) for line in team("inbox", "Bob", "--jsonl", "--ack").stdout.splitlines()]
    assert [(d["id"], d["subject"], d["state"]) for d in docs] == [(one, "first", "cur"), (two, "second", "cur")]
    assert team("inbox", "Bob").stdout == "no new messages for Bob\n"          # --ack marked both read
    assert [d["id"] for d in json.loads(team("inbox", "Bob", "--all", "--json").stdout)] == [one, two]
    assert [json.loads(x)["state"] for x in team("inbox", "Bob", "--all", "--jsonl").stdout.splitlines()] == [
        "cur", "cur"]


def test_read_as_relay_agent_marks_read_only_the_agents_own_new_copy_and_refuses_a_stranger(team, monkeypatch):
    mid = team("send", "--from", "Alice", "--to", "Bob", "--subject", "s", "hello").stdout.strip()
    team("run", "--once", "-q")
    monkeypatch.setenv("RELAY_AGENT", "Alice")              # its sender: shown, Bob's copy left unread
    assert team("read", mid).stdout.startswith(f"--- message 1 of 1: {mid}")
    monkeypatch.delenv("RELAY_AGENT")
    assert [d["id"] for d in json.loads(team("inbox", "Bob", "--json").stdout)] == [mid]
    monkeypatch.setenv("RELAY_AGENT", "Carol")
    r = team("read", mid, ok=False)
    assert r.exit_code == 1 and r.stdout == "" and r.stderr == (
        f"relay: no message '{mid}' that Carol sent or received\n")
    monkeypatch.setenv("RELAY_AGENT", "Bob")
    doc = json.loads(team("read", mid, "--json").stdout)
    assert doc["state"] == "cur" and doc["path"].endswith(f"inbox/Bob/cur/{mid}.json:2,S")
    monkeypatch.delenv("RELAY_AGENT")
    assert team("inbox", "Bob").stdout == "no new messages for Bob\n"


def _delivered_to_bob(team, body="hello Bob", *extra):
    mid = team("send", "--from", "Alice", "--to", "Bob", *extra, body).stdout.split()[0]
    team("run", "--once")
    return mid


def test_a_reply_to_without_to_goes_to_the_original_sender_in_its_thread(team):
    mid = _delivered_to_bob(team, "question", "--thread", "t9", "--subject", "plan")
    r = team("send", "--from", "Bob", "--reply-to", mid, "answer")
    assert r.exit_code == 0
    team("run", "--once")
    [doc] = json.loads(team("inbox", "Alice", "--json").stdout)
    assert (doc["from"], doc["to"], doc["thread"], doc["subject"], doc["body"]) == \
        ("Bob", ["Alice"], "t9", "Re: plan", "answer")


@pytest.mark.timeout_s(15)
def test_send_with_a_duration_after_wait_delivered_reads_the_body_from_stdin_and_times_out(team):
    r = team("send", "--from", "Alice", "--to", "Bob", "--wait-delivered", "0", input="the body\n", ok=False)
    mid = r.stdout.split()[0]
    assert r.exit_code == 124
    assert f"relay: {mid} was not delivered to every recipient in 0s" in r.stderr
    team("run", "--once")
    [doc] = json.loads(team("inbox", "Bob", "--json").stdout)
    assert doc["body"] == "the body\n"


@pytest.mark.timeout_s(15)
@pytest.mark.parametrize("flag", ["--wait-read", "--wait-acked"])
def test_send_with_a_duration_after_wait_read_or_acked_reads_the_body_from_stdin(team, flag):
    r = team("send", "--from", "Alice", "--to", "Bob", flag, "0", input="the body\n", ok=False)
    mid = r.stdout.split()[0]
    assert r.exit_code == 124
    team("run", "--once")
    [doc] = json.loads(team("inbox", "Bob", "--json").stdout)
    assert (doc["id"], doc["body"]) == (mid, "the body\n")


@pytest.mark.timeout_s(15)
def test_send_without_a_wait_flag_or_body_reads_stdin_and_returns_at_once_with_the_no_relay_note(team):
    r = team("send", "--from", "Alice", "--to", "Bob", input="piped\n")
    mid = r.stdout.split()[0]
    assert r.stdout == f"{mid}\n"
    assert r.stderr == (f"relay: no relay is running here: {mid} waits in Alice's outbox until one runs (start one: "
                        "relay run; as a service: relay service systemd)\n")


def test_send_says_no_relay_is_running_only_when_none_holds_the_lock_nor_for_a_repeated_request(team):
    from relay.files.lock import DaemonLock
    first = team("send", "--from", "Alice", "--to", "Bob", "--request-id", "r1", "once")
    mid = first.stdout.split()[0]
    assert "no relay is running here" in first.stderr
    again = team("send", "--from", "Alice", "--to", "Bob", "--request-id", "r1", "once")
    assert again.stdout == f"{mid}\n"
    assert again.stderr == f"relay: request id 'r1' was sent before as {mid}; not sent again\n"
    lock = DaemonLock(team.state / "relay.lock").acquire()
    try:
        held = team("send", "--from", "Alice", "--to", "Bob", "another")
    finally:
        lock.release()
    assert held.stderr == "" and len(held.stdout.split()) == 1


@pytest.mark.timeout_s(15)
def test_inbox_wait_with_an_empty_agent_takes_the_name_after_wait(team):
    _delivered_to_bob(team)
    r = team("inbox", "", "--wait", "Bob")
    assert "hello Bob" in r.stdout and "from:    Alice" in r.stdout


@pytest.mark.timeout_s(15)
def test_inbox_takes_relay_agent_with_and_without_a_wait_duration(team, monkeypatch):
    _delivered_to_bob(team)
    monkeypatch.setenv("RELAY_AGENT", "Bob")
    plain = team("inbox")
    assert "hello Bob" in plain.stdout
    waited = team("inbox", "--wait", "1")
    assert "hello Bob" in waited.stdout and waited.stdout == plain.stdout


@pytest.mark.timeout_s(15)
def test_inbox_of_a_named_agent_with_a_bare_wait_shows_what_is_there(team):
    _delivered_to_bob(team)
    r = team("inbox", "Bob", "--wait")
    assert "hello Bob" in r.stdout


@pytest.mark.timeout_s(15)
@pytest.mark.parametrize("flags", [["--all"], ["--recent", "1"]])
def test_inbox_wait_with_all_or_recent_also_shows_what_was_read(team, flags):
    old = _delivered_to_bob(team, "old one")
    team("read", old, "--agent", "Bob")
    new = _delivered_to_bob(team, "new one")
    docs = json.loads(team("inbox", "Bob", "--wait", "5", *flags, "--json").stdout)
    assert sorted((d["id"], d["state"]) for d in docs) == [(old, "cur"), (new, "new")]


def test_read_as_relay_agent_marks_its_copy_read(team, monkeypatch):
    mid = _delivered_to_bob(team)
    monkeypatch.setenv("RELAY_AGENT", "Bob")
    assert json.loads(team("read", mid, "--json").stdout)["state"] == "cur"
    assert "no new messages for Bob" in team("inbox", "Bob").stdout


def test_read_by_the_sender_shows_the_message_and_leaves_the_recipients_copy_unread(team, monkeypatch):
    mid = _delivered_to_bob(team)
    monkeypatch.setenv("RELAY_AGENT", "Alice")
    r = team("read", mid, "--json")
    doc = json.loads(r.stdout)
    assert (doc["id"], doc["body"]) == (mid, "hello Bob") and r.stderr == ""
    assert doc["state"] == "new" and Path(doc["path"]).exists()         # Bob's copy, as it is
    assert "(read)" not in team("read", mid).stdout
    assert [d["state"] for d in json.loads(team("inbox", "Bob", "--json").stdout)] == ["new"]


def test_inbox_all_ack_marks_only_the_new_ones_and_labels_the_read_one_as_it_was(team):
    old = _delivered_to_bob(team, "old one")
    team("read", old, "--agent", "Bob")
    new = _delivered_to_bob(team, "new one")
    r = team("inbox", "Bob", "--all", "--ack", "--json")
    docs = {d["id"]: d for d in json.loads(r.stdout)}
    assert docs[old]["state"] == docs[new]["state"] == "cur" and r.stderr == ""
    assert Path(docs[old]["path"]).exists() and Path(docs[new]["path"]).exists()
    assert "no new messages for Bob" in team("inbox", "Bob").stdout


def test_search_shows_no_subject_as_nothing_not_none(team):
    mid = _delivered_to_bob(team, "findable words")
    r = team("search", "findable")
    first, snippet = r.stdout.splitlines()
    assert first.startswith(f"{mid}  ") and first.endswith("Alice -> Bob")
    assert "None" not in r.stdout and snippet == "    **findable** words"


@pytest.mark.timeout_s(15)
def test_inbox_of_relay_agent_without_wait_says_at_once_that_nothing_is_new(team, monkeypatch):
    monkeypatch.setenv("RELAY_AGENT", "Bob")
    r = team("inbox")
    assert r.stdout == "no new messages for Bob\n"


def test_inbox_ack_labels_an_unreadable_envelope_still_new_and_leaves_it_in_new(team):
    mid = _delivered_to_bob(team)
    junk = team.state / "inbox" / "Bob" / "new" / f"{IdGenerator().new(time.time())}.json"
    junk.write_text("not json{")
    docs = {d["id"]: d for d in json.loads(team("inbox", "Bob", "--ack", "--json").stdout)}
    bad = docs[junk.name.removesuffix(".json")]
    assert bad["error"].startswith("unreadable envelope") and (bad["state"], bad["path"]) == ("new", str(junk))
    assert docs[mid]["state"] == "cur" and junk.exists()


def test_search_shows_a_message_whose_sent_time_the_ledger_lacks_without_a_time(team):
    import sqlite3
    mid = _delivered_to_bob(team, "timeless words", "--subject", "old row")
    with sqlite3.connect(team.state / "ledger.sqlite") as db:
        db.execute("UPDATE messages SET sent_at = NULL WHERE id = ?", (mid,))
    db.close()
    first, snippet = team("search", "timeless").stdout.splitlines()
    assert first == f"{mid}    Alice -> Bob  old row"
    assert snippet == "    **timeless** words"


def test_run_once_takes_patience_and_without_once_refuses_it(team):
    r = team("run", "--once", "--patience", "1", "-q")
    assert r.stdout.startswith("relayed 0 message(s), 0 failed, 0 to retry, in ")
    r = team("run", "--patience", "1", ok=False)
    assert r.exit_code == 2 and "--patience is for --once" in r.stderr


def test_run_once_with_a_federation_url_runs_and_without_one_is_refused_naming_the_team(team):
    mid = team("send", "--from", "Alice", "--to", "Bob", "local").stdout.split()[0]
    toml = team.state / "relay.toml"
    toml.write_text('[federation]\nteam = "t"\nnode = "n1"\n')
    r = team("run", "--once", "-q", ok=False)
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.startswith("relay: [federation] of team t: no federation url here")
    toml.write_text('[federation]\nurl = "redis://127.0.0.1:1/0"\nteam = "t"\nnode = "n1"\n')
    r = team("run", "--once", "-q")
    lines = r.stdout.splitlines()
    assert lines[0].startswith("relayed 1 message(s), 0 failed") and lines[1] == "federation: published 0, received 0"
    assert [d["id"] for d in json.loads(team("inbox", "Bob", "--json").stdout)] == [mid]


def test_status_lists_the_agents_by_name(team):
    r = team("status", ok=False)
    assert r.exit_code == 3 and "\nagents     Alice, Bob, Carol\n" in r.stdout


def test_demo_titles_each_message_by_its_subject_else_the_start_of_its_body(cli, tmp_path):
    src = tmp_path / "boxes"
    (src / "Ann").mkdir(parents=True)
    (src / "Ann" / "a").write_text("TO: Ben\nSUBJECT: the plan\n\nbody of the plan")
    (src / "Ann" / "b").write_text("TO: Ben\n\n" + "no subject, so the body stands in " * 3)
    (src / "Ben").mkdir()
    r = cli("demo", str(src))
    lines = r.stdout.splitlines()
    assert "  from Ann      [message] the plan" in lines
    assert "  from Ann      [message] no subject, so the body stands in no subject, so …" in lines
    assert "None" not in r.stdout


def test_status_of_a_federated_project_exits_3_with_no_daemon_and_5_with_one_whose_link_is_down(team):
    """Federated, the server unreachable (a run recorded the link down): with no daemon the exit
    is still 3 (no daemon), the federation adding nothing; with the daemon's lock held, the link
    down is a federation problem of its own, exit 5, said on the health line."""
    from relay.core.health import EXIT_FEDERATION
    from relay.files.lock import DaemonLock
    (team.state / "relay.toml").write_text('[federation]\nurl = "redis://127.0.0.1:1/0"\nteam = "t"\nnode = "n1"\n')
    team("run", "--once", "-q")
    r = team("status", ok=False)
    assert r.exit_code == 3
    assert r.stdout.splitlines()[-1] == "health     no daemon is running (relay.lock is not held)"
    lock = DaemonLock(team.state / "relay.lock").acquire()
    try:
        r = team("status", ok=False)
    finally:
        lock.release()
    assert r.exit_code == EXIT_FEDERATION
    assert r.stdout.splitlines()[-1].startswith("health     federation: the link to the team's server is down (")
