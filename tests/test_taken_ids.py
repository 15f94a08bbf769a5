"""Ids bound to their senders: an id `relay send` printed to one agent names that agent's message
in every verb, whatever another agent copies into a file of its own; an id another message has
already is refused without failing the message; request ids are each sender's own; the event
`identified` only for an id relay would not have chosen."""
import errno
import json
import os
import time

import pytest
from conftest import error_line, failing_create

import relay


def drain(root):
    with relay.Relay(relay.load(root, ".relay", env={})) as r:
        return r.drain(now_fn=lambda: time.time() + 1)


@pytest.fixture
def crew(cli):
    cli("init", "--agent", "Ann", "--agent", "Bob", "--agent", "Al")
    return cli


def copy_id(crew, thief, mid, name="early", body="not Ann's", back=3600, extra=""):
    """`thief` reads Ann's outbox and writes a back-dated file of its own with her id."""
    ann = (crew.state / "outbox" / "Ann" / f"msg-{mid.lower()}").read_text()
    assert f"ID: {mid}" in ann
    box = crew.state / "outbox" / thief
    box.mkdir(exist_ok=True)
    (box / f".{name}").write_text(f"ID: {mid}\nTO: Bob\n{extra}\n{body}")
    old = time.time() - back
    os.utime(box / f".{name}", (old, old))
    os.rename(box / f".{name}", box / name)


def envelope(crew, agent, mid):
    return json.loads((crew.state / "inbox" / agent / "new" / f"{mid}.json").read_text())


def test_an_id_send_printed_is_not_taken_by_a_back_dated_copy_in_another_outbox(crew):
    """Al copied the id of Ann's `relay send` into an older file of its own: Ann's message failed
    ("the id ... is already used"), and her id named Al's message in show, read and --reply-to."""
    mid = crew("send", "--from", "Ann", "--to", "Bob", "prod is down").stdout.strip()
    copy_id(crew, "Al", mid)
    drain(crew.root)
    assert envelope(crew, "Bob", mid)["from"] == "Ann" and envelope(crew, "Bob", mid)["body"] == "prod is down"
    shown = json.loads(crew("show", mid, "--json").output)
    assert (shown["from"], shown["status"]) == ("Ann", "archived")
    # Al's message is delivered all the same, under the id relay gave it, and says why
    [theirs] = [m for m in relay.Agent("Bob", root=crew.root).inbox() if m.sender == "Al"]
    assert theirs.id != mid and theirs.body == "not Ann's"
    events = json.loads(crew("show", theirs.id, "--json").output)["events"]
    [refused] = [e for e in events if e["event"] == "id_refused"]
    assert mid in refused["detail"] and "Ann" in refused["detail"]
    assert json.loads(crew("read", mid, "--agent", "Bob", "--json").output)["from"] == "Ann"
    crew("send", "--from", "Bob", "--reply-to", mid, "thanks")
    drain(crew.root)
    assert [m.body for m in relay.Agent("Ann", root=crew.root).inbox()] == ["thanks"]
    assert relay.Agent("Al", root=crew.root).inbox() == []


def test_show_finds_the_printed_id_in_its_senders_outbox_only(crew):
    """Before relay takes it, `relay show ID` looked in every outbox for msg-<id>, the first in
    name order first: Al's copy of the name, not Ann's file."""
    mid = crew("send", "--from", "Ann", "--to", "Bob", "prod is down").stdout.strip()
    box = crew.state / "outbox" / "Al"
    (box / f"msg-{mid.lower()}.tmp").write_text("TO: Bob\n\nmine")
    os.rename(box / f"msg-{mid.lower()}.tmp", box / f"msg-{mid.lower()}")
    shown = json.loads(crew("show", mid, "--json").output)
    assert shown["source_path"] == f"outbox/Ann/msg-{mid.lower()}"


def test_a_file_named_after_a_printed_id_does_not_stand_for_it(crew):
    """A message failed before its file was read is found by its file name msg-<id>: Al's failed
    file of that name was shown for the id printed to Ann."""
    mid = crew("send", "--from", "Ann", "--to", "Bob", "prod is down").stdout.strip()
    ann = crew.state / "outbox" / "Ann" / f"msg-{mid.lower()}"
    aside = crew.root / "aside"
    os.rename(ann, aside)                   # not there yet when relay looks (a slow disk, a crash)
    box = crew.state / "outbox" / "Al"
    (box / ".x").write_text("TO: Nobody\n\nmine")
    os.rename(box / ".x", box / f"msg-{mid.lower()}")
    drain(crew.root)
    r = crew("show", mid, ok=False)
    assert r.exit_code == 1 and "Al" not in r.output
    os.rename(aside, ann)
    drain(crew.root)
    assert json.loads(crew("show", mid, "--json").output)["from"] == "Ann"
    assert envelope(crew, "Bob", mid)["from"] == "Ann"


def test_an_id_another_message_has_is_refused_without_failing_the_message(project):
    """A hand-chosen id used first by another sender's message: the later one is delivered under
    the id relay gave it (event id_refused), not failed, so no agent makes another's fail."""
    r = project.relay()
    mid = "01KC3ABCDEFGHJKMNPQRSTVWXY"
    project.drop("Cy", "first", f"ID: {mid}\nTO: Ben\n\nfirst")
    assert r.drain().archived == 1
    project.drop("Ann", "second", json.dumps({"id": mid.lower(), "to": "Ben", "body": "second"}))
    assert r.drain().archived == 1
    [row] = [row for row in r.history.audit() if row["sender"] == "Ann"]
    assert row["id"] != mid and row["status"] == "archived"
    [refused] = [e for e in r.history.events(row["id"]) if e["event"] == "id_refused"]
    assert refused["detail"] == (f"the id {mid} in its file is another message's (from Cy); this message keeps "
                                 "the id relay gave it")
    assert sorted(e["body"] for e in project.inbox("Ben")) == ["first", "second"]
    assert r.history.get(mid)["sender"] == "Cy"


def test_request_ids_are_each_senders_own(crew):
    """Al repeats the request id of Ann's message in an earlier file of its own: Ann's message is
    neither suppressed nor sent twice, and Ann's retried send still names her first message."""
    mid = crew("send", "--from", "Ann", "--to", "Bob", "--request-id", "deploy-7", "deploy").stdout.strip()
    copy_id(crew, "Al", mid, extra="REQUEST-ID: deploy-7\n")
    box = crew.state / "outbox" / "Al"
    (box / ".again").write_text("TO: Bob\nREQUEST-ID: deploy-7\n\nagain")
    os.rename(box / ".again", box / "again")
    drain(crew.root)
    bodies = sorted(m.body for m in relay.Agent("Bob", root=crew.root).inbox())
    assert bodies == ["deploy", "not Ann's"]       # Al's second file repeats Al's first, not Ann's
    again = crew("send", "--from", "Ann", "--to", "Bob", "--request-id", "deploy-7", "deploy")
    assert again.output.strip().splitlines()[-1] == mid
    assert crew("send", "--from", "Al", "--to", "Bob", "--request-id", "deploy-7", "x").stdout.strip() != mid



def test_the_record_of_an_id_whose_file_never_came_goes_at_the_retention_sweep(crew):
    mid = crew("send", "--from", "Ann", "--to", "Bob", "never relayed").stdout.strip()
    (crew.state / "outbox" / "Ann" / f"msg-{mid.lower()}").unlink()
    with relay.Relay(relay.load(crew.root, ".relay", env={})) as r:
        assert r.history.id_owner(mid) == "Ann"
        r.sweep(time.time() + 8 * 86400)
        assert r.history.id_owner(mid) is None


# -- an id a recipient still holds, a re-keyed message on its way, kill -9 around one ---------------

MID = "01KC3ABCDEFGHJKMNPQRSTVWXY"


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
    for part, name in (("messages", "register_and_claim"), ("senders", "identify"), ("messages", "record")):
        stopping(getattr(first.ledger, part), name)
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


# -- identified -------------------------------------------------------------------------------------

def test_identified_only_for_an_id_relay_would_not_have_chosen(team):
    mid = team("send", "--from", "Alice", "--to", "Bob", "hello").stdout.strip()
    chosen = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
    (team.state / "outbox/Alice/mine").write_text(f"ID: {chosen}\nTO: Bob\n\nmy own id")
    team("run", "--once")
    events = {e["event"] for e in json.loads(team("show", mid, "--json").stdout)["events"]}
    assert "identified" not in events and {"discovered", "delivered", "archived"} <= events
    events = json.loads(team("show", chosen, "--json").stdout)["events"]
    assert [e["event"] for e in events].count("identified") == 1


def test_each_reason_a_chosen_id_is_not_taken_is_said_in_its_event(crew):
    """An id relay send gave Ann, copied by Al: given to Ann. An id a message from Bob has: Bob's.
    An id given to a message already delivered under relay's: it keeps its id."""
    mid = crew("send", "--from", "Ann", "--to", "Bob", "prod is down").stdout.strip()
    copy_id(crew, "Al", mid)
    drain(crew.root)
    [theirs] = [m for m in relay.Agent("Bob", root=crew.root).inbox() if m.sender == "Al"]
    events = json.loads(crew("show", theirs.id, "--json").output)["events"]
    assert [e["detail"] for e in events if e["event"] == "id_refused"] == [
        f"the id {mid} in its file was given to Ann by relay send; this message keeps the id relay gave it"]
    box = crew.state / "outbox" / "Al"
    (box / ".again").write_text(f"ID: {theirs.id}\nTO: Bob\n\nAl again, with an id of its own message")
    os.rename(box / ".again", box / "again")
    (crew.state / "outbox" / "Bob").mkdir(exist_ok=True)
    (crew.state / "outbox" / "Bob" / ".b").write_text(f"ID: {theirs.id}\nTO: Ann\n\nBob, with Al's id")
    os.rename(crew.state / "outbox" / "Bob" / ".b", crew.state / "outbox" / "Bob" / "b")
    drain(crew.root)
    rows = {json.loads(crew("show", m.id, "--json").output)["subject"] or m.body: m
            for m in relay.Agent("Ann", root=crew.root).inbox()}
    bobs = rows["Bob, with Al's id"]
    events = json.loads(crew("show", bobs.id, "--json").output)["events"]
    assert [e["detail"] for e in events if e["event"] == "id_refused"] == [
        f"the id {theirs.id} in its file is another message's (from Al); this message keeps the id relay gave it"]
    audit = json.loads(crew("audit", "--from", "Al", "--status", "failed", "--json").output)
    assert [a["error"] for a in audit] == [f"the id {theirs.id} is already used by another message; choose another, "
                                           "or leave ID out and relay gives one"]


def test_a_sweep_of_a_full_batch_of_forgotten_ids_says_another_batch_is_due(crew):
    mids = [crew("send", "--from", "Ann", "--to", "Bob", f"never relayed {i}").stdout.strip() for i in range(3)]
    for mid in mids:
        (crew.state / "outbox" / "Ann" / f"msg-{mid.lower()}").unlink()
    with relay.Relay(relay.load(crew.root, ".relay", env={})) as r:
        later = time.time() + 8 * 86400
        first = r.sweep(later, limit=2)
        assert first.more is True and first.ids == []
        assert sum(r.history.id_owner(m) is None for m in mids) == 2      # the batch's limit, no more
        second = r.sweep(later, limit=2)
        assert second.more is False and all(r.history.id_owner(m) is None for m in mids)


def test_an_id_whose_envelope_in_a_recipients_inbox_does_not_parse_is_still_taken(project):
    """Ben's new/ holds a file under the chosen id that does not parse (cut short, or put there
    by hand): it is not this message's, which a crash did not cut short, so the id is refused
    and Ben's file left as it is."""
    r = project.relay()
    r.drain()
    mid = "01KC3ABCDEFGHJKMNPQRSTVWXZ"
    held = project.state / "inbox" / "Ben" / "new" / f"{mid}.json"
    held.write_bytes(b'{"id": "01KC3AB')
    project.drop("Cy", "b", f"ID: {mid}\nTO: Ben\n\nunder a held id")
    assert r.drain().archived == 1
    [row] = [row for row in r.history.audit() if row["sender"] == "Cy"]
    assert row["id"] != mid and [e["detail"] for e in r.history.events(row["id"]) if e["event"] == "id_refused"] == [
        f"the id {mid} in its file is another message's (in the inbox of Ben); this message keeps the id relay "
        "gave it"]
    assert held.read_bytes() == b'{"id": "01KC3AB'
    assert json.loads((held.parent / f"{row['id']}.json").read_bytes())["body"] == "under a held id"


def test_an_id_whose_envelope_in_a_recipients_inbox_names_another_id_is_still_taken(project):
    """Ben's new/<id>.json holds an envelope of the very same bytes but of another message id:
    not this message's, so the chosen id is refused and Ben's file left as it is."""
    import hashlib
    r = project.relay()
    r.drain()
    mid = "01KC3ABCDEFGHJKMNPQRSTVWXZ"
    data = f"ID: {mid}\nTO: Ben\n\nunder a held id".encode()
    held = project.state / "inbox" / "Ben" / "new" / f"{mid}.json"
    planted = json.dumps({"id": "01JAAAAAAAAAAAAAAAAAAAAAAA", "sha256": hashlib.sha256(data).hexdigest(),
                          "body": "the other"}).encode()
    held.write_bytes(planted)
    project.drop("Cy", "b", data)
    assert r.drain().archived == 1
    [row] = [row for row in r.history.audit() if row["sender"] == "Cy"]
    assert row["id"] != mid and held.read_bytes() == planted
