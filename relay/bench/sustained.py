"""Sustained load on a running daemon: producer processes write while `relay run` delivers.

The daemon runs as a process of its own (`python -m relay run`, or any command that serves the
same way, such as benchmarks/profile_daemon.py) on a fresh project in a temporary directory under
`base`, so on the file system under test. Producer processes (multiprocessing, spawn: never
threads of the measuring process) write messages the way agents do: a dot-temporary file written
and closed, then renamed into the outbox under a name no other message uses. Either at a fixed
offered total rate, spread evenly over the producers, or as fast as they can for a fixed time;
"as fast as they can" with a cap holds a producer whose outbox has `cap` files waiting until
the daemon has taken half (a closed loop: the daemon is never short of work, and the producers
do not take the CPU to write what cannot be delivered within the run). The producers and the
thread that sees envelopes arrive are in loadgen.py; this module runs and measures.

Measured from outside the daemon:
- latency: from each rename (the producer's clock, read just before the call) to the link of
  the envelope into the recipient's new/, seen by inotify (IN_CREATE, IN_MOVED_TO) on every
  inbox new/ directory by a thread of the measuring process. The envelope's `relayed_at` is the
  time its step began, before the batch was read, written and synced, so it is reported only
  beside (as `relayed_at_lag_*`: how much earlier than the link it is). The envelope's ctime
  (set by the unlink of its tmp/ name right after the link, on the kernel's coarse clock) checks
  the inotify instants: `seen_after_ctime_*` is how long after it the measuring thread saw it;
- delivered msg/s, the daemon's CPU seconds per 1,000 messages (utime + stime from
  /proc/<pid>/stat, before and after), its peak RSS (VmHWM), its CPU while idle;
- the producers' own rate and CPU, to show they were not the bottleneck.
"""
import datetime
import marshal
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

from relay.bench import bench
from relay.bench.loadgen import Arrivals, produce
from relay.core.loop import quiet_gc
from relay.errors import BenchError

READY_TIMEOUT = 60.0


# -- the daemon, from outside -----------------------------------------------------------------

def cpu_seconds(pid):
    return bench._cpu(pid)


def system_seconds(pid):
    """The kernel's part of cpu_seconds."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[12]) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    return None


def fs_type(path):
    try:
        out = subprocess.run(["df", "--output=fstype,source", str(path)], capture_output=True,
                             text=True, timeout=10).stdout.split("\n")[1].split()
        return f"{out[0]} ({out[1]})"
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


class Daemon:
    """`relay run` (or `cmd`) on the project at `root`, started and waited for (READY=1)."""

    def __init__(self, root, agents, cmd=None, durability="full"):
        self.root = root
        sock_path = f"@relay-sustained-{os.getpid()}-{os.urandom(4).hex()}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind("\0" + sock_path[1:])
        sock.settimeout(1)
        # Each producer writes to one recipient, far past flow control's pair_rate (600 messages
        # per pair in 10 minutes): at full speed the run would measure that limit's shedding,
        # not delivery. The limit is off; queue_limit (unread per inbox) stays as configured.
        env = dict(os.environ, RELAY_ROOT=str(root), NOTIFY_SOCKET=sock_path, RELAY_AGENTS=",".join(agents),
                   RELAY_DURABILITY=durability, RELAY_LOG_LEVEL="WARNING", RELAY_PAIR_RATE="0")
        self.log = open(root / "daemon.log", "wb")
        self.proc = subprocess.Popen(cmd or [sys.executable, "-m", "relay", "run"], env=env, stderr=self.log)
        self.pid = self.proc.pid
        try:
            ready = bench.wait_ready(sock, lambda: self.proc.poll() is None, READY_TIMEOUT)
        except OSError:
            ready = None
        finally:
            sock.close()
        if not ready:
            self.stop()
            raise BenchError(f"the daemon {'did not say READY=1' if ready is None else 'exited'}: {self.tail()}")

    def tail(self):
        return (self.root / "daemon.log").read_bytes()[-2000:].decode(errors="replace")

    def stop(self, timeout=120):
        bench.stop(self.proc, timeout)
        self.log.close()
        return self.proc.returncode


# -- one run ------------------------------------------------------------------------------------

def _pct(values, q):
    return round(values[min(len(values) - 1, int(len(values) * q))], 2) if values else None


def _epoch(iso):
    return datetime.datetime.fromisoformat(iso).timestamp()


def _wait_for_figures(done, procs):
    """Until every producer has written its figures (each says so on `done`, then stays): a
    producer that died instead is reported at once, one that is still writing after
    READY_TIMEOUT once that is past."""
    deadline, finished = time.monotonic() + READY_TIMEOUT, 0
    while finished < len(procs):
        if done.acquire(timeout=0.05):
            finished += 1
            continue
        dead = [p for p in procs if p.exitcode is not None]
        if dead or time.monotonic() > deadline:
            raise BenchError("the producers did not all finish: " + ", ".join(
                f"{p.name} exit {p.exitcode}" for p in dead or procs) + "; see the tracebacks above")


def scenario(base, label, agents=20, producers=None, rate=None, seconds=5.0, cap=None, cmd=None,
             body_size=200, settle=60.0, idle_seconds=0.0, durability="full"):
    """One run on a fresh project: `agents` agents, `producers` producer processes (default one
    per agent, at most 20), at `rate` msg/s in total or as fast as they can (rate None) for
    `seconds`. Returns its figures (a dict)."""
    producers = producers or min(agents, 20)
    root = Path(tempfile.mkdtemp(dir=base, prefix="sustained-"))
    names = [f"a{i:04d}" for i in range(agents)]
    state = root / ".relay"
    daemon = arrivals = None
    procs = []
    try:
        daemon = Daemon(root, names, cmd, durability)
        out = {"scenario": label, "agents": agents, "producers": producers,
               "offered_per_s": rate, "seconds": seconds, "cap_per_agent": cap}
        if idle_seconds:
            out["idle_cpu_percent"] = _idle_cpu(daemon, idle_seconds)
        arrivals = Arrivals([state / "inbox" / n / "new" for n in names])
        files, (go, start, done, release) = _start_producers(procs, root, names, producers, rate, seconds, cap,
                                                             body_size)
        cpu0, sys0 = cpu_seconds(daemon.pid), system_seconds(daemon.pid)
        start.value = t0 = time.time() + 0.05
        go.set()
        time.sleep(max(0.0, t0 + seconds - time.time()))
        if rate is None:        # full speed: the window is the producing time
            cpu1, sys1, t1 = cpu_seconds(daemon.pid), system_seconds(daemon.pid), time.time()
        _wait_for_figures(done, procs)
        sent, written, producer_cpu, held, first, last = _produced(files, names, agents, producers)
        if rate is not None:    # a fixed rate: every message is waited for
            _settle(daemon, arrivals, written, settle)
            cpu1, sys1 = cpu_seconds(daemon.pid), system_seconds(daemon.pid)
            t1 = max(arrivals.seen.values(), default=time.time())
        release.set()
        for p in procs:
            p.join(READY_TIMEOUT)
            if p.exitcode != 0:
                raise BenchError(f"{p.name} failed (exit {p.exitcode}); see its traceback above")
        out["peak_rss_mb"] = peak_rss_mb(daemon.pid)
        if idle_seconds and rate is not None:
            out["idle_cpu_after_percent"] = _idle_cpu(daemon, idle_seconds)
        arrivals.close()
        seen, overflows, arrivals = arrivals.seen, arrivals.overflows, None
        out["daemon_exit"] = daemon.stop()
        delivered, lat, lag, seen_lag, when = _arrived(state, names, seen, sent, t0, t1)
        window = t1 - t0
        out.update({
            "written": written,
            "written_per_s": round(written / (last - first), 1) if written > 1 and last > first else None,
            "producer_cpu_s_per_1000": round(producer_cpu / written * 1000, 3) if written else None,
            "producers_held_percent": round(held / producers / seconds * 100, 1) if cap else None,
            "delivered": delivered,
            "delivered_per_s": round(delivered / window, 1) if window > 0 else None,
            "p50_ms": _pct(lat, 0.50), "p95_ms": _pct(lat, 0.95), "p99_ms": _pct(lat, 0.99),
            "max_ms": round(lat[-1], 2) if lat else None,
            "relayed_at_lag_p50_ms": _pct(lag, 0.50), "relayed_at_lag_p99_ms": _pct(lag, 0.99),
            "seen_after_ctime_p50_ms": _pct(seen_lag, 0.50), "seen_after_ctime_p99_ms": _pct(seen_lag, 0.99),
            "daemon_cpu_s_per_1000": round((cpu1 - cpu0) / delivered * 1000, 3) if delivered else None,
            "daemon_system_s_per_1000": round((sys1 - sys0) / delivered * 1000, 3) if delivered else None,
            "daemon_cpu_percent": round((cpu1 - cpu0) / window * 100, 1) if window > 0 else None,
            "inotify_overflows": overflows,
            # the slowest ten: (latency ms, sent at in seconds from the run's start, sender)
            "slowest": sorted(when, reverse=True)[:10],
            "load_avg": [round(x, 2) for x in os.getloadavg()],
        })
        return out
    finally:
        if arrivals is not None:
            arrivals.close()
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        if daemon is not None:
            daemon.stop()
        bench.discard(root)


def _start_producers(procs, root, names, producers, rate, seconds, cap, body_size):
    """The producer processes started (each appended to `procs`) and ready: the files their
    figures go to, and (go, start, done, release), what the run drives them with."""
    agents, state = len(names), root / ".relay"
    ctx = multiprocessing.get_context("spawn")
    ready, go, start = ctx.Barrier(producers + 1), ctx.Event(), ctx.Value("d", 0.0)
    done, release = ctx.Semaphore(0), ctx.Event()
    files = [root / f"producer-{k}.marshal" for k in range(producers)]
    for k in range(producers):
        own = range(k, agents, producers)
        boxes = [(str(state / "outbox" / names[a]), names[(a + 1) % agents]) for a in own]
        share, offset = (rate / producers, k / rate) if rate else (None, 0.0)
        p = ctx.Process(target=produce, name=f"producer-{k}", daemon=True,
                        args=(k, boxes, share, offset, seconds, cap, b"x" * body_size, str(files[k]), ready, go,
                              start, done, release))
        p.start()
        procs.append(p)
    try:
        ready.wait(READY_TIMEOUT)
    except threading.BrokenBarrierError:
        raise BenchError("the producers did not all start in time: "
                           + ", ".join(f"{p.name} exit {p.exitcode}" for p in procs if not p.is_alive())) from None
    return files, (go, start, done, release)


def _settle(daemon, arrivals, written, settle):
    """Wait (at most `settle` seconds) for every message written to arrive."""
    deadline = time.time() + settle
    while len(arrivals.seen) < written and time.time() < deadline:
        if daemon.proc.poll() is not None:
            raise BenchError(f"the daemon exited ({daemon.proc.returncode}) during the run: {daemon.tail()}")
        time.sleep(0.05)


def _idle_cpu(daemon, idle_seconds):
    """The daemon's CPU (percent of one core) while nothing is sent for `idle_seconds`."""
    time.sleep(0.5)
    c0 = cpu_seconds(daemon.pid)
    time.sleep(idle_seconds)
    return round((cpu_seconds(daemon.pid) - c0) / idle_seconds * 100, 3)


def _produced(files, names, agents, producers):
    """What the producers wrote, from their figures' files: {(sender, name): time written},
    the count, their CPU seconds, their seconds held back by the cap, the first and last time."""
    sent = {}
    written = producer_cpu = held = 0
    first = last = None
    for k, f in enumerate(files):
        with open(f, "rb") as fh:
            pnames, ptimes, pcpu, pheld = marshal.load(fh)
        own = range(k, agents, producers)
        senders = [names[a] for a in own]
        for i, (n, t) in enumerate(zip(pnames, ptimes)):
            sent[(senders[i % len(senders)], n)] = t
        written += len(pnames)
        producer_cpu += pcpu
        held += pheld
        if ptimes:
            first = ptimes[0] if first is None else min(first, ptimes[0])
            last = ptimes[-1] if last is None else max(last, ptimes[-1])
    return sent, written, producer_cpu, held, first, last


def _arrived(state, names, seen, sent, t0, t1):
    """The deliveries seen by t1 of messages the producers wrote: their count, latencies (ms,
    sorted), lags behind relayed_at and behind the kernel's ctime (ms, sorted), and (latency,
    sent at from the run's start, sender) of each."""
    lat, lag, seen_lag, when = [], [], [], []
    delivered = 0
    for n in names:
        new = state / "inbox" / n / "new"
        for entry in os.scandir(new):
            t = seen.get(os.fsencode(entry.name))
            if t is None or t > t1:
                continue
            env = orjson.loads(Path(entry.path).read_bytes())
            t_sent = sent.get((env["from"], env["source"]))
            if t_sent is None:
                continue
            delivered += 1
            lat.append((t - t_sent) * 1000)
            when.append((round((t - t_sent) * 1000, 2), round(t_sent - t0, 3), env["from"]))
            lag.append((t - _epoch(env["relayed_at"])) * 1000)
            # The link's unlink of tmp/ follows at once and sets the inode's ctime: the kernel's
            # (coarse, a clock tick) time of the arrival, against which inotify's is checked.
            seen_lag.append((t - entry.stat(follow_symlinks=False).st_ctime_ns / 1e9) * 1000)
    lat.sort()
    lag.sort()
    seen_lag.sort()
    return delivered, lat, lag, seen_lag, when


def pressure():
    """The machine's load when a figure was taken: load averages, and the share of the last
    10 s in which some task waited for a CPU or for I/O (Linux PSI), when readable."""
    out = {"load_avg": [round(x, 2) for x in os.getloadavg()]}
    for what in ("cpu", "io"):
        try:
            with open(f"/proc/pressure/{what}") as f:
                out[f"{what}_wait_percent"] = float(f.readline().split()[1].split("=")[1])
        except (OSError, IndexError, ValueError):
            pass
    return out


def quiet_disk(timeout=30.0):
    """sync(2), then wait (at most `timeout`) until the kernel holds under 8 MB of dirty pages:
    each run starts without the write-back of the one before. Returns pressure() then."""
    os.sync()
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open("/proc/meminfo") as f:
                kb = sum(int(line.split()[1]) for line in f if line.startswith(("Dirty:", "Writeback:")))
        except (OSError, ValueError, IndexError):
            break
        if kb < 8192:
            break
        time.sleep(0.2)
    return pressure()


# -- run --once and the naive loop on a backlog, in a child process ------------------------------

def _backlog_child(base, messages, agents, what, conn):
    """In a child process, so that its CPU time is that drain's alone."""
    quiet_gc()          # as `relay run` has it (for both)
    stats = {}
    if what == "once":
        # Flow control's limits off, as for the daemon (Daemon): the backlog is the full-speed
        # run's, each agent writing to one recipient past pair_rate.
        rate = bench.relay_once(base, messages, agents, "full", limits=False, stats=stats)
    else:
        rate = bench.naive(base, messages, agents, True, stats=stats)
    conn.send({"per_s": round(rate), "cpu_s_per_1000": round(stats["cpu_s"] / messages * 1000, 3), **pressure()})
    conn.close()


def backlog(base, messages, agents, what):
    """`run --once` (what="once") or the naive durable loop ("naive") on a backlog of
    `messages`: msg/s and CPU seconds per 1,000 messages."""
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_backlog_child, args=(str(base), messages, agents, what, there), daemon=True)
    p.start()
    there.close()
    try:
        return here.recv()
    except EOFError:
        raise BenchError(f"the {what} backlog run died (exit {p.join() or p.exitcode})") from None
    finally:
        p.join()


# -- the whole benchmark ---------------------------------------------------------------------------

COLUMNS = [("scenario", "{}"), ("offered_per_s", "{:g}"), ("written_per_s", "{:.0f}"), ("delivered_per_s", "{:.0f}"),
           ("p50_ms", "{:.1f}"), ("p95_ms", "{:.1f}"), ("p99_ms", "{:.1f}"), ("daemon_cpu_s_per_1000", "{:.2f}"),
           ("peak_rss_mb", "{:.0f}"), ("load_before", "{0[0]:.1f}"), ("load_avg", "{0[0]:.1f}")]
HEADS = ["scenario", "offered/s", "written/s", "delivered/s", "p50 ms", "p95 ms", "p99 ms", "CPU s/1k", "RSS MB",
         "load before", "after"]


def table(rows):
    cells = [HEADS] + [[("-" if r.get(k) is None else fmt.format(r[k])) for k, fmt in COLUMNS] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADS))]
    return "\n".join("  ".join(c[i].rjust(widths[i]) if i else c[i].ljust(widths[i]) for i in range(len(c)))
                     for c in cells)


def run(base, agents=20, rates=(100, 700, 1000), seconds=10.0, full_seconds=5.0, cap=50,
        many_agents=1000, many_rate=100, idle_seconds=3.0, once=True, cmd=None, repeat=1, echo=print,
        settle_timeout=0.0, keep=False):
    """Every scenario in turn, then run --once and the naive durable loop on a backlog the size
    of what the closed-loop full-speed run delivered. With `repeat`, each scenario runs that
    many times and its row is the median run by delivered msg/s (then p50), the spread beside
    (`runs`). `settle_timeout`: how long to wait first for file creation to be cheap (see
    bench.discard). `keep`: leave the finished projects in base's bench.TRASH instead of
    deleting them at the end. Returns the figures (a dict)."""
    base = Path(base)
    base.mkdir(parents=True, exist_ok=True)
    out = {"dir": str(base), "fs": fs_type(base), "cpus": os.cpu_count(), "rows": []}
    echo(f"sustained load in {base} ({out['fs']}), {agents} agents, {os.cpu_count()} CPUs")
    out["create_us"] = us = bench.cheap_creates(base, settle_timeout, echo)
    echo("  " + bench.create_cost_note(us))
    plan = [(f"rate {r:g}", dict(rate=r, seconds=seconds)) for r in rates]
    if full_seconds > 0:
        plan.append((f"full, cap {cap}/agent", dict(rate=None, seconds=full_seconds, cap=cap)))
    if many_agents:
        plan.append((f"{many_agents} outboxes, rate {many_rate:g}",
                     dict(rate=many_rate, seconds=seconds, agents=many_agents)))
    # Last: it leaves tens of thousands of files to the disk's write-back, which would slow a
    # run after it (each run also starts after a sync, with what came before on the disk).
    if full_seconds > 0:
        plan.append(("full, open loop", dict(rate=None, seconds=full_seconds)))
    for i, (label, kw) in enumerate(plan):
        kw.setdefault("agents", agents)
        tries = []
        for _ in range(max(1, repeat)):
            before = quiet_disk()
            row = scenario(base, label, cmd=cmd, idle_seconds=idle_seconds if i == 0 else 0.0, **kw)
            row.update(pressure(), load_before=before["load_avg"])
            tries.append(row)
        tries.sort(key=lambda r: (r["delivered_per_s"] or 0, -(r["p50_ms"] or 0)))
        row = tries[len(tries) // 2]
        if len(tries) > 1:
            row["runs"] = [{k: r[k] for k in ("delivered_per_s", "p50_ms", "p99_ms", "daemon_cpu_s_per_1000")}
                           | {"load_before": r["load_before"][0]} for r in tries]
        out["rows"].append(row)
        held = "" if row["producers_held_percent"] is None else \
            f", producers held by the cap {row['producers_held_percent']}% of the time"
        echo(f"  {label}: {row['delivered']}/{row['written']} delivered, {row['delivered_per_s']} msg/s, "
             f"p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms, daemon CPU {row['daemon_cpu_s_per_1000']} s/1k "
             f"({row['daemon_cpu_percent']}% of a CPU), producers' CPU {row['producer_cpu_s_per_1000']} s/1k{held} "
             f"(load {row['load_avg'][0]})")
    first = out["rows"][0]
    out["idle_cpu_percent"] = first.get("idle_cpu_percent")
    out["idle_cpu_after_load_percent"] = first.get("idle_cpu_after_percent")
    out["daemon_peak_rss_mb"] = max(r["peak_rss_mb"] or 0 for r in out["rows"])
    full = [r for r in out["rows"] if r["scenario"].startswith("full")]
    if once:
        size = max(1000, max((r["delivered"] for r in full), default=0))
        quiet_disk()
        out["once"] = backlog(base, size, agents, "once")
        quiet_disk()
        out["naive_durable"] = backlog(base, size, agents, "naive")
        out["backlog"] = size
    echo(table(out["rows"]))
    for r in out["rows"]:
        if "runs" in r:
            echo(f"  {r['scenario']}, each run: " + "; ".join(
                f"{x['delivered_per_s']}/s p50 {x['p50_ms']} p99 {x['p99_ms']} ms CPU {x['daemon_cpu_s_per_1000']} "
                f"(load {x['load_before']})" for x in r["runs"]))
    if once:
        o, n = out["once"], out["naive_durable"]
        echo(f"backlog of {size}: run --once {o['per_s']} msg/s, {o['cpu_s_per_1000']} CPU s/1k "
             f"(load {o['load_avg'][0]}); naive durable loop {n['per_s']} msg/s, {n['cpu_s_per_1000']} CPU s/1k "
             f"(load {n['load_avg'][0]})")
        for r in full:
            if r["daemon_cpu_s_per_1000"]:
                r["cpu_vs_once"] = round(r["daemon_cpu_s_per_1000"] / o["cpu_s_per_1000"], 2)
                echo(f"  {r['scenario']}: daemon CPU per message {r['cpu_vs_once']}x run --once's")
    echo(f"daemon idle CPU {out['idle_cpu_percent']}% (after load {out['idle_cpu_after_load_percent']}%), "
         f"peak RSS {out['daemon_peak_rss_mb']} MB")
    if not keep:
        bench.empty_trash(base)
    return out
