"""A short randomized soak: the daemon killed with SIGKILL at random instants while producers
write (by rename and in place, reusing `msg`, some to `*`); each message arrives exactly once."""
import importlib.util
from pathlib import Path

import pytest

# chaos.run waits up to 120 s for the relay to settle, then reports what is lost or left over.
pytestmark = [pytest.mark.soak, pytest.mark.timeout_s(180)]

spec = importlib.util.spec_from_file_location("chaos", Path(__file__).parent.parent / "benchmarks" / "chaos.py")
chaos = importlib.util.module_from_spec(spec)
spec.loader.exec_module(chaos)


def test_short_soak_under_sigkill():
    result = chaos.run(cycles=8, messages=200, seed=7, echo=lambda *_: None)
    assert result["kills"] >= 8 and result["deliveries"] >= 200     # every message was written
    assert (result["lost"], result["duplicated"], result["unexpected"], result["left"]) == (0, 0, 0, 0), result


@pytest.mark.timeout_s(150)
def test_short_hostile_soak():
    """benchmarks/hostile.py for a few seconds: links at every level, hard links, odd names,
    future times, held-open files and swapped directories, reserved names in every case, files of
    kind bounce, mail to an archived agent, searches and reservations at and past their bounds,
    while producers send; nothing outside the state directory changes and every well-formed
    message arrives exactly once."""
    import subprocess
    import sys
    script = Path(__file__).parent.parent / "benchmarks" / "hostile.py"
    r = subprocess.run([sys.executable, str(script), "--seconds", "5", "--seed", "3", "--settle", "60"],
                       capture_output=True, text=True, timeout=140)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert '"lost": 0, "duplicated": 0' in r.stdout and "0 differences" in r.stdout
    for planted in ("reserved-outbox", "bounce-kind", "archived-recipient"):
        assert f" {planted}=" in r.stdout, planted         # the new kinds were planted, and held
    assert '"reserved_delivered": 0, "bounce_kind_delivered": 0, "archived_got_mail": 0' in r.stdout


@pytest.mark.timeout_s(240)
def test_sustained_load_benchmark_at_a_tiny_size(tmp_path):
    """relay/sustained.py (benchmarks/sustained.py, `relay bench --sustained`) end to end at a
    tiny size: the daemon as a process, producer processes at a fixed rate, at full speed open
    and capped, many outboxes, then run --once and the naive loop. Every message of the
    fixed-rate runs is seen arriving and matched to its rename; every figure is there. No
    figure is judged: this proves the benchmark works, not how fast relay is."""
    from relay.bench import sustained
    lines = []
    out = sustained.run(tmp_path, agents=3, rates=(50,), seconds=0.5, full_seconds=0.5, cap=5, many_agents=30,
                        many_rate=50, idle_seconds=0.2, echo=lines.append)
    rows = {r["scenario"]: r for r in out["rows"]}
    assert list(rows) == ["rate 50", "full, cap 5/agent", "30 outboxes, rate 50", "full, open loop"]
    for label in ("rate 50", "30 outboxes, rate 50"):
        r = rows[label]
        assert abs(r["written"] - 25) <= 1 and r["delivered"] == r["written"], r
        assert 0 < r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"] <= r["max_ms"], r
        assert r["daemon_cpu_s_per_1000"] > 0 and r["inotify_overflows"] == 0, r
    for r in rows.values():
        assert r["daemon_exit"] == 0 and r["peak_rss_mb"] > 0 and r["written"] > 0, r
        assert r["delivered"] <= r["written"] and len(r["load_avg"]) == 3, r
    assert rows["30 outboxes, rate 50"]["producers"] == 20 and rows["rate 50"]["producers"] == 3
    assert rows["full, cap 5/agent"]["producers_held_percent"] is not None
    assert out["fs"] != "unknown" and out["idle_cpu_percent"] is not None
    # the backlog is as large as the most the full-speed runs delivered, and 1,000 at least
    full = max(r["delivered"] for label, r in rows.items() if label.startswith("full"))
    assert out["backlog"] == max(1000, full) and out["once"]["per_s"] > 0 and out["naive_durable"]["cpu_s_per_1000"] > 0
    assert any(line.startswith("scenario") and "p99 ms" in line for line in lines)
    assert not list(tmp_path.iterdir()), "the benchmark left files behind"


def test_the_wake_benchmark_at_a_tiny_size(tmp_path):
    """benchmarks/wake.py end to end, for a second at 10 msg/s: the daemon as a process, the
    hook, an SDK client subscribed to relay mcp, a private tmux server when there is one. Every
    message is seen by each way of telling, and every figure is there; none is judged: this
    proves the benchmark works, not how fast relay is."""
    import shutil
    spec = importlib.util.spec_from_file_location("wake", Path(__file__).parent.parent / "benchmarks" / "wake.py")
    wake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wake)
    out = wake.run(rate=10, seconds=1, where=tmp_path)
    assert out["sent"] == 20 and "errors" not in out, out
    keys = ["delivered", "mcp_updated", "mcp_channel", "hook"] + (["tmux"] if shutil.which("tmux") else [])
    for key in keys:
        r = out[key]
        assert r["n"] == 10 and r["missed"] == 0 and 0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"], (key, r)
    if shutil.which("tmux"):
        assert out["tmux"]["in_pane"] is True
    else:
        assert out["tmux"].startswith("skipped: ")
    assert not list(tmp_path.iterdir()), "the benchmark left files behind"
