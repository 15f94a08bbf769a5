"""Team state (relay state, the Project's and the Agent's state_*): versions, compare-and-set
refused with the holder named, even across two ledger connections racing; every change an
event. relay show --path: the messages an outbox path has carried, newest first. relay commands:
the operator commands recorded, newest first, or one by id."""
import json
import os
import re
import sqlite3
import threading

import pytest

import relay
from relay.agent.api import Project
from relay.core.message import iso
from relay.errors import NotFound, RelayError, StateConflict
from relay.ledger.history import History
from relay.ledger.ledger import Ledger
from relay.ledger.state import MAX_VALUE_BYTES

ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z\Z")




def ledger_path(cli):
    return cli.state / "ledger.sqlite"


def state_events(cli):
    with History(Ledger(ledger_path(cli), readonly=True)) as h:
        return [(e["event"], e["detail"], e["actor"], e["message_id"]) for e in h.events_after(0)
                if e["event"].startswith("state-")]


def drop(cli, sender, name, text):
    box = cli.state / "outbox" / sender
    box.mkdir(parents=True, exist_ok=True)
    (box / f".{name}.tmp").write_text(text)
    os.rename(box / f".{name}.tmp", box / name)


# -- team state: the Python API ------------------------------------------------------------------

def test_the_ledger_has_migration_51_team_state(team):
    with History(Ledger(ledger_path(team), readonly=True)) as h:
        assert (51, "team state", True) in [(v, n, ok) for v, n, ok in h.checks.migrations()]


def test_set_get_list_delete_with_versions_and_events(crew):
    alice, bob = crew.agent("Alice"), crew.agent("Bob")
    assert alice.state_get("plan") is None and alice.state_list() == []
    first = alice.state_set("plan", '{"phase": 1}')
    assert (first.key, first.value, first.version, first.updated_by) == ("plan", '{"phase": 1}', 1, "Alice")
    assert first.updated_at == crew.clock.now
    crew.clock.advance(5)
    second = bob.state_set("plan", '{"phase": 2}', if_version=1)
    assert (second.version, second.updated_by, second.updated_at) == (2, "Bob", crew.clock.now)
    assert alice.state_get("plan") == second
    bob.state_set("tasks/42", "Carol")
    assert [e.key for e in alice.state_list()] == ["plan", "tasks/42"]
    assert [e.key for e in alice.state_list(prefix="tasks/")] == ["tasks/42"]
    assert second.as_dict() == {"key": "plan", "value": '{"phase": 2}', "version": 2,
                                "updated_at": iso(crew.clock.now), "updated_by": "Bob"}
    gone = alice.state_delete("plan", if_version=2)
    assert (gone.value, gone.version) == ('{"phase": 2}', 2)
    assert alice.state_get("plan") is None and [e.key for e in alice.state_list()] == ["tasks/42"]
    with pytest.raises(NotFound, match="has no value; nothing deleted"):
        alice.state_delete("plan")
    # every change an event, with who made it; no message is named
    assert state_events(crew) == [
        ("state-set", "key=plan version=1 bytes=12", "Alice", None),
        ("state-set", "key=plan version=2 bytes=12", "Bob", None),
        ("state-set", "key=tasks/42 version=1 bytes=5", "Bob", None),
        ("state-deleted", "key=plan version=3", "Alice", None)]


def test_a_values_size_is_counted_in_utf8_and_a_prefix_lists_its_keys_in_order(crew):
    alice = crew.agent("Alice")
    for key in ("task/2", "task/1", "task/10", "tasks", "other"):
        alice.state_set(key, "déjà")
    assert [e.key for e in alice.state_list(prefix="task/")] == ["task/1", "task/10", "task/2"]
    assert state_events(crew)[0] == ("state-set", "key=task/2 version=1 bytes=6", "Alice", None)


def test_compare_and_set_refusals_name_the_version_and_the_holder(crew):
    alice, bob = crew.agent("Alice"), crew.agent("Bob")
    alice.state_set("build-lock", "Alice: release 2.1", if_absent=True)
    with pytest.raises(StateConflict) as taken:
        bob.state_set("build-lock", "Bob", if_absent=True)
    assert "version 1, set by Alice" in str(taken.value) and iso(crew.clock.now) in str(taken.value)
    assert taken.value.key == "build-lock" and taken.value.expected is None
    assert (taken.value.current.value, taken.value.current.updated_by) == ("Alice: release 2.1", "Alice")
    with pytest.raises(StateConflict, match="at version 1, set by Alice.*not version 7; not set") as stale:
        bob.state_set("build-lock", "Bob", if_version=7)
    assert stale.value.expected == 7
    with pytest.raises(StateConflict, match="not version 3; not deleted"):
        bob.state_delete("build-lock", if_version=3)
    with pytest.raises(StateConflict, match="has no value \\(version 1 was expected\\)") as absent:
        bob.state_set("other", "x", if_version=1)
    assert absent.value.current is None
    assert alice.state_get("build-lock").value == "Alice: release 2.1"      # nothing changed
    assert [e[1] for e in state_events(crew)] == ["key=build-lock version=1 bytes=18"]     # refusals change nothing


def test_a_version_is_never_given_twice_across_a_delete(crew):
    """An old version does not match a key deleted and set again (no ABA)."""
    alice, bob = crew.agent("Alice"), crew.agent("Bob")
    seen = alice.state_set("lead", "Alice")
    bob.state_delete("lead")
    again = bob.state_set("lead", "Bob", if_absent=True)
    assert again.version == 3
    with pytest.raises(StateConflict, match="at version 3, set by Bob"):
        alice.state_set("lead", "Alice", if_version=seen.version)


def test_bad_keys_values_and_versions_are_refused(crew):
    alice = crew.agent("Alice")
    for key in ("", "has space", "-leading", "x" * 129, "tab\there", "../up", None):
        with pytest.raises(RelayError, match="invalid state key"):
            alice.state_set(key, "v")
    assert alice.state_set("a" * 128, "v").version == 1
    with pytest.raises(RelayError, match=f"is {MAX_VALUE_BYTES + 1} bytes, over the {MAX_VALUE_BYTES}"):
        alice.state_set("big", "x" * (MAX_VALUE_BYTES + 1))
    assert alice.state_set("big", "é" * (MAX_VALUE_BYTES // 2)).version == 1       # 64 KiB in UTF-8 exactly
    with pytest.raises(RelayError, match="is text, not dict"):
        alice.state_set("k", {"a": 1})
    with pytest.raises(RelayError, match="lone surrogate"):
        alice.state_set("k", "\udc80")
    for version in (0, -1, True, "2"):
        with pytest.raises(RelayError, match="whole number 1 or more"):
            alice.state_set("k", "v", if_version=version)
    with pytest.raises(RelayError, match="not both"):
        alice.state_set("k", "v", if_version=1, if_absent=True)
    with pytest.raises(relay.InvalidName, match="relay's own name"):
        crew.agent("System").state_set("k", "v")
    with Project(crew.root, clock=crew.clock) as project:     # the Project's, in the name it is given
        assert project.state_set("lead", "Bob", actor="coordinator").updated_by == "coordinator"
        for actor in ("", "two\nlines", None, "a" * 201):
            with pytest.raises(RelayError, match="actor of a state change is 1 to 200 characters"):
                project.state_delete("lead", actor=actor)
        assert project.state_set("other", "x", actor="a").updated_by == "a"
        assert project.state_set("other", "x", actor="a" * 200).updated_by == "a" * 200
        project.state_delete("other", actor="a" * 200)
        assert project.state_delete("lead", actor="coordinator").value == "Bob"
    assert [e.key for e in alice.state_list()] == ["a" * 128, "big"]
    assert state_events(crew)[-1] == ("state-deleted", "key=lead version=2", "coordinator", None)


def test_two_ledger_connections_racing_one_compare_and_set(team, clock):
    """BEGIN IMMEDIATE makes the check and the write one step: of two connections taking each key
    at the same instant, exactly one gets it and the other is told who has it."""
    ledgers = [Ledger(ledger_path(team)), Ledger(ledger_path(team))]
    keys = [f"lock-{i}" for i in range(20)]
    results = {k: [] for k in keys}
    start = threading.Barrier(2)

    def take(ledger, who):
        for key in keys:
            start.wait(timeout=10)
            results[key].append((who, *ledger.state.set(key, who, clock(), who, if_absent=True)))

    threads = [threading.Thread(target=take, args=(led, name)) for led, name in zip(ledgers, ("Alice", "Bob"))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    finally:
        for led in ledgers:
            led.close()
    for key, outcomes in results.items():
        won = [(who, row) for who, done, row in outcomes if done]
        lost = [(who, row) for who, done, row in outcomes if not done]
        assert len(won) == 1 and len(lost) == 1, (key, outcomes)
        assert lost[0][1]["updated_by"] == won[0][0] and lost[0][1]["version"] == 1
    with History(Ledger(ledger_path(team), readonly=True)) as h:
        assert {r["key"]: r["updated_by"] for r in h.state.entries()} == {k: w for k, outs in results.items()
                                                                          for w, done, _ in outs if done}
    assert len(state_events(team)) == len(keys)       # one event per key taken, none for a refusal


def test_a_version_race_lets_exactly_one_writer_through(team, clock):
    with Ledger(ledger_path(team)) as led:
        led.state.set("plan", "v1", clock(), "Alice")
    ledgers = [Ledger(ledger_path(team)), Ledger(ledger_path(team))]
    start = threading.Barrier(2)
    out = []

    def write(ledger, who):
        start.wait(timeout=10)
        out.append((who, ledger.state.set("plan", who, clock(), who, if_version=1)[0]))

    threads = [threading.Thread(target=write, args=(led, who)) for led, who in zip(ledgers, ("Bob", "Carol"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for led in ledgers:
        led.close()
    assert sorted(done for _, done in out) == [False, True]
    winner = next(who for who, done in out if done)
    with History(Ledger(ledger_path(team), readonly=True)) as h:
        row = h.state.get("plan")
    assert (row["value"], row["version"]) == (winner, 2)


# -- team state: the CLI ------------------------------------------------------------------------

def test_state_verbs_and_their_json(team):
    r = team("state", "set", "build-lock", "Alice: release", "--if-absent", "--as", "Alice")
    assert re.fullmatch(r"build-lock: version 1, set by Alice at \S+Z\n", r.output)
    assert team("state", "get", "build-lock").output == "Alice: release\n"
    doc = json.loads(team("state", "get", "build-lock", "--json").output)
    assert set(doc) == {"key", "value", "version", "updated_at", "updated_by"}
    assert (doc["value"], doc["version"], doc["updated_by"]) == ("Alice: release", 1, "Alice")
    assert ISO.match(doc["updated_at"])
    team("state", "set", "plan", "-", "--as", "Bob", input='{"phase": 1}\n')
    listed = json.loads(team("state", "list", "--json").output)
    assert [(d["key"], d["value"], d["version"], d["updated_by"]) for d in listed] == [
        ("build-lock", "Alice: release", 1, "Alice"), ("plan", '{"phase": 1}\n', 1, "Bob")]
    table = team("state", "list").output
    assert re.search(r"^build-lock\s+1\s+\S+Z\s+Alice\s+Alice: release$", table, flags=re.MULTILINE)
    assert json.loads(team("state", "list", "--prefix", "pl", "--json").output)[0]["key"] == "plan"
    new = json.loads(team("state", "set", "plan", "two", "--if-version", "1", "--as", "Carol", "--json").output)
    assert (new["version"], new["updated_by"]) == (2, "Carol")
    gone = json.loads(team("state", "delete", "plan", "--if-version", "2", "--as", "Carol", "--json").output)
    assert (gone["deleted"], gone["version"], gone["value"]) == (True, 2, "two")
    assert "no team state under 'plan'" in team("state", "list", "--prefix", "plan").output
    assert json.loads(team("state", "list", "--prefix", "zzz", "--json").output) == []


def test_state_changes_show_in_relay_tail_with_who_made_them(team):
    team("state", "set", "lead", "Alice", "--as", "Alice")
    team("state", "delete", "lead", "--as", "Bob")
    lines = [json.loads(line) for line in team("tail", "--json").output.splitlines()]
    assert [(e["event"], e["detail"], e["actor"], e["id"]) for e in lines if e["event"].startswith("state-")] == [
        ("state-set", "key=lead version=1 bytes=5", "Alice", None), ("state-deleted", "key=lead version=2", "Bob", None)]
    text = team("tail").output
    assert re.search(r"state-set\s+by Alice: key=lead version=1", text)


def test_the_actor_is_relay_agent_else_the_operator(team, monkeypatch):
    monkeypatch.setenv("RELAY_AGENT", "Carol")
    team("state", "set", "a", "1")
    monkeypatch.delenv("RELAY_AGENT")
    team("state", "set", "b", "2")
    by = {d["key"]: d["updated_by"] for d in json.loads(team("state", "list", "--json").output)}
    assert by["a"] == "Carol" and by["b"].startswith("operator")


def test_state_refusals_are_one_line_with_the_right_exit(team):
    team("state", "set", "build-lock", "Alice", "--as", "Alice")
    r = team("state", "set", "build-lock", "Bob", "--if-absent", "--as", "Bob", ok=False)
    assert r.exit_code == 1 and "version 1, set by Alice" in r.stderr and "Traceback" not in r.output
    r = team("state", "set", "build-lock", "Bob", "--if-version", "4", ok=False)
    assert r.exit_code == 1 and "not version 4; not set" in r.stderr
    r = team("state", "delete", "build-lock", "--if-version", "9", ok=False)
    assert r.exit_code == 1 and "not deleted" in r.stderr
    assert team("state", "get", "build-lock").output == "Alice\n"
    r = team("state", "get", "nothing-here", ok=False)
    assert r.exit_code == 1 and "'nothing-here' has no value" in r.stderr
    r = team("state", "delete", "nothing-here", ok=False)
    assert r.exit_code == 1 and "nothing deleted" in r.stderr
    r = team("state", "set", "bad key", "v", ok=False)
    assert r.exit_code == 1 and "invalid state key 'bad key'" in r.stderr
    r = team("state", "get", "bad/../key!", ok=False)
    assert r.exit_code == 1 and "invalid state key" in r.stderr
    r = team("state", "set", "big", "-", input="x" * (MAX_VALUE_BYTES + 10), ok=False)
    assert r.exit_code == 1 and f"over the {MAX_VALUE_BYTES} (64 KiB)" in r.stderr
    r = team("state", "set", "k", "v", "--if-absent", "--if-version", "1", ok=False)
    assert r.exit_code == 2 and "not both" in r.stderr
    r = team("state", "set", "k", "v", "--if-version", "0", ok=False)
    assert r.exit_code == 2 and "--if-version" in r.stderr
    r = team("state", "set", "k", "v", "--as", "Zed", ok=False)
    assert r.exit_code == 1 and "Zed" in r.stderr
    r = team("state", "set", "k", "v", "--as", "System", ok=False)
    assert r.exit_code == 1 and "relay's own name" in r.stderr
    assert [d["key"] for d in json.loads(team("state", "list", "--json").output)] == ["build-lock"]


def test_a_state_row_this_relay_cannot_read_is_named_not_fatal(team):
    team("state", "set", "good", "v")
    team("state", "set", "odd", "v")
    db = sqlite3.connect(ledger_path(team), isolation_level=None)
    db.execute("UPDATE team_state SET version = 'x' WHERE key = 'odd'")
    db.close()
    r = team("state", "list", "--json")
    assert [d["key"] for d in json.loads(r.stdout)] == ["good"]
    assert "team_state row 'odd': column version holds 'x'" in r.stderr
    r = team("state", "get", "odd", ok=False)
    assert r.exit_code == 1 and "column version holds 'x'" in r.stderr
    r = team("state", "set", "odd", "w", ok=False)
    assert r.exit_code == 1 and "column version holds 'x', which this relay cannot read; nothing changed" in r.stderr


@pytest.mark.parametrize("version, shown", [(-1, "-1"), (1.5, "1.5")])
def test_a_state_version_below_zero_or_not_whole_cannot_be_read(team, version, shown):
    team("state", "set", "good", "v")
    team("state", "set", "odd", "v")
    db = sqlite3.connect(ledger_path(team), isolation_level=None)
    db.execute("UPDATE team_state SET version = ? WHERE key = 'odd'", (version,))
    db.close()
    r = team("state", "list", "--json")
    assert [d["key"] for d in json.loads(r.stdout)] == ["good"]
    assert f"team_state row 'odd': column version holds {shown}" in r.stderr


# -- relay show --path ---------------------------------------------------------------------------

def test_show_path_lists_every_message_a_reused_name_carried_newest_first(team):
    ids = []
    for n in (1, 2, 3):
        drop(team, "Alice", "msg", f"TO: Bob\nSUBJECT: round {n}\n\nbody {n}")
        team("run", "--once", "-q")
        ids.append(json.loads(team("audit", "--json", "--limit", "1").stdout)[0]["id"])
    drop(team, "Bob", "msg", "TO: Alice\n\nother sender, same name")
    team("run", "--once", "-q")
    docs = json.loads(team("show", "--path", "outbox/Alice/msg", "--json").output)
    assert [d["id"] for d in docs] == ids[::-1]
    assert [d["subject"] for d in docs] == ["round 3", "round 2", "round 1"]
    assert all(d["source_path"] == "outbox/Alice/msg" and d["body"] for d in docs)
    assert [e["event"] for e in docs[0]["events"]] == ["discovered", "claimed", "delivered", "archived"]
    assert docs[0] == json.loads(team("show", ids[2], "--json").output)      # each as relay show ID has it
    text = team("show", "--path", "outbox/Alice/msg").output
    assert text.startswith("3 message(s) from outbox/Alice/msg, newest first")
    assert text.index(ids[2]) < text.index(ids[1]) < text.index(ids[0]) and "body 1" in text
    assert all(team("show", mid).output.strip() in text for mid in ids)    # receipts too, as relay show ID
    # the same path from the project root, or absolute
    for path in (".relay/outbox/Alice/msg", str(team.state / "outbox/Alice/msg")):
        assert [d["id"] for d in json.loads(team("show", "--path", path, "--json").output)] == ids[::-1]
    r = team("show", "--path", "outbox/Alice/msg", "--limit", "1")
    assert ids[2] in r.stdout and ids[1] not in r.stdout and "stopped at the limit of 1" in r.stderr


def test_show_path_refusals(team):
    r = team("show", "--path", "outbox/Alice/never", ok=False)
    assert r.exit_code == 1 and "no message from outbox/Alice/never in the ledger" in r.stderr
    drop(team, "Alice", "waiting", "TO: Bob\n\nnot taken yet")
    r = team("show", "--path", "outbox/Alice/waiting", ok=False)
    assert r.exit_code == 1 and "relay has not taken yet" in r.stderr
    for bad, why in (("inbox/Bob/new/x.json", "not an outbox path"), ("outbox/Alice", "not an outbox path"),
                     ("outbox/Alice/sub/x", "not an outbox path"), ("outbox/../x", "no agent name"),
                     ("outbox/Alice/..", "no file name"), ("/etc/passwd", "not inside the state directory")):
        r = team("show", "--path", bad, ok=False)
        assert r.exit_code == 2 and why in r.stderr and "outbox/AGENT/NAME" in r.stderr, bad
    r = team("show", ok=False)
    assert r.exit_code == 2 and "name a message ID, or --path" in r.stderr
    r = team("show", "01ABC", "--path", "outbox/Alice/msg", ok=False)
    assert r.exit_code == 2
    r = team("show", "01ABC", "--limit", "2", ok=False)
    assert r.exit_code == 2 and "--limit goes with --path" in r.stderr


# -- relay commands ------------------------------------------------------------------------------

def test_commands_lists_the_recorded_operator_commands_newest_first(team):
    team("ping", "Bob", "--command-id", "first-ping")
    team("retry", "01AAAAAAAAAAAAAAAAAAAAAAAA", ok=False)
    team("archive-agent", "Carol", "--command-id", "retire-carol")
    docs = json.loads(team("commands", "--json").output)
    assert [d["verb"] for d in docs] == ["archive-agent", "retry", "ping"]
    assert set(docs[0]) == {"id", "verb", "arguments", "actor", "at", "result"}
    assert docs[0]["arguments"] == {"name": "Carol", "undo": False} and docs[0]["id"] == "retire-carol"
    assert docs[1]["id"].startswith("auto-") and docs[1]["result"]["code"] == 1
    assert docs[1]["result"]["errors"] and docs[2]["result"] == {"lines": docs[2]["result"]["lines"], "errors": [],
                                                                  "code": 0}
    assert all(ISO.match(d["at"]) and d["actor"].startswith("operator") for d in docs)
    table = team("commands").output.splitlines()
    assert table[0].split()[:6] == ["AT", "ID", "VERB", "ACTOR", "RESULT", "ARGUMENTS"]
    assert re.match(r"\S+Z\s+retire-carol\s+archive-agent\s+operator\S*\s+ok\s+\{", table[1])
    assert re.match(r"\S+Z\s+auto-\S+\s+retry\s+operator\S*\s+exit 1\s+\{", table[2])
    assert [d["verb"] for d in json.loads(team("commands", "--verb", "ping", "--json").output)] == ["ping"]
    r = team("commands", "--limit", "1")
    assert "retire-carol" in r.stdout and "first-ping" not in r.stdout and "stopped at the limit of 1" in r.stderr
    assert len(json.loads(team("commands", "--limit", "2", "--json").stdout)) == 2


def test_commands_shows_one_by_id(team):
    team("ping", "Bob", "--command-id", "first-ping")
    one = json.loads(team("commands", "first-ping", "--json").output)
    assert (one["id"], one["verb"], one["arguments"], one["result"]["code"]) == ("first-ping", "ping",
                                                                              {"agent": "Bob"}, 0)
    assert ISO.match(one["at"])
    text = team("commands", "first-ping").output
    assert "command first-ping" in text and "relay ping" in text and "result     ok" in text
    assert "pinged Bob" in text
    r = team("commands", "no-such-id", ok=False)
    assert r.exit_code == 1 and "no operator command with id 'no-such-id'" in r.stderr
    r = team("commands", "bad\x01id", ok=False)
    assert r.exit_code == 1 and "invalid command id" in r.stderr


def test_commands_with_none_recorded_and_an_unfinished_one(team):
    assert "no operator commands recorded" in team("commands").output
    assert json.loads(team("commands", "--json").output) == []
    with Ledger(ledger_path(team)) as led:      # a command killed before it finished: begun, no result
        led.operations.begin_command("killed-1", "expire", '{"id":"01AAAAAAAAAAAAAAAAAAAAAAAA"}', "operator:x", 1.0e9)
    assert re.search(r"killed-1\s+expire\s+operator:x\s+unfinished", team("commands").output)
    doc = json.loads(team("commands", "killed-1", "--json").output)
    assert doc["result"] is None and doc["at"] == "2001-09-09T01:46:40.000000Z"


def test_a_prefix_of_two_message_ids_is_refused_and_one_of_either_whole_id_is_found(project):
    relay = project.relay()
    project.drop("Ann", "one", "TO: Ben\n\nfirst")
    project.drop("Ann", "two", "TO: Ben\n\nsecond")
    relay.drain()
    a, b = sorted(r["id"] for r in relay.history.audit() if r["sender"] == "Ann")
    common = next(i for i in range(len(a)) if a[i] != b[i])
    with pytest.raises(RelayError, match=r"matches more than one message; give more of the id") as e:
        relay.history.find(a[:common].lower())
    assert repr(a[:common].lower()) in str(e.value)
    assert relay.history.find(a[:common + 1].lower())["id"] == a
    assert relay.history.find(b[:common + 1])["id"] == b
    assert relay.history.find(a)["id"] == a


def test_an_id_named_only_by_files_of_two_agents_is_refused_and_by_one_agents_file_is_found(project):
    relay = project.relay()
    given = "01JAAAAAAAAAAAAAAAAAAAAAAA"
    project.drop("Ann", f"msg-{given.lower()}", "SUBJECT: no recipient\n\nx")
    relay.drain()
    row = relay.history.find(given)
    assert (row["sender"], row["name"], row["status"]) == ("Ann", f"msg-{given.lower()}", "failed")
    assert row["id"] != given
    project.drop("Ben", f"msg-{given.lower()}", "SUBJECT: no recipient either\n\nx")
    relay.drain()
    with pytest.raises(RelayError, match=f"no message has the id {given}, and files of more than one agent are "
                                         f"named msg-{given.lower()}; relay will not say which is meant"):
        relay.history.find(given.lower())
    with pytest.raises(NotFound, match="no message with id '01JAAAAAAAAAAAAAAAAAAAAAAB' in the ledger"):
        relay.history.find("01JAAAAAAAAAAAAAAAAAAAAAAB")


def test_an_outbox_path_is_read_relative_to_the_state_directory_the_root_or_absolute_and_nothing_else():
    import types
    from pathlib import Path

    import click

    from relay.cli.lookups import outbox_source
    inside = types.SimpleNamespace(root=Path("/p"), state=Path("/p/.relay"))
    apart = types.SimpleNamespace(root=Path("/p"), state=Path("/var/relay"))
    for text in ("outbox/Ann/m", ".relay/outbox/Ann/m", "/p/.relay/outbox/Ann/m"):
        assert outbox_source(text, inside) == ("Ann", "m")
    assert outbox_source("outbox/Ann/m", apart) == ("Ann", "m")
    assert outbox_source("/var/relay/outbox/Ann/m", apart) == ("Ann", "m")

    def why(text, layout=inside):
        with pytest.raises(click.BadParameter) as e:
            outbox_source(text, layout)
        assert e.value.param_hint == "--path"
        said = e.value.message
        assert said.startswith(f"{text!r}: ") and said.endswith(
            "; give outbox/AGENT/NAME (a file name in an agent's outbox)")
        return said[len(repr(text)) + 2:].split("; give")[0]
    assert why("outbox/Ann/m\0x") == "a path holds no NUL character"
    assert why("/p/.relay2/outbox/Ann/m") == "not inside the state directory /p/.relay"
    assert why("/p/outbox/Ann/m") == "not inside the state directory /p/.relay"
    assert why(".relay/outbox/Ann/m", apart) == "not an outbox path"
    assert why(".relay2/outbox/Ann/m") == "not an outbox path"
    assert why("outbox/Ann/") == "no file name" and why("outbox/Ann/.") == "no file name"
    assert why("outbox/-Ann/m") == "'-Ann' is no agent name ([A-Za-z0-9][A-Za-z0-9._-]{0,63})"
    assert why("Outbox/Ann/m") == "not an outbox path"


def test_an_id_relay_send_gave_one_agent_that_names_anothers_message_is_refused(project, clock):
    relay = project.relay()
    project.drop("Ben", "m", "TO: Ann\n\nfrom Ben")
    relay.drain()
    [row] = [r for r in relay.history.audit() if r["sender"] == "Ben"]
    assert relay.history.find(row["id"].lower())["sender"] == "Ben"
    relay.ledger.senders.reserve_id(row["id"], "Ann", clock.now)
    with pytest.raises(RelayError) as e:
        relay.history.find(row["id"].lower())
    assert str(e.value) == (f"the id {row['id']} was given to Ann by relay send, but the message recorded under it "
                            "is from Ben; relay will not say which is meant")
    assert relay.history.find(row["id"][:20])["id"] == row["id"]     # a prefix is no id relay send gave


def test_show_of_an_unbound_id_named_by_files_in_two_outboxes_refuses_to_choose(team):
    mid = "01KC3ABCDEFGHJKMNPQRSTVWXY"
    for sender in ("Alice", "Bob"):
        drop(team, sender, f"msg-{mid.lower()}", "TO: Carol\n\nwhich one")
    r = team("show", mid, ok=False)
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr == (f"relay: no message has the id {mid} yet, and files of more than one agent are named "
                        f"msg-{mid.lower()}; relay will not say which is meant\n")
    # one such file is the one meant, found in whichever outbox holds it (lower case or upper)
    os.unlink(team.state / "outbox" / "Alice" / f"msg-{mid.lower()}")
    for given in (mid, mid.lower()):
        assert json.loads(team("show", given, "--json").stdout) == {
            "id": mid, "status": "waiting", "source_path": f"outbox/Bob/msg-{mid.lower()}"}


def test_show_as_an_agent_of_a_message_not_taken_yet_is_the_senders_only(team):
    mid = team("send", "--from", "Alice", "--to", "Bob", "not taken yet").stdout.strip()
    waiting = {"id": mid, "status": "waiting", "source_path": f"outbox/Alice/msg-{mid.lower()}"}
    assert json.loads(team("show", mid, "--agent", "Alice", "--json").stdout) == waiting
    assert json.loads(team("show", mid, "--json").stdout) == waiting
    for other in ("Bob", "Carol"):          # its recipient included: it is not in Bob's hands yet
        r = team("show", mid, "--agent", other, "--json", ok=False)
        assert r.exit_code == 1 and r.stdout == "" and "waiting" not in r.stderr and "outbox/" not in r.stderr


def test_show_path_hints_at_a_file_not_taken_yet_only_to_its_sender_or_the_operator(team):
    drop(team, "Alice", "waiting", "TO: Bob\n\nnot taken yet")
    hint = "a file is there now that relay has not taken yet"
    for agent, hinted in ((None, True), ("Alice", True), ("Bob", False), ("Carol", False)):
        args = ("--agent", agent) if agent else ()
        r = team("show", "--path", "outbox/Alice/waiting", *args, ok=False)
        assert r.exit_code == 1 and "no message from outbox/Alice/waiting in the ledger" in r.stderr, agent
        assert (hint in r.stderr) is hinted, agent
    r = team("show", "--path", "outbox/Alice/never-written", ok=False)      # no file there: no hint
    assert r.exit_code == 1 and r.stderr == "relay: no message from outbox/Alice/never-written in the ledger\n"


def test_show_path_prints_ten_messages_unless_told_and_its_json_lists_them_all(team):
    for n in range(11):
        drop(team, "Alice", "msg", f"TO: Bob\nSUBJECT: round {n}\n\nbody {n}")
        team("run", "--once", "-q")
    r = team("show", "--path", "outbox/Alice/msg")
    assert r.stdout.startswith("10 message(s) from outbox/Alice/msg, newest first")
    assert "round 10" in r.stdout and "round 1\n" in r.stdout and "round 0\n" not in r.stdout
    assert r.stderr == ("relay: stopped at the limit of 10 message(s); outbox/Alice/msg carried more "
                        "(--limit N shows more)\n")
    r = team("show", "--path", "outbox/Alice/msg", "--json")
    assert len(json.loads(r.stdout)) == 11 and r.stderr == ""
    r = team("show", "--path", "outbox/Alice/msg", "--limit", "11")
    assert r.stdout.startswith("11 message(s)") and r.stderr == ""
    r = team("show", "--path", "outbox/Alice/msg", "--json", "--limit", "3")
    assert [d["subject"] for d in json.loads(r.stdout)] == ["round 10", "round 9", "round 8"]
    assert "stopped at the limit of 3 message(s)" in r.stderr


def test_show_gives_a_messages_receipts_to_its_sender_and_the_operator_but_not_to_a_recipient(team):
    mid = team("send", "--from", "Alice", "--to", "Bob", "--priority", "high", "look").stdout.strip()
    team("run", "--once", "-q")
    for agent, told in ((None, True), ("Alice", True), ("Bob", False)):
        args = ("--agent", agent) if agent else ()
        doc = json.loads(team("show", mid, "--json", *args).stdout)
        assert doc["id"] == mid and doc["body"] == "look", agent
        assert ("receipts" in doc and "priority" in doc and "ack_required" in doc) is told, agent
        if told:
            assert doc["priority"] == "high" and doc["ack_required"] is False
            assert [r["recipient"] for r in doc["receipts"]] == ["Bob"]
        text = team("show", mid, *args).stdout
        assert ("\n  priority       high\n  ack_required   no\nreceipts:" in text) is told, agent
        assert "\nevents:" in text
        [story] = json.loads(team("show", "--path", f"outbox/Alice/msg-{mid.lower()}", "--json", *args).stdout)
        assert story["id"] == mid and ("receipts" in story) is told, agent


def test_show_path_refuses_three_parts_not_under_outbox_and_a_file_name_of_dot_or_nothing(team):
    drop(team, "Alice", "msg", "TO: Bob\n\nhello")
    team("run", "--once", "-q")
    for bad, why in (("inbox/Alice/msg", "not an outbox path"), ("archive/Alice/msg", "not an outbox path"),
                     ("outbox/Alice/.", "no file name"), ("outbox/Alice/", "no file name"),
                     ("outbox/Alice/m\0sg", "a path holds no NUL character"),
                     (".relayx/outbox/Alice/msg", "not an outbox path")):
        r = team("show", "--path", bad, ok=False)
        assert r.exit_code == 2 and why in r.stderr and "outbox/AGENT/NAME" in r.stderr, bad
    for good in ("outbox/Alice/msg", ".relay/outbox/Alice/msg", str(team.state / "outbox" / "Alice" / "msg")):
        assert len(json.loads(team("show", "--path", good, "--json").stdout)) == 1, good


def test_commands_table_shows_the_newest_50_unless_told_and_its_json_gives_them_all(team):
    from relay.operator import commands
    with Ledger(team.state / "ledger.sqlite") as led:
        for i in range(51):
            commands.run(led, "ping", {"name": "Bob"}, f"c-{i:02d}", lambda: commands.Result(["ok"]), "operator:t",
                         now=1_800_000_000.0 + i)
    r = team("commands")
    rows = r.stdout.splitlines()[1:]
    assert len(rows) == 50 and "c-50" in rows[0] and not any("c-00" in row for row in rows)
    assert r.stderr == ("relay: stopped at the limit of 50 command(s); more were recorded (--limit N shows more)\n")
    r = team("commands", "--json")
    assert len(json.loads(r.stdout)) == 51 and r.stderr == ""
    r = team("commands", "--limit", "51")
    assert len(r.stdout.splitlines()) == 52 and r.stderr == ""


def test_show_of_a_message_not_taken_yet_looks_in_the_outbox_of_the_agent_that_owns_or_asks_for_it(team):
    # an id relay send gave Alice: her outbox only, whatever another outbox holds under that name
    mid = team("send", "--from", "Alice", "--to", "Bob", "bound").stdout.strip()
    drop(team, "Bob", f"msg-{mid.lower()}", "TO: Carol\n\nsame name, another outbox")
    assert json.loads(team("show", mid, "--json").stdout)["source_path"] == f"outbox/Alice/msg-{mid.lower()}"
    # an id no send bound: as an agent, its own outbox only; as the operator, every outbox
    free = "01KC3ABCDEFGHJKMNPQRSTVWXY"
    for sender in ("Alice", "Bob"):
        drop(team, sender, f"msg-{free.lower()}", "TO: Carol\n\nwhich one")
    for agent in ("Alice", "Bob"):
        doc = json.loads(team("show", free, "--agent", agent, "--json").stdout)
        assert doc == {"id": free, "status": "waiting", "source_path": f"outbox/{agent}/msg-{free.lower()}"}
    r = team("show", free, "--agent", "Carol", "--json", ok=False)
    assert r.exit_code == 1 and r.stdout == ""
    r = team("show", free, ok=False)
    assert r.exit_code == 1 and "relay will not say which is meant" in r.stderr
