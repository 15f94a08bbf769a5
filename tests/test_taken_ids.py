"""Ids bound to their senders: an id `relay send` printed to one agent names that agent's message
in every verb, whatever another agent copies into a file of its own; an id another message has
already is refused without failing the message; request ids are each sender's own."""
import json
import os
import time

import pytest
from conftest import error_line

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
    mid = crew("send", "--from", "Ann", "--to", "Bob", "prod is down").output.strip()
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
    mid = crew("send", "--from", "Ann", "--to", "Bob", "prod is down").output.strip()
    box = crew.state / "outbox" / "Al"
    (box / f"msg-{mid.lower()}.tmp").write_text("TO: Bob\n\nmine")
    os.rename(box / f"msg-{mid.lower()}.tmp", box / f"msg-{mid.lower()}")
    shown = json.loads(crew("show", mid, "--json").output)
    assert shown["source_path"] == f"outbox/Ann/msg-{mid.lower()}"


def test_a_file_named_after_a_printed_id_does_not_stand_for_it(crew):
    """A message failed before its file was read is found by its file name msg-<id>: Al's failed
    file of that name was shown for the id printed to Ann."""
    mid = crew("send", "--from", "Ann", "--to", "Bob", "prod is down").output.strip()
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
    mid = crew("send", "--from", "Ann", "--to", "Bob", "--request-id", "deploy-7", "deploy").output.strip()
    copy_id(crew, "Al", mid, extra="REQUEST-ID: deploy-7\n")
    box = crew.state / "outbox" / "Al"
    (box / ".again").write_text("TO: Bob\nREQUEST-ID: deploy-7\n\nagain")
    os.rename(box / ".again", box / "again")
    drain(crew.root)
    bodies = sorted(m.body for m in relay.Agent("Bob", root=crew.root).inbox())
    assert bodies == ["deploy", "not Ann's"]       # Al's second file repeats Al's first, not Ann's
    again = crew("send", "--from", "Ann", "--to", "Bob", "--request-id", "deploy-7", "deploy")
    assert again.output.strip().splitlines()[-1] == mid
    assert crew("send", "--from", "Al", "--to", "Bob", "--request-id", "deploy-7", "x").output.strip() != mid



def test_the_record_of_an_id_whose_file_never_came_goes_at_the_retention_sweep(crew):
    mid = crew("send", "--from", "Ann", "--to", "Bob", "never relayed").output.strip()
    (crew.state / "outbox" / "Ann" / f"msg-{mid.lower()}").unlink()
    with relay.Relay(relay.load(crew.root, ".relay", env={})) as r:
        assert r.history.id_owner(mid) == "Ann"
        r.sweep(time.time() + 8 * 86400)
        assert r.history.id_owner(mid) is None
