"""The per-message hot paths give the same text as their plain forms: a timestamp, an id, a
parsed message, the verdict on a stored row. Each fast path is checked against a reference
written the obvious way, over many inputs and the edges where a shortcut would go wrong."""
import datetime
import random

from relay import message

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


def test_iso_cache_stays_small():
    for s in range(10 * message.MAX_ISO_SECONDS):
        message.iso(1_600_000_000 + s + 0.5)
    assert len(message._iso_seconds) <= message.MAX_ISO_SECONDS
    assert message.iso(1_600_000_000.5) == _datetime_iso(1_600_000_000.5)
