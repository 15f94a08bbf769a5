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



def drain(root, now=None):
    import time
    with relay.Relay(relay.load(root, ".relay", env={})) as r:
        return r.drain(now_fn=lambda: (now or time.time()) + 1)


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
    mid = team("send", "--from", "Dave", "--to", "Erin", "--create", "hello").stdout.strip()
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


def test_send_to_broadcast_reaches_everyone_like_star(team):
    """contract §2: `*` has the alias `Broadcast`; the agent side must not refuse it as an unknown agent."""
    mid = team("send", "--from", "Alice", "--to", "Broadcast", "to all").stdout.strip()
    drain(team.root)
    for agent in ("Bob", "Carol"):
        assert [m.id for m in relay.Agent(agent, root=team.root).inbox()] == [mid]
    assert relay.Agent("Alice", root=team.root).inbox() == []
    r = team("send", "--from", "Broadcast", "--to", "Bob", "--create", "x", ok=False)
    assert error_line(r) == "'Broadcast' is a name relay keeps for itself (Broadcast: every agent (as '*')), in any case (--from)"
    assert not (team.state / "outbox" / "Broadcast").exists()


# -- the id relay send prints is the message's id ---------------------------------------------------

def test_the_printed_id_is_what_show_and_the_inbox_know(team):
    mid = team("send", "--from", "Alice", "--to", "Bob", "--subject", "s", "hello").stdout.strip()
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
        first.ledger.senders.identify = crash
    else:
        first.ledger.messages.record = crash
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


def test_a_body_over_max_body_bytes_is_refused_before_anything_is_written(team):
    """relay send printed an id and exited 0; the daemon then failed the file ("over
    max_body_bytes"), under an id of its own that relay show did not know by the printed one."""
    (team.state / "relay.toml").write_text("max_body_bytes = 100\n")
    r = team("send", "--from", "Alice", "--to", "Bob", "-", input="é" * 51, ok=False)
    assert r.exit_code == 1
    assert error_line(r) == ("the body is 102 bytes, over max_body_bytes (100); relay would refuse it: send it in "
                             "parts, or raise max_body_bytes in relay.toml")
    assert list((team.state / "outbox" / "Alice").iterdir()) == []
    mid = team("send", "--from", "Alice", "--to", "Bob", "-", input="é" * 50).stdout.strip()
    drain(team.root)
    assert [len(m.body) for m in relay.Agent("Bob", root=team.root).inbox()] == [50]
    assert json.loads(team("show", mid, "--json").output)["status"] == "archived"


def test_a_subject_longer_than_a_header_line_is_refused_before_anything_is_written(team):
    """relay send exited 0 with a 70000-character subject; the daemon then failed the file with
    "header line 3 is 70009 characters long ... is the blank line after the headers missing?"."""
    from relay.core.message import MAX_HEADER_LINE
    fits = MAX_HEADER_LINE - len("SUBJECT: ")
    r = team("send", "--from", "Alice", "--to", "Bob", "--subject", "s" * (fits + 1), "x", ok=False)
    assert error_line(r) == f"the subject is {fits + 1} characters long; a header line holds at most {fits} of them"
    assert list((team.state / "outbox" / "Alice").iterdir()) == []
    with pytest.raises(relay.RelayError, match=r"^the thread is 65536 characters long; a header line holds at "):
        relay.Agent("Alice", root=team.root).send("Bob", "x", thread="t" * MAX_HEADER_LINE)
    team("send", "--from", "Alice", "--to", "Bob", "--subject", "s" * fits, "x")
    assert drain(team.root).archived == 1
    assert len(relay.Agent("Bob", root=team.root).inbox()[0].subject) == fits


def test_the_printed_id_finds_a_message_that_failed_before_relay_read_its_id(team):
    """A file refused before it is parsed (here: max_body_bytes lowered after the send) failed
    under the id relay gave it when found; show, retry and read did not know the printed id."""
    mid = team("send", "--from", "Alice", "--to", "Bob", "x" * 200).stdout.strip()
    (team.state / "relay.toml").write_text("max_body_bytes = 100\n")
    assert drain(team.root).failed == 1
    doc = json.loads(team("show", mid, "--json").output)
    assert doc["status"] == "failed" and "over max_body_bytes (100)" in doc["error"]
    assert doc["source_path"] == f"outbox/Alice/msg-{mid.lower()}"
    assert "over max_body_bytes" in team("read", mid).output
    (team.state / "relay.toml").write_text("max_body_bytes = 1000\n")
    assert team("retry", mid).exit_code == 0
    drain(team.root)
    [m] = relay.Agent("Bob", root=team.root).inbox()
    assert m.id == mid and len(m.body) == 200
    assert json.loads(team("show", mid, "--json").output)["status"] == "archived"


# -- request ids --------------------------------------------------------------------------------------

def test_a_repeated_request_id_is_delivered_once(team):
    a = relay.Agent("Alice", root=team.root)
    one = a.send("Bob", "deploy please", request_id="deploy-7")
    two = a.send("Bob", "deploy please", request_id="deploy-7")      # before relay ran: known
    assert one == two and a.repeated
    drain(team.root)
    assert [m.id for m in relay.Agent("Bob", root=team.root).inbox()] == [one]
    r = team("send", "--from", "Alice", "--to", "Bob", "--request-id", "deploy-7", "again")
    assert r.output.splitlines() == [f"relay: request id 'deploy-7' was sent before as {one}; not sent again", one]
    assert a.send("Bob", "again", request_id="deploy-7") == one and a.repeated
    assert a.send("Bob", "other", request_id="deploy-8") != one and not a.repeated
    assert sum(1 for _ in (team.state / "outbox" / "Alice").iterdir()) == 1       # deploy-8 only


def test_of_two_sends_with_one_request_id_the_one_sent_first_is_delivered_whatever_the_file_times(team):
    """Both written before relay ran, in one batch, each with the id its sender chose (`ID:`;
    `relay send` itself now finds the first in the outbox and writes no second): the earlier id
    is the message, the later one its repeat, even when the later file's time is the older."""
    from relay.ids import IdGenerator
    now = time.time()
    one, two = IdGenerator().new(now - 5), IdGenerator().new(now - 4)
    box = team.state / "outbox" / "Alice"
    for mid, body, age in ((one, "first", 10), (two, "second", 20)):       # the second found first
        path = box / f"m-{body}"
        path.write_text(f"TO: Bob\nID: {mid}\nREQUEST-ID: deploy-9\n\n{body}")
        os.utime(path, (now - age, now - age))
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
        f"--- message 1 of 1: {first} (read) ---", "from:    Alice", "to:      Bob", "thread:  t1",
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
    assert r.exit_code == 124 and r.output == "relay: no new message for Bob in 200ms\n"
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
    rid = team("send", "--from", "Bob", "--reply-to", q.id, "answer").stdout.strip()
    drain(team.root)
    [a] = alice.inbox()
    assert (a.id, a.thread, a.subject, a.body) == (rid, q.id, "Re: review", "answer")
    again = bob.reply(q, "more")        # Python: the same thread and subject
    drain(team.root)
    assert [(m.thread, m.subject) for m in alice.inbox()][-1] == (q.id, "Re: review") and again


def test_a_reply_to_ones_own_message_goes_to_its_recipients(team):
    """As a mail client's reply to a sent message: to the recipients it was sent to, never back
    to oneself (the shell, Python and MCP alike)."""
    import anyio

    from relay.agent import mcp_server
    alice, bob, carol = (relay.Agent(n, root=team.root) for n in ("Alice", "Bob", "Carol"))
    mid = alice.send(["Bob", "Carol"], "the plan", subject="plan")
    drain(team.root)
    rid = team("send", "--from", "Alice", "--reply-to", mid, "one more thing").stdout.strip()
    again = alice.reply(mid, "and another")
    server = mcp_server.build(alice)
    third = anyio.run(server.call_tool, "reply", {"id": mid, "body": "last"}).structured_content["id"]
    drain(team.root)
    for them in (bob, carol):
        got = [(m.id, m.sender, m.to, m.thread, m.subject) for m in them.inbox()][1:]
        assert got == [(r, "Alice", ["Bob", "Carol"], mid, "Re: plan") for r in (rid, again, third)]
    assert alice.inbox() == []
    note = alice.send(["Alice", "Bob"], "a note to myself and Bob")     # herself among them: not to herself again
    drain(team.root)
    alice.inbox(ack=True)
    alice.reply(note, "and only Bob")
    drain(team.root)
    assert alice.inbox() == [] and bob.inbox()[-1].body == "and only Bob"
    alone = alice.send("Alice", "a note to myself")                    # to herself alone: to herself
    drain(team.root)
    alice.inbox(ack=True)
    alice.reply(alone, "noted")
    drain(team.root)
    assert [m.body for m in alice.inbox()] == ["noted"]
    for a in (alice, bob, carol):
        a.close()


def test_system_inbox_is_read_but_system_never_sends(team):
    (team.state / "outbox" / "Alice" / "spawn").write_text("NAME: worker\nCLI: claude\n")
    drain(team.root)
    assert "kind:    spawn" in team("inbox", "System").output
    r = team("send", "--from", "System", "--to", "Bob", "x", ok=False)
    assert error_line(r) == "'System' is a name relay keeps for itself (System: relay's own name), in any case (--from)"
    with pytest.raises(relay.InvalidName):
        relay.Agent("System", root=team.root).send("Bob", "x")


def test_inbox_json_is_one_document(project):
    """Guards the JSON the agents' side reads: a list of whole envelopes."""
    from click.testing import CliRunner

    from relay.cli import main
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nhello")
    relay.drain()
    r = CliRunner().invoke(main, ["--root", str(project.root), "inbox", "Ben", "--json"])
    assert r.exit_code == 0 and [d["body"] for d in json.loads(r.output)] == ["hello"]


# -- waits that must wake -----------------------------------------------------------------------------

def _waiter(agent, **kw):
    """A thread waiting on `agent`'s inbox; (thread, listening, results, errors)."""
    import threading
    listening, got, errors = threading.Event(), [], []

    def run():
        try:
            got.extend(agent.wait(listening=listening, **kw))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors.append(e)
            listening.set()
    t = threading.Thread(target=run)
    t.start()
    assert listening.wait(10)
    return t, got, errors


def test_a_wait_longer_than_the_platform_counts_still_wakes(team):
    """`relay inbox --wait 99999999999999d` ended in an OverflowError traceback from select()."""
    bob = relay.Agent("Bob", root=team.root)
    t, got, errors = _waiter(bob, timeout=99999999999999 * 86400.0)
    mid = relay.Agent("Alice", root=team.root).send("Bob", "late but here")
    drain(team.root)
    t.join(10)
    assert not t.is_alive() and errors == []
    assert [m.id for m in got] == [mid]
    bob.close()


def test_a_wait_with_no_sense_of_time_is_refused_and_a_negative_one_looks_once(team):
    bob = relay.Agent("Bob", root=team.root)
    with pytest.raises(relay.RelayError, match=r"^the timeout must be a number of seconds, not nan$"):
        bob.wait(timeout=float("nan"))
    assert bob.wait(timeout=-5) == []
    for bad in ("soon", [1], None.__class__):
        with pytest.raises(relay.RelayError) as e:
            bob.wait(timeout=bad)
        assert str(e.value) == f"the timeout must be a number of seconds, not {bad!r}"
    assert bob.wait(timeout="0") == []
    bob.close()


def _envelope(mid, body, sender="Alice"):
    return json.dumps({"id": mid, "from": sender, "to": ["Bob"], "kind": "message", "body": body})


def _deliver(directory, mid, body):
    """An envelope put into `directory` whole, as relay does (written aside, then linked in)."""
    aside = directory.parent / f".{mid}.aside"
    aside.write_text(_envelope(mid, body))
    os.rename(aside, directory / f"{mid}.json")


MID = "01KC3ABCDEFGHJKMNPQRSTVWXY"


def test_a_wait_wakes_for_a_message_in_an_inbox_replaced_while_it_waited(team):
    """The watch stayed on the new/ directory that was renamed away: a message in the new one
    never woke the waiter (a wait without timeout hung for good), and a long-lived Agent kept
    reading the old directory through a cached descriptor."""
    bob = relay.Agent("Bob", root=team.root)
    assert bob.wait(timeout=0) == []                # the watch is armed and kept
    new = team.state / "inbox" / "Bob" / "new"
    os.rename(new, new.with_name("new.old"))
    new.mkdir()
    assert bob.inbox() == []
    t, got, errors = _waiter(bob, timeout=30)
    _deliver(new, MID, "in the new directory")
    t.join(30)
    assert errors == [] and [m.body for m in got] == ["in the new directory"]
    assert [m.id for m in bob.inbox()] == [MID]
    bob.close()


def test_a_wait_whose_inbox_is_swapped_for_a_link_ends_with_the_reason(team, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    bob = relay.Agent("Bob", root=team.root)
    t, got, errors = _waiter(bob, timeout=30)
    new = team.state / "inbox" / "Bob" / "new"
    os.rename(new, new.with_name("new.old"))
    os.symlink(outside, new)
    (outside / f"{MID}.json").write_text(_envelope(MID, "planted outside"))
    t.join(30)
    assert not t.is_alive() and got == []
    assert [str(e) for e in errors] == [
        "inbox/Bob/new is a symbolic link or not a directory; relay never follows links under its state "
        "directory: it may lead outside the state directory, and relay reads and moves only files inside it"]
    assert os.listdir(outside) == [f"{MID}.json"]
    bob.close()


def test_junk_in_new_does_not_end_every_wait_at_once(team):
    """An entry of new/ that is no envelope was returned by every wait at once, never marked
    read: `relay inbox Bob --wait --ack` in a loop spun instead of blocking."""
    (team.state / "inbox" / "Bob" / "new" / "junk").write_text("not an envelope")
    r = team("inbox", "Bob", "--wait", "0.2", "--ack", ok=False)
    assert r.exit_code == 124 and r.output == "relay: no new message for Bob in 200ms\n"
    assert "unreadable envelope" in team("inbox", "Bob").output          # still shown to a person
    bob = relay.Agent("Bob", root=team.root)
    t, got, errors = _waiter(bob, timeout=30, ack=True)
    mid = relay.Agent("Alice", root=team.root).send("Bob", "a real one")
    drain(team.root)
    t.join(30)
    assert errors == [] and [(m.id, m.state, bool(m.error)) for m in got] == [(mid, "cur", False), ("junk", "new", True)]
    bob.close()


def test_a_wait_with_no_watch_to_be_had_still_waits_and_wakes(team, monkeypatch, caplog):
    """With the user's inotify instances used up (128 by default, shared by every daemon, editor
    and IDE of the user), the wait ended in "OSError: inotify instance limit reached" (exit 1):
    the fallback Observer needs an inotify instance too."""
    import relay.agent.mail
    import relay.core.watcher

    def no_observer():
        raise OSError(errno.EMFILE, "inotify instance limit reached")
    monkeypatch.setattr(relay.agent.mail, "inotify_init", lambda: -1)           # what the kernel answers then
    monkeypatch.setattr(relay.core.watcher, "observer", no_observer)
    bob = relay.Agent("Bob", root=team.root)
    assert bob.wait(timeout=0.1) == []
    assert "the wait looks for new messages every 0.5s instead" in caplog.text
    t, got, errors = _waiter(bob, timeout=30)
    mid = relay.Agent("Alice", root=team.root).send("Bob", "found by looking")
    drain(team.root)
    t.join(30)
    assert errors == [] and [m.id for m in got] == [mid]
    bob.close()


def test_a_wait_in_a_process_holding_many_files_still_wakes(team):
    """The waiter's inotify descriptor was handed to select(), which refuses one numbered past
    1023: in a process holding that many files the wait ended in "ValueError: filedescriptor
    out of range in select()"."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1100:
        pytest.skip("this process may not hold 1100 files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1100), hard))
    held = []
    try:
        while not held or held[-1] < 1024:
            held.append(os.open(os.devnull, os.O_RDONLY))
        bob = relay.Agent("Bob", root=team.root)
        t, got, errors = _waiter(bob, timeout=30)
        mid = relay.Agent("Alice", root=team.root).send("Bob", "past 1023")
        drain(team.root)
        t.join(30)
        assert errors == [] and [m.id for m in got] == [mid]
        bob.close()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_agents_made_again_and_again_do_not_leak_descriptors(team):
    """Each Agent (and relay.agents()) left the state directory's descriptors open for the life
    of the process, close() or not: a harness making an Agent per look ran out of files. An Agent
    dropped without close() frees them at once (nothing it holds holds it back), and one used
    again after close() reads through the descriptors opened again, never the closed ones."""
    relay.Agent("Alice", root=team.root).send("Bob", "x")
    drain(team.root)

    def open_files():
        return len(os.listdir("/proc/self/fd"))
    relay.Agent("Bob", root=team.root).inbox()
    before = open_files()
    for _ in range(50):
        relay.Agent("Bob", root=team.root).inbox()
        relay.agents(root=team.root)
        with relay.Agent("Bob", root=team.root) as bob:
            bob.wait(timeout=0)
        # usable after close(): what it needs is opened again (the message is listed, not lost)
        assert [m.body for m in bob.inbox()] == ["x"]
        bob.close()
    assert open_files() - before < 10


# -- odd names in an inbox, two readers, another agent's copy, a prefix -------------------------------

def test_an_odd_file_name_in_an_inbox_is_listed_escaped_not_a_traceback(team):
    """A name with bytes that are not UTF-8 in new/ made `relay inbox --json/--jsonl` end in a
    TypeError traceback from orjson (surrogates)."""
    new = os.fsencode(team.state / "inbox" / "Bob" / "new")
    with open(os.path.join(new, b"\xff\x1b.json"), "w") as f:
        f.write(_envelope(MID, "posing as a message"))
    [doc] = json.loads(team("inbox", "Bob", "--json").output)
    assert doc["id"] == "\\xff\\x1b" and doc["state"] == "new"
    assert doc["error"] == "not an envelope relay wrote: its name is not valid UTF-8 ('\\xff\\x1b.json')"
    assert doc["path"].endswith("/inbox/Bob/new/\\xff\\x1b.json")
    [line] = team("inbox", "Bob", "--jsonl", "--ack").output.splitlines()
    assert json.loads(line)["error"] == doc["error"]
    assert os.listdir(new) == [b"\xff\x1b.json"]        # never marked read, never moved


def test_a_read_copy_under_an_odd_name_is_not_taken_for_the_message(team):
    """show/read --json found `cur/<id>.json:2,S\\xff` as the copy and ended in a traceback."""
    mid = relay.Agent("Alice", root=team.root).send("Bob", "hi")
    drain(team.root)
    box = team.state / "inbox" / "Bob"
    os.rename(box / "new" / f"{mid}.json", os.fsencode(box / "cur" / f"{mid}.json:2,S") + b"\xff")
    assert json.loads(team("show", mid, "--json").output)["deliveries"][0]["inbox_path"] is None
    assert json.loads(team("read", mid, "--json").output)["body"] == "hi"        # the ledger's record
    r = team("read", mid, "--agent", "Bob", "--json", ok=False)
    assert error_line(r) == f"no message {mid!r} in the inbox of Bob"


def test_two_readers_of_one_inbox_both_ack_without_an_error(team):
    """The second `relay inbox Bob --ack` (another session of Bob) printed the message, then
    exited 1 with "No such file or directory": the first had moved it to cur/ meanwhile."""
    mid = relay.Agent("Alice", root=team.root).send("Bob", "for both sessions")
    drain(team.root)
    one, two = relay.Agent("Bob", root=team.root), relay.Agent("Bob", root=team.root)
    seen_one, seen_two = one.inbox(), two.inbox()
    assert [m.state for m in one.ack(seen_one)] == ["cur"]
    [m] = two.ack(seen_two)
    assert (m.id, m.state) == (mid, "cur") and os.path.isfile(m.path)


def test_an_agent_never_marks_read_another_agents_copy(team):
    """Agent.find() falls back to any recipient's copy; acking it moved Carol's envelope to her
    cur/, so Carol never saw the message as new."""
    mid = relay.Agent("Alice", root=team.root).send("Bob,Carol", "for two")
    drain(team.root)
    bob, carol = relay.Agent("Bob", root=team.root), relay.Agent("Carol", root=team.root)
    [theirs] = carol.inbox()
    assert [m.state for m in bob.ack([theirs])] == ["new"]
    assert [m.id for m in carol.inbox()] == [mid]
    assert [m.state for m in bob.ack(bob.inbox())] == ["cur"]


def test_read_takes_a_unique_prefix_for_an_agent_as_without_one(team):
    """`relay read PREFIX` found the message, `relay read PREFIX --agent Bob` said there was
    none, though Agent.read() says it takes a unique prefix."""
    mid = relay.Agent("Alice", root=team.root).send("Bob", "by prefix")
    drain(team.root)
    assert "by prefix" in team("read", mid[:12]).output
    assert json.loads(team("read", mid[:12].lower(), "--agent", "Bob", "--json").output)["id"] == mid
    r = team("read", "", "--agent", "Bob", ok=False)
    assert error_line(r) == "no message '' in the inbox of Bob"


@pytest.mark.parametrize("to", ["", " , ", [], ["", " "]])
def test_a_send_naming_no_recipient_is_refused_before_anything_is_written(team, to):
    with relay.Agent("Alice", root=team.root) as alice:
        with pytest.raises(relay.RelayError) as e:
            alice.send(to, "x")
    assert str(e.value) == "no recipient: give a name, a list of names, '*' or System"
    assert list((team.state / "outbox" / "Alice").iterdir()) == []


@pytest.mark.parametrize("kw, said", [
    ({"body": b"x"}, "the body must be text, not bytes"), ({"body": None}, "the body must be text, not NoneType"),
    ({"request_id": "a\nb"}, "--request-id must be one line of at most 200 characters"),
    ({"request_id": "r" * 201}, "--request-id must be one line of at most 200 characters"),
    ({"max_retries": True}, "max_retries True is not a whole number from 0 up"),
    ({"max_retries": "3"}, "max_retries '3' is not a whole number from 0 up"),
    ({"max_retries": 2.0}, "max_retries 2.0 is not a whole number from 0 up"),
    ({"ack_required": "maybe"}, "ACK 'maybe'"),
    ({"ack_required": 1}, "ack_required must be true or false, not 1"),
    ({"subject": "a\nb"}, "subject must be one line"), ({"thread": "a\rb"}, "thread must be one line"),
])
def test_each_field_of_a_send_the_daemon_would_refuse_is_refused_before_anything_is_written(team, kw, said):
    kw = {"body": "x", **kw}
    with relay.Agent("Alice", root=team.root) as alice:
        with pytest.raises(relay.RelayError) as e:
            alice.send("Bob", **kw)
    assert said in str(e.value)
    assert list((team.state / "outbox" / "Alice").iterdir()) == []


def test_a_request_id_of_200_characters_and_a_max_retries_of_0_are_taken(team):
    with relay.Agent("Alice", root=team.root) as alice:
        mid = alice.send("Bob", "x", request_id="r" * 200, max_retries=0)
    [f] = (team.state / "outbox" / "Alice").iterdir()
    text = f.read_text()
    assert f"ID: {mid}\n" in text and f"REQUEST-ID: {'r' * 200}\n" in text and "MAX-RETRIES: 0\n" in text


@pytest.mark.parametrize("subject, reply", [("plan", "Re: plan"), ("Re: plan", "Re: plan"), ("RE: plan", "RE: plan"),
                                            ("re:plan", "re:plan"), ("Regarding plan", "Re: Regarding plan"),
                                            (None, None)])
def test_a_reply_keeps_a_subject_that_is_a_reply_already_in_any_case_and_prefixes_any_other(team, subject, reply):
    with relay.Agent("Alice", root=team.root) as alice, relay.Agent("Bob", root=team.root) as bob:
        alice.send("Bob", "question", subject=subject)
        drain(team.root)
        [q] = bob.inbox()
        bob.reply(q, "answer")
        drain(team.root)
        [a] = alice.inbox()
    assert a.subject == reply and a.thread == q.id


def test_an_agent_of_a_project_with_no_ledger_yet_reads_nothing_and_says_why_a_message_is_not_found(team):
    from relay.errors import NotFound
    (team.state / "ledger.sqlite").unlink()
    with relay.Agent("Alice", root=team.root) as alice:
        assert alice.state_get("build-lock") is None and alice.state_list() == []
        assert alice.search("hello") == [] and alice.thread("plan") == [] and alice.unacknowledged() == []
        assert alice.sent_before("R1") is None
        assert [r.name for r in alice.agents()] == ["Alice", "Bob", "Carol"]
        with pytest.raises(NotFound) as e:
            alice.receipts("01ABC")
        assert str(e.value) == "no message '01ABC' that Alice sent: the project has no ledger yet"
        with pytest.raises(NotFound) as e:
            alice.find("01ABC")
        assert str(e.value) == "no message with id '01ABC': the project has no ledger yet"
        assert not (team.state / "ledger.sqlite").exists()
        assert alice.spawn("Dana", "the docs")          # no operator archived anyone: no ledger to say so


def test_a_stop_wakes_each_event_watching_it_once_set_and_none_it_forgot():
    import select

    from relay.agent.api import Stop
    stop = Stop()
    kept, forgotten = threading.Event(), threading.Event()
    stop.watch(kept)
    stop.watch(forgotten)
    stop.watch(forgotten, on=False)
    assert not stop.is_set() and select.select([stop.fileno()], [], [], 0)[0] == []
    stop.set()
    stop.set()                                              # set twice: one byte in the pipe
    assert stop.is_set() and kept.is_set() and not forgotten.is_set()
    assert os.read(stop.fileno(), 16) == b"x"
    late = threading.Event()
    stop.watch(late)                                        # watched once set: set at once
    assert late.is_set()


def test_an_agent_outside_a_project_or_unnamed_is_refused_saying_what_to_do(tmp_path, monkeypatch):
    with pytest.raises(relay.RelayError) as e:
        relay.Agent("Ann", root=tmp_path)
    assert str(e.value) == f"no relay state directory at {tmp_path / '.relay'}: run `relay init` first"
    assert not (tmp_path / ".relay").exists()
    monkeypatch.delenv("RELAY_AGENT", raising=False)
    with pytest.raises(relay.RelayError) as e:
        relay.Agent(root=tmp_path)
    assert str(e.value) == 'name the agent: relay.Agent("NAME"), or set RELAY_AGENT=NAME'


def test_system_reads_its_inbox_but_never_sends_and_an_agent_created_on_purpose_may(team):
    with relay.Agent("System", root=team.root) as system:
        with pytest.raises(relay.RelayError) as e:
            system.send("Alice", "x")
        assert str(e.value) == "'System' is relay's own name and never a sender: only agents have outboxes"
        assert system.inbox() == []
    with relay.Agent("Dana", root=team.root, create=True) as dana:
        assert dana.send("Alice", "hello from Dana")
    assert (team.state / "inbox" / "Dana" / "new").is_dir()


def test_an_agent_made_without_a_name_is_relay_agents_and_a_name_given_outranks_it(team, monkeypatch):
    monkeypatch.setenv("RELAY_AGENT", "Bob")
    with relay.Agent(root=team.root) as me:
        assert me.name == "Bob"
        mid = me.send("Alice", "from the environment's agent")
    with relay.Agent("Carol", root=team.root) as carol:
        assert carol.name == "Carol"
    drain(team.root)
    with relay.Agent("Alice", root=team.root) as alice:
        [m] = alice.inbox()
        assert (m.id, m.sender) == (mid, "Bob")


def test_headers_over_what_relay_reads_in_all_are_refused_at_the_boundary_and_not_below():
    from relay.agent.api import compose
    from relay.core.message import MAX_HEADER_BYTES
    long = dict(thread="t" * 60000, kind="k" * 60000, content_type="c" * 60000, request_id=None)
    to = ["b" * 60000]
    head = len("\n".join(["ID: m-1", "TO: " + to[0], "THREAD: " + long["thread"], "SUBJECT: ", "KIND: " + long["kind"],
                          "CONTENT-TYPE: " + long["content_type"]]))
    fits = MAX_HEADER_BYTES - head                  # the subject that makes the headers exactly the limit
    assert 0 < fits < 60000
    assert compose(to, "x", mid="m-1", subject="s" * fits, **long).endswith(b"\n\nx")
    with pytest.raises(relay.RelayError) as e:
        compose(to, "x", mid="m-1", subject="s" * (fits + 1), **long)
    assert str(e.value) == (f"the headers are {MAX_HEADER_BYTES + 1} characters long, over the {MAX_HEADER_BYTES} "
                            "relay reads; shorten the subject or thread")


def test_a_recipient_list_longer_than_a_header_line_is_called_the_recipient_list():
    from relay.agent.api import compose
    from relay.core.message import MAX_HEADER_LINE
    with pytest.raises(relay.RelayError) as e:
        compose(["b" * (MAX_HEADER_LINE - 3)], "x", mid="m-1")
    assert str(e.value) == (f"the recipient list is {MAX_HEADER_LINE - 3} characters long; a header line holds at "
                            f"most {MAX_HEADER_LINE - 4} of them")
    assert compose(["b" * (MAX_HEADER_LINE - 4)], "x", mid="m-1")


def test_a_reply_to_a_message_naming_no_sender_is_refused_and_nothing_is_written(team):
    from relay.agent.api import Received
    orphan = Received.of({"id": "m-orphan", "to": ["Alice"], "subject": "who?"}, "cur", "/nowhere/m-orphan.json")
    with relay.Agent("Alice", root=team.root) as alice:
        with pytest.raises(relay.RelayError) as e:
            alice.reply(orphan, "answer")
    assert str(e.value) == "m-orphan names no sender to reply to"
    assert list((team.state / "outbox" / "Alice").iterdir()) == []


def test_sent_before_names_the_message_of_its_request_id_and_none_for_another(team):
    with relay.Agent("Alice", root=team.root) as alice:
        mid = alice.send("Bob", "x", request_id="req-2")
        drain(team.root)
        assert alice.sent_before("req-2") == mid and alice.sent_before("req-1") is None


def test_system_may_be_opened_with_create_and_gets_no_agent_made(team):
    with relay.Agent("System", root=team.root, create=True) as system:
        assert system.name == "System" and system.inbox() == []
    assert "System" not in relay.agents(root=team.root)
    assert not (team.state / "outbox" / "System").exists()


def test_a_reply_with_its_own_subject_and_thread_keeps_them(team):
    with relay.Agent("Alice", root=team.root) as alice, relay.Agent("Bob", root=team.root) as bob:
        alice.send("Bob", "question", subject="plan", thread="T-1")
        drain(team.root)
        [q] = bob.inbox()
        bob.reply(q, "answer", subject="my own words", thread="T-2")
        bob.reply(q, "again")
        drain(team.root)
        assert [(a.subject, a.thread, a.body) for a in alice.inbox()] == [("my own words", "T-2", "answer"),
                                                                         ("Re: plan", "T-1", "again")]


def test_a_reply_to_a_message_one_sent_goes_to_whom_to_names_when_given(team):
    with relay.Agent("Alice", root=team.root) as alice:
        mid = alice.send("Bob", "the plan", subject="plan")
        drain(team.root)
        again = alice.reply(mid, "for Carol", to="Carol")
        drain(team.root)
    with relay.Agent("Carol", root=team.root) as carol, relay.Agent("Bob", root=team.root) as bob:
        assert [(m.id, m.thread, m.subject) for m in carol.inbox()] == [(again, mid, "Re: plan")]
        assert [m.id for m in bob.inbox()] == [mid]


def test_an_envelope_missing_fields_reads_with_its_file_id_and_the_defaults():
    from relay.agent.api import Received
    m = Received.of({"to": ["Bob", 5], "body": None, "priority": "", "content_type": 3, "ack_required": "true",
                     "headers": ["x"]}, "new", "/s/inbox/Bob/new/01ABC.json")
    assert (m.id, m.to, m.body, m.priority, m.content_type, m.ack_required, m.headers, m.sender) == (
        "01ABC", ["Bob"], "", "normal", "text/plain", False, {}, None)
    m = Received.of({"id": "m-1", "body": "b", "priority": "low", "content_type": "text/markdown",
                     "ack_required": True}, "cur", "/s/inbox/Bob/cur/01ABC.json:2,S")
    assert (m.id, m.body, m.priority, m.content_type, m.ack_required) == ("m-1", "b", "low", "text/markdown", True)


@pytest.mark.parametrize("thread, replies_in", [("T-1", "T-1"), (None, "m-1"), ("", "m-1"), ("two\nlines", "m-1"),
                                                ("a\rb", "m-1")])
def test_a_reply_goes_in_the_messages_thread_or_its_id_when_no_reply_can_name_it(thread, replies_in):
    from relay.agent.api import Received
    assert Received.of({"id": "m-1", "thread": thread}, "new", "/x/m-1.json").reply_thread == replies_in


def test_an_unknown_agent_is_told_with_at_most_30_known_names_and_none_said_as_none():
    from relay.agent.project import check_known
    from relay.errors import UnknownAgent
    with pytest.raises(UnknownAgent) as e:
        check_known("zed", set(), "recipient")
    assert str(e.value) == "unknown recipient 'zed'; known agents: (none) (--create adds a new agent on purpose)"
    thirty = {f"a{i:02d}" for i in range(30)}
    with pytest.raises(UnknownAgent) as e:
        check_known("zed", thirty, "sender")
    assert str(e.value).endswith("a28, a29 (--create adds a new agent on purpose)")
    with pytest.raises(UnknownAgent) as e:
        check_known("zed", thirty | {"a30"}, "sender")
    assert str(e.value).endswith("a28, a29 ... (31 in all) (--create adds a new agent on purpose)")
    assert check_known("a05", thirty, "sender") == "a05"


def test_a_failed_message_read_from_the_ledger_keeps_its_headers_body_and_content_type(team):
    from relay.agent.project import Project as Team
    box = team.state / "outbox" / "Alice"
    for name, text in (("m", "TO: Zed\nSUBJECT: s\nX-Ticket: 42\n\nlost"),
                       ("n", "TO: Zed\nSUBJECT: md\nCONTENT-TYPE: text/markdown\n\n# lost")):
        (box / f".{name}").write_text(text)
        os.rename(box / f".{name}", box / name)
    drain(team.root)
    project = Team(team.root)
    with project.history() as history:
        rows = {r["subject"]: r["id"] for r in history.audit(status="failed")}
    m = project.message(rows["s"])
    assert (m.state, m.path, m.headers, m.body, m.subject) == ("failed", None, {"X-Ticket": "42"}, "lost", "s")
    assert m.content_type == "text/plain"
    md = project.message(rows["md"])
    assert (md.content_type, md.headers, md.body) == ("text/markdown", {}, "# lost")


def test_a_watch_of_a_directory_that_is_not_there_leaves_no_thread_running(tmp_path):
    """inotify refuses the missing directory, and so does watchdog's Observer, whose failed start
    has already started its emitter's threads: they are stopped, and the wait still works."""
    from relay.agent.mail import NewMail
    before = set(threading.enumerate())
    mail = NewMail([tmp_path / "gone" / "new"]).open()
    assert mail.observer is None and mail.fd is None
    for t in set(threading.enumerate()) - before:
        t.join(timeout=5)
    assert [t.name for t in set(threading.enumerate()) - before if t.is_alive()] == []
    mail.wait(0)        # looks again at once: no watch to wake it
    assert not mail.arrived.is_set()
    mail.close()
