"""File reservations: advisory leases on paths and globs, in the ledger, for the shell, Python
and MCP. An overlapping exclusive reservation is refused naming its holder and its end, and the
holder is told; leases end by themselves (the injected clock), are renewed by reserving again,
and show in `relay status` and `relay agents`."""
import importlib.util
import json
import threading

import pytest

import relay
from relay.agent.api import Project
from relay.core.message import iso
from relay.errors import ReservationConflict, RelayError
from relay.ledger.history import History
from relay.ledger.ledger import Ledger




def events(root, *names):
    with History(Ledger(root / ".relay" / "ledger.sqlite", readonly=True)) as h:
        return [dict(e) for e in h.events_after(0) if e["event"] in names]


def notices(root, agent):
    box = root / ".relay" / "inbox" / agent / "new"
    docs = [json.loads(p.read_bytes()) for p in sorted(box.iterdir())] if box.is_dir() else []
    return [d for d in docs if d["kind"] == "reservation-refused"]


def test_an_overlapping_exclusive_reservation_is_refused_naming_its_holder(crew):
    alice, bob = crew.agent("Alice"), crew.agent("Bob")
    got = alice.reserve(["src/"], ttl="30m", exclusive=True, reason="parser refactor")
    assert [(r.agent, r.path, r.exclusive, r.reason) for r in got] == [("Alice", "src", True, "parser refactor")]
    assert got[0].expires_at == pytest.approx(crew.clock.now + 1800)
    with pytest.raises(ReservationConflict) as refused:
        bob.reserve(["src/parser/lexer.py", "docs/notes.md"])
    text = str(refused.value)
    assert "src/parser/lexer.py" in text and "Alice" in text and "parser refactor" in text
    assert iso(crew.clock.now + 1800)[:16] in text      # until when
    assert [(c["path"], c["holder"], c["held"]) for c in refused.value.conflicts] == \
        [("src/parser/lexer.py", "Alice", "src")]
    # all or nothing: docs/notes.md, free, was not reserved either
    assert [(r.agent, r.path) for r in bob.reservations()] == [("Alice", "src")]


def test_shared_reservations_share_and_an_exclusive_one_excludes_them(crew):
    alice, bob, carol = crew.agent("Alice"), crew.agent("Bob"), crew.agent("Carol")
    alice.reserve(["docs/**/*.md"])
    bob.reserve(["docs/guide.md"])                    # shared beside shared
    with pytest.raises(ReservationConflict, match="Alice"):
        carol.reserve(["docs"], exclusive=True)       # exclusive over shared ones
    carol.reserve(["docs/*.txt"], exclusive=True)     # no .md file is a .txt file
    with pytest.raises(ReservationConflict, match="Carol"):
        alice.reserve(["docs/a.txt"])                 # shared under an exclusive one
    # a path not there yet may become a directory: it holds what may be under it
    with pytest.raises(ReservationConflict, match=r"as docs/\*\*/\*\.md"):
        carol.reserve(["docs/b.txt"], exclusive=True)
    # a file that exists holds only itself; an agent's own reservations never stand in its way
    (crew.root / "docs").mkdir()
    (crew.root / "docs" / "b.txt").write_text("b\n")
    assert [r.scope for r in carol.reserve(["docs/b.txt", "docs"], exclusive=False)] == ["file", "tree"]
    carol.release(["docs"])
    assert sorted((r.agent, r.path) for r in alice.reservations()) == [
        ("Alice", "docs/**/*.md"), ("Bob", "docs/guide.md"), ("Carol", "docs/*.txt"), ("Carol", "docs/b.txt")]


def test_leases_expire_by_themselves_and_are_renewed_by_reserving_again(crew):
    alice, bob = crew.agent("Alice"), crew.agent("Bob")
    first = alice.reserve(["src/app.py"], ttl="10m", exclusive=True)[0]
    crew.clock.advance(540)
    renewed = alice.reserve(["src/app.py"], ttl="10m", exclusive=True)[0]
    assert renewed.since == first.since and renewed.expires_at == pytest.approx(crew.clock.now + 600)
    crew.clock.advance(300)                            # past the first lease's end, inside the renewed one
    with pytest.raises(ReservationConflict, match="Alice"):
        bob.reserve(["src/app.py"])
    crew.clock.advance(301)                            # the renewed lease is over
    assert bob.reservations() == []
    assert [r.agent for r in bob.reserve(["src/app.py"], exclusive=True)] == ["Bob"]
    expired = events(crew.root, "reservation-expired")
    assert len(expired) == 1 and expired[0]["actor"] == "Alice"
    assert expired[0]["at"] == pytest.approx(renewed.expires_at)      # recorded at the instant it ended
    assert [e["event"] for e in events(crew.root, "reserved", "renewed", "reservation-refused",
                                       "reservation-expired")] == [
        "reserved", "renewed", "reservation-refused", "reservation-expired", "reserved"]


def test_a_request_names_200_paths_and_a_reason_of_500_characters_at_most(crew):
    alice = crew.agent("Alice")
    with pytest.raises(RelayError, match="a reason is one line of at most 500 characters"):
        alice.reserve(["a"], reason="r" * 501)
    with pytest.raises(RelayError, match="200"):
        alice.reserve([f"p/{i}" for i in range(201)])
    assert alice.reservations() == []
    assert len(alice.reserve([f"p/{i}" for i in range(200)], reason="r" * 500)) == 200
    assert {r.reason for r in alice.reservations()} == {"r" * 500}


@pytest.mark.parametrize("seconds, said", [(-5, "0s"), (119.9, "119s"), (120, "2m"), (7199, "119m"), (7200, "2h00m"), (11100, "3h05m"), (7290, "2h01m"),
                                           (172799, "47h59m"), (172800, "2d00h"), (176400, "2d01h")])
def test_how_long_a_lease_has_left_is_said_in_its_largest_units(seconds, said):
    from relay.agent.leases import left
    assert left(seconds) == said


def test_release_and_what_was_not_held(crew):
    alice, bob = crew.agent("Alice"), crew.agent("Bob")
    alice.reserve(["src", "docs/*.md"], exclusive=True)
    assert alice.release(["src/", "tests"]) == ["src"]
    assert [r.path for r in alice.reservations(mine=True)] == ["docs/*.md"]
    bob.reserve(["src/app.py"], exclusive=True)
    assert alice.release() == ["docs/*.md"]          # None: all of mine
    assert [e["detail"].split()[0] for e in events(crew.root, "released")] == ["src", "docs/*.md"]


def test_reservations_are_durable_in_the_ledger(crew):
    crew.agent("Alice").reserve(["src"], exclusive=True, reason="r")
    with Project(crew.root) as fresh:
        with fresh.history() as h:
            rows = h.reservations.held(crew.clock.now)
    assert [(r["agent"], r["pattern"], r["exclusive"], r["reason"]) for r in rows] == [("Alice", "src", 1, "r")]


def test_paths_stay_inside_the_project(crew):
    alice = crew.agent("Alice")
    for bad in ["../elsewhere", "/etc/passwd", "src/../../x"]:
        with pytest.raises(RelayError, match="outside the project"):
            alice.reserve([bad])
    with pytest.raises(RelayError):
        alice.reserve(["src"], ttl="0s")
    assert alice.reservations() == []


def test_the_holder_is_told_once_per_lease_and_requester(crew):
    alice, bob, carol = crew.agent("Alice"), crew.agent("Bob"), crew.agent("Carol")
    alice.reserve(["src"], exclusive=True, reason="refactor")
    for _ in range(3):
        with pytest.raises(ReservationConflict):
            bob.reserve(["src/app.py"])
    told = notices(crew.root, "Alice")
    assert len(told) == 1
    n = told[0]
    assert n["from"] == "System" and n["to"] == ["Alice"]
    assert "Bob" in n["subject"] and "src/app.py" in n["body"] and "relay release" in n["body"]
    assert n["headers"]["requester"] == "Bob"
    with pytest.raises(ReservationConflict):
        carol.reserve(["src/x.py"], exclusive=True)
    assert [n["headers"]["requester"] for n in notices(crew.root, "Alice")] == ["Bob", "Carol"]
    assert notices(crew.root, "Bob") == [] and notices(crew.root, "Carol") == []
    # a new lease (after a release) is told again
    alice.release(["src"])
    crew.clock.advance(1)
    alice.reserve(["src"], exclusive=True)
    with pytest.raises(ReservationConflict):
        bob.reserve(["src/app.py"])
    assert [n["headers"]["requester"] for n in notices(crew.root, "Alice")] == ["Bob", "Carol", "Bob"]
    assert len(events(crew.root, "reservation-notice")) == 3


def test_a_notice_not_yet_written_is_kept_past_a_week_until_it_is(crew):
    """A delivered notice is kept a week; one not written yet (the holder's inbox could not take
    it) is kept until it is, however long that takes."""
    from relay.ledger.reservations import NOTICES_KEPT
    alice, bob, carol = crew.agent("Alice"), crew.agent("Bob"), crew.agent("Carol")
    alice.reserve(["src"], exclusive=True, ttl="7d")
    tmp = crew.root / ".relay" / "inbox" / "Alice" / "tmp"
    tmp.rmdir()
    tmp.write_text("in the way\n")
    with pytest.raises(ReservationConflict):
        bob.reserve(["src/app.py"])
    crew.clock.advance(NOTICES_KEPT + 60)             # a week and more: the lease has ended too
    carol.reserve(["docs"])                           # a write that sweeps what ended
    tmp.unlink()
    tmp.mkdir()
    carol.release(["docs"])
    [told] = notices(crew.root, "Alice")
    assert told["headers"]["requester"] == "Bob"


def test_notices_are_due_oldest_first_and_recorded_delivered_once(crew):
    alice, bob, carol = crew.agent("Alice"), crew.agent("Bob"), crew.agent("Carol")
    alice.reserve(["src"], exclusive=True)
    tmp = crew.root / ".relay" / "inbox" / "Alice" / "tmp"
    tmp.rmdir()
    tmp.write_text("in the way\n")                    # the notices stay due
    for requester in (bob, carol):
        crew.clock.advance(1)
        with pytest.raises(ReservationConflict):
            requester.reserve(["src/app.py"])
    with Ledger(crew.root / ".relay" / "ledger.sqlite") as led, History(led) as h:
        due = h.reservations.notices_due()
        assert [n["requester"] for n in due] == ["Bob", "Carol"]
        for _ in range(2):
            led.reservations.notice_delivered(due[0]["id"], "Alice", crew.clock.now, "written by hand")
        assert [n["requester"] for n in h.reservations.notices_due()] == ["Carol"]
    assert len(events(crew.root, "reservation-notice")) == 1


def test_a_notice_that_could_not_be_written_is_written_later_and_once(crew):
    alice, bob, carol = crew.agent("Alice"), crew.agent("Bob"), crew.agent("Carol")
    alice.reserve(["src"], exclusive=True)
    tmp = crew.root / ".relay" / "inbox" / "Alice" / "tmp"
    tmp.rmdir()
    tmp.write_text("in the way\n")                    # Alice's inbox cannot take an envelope now
    with pytest.raises(ReservationConflict):
        bob.reserve(["src/app.py"])
    assert notices(crew.root, "Alice") == [] and events(crew.root, "reservation-notice") == []
    tmp.unlink()
    tmp.mkdir()
    carol.reserve(["docs"])                           # any later write of any agent writes it
    [told] = notices(crew.root, "Alice")
    assert told["headers"]["requester"] == "Bob"
    carol.release(["docs"])
    assert len(notices(crew.root, "Alice")) == 1 and len(events(crew.root, "reservation-notice")) == 1


def test_two_agents_racing_for_one_exclusive_reservation_exactly_one_wins(crew):
    """Each on its own connection; the check and the write are one BEGIN IMMEDIATE transaction."""
    for round_ in range(10):
        path = f"race/{round_}.py"
        gate = threading.Barrier(2)
        won, lost = [], []

        def contend(name):
            me = relay.Agent(name, project=Project(crew.root))
            try:
                gate.wait()
                try:
                    won.append(me.reserve([path], exclusive=True)[0].agent)
                except ReservationConflict as e:
                    lost.append((name, e.conflicts[0]["holder"]))
            finally:
                me.close()
        threads = [threading.Thread(target=contend, args=(n,)) for n in ("Alice", "Bob")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1 and len(lost) == 1, (won, lost)
        assert lost[0][1] == won[0]


# -- the command line ------------------------------------------------------------------------

def test_cli_reserve_refuse_list_and_release(team):
    ok = team("reserve", "--agent", "Alice", "src/", "--for", "30m", "--exclusive", "--reason", "refactor")
    assert "src" in ok.output and "exclusive" in ok.output
    refused = team("reserve", "--agent", "Bob", "src/app.py", ok=False)
    assert refused.exit_code == 1
    line = [ln for ln in refused.output.splitlines() if ln.strip()]
    assert len(line) == 1 and "Alice" in line[0] and "until" in line[0] and "src/app.py" in line[0]
    listed = json.loads(team("reservations", "--json").output)
    assert [(r["agent"], r["path"], r["exclusive"], r["reason"]) for r in listed] == [("Alice", "src", True, "refactor")]
    assert {"since", "expires_at", "expires_in_s"} <= set(listed[0])
    assert "Alice" in team("reservations").output
    assert "released src" in team("release", "--agent", "Alice", "src").output
    assert json.loads(team("reservations", "--json").output) == []
    assert "Bob" in team("reserve", "--agent", "Bob", "src/app.py").output


def test_cli_paths_from_a_sub_directory_and_refusals(team, monkeypatch):
    (team.root / "src").mkdir()
    monkeypatch.chdir(team.root / "src")
    team("reserve", "--agent", "Alice", "app.py")
    assert [r["path"] for r in json.loads(team("reservations", "--json").output)] == ["src/app.py"]
    outside = team("reserve", "--agent", "Alice", "../../x", ok=False)
    assert outside.exit_code == 1 and "outside the project" in outside.output
    assert team("reserve", "--agent", "Alice", "x", "--for", "soon", ok=False).exit_code == 2
    for length in ("0", "0s", "604801"):                                  # a lease ended already, or too long
        r = team("reserve", "--agent", "Alice", "x", "--for", length, ok=False)
        assert r.exit_code == 2 and "more than 0s and at most 7d" in r.output, length
    assert team("reserve", "--agent", "Nobody", "x", ok=False).exit_code == 1
    assert team("reserve", "--agent", "Alice", ok=False).exit_code == 2      # no PATH
    assert "not held" in team("release", "--agent", "Alice", "nothing.py").output
    assert "released src/app.py" in team("release", "--agent", "Alice", "app.py").output    # from src/ too
    assert json.loads(team("reservations", "--json").output) == []


def test_cli_agent_from_relay_agent(team, monkeypatch):
    monkeypatch.setenv("RELAY_AGENT", "Carol")
    team("reserve", "notes.md")
    assert [r["agent"] for r in json.loads(team("reservations", "--json").output)] == ["Carol"]


def test_status_and_agents_show_reservations(team):
    team("reserve", "--agent", "Alice", "src", "--exclusive")
    team("reserve", "--agent", "Bob", "docs/*.md")
    status = json.loads(team("status", "--json").output)
    assert [(r["agent"], r["path"], r["exclusive"]) for r in status["reservations"]] == [
        ("Alice", "src", True), ("Bob", "docs/*.md", False)]
    text = team("status", ok=False).output
    assert "reservations" in text and "src" in text
    rows = {r["agent"]: r for r in json.loads(team("agents", "--json").output)}
    assert [r["path"] for r in rows["Alice"]["reservations"]] == ["src"]
    assert rows["Carol"]["reservations"] == []
    assert "RESERVED" in team("agents").output


def test_tail_shows_every_change(team):
    team("reserve", "--agent", "Alice", "src", "--exclusive")
    team("reserve", "--agent", "Bob", "src/x", ok=False)
    team("release", "--agent", "Alice", "src")
    seen = [json.loads(line)["event"] for line in team("tail", "--json").output.splitlines()]
    assert seen == ["reserved", "reservation-refused", "reservation-notice", "released"]


# -- MCP -------------------------------------------------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("mcp") is None, reason="needs the mcp extra")
def test_mcp_tools_reserve_release_and_reservations(team, tmp_path):
    """Through the SDK's own client, two servers (Alice's and Bob's) on one project."""
    import anyio
    from mcp_client import ToolFailed, serve
    errlog = tmp_path / "server.err"

    async def main():
        with open(errlog, "w") as err:
            async with serve(team.root, "Alice", err) as alice, serve(team.root, "Bob", err) as bob:
                tools = await alice.tools()
                assert {"reserve", "release", "reservations"} <= set(tools)
                got = await alice.call("reserve", paths=["src/"], ttl="30m", exclusive=True, reason="refactor")
                [lease] = got["reservations"]
                assert (lease["agent"], lease["path"], lease["exclusive"], lease["scope"]) == ("Alice", "src", True, "tree")
                assert 1790 < lease["expires_in_s"] <= 1800
                with pytest.raises(ToolFailed) as refused:
                    await bob.call("reserve", paths=["src/app.py"])
                text = str(refused.value)
                assert "Alice" in text and "until" in text and "refactor" in text and "\n" not in text
                assert [r["agent"] for r in (await bob.call("reservations"))["reservations"]] == ["Alice"]
                assert (await bob.call("reservations", mine=True))["reservations"] == []
                assert await alice.call("release", paths=["src", "docs"]) == {"released": ["src"], "not_held": ["docs"]}
                got = await bob.call("reserve", paths=["src/app.py"], exclusive=True)
                assert got["reservations"][0]["agent"] == "Bob"
                assert await bob.call("release") == {"released": ["src/app.py"], "not_held": []}
    anyio.run(main)
    assert "Traceback" not in errlog.read_text()
    assert len(notices(team.root, "Alice")) == 1


@pytest.mark.skipif(importlib.util.find_spec("mcp") is None, reason="needs the mcp extra")
def test_long_patterns_under_the_bound_are_reserved_and_compared_in_the_cli_and_mcp(team, tmp_path):
    """`*a` x 240 (480 characters; the bound is 1,024) once ended in a RecursionError."""
    import anyio
    from mcp_client import ToolFailed, serve
    long_ = "*a" * 240
    assert long_ in team("reserve", "--agent", "Alice", long_, "--exclusive").output
    assert "Bob" in team("reserve", "--agent", "Bob", "*b" * 240).output           # ends in b: no overlap
    refused = team("reserve", "--agent", "Bob", "a" * 240, ok=False)
    assert refused.exit_code == 1 and "Alice" in refused.output and "Traceback" not in refused.output
    errlog = tmp_path / "server.err"

    async def main():
        with open(errlog, "w") as err:
            async with serve(team.root, "Carol", err) as carol:
                with pytest.raises(ToolFailed, match="Alice"):
                    await carol.call("reserve", paths=["?" * 500])
                got = await carol.call("reserve", paths=["/".join(["**", "b"] * 150)])
                assert got["reservations"][0]["agent"] == "Carol"
    anyio.run(main)
    assert "Traceback" not in errlog.read_text()


# -- the bounds of one request ---------------------------------------------------------------

def _many_segments(base):
    """A 1,024-character glob of 256 segments `*X*`, a different character in each: any two such
    overlap, and deciding it fills a dynamic programme of 256 x 256 segments."""
    return "/".join(f"*{chr(0x4E00 + base + i)}*" for i in range(256))[:1024]


def test_overlaps_are_decided_outside_the_write_lock_so_other_writers_go_on(crew):
    """A write through another connection, made while the request's overlaps are decided,
    succeeds at once (busy timeout 50 ms): no lock is held while comparing."""
    from relay.files.patterns import overlap
    crew.agent("Bob").reserve(["src/*.py", "docs/**"], exclusive=True)
    path = crew.root / ".relay" / "ledger.sqlite"
    wrote = []

    def overlaps_writing(a, b, a_scope, b_scope, work):
        other = Ledger(path, busy_timeout_ms=50)
        try:
            wrote.append(other.state.set(f"k{len(wrote)}", "v", crew.clock.now, "Carol")[0])
        finally:
            other.close()
        return overlap(a, b, a_scope, b_scope, work)

    ledger = Ledger(path)
    try:
        got, conflicts, _ = ledger.reservations.reserve(
            "Alice", [("src/app.py", "tree"), ("lib", "tree")], crew.clock.now, crew.clock.now + 60, True, None,
            iter(f"r{i}" for i in range(99)).__next__, lambda holder, cs: ("s", "b", "{}"), overlaps=overlaps_writing)
    finally:
        ledger.close()
    assert wrote == [True] * 4                      # two paths x two leases of Bob, each compared once
    assert [c["held"] for c in conflicts] == ["src/*.py"] and got == []


def test_a_lease_taken_while_a_request_is_decided_is_decided_too(crew):
    """The leases changed between the decision and the write: the decision is made again."""
    from relay.files.patterns import overlap
    path = crew.root / ".relay" / "ledger.sqlite"
    ids = iter(f"r{i}" for i in range(99)).__next__
    raced = []

    def overlaps_racing(a, b, a_scope, b_scope, work):
        if not raced:                       # Carol takes src/ while Alice's request is decided
            raced.append(crew.agent("Carol").reserve(["src"], exclusive=True))
        return overlap(a, b, a_scope, b_scope, work)

    crew.agent("Bob").reserve(["docs"], exclusive=True)
    ledger = Ledger(path)
    try:
        got, conflicts, _ = ledger.reservations.reserve("Alice", [("src/app.py", "tree")], crew.clock.now,
                                                        crew.clock.now + 60, True, None, ids,
                                                        lambda holder, cs: ("s", "b", "{}"), overlaps=overlaps_racing)
    finally:
        ledger.close()
    assert got == [] and [(c["holder"], c["held"]) for c in conflicts] == [("Carol", "src")]


def test_the_work_of_one_request_is_bounded_and_counted(crew):
    """Deciding 2 x 2 globs of 256 segments each would take 4 x 525,825 steps: refused at the
    bound (MAX_WORK), naming it, with nothing written; a Work given counts the steps taken."""
    from relay.files.patterns import MAX_WORK, TooMuchWork, Work
    bob, alice = crew.agent("Bob"), crew.agent("Alice")
    bob.reserve([_many_segments(0), _many_segments(300)], exclusive=True)
    with pytest.raises(TooMuchWork, match=f"more than {MAX_WORK:,} steps") as refused:
        alice.reserve([_many_segments(600), _many_segments(900)], exclusive=True)
    assert "fewer or shorter paths" in str(refused.value)
    assert not events(crew.root, "reservation-refused") and [r.agent for r in alice.reservations()] == ["Bob", "Bob"]
    work = Work(limit=100_000)
    ledger = Ledger(crew.root / ".relay" / "ledger.sqlite")
    try:
        with pytest.raises(TooMuchWork, match="100,000 steps"):
            ledger.reservations.reserve("Alice", [(_many_segments(600), "glob")], crew.clock.now, crew.clock.now + 60,
                                        True, None, iter(["r1"]).__next__, lambda holder, cs: ("s", "b", "{}"),
                                        work=work)
    finally:
        ledger.close()
    assert 100_000 < work.spent <= 100_000 + 64     # it stopped at the bound: one step past it at most


def test_an_agent_holds_at_most_max_held_patterns(crew):
    from relay.ledger.reservations import MAX_HELD
    alice = crew.agent("Alice")
    alice.reserve([f"a/{i}" for i in range(200)])
    alice.reserve([f"b/{i}" for i in range(MAX_HELD - 200)])
    with pytest.raises(RelayError, match=f"Alice would hold {MAX_HELD + 1} reservations; an agent holds at most "
                                         f"{MAX_HELD}"):
        alice.reserve(["c/0"])
    assert len(alice.reservations(mine=True)) == MAX_HELD
    assert alice.reserve(["a/0", "b/0"], reason="renewed")[0].reason == "renewed"      # renewing is not more


@pytest.mark.parametrize("ttl, seconds", [(0.5, 0.5), ("500ms", 0.5), ("1s", 1.0), ("7d", 604800.0), (604800, 604800.0)])
def test_a_lease_lasts_any_time_above_nothing_up_to_seven_days(ttl, seconds):
    from relay.agent.leases import ttl_seconds
    assert ttl_seconds(ttl) == seconds


@pytest.mark.parametrize("ttl", [0, "0s", -1, 604800.5, "7d1s", True])
def test_a_lease_of_nothing_or_past_seven_days_is_refused(ttl):
    from relay.agent.leases import ttl_seconds
    with pytest.raises(RelayError, match="a lease"):
        ttl_seconds(ttl)


@pytest.mark.parametrize("char, refused", [("\ud7ff", False), ("\ud800", True), ("\udfff", True), ("\ue000", False),
                                           ("\t", True), ("\x7f", True)])
def test_a_reason_refuses_control_characters_and_lone_surrogates_only(crew, char, refused):
    alice = crew.agent("Alice")
    if refused:
        with pytest.raises(RelayError, match="without control characters"):
            alice.reserve(["a"], reason=f"x{char}y")
        assert alice.reservations() == []
    else:
        assert [r.reason for r in alice.reserve(["a"], reason=f"x{char}y")] == [f"x{char}y"]


def test_a_refusal_names_the_holders_oldest_lease_first(crew):
    alice, bob, carol = crew.agent("Alice"), crew.agent("Bob"), crew.agent("Carol")
    bob.reserve(["src/"])
    crew.clock.advance(60)
    alice.reserve(["src/a.py"])
    with pytest.raises(ReservationConflict) as refused:
        carol.reserve(["src/a.py"], exclusive=True)
    assert [(c["path"], c["holder"], c["held"]) for c in refused.value.conflicts] == \
        [("src/a.py", "Bob", "src"), ("src/a.py", "Alice", "src/a.py")]


@pytest.mark.parametrize("paths", [[], (), iter([])])
def test_a_request_naming_no_path_is_refused(crew, paths):
    with pytest.raises(RelayError) as e:
        crew.agent("Alice").reserve(paths)
    assert str(e.value) == "name at least one path or glob"


def test_the_200_paths_of_a_request_are_counted_as_given_and_a_single_path_may_be_a_string(crew):
    alice = crew.agent("Alice")
    with pytest.raises(RelayError) as e:
        alice.reserve(["src"] * 201)
    assert str(e.value) == "201 paths in one request; at most 200"
    assert [r.path for r in alice.reserve(["src"] * 200)] == ["src"]
    assert [r.path for r in alice.reserve("docs")] == ["docs"]
    assert [r.path for r in alice.reservations(mine=True)] == ["docs", "src"]


def test_system_reserves_nothing(crew, team):
    import relay
    from relay.agent.project import Project as Team
    from relay.errors import InvalidName
    with relay.Agent("System", project=Team(team.root, clock=crew.clock)) as system:
        with pytest.raises(InvalidName) as e:
            system.reserve(["src"])
    assert str(e.value) == "'System' is relay's own name; only agents reserve files"


def test_a_notice_to_an_archived_holder_is_not_written_and_recorded_so(crew, team):
    alice, bob = crew.agent("Alice"), crew.agent("Bob")
    alice.reserve(["src"], exclusive=True)
    team("archive-agent", "Alice")
    with pytest.raises(ReservationConflict) as refused:
        bob.reserve(["src/app.py"])
    assert [e["detail"] for e in events(crew.root, "reservation-notice")] == ["to Alice: not written: Alice is archived"]
    assert notices(crew.root, "Alice") == []
    assert str(refused.value).endswith(". Alice is archived and was not told; ask, wait for the lease to end, or "
                                       "reserve other paths")


def test_cli_reserve_for_exactly_seven_days_and_as_json(team):
    out = team("reserve", "--agent", "Alice", "src", "--for", "7d", "--reason", "why").output.strip()
    assert out.startswith("Alice holds src (shared, and all under it) until ") and out.endswith(" (in 6d23h; why)")
    listed = json.loads(team("reserve", "--agent", "Alice", "docs/*.md", "--exclusive", "--json").output)
    assert [(r["agent"], r["path"], r["scope"], r["exclusive"], r["reason"]) for r in listed] == [
        ("Alice", "docs/*.md", "glob", True, None)]
    assert 3599 < listed[0]["expires_in_s"] <= 3600
    out = team("reserve", "--agent", "Bob", "README.md", "--for", "1ms").output
    assert out.startswith("Bob holds README.md (shared, ")


def test_cli_reservations_lists_a_table_by_agent_and_path_and_filters_by_agent(team):
    assert team("reservations").output == "no reservations held\n"
    team("reserve", "--agent", "Bob", "x.py")
    team("reserve", "--agent", "Alice", "src", "--reason", "why", "--exclusive")
    team("reserve", "--agent", "Alice", "docs/*.md")
    lines = team("reservations").output.splitlines()
    assert lines[0].split() == ["AGENT", "MODE", "UNTIL", "LEFT", "PATH"]
    assert [ln.split()[:2] + ln.split()[4:] for ln in lines[1:]] == [
        ["Alice", "shared", "docs/*.md"], ["Alice", "exclusive", "src", "(why)"], ["Bob", "shared", "x.py"]]
    lines = team("reservations", "--agent", "Bob").output.splitlines()
    assert len(lines) == 2 and lines[1].split()[0] == "Bob"
    assert team("reservations", "--agent", "Carol").output == "no reservations held\n"


def test_cli_release_needs_paths_or_all_and_says_what_was_not_held(team):
    r = team("release", "--agent", "Alice", ok=False)
    assert r.exit_code == 2 and "relay: name the paths to release, or --all" in r.output
    assert team("release", "--agent", "Alice", "--all").output == "Alice held no reservation\n"
    team("reserve", "--agent", "Alice", "src", "docs")
    assert team("release", "--agent", "Alice", "src", "nothing").output.splitlines() == [
        "released src", "nothing: not held by Alice; nothing to release (relay reservations --agent Alice)"]
    assert team("release", "--agent", "Alice", "--all").output == "released docs\n"


def test_status_names_eight_reservations_at_most_and_marks_the_exclusive_ones(team):
    team("reserve", "--agent", "Alice", "src", "--exclusive")
    team("reserve", "--agent", "Bob", "docs/*.md")
    [line] = [ln for ln in team("status", ok=False).stdout.splitlines() if ln.startswith("reservations")]
    assert line == "reservations 2: Alice src (exclusive), Bob docs/*.md  (relay reservations)"
    team("reserve", "--agent", "Carol", *[f"c{i}" for i in range(6)])
    [line] = [ln for ln in team("status", ok=False).stdout.splitlines() if ln.startswith("reservations")]
    assert line.startswith("reservations 8: ") and line.endswith(", Carol c5  (relay reservations)")
    team("reserve", "--agent", "Carol", "c6")
    [line] = [ln for ln in team("status", ok=False).stdout.splitlines() if ln.startswith("reservations")]
    assert line.startswith("reservations 9: ") and line.endswith(", Carol c5 ...  (relay reservations)")
    assert "c6" not in line


def test_a_refusal_says_each_lease_in_the_way_how_it_is_held_and_that_its_holders_were_told(crew):
    from relay.ledger.reservations import utc
    alice, bob, carol = crew.agent("Alice"), crew.agent("Bob"), crew.agent("Carol")
    bob.reserve(["src/"], ttl="2h", reason="the parser")
    alice.reserve(["src/a.py"], ttl="90s")
    until_bob, until_alice = utc(crew.clock.now + 7200), utc(crew.clock.now + 90)
    with pytest.raises(ReservationConflict) as refused:
        carol.reserve(["src/a.py"], exclusive=True)
    assert str(refused.value) == (
        f"nothing reserved for Carol: src/a.py is held shared by Bob (as src) until {until_bob} (in 2h00m; reason: "
        f"the parser); src/a.py is held shared by Alice until {until_alice} (in 90s). Bob, Alice were told; ask, "
        "wait for the lease to end, or reserve other paths")
    alice.release()
    with pytest.raises(ReservationConflict) as refused:
        carol.reserve(["src/b.py"], exclusive=True)
    assert str(refused.value).endswith(". Bob was told; ask, wait for the lease to end, or reserve other paths")
    [told] = notices(crew.root, "Bob")             # once per lease and requester
    assert told["subject"] == "reservation: Carol was refused on src"
    assert told["body"].splitlines()[:2] == [
        f"Carol asked to reserve src/a.py (exclusive) at {utc(crew.clock.now)} and was refused: you hold src.",
        f"  src (shared) until {until_bob}; reason: the parser"]
    assert "`relay release --agent Bob src`" in told["body"] and "--to Carol" in told["body"]


def test_a_refusal_says_which_holders_were_told_and_which_are_archived_and_were_not(crew, team):
    from relay.agent.leases import refusal
    alice, bob, carol = (crew.agent(n) for n in ("Alice", "Bob", "Carol"))
    alice.reserve(["src/a.py"])
    bob.reserve(["src/a.py"])
    team("archive-agent", "Alice")
    with pytest.raises(ReservationConflict) as refused:
        carol.reserve(["src/a.py"], exclusive=True)
    assert str(refused.value).endswith(". Bob was told; Alice is archived and was not told; ask, wait for "
                                       "the lease to end, or reserve other paths")
    assert len(notices(crew.root, "Bob")) == 1 and notices(crew.root, "Alice") == []
    held = [{"holder": h, "path": "p", "held": "p", "exclusive": False, "reason": None, "expires_at": 60.0}
            for h in ("Ann", "Ben", "Cy")]
    assert str(refusal("Dee", True, held, 0.0, archived={"Ben", "Cy"})).endswith(
        ". Ann was told; Ben, Cy are archived and were not told; ask, wait for the lease to end, or reserve other paths")
    assert ". Ann, Ben, Cy were told; ask" in str(refusal("Dee", True, held, 0.0))


def test_a_project_whose_ledger_is_not_made_yet_holds_no_reservation(team):
    (team.state / "ledger.sqlite").unlink()
    with relay.Agent("Alice", root=team.root) as alice:
        assert alice.reservations() == [] and alice.reservations(mine=True) == []
    assert not (team.state / "ledger.sqlite").exists()


def test_the_mcp_release_tool_says_what_it_released_and_what_was_not_held_and_reservations_filters_mine(team):
    import anyio

    from relay.agent import mcp_server
    with relay.Agent("Alice", root=team.root) as alice, relay.Agent("Bob", root=team.root) as bob:
        server = mcp_server.build(alice)

        def call(name, args):
            return anyio.run(server.call_tool, name, args).structured_content
        got = call("reserve", {"paths": ["src", "docs/*.md"], "exclusive": True, "reason": "why"})
        assert [(r["path"], r["exclusive"], r["reason"]) for r in got["reservations"]] == [
            ("src", True, "why"), ("docs/*.md", True, "why")]
        bob.reserve(["README.md"])
        assert [r["agent"] for r in call("reservations", {})["reservations"]] == ["Alice", "Alice", "Bob"]
        assert [r["path"] for r in call("reservations", {"mine": True})["reservations"]] == ["docs/*.md", "src"]
        assert call("release", {"paths": ["src/", "README.md", "nothing"]}) == {
            "released": ["src"], "not_held": ["README.md", "nothing"]}
        assert call("release", {}) == {"released": ["docs/*.md"], "not_held": []}
        assert [r["agent"] for r in call("reservations", {})["reservations"]] == ["Bob"]


def test_a_renewal_without_a_reason_keeps_the_reason_given_and_one_with_a_reason_replaces_it(crew, team):
    alice = crew.agent("Alice")
    [first] = alice.reserve(["src/app.py"], ttl="5m", reason="the parser")
    [renewed] = alice.reserve(["src/app.py"], ttl="10m")
    assert renewed.reason == "the parser" and renewed.since == first.since
    assert [r.reason for r in alice.reservations(mine=True)] == ["the parser"]
    assert "(the parser)" in team("reservations").output
    [changed] = alice.reserve(["src/app.py"], ttl="10m", reason="the lexer now")
    assert changed.reason == "the lexer now" and [r.reason for r in alice.reservations()] == ["the lexer now"]


def test_a_reason_that_is_no_text_is_refused_and_an_empty_one_is_none(crew):
    alice = crew.agent("Alice")
    for bad in (5, ["why"], b"why"):
        with pytest.raises(RelayError, match="a reason is one line of at most 500 characters"):
            alice.reserve(["a"], reason=bad)
    assert alice.reservations() == []
    [r] = alice.reserve(["a"], reason="")
    assert r.reason is None and [x.reason for x in alice.reservations()] == [None]
