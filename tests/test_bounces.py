"""A sender hears of a message that failed or was shed. relay delivers a bounce
to the sender's own inbox, from System, kind "bounce", naming the message (id, subject, to whom),
the reason and what to do; once per message and recipient set, through the pipeline's own
exactly-once path (a message from System in the spool, registered with the ledger); never a
bounce of a bounce; `bounces = false` turns them off."""
import errno
import json

import pytest
from conftest import failing_create



def bounces(project, agent):
    return [e for e in project.inbox(agent) if e["kind"] == "bounce"]


def test_a_message_to_an_unknown_recipient_bounces_to_its_sender(project):
    r = project.relay()
    project.drop("Ann", "m", "TO: ben\nSUBJECT: the plan\nTHREAD: t-7\n\nhello")
    total = r.drain()
    assert total.failed == 1
    [failed] = [row for row in r.history.audit() if row["sender"] == "Ann"]
    [b] = bounces(project, "Ann")
    assert b["from"] == "System" and b["to"] == ["Ann"] and b["kind"] == "bounce"
    assert b["subject"] == "Undelivered: the plan" and b["thread"] == "t-7"
    assert b["headers"]["bounce_of"] == failed["id"] and b["headers"]["failed_recipients"] == ["ben"]
    assert "unknown recipient ben; did you mean Ben?" in b["headers"]["reason"]
    assert failed["id"] in b["body"] and "the plan" in b["body"] and "ben" in b["body"]
    assert "What to do:" in b["body"] and f"relay show {failed['id']}" in b["body"]
    row = r.history.get(b["id"])        # a message like any other, in the ledger and the archive
    assert row["sender"] == "System" and row["kind"] == "bounce" and row["status"] == "archived"
    assert (project.state / row["archive_path"]).is_file()
    assert "bounced" in [e["event"] for e in r.history.events(failed["id"])]
    assert project.inbox("Ben") == [] and project.inbox("Cy") == []


def test_a_message_without_a_thread_bounces_in_the_thread_named_by_its_id(project):
    r = project.relay()
    project.drop("Ann", "m", "TO: Zed\n\nhello")
    r.drain()
    [b] = bounces(project, "Ann")
    assert b["thread"] == b["headers"]["bounce_of"] and b["subject"] == f"Undelivered: your message {b['thread']}"


def test_shed_for_some_recipients_bounces_naming_only_them(project):
    r = project.relay(pair_rate=1, pair_window="1h")
    project.drop("Ann", "a", "TO: Ben\n\nfirst")
    r.drain()
    project.drop("Ann", "b", "TO: Ben, Cy\nSUBJECT: second\n\nsecond")
    r.drain()
    assert [e["body"] for e in project.inbox("Cy")] == ["second"]
    [b] = bounces(project, "Ann")
    assert b["headers"]["failed_recipients"] == ["Ben"] and "per_pair_rate" in b["headers"]["reason"]
    assert "Ben" in b["body"] and "second" in b["body"]


def test_once_per_message_and_recipient_set(project, cli):
    r = project.relay()
    project.drop("Ann", "m", "TO: Zed\n\nhello")
    r.drain()
    [failed] = [row for row in r.history.audit() if row["sender"] == "Ann"]
    cli("retry", failed["id"])                  # the operator puts it back: it fails again alike
    r.drain()
    assert r.history.get(failed["id"])["status"] == "failed"
    assert len(bounces(project, "Ann")) == 1
    assert len([row for row in r.history.audit() if row["sender"] == "System"]) == 1


def test_never_a_bounce_of_a_bounce(project, clock):
    r = project.relay(max_retries=0, retry_period="0s")
    switch = failing_create(r, OSError(errno.EACCES, "Permission denied"), lambda rel: rel.startswith("inbox/Ann/"))
    project.drop("Ann", "m", "TO: Zed\n\nhello")
    for _ in range(6):
        r.step()
        clock.advance(10)
    switch["on"] = False
    r.drain()
    system = [row for row in r.history.audit() if row["sender"] == "System"]
    assert len(system) == 1 and system[0]["status"] == "failed" and "Permission denied" in system[0]["error"]
    assert bounces(project, "Ann") == [] and project.inbox("System") == []


def test_one_message_and_one_set_of_recipients_is_owed_one_bounce_whatever_their_order(tmp_path):
    """A (message, recipient set) is owed one bounce: the same set named in another order (a
    retry that met the recipients otherwise) is the same set."""
    from relay.ledger.history import History
    from relay.ledger.ledger import Ledger
    with Ledger(tmp_path / "ledger.sqlite") as led:
        led.operations.add_archived([("01KC3000000000000000000001", "Ann", "m", '["Ben", "Cy"]', "message", "s",
                                      "b", 1, "0" * 64, 1e9, "archive/x/m")])
        with led.transaction():
            led.bounces.owe(1e9, [("01KC3000000000000000000001", "Ann", ["Ben", "Cy"], "shed")])
        with led.transaction():
            led.bounces.owe(1e9 + 1, [("01KC3000000000000000000001", "Ann", ["Cy", "Ben", "Cy"], "shed")])
        assert [r["recipients"] for r in History(led).bounces.due(10)] == ['["Ben","Cy"]']


def test_bounces_can_be_turned_off(project):
    r = project.relay(bounces=False)
    project.drop("Ann", "m", "TO: Zed\n\nhello")
    assert r.drain().failed == 1
    assert bounces(project, "Ann") == [] and [row["sender"] for row in r.history.audit()] == ["Ann"]


def test_a_file_with_an_unfit_name_bounces(project):
    r = project.relay()
    project.drop("Ann", "bad\x01name", "TO: Ben\n\nhello")
    r.drain()
    [b] = bounces(project, "Ann")
    assert b["headers"]["failed_recipients"] == [] and "control characters" in b["headers"]["reason"]


class Crash(Exception):
    pass


@pytest.mark.parametrize("part, where", [("messages", "record"), ("bounces", "bounced")])
def test_a_crash_on_the_way_delivers_the_bounce_once(project, part, where):
    """Killed after the failure's record was written but before the bounce was registered (or
    before the failure itself was recorded): the next start delivers exactly one bounce."""
    r = project.relay()
    project.drop("Ann", "m", "TO: Zed\n\nhello")
    writes = getattr(r.ledger, part)
    real = getattr(writes, where)
    calls = []

    def crash(*a, **k):
        calls.append(1)
        if where == "record" and len(calls) == 1 or where == "bounced":
            raise Crash()
        return real(*a, **k)
    setattr(writes, where, crash)
    with pytest.raises(Crash):
        r.drain()
    setattr(writes, where, real)
    r.close()
    project.relays.remove(r)
    again = project.relay()
    again.drain()
    assert len(bounces(project, "Ann")) == 1
    assert [row["status"] for row in again.history.audit() if row["sender"] == "System"] == ["archived"]
    assert not any((project.state / "spool").rglob("*bounce*"))


def test_a_claim_budget_quarantine_bounces(project):
    r = project.relay(max_retries=1)
    project.drop("Ann", "m", "TO: Ben\nSUBJECT: s\n\nhello")
    real = r.ledger.messages.record

    def crash(*a, **k):
        raise Crash()
    r.ledger.messages.record = crash
    with pytest.raises(Crash):
        r.drain()
    r.ledger.messages.record = real
    r.close()
    project.relays.remove(r)
    again = project.relay(max_retries=1)
    again.drain()
    [b] = bounces(project, "Ann")
    assert "relay stopped while handling it" in b["headers"]["reason"] and b["headers"]["bounce_of"] in b["body"]


def test_relay_audit_and_show_name_the_bounce(team):
    team("send", "--from", "Alice", "--to", "Bob", "--subject", "s", "hello")
    (team.state / "outbox/Alice/m").write_text("TO: Zed\n\nlost")
    team("run", "--once")           # one pass over what was there: the bounce it owes waits for the next
    assert not any(r["kind"] == "bounce" for r in json.loads(team("audit", "--json").stdout))
    team("run", "--once")
    rows = json.loads(team("audit", "--json").stdout)
    failed = next(r for r in rows if r["status"] == "failed")
    bounce = next(r for r in rows if r["kind"] == "bounce")
    assert bounce["from"] == "System" and bounce["to"] == ["Alice"] and bounce["thread"] == failed["id"]
    assert "bounced" in team("show", failed["id"]).stdout


def test_a_reply_to_a_bounce_is_refused_system_reads_no_replies(team):
    """Nothing is sent into System's inbox: --reply-to and Agent.reply say so and what to do;
    naming the recipients (--to) answers them in the bounce's thread."""
    import relay
    from conftest import error_line
    (team.state / "outbox/Alice/m").write_text("TO: Zed\nSUBJECT: plan\n\nlost")
    team("run", "--once")
    team("run", "--once")
    [bounce] = [r for r in json.loads(team("audit", "--json").stdout) if r["kind"] == "bounce"]
    refused = team("send", "--from", "Alice", "--reply-to", bounce["id"], "thanks", ok=False)
    assert refused.exit_code == 1 and "System reads no replies" in error_line(refused)
    assert "relay send --to NAME --thread" in error_line(refused) and "Traceback" not in refused.output
    with relay.Agent("Alice", root=team.root) as alice:
        with pytest.raises(relay.RelayError, match="reads no replies"):
            alice.reply(bounce["id"], "thanks")
    assert not list((team.state / "outbox" / "Alice").glob("*"))       # nothing written
    team("send", "--from", "Alice", "--reply-to", bounce["id"], "--to", "Bob", "Zed was lost")
    team("run", "--once")
    [to_bob] = [r for r in json.loads(team("audit", "--json").stdout) if r["to"] == ["Bob"]]
    assert to_bob["thread"] == bounce["thread"] and not list((team.state / "inbox" / "System" / "new").glob("*"))


def test_a_load_shed_bounces_once_a_window_per_pair(project, clock):
    """An agent that answers every message, bounces too, would keep alive the loop pair_rate
    stops: a shed for pair_rate (or queue_limit) bounces once per sender, recipient and reason
    in a pair_window."""
    r = project.relay(pair_rate=1, pair_window="10m")
    for i in range(4):
        project.drop("Ann", f"m{i}", f"TO: Ben\n\nm{i}")
    r.drain()
    assert [e["body"] for e in project.inbox("Ben")] == ["m0"]
    assert len(bounces(project, "Ann")) == 1
    project.drop("Ann", "late", "TO: Ben\n\nlate")
    clock.advance(601)
    r.drain()
    assert len(bounces(project, "Ann")) == 1 and [e["body"] for e in project.inbox("Ben")] == ["m0", "late"]
    for i in range(2):
        project.drop("Ann", f"n{i}", f"TO: Ben\n\nn{i}")
    r.drain()
    assert len(bounces(project, "Ann")) == 2        # a new window


def test_an_agents_file_of_kind_bounce_is_refused_and_bounces_to_its_sender(project):
    """Only System's bounces are owed none: an agent's file claiming kind bounce is refused
    like any failed message, and its sender hears of it."""
    r = project.relay()
    project.drop("Ann", "m", "TO: Ben\nKIND: bounce\n\nnot really from System")
    r.drain()
    [failed] = [row for row in r.history.audit() if row["sender"] == "Ann"]
    assert failed["status"] == "failed" and failed["kind"] == "bounce"
    [b] = bounces(project, "Ann")
    assert b["from"] == "System" and b["headers"]["bounce_of"] == failed["id"]
    assert project.inbox("Ben") == []


def test_a_delivered_message_shed_for_some_under_a_load_limit_bounces_unless_every_one_is_quiet(project, clock):
    """Delivered to some and shed for others under pair_rate: it bounces when any recipient
    shed starts its window (naming every one shed), and not when each is in its window."""
    r = project.relay(agents=("Ann", "Ben", "Cy", "Dee", "Eve"), pair_rate=1, pair_window="1h")
    sends = [("m0", "Ben"), ("m1", "Ben, Cy"), ("m2", "Ben, Cy, Dee"), ("m3", "Ben, Cy, Eve")]
    for name, to in sends:
        project.drop("Ann", name, f"TO: {to}\nSUBJECT: {name}\n\n{name}")
        r.drain(now_fn=lambda: clock.advance(1))
    assert [e["body"] for e in project.inbox("Cy")] == ["m1"]
    assert [e["body"] for e in project.inbox("Dee")] == ["m2"] and [e["body"] for e in project.inbox("Eve")] == ["m3"]
    said = [(b["subject"], b["headers"]["failed_recipients"]) for b in bounces(project, "Ann")]
    assert said == [("Undelivered: m1", ["Ben"]), ("Undelivered: m2", ["Ben", "Cy"])]


def test_a_message_that_fails_after_reaching_some_recipients_bounces_naming_only_the_others(project, clock):
    r = project.relay()
    failing_create(r, OSError(errno.EACCES, "Permission denied"), when=lambda rel: rel.startswith("inbox/Cy/"))
    project.drop("Ann", "m", "TO: Ben, Cy\nSUBJECT: half way\n\nx")
    for _ in range(10):
        r.step()
        clock.advance(3600)
    [row] = [x for x in r.history.audit() if x["sender"] == "Ann"]
    assert row["status"] == "failed"
    assert [e["body"] for e in project.inbox("Ben")] == ["x"]
    r.drain()
    [b] = bounces(project, "Ann")
    assert b["headers"]["failed_recipients"] == ["Cy"] and b["subject"] == "Undelivered: half way"


def test_a_claim_budget_quarantine_after_some_deliveries_bounces_naming_only_the_others(project, clock):
    r = project.relay(max_retries=1)
    switch = failing_create(r, OSError(errno.EACCES, "Permission denied"), when=lambda rel: rel.startswith("inbox/Cy/"))
    project.drop("Ann", "m", "TO: Ben, Cy\nSUBJECT: s\n\nhello")
    r.step()
    [row] = [x for x in r.history.audit() if x["sender"] == "Ann"]
    assert row["status"] == "pending" and [d["recipient"] for d in r.history.deliveries(row["id"])] == ["Ben"]
    switch["on"] = False
    real = r.ledger.messages.record

    def crash(*a, **k):
        raise Crash()
    r.ledger.messages.record = crash
    with pytest.raises(Crash):
        r.drain(now_fn=lambda: clock.advance(3600))
    r.ledger.messages.record = real
    r.close()
    project.relays.remove(r)
    again = project.relay(max_retries=1)
    again.drain()
    failed = again.history.get(row["id"])
    assert failed["status"] == "failed"
    report = json.loads((project.state / f"{failed['failed_path']}.error.json").read_text())
    assert report["delivered_to"] == ["Ben"] and "relay stopped while handling it once" in report["reason"]
    assert report["what_to_do"].endswith("; recipients that already have it do not get it again")
    [b] = bounces(project, "Ann")
    assert b["headers"]["failed_recipients"] == ["Cy"] and "relay stopped while handling it" in b["headers"]["reason"]


@pytest.mark.parametrize("reason, says", [
    ("unknown recipient Zed; known agents: Ann", "check the name (`relay agents` lists the agents"),
    ("shed for Ben (per_pair_rate: 3 in 60s)", "you sent them more than `pair_rate` messages in `pair_window`"),
    ("shed for Ben (queue_limit: 100 unread)", "their inbox is full (they do not read it)"),
    ("shed for Ben (recipient_archived)", "an operator retired them (relay archive-agent)"),
    ("shed for every recipient (body_size: ...)", "the body is over `max_body_bytes`: send it in smaller parts"),
    ("the body is 2000 bytes, over MAX_BODY_BYTES (1000)", "the body is over `max_body_bytes`: send it in smaller parts"),
    ("Unknown Recipient zed", "check the name"),
    ("writing the envelope for Cy: Permission denied", "fix what the reason says and send it again; an operator can "
                                                       "deliver this one as it is with `relay retry 01MID`"),
])
def test_a_bounce_says_what_to_do_by_the_first_words_of_its_reason_it_matches(reason, says):
    from relay.core.bounces import document
    doc = json.loads(document({"message_id": "01MID", "reason": reason, "recipients": '["Ben"]', "subject": None,
                               "sender": "Ann", "thread": None}, 100_000))
    assert f"\n\nWhat to do: {says}" in doc["body"]
    assert doc["body"].count("What to do:") == 1


def test_a_bounces_document_names_the_message_its_recipients_or_none_and_is_cut_to_the_limit():
    from relay.core.bounces import document
    row = {"message_id": "01MID", "reason": "unknown recipient Zed", "recipients": '["Zed", 3, "Yan"]',
           "subject": "plans", "sender": "Ann", "thread": "t-1"}
    doc = json.loads(document(row, 100_000))
    assert doc["body"].startswith('Your message 01MID "plans" was not delivered to Zed, Yan.\n\nWhy: unknown recipient Zed\n\n')
    assert doc["body"].endswith("\n\n`relay show 01MID` tells its whole story.\n")
    assert (doc["to"], doc["kind"], doc["thread"], doc["subject"], doc["failed_recipients"], doc["bounce_of"]) == (
        "Ann", "bounce", "t-1", "Undelivered: plans", ["Zed", "Yan"], "01MID")
    bare = json.loads(document({**row, "recipients": "[]", "subject": "", "thread": None}, 100_000))
    assert bare["body"].startswith("Your message 01MID was not delivered to its recipients.\n\n")
    assert (bare["thread"], bare["subject"]) == ("01MID", "Undelivered: your message 01MID")
    broken = json.loads(document({**row, "recipients": "not json"}, 100_000))
    assert broken["failed_recipients"] == [] and "delivered to its recipients." in broken["body"]
    size = len(doc["body"].encode())
    assert json.loads(document(row, size))["body"] == doc["body"]              # exactly the limit: whole
    cut = json.loads(document(row, size - 1))["body"]
    assert cut.endswith("...") and len(cut.encode()) == size - 1 and cut[:-3] == doc["body"][:size - 4]


def test_bounces_emitted_a_batch_at_a_time_stay_due_until_a_batch_is_not_full(project, clock):
    r = project.relay()
    real = r.bounces.emit
    r.bounces.emit = lambda now, limit=256: 0          # owed by the batch, not written yet
    for i in range(3):
        project.drop("Ann", f"m{i}", f"TO: Nobody\nSUBJECT: s{i}\n\nx")
    r.drain()
    r.bounces.emit = real
    assert r.bounces.due is True
    assert r.bounces.emit(clock.now, limit=2) == 2 and r.bounces.due is True
    assert r.bounces.emit(clock.now, limit=2) == 1 and r.bounces.due is False
    assert r.bounces.emit(clock.now, limit=2) == 0
    r.drain()
    assert sorted(b["subject"] for b in bounces(project, "Ann")) == ["Undelivered: s0", "Undelivered: s1",
                                                                     "Undelivered: s2"]


def test_two_oversized_messages_to_one_recipient_each_bounce_a_size_is_no_load_limit(project, clock):
    """Only a shed for a load limit (per_pair_rate, queue_limit) is bounced once a window."""
    r = project.relay(max_body_bytes=100, pair_window="1h")
    for i in range(3):
        project.drop("Ann", f"big{i}", f"TO: Ben\nSUBJECT: big {i}\n\n" + "x" * 150)
        r.drain(now_fn=lambda: clock.advance(1))
    assert sorted(b["subject"] for b in bounces(project, "Ann")) == ["Undelivered: big 0", "Undelivered: big 1",
                                                                     "Undelivered: big 2"]


def test_a_bounce_of_a_message_never_resolved_names_the_recipients_written_but_everyone(project):
    """An unknown name beside '*': never resolved, it bounces naming what was written, without
    '*'; a message too large for its body names those it was shed for."""
    r = project.relay(max_body_bytes=100)
    project.drop("Ann", "m", "TO: Zed, *\nSUBJECT: lost\n\nx")
    project.drop("Ann", "big", "TO: Cy, Ben\nSUBJECT: big\n\n" + "x" * 150)
    r.drain()
    said = {b["subject"]: b["headers"]["failed_recipients"] for b in bounces(project, "Ann")}
    assert said == {"Undelivered: lost": ["Zed"], "Undelivered: big": ["Ben", "Cy"]}


def test_a_message_too_large_to_read_bounces_naming_everyone_it_was_shed_for(project):
    r = project.relay(max_body_bytes=100)
    project.drop("Ann", "huge", "TO: Ben\nSUBJECT: big\n\n" + "x" * 300_000)
    assert r.drain().failed == 1
    [b] = bounces(project, "Ann")
    assert b["headers"]["failed_recipients"] == ["*"]
    assert "the file is 300022 bytes, over max_body_bytes (100) plus room for headers" in b["headers"]["reason"]


@pytest.mark.parametrize("window, quiet_at, again_at", [("1h", 601, 3601), ("30s", 29, 31)])
def test_a_load_shed_stays_quiet_for_the_pair_window_configured_not_the_default(project, clock, window, quiet_at,
                                                                                   again_at):
    r = project.relay(pair_rate=1, pair_window=window)
    project.drop("Ann", "m0", "TO: Ben\n\nm0")
    project.drop("Ann", "m1", "TO: Ben\n\nm1")
    r.drain()
    assert len(bounces(project, "Ann")) == 1
    clock.advance(quiet_at)
    project.drop("Ann", "m2", "TO: Ben\n\nm2")
    project.drop("Ann", "m3", "TO: Ben\n\nm3")
    r.drain()
    assert len(bounces(project, "Ann")) == 1            # shed within the window: no bounce
    clock.advance(again_at - quiet_at)
    project.drop("Ann", "m4", "TO: Ben\n\nm4")
    project.drop("Ann", "m5", "TO: Ben\n\nm5")
    r.drain()
    assert len(bounces(project, "Ann")) == 2            # the window over: bounced again


def test_a_shed_of_an_earlier_attempt_bounces_when_the_message_is_delivered_to_the_others(project, clock):
    r = project.relay(pair_rate=1, pair_window="1h")
    project.drop("Ann", "first", "TO: Cy\n\nfirst")
    r.drain()
    switch = failing_create(r, OSError(errno.EACCES, "Permission denied"), when=lambda rel: rel.startswith("inbox/Ben/"))
    project.drop("Ann", "second", "TO: Ben, Cy\nSUBJECT: two\n\nsecond")
    r.hint("file", "Ann", "second")
    r.step()
    [row] = [x for x in r.history.audit() if x["name"] == "second"]
    assert row["status"] == "pending" and bounces(project, "Ann") == []       # Cy shed, Ben tried again
    switch["on"] = False
    clock.advance(60)
    r.drain()
    assert r.history.get(row["id"])["status"] == "archived"
    assert [e["body"] for e in project.inbox("Ben")] == ["second"]
    [b] = bounces(project, "Ann")
    assert b["headers"]["failed_recipients"] == ["Cy"] and b["headers"]["bounce_of"] == row["id"]
    [report] = [p for p in project.files("failed") if p.name.endswith(".shed.json")]   # Cy's shed still said
    assert report.name == f"{row['id']}--second.shed.json"
    assert [s["recipient"] for s in json.loads(report.read_text())["shed"]] == ["Cy"]


def test_a_message_delivered_but_not_yet_archived_bounces_its_sheds_at_once(project, clock, monkeypatch):
    r = project.relay(pair_rate=1, pair_window="1h")
    project.drop("Ann", "first", "TO: Cy\n\nfirst")
    r.drain()
    real = r.archive.store

    def full(src, rel):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(r.archive, "store", full)
    project.drop("Ann", "second", "TO: Ben, Cy\nSUBJECT: two\n\nsecond")
    r.hint("file", "Ann", "second")
    r.step()
    r.step()
    [row] = [x for x in r.history.audit() if x["name"] == "second"]
    assert row["status"] == "delivered"
    [b] = bounces(project, "Ann")
    assert b["headers"]["failed_recipients"] == ["Cy"] and b["headers"]["bounce_of"] == row["id"]
    monkeypatch.setattr(r.archive, "store", real)
    clock.advance(60)
    r.drain()
    assert r.history.get(row["id"])["status"] == "archived" and len(bounces(project, "Ann")) == 1


def test_a_queue_limit_shed_stays_quiet_ten_minutes_when_no_pair_window_is_set(project, clock):
    r = project.relay(queue_limit=1, pair_window="0s")
    project.drop("Ann", "m0", "TO: Ben\n\nm0")
    r.drain()
    assert [e["body"] for e in project.inbox("Ben")] == ["m0"]
    for i, (at, owed) in enumerate([(0, 1), (599, 1), (2, 2)], start=1):
        clock.advance(at)
        project.drop("Ann", f"m{i}", f"TO: Ben\n\nm{i}")
        r.hint("file", "Ann", f"m{i}")
        r.drain()
        assert len(bounces(project, "Ann")) == owed, i
    assert [e["body"] for e in project.inbox("Ben")] == ["m0"]
