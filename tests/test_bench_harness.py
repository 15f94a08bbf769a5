"""The sustained-load harness under attack: producers that die or are orphaned, --keep."""
import os
import select
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from relay.bench import sustained

REPO = Path(__file__).parent.parent

# A daemon that says READY=1 and makes the inboxes but no outbox: every producer fails its first write.
NO_OUTBOXES = textwrap.dedent("""
    import os, signal, socket
    root = os.environ["RELAY_ROOT"]
    for a in os.environ["RELAY_AGENTS"].split(","):
        for sub in ("tmp", "new", "cur"):
            os.makedirs(f"{root}/.relay/inbox/{a}/{sub}", exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.sendto(b"READY=1", "\\0" + os.environ["NOTIFY_SOCKET"][1:])
    signal.pause()
""")


@pytest.mark.timeout_s(20)
def test_a_producer_that_dies_is_reported_at_once_not_after_the_barriers_timeout(tmp_path):
    fake = tmp_path / "fake_daemon.py"
    fake.write_text(NO_OUTBOXES)
    with pytest.raises(RuntimeError, match=r"producer-0 .*exit 1"):
        sustained.scenario(tmp_path, "rate 20", agents=1, rate=20.0, seconds=0.2,
                           cmd=[sys.executable, str(fake)])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("sustained-")] == []


# A measuring process that starts one producer, lets it write its figures, then dies (kill -9
# as it were) without releasing it: the producer must not wait for ever.
ORPHAN = textwrap.dedent("""
    import multiprocessing, os, sys, time
    from relay.bench.loadgen import produce
    if __name__ == "__main__":
        base = sys.argv[1]
        os.makedirs(f"{base}/outbox/a", exist_ok=True)
        ctx = multiprocessing.get_context("spawn")
        ready, go, start = ctx.Barrier(2), ctx.Event(), ctx.Value("d", 0.0)
        done, release = ctx.Semaphore(0), ctx.Event()
        p = ctx.Process(target=produce, daemon=True, args=(0, [(f"{base}/outbox/a", "b")], 50.0, 0.0, 0.1, None,
                        b"x", f"{base}/figures", ready, go, start, done, release))
        p.start()
        ready.wait(30)
        start.value = time.time()
        go.set()
        assert done.acquire(timeout=30)
        print(p.pid, flush=True)
        os._exit(0)
""")


@pytest.mark.timeout_s(20)
def test_a_producer_whose_measuring_process_died_exits(tmp_path):
    script = tmp_path / "orphan.py"
    script.write_text(ORPHAN)
    r = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=15,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "figures").exists()
    pid = int(r.stdout.split()[0])
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return                                  # already gone
    try:
        assert select.select([fd], [], [], 10)[0], f"producer {pid} still waits for a release that cannot come"
    finally:
        os.close(fd)


@pytest.mark.timeout_s(30)
def test_sustained_keep_leaves_the_projects(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "sustained.py"), "--agents", "2", "--rates", "50",
                        "--seconds", "0.3", "--full-seconds", "0", "--many-agents", "0", "--no-once",
                        "--idle-seconds", "0", "--settle-timeout", "0", "--keep", "--dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=25, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    where = Path(r.stdout.strip().splitlines()[-1].split(" in ", 1)[1])
    logs = list(where.rglob("daemon.log"))
    assert len(logs) == 1 and (logs[0].parent / ".relay" / "ledger.sqlite").exists(), sorted(tmp_path.rglob("*"))


@pytest.mark.timeout_s(40)
def test_profile_daemon_leaves_nothing_in_its_dir(tmp_path):
    """benchmarks/profile_daemon.py daemon put its project into <dir>/.relay-bench-done, which
    nothing ever emptied (with --dir's default, the system temporary directory)."""
    where = tmp_path / "dir"
    where.mkdir()
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "profile_daemon.py"), "daemon", "--scenario", "rate 40",
                        "--agents", "2", "--seconds", "0.3", "--settle-timeout", "0", "--out", str(tmp_path / "out"),
                        "--dir", str(where)], capture_output=True, text=True, timeout=35,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr[-3000:]
    assert '"delivered": 12' in r.stdout, r.stdout
    assert list(where.iterdir()) == [], "the benchmark left files behind"
