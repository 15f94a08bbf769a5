"""The agent's side: finding the project, sending with checked names and real ids, request ids,
reading whole messages, waiting; each refusal with its exact line."""
import errno
import json
import os
import threading
import time

import pytest
from click.testing import CliRunner

import relay
import relay.files.fs
from conftest import error_line, failing_create
from relay.cli import main
from relay.operator.doctor import expire



def drain(root):
    with relay.Relay(relay.load(root, ".relay", env={})) as r:
        return r.drain(now_fn=lambda: __import__("time").time() + 1)


# -- names are checked before anything is written --------------------------------------------------

def test_unknown_or_wrong_case_recipient_is_refused_with_the_closest_match(team):
    r = team("send", "--from", "Alice", "--to", "bob", "hi", ok=False)
    assert r.exit_code == 1
    assert error_line(r) == ("unknown recipient 'bob'; did you mean Bob? known agents: Alice, Bob, Carol "
                             "(--create adds a new agent on purpose)")
    r = team("send", "--from", "Alice", "--to", "Bob,Zed", "hi", ok=False)
    assert error_line(r) == ("unknown recipient 'Zed'; known agents: Alice, Bob, Carol "
                             "(--create adds a new agent on purpose)")
    assert not any((team.state / "outbox" / "Alice").iterdir())


def test_a_misspelt_sender_is_refused_and_creates_nothing(team):
    r = team("send", "--from", "Alcie", "--to", "Bob", "hi", ok=False)
    assert error_line(r) == ("unknown sender 'Alcie'; did you mean Alice? known agents: Alice, Bob, Carol "
                             "(--create adds a new agent on purpose)")
    assert not (team.state / "outbox" / "Alcie").exists() and not (team.state / "inbox" / "Alcie").exists()


def test_create_adds_new_agents_on_purpose(team):
    mid = team("send", "--from", "Dave", "--to", "Erin", "--create", "hello").output.strip()
    assert (team.state / "outbox" / "Dave").is_dir() and (team.state / "inbox" / "Erin" / "new").is_dir()
    drain(team.root)
    [m] = relay.Agent("Erin", root=team.root).inbox()
    assert (m.id, m.sender, m.body) == (mid, "Dave", "hello")


def test_outside_a_project_every_verb_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for args in (["status"], ["send", "--from", "A", "--to", "B", "x"], ["inbox", "A"], ["audit"],
                 ["run", "--once"], ["read", "01KC3000000000000000000000"]):
        r = runner.invoke(main, args)
        assert r.exit_code == 1, args
        assert error_line(r) == "not in a relay project (no .relay/ here or above); run relay init"
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(relay.NotInProject):
        relay.Agent("A")


def test_verbs_find_the_project_from_a_subdirectory(team, monkeypatch):
    sub = team.root / "src" / "deep"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    runner = CliRunner()
    r = runner.invoke(main, ["send", "--from", "Alice", "--to", "Bob", "from below"])
    assert r.exit_code == 0, r.output
    assert not (sub / ".relay").exists() and not (team.root / "src" / ".relay").exists()
    drain(team.root)
    r = runner.invoke(main, ["inbox", "Bob", "--json"])
    assert [d["body"] for d in json.loads(r.output)] == ["from below"]
    assert relay.Agent("Bob").inbox()[0].body == "from below"      # the API finds it the same way
    assert runner.invoke(main, ["status"]).exit_code == 3      # found the project; no daemon runs


# -- the id relay send prints is the message's id ---------------------------------------------------

def test_the_printed_id_is_what_show_and_the_inbox_know(team):
    mid = team("send", "--from", "Alice", "--to", "Bob", "--subject", "s", "hello").output.strip()
    assert json.loads(team("show", mid, "--json").output) == {
        "id": mid, "status": "waiting", "source_path": f"outbox/Alice/msg-{mid.lower()}"}
    assert "relay has not taken it yet" in team("show", mid).output
    drain(team.root)
    assert json.loads(team("show", mid, "--json").output)["id"] == mid
    assert json.loads(team("inbox", "Bob", "--json").output)[0]["id"] == mid
    assert (team.state / "inbox" / "Bob" / "new" / f"{mid}.json").is_file()
    [archived] = (team.state / "archive").rglob(f"{mid}--*")
    assert archived.parent.name == "Alice"


@pytest.mark.parametrize("chosen, reason", [
    ("abc", "the id 'abc' is not a relay id (26 characters of 0123456789ABCDEFGHJKMNPQRSTVWXYZ); "
            "leave ID out and relay gives one"),
    ("01KC3000000000000000000OOO", "the id '01KC3000000000000000000OOO' is not a relay id (26 characters of "
                                   "0123456789ABCDEFGHJKMNPQRSTVWXYZ); leave ID out and relay gives one"),
])
def test_a_malformed_chosen_id_is_refused_with_the_reason(project, chosen, reason):
    r = project.relay()
    project.drop("Ann", "m", f"ID: {chosen}\nTO: Ben\n\nhi")
    assert r.drain().failed == 1
    [report] = (project.state / "failed" / "Ann").glob("*.error.json")
    assert json.loads(report.read_text())["reason"] == reason
    assert project.inbox("Ben") == []


def test_a_reused_id_is_refused_and_the_first_message_keeps_it(project):
    """A sender's own reuse of an id is its mistake, refused (another sender's file naming the
    id is delivered under relay's id: test_taken_ids)."""
    r = project.relay()
    mid = "01KC3ABCDEFGHJKMNPQRSTVWXY"
    project.drop("Ann", "first", f"ID: {mid}\nTO: Ben\n\nfirst")
    assert r.drain().archived == 1
    project.drop("Ann", "second", json.dumps({"id": mid.lower(), "to": "Ben", "body": "second"}))
    assert r.drain().failed == 1
    [report] = (project.state / "failed" / "Ann").glob("*.error.json")
    assert json.loads(report.read_text())["reason"] == (
        f"the id {mid} is already used by another message; choose another, or leave ID out and relay gives one")
    assert [e["body"] for e in project.inbox("Ben")] == ["first"]
    assert r.history.get(mid)["sender"] == "Ann"


def test_two_files_choosing_one_id_in_one_batch_deliver_the_first_only(project):
    r = project.relay()
    mid = "01KC3ABCDEFGHJKMNPQRSTVWXY"
    project.drop("Ann", "a", f"ID: {mid}\nTO: Ben\n\none")
    project.drop("Ann", "b", f"ID: {mid}\nTO: Ben\n\ntwo")
    total = r.drain()
    assert (total.archived, total.failed) == (1, 1)
    [env] = project.inbox("Ben")
    assert env["id"] == mid and r.history.get(mid)["status"] == "archived"


def test_a_refused_message_is_found_by_the_id_its_sender_chose(project):
    r = project.relay()
    mid = "01KC3ABCDEFGHJKMNPQRSTVWXY"
    project.drop("Ann", "m", f"ID: {mid}\nTO: Nobody\n\nlost?")
    assert r.drain().failed == 1
    row = r.history.get(mid)
    assert row["status"] == "failed" and "unknown recipient Nobody" in row["error"]
    assert (project.state / "failed" / "Ann" / f"{mid}--m").is_file()
    assert [e["event"] for e in r.history.events(mid)][:3] == ["discovered", "claimed", "identified"]


@pytest.mark.parametrize("crash_at", ["identify", "record"])
def test_a_crash_around_the_id_change_delivers_once(project, crash_at):
    """The chosen id is committed before anything is delivered; a stop before or after that
    commit leaves one envelope, under the chosen id, and the spool file found by its first id."""
    mid = "01KC3ABCDEFGHJKMNPQRSTVWXY"
    first = project.relay()

    def crash(*a, **k):
        raise KeyboardInterrupt("power cut")
    if crash_at == "identify":
        first.ledger.identify = crash
    else:
        first.ledger.record = crash
    project.drop("Ann", "m", f"ID: {mid}\nTO: Ben, Cy\n\nonce")
    with pytest.raises(KeyboardInterrupt):
        first.drain()
    first.close()
    second = project.relay()
    assert second.drain().archived == 1
    for agent in ("Ben", "Cy"):
        assert [e["id"] for e in project.inbox(agent)] == [mid]
    row = second.history.get(mid)
    assert row["status"] == "archived" and row["archive_path"].endswith(f"/Ann/{mid}--m")
    assert list((project.state / "spool" / "Ann").iterdir()) == []


# -- request ids --------------------------------------------------------------------------------------

def test_a_repeated_request_id_is_delivered_once(team):
    a = relay.Agent("Alice", root=team.root)
    one = a.send("Bob", "deploy please", request_id="deploy-7")
    two = a.send("Bob", "deploy please", request_id="deploy-7")      # before relay ran: both written
    assert one != two
    drain(team.root)
    assert [m.id for m in relay.Agent("Bob", root=team.root).inbox()] == [one]
    show = json.loads(team("show", two, "--json").output)
    assert show["status"] == "archived" and show["duplicate_of"] == one
    r = team("send", "--from", "Alice", "--to", "Bob", "--request-id", "deploy-7", "again")
    assert r.output.splitlines() == [f"relay: request id 'deploy-7' was sent before as {one}; not sent again", one]
    assert a.send("Bob", "again", request_id="deploy-7") == one and a.repeated
    assert a.send("Bob", "other", request_id="deploy-8") != one and not a.repeated
    assert sum(1 for _ in (team.state / "outbox" / "Alice").iterdir()) == 1       # deploy-8 only


def test_of_two_sends_with_one_request_id_the_one_sent_first_is_delivered_whatever_the_file_times(team):
    """Both written before relay ran, in one batch: the earlier send (its id says when) is the
    message, the later one its repeat, even when the later file's time is the older."""
    a = relay.Agent("Alice", root=team.root)
    one = a.send("Bob", "first", request_id="deploy-9")
    two = a.send("Bob", "second", request_id="deploy-9")
    box = team.state / "outbox" / "Alice"
    os.utime(box / f"msg-{one.lower()}", (time.time() - 10, time.time() - 10))
    os.utime(box / f"msg-{two.lower()}", (time.time() - 20, time.time() - 20))     # found first
    drain(team.root)
    assert [m.body for m in relay.Agent("Bob", root=team.root).inbox()] == ["first"]
    assert json.loads(team("show", two, "--json").output)["duplicate_of"] == one


def test_a_request_id_whose_message_failed_may_be_sent_again(project):
    r = project.relay()
    project.drop("Ann", "a", "TO: Nobody\nREQUEST-ID: r1\n\nfirst")
    assert r.drain().failed == 1
    project.drop("Ann", "b", json.dumps({"to": "Ben", "request_id": "r1", "body": "second"}))
    assert r.drain().archived == 1
    assert [e["body"] for e in project.inbox("Ben")] == ["second"]


def test_a_request_id_whose_message_was_expired_may_be_sent_again(project):
    """A message whose request id relay recorded (it was read, then its delivery kept failing)
    and that an operator expired has failed: the request id is free again, for `relay send`
    (which looks for an earlier message first) and for the relay (which settles repeats)."""
    r = project.relay(retry_backoff="1h")
    switch = failing_create(r, OSError(errno.ENOSPC, "No space left on device"))
    project.drop("Ann", "a", "TO: Ben\nREQUEST-ID: r1\n\nfirst")
    assert r.step().retried == 1
    [row] = r.history.audit()
    assert (row["status"], row["request_id"]) == ("pending", "r1")
    switch["on"] = False
    expire(r.ledger, r.layout, row["id"])
    ann = relay.Agent("Ann", root=project.root)
    second = ann.send("Ben", "second", request_id="r1")
    assert second != row["id"] and not ann.repeated
    ann.close()
    r.hint("rescan")
    r.step(project.clock.advance(1))
    assert [e["body"] for e in project.inbox("Ben")] == ["second"]
    assert r.history.get(second)["duplicate_of"] is None and r.history.get(row["id"])["status"] == "failed"


def test_request_ids_are_per_sender(project):
    r = project.relay()
    project.drop("Ann", "a", "TO: Cy\nREQUEST-ID: same\n\nfrom Ann")
    project.drop("Ben", "b", "TO: Cy\nREQUEST-ID: same\n\nfrom Ben")
    assert r.drain().archived == 2
    assert sorted(e["body"] for e in project.inbox("Cy")) == ["from Ann", "from Ben"]


# -- reading ------------------------------------------------------------------------------------------

def test_inbox_prints_whole_messages_oldest_first_and_ack_marks_only_what_it_printed(team):
    a = relay.Agent("Alice", root=team.root)
    first = a.send("Bob", "line one\nline two\x1b[31m", subject="first", thread="t1")
    drain(team.root)
    out = team("inbox", "Bob", "--ack").output
    assert out.splitlines() == [
        f"--- message 1 of 1: {first} (unread) ---", "from:    Alice", "to:      Bob", "thread:  t1",
        "subject: first", out.splitlines()[5], f"id:      {first}", "", "line one", "line two\\e[31m"]
    assert out.splitlines()[5].startswith("sent:    20")
    second = a.send("Bob", "later")             # arrives after the listing: not marked read
    drain(team.root)
    [m] = relay.Agent("Bob", root=team.root).inbox()
    assert m.id == second and m.state == "new"
    lines = team("inbox", "Bob", "--jsonl", "--all").output.splitlines()
    assert [(json.loads(ln)["id"], json.loads(ln)["state"]) for ln in lines] == [(second, "new"), (first, "cur")]


def test_read_prints_one_message_and_marks_it_read_for_that_agent(team):
    mid = relay.Agent("Alice", root=team.root).send("Bob", "body text", subject="s")
    drain(team.root)
    assert "body text" in team("read", mid).output
    assert relay.Agent("Bob", root=team.root).inbox()[0].state == "new"      # read without --agent marks nothing
    doc = json.loads(team("read", mid, "--agent", "Bob", "--json").output)
    assert doc["body"] == "body text" and doc["state"] == "cur"
    assert relay.Agent("Bob", root=team.root).inbox() == []
    r = team("read", "01KC3000000000000000000000", "--agent", "Bob", ok=False)
    assert error_line(r) == "no message '01KC3000000000000000000000' in the inbox of Bob"


def test_wait_times_out_with_its_own_exit_code(team):
    r = team("inbox", "Bob", "--wait", "0.2", ok=False)
    assert r.exit_code == 124 and r.output == "relay: no new message for Bob in 0.2\n"
    assert relay.Agent("Bob", root=team.root).wait(timeout=0.05) == []


def test_wait_wakes_when_a_message_arrives(team):
    bob = relay.Agent("Bob", root=team.root)
    listening, got = threading.Event(), []
    waiter = threading.Thread(target=lambda: got.extend(bob.wait(timeout=30, ack=True, listening=listening)))
    waiter.start()
    assert listening.wait(10)
    mid = relay.Agent("Alice", root=team.root).send("Bob", "wake up")
    drain(team.root)
    waiter.join(30)
    assert [(m.id, m.body, m.state) for m in got] == [(mid, "wake up", "cur")]


def test_a_long_lived_agents_wait_follows_its_inbox_replaced_between_two_waits(team):
    """An Agent keeps its watch from one wait to the next. Its new/ was replaced in between (moved
    away, made again): the next wait watches the directory there now, and wakes for a message
    relay delivers into it (written in tmp/, linked into new/)."""
    bob = relay.Agent("Bob", root=team.root)
    assert bob.wait(timeout=0) == []                    # the watch is armed, and kept
    new = team.state / "inbox" / "Bob" / "new"
    os.rename(new, new.with_name("new.old"))
    new.mkdir()
    listening, got = threading.Event(), []
    waiter = threading.Thread(target=lambda: got.extend(bob.wait(timeout=20, listening=listening)))
    waiter.start()
    assert listening.wait(10)
    mid = relay.Agent("Alice", root=team.root).send("Bob", "after the swap")
    drain(team.root)
    waiter.join(15)
    assert not waiter.is_alive() and [m.id for m in got] == [mid]
    bob.close()


def test_wait_returns_at_once_when_mail_is_there(team):
    relay.Agent("Alice", root=team.root).send("Bob", "already here")
    drain(team.root)
    out = team("inbox", "Bob", "--wait", "--ack").output
    assert "already here" in out
    assert relay.Agent("Bob", root=team.root).inbox() == []


def test_inbox_and_wait_with_a_limit_read_only_what_they_return(team, monkeypatch):
    """With `limit`, the oldest messages up to it are read and nothing past them; an unreadable
    entry met on the way is listed and not counted; `skip` leaves entries out unread."""
    alice = relay.Agent("Alice", root=team.root)
    sent = [alice.send("Bob", f"m{i}") for i in range(4)]
    drain(team.root)
    opened, read = [], relay.files.fs.StateDir.read

    def counting(self, rel, limit=None):
        if rel.startswith("inbox/Bob/new/"):
            opened.append(rel.rsplit("/", 1)[1])
        return read(self, rel, limit)
    monkeypatch.setattr(relay.files.fs.StateDir, "read", counting)
    bob = relay.Agent("Bob", root=team.root)
    assert [m.id for m in bob.inbox(limit=2)] == sent[:2] and opened == [f"{m}.json" for m in sent[:2]]
    opened.clear()
    assert [m.id for m in bob.wait(timeout=0, limit=1, skip={f"{sent[0]}.json"})] == sent[1:2]
    assert opened == [f"{sent[1]}.json"]
    (team.state / "inbox" / "Bob" / "new" / "00PLANTED.json").write_bytes(b"not json")    # sorts first
    opened.clear()
    got = bob.inbox(limit=1)
    assert [(m.id, bool(m.error)) for m in got] == [("00PLANTED", True), (sent[0], False)]
    assert opened == ["00PLANTED.json", f"{sent[0]}.json"]
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(relay.RelayError) as e:
            bob.inbox(limit=bad)
        assert str(e.value) == f"the limit must be a whole number of messages, 1 or more, not {bad!r}"
    bob.close()


def test_reply_goes_to_the_sender_in_the_thread(team):
    alice, bob = relay.Agent("Alice", root=team.root), relay.Agent("Bob", root=team.root)
    alice.send("Bob", "question", subject="review")
    drain(team.root)
    [q] = bob.inbox()
    rid = team("send", "--from", "Bob", "--reply-to", q.id, "answer").output.strip()
    drain(team.root)
    [a] = alice.inbox()
    assert (a.id, a.thread, a.subject, a.body) == (rid, q.id, "Re: review", "answer")
    again = bob.reply(q, "more")        # Python: the same thread and subject
    drain(team.root)
    assert [(m.thread, m.subject) for m in alice.inbox()][-1] == (q.id, "Re: review") and again


def test_system_inbox_is_read_but_system_never_sends(team):
    (team.state / "outbox" / "Alice" / "spawn").write_text("NAME: worker\nCLI: claude\n")
    drain(team.root)
    assert "kind:    spawn" in team("inbox", "System").output
    r = team("send", "--from", "System", "--to", "Bob", "x", ok=False)
    assert error_line(r) == "'System' is relay's own name and never a sender (--from): only agents have outboxes"
    with pytest.raises(relay.InvalidName):
        relay.Agent("System", root=team.root).send("Bob", "x")
