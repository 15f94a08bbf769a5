"""Every verb through click's CliRunner, in-process."""
import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from relay.cli import main




def drop(cli, sender, name, text):
    box = cli.state / "outbox" / sender
    box.mkdir(parents=True, exist_ok=True)
    (box / f".{name}.tmp").write_text(text)
    os.rename(box / f".{name}.tmp", box / name)


def test_every_verb_has_help_and_is_in_the_docs_command_table():
    table = (Path(__file__).parent.parent / "docs" / "operating.md").read_text()
    runner = CliRunner()
    for name, cmd in main.commands.items():
        assert cmd.help, f"relay {name} has no help text"
        result = runner.invoke(main, [name, "--help"])
        assert result.exit_code == 0 and "Usage" in result.output
        assert re.search(rf"^\| `relay {name}\b", table, flags=re.M), f"relay {name} is not in docs/operating.md's table"


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
