"""Flow control: each shed reason, the echo loop stopped by pair_rate, what the sender learns,
one record per (message, recipient), the cheap hot path, limits off."""
import json
import os

import pytest

from conftest import failing_create


def sheds(relay, mid):
    return [(s["recipient"], s["reason"], s["limit_value"], s["observed"], s["sender"])
            for s in relay.history.sheds(mid)]


def ids(relay, status=None):
    return [r["id"] for r in relay.history.audit(status=status, oldest_first=True)]


def named(relay):
    return {r["name"]: r["id"] for r in relay.history.audit()}


def take(project, agent):
    """The agent reads its inbox: every envelope in new/ moves to cur/."""
    new = project.state / "inbox" / agent / "new"
    for p in sorted(new.iterdir()):
        os.rename(p, project.state / "inbox" / agent / "cur" / (p.name + ":2,S"))


def test_body_size_is_a_shed_and_a_failure(project):
    relay = project.relay(max_body_bytes=100)
    project.drop("Ann", "big", "TO: Ben, Cy\n\n" + "x" * 150)
    project.drop("Ann", "huge", "TO: Ben\n\n" + "x" * 300_000)     # too large to read at all
    project.drop("Ann", "ok", "TO: Ben\n\nsmall")
    counts = relay.drain()
    assert counts.shed == 3 and counts.failed == 2 and counts.archived == 1
    assert counts.bounced == 2 and len([e for e in project.inbox("Ann") if e["kind"] == "bounce"]) == 2
    big, huge = named(relay)["big"], named(relay)["huge"]
    assert sheds(relay, big) == [("Ben", "body_size", 100, 150, "Ann"), ("Cy", "body_size", 100, 150, "Ann")]
    [(who, reason, limit, observed, _)] = sheds(relay, huge)
    assert (who, reason, limit) == ("*", "body_size", 100) and observed > 300_000
    row = relay.history.get(big)
    assert row["status"] == "failed" and "shed for every recipient" in row["error"]
    assert "over max_body_bytes (100)" in row["error"]
    report = json.loads((project.state / f"{row['failed_path']}.error.json").read_text())
    assert [s["reason"] for s in report["shed"]] == ["body_size", "body_size"] and "body_size" in report["reason"]
    assert [e["body"] for e in project.inbox("Ben")] == ["small"]


@pytest.mark.parametrize("fmt", ["header", "json", "unread"])
def test_a_message_shed_for_size_keeps_its_recipients_kind_subject_and_headers(project, fmt):
    """Shed for its size (its body over max_body_bytes, or the file too large to read at all),
    a message is still recorded as its sender wrote it: `Ann -> Ben, Cy` in audit, its kind,
    subject and headers, the first bytes of its body; the bounce names its subject."""
    relay = project.relay(max_body_bytes=100)
    body = "x" * (300_000 if fmt == "unread" else 150)
    if fmt == "json":
        text = json.dumps({"to": ["Ben", "Cy"], "kind": "review", "subject": "the big diff", "body": body,
                           "Ticket": "T-1"})
    else:
        text = f"TO: Ben, Cy\nKIND: review\nSUBJECT: the big diff\nTicket: T-1\n\n{body}"
    project.drop("Ann", "big", text)
    assert relay.drain().failed == 1
    [row] = [r for r in relay.history.audit() if r["sender"] == "Ann"]
    assert (row["sender"], json.loads(row["recipients"] or "null"), row["kind"], row["subject"]) == \
        ("Ann", ["Ben", "Cy"], "review", "the big diff")
    assert json.loads(row["headers"]) == {"Ticket": "T-1"} and row["body"].startswith("xxx")
    assert len(row["body"].encode()) <= 1024 and row["status"] == "failed"
    [bounce] = [e for e in project.inbox("Ann") if e["kind"] == "bounce"]
    assert "the big diff" in bounce["subject"] + bounce["body"]


def test_per_pair_rate_sheds_over_the_window_and_spares_other_recipients(project, clock):
    relay = project.relay(pair_rate=3, pair_window="60s")
    for i in range(3):
        project.drop("Ann", f"m{i}", f"TO: Ben\n\nm{i}")
    relay.drain()
    project.drop("Ann", "both", "TO: Ben, Cy\n\nboth")
    project.drop("Ann", "only", "TO: Ben\n\nonly")
    project.drop("Cy", "other", "TO: Ben\n\nother sender")      # another pair: its own window
    relay.drain()
    both, only = named(relay)["both"], named(relay)["only"]
    assert sheds(relay, both) == [("Ben", "per_pair_rate", 3, 4, "Ann")]
    assert sheds(relay, only) == [("Ben", "per_pair_rate", 3, 4, "Ann")]
    assert relay.history.get(both)["status"] == "archived"                  # Cy got it
    assert [e["body"] for e in project.inbox("Cy")] == ["both"]
    assert relay.history.get(only)["status"] == "failed" and "per_pair_rate" in relay.history.get(only)["error"]
    assert sorted(e["body"] for e in project.inbox("Ben")) == ["m0", "m1", "m2", "other sender"]
    # the sender of the partly shed message learns it where its failures land
    report = json.loads((project.state / "failed/Ann" / f"{both}--both.shed.json").read_text())
    assert report["shed"][0]["recipient"] == "Ben" and report["shed"][0]["reason"] == "per_pair_rate"
    assert report["delivered_to"] == ["Cy"]
    # once the window has passed, Ann reaches Ben again
    clock.advance(61)
    project.drop("Ann", "later", "TO: Ben\n\nlater")
    relay.drain()
    assert "later" in [e["body"] for e in project.inbox("Ben")]


def test_the_echo_loop_between_two_agents_is_stopped_by_pair_rate(project, clock):
    """Ann and Ben answer every message from each other at once: without a limit they would
    flood each other forever. pair_rate lets `pair_rate` through per window, then sheds."""
    relay = project.relay(agents=("Ann", "Ben"), pair_rate=5, pair_window="10m")
    project.drop("Ann", "hello", "TO: Ben\n\nhello")
    rounds = 0
    for rounds in range(1, 50):
        relay.drain()
        replies = 0
        for me, other in (("Ann", "Ben"), ("Ben", "Ann")):
            for env in project.inbox(me):
                project.drop(me, f"re-{env['id']}", f"TO: {other}\n\nre: {env['body'][:20]}")
                replies += 1
            take(project, me)
        clock.advance(1)
        if not replies:
            break
    assert rounds < 20, "the loop was not stopped"
    cur = {a: [json.loads(p.read_bytes()) for p in (project.state / "inbox" / a / "cur").iterdir()] for a in ("Ann", "Ben")}
    assert {a: sum(e["kind"] != "bounce" for e in envs) for a, envs in cur.items()} == {"Ann": 5, "Ben": 5}
    # each side is told of the first shed only (answered too, the notice keeps no loop alive)
    assert all(sum(e["kind"] == "bounce" for e in envs) <= 1 for envs in cur.values())
    shed = [s for mid in ids(relay) for s in sheds(relay, mid)]
    assert shed and {s[1] for s in shed} == {"per_pair_rate"}
    assert relay.history.shed_counts() == {"per_pair_rate": len(shed)}


def test_queue_limit_sheds_for_a_recipient_that_does_not_read(project, clock):
    relay = project.relay(queue_limit=3)
    for i in range(5):
        project.drop("Ann", f"m{i}", f"TO: Ben\n\nm{i}")
    project.drop("Cy", "c", "TO: Ben, Ann\n\nto both")
    relay.drain()
    # Ann's flood is shed past the queue; Cy, under its share of it, still reaches Ben
    assert sorted(e["body"] for e in project.inbox("Ben")) == ["m0", "m1", "m2", "to both"]
    shed = [s for mid in ids(relay) for s in sheds(relay, mid)]
    assert [s[1:5] for s in shed] == [("queue_limit", 3, 3, "Ann")] * 2
    assert [e["body"] for e in project.inbox("Ann") if e["kind"] != "bounce"] == ["to both"]
    assert len([e for e in project.inbox("Ann") if e["kind"] == "bounce"]) == 1   # one for both sheds (a window)
    take(project, "Ben")                                 # Ben reads: room again
    clock.advance(60)
    project.drop("Ann", "after", "TO: Ben\n\nafter")
    relay.drain()
    assert [e["body"] for e in project.inbox("Ben")] == ["after"]


def test_unread_envelopes_are_counted_once_per_recipient_per_batch_at_most(project):
    relay = project.relay(queue_limit=40)
    listings = []
    real = relay.fs.count

    def count(rel, *a, **k):
        listings.append(rel)
        return real(rel, *a, **k)
    relay.fs.count = count
    for i in range(60):
        project.drop("Ann", f"m{i:02d}", f"TO: Ben, Cy\n\nm{i}")
    relay.drain()
    assert len(project.inbox("Ben")) == 40 and len(project.inbox("Cy")) == 40
    assert sorted(listings) == ["inbox/Ben/new", "inbox/Cy/new"]     # one batch: one listing each


def shed_for_ben_and_failing_for_cy(project, clock, text):
    """Ben's queue full (queue_limit 1) and Cy's envelopes refused, Ann's message `m` (`text`)
    tried once: shed for Ben, pending for Cy. Returns (relay, its id, the switch of Cy's failure)."""
    relay = project.relay(queue_limit=1)
    project.drop("Ann", "first", "TO: Ben\n\nfills Ben's queue")
    relay.drain()
    switch = failing_create(relay, PermissionError(13, "Permission denied"), lambda rel: rel.startswith("inbox/Cy/"))
    project.drop("Ann", "m", text)
    relay.hint("rescan")
    relay.step(clock.advance(1))
    mid = named(relay)["m"]
    assert relay.history.get(mid)["status"] == "pending"
    return relay, mid, switch


def test_a_shed_is_recorded_once_even_when_the_message_is_retried(project, clock):
    relay, mid, switch = shed_for_ben_and_failing_for_cy(project, clock, "TO: Ben, Cy\n\nBen is full, Cy is failing")
    switch["on"] = False
    take(project, "Ben")        # room again: the shed decision stands all the same
    for _ in range(5):
        relay.step(clock.advance(10))
    assert relay.history.get(mid)["status"] == "archived"
    assert sheds(relay, mid) == [("Ben", "queue_limit", 1, 1, "Ann")]
    assert [e["event"] for e in relay.history.events(mid)].count("shed") == 1
    assert [e["body"] for e in project.inbox("Cy")] == ["Ben is full, Cy is failing"]
    assert [e["body"] for e in project.inbox("Ben")] == []


def test_retry_delivers_a_shed_message_past_the_limits(project, clock):
    from relay.operator import doctor as operator
    relay = project.relay(queue_limit=1)
    project.drop("Ann", "a", "TO: Ben\n\na")
    project.drop("Ann", "b", "TO: Ben\n\nb")
    relay.drain()
    [b] = ids(relay, "failed")
    assert operator.retry(relay.ledger, relay.layout, [b], now=clock.now).lines == [f"{b}: back to pending"]
    relay.step(clock.advance(1))
    assert relay.history.get(b)["status"] == "archived"
    assert sorted(e["body"] for e in project.inbox("Ben")) == ["a", "b"]
    [(_, _, _, _, released)] = [(*s[:4], s["released_at"]) for s in relay.history.sheds(b)]
    assert released == clock.now - 1


def restarted(project, relay, **values):
    """A new relay on the project, started once `relay` is stopped."""
    relay.close()
    project.relays.remove(relay)
    return project.relay(**values)


def test_windows_are_seeded_from_the_ledger_at_start(project, clock):
    relay = project.relay(pair_rate=2, pair_window="1h")
    project.drop("Ann", "a", "TO: Ben\n\na")
    project.drop("Ann", "b", "TO: Ben\n\nb")
    relay.drain()
    again = restarted(project, relay, pair_rate=2, pair_window="1h")
    project.drop("Ann", "c", "TO: Ben\n\nc")
    again.drain()
    [c] = ids(again, "failed")
    assert sheds(again, c) == [("Ben", "per_pair_rate", 2, 3, "Ann")]


def dated(path, when):
    os.utime(path, (when, when))
    return path


def test_windows_seeded_at_start_count_a_message_when_it_was_written(project, clock):
    """A message written two hours ago and delivered just now counts, after a restart as before
    it, at the time it was written: outside a window of an hour."""
    relay = project.relay(pair_rate=1, pair_window="1h")
    dated(project.drop("Ann", "old", "TO: Ben\n\nold"), clock.now - 7200)
    relay.drain()
    again = restarted(project, relay, pair_rate=1, pair_window="1h")
    project.drop("Ann", "new", "TO: Ben\n\nnew")
    again.drain()
    assert sorted(e["body"] for e in project.inbox("Ben")) == ["new", "old"]
    assert ids(again, "failed") == []


@pytest.mark.parametrize("off", [{"pair_rate": 0}, {"pair_window": "0s"}])
def test_zero_turns_a_limit_off(project, off):
    relay = project.relay(queue_limit=0, **off)
    for i in range(30):
        project.drop("Ann", f"m{i}", "TO: Ben\n\nx")
    counts = relay.drain()
    assert counts.archived == 30 and counts.shed == 0 and len(project.inbox("Ben")) == 30


def test_defaults_never_shed_a_busy_pair(project):
    relay = project.relay()
    assert (relay.config.pair_rate, relay.config.pair_window, relay.config.queue_limit) == (600, 600, 10_000)
    for i in range(300):
        project.drop("Ann", f"m{i}", f"TO: Ben\n\n{i}")
    assert relay.drain().shed == 0 and len(project.inbox("Ben")) == 300


def test_a_shed_report_is_known_to_doctor_and_swept_with_its_message(project, clock):
    from relay.operator import doctor as operator
    relay = project.relay(pair_rate=1, pair_window="1h")
    project.drop("Ann", "a", "TO: Ben\n\na")
    relay.drain()
    project.drop("Ann", "b", "TO: Ben, Cy\n\nb")
    relay.drain()
    b = named(relay)["b"]
    report = project.state / "failed/Ann" / f"{b}--b.shed.json"
    problems, _ = operator.doctor(relay.history, relay.layout, None, now=clock.now)
    assert report.exists() and [p for p in problems if "shed" in p] == []
    stray = project.state / "failed/Ann" / "01AAAAAAAAAAAAAAAAAAAAAAAA--x.shed.json"
    stray.write_text("{}")
    problems, _ = operator.doctor(relay.history, relay.layout, None, now=clock.now)
    assert [p.split(":")[0] for p in problems if ".shed.json" in p] == ["failed/Ann/01AAAAAAAAAAAAAAAAAAAAAAAA--x.shed.json"]
    stray.unlink()
    relay.sweep(clock.advance(8 * 86400))
    assert not report.exists() and relay.history.get(b) is None
    assert relay.history.shed_counts() == {}        # the records went with their message


def test_a_too_large_message_records_sheds_only_for_agents_relay_knows(project, caplog):
    """body_size sheds were recorded for every name as written, before the names were checked:
    an agent could make relay record sheds to paths, to names holding terminal escapes (written
    raw into the daemon's log) and to thousands of made-up names per file, each one an agent in
    `relay queues`. Only known agents (and System) are shed; the rest is `*`."""
    relay = project.relay(max_body_bytes="10")
    names = ", ".join(["../../etc", "Ben", "b\x1b[31mred", "Nobody", "System", "Ben"] + [f"x{i}" for i in range(3000)])
    project.drop("Ann", "m1", f"TO: {names}\n\n{'y' * 20}")
    project.drop("Ann", "m2", f"TO: ../../etc, Nobody\n\n{'y' * 20}")
    with caplog.at_level("WARNING", logger="relay"):
        total = relay.drain()
    assert total.failed == 2 and total.shed == 3
    got = {(r["message_id"], r["recipient"]) for r in relay.history.db.execute("SELECT * FROM sheds")}
    by_name = {name: mid for mid, name in got}
    assert set(by_name) == {"Ben", "System", "*"} and len(got) == 3
    assert "\x1b" not in caplog.text and "../../etc" not in caplog.text


def drop_at(project, sender, name, text, at):
    import os
    path = project.drop(sender, name, text)
    os.utime(path, (at - 10, at - 10))      # settled, and not in the future of a clock set back
    return path


def test_a_clock_set_back_does_not_hold_a_pair_past_its_window(project, clock):
    """Deliveries recorded before the clock was set back (NTP, a VM restored) lie in its future:
    the window kept them until the clock caught up again, so one sender was shed for a
    recipient for as long as the clock had jumped (an hour here), not for pair_window. The
    running relay counts them from the jump on; a start (run --once) cannot place them and
    leaves them out of its window."""
    relay = project.relay(pair_rate="2", pair_window="60s")
    relay.recover()
    for i in range(2):
        drop_at(project, "Ann", f"m{i}", "TO: Ben\n\nx", clock.now)
        relay.hint("file", "Ann", f"m{i}")
        assert relay.step().archived == 1
    clock.advance(-3600)
    drop_at(project, "Ann", "m2", "TO: Ben\n\nstill inside the window", clock.now)
    relay.hint("file", "Ann", "m2")
    assert relay.step().shed == 1                    # the window still holds: no one escapes it
    clock.advance(71)                                # m3 is written (at - 10) a window after the jump
    drop_at(project, "Ann", "m3", "TO: Ben\n\nafter the window", clock.now)
    relay.hint("file", "Ann", "m3")
    counts = relay.step()
    assert (counts.archived, counts.shed) == (1, 0)
    clock.advance(-3600)                             # again, and this time relay starts afresh
    relay.close()
    project.relays.remove(relay)
    relay = project.relay(pair_rate="2", pair_window="60s")
    for i in (4, 5, 6):
        drop_at(project, "Ann", f"m{i}", "TO: Ben\n\nx", clock.now)
        clock.advance(1)
    total = relay.drain()
    assert (total.archived, total.shed) == (2, 1)    # the window counts from the start


def test_queue_limit_counts_envelopes_not_what_was_planted_in_new(project, cli):
    """queue_limit counted every entry of new/ not starting with '.': a directory, a link, a FIFO
    or a note planted in a recipient's new/ made relay shed everyone's messages to it. Only
    envelopes count (regular files named <id>.json), in the flow's decision and in relay queues."""
    import os
    relay = project.relay(queue_limit="3")
    drop_at(project, "Ann", "m0", "TO: Ben\n\nthe one unread envelope", project.clock.now)
    assert relay.drain().archived == 1
    new = project.state / "inbox/Ben/new"
    (new / "junk").mkdir()
    (new / "01ZZZZZZZZZZZZZZZZZZZZZZZZ.json").symlink_to("/etc/passwd")
    os.mkfifo(new / "fifo.json")
    (new / "notes.txt").write_text("planted")
    for i in (1, 2):
        drop_at(project, "Cy", f"m{i}", "TO: Ben\n\nfrom someone else", project.clock.now)
        project.clock.advance(1)
    total = relay.drain()
    assert (total.archived, total.shed) == (2, 0)
    drop_at(project, "Cy", "m3", "TO: Ben\n\nnow the queue is full", project.clock.now)
    assert relay.drain().shed == 1                  # three envelopes: the limit still holds
    [ben] = [a for a in json.loads(cli("queues", "--json").stdout)["agents"] if a["agent"] == "Ben"]
    assert ben["unread"] == 3


def test_per_pair_rate_sheds_the_latest_sent_not_whichever_was_listed_last(project, clock):
    """Files found in one scan got their ids, and so their claim order, in the order the
    directory listed them: with Ann over pair_rate, relay delivered her later messages to Bob
    and shed earlier ones (msg 2 shed, msg 3 delivered: a conversation with a hole). The files
    of a scan are taken in the order they were written (their mtime), so the latest are shed."""
    import os
    relay = project.relay(pair_rate="5", pair_window="10m")
    for n in range(10):
        path = project.drop("Ann", f"z{9 - n}-{n * 7919 % 10}", f"TO: Ben\n\nmessage {n}")
        os.utime(path, (clock.now - 100 + n, clock.now - 100 + n))
    total = relay.drain()
    assert (total.archived, total.shed) == (5, 5)
    assert sorted(m["body"] for m in project.inbox("Ben")) == [f"message {n}" for n in range(5)]


# -- attacks on flow control ------------------------------------------------------------------

def test_a_planted_link_in_failed_does_not_stop_the_batch(project, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    relay = project.relay(pair_rate=1, pair_window="1h")
    project.drop("Ann", "a", "TO: Ben\n\na")
    relay.drain()
    (project.state / "failed").mkdir(exist_ok=True)
    (project.state / "failed/Ann").symlink_to(outside)
    project.drop("Ann", "b", "TO: Ben, Cy\n\nb")
    counts = relay.drain()
    b = named(relay)["b"]
    assert counts.shed == 1 and relay.history.get(b)["status"] == "archived"
    assert [e["body"] for e in project.inbox("Cy")] == ["b"]
    assert sheds(relay, b) == [("Ben", "per_pair_rate", 1, 2, "Ann")]
    assert list(outside.iterdir()) == []


def test_a_stale_report_from_a_cut_attempt_is_removed(project, clock):
    relay = project.relay()
    switch = failing_create(relay, PermissionError(13, "Permission denied"), lambda rel: rel.startswith("inbox/Cy/"))
    project.drop("Ann", "m", "TO: Ben, Cy\n\nm")
    relay.drain()
    mid = named(relay)["m"]
    stale = project.state / "failed/Ann" / f"{mid}--m.shed.json"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text('{"shed": "written before a crash"}')
    switch["on"] = False
    for _ in range(3):
        relay.step(clock.advance(10))
    assert relay.history.get(mid)["status"] == "archived" and not stale.exists()


def test_a_broadcast_when_everyone_else_is_archived_fails_at_once(project):
    relay = project.relay()
    for name in ("Ben", "Cy"):
        relay.ledger.operations.archive_agent(name, 1.0, "operator:test")
    project.drop("Ann", "all", "TO: *\n\nanyone?")
    relay.drain()
    row = relay.history.get(named(relay)["all"])
    assert row["status"] == "failed" and "the others are archived" in row["error"] and row["retries"] == 0


def test_an_archived_agent_is_left_out_of_a_broadcast_but_shed_when_also_named(project):
    """'*' means the agents that are still there: an archived one is left out, silently. Named
    beside it, it is a recipient the sender chose: shed (recipient_archived), and told."""
    relay = project.relay(agents=("Ann", "Ben", "Cy", "Dee"))
    relay.ledger.operations.archive_agent("Cy", 1.0, "operator:test")
    project.drop("Ann", "all", "TO: *\n\neveryone")
    project.drop("Ann", "named", "TO: *, Cy\n\neveryone and Cy")
    relay.drain()
    everyone, named_too = named(relay)["all"], named(relay)["named"]
    assert relay.history.get(everyone)["status"] == "archived" and sheds(relay, everyone) == []
    assert sheds(relay, named_too) == [("Cy", "recipient_archived", None, None, "Ann")]
    assert relay.history.get(named_too)["status"] == "archived"             # Ben and Dee got it
    for agent in ("Ben", "Dee"):
        assert sorted(e["body"] for e in project.inbox(agent)) == ["everyone", "everyone and Cy"]
    assert project.inbox("Cy") == []


def test_an_operator_retry_passes_the_limits_but_never_an_archive(project, clock):
    from relay.operator import doctor as operator
    relay = project.relay(queue_limit=1)
    project.drop("Ann", "a", "TO: Ben\n\na")
    project.drop("Ann", "b", "TO: Ben\n\nb")
    relay.drain()
    [b] = ids(relay, "failed")
    relay.ledger.operations.archive_agent("Ben", clock.now, "operator:test")
    operator.retry(relay.ledger, relay.layout, [b], now=clock.now)
    relay.step(clock.advance(1))
    assert relay.history.get(b)["status"] == "failed"
    [row] = relay.history.sheds(b)              # one record, renewed with the new reason
    assert (row["reason"], row["released_at"]) == ("recipient_archived", None)
    [held] = project.inbox("Ben")
    assert held["id"] != b


def test_rows_this_build_cannot_read_do_not_stop_flow_control_or_the_views(cli):
    import sqlite3
    cli("init", "--agent", "Ann", "--agent", "Ben")
    (cli.state / "relay.toml").write_text("pair_rate = 1\n")
    for name in ("one", "two"):
        (cli.state / "outbox/Ann" / name).write_text("TO: Ben\n\nx")
        os.utime(cli.state / "outbox/Ann" / name, (1_700_000_000, 1_700_000_000))
    cli("run", "--once", "-q")
    db = sqlite3.connect(cli.state / "ledger.sqlite", isolation_level=None)
    db.execute("UPDATE sheds SET at = 'yesterday', limit_value = 'many', observed = x'00ff'")
    db.execute("UPDATE deliveries SET delivered_at = 'soon'")
    db.execute("INSERT INTO pings VALUES ('P1', 'Ben', 'noon', 'operator:x')")
    db.execute("INSERT INTO archived_agents VALUES ('../../etc', 'then', 'operator:x')")
    db.close()
    (cli.state / "outbox/Ann/three").write_text("TO: Ben\n\nx")
    os.utime(cli.state / "outbox/Ann/three", (1_700_000_000, 1_700_000_000))
    cli("run", "--once", "-q")                   # the windows are seeded without the bad rows
    [shed] = json.loads(cli("audit", "--status", "shed", "--json").output)
    for verb in (("status",), ("queues",), ("queues", "--json"), ("agents",), ("agents", "--json"),
                 ("show", shed["id"]), ("show", shed["id"], "--json"), ("report", "--html", str(cli.root / "r.html"))):
        assert cli(*verb, ok=False).exit_code == (3 if verb == ("status",) else 0)      # 3: no daemon runs
    assert "yesterday" in cli("show", shed["id"]).output


def test_the_reason_names_whom_a_message_was_shed_for():
    from relay.core.flow import summary
    from relay.core.work import Shed
    rate = Shed("per_pair_rate", 1, 2, "over")
    assert summary({"Ben": rate}) == "shed for Ben (per_pair_rate: over)"
    assert summary({"Ben": rate, "Cy": rate}) == "shed for every recipient (per_pair_rate: over)"
    assert summary({"Ben": rate, "Cy": rate}, everyone=False) == "shed for Ben, Cy (per_pair_rate: over)"
    assert summary({"Ben": rate, "Cy": Shed("queue_limit", 3, 3, "full")}) == (
        "shed for every recipient: Ben (per_pair_rate: over); Cy (queue_limit: full)")


@pytest.mark.parametrize("value, shown", [(59, "59s"), (60, "1m"), (90, "90s"), (600, "10m"), (3600, "1h"),
                                          (5400, "90m"), (86400, "1d"), (0.5, "0.5s")])
def test_a_window_in_a_shed_reason_is_shown_in_its_largest_whole_unit(value, shown):
    from relay.core.flow import seconds
    assert seconds(value) == shown


def test_a_looping_sender_of_large_shed_messages_grows_the_ledger_by_a_bounded_amount(project, clock, cli):
    """190 shed messages of 64 KiB from one sender (per_pair_rate): each keeps its subject,
    headers, size and hash, the first KiB of its body while the sender has had fewer than
    SHED_BODIES sheds in the SHED_WINDOW, and no body past them; the ledger does not hold the
    12 MiB that was sent."""
    import hashlib
    import sqlite3

    from relay.ledger.shed_keep import KEEP_BODY_BYTES, SHED_BODIES
    relay = project.relay(pair_rate=1, pair_window="1h")
    project.drop("Ann", "first", "TO: Ben\n\nthe one that is delivered")
    relay.drain()
    path = project.state / "ledger.sqlite"
    before = path.stat().st_size
    body = ("x" * 1023 + "é") * 64                                 # 64 KiB and more, a character across the cut
    for i in range(190):
        project.drop("Ann", f"loop{i:03d}", f"TO: Ben\nSUBJECT: again {i}\nX-Loop: {i}\n\n{body}")
    counts = relay.drain()
    assert counts.failed == 190 and counts.shed == 190
    db = sqlite3.connect(path)
    rows = db.execute("SELECT name, subject, size, sha256, body, headers FROM messages WHERE name LIKE 'loop%' "
                      "ORDER BY name").fetchall()
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    sent = len(body.encode())
    assert len(rows) == 190 and all(r[2] == sent + len(f"TO: Ben\nSUBJECT: again {n}\nX-Loop: {n}\n\n")
                                    for n, r in enumerate(rows))
    assert all(r[3] == hashlib.sha256(f"TO: Ben\nSUBJECT: again {n}\nX-Loop: {n}\n\n{body}".encode()).hexdigest()
               for n, r in enumerate(rows))
    assert [r[1] for r in rows] == [f"again {n}" for n in range(190)]
    assert all(json.loads(r[5]) == {"X-Loop": str(n)} for n, r in enumerate(rows))
    kept = [r[4] for r in rows]
    assert kept[:SHED_BODIES] == [body.encode()[:KEEP_BODY_BYTES].decode("utf-8", "ignore")] * SHED_BODIES
    assert len(kept[0].encode()) == KEEP_BODY_BYTES - 1                  # é is not cut in two
    assert kept[SHED_BODIES:] == [None] * (190 - SHED_BODIES)
    assert path.stat().st_size - before < 2 * 1024 * 1024               # 12 MiB were sent
    # audit and show still say what was shed: subject, size, hash
    mid = named(relay)["loop189"]
    shown = cli("show", mid, ok=False).output
    assert "again 189" in shown and str(rows[189][2]) in shown and rows[189][3] in shown
    assert "per_pair_rate" in shown
    audited = json.loads(cli("audit", "--json", "--status", "failed").output)
    assert {a["subject"] for a in audited} >= {"again 0", "again 189"}
    # an hour later the sender's next shed keeps its first KiB again
    clock.advance(3601)
    project.drop("Ann", "late0", "TO: Ben\n\nfirst\n" + body)
    project.drop("Ann", "late1", "TO: Ben\nSUBJECT: late\n\n" + body)
    relay.drain()
    late = relay.history.get(named(relay)["late1"])
    assert late["status"] == "failed" and late["body"] == body.encode()[:KEEP_BODY_BYTES].decode("utf-8", "ignore")


def test_messages_from_another_node_shed_for_every_recipient_keep_what_a_local_one_does(tmp_path):
    """The receiver of a federation records a message it sheds for every recipient with
    ledger.remote.received: the same bound as a local shed."""
    from relay.ledger.history import History
    from relay.ledger.ledger import Ledger
    from relay.ledger.shed_keep import KEEP_BODY_BYTES, SHED_BODIES
    now, body = 1_900_000_000.0, "y" * 200_000

    def item(i):
        return {"id": f"01KC30000000000000000{i:05d}", "sender": "Ann", "name": f"m{i}", "node": "n2",
                "entry_id": f"{i}-0", "recipients": ["Ben"], "kind": "message", "thread": None,
                "subject": f"loop {i}", "body": body, "headers": '{"X-Loop": "1"}', "sha256": "0" * 64,
                "sent_at": now, "delivered": {}, "error": "shed for Ben (per_pair_rate)"}
    failed = [item(i) for i in range(40)]
    sheds = [(m["id"], "Ben", "Ann", "per_pair_rate", 1, 2) for m in failed]
    with Ledger(tmp_path / "ledger.sqlite") as led:
        led.remote.received(now, [], [], sheds[:30], failed[:30])
        led.remote.received(now + 1, [], [], sheds[30:], failed[30:])
        rows = [History(led).get(m["id"]) for m in failed]
    assert [r["subject"] for r in rows] == [f"loop {i}" for i in range(40)]
    assert [r["body"] for r in rows] == [body[:KEEP_BODY_BYTES]] * SHED_BODIES + [None] * (40 - SHED_BODIES)
    assert all(r["status"] == "failed" and r["headers"] == '{"X-Loop": "1"}' for r in rows)


def test_a_shed_record_keeps_headers_up_to_their_bound():
    from relay.ledger.shed_keep import KEEP_HEADER_BYTES, KEEP_VALUE_CHARS, head, headers_kept
    small = json.dumps({"X-A": "1"})
    assert headers_kept(small) == small and headers_kept(None) is None
    big = json.dumps({f"X-{i}": "v" * 60_000 for i in range(4)})              # 240 KB of headers
    kept = json.loads(headers_kept(big))
    assert len(json.dumps(kept, separators=(",", ":"))) <= KEEP_HEADER_BYTES
    assert list(kept) == ["X-0", "X-1", "X-2", "X-3"] and all(v == "v" * KEEP_VALUE_CHARS for v in kept.values())
    assert head("é" * 600, 1023) == "é" * 511 and head("short", 1024) == "short"


def test_a_shed_records_headers_at_their_bound_exactly():
    """Headers of KEEP_HEADER_BYTES are kept as they are; past it, a header whose JSON fills the
    room left exactly is kept, and what no longer fits is left out."""
    from relay.ledger.shed_keep import KEEP_HEADER_BYTES, headers_kept
    whole = '{"X":"' + "v" * (KEEP_HEADER_BYTES - 8) + '"}'
    assert len(whole) == KEEP_HEADER_BYTES and headers_kept(whole) == whole
    name = "X" * (KEEP_HEADER_BYTES - 2 - len('{"":""}'))           # {name: ""} fills the room ({} aside)
    assert json.loads(headers_kept(json.dumps({name: "", "Y": "y"}))) == {name: ""}


@pytest.mark.parametrize("size", [150, 300_000])
def test_a_message_shed_for_size_that_opens_with_a_bom_keeps_its_recipients_and_subject(project, size):
    """A byte order mark before the headers is skipped as the parser skips it, whether the file
    was read whole (150) or only its first bytes (300 000)."""
    relay = project.relay(max_body_bytes=100)
    project.drop("Ann", "big", b"\xef\xbb\xbfTO: Ben, Cy\nSUBJECT: the big diff\n\n" + b"x" * size)
    assert relay.drain().failed == 1
    [row] = [r for r in relay.history.audit() if r["sender"] == "Ann"]
    assert (json.loads(row["recipients"] or "null"), row["subject"]) == (["Ben", "Cy"], "the big diff")
    assert row["body"].startswith("xxx")


def test_a_json_message_too_large_to_read_says_nothing_of_its_recipients(project):
    """Its fields may follow its body: what its first bytes hold is not taken for them."""
    relay = project.relay(max_body_bytes=100)
    project.drop("Ann", "big", json.dumps({"to": ["Ben"], "subject": "s", "body": "x" * 300_000}))
    assert relay.drain().failed == 1
    [row] = [r for r in relay.history.audit() if r["sender"] == "Ann"]
    assert (row["recipients"], row["subject"], row["status"]) == (None, None, "failed")
    assert "over max_body_bytes (100)" in row["error"]


def test_the_shed_filter_and_the_shed_figures_count_each_reason(project):
    """history.web: the messages filtered by `shed` are those with a shed recorded, whatever
    their status; shed_reasons counts each recipient's shed under its reason, every other
    reason flow control knows at 0."""
    from relay.ledger.schema import REASONS
    relay = project.relay(max_body_bytes=100)
    project.drop("Ann", "big", "TO: Ben, Cy\n\n" + "x" * 150)
    project.drop("Ann", "ok", "TO: Ben\n\nsmall")
    relay.drain()
    ids = named(relay)
    assert [r["id"] for r in relay.history.web.messages(status="shed")] == [ids["big"]]
    assert {r["id"] for r in relay.history.web.messages(status="failed")} >= {ids["big"]}
    assert ids["ok"] in [r["id"] for r in relay.history.web.messages(status="archived")]
    assert relay.history.web.shed_reasons() == {**dict.fromkeys(REASONS, 0), "body_size": 2}


def test_the_headers_a_shed_record_keeps_are_cut_to_256_characters_each_in_order_within_4_kib():
    import orjson

    from relay.ledger.shed_keep import headers_kept
    assert headers_kept(None) is None
    small = orjson.dumps({"X-A": "a" * 300}).decode()
    assert headers_kept(small) == small                         # within 4 KiB: kept as sent
    given = {f"H{i:02d}": "v" * 300 for i in range(16)}
    given["Z"] = "z"                                            # fits, but after one that did not
    given.update({f"N{i}": i for i in range(3)})
    kept = orjson.loads(headers_kept(orjson.dumps(given).decode()))
    assert kept == {f"H{i:02d}": "v" * 256 for i in range(15)}  # 15 x 266 bytes fit in 4094, the 16th does not
    assert len(orjson.dumps(kept)) <= 4096
    assert headers_kept("[" + '"x", ' * 1000 + '"x"]') is None
    assert headers_kept("{" + "x" * 5000) is None


def test_the_body_a_shed_record_keeps_is_its_first_kib_cut_between_characters():
    from relay.ledger.shed_keep import head
    assert head(None, 1024) is None
    assert head("é" * 256, 1024) == "é" * 256
    assert head("é" * 512, 1024) == "é" * 512
    assert head("é" * 513, 1024) == "é" * 512
    assert head("x" + "é" * 600, 1024) == "x" + "é" * 511
    assert head("\U0001f600" * 300, 1024) == "\U0001f600" * 256


def test_a_message_shed_for_every_recipient_keeps_the_first_1024_characters_of_its_subject(project):
    relay = project.relay(pair_rate=1, pair_window="1h")
    project.drop("Ann", "first", "TO: Ben\n\nthe one that is delivered")
    relay.drain()
    subject = "s" * 1023 + "éé" + "t" * 10
    project.drop("Ann", "shed", f"TO: Ben\nSUBJECT: {subject}\n\nbody")
    relay.drain()
    row = relay.history.get(named(relay)["shed"])
    assert row["status"] == "failed" and row["subject"] == subject[:1024] and row["body"] == "body"


def test_a_retry_does_not_count_against_the_limits_a_recipient_that_already_has_the_message(project, clock):
    """Delivered to Ben, not yet to Cy: tried again, the message is not shed for Ben (whose pair
    count it now fills) and reaches Cy; nothing is shed, no bounce is owed."""
    import errno
    relay = project.relay(pair_rate=2, pair_window="1h")
    project.drop("Ann", "m0", "TO: Ben\n\nm0")
    relay.drain()
    switch = failing_create(relay, OSError(errno.EACCES, "denied"), when=lambda rel: rel.startswith("inbox/Cy/"))
    project.drop("Ann", "m1", "TO: Ben, Cy\n\nm1")
    relay.hint("rescan")
    assert relay.step(clock.advance(1)).retried == 1
    mid = named(relay)["m1"]
    (project.state / "inbox/Ben/new" / f"{mid}.json").unlink()      # Ben took it and deleted it
    switch["on"] = False
    total = relay.drain(now_fn=lambda: clock.advance(5))
    assert total.archived == 1 and total.shed == 0
    assert relay.history.get(mid)["status"] == "archived" and sheds(relay, mid) == []
    assert [d["recipient"] for d in relay.history.deliveries(mid)] == ["Ben", "Cy"]
    assert [e["body"] for e in project.inbox("Ben")] == ["m0"] and [e["body"] for e in project.inbox("Cy")] == ["m1"]
    assert [e for e in project.inbox("Ann") if e["kind"] == "bounce"] == []


class Crash(BaseException):
    """Stands for the process dying: nothing after it runs."""


def test_a_message_a_crash_left_in_a_full_inbox_is_not_shed_for_the_recipient_that_holds_it(project, monkeypatch):
    """Delivered to Ben (queue_limit 1) and then the process died before the record: tried
    again, Ben's new/ is full with that very message, which is not shed, not delivered twice."""
    relay = project.relay(queue_limit=1)
    project.drop("Ann", "m", "TO: Ben\n\nx")
    monkeypatch.setattr(relay.ledger.messages, "record", lambda *a, **k: (_ for _ in ()).throw(Crash()))
    with pytest.raises(Crash):
        relay.step()
    assert len(project.inbox("Ben")) == 1
    relay.close()
    project.relays.remove(relay)
    again = project.relay(queue_limit=1)
    total = again.drain()
    assert (total.archived, total.shed, total.failed) == (1, 0, 0)
    [row] = [r for r in again.history.audit() if r["sender"] == "Ann"]
    assert row["status"] == "archived" and sheds(again, row["id"]) == []
    assert [e["body"] for e in project.inbox("Ben")] == ["x"] and project.inbox("Ann") == []


def test_a_queue_one_short_of_its_limit_is_shared_with_the_sender_already_in_it(project, clock):
    """Ben's new/ holds one of Cy's (queue_limit 2, one short of it): Ann's first message is
    admitted, her second in the same batch is over her share (1 of 2 senders) and shed."""
    relay = project.relay(queue_limit=2)
    project.drop("Cy", "c", "TO: Ben\n\nfrom Cy")
    relay.drain()
    clock.advance(1)
    project.drop("Ann", "a1", "TO: Ben\n\na1")
    project.drop("Ann", "a2", "TO: Ben\n\na2")
    relay.hint("rescan")
    relay.step(clock.advance(1))
    assert sorted(e["body"] for e in project.inbox("Ben")) == ["a1", "from Cy"]
    [(mid, shed)] = [(m, s) for m in ids(relay) for s in relay.history.sheds(m)]
    assert mid == named(relay)["a2"] and (shed["reason"], shed["limit_value"], shed["observed"]) == ("queue_limit", 2, 2)
    assert relay.history.get(mid)["error"] == (
        "shed for Ben (queue_limit: Ben already holds 2 unread messages in its new/ (queue_limit = 2), 1 of them "
        "from Ann, its share (1) among 2 sender(s); Ben is not reading its inbox)")


def test_a_backlog_written_slowly_while_no_relay_ran_is_counted_at_the_times_it_was_written(project, clock):
    """Three messages Ann wrote to Ben twenty minutes apart (pair_rate 1 a minute) are no loop
    when relay finds them at once: each counts at its file's time, and none is shed. Three
    written within the minute are: two are shed."""
    relay = project.relay(pair_rate=1, pair_window="60s")
    for i, ago in enumerate((3600, 2400, 1200)):
        path = project.drop("Ann", f"old{i}", f"TO: Ben\n\nold{i}")
        os.utime(path, (clock.now - ago, clock.now - ago))
    for i, ago in enumerate((30, 20, 10)):
        path = project.drop("Ann", f"new{i}", f"TO: Cy\n\nnew{i}")
        os.utime(path, (clock.now - ago, clock.now - ago))
    total = relay.drain()
    assert sorted(e["body"] for e in project.inbox("Ben")) == ["old0", "old1", "old2"]
    assert [e["body"] for e in project.inbox("Cy")] == ["new0"] and total.shed == 2


def test_what_a_too_large_message_says_is_read_from_its_first_bytes_and_its_body_cut_short():
    from relay.core.oversize import said
    m = said(b"\xef\xbb\xbfTO: Ben, Cy\nSUBJECT: s\n\n" + "é".encode() * 200, "big", 101)
    assert (m.to, m.subject, m.body) == (("Ben", "Cy"), "s", "é" * 50)     # 101 bytes cut between characters
    assert said(b"TO: Ben\n\n" + b"x" * 9000, "big", 100_000).body == "x" * 4096
    assert said(b"TO: Ben\n\n" + b"x" * 9000, "big", 0).body == ""
    doc = {"to": ["Ben"], "kind": "review", "subject": "s", "body": "y" * 300}
    m = said(json.dumps(doc).encode(), "big", 100)
    assert (m.to, m.kind, m.subject, m.body) == (("Ben",), "review", "s", "y" * 100)
    assert said(json.dumps({"to": "Ben", "subject": "s"}).encode(), "big", 100).body == ""


@pytest.mark.parametrize("data, whole", [
    (b"TO: Ben\nSUBJECT: \xff\xfe\n\nx", True),             # not UTF-8 in its headers
    (b"TO: Ben\nSUBJECT: s", True),                         # no blank line after the headers
    (b'{"to": "Ben", "body": "x"', True),                  # JSON that does not parse
    (b'{"to": "Ben", "body": "x"}', False),                # JSON read only in part: its fields may follow
    (b"SUBJECT: s\n\nx", True),                             # no recipient: no message relay reads
])
def test_a_too_large_message_whose_first_bytes_are_no_message_says_nothing(data, whole):
    from relay.core.oversize import said
    assert said(data, "big", 100, whole=whole) is None


def test_a_window_of_no_time_is_shown_in_seconds_and_a_body_size_shed_keeps_the_sentence_given():
    from relay.core.flow import body_size, seconds
    assert seconds(0) == "0s" and seconds(86400 * 2) == "2d" and seconds(7200) == "2h"
    sheds = body_size(100, 150, ("Ben", "Broadcast", "*"), text="the file grew while relay read it")
    assert list(sheds) == ["Ben", "*"] and {s.text for s in sheds.values()} == {"the file grew while relay read it"}
    assert body_size(100, 150, ())["*"].text == "the body is 150 bytes, over max_body_bytes (100)"


@pytest.mark.parametrize("values", [{"pair_window": "0s"}, {"pair_rate": 0}])
def test_a_pair_window_or_pair_rate_of_0_turns_the_pair_limit_off(project, values):
    relay = project.relay(**{"pair_rate": 1, "pair_window": "10m", **values})
    for i in range(4):
        project.drop("Ann", f"m{i}", f"TO: Ben\n\nm{i}")
    counts = relay.drain()
    assert (counts.archived, counts.shed) == (4, 0)
    assert sorted(e["body"] for e in project.inbox("Ben")) == ["m0", "m1", "m2", "m3"]


@pytest.mark.parametrize("sent_at, counted", [(90.0, 90.0), (150.0, 100.0), (None, 100.0), (float("nan"), 100.0),
                                              ("90", 100.0), (90, 90)])
def test_a_message_counts_as_written_at_its_files_time_unless_that_is_in_the_future_or_unknown(sent_at, counted):
    from relay.core.flow import written
    assert written(sent_at, 100.0) == counted


def test_a_message_shed_for_everyone_unread_is_said_shed_for_every_recipient():
    from relay.core.flow import body_size, summary
    sheds = body_size(100, 300_000, text="the file is 300000 bytes")
    assert summary(sheds) == "shed for every recipient (body_size: the file is 300000 bytes)"
    assert summary(sheds, everyone=False) == "shed for * (body_size: the file is 300000 bytes)"
    assert summary(body_size(100, 150, ("Ben",), text="big")) == "shed for Ben (body_size: big)"


def test_the_queue_limit_counts_only_envelopes_relay_writes_in_new(project, clock):
    relay = project.relay(queue_limit=2, pair_rate=0)
    project.drop("Ann", "m0", "TO: Ben\n\nm0")
    relay.drain()
    new = project.state / "inbox" / "Ben" / "new"
    other = "01JAAAAAAAAAAAAAAAAAAAAAAA"
    (new / f"{other}.txt!").write_text("{}")            # an id, but not .json
    (new / "not-an-id.json").write_text("{}")            # .json, but no id
    (new / "01JBBBBBBBBBBBBBBBBBBBBBBB.json").mkdir()    # an envelope's name, but a directory
    os.symlink(new / "not-an-id.json", new / "01JCCCCCCCCCCCCCCCCCCCCCCC.json")    # a link
    clock.advance(600)
    project.drop("Ann", "m1", "TO: Ben\n\nm1")
    relay.hint("file", "Ann", "m1")
    assert relay.drain().shed == 0
    project.drop("Ann", "m2", "TO: Ben\n\nm2")
    relay.hint("file", "Ann", "m2")
    assert relay.drain().shed == 1
    assert {r["name"]: r["status"] for r in relay.history.audit() if r["sender"] == "Ann"} == {
        "m0": "archived", "m1": "archived", "m2": "failed"}
    assert sheds(relay, named(relay)["m2"]) == [("Ben", "queue_limit", 2, 2, "Ann")]     # the planted ones not held


def test_a_recipient_that_read_its_inbox_has_room_again_before_the_next_rescan_interval(project, clock):
    """The count kept (2 of queue_limit 2) is an upper bound: near the limit new/ is listed
    again at once, so Ben, who has just read both, gets the third a second later."""
    relay = project.relay(queue_limit=2, pair_rate=0)
    project.drop("Ann", "a1", "TO: Ben\n\na1")
    project.drop("Ann", "a2", "TO: Ben\n\na2")
    relay.drain()
    take(project, "Ben")
    project.drop("Ann", "a3", "TO: Ben\n\na3")
    relay.hint("rescan")
    relay.step(clock.advance(1))
    assert [e["body"] for e in project.inbox("Ben")] == ["a3"]
    assert relay.history.get(named(relay)["a3"])["status"] == "archived" and sheds(relay, named(relay)["a3"]) == []


def test_a_count_kept_longer_than_rescan_interval_is_listed_again(project, clock, tmp_path):
    """Ben's new/ counted 0 (far from queue_limit 3, so not listed again while fresh); Ann's two
    envelopes put back there by hand are seen once the count is older than rescan_interval
    (30 s): Ann's next message is shed, three of hers unread."""
    relay = project.relay(queue_limit=3, pair_rate=0)
    project.drop("Ann", "a1", "TO: Ben\n\na1")
    project.drop("Ann", "a2", "TO: Ben\n\na2")
    relay.drain()
    new, aside = project.state / "inbox" / "Ben" / "new", tmp_path / "aside"
    aside.mkdir()
    moved = sorted(p.name for p in new.iterdir())
    for n in moved:
        os.rename(new / n, aside / n)
    clock.advance(1)
    project.drop("Ann", "a3", "TO: Ben\n\na3")       # near the limit: listed (empty), delivered
    relay.hint("rescan")
    relay.step(clock.advance(1))
    assert [e["body"] for e in project.inbox("Ben")] == ["a3"]
    for n in moved:
        os.rename(aside / n, new / n)
    project.drop("Ann", "a4", "TO: Ben\n\na4")
    relay.hint("rescan")
    relay.step(clock.advance(31))
    a4 = named(relay)["a4"]
    assert sheds(relay, a4) == [("Ben", "queue_limit", 3, 3, "Ann")]
    assert sorted(e["body"] for e in project.inbox("Ben")) == ["a1", "a2", "a3"]


def test_a_one_letter_agents_full_queue_sheds_the_next_message_like_any_other(project, clock):
    relay = project.relay(agents=("Ann", "B"), queue_limit=1, pair_rate=0)
    project.drop("Ann", "a1", "TO: B\n\na1")
    project.drop("Ann", "a2", "TO: B\n\na2")
    relay.drain()
    assert [e["body"] for e in project.inbox("B")] == ["a1"]
    assert sheds(relay, named(relay)["a2"]) == [("B", "queue_limit", 1, 1, "Ann")]
    assert relay.history.get(named(relay)["a2"])["status"] == "failed"


def test_a_queues_share_counts_only_the_senders_to_that_recipient_in_the_batch(project, clock):
    """Ben's new/ holds 4 of Cy's (queue_limit 6): Ann's third in the batch finds it full, but
    she has 2 of its 6 under her share (3, of 2 senders); Al, writing to Cy in the same batch,
    is no sender of Ben's queue and takes no share of it."""
    relay = project.relay(agents=("Al", "Ann", "Ben", "Cy"), queue_limit=6, pair_rate=0)
    for i in range(4):
        project.drop("Cy", f"c{i}", f"TO: Ben\n\nc{i}")
    relay.drain()
    clock.advance(1)
    project.drop("Al", "x", "TO: Cy\n\nx")
    for i in range(1, 4):
        project.drop("Ann", f"a{i}", f"TO: Ben\n\na{i}")
    relay.hint("rescan")
    relay.step(clock.advance(1))
    assert sorted(e["body"] for e in project.inbox("Ben")) == ["a1", "a2", "a3", "c0", "c1", "c2", "c3"]
    assert [e["body"] for e in project.inbox("Cy")] == ["x"]
    assert [s for n in ("a1", "a2", "a3") for s in sheds(relay, named(relay)[n])] == []


def test_a_broadcast_too_large_is_shed_for_star_and_for_each_agent_named_beside_it(project):
    relay = project.relay(max_body_bytes=100)
    project.drop("Ann", "big", "TO: *, Ben\n\n" + "x" * 150)
    assert relay.drain().failed == 1
    assert sheds(relay, named(relay)["big"]) == [("*", "body_size", 100, 150, "Ann"), ("Ben", "body_size", 100, 150, "Ann")]


def test_a_broadcast_left_with_only_recipients_shed_before_fails_with_their_sheds(project, clock):
    """`*` to Ben and Cy: Ben is shed (his queue full), Cy fails for a while; the operator then
    archives Cy, who leaves the broadcast. Its one recipient left was shed by the earlier
    attempt: the message fails with that shed, it is not archived as if delivered."""
    relay, mid, switch = shed_for_ben_and_failing_for_cy(project, clock, "TO: *\n\neveryone")
    relay.ledger.operations.archive_agent("Cy", clock.now, "operator:test")
    switch["on"] = False
    for _ in range(5):
        relay.step(clock.advance(10))
    row = relay.history.get(mid)
    assert row["status"] == "failed" and row["error"] == "shed for Ben (queue_limit)"
    assert project.inbox("Cy") == [] and [e["body"] for e in project.inbox("Ben")] == ["fills Ben's queue"]
