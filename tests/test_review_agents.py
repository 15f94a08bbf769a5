"""The agent's side attacked: names relay gives a meaning, waits that must wake, ids that
collide, files planted where the agent verbs look, crashes around a re-keyed message."""
import errno
import json
import os

import pytest
from conftest import error_line, failing_create

import relay



def drain(root, now=None):
    import time
    with relay.Relay(relay.load(root, ".relay", env={})) as r:
        return r.drain(now_fn=lambda: (now or time.time()) + 1)


# -- names -------------------------------------------------------------------------------------------

def test_send_to_broadcast_reaches_everyone_like_star(team):
    """SPEC 2: `*` has the alias `Broadcast`; the agent side must not refuse it as an unknown agent."""
    mid = team("send", "--from", "Alice", "--to", "Broadcast", "to all").output.strip()
    drain(team.root)
    for agent in ("Bob", "Carol"):
        assert [m.id for m in relay.Agent(agent, root=team.root).inbox()] == [mid]
    assert relay.Agent("Alice", root=team.root).inbox() == []
    r = team("send", "--from", "Broadcast", "--to", "Bob", "--create", "x", ok=False)
    assert error_line(r) == "'Broadcast' means every agent (as '*') and cannot be one agent's name"
    assert not (team.state / "outbox" / "Broadcast").exists()


# -- waiting -----------------------------------------------------------------------------------------

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


# -- planted files -----------------------------------------------------------------------------------

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


# -- sending -----------------------------------------------------------------------------------------

def test_a_body_over_max_body_bytes_is_refused_before_anything_is_written(team):
    """relay send printed an id and exited 0; the daemon then failed the file ("over
    max_body_bytes"), under an id of its own that relay show did not know by the printed one."""
    (team.state / "relay.toml").write_text("max_body_bytes = 100\n")
    r = team("send", "--from", "Alice", "--to", "Bob", "-", input="é" * 51, ok=False)
    assert r.exit_code == 1
    assert error_line(r) == ("the body is 102 bytes, over max_body_bytes (100); relay would refuse it: send it in "
                             "parts, or raise max_body_bytes in relay.toml")
    assert list((team.state / "outbox" / "Alice").iterdir()) == []
    mid = team("send", "--from", "Alice", "--to", "Bob", "-", input="é" * 50).output.strip()
    drain(team.root)
    assert [len(m.body) for m in relay.Agent("Bob", root=team.root).inbox()] == [50]
    assert json.loads(team("show", mid, "--json").output)["status"] == "archived"


def test_the_printed_id_finds_a_message_that_failed_before_relay_read_its_id(team):
    """A file refused before it is parsed (here: max_body_bytes lowered after the send) failed
    under the id relay gave it when found; show, retry and read did not know the printed id."""
    mid = team("send", "--from", "Alice", "--to", "Bob", "x" * 200).output.strip()
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


# -- ids -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("read_first", [False, True])
def test_an_id_the_ledger_forgot_at_a_sweep_is_not_taken_while_a_recipient_holds_it(project, read_first):
    """After the retention sweep forgot a message, a file choosing its id was delivered under
    it: the recipient's unread envelope (new/<id>.json) was replaced by the newcomer, and a read
    one (cur/) got a second message of the same id."""
    r = project.relay()
    project.drop("Ann", "a", f"ID: {MID}\nTO: Ben\n\nthe first")
    assert r.drain().archived == 1
    if read_first:
        relay.Agent("Ben", root=project.root).inbox(ack=True)
    project.clock.advance(8 * 86400)
    assert r.sweep_all().archived == 1 and r.history.get(MID) is None
    project.drop("Cy", "b", f"ID: {MID}\nTO: Ben\n\nposing as the first")
    project.clock.advance(10)
    assert r.drain().archived == 1           # another sender's message: not failed, not under that id
    [row] = r.history.audit()
    assert row["id"] != MID and [e["detail"] for e in r.history.events(row["id"]) if e["event"] == "id_refused"] == [
        f"the id {MID} in its file is another message's (in the inbox of Ben); this message keeps the id relay "
        "gave it"]
    held = project.inbox("Ben", "cur" if read_first else "new")
    assert [e["body"] for e in held if e["id"] == MID] == ["the first"]
    assert [(e["id"], e["body"]) for e in held + project.inbox("Ben", "new" if read_first else "cur")
            if e["id"] != MID] == [(row["id"], "posing as the first")]
    assert r.history.get(MID) is None                   # the refused file keeps the id relay gave it


def test_a_partly_delivered_message_whose_file_gains_an_id_keeps_its_own_and_relay_goes_on(project):
    """Re-keying a row that has deliveries broke their foreign key: IntegrityError from every
    step that claimed it, so the whole relay stalled on one edited spool file."""
    r = project.relay()
    project.drop("Ann", "a", "TO: Ben, Cy\n\nhello")
    switch = failing_create(r, OSError(errno.EACCES, "denied"), when=lambda rel: rel.startswith("inbox/Cy/"))
    assert r.step().retried == 1
    [spooled] = (project.state / "spool" / "Ann").iterdir()
    first = spooled.name.split("--")[0]
    spooled.write_text(f"ID: {MID}\nTO: Ben, Cy\n\nhello")
    switch["on"] = False
    project.drop("Ben", "b", "TO: Ann\n\nan innocent bystander")
    project.clock.advance(60)
    total = r.drain()
    assert total.archived == 2 and total.failed == 0
    assert [e["id"] for e in project.inbox("Cy")] == [first] and [e["id"] for e in project.inbox("Ben")] == [first]
    assert r.history.get(first)["status"] == "archived" and r.history.get(MID) is None
    assert [e["body"] for e in project.inbox("Ann")] == ["an innocent bystander"]


def test_doctor_knows_the_spool_file_of_a_rekeyed_message_on_its_way(project, cli):
    """The spool file keeps the id relay gave when found; doctor looked for a pending message
    of that id only, called the file an orphan (exit 1) and advised moving it into an outbox,
    which would have sent the message twice."""
    r = project.relay()
    project.drop("Ann", "a", f"ID: {MID}\nTO: Ben\n\nhello")
    switch = failing_create(r, OSError(errno.EACCES, "denied"))
    assert r.step().retried == 1
    assert r.history.get(MID)["status"] == "pending"
    r.close()
    assert json.loads(cli("doctor", "--json").output)["problems"] == []
    switch["on"] = False
    project.clock.advance(60)
    assert project.relay().drain().archived == 1


# -- discovery -----------------------------------------------------------------------------------------

def test_a_state_directory_of_another_user_is_not_taken_for_the_project(tmp_path):
    """Like git's `.git` ownership check: discovery took any `.relay/` above, so one another
    user put in a shared parent (/tmp) received this user's messages and set its relay.toml."""
    from relay import config as config_mod
    (tmp_path / ".relay").mkdir()
    sub = tmp_path / "mine" / "src"
    sub.mkdir(parents=True)
    me = os.geteuid()
    assert config_mod.discover(cwd=sub, env={}, uid=me) == tmp_path
    with pytest.raises(relay.NotInProject) as e:
        config_mod.discover(cwd=sub, env={}, uid=me + 1)
    assert str(e.value) == (f"{tmp_path}/.relay belongs to another user (uid {me}), so relay does not take it for "
                            f"your project; run relay init here for one of your own, or give --root {tmp_path} to "
                            "use it on purpose")
    assert config_mod.discover(root=str(tmp_path), cwd=sub, env={}, uid=me + 1) == tmp_path    # on purpose


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory of another user takes root")
def test_relay_init_under_another_users_state_directory_makes_a_project_of_ones_own(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from relay.cli import main
    shared = tmp_path / "shared"
    (shared / "newproj").mkdir(parents=True)
    runner = CliRunner()
    assert runner.invoke(main, ["--root", str(shared), "init", "--agent", "mallory"]).exit_code == 0
    (shared / ".relay" / "relay.toml").write_text('unknown_recipient = "create"\n')
    for p in [shared / ".relay", *(shared / ".relay").rglob("*")]:
        os.lchown(p, 65534, 65534)
    monkeypatch.chdir(shared / "newproj")
    r = runner.invoke(main, ["init", "--agent", "alice", "--agent", "bob"])
    assert r.exit_code == 0 and r.output == f"initialised {shared}/newproj/.relay with agents alice, bob\n"
    assert runner.invoke(main, ["send", "--from", "alice", "--to", "bob", "secret"]).exit_code == 0
    assert sorted(p.name for p in (shared / ".relay" / "outbox").iterdir()) == ["mallory"]
    assert len(list((shared / "newproj" / ".relay" / "outbox" / "alice").iterdir())) == 1
    monkeypatch.chdir(shared)
    r = runner.invoke(main, ["init", "--agent", "alice"])
    assert r.exit_code == 1 and error_line(r) == (
        f"{shared}/.relay belongs to another user (uid 65534), so relay does not take it for your project; run "
        f"relay init here for one of your own, or give --root {shared} to use it on purpose")
    assert sorted(p.name for p in (shared / ".relay" / "outbox").iterdir()) == ["mallory"]


# -- marking read --------------------------------------------------------------------------------------

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
    of the process, close() or not: a harness making an Agent per look ran out of files."""
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
        bob.inbox()                     # usable after close(): what it needs is opened again
        bob.close()
    assert open_files() - before < 10


def test_read_takes_a_unique_prefix_for_an_agent_as_without_one(team):
    """`relay read PREFIX` found the message, `relay read PREFIX --agent Bob` said there was
    none, though Agent.read() says it takes a unique prefix."""
    mid = relay.Agent("Alice", root=team.root).send("Bob", "by prefix")
    drain(team.root)
    assert "by prefix" in team("read", mid[:12]).output
    assert json.loads(team("read", mid[:12].lower(), "--agent", "Bob", "--json").output)["id"] == mid
    r = team("read", "", "--agent", "Bob", ok=False)
    assert error_line(r) == "no message '' in the inbox of Bob"


# -- kill -9 around a re-keyed message (found nothing; kept so it stays so) ----------------------------

class _Stop(BaseException):
    """kill -9 at this instant: nothing after it runs, nothing is cleaned up."""


@pytest.mark.parametrize("at", range(1, 15))     # the batch makes 14 such operations
def test_a_stop_at_any_step_of_a_rekeying_batch_delivers_once_under_the_chosen_id(project, at):
    """A batch with a file choosing its id and a second file repeating its request id, stopped
    at the at-th file-system or ledger operation, then recovered: each recipient holds the
    message once under the chosen id, the repeat is a duplicate, nothing is left in the spool,
    and doctor and verify see no problem."""
    from relay.operator import doctor as operator
    first = project.relay()
    project.drop("Ann", "a", f"ID: {MID}\nTO: Ben, Cy\nREQUEST-ID: q\n\nonce")
    project.drop("Ann", "b", "TO: Ben, Cy\nREQUEST-ID: q\n\nrepeat")
    count = [0]

    def stopping(obj, name):
        real = getattr(obj, name)

        def op(*a, **k):
            count[0] += 1
            if count[0] == at:
                raise _Stop(name)
            return real(*a, **k)
        setattr(obj, name, op)
    for name in ("rename", "link", "create", "unlink"):
        stopping(first.fs, name)
    for name in ("register_and_claim", "identify", "record"):
        stopping(first.ledger, name)
    with pytest.raises(_Stop):
        first.drain()
    first.close()
    project.clock.advance(5)
    second = project.relay()
    second.drain()
    for agent in ("Ben", "Cy"):
        held = [p for p in (project.state / "inbox" / agent).rglob("*") if p.is_file()]
        assert [(json.loads(p.read_text())["id"], json.loads(p.read_text())["body"]) for p in held] == [(MID, "once")]
    rows = {r["id"]: r for r in second.ledger.db.execute("SELECT id, status, duplicate_of FROM messages")}
    assert rows.pop(MID)["status"] == "archived"
    [(dup_id, dup)] = rows.items()
    assert (dup["status"], dup["duplicate_of"]) == ("archived", MID)
    assert [p for p in (project.state / "spool").rglob("*") if p.is_file()] == []
    assert operator.doctor(second.history, second.layout, None)[0] == []
    assert operator.verify(second.history, second.layout)[1] == []
