"""Flow control counts messages by when they were written, not when relay delivered them: the
backlog agents wrote while relay was stopped is delivered, a loop is still shed."""
import os

import pytest


def written(project, sender, name, text, at):
    path = project.drop(sender, name, text)
    os.utime(path, (at, at))
    return path


def outcome(relay):
    """(archived, failed) of the agents' messages (bounces to their senders aside: test_bounces.py)."""
    rows = [r for r in relay.history.audit() if r["sender"] != "System"]
    return sum(r["status"] == "archived" for r in rows), sum(r["status"] == "failed" for r in rows)


def test_a_backlog_written_while_relay_was_stopped_is_delivered_not_shed(project, clock):
    """Relay was stopped for 8 minutes while Ann wrote to Ben every 15 s (4 a minute, under
    pair_rate = 5 per minute): everything past 5 was shed in the burst that followed its start."""
    start = clock.now - 480
    for i in range(32):
        written(project, "Ann", f"m{i:02d}", f"TO: Ben\n\nm{i}", start + 15 * i)
    relay = project.relay(pair_rate=5, pair_window="60s")
    assert relay.drain().shed == 0
    assert outcome(relay) == (32, 0) and len(project.inbox("Ben")) == 32


def test_files_written_at_a_loops_rate_are_still_shed_in_a_backlog(project, clock):
    start = clock.now - 480
    for i in range(32):
        written(project, "Ann", f"m{i:02d}", f"TO: Ben\n\nm{i}", start + 0.5 * i)      # 2 a second
    relay = project.relay(pair_rate=5, pair_window="60s")
    relay.drain()
    assert outcome(relay) == (5, 27)
    assert [e["body"] for e in sorted(project.inbox("Ben"), key=lambda e: e["sent_at"])] == [
        f"m{i}" for i in range(5)]                  # the first written are the ones delivered


def test_a_backlog_counts_with_what_was_delivered_before_relay_stopped(project, clock):
    relay = project.relay(pair_rate=5, pair_window="60s")
    for i in range(3):
        written(project, "Ann", f"a{i}", f"TO: Ben\n\na{i}", clock.now - 5 + i)
    relay.drain()
    relay.close()
    project.relays.remove(relay)
    clock.advance(30)                                   # stopped for 30 s; Ann wrote 4 more
    for i in range(4):
        written(project, "Ann", f"b{i}", f"TO: Ben\n\nb{i}", clock.now - 20 + i)
    again = project.relay(pair_rate=5, pair_window="60s")
    again.drain()
    assert outcome(again) == (5, 2)                     # 3 + 2 in one minute of writing


@pytest.mark.parametrize("ahead", [3600, 10 ** 9])
def test_a_file_dated_in_the_future_counts_as_written_now(project, clock, ahead):
    relay = project.relay(pair_rate=5, pair_window="60s")
    for i in range(8):
        written(project, "Ann", f"f{i}", f"TO: Ben\n\nf{i}", clock.now + ahead + 600 * i)
    relay.drain(wait=clock.advance, now_fn=clock)       # settled by relay's clock
    assert outcome(relay) == (5, 3)
    clock.advance(61)                                   # a window later they count no more
    written(project, "Ann", "later", "TO: Ben\n\nlater", clock.now - 1)
    relay.drain()
    assert outcome(relay) == (6, 3)
