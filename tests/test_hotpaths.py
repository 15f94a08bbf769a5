"""The per-message hot paths give the same text as their plain forms: a timestamp, an id, a
parsed message, the verdict on a stored row. Each fast path is checked against a reference
written the obvious way, over many inputs and the edges where a shortcut would go wrong."""
import datetime
import math
import os
import random
import time

import orjson
import pytest

from relay.files import fs

from relay import ids

from relay.core import archive, message
from relay.errors import MessageRefused, TooLarge
from relay.ids import ALPHABET

UTC = datetime.timezone.utc


def _datetime_iso(ts):
    """What datetime makes of `ts`, in relay's form (microseconds, a Z)."""
    d = datetime.datetime.fromtimestamp(ts, UTC)
    return d.strftime("%Y-%m-%dT%H:%M:%S") + f".{d.microsecond:06d}Z"


def test_iso_matches_datetime_for_many_instants():
    rng = random.Random(15)
    instants = [rng.uniform(-2e9, 4e9) for _ in range(20000)]
    # Batches alternate between a few seconds (sent_at, relayed_at): the cache of formatted
    # seconds must never hand one second's text to another.
    instants += [t + d for t in (1_700_000_000.0, 1_760_000_000.5) for d in (0.25, 1.0, -1.0, 0.25, 3600.0, 0.0)]
    for ts in instants:
        assert message.iso(ts) == _datetime_iso(ts), ts


def test_iso_calendar_edges_and_rounding():
    leap = datetime.datetime(2024, 2, 29, 23, 59, 59, tzinfo=UTC).timestamp()
    y2k = datetime.datetime(1999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()
    cases = {
        0.0: "1970-01-01T00:00:00.000000Z",
        -0.5: "1969-12-31T23:59:59.500000Z",
        -1e-6: "1969-12-31T23:59:59.999999Z",
        leap: "2024-02-29T23:59:59.000000Z",
        leap + 0.9999996: "2024-03-01T00:00:00.000000Z",     # rounds up into the next day
        leap + 0.9999994: "2024-02-29T23:59:59.999999Z",
        y2k + 0.9999999: "2000-01-01T00:00:00.000000Z",
        951782400.0: "2000-02-29T00:00:00.000000Z",           # 2000 is a leap year
        1_700_000_000.0000004: "2023-11-14T22:13:20.000000Z",   # under half a microsecond
        1_700_000_000.25: "2023-11-14T22:13:20.250000Z",
        1e18: "9999-12-31T23:59:59.000000Z",                  # past the calendar: its end
        float("inf"): "9999-12-31T23:59:59.000000Z",
        -1e18: "0001-01-01T00:00:00.000000Z",
        1_700_000_000: "2023-11-14T22:13:20.000000Z",           # an int
    }
    for ts, want in cases.items():
        assert message.iso(ts) == want, ts
    # Round half to even on the microsecond, as datetime does, wherever a half is exact.
    for ts in (0.0000005, 0.0000015, 0.0000025, 1.5 + 0.0000005, 1024.0000005):
        assert message.iso(ts) == _datetime_iso(ts), ts


def test_the_day_of_an_instant_is_datetimes_whichever_day_was_named_before():
    """day_of keeps the day it named last: instants on either side of midnight, before 1970, far
    off and unfit, in any order, each get the day datetime gives (or 0001-01-01)."""
    def reference(ts):
        try:
            return datetime.datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d")
        except (OverflowError, OSError, ValueError):
            return "0001-01-01"
    rng = random.Random(29)
    midnight = 1_764_633_600.0          # 2025-12-02T00:00:00Z
    edges = [midnight, midnight - 1e-6, midnight + 1e-6, midnight - 86400, 0.0, -1e-6, -86400.5, 951_782_400.0,
             253_402_300_799.0, 1e20, -1e20, float("nan"), float("inf"), float("-inf")]
    instants = edges + [rng.uniform(-4e9, 4e9) for _ in range(2000)] + [midnight + rng.uniform(-5, 5) for _ in range(500)]
    rng.shuffle(instants)
    for ts in instants + edges:
        assert archive.day_of(ts) == reference(ts), ts
        assert archive.day_of(ts) == reference(ts), ts       # named again, from what it kept
    # datetime rounds to the microsecond: the last half microsecond of a day is named the next
    # day, which must not be kept for the rest of the day before it.
    for before, then in [(math.nextafter(midnight, 0), midnight - 43200), (midnight - 4e-7, midnight - 1),
                         (-1e-7, -3600.0), (math.nextafter(0.0, -1), -86399.0)]:
        assert archive.day_of(before) == reference(before)
        assert archive.day_of(then) == reference(then) == reference(midnight - 86400 if then > 0 else -1), then
    with pytest.raises(TypeError):
        archive.day_of(None)


def test_iso_cache_stays_small():
    for s in range(10 * message.MAX_ISO_SECONDS):
        message.iso(1_600_000_000 + s + 0.5)
    assert len(message._iso_seconds) <= message.MAX_ISO_SECONDS
    assert message.iso(1_600_000_000.5) == _datetime_iso(1_600_000_000.5)



def _chars(value, length):
    """`length` characters of the id alphabet for `value`, 5 bits each, most significant first."""
    return "".join(ALPHABET[(value >> (5 * i)) & 31] for i in range(length - 1, -1, -1))


def test_id_text_is_the_milliseconds_then_the_random_part_each_cut_to_its_width():
    rng = random.Random(15)
    cases = [(0, 0), (2 ** 48 - 1, 2 ** 80 - 1), (2 ** 50 + 7, 2 ** 80 + 3), (-1, 5), (1_760_000_000_123, 2 ** 79)]
    cases += [(rng.randrange(2 ** 48), rng.randrange(2 ** 80)) for _ in range(2000)]
    for ms, rand in cases:
        assert ids.id_text(ms, rand) == _chars(ms, 10) + _chars(rand, 16) == ids._encode(ms, 10) + ids._encode(rand, 16)


def test_ids_of_one_millisecond_count_up():
    gen = ids.IdGenerator()
    first = gen.new(1_760_000_000.123)
    second, later = gen.new(1_760_000_000.1234), gen.new(1_760_000_000.124)
    assert first[:10] == second[:10] == _chars(1_760_000_000_123, 10) and later[:10] == _chars(1_760_000_000_124, 10)
    assert first < second < later
    assert _from_chars(second[10:]) == _from_chars(first[10:]) + 1


def test_ids_keep_increasing_when_the_clock_steps_back():
    """A clock set back (NTP, a VM resumed) gives no id that sorts before one already given:
    the later ids keep the last millisecond and count up from it."""
    gen = ids.IdGenerator()
    first = gen.new(1_760_000_000.500)
    back = [gen.new(1_760_000_000.500 - step) for step in (0.001, 5.0, 3600.0)]
    assert sorted([first, *back]) == [first, *back] and len({first, *back}) == 4
    assert {b[:10] for b in back} == {first[:10]}
    assert gen.new(1_760_000_000.501)[:10] == _chars(1_760_000_000_501, 10)     # and go on once the clock does


def _from_chars(text):
    value = 0
    for c in text:
        value = value * 32 + ALPHABET.index(c)
    return value


def test_parse_shortcuts_keep_their_meaning():
    """A blank file of any ASCII whitespace is empty; JSON is found after leading whitespace of
    any kind; a lone CR stays in a body, CRLF becomes LF; the body's size is counted in bytes."""
    for blank in (b" ", b"\n\r\t\x0b\x0c ", b"\x0c"):
        with pytest.raises(MessageRefused, match="the file is empty"):
            message.parse(blank, "m", 100)
    for lead in ("", " ", "\n\t"):
        m = message.parse((lead + '{"to": "Bob", "body": "x"}').encode(), "m", 100)
        assert (m.format, m.to, m.body) == ("json", ("Bob",), "x"), repr(lead)
    with pytest.raises(MessageRefused, match="invalid JSON"):       # read as JSON, which has no em space
        message.parse('\u2003{"to": "Bob"}'.encode(), "m", 100)
    m = message.parse("\u2003TO: Bob\n\nx".encode(), "m", 100)    # no brace: a header file (its key has a space)
    assert m.format == "header" and m.to == ("Bob",)
    assert message.parse(b"TO: Bob\n\na\rb\r\nc\r\n", "m", 100).body == "a\rb\nc\n"
    assert message.parse(b"TO: Bob\n\nno carriage return", "m", 100).body == "no carriage return"
    body = "\u00e9" * 50                                      # 50 characters, 100 bytes
    assert message.parse(f"TO: Bob\n\n{body}".encode(), "m", 100).body == body
    with pytest.raises(TooLarge) as e:
        message.parse(f"TO: Bob\n\n{body}x".encode(), "m", 100)
    assert (e.value.limit, e.value.observed) == (100, 101)
    assert message.parse(b"TO: Bob\n\n" + b"a" * 100, "m", 100).body == "a" * 100
    with pytest.raises(TooLarge):
        message.parse(b"TO: Bob\n\n" + b"a" * 101, "m", 100)


def test_names_split_alike_with_and_without_commas():
    for value, names in {"Bob": ("Bob",), "  Bob  ": ("Bob",), "": None, "   ": None, "Bob, Carol": ("Bob", "Carol"),
                         " , Bob,,Carol , ": ("Bob", "Carol")}.items():
        if names is None:
            with pytest.raises(MessageRefused, match="no recipient"):
                message.parse(f"TO: {value}\n\nx".encode(), "m", 100)
            with pytest.raises(MessageRefused, match="no recipient"):
                message.parse(orjson.dumps({"to": value, "body": "x"}), "m", 100)
        else:
            assert message.parse(f"TO: {value}\n\nx".encode(), "m", 100).to == names
            assert message.parse(orjson.dumps({"to": value, "body": "x"}), "m", 100).to == names


def test_path_split_fast_path_refuses_what_the_checks_refuse():
    for rel in ("a", "archive/2026-01-01/Bob/X--m.md", "a/.b/c..", "...", "a/ b", "spool/Bob/\udcff"):
        assert fs.split(rel) == rel.split("/"), rel
    for rel in ("", "/a", "a/", "a//b", ".", "..", "a/./b", "a/../b", "../a", "a/..", "a\0b", "a/\0", "/"):
        with pytest.raises(fs.Unsafe, match="is not a path inside the state directory"):
            fs.split(rel)
    assert fs.split(("a", "b")) == ["a", "b"]
    with pytest.raises(fs.Unsafe):
        fs.split(("a", "b/c"))


def test_the_directory_cache_stays_bounded_and_a_rename_keeps_both_its_directories(tmp_path):
    """The cache of directory descriptors is trimmed before an operation, never between the two
    paths of a rename (which would close the first path's directory under it)."""
    state = fs.StateDir(tmp_path)
    try:
        for i in range(fs.MAX_CACHED + 40):
            state.makedirs(f"d/{i}")
        assert len(state._dirs) <= fs.MAX_CACHED + 1
        for n in range(fs.MAX_CACHED - 2, fs.MAX_CACHED + 3):    # the cache just under, at and over its bound
            os.close(state.create(f"d/{n}/m"))
            state.forget()
            for i in range(n):
                state.dir(f"d/{i}")
            state.rename(f"d/{n}/m", f"d/{n + 1}/m")      # both directories new to the cache
            state.link(f"d/{n + 1}/m", f"d/{n + 2}/m")
            assert state.lstat(f"d/{n + 2}/m").st_nlink == 2 and not state.exists(f"d/{n}/m")
            state.unlink(f"d/{n + 1}/m")
            state.unlink(f"d/{n + 2}/m")
            assert len(state._dirs) <= fs.MAX_CACHED + 3
    finally:
        state.close()


def test_recipients_are_each_named_once_whatever_the_shortcut():
    known = {"Ann", "Bob", "Cy"}
    for to, want in {"Bob": ["Bob"], "*, Bob": ["Bob", "Cy"], "Bob, *": ["Bob", "Cy"], "Bob, Broadcast, *": ["Bob", "Cy"],
                     "Cy, Bob, Cy": ["Cy", "Bob"], "System": ["System"]}.items():
        m = message.parse(f"TO: {to}\n\nx".encode(), "m", 100)
        assert message.resolve(m, "Ann", known) == (want, []), to
    m = message.parse(b"TO: Zed\n\nx", "m", 100)
    assert message.resolve(m, "Ann", known, create_unknown=True) == (["Zed"], ["Zed"])
    m = message.parse(b"TO: Zed, *\n\nx", "m", 100)
    assert message.resolve(m, "Ann", known, create_unknown=True) == (["Bob", "Cy", "Zed"], ["Zed"])


def test_control_fields_found_whether_or_not_a_file_has_any():
    assert message.parse(b"TO: Bob\nSUBJECT: s\n\nx", "m", 100).control == {}
    assert message.parse(b'{"to": "Bob", "cwd": null, "model": null}', "m", 100).control == {}
    m = message.parse(b"KIND: spawn\nNAME: Zed\nCLI: claude\nX-Other: 1\n\nx", "m", 100)
    assert m.control == {"name": "Zed", "cli": "claude"} and m.to == ("System",) and m.headers == {"X-Other": "1"}
    assert message.parse(b'{"to": "Bob", "model": "m1", "cwd": null}', "m", 100).control == {"model": "m1"}


def test_envelope_bytes_are_as_before():
    """An envelope's keys in their order, priority and ack_required after content_type, control
    fields last, times from iso()."""
    m = message.parse(b"TO: Bob\nSUBJECT: hi\nX-Prio: high\n\nhello\n", "m1", 100)
    got = message.envelope("01KAAAAAAAAAAAAAAAAAAAAAAA", "Ann", ["Bob"], m, 1_700_000_000.25, 1_700_000_001.0000004,
                           "m1", "ab" * 32)
    assert got == (b'{"id":"01KAAAAAAAAAAAAAAAAAAAAAAA","from":"Ann","to":["Bob"],"kind":"message","thread":null,'
                   b'"subject":"hi","body":"hello\\n","headers":{"X-Prio":"high"},'
                   b'"sent_at":"2023-11-14T22:13:20.250000Z","relayed_at":"2023-11-14T22:13:21.000000Z",'
                   b'"source":"m1","sha256":"' + b"ab" * 32 + b'","content_type":"text/plain",'
                   b'"priority":"normal","ack_required":false}')
    u = message.parse(b"TO: Bob\nPRIORITY: URGENT\nACK: required\n\nnow\n", "m2", 100)
    got = message.envelope("01KAAAAAAAAAAAAAAAAAAAAAAC", "Ann", ["Bob"], u, 0.0, 0.5, "m2", "ef" * 32)
    assert got.endswith(b'"headers":{},"sent_at":"1970-01-01T00:00:00.000000Z",'
                        b'"relayed_at":"1970-01-01T00:00:00.500000Z","source":"m2","sha256":"' + b"ef" * 32
                        + b'","content_type":"text/plain","priority":"urgent","ack_required":true}')
    c = message.parse(b'{"kind": "spawn", "name": "Zed", "cli": "claude", "body": "go"}', "spawn.json", 100)
    got = message.envelope("01KAAAAAAAAAAAAAAAAAAAAAAB", "Ann", ["System"], c, 0.0, 0.5, "spawn.json", "cd" * 32)
    assert got.endswith(b'"sent_at":"1970-01-01T00:00:00.000000Z","relayed_at":"1970-01-01T00:00:00.500000Z",'
                        b'"source":"spawn.json","sha256":"' + b"cd" * 32 + b'","content_type":"text/plain",'
                        b'"priority":"normal","ack_required":false,"name":"Zed","cli":"claude"}')


def test_the_agent_names_kept_between_changes_are_the_names_a_fresh_listing_gives(tmp_path):
    """Layout.agent_names keeps what outbox/ and inbox/ list while neither changed; every
    change (a directory made, removed, renamed, replaced by a link, even with the directory's
    times set back) is seen at the next call, however soon after the last listing it comes."""
    from relay.files.layout import RACY, Layout
    state = tmp_path / ".relay"
    for d in ("outbox", "inbox"):
        (state / d).mkdir(parents=True)
    layout = Layout(tmp_path, state).create()
    later = [0.0]
    layout.now = lambda: time.time() + later[0]

    def fresh():
        return Layout(tmp_path, state).agent_names(["Cfg"])

    def settle():       # the directories' last change out of the racy window: the listing is kept
        later[0] += 2 * RACY

    steps = [lambda: (state / "outbox" / "Ann").mkdir(),
             lambda: (state / "inbox" / "Bob").mkdir(),
             lambda: (state / "outbox" / "Ann").rename(state / "outbox" / "Ada"),
             lambda: (state / "outbox" / "Ada").rmdir(),
             lambda: (state / "outbox" / "Eve").symlink_to(state / "inbox" / "Bob"),
             lambda: (state / "outbox" / "Cy").mkdir()]
    for i, change in enumerate(steps):
        settle()
        assert layout.agent_names(["Cfg"]) == fresh()       # listed, and kept
        kept = layout._names
        assert kept is not None
        times = [os.stat(state / d) for d in ("outbox", "inbox")]
        change()
        if i % 2:           # the times set back as they were: the change time still moved
            for d, st in zip(("outbox", "inbox"), times, strict=True):
                os.utime(state / d, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert layout.agent_names(["Cfg"]) == fresh(), i
    assert layout.agent_names() == {"Bob", "Cy"} and "Eve" not in layout.agent_names()
    later[0] = 0.0
    (state / "outbox" / "Dee").mkdir()      # within the racy window: listed again each time
    assert "Dee" in layout.agent_names() and layout._names is None


def test_a_listing_is_kept_only_well_after_a_change_the_file_system_can_tell_apart():
    """Where a directory's times are whole seconds, two changes within a second look alike:
    a listing is kept only COARSE_RACY seconds after the last change, not RACY."""
    from relay.files.layout import COARSE_RACY, RACY, racy
    second = 1_000_000_000
    fine = (1, 2, 1_700_000_000_123_456_789, 1_700_000_000_223_456_789)
    assert racy(fine + fine) == RACY
    assert racy(fine + (1, 3, 1_700_000_000 * second, 1_700_000_001 * second)) == COARSE_RACY
    assert racy((1, 2, 1_700_000_000 * second, 1_700_000_000 * second) + fine) == COARSE_RACY
    # a time set back to a whole second by hand: the change time, which nobody sets, is fine
    assert racy((1, 2, 1_600_000_000 * second, 1_700_000_000_223_456_789) + fine) == RACY
    assert COARSE_RACY > 2 > RACY
