"""The benchmarks put finished runs aside instead of deleting them between runs (see bench.discard);
the latency run's floor in turns, its envelopes counted once, a daemon that dies."""
import json
import os
import signal
import socket
import threading

import pytest

from relay.bench import bench
from relay.errors import BenchError


def test_a_discarded_run_waits_in_the_trash_until_the_end(tmp_path):
    run = tmp_path / "relay-full-abc"
    (run / ".relay" / "inbox").mkdir(parents=True)
    (run / ".relay" / "inbox" / "m.json").write_text("{}")
    bench.discard(run)
    assert not run.exists()
    kept = tmp_path / bench.TRASH / "relay-full-abc" / ".relay" / "inbox" / "m.json"
    assert kept.read_text() == "{}"        # not deleted: no inode freed during the benchmark
    bench.empty_trash(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_create_probe_measures_and_leaves_only_trash(tmp_path):
    us = bench.create_cost_us(tmp_path, n=50)
    assert us >= 0
    assert [p.name for p in tmp_path.iterdir()] == [bench.TRASH]
    (made,) = (tmp_path / bench.TRASH).iterdir()
    assert len(list(made.iterdir())) == 50
    assert "slow" in bench.create_cost_note(bench.SLOW_CREATE_US + 1)
    assert "slow" not in bench.create_cost_note(bench.SLOW_CREATE_US)


def test_a_trash_name_that_is_a_link_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    base = tmp_path / "base"
    base.mkdir()
    (base / bench.TRASH).symlink_to(elsewhere)
    run = base / "relay-full-abc"
    (run / "x").mkdir(parents=True)
    bench.discard(run)
    assert not run.exists() and list(elsewhere.iterdir()) == []     # deleted where it was, not moved away


def test_the_floor_probe_does_each_step_of_a_delivery_and_leaves_only_trash(tmp_path):
    got = bench.floor(tmp_path, n=20, rate=10_000)
    assert 0 < got["p50_ms"] <= got["p99_ms"]
    assert [p.name for p in tmp_path.iterdir()] == [bench.TRASH]
    (made,) = (tmp_path / bench.TRASH).iterdir()
    assert sorted(p.name for p in (made / "new").iterdir()) == sorted(f"{i}.json" for i in range(20))
    assert len(list((made / "archive").iterdir())) == 20 and list((made / "out").iterdir()) == []
    import sqlite3
    db = sqlite3.connect(made / "ledger.sqlite")
    assert db.execute("SELECT count(*) FROM t").fetchone()[0] == 20      # one commit per delivery
    db.close()


def test_the_floor_and_the_daemons_latency_are_taken_in_turns(tmp_path, monkeypatch):
    """relay bench's latency: blocks of the floor's deliveries and of messages to the daemon in
    turns, every message seen once (names and tokens go on across blocks), each block's ratio
    its own p50 over the floor's block just before it, and only the trash left."""
    calls = []
    sample, offer = bench.Floor.sample, bench.offer

    def sampled(self, n, rate):
        calls.append(("floor", sample(self, n, rate)))
        return calls[-1][1]

    def offered(*a, **k):
        calls.append(("offer", offer(*a, **k)))
        return calls[-1][1]

    monkeypatch.setattr(bench.Floor, "sample", sampled)
    monkeypatch.setattr(bench, "offer", offered)
    got = bench.latency(tmp_path, rate=200.0, seconds=0.6, agents=3, floor_blocks=3)
    assert [kind for kind, _ in calls] == ["floor", "offer"] * 3
    assert got["block_ratios"] == [round(bench.percentile(calls[i + 1][1], 0.5) / bench.percentile(calls[i][1], 0.5), 2)
                                   for i in (0, 2, 4)]
    assert got["messages"] == got["delivered"] == 120
    assert len(got["block_ratios"]) == 3 and all(r > 0 for r in got["block_ratios"])
    assert 0 < got["floor"]["p50_ms"] <= got["floor"]["p99_ms"] and 0 < got["p50_ms"] <= got["p99_ms"]
    assert [p.name for p in tmp_path.iterdir()] == [bench.TRASH]
    floor_dir, project = sorted((tmp_path / bench.TRASH).iterdir(), key=lambda p: p.name)
    assert floor_dir.name.startswith("floor-") and len(list((floor_dir / "new").iterdir())) == 3 * 20
    names = [p.name for d in (project / ".relay" / "archive").rglob("agent*") if d.is_dir() for p in d.iterdir()]
    assert len(names) == 120 and len(set(n.split("--")[-1] for n in names)) == 120


def _fake_daemon(box, new, names, stray):
    """Once every message of `names` is in `box` (offer() is waiting by then), deliver an
    envelope of another run's message (`stray`), then each of them (its token in its body), the
    last only after a pause."""
    def link(name, token):
        tmp = new.parent / "tmp" / name
        tmp.write_text(json.dumps({"body": f"token {token}"}))
        os.link(tmp, new / name)

    def run():
        while not all((box / n).exists() for n in names):
            threading.Event().wait(0.01)
        link("stray.json", stray)
        for n in names:
            if n == names[-1]:
                threading.Event().wait(0.5)
            link(f"{n}.json", int(n[1:]))
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_an_offer_counts_its_own_envelopes_not_a_late_one_of_another_run(tmp_path):
    """offer() waits for its own messages: an envelope of another block's message seen meanwhile
    is not one of them (else the wait ends before the last of its own, which is then lost)."""
    box, new = tmp_path / "out", tmp_path / "new"
    for d in (box, new, tmp_path / "tmp"):
        d.mkdir()
    thread = _fake_daemon(box, new, ["m10", "m11", "m12"], stray=3)
    got = bench.offer(3, 1000.0, lambda i: (box, "b"), [new], 10, start=10)
    thread.join(10)
    assert len(got) == 3 and all(t >= 0 for t in got)


def _kill_children():
    for pid in [int(p) for t in os.listdir("/proc/self/task") for p in open(f"/proc/self/task/{t}/children").read().split()]:
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("when", ["in the second block", "after the last block"])
def test_a_daemon_that_dies_during_the_latency_run_is_reported_at_once(tmp_path, monkeypatch, when):
    """The daemon under test killed in the second block (or after the last, before its idle
    CPU is read): the run ends there with an error that says so (its exit, how many messages
    arrived), not after the block's patience (an hour here: the test's time limit would end it
    first), and leaves only the trash."""
    blocks, offer = [], bench.offer

    def offered(count, rate, route, inboxes, patience, **k):
        blocks.append(1)
        if when == "in the second block" and len(blocks) == 2:
            _kill_children()
        got = offer(count, rate, route, inboxes, 3600, **k)
        if when == "after the last block" and len(blocks) == 3:
            _kill_children()
        return got

    monkeypatch.setattr(bench, "offer", offered)
    with pytest.raises(BenchError, match=r"exited \(-9\) during the latency run, after \d+ of 60 messages"):
        bench.latency(tmp_path, rate=100.0, seconds=0.6, agents=3, floor_blocks=3)
    assert len(blocks) == (2 if when == "in the second block" else 3)
    assert [p.name for p in tmp_path.iterdir()] == [bench.TRASH]


def test_a_daemon_that_cannot_start_is_reported_with_what_it_said(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAY_PAIR_RATE", "bogus")
    with pytest.raises(BenchError, match=r"exited \(1\) during the latency run, after 0 of 20 messages: .*pair_rate"):
        bench.latency(tmp_path, rate=100.0, seconds=0.2, agents=3, floor_blocks=2)
    assert [p.name for p in tmp_path.iterdir()] == [bench.TRASH]


def test_the_daemons_peak_rss_is_its_own_and_no_floor_block_goes_without_a_message(tmp_path, monkeypatch):
    """The RSS printed is the daemon's (not this process's, which a child's ru_maxrss starts
    from at the fork); five floor blocks asked for and three messages offered: three blocks."""
    calls = []
    sample = bench.Floor.sample
    monkeypatch.setattr(bench.Floor, "sample", lambda self, n, rate: calls.append(n) or sample(self, n, rate))
    ballast = bytearray(300 << 20)
    ballast[::4096] = b"x" * len(ballast[::4096])       # resident, not only reserved
    got = bench.latency(tmp_path, rate=10.0, seconds=0.3, agents=3, floor_blocks=5)
    assert 0 < got["daemon_peak_rss_mb"] < 200
    assert got["delivered"] == 3 and len(got["block_ratios"]) == len(calls) == 3
    del ballast


def test_relay_bench_refuses_a_rate_and_length_that_offer_no_message_before_any_work(tmp_path, cli):
    r = cli("bench", "--rate", "1", "--seconds", "0.5", "--dir", str(tmp_path), ok=False)
    assert r.exit_code == 2 and "offers no message" in r.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("rate, seconds", [(1.0, 0.5), (-10.0, -1.0), (float("nan"), 1.0), (float("inf"), 1.0)])
def test_a_latency_run_that_offers_no_message_is_refused(tmp_path, rate, seconds):
    with pytest.raises(BenchError, match="offers no message"):
        bench.latency(tmp_path, rate=rate, seconds=seconds)
    assert list(tmp_path.iterdir()) == []


def _dgram_queue():
    """How many datagrams a Unix socket's queue holds here (net.unix.max_dgram_qlen)."""
    try:
        with open("/proc/sys/net/unix/max_dgram_qlen") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 10


def test_the_daemon_never_waits_on_a_supervisor_that_stopped_reading(monkeypatch):
    """NOTIFY_SOCKET whose reader reads nothing: its queue fills, and notify() says the line
    was not sent after NOTIFY_WAIT instead of waiting on (the daemon's loop stopped there, a
    minute into a bench)."""
    from relay import service
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"relay-test-{os.getpid()}-{os.urandom(4).hex()}"
    sock.bind("\0" + name)
    monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    try:
        sent = [service.notify(f"STATUS=line {i}") for i in range(_dgram_queue() + 5)]
    finally:
        sock.close()
    assert sent[0] is True and sent[-1] is False
