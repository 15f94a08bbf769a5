"""Cross-node latency and throughput of the federation: two `relay run` daemons (nodes n1 and n2)
and one redis-server (AOF, appendfsync everysec as the README sets it up; --appendfsync always
for the server's sync on every write), all on this machine over loopback.

    python benchmarks/federation.py latency --rate 100 --seconds 10     # rename on n1 -> envelope in new/ on n2
    python benchmarks/federation.py throughput --messages 5000          # sustained, durability full
    python benchmarks/federation.py throughput --backlog               # a backlog written before the daemons start
    (--local: the same with every recipient on n1, for comparison)

latency: messages offered at a steady rate from 8 agents of n1 to 8 agents of n2; the time from
each rename into an outbox on n1 to its envelope appearing in new/ on n2 (seen by inotify).
throughput: a producer writes the messages as fast as it can into n1's outboxes while both
daemons run; messages per second from the first rename to the last envelope in new/ on n2.
Prints one JSON line (with the machine's load average, since the machine may be shared, and for
latency the share of CPU time the hypervisor stole during the run: a virtual machine whose host
is busy shows it there, and its figures are those of a slower machine).
"""
import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from relay.bench import bench

_spec = importlib.util.spec_from_file_location("fedkit", Path(__file__).parent / "fedkit.py")
fedkit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fedkit)

APPENDFSYNC = "everysec"
SENDERS = [f"S{i}" for i in range(8)]
RECEIVERS = [f"R{i}" for i in range(8)]


class Pair:
    """Redis and the two nodes, started; stop() ends them all. `before(s1)` runs before n1's
    daemon starts (once n2's has and the directory is known)."""

    def __init__(self, base, durability, before=None):
        self.base = Path(tempfile.mkdtemp(prefix="relay-fed-", dir=base))
        self.server = fedkit.RedisServer(self.base / "redis", appendfsync=APPENDFSYNC).start()
        # Each sender writes to one receiver: 5,000 messages are 625 per pair, past flow control's
        # default pair_rate (600 per 10 minutes), whose sheds never arrive. What is measured here is
        # the way across, not flow control: its limits are off.
        limits = "pair_rate = 0\nqueue_limit = 0"
        self.s1 = fedkit.write_config(self.base / "n1", self.server.url, "bench", "n1", SENDERS, limits)
        self.s2 = fedkit.write_config(self.base / "n2", self.server.url, "bench", "n2", RECEIVERS, limits)
        env = {"RELAY_LOG_LEVEL": "WARNING", "RELAY_DURABILITY": durability}
        self.procs = []
        if before is not None:      # the directory first (run --once), then the backlog, then the daemons
            for n in ("n2", "n1"):
                subprocess.run([sys.executable, "-m", "relay", "--root", str(self.base / n), "run", "--once", "-q"],
                               check=True, capture_output=True, env=dict(os.environ, RELAY_LOG_LEVEL="ERROR"))
            before(self.s1)
        self.started = time.time()
        self.procs = [fedkit.start_daemon(self.base / n, self.base, env) for n in ("n1", "n2")]
        deadline = time.monotonic() + 30
        while not self.ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the nodes did not see each other: logs in {self.base}")
            time.sleep(0.05)

    def ready(self):
        """Each node knows the other's agents (a message from each way has gone through)."""
        import sqlite3
        for state, other in ((self.s1, RECEIVERS[0]), (self.s2, SENDERS[0])):
            try:
                db = sqlite3.connect(f"file:{state / 'ledger.sqlite'}?mode=ro", uri=True)
                try:
                    if not db.execute("SELECT 1 FROM remote_agents WHERE name = ?", (other,)).fetchone():
                        return False
                finally:
                    db.close()
            except sqlite3.Error:
                return False
        return True

    def cpu(self):
        """CPU seconds used so far by n1's daemon, n2's daemon and the server."""
        out = []
        for pid in [p.pid for p in self.procs] + [self.server.proc.pid]:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out.append(round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2))
        return out

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(timeout=60)
        self.server.stop()
        shutil.rmtree(self.base, ignore_errors=True)


def arrived(state, agents=RECEIVERS):
    return sum(len(os.listdir(state / "inbox" / r / "new")) for r in agents)


def latency(base, rate, seconds, durability="full"):

    pair = Pair(base, durability)
    ticks = fedkit.cpu_ticks()
    try:
        count = int(rate * seconds)
        lat = bench.offer(count, rate, lambda i: (pair.s1 / "outbox" / SENDERS[i % 8], RECEIVERS[(i * 3) % 8]),
                          [pair.s2 / "inbox" / r / "new" for r in RECEIVERS], 60)
    finally:
        stolen = fedkit.stolen_percent(ticks, fedkit.cpu_ticks())
        pair.stop()
    lat.sort()
    if not lat:
        raise RuntimeError("no envelope was seen on n2")

    def pct(p):
        return round(lat[min(len(lat) - 1, int(len(lat) * p))], 2)
    return {"what": "cross-node latency", "rate": rate, "messages": count, "delivered": len(lat), "p50_ms": pct(0.5),
            "p90_ms": pct(0.9), "p99_ms": pct(0.99), "max_ms": round(lat[-1], 2), "durability": durability,
            "loadavg_before": LOAD, "cpu_stolen_percent": stolen}


def produce(state, messages, to):
    for i in range(messages):
        box = state / "outbox" / SENDERS[i % 8]
        tmp = box / f".m{i}.tmp"
        tmp.write_text(f"TO: {to[(i * 3 + 1) % 8]}\n\ntoken {i}")
        os.rename(tmp, box / f"m{i}")


def throughput(base, messages, durability="full", local=False, backlog=False):
    """`local`: the same run with every recipient on n1 (the single-machine figure, side by side).
    `backlog`: the messages are written before n1's daemon starts (what the pipeline can carry
    with no producer beside it), the clock starts with the daemons."""
    to = SENDERS if local else RECEIVERS
    pair = Pair(base, durability, before=(lambda s1: produce(s1, messages, to)) if backlog else None)
    where = pair.s1 if local else pair.s2
    try:
        t0 = pair.started if backlog else time.time()
        if not backlog:
            produce(pair.s1, messages, to)
        written = time.time() - t0
        deadline = time.time() + 300
        n = 0
        while time.time() < deadline:
            n = arrived(where, to)
            if n >= messages:
                break
            time.sleep(0.01)
        took = time.time() - t0
        cpu = pair.cpu()
    finally:
        pair.stop()
    what = ("local" if local else "cross-node") + (" throughput of a backlog" if backlog else " throughput")
    return {"what": what, "messages": messages, "arrived": n, "seconds": round(took, 2),
            "msg_per_s": round(n / took, 1), "producer_seconds": None if backlog else round(written, 2),
            "durability": durability,
            "cpu_s_n1_n2_redis": cpu, "loadavg_before": LOAD}


LOAD = None


def main():
    global LOAD
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["latency", "throughput"])
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--messages", type=int, default=5000)
    ap.add_argument("--durability", choices=["full", "normal"], default="full")
    ap.add_argument("--local", action="store_true", help="throughput with every recipient on n1, for comparison")
    ap.add_argument("--backlog", action="store_true", help="throughput of messages written before the daemons start")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--appendfsync", choices=["everysec", "always"], default="everysec")
    args = ap.parse_args()
    global APPENDFSYNC
    APPENDFSYNC = args.appendfsync
    if fedkit.REDIS_SERVER is None:
        print(fedkit.MISSING, file=sys.stderr)
        sys.exit(2)
    LOAD = [round(x, 2) for x in os.getloadavg()]
    if args.what == "latency":
        print(json.dumps({**latency(args.dir, args.rate, args.seconds, args.durability), "appendfsync": APPENDFSYNC}))
    else:
        print(json.dumps({**throughput(args.dir, args.messages, args.durability, args.local, args.backlog),
                          "appendfsync": APPENDFSYNC}))


if __name__ == "__main__":
    main()
