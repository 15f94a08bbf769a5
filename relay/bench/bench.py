"""`relay bench`: this disk's limits and relay's throughput and latency, side by side.

Everything runs in a temporary directory on the file system under test. Figures, not verdicts:
the targets are printed beside them so a reader can compare.
"""
import hashlib
import json
import logging
import math
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

from relay import config as config_mod
from relay.core.daemon import Relay
from relay.core.loop import quiet_gc
from relay.bench.loadgen import offer     # bench.offer: latency's (a seam)
from relay.errors import BenchError


TRASH = ".relay-bench-done"
SLOW_CREATE_US = 200


def discard(path):
    """Put a finished run's directory aside instead of deleting it: on ext4 without a journal,
    creating a file passes over every inode freed in the last 1 to 6 minutes (reading each one's
    deletion time), so deleting one run's tens of thousands of files made the next run's
    creates cost about 1 ms of system CPU each instead of 20 us, whichever was being measured.
    empty_trash() removes them once every figure is taken."""
    path = Path(path)
    trash = path.parent / TRASH
    try:
        trash.mkdir(exist_ok=True)
        if trash.is_symlink() or not trash.is_dir():
            raise IsADirectoryError(f"{trash} is not a plain directory")     # never moved through a link
        os.rename(path, trash / path.name)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)


def empty_trash(base):
    shutil.rmtree(Path(base) / TRASH, ignore_errors=True)


def create_cost_us(base, n=200):
    """The system CPU, in microseconds, of creating one empty file in a new directory under
    `base` now (the files are discarded, not deleted)."""
    d = Path(tempfile.mkdtemp(dir=base, prefix="create-"))
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            t = resource.getrusage(resource.RUSAGE_SELF).ru_stime
            for i in range(n):
                os.close(os.open(f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=fd))
            return round((resource.getrusage(resource.RUSAGE_SELF).ru_stime - t) / n * 1e6, 1)
        finally:
            os.close(fd)
    finally:
        discard(d)


def cheap_creates(base, timeout, echo=print, poll=10.0):
    """Wait (at most `timeout` seconds) until creating a file under `base` is cheap again (see
    discard), saying so once; returns the last create_cost_us()."""
    us = create_cost_us(base)
    deadline = time.monotonic() + timeout
    if us > SLOW_CREATE_US and timeout > 0:
        echo(f"  creating a file here costs {us} us of system CPU: waiting up to {timeout:.0f} s for the "
             f"inodes deleted lately to age (ext4 without a journal passes over them for up to 6 minutes)")
        while us > SLOW_CREATE_US and time.monotonic() < deadline:
            time.sleep(poll)
            us = create_cost_us(base)
    return us


def create_cost_note(us):
    slow = (" (slow: on ext4 without a journal, files deleted in the last few minutes make creates "
            "costly; figures taken now are low; wait and run again)") if us > SLOW_CREATE_US else ""
    return f"creating a file here costs {us} us of system CPU{slow}"


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)


def disk(base, n=300):
    """fsync'd file creates/s, directory fsyncs/s, renames/s."""
    d = Path(tempfile.mkdtemp(dir=base, prefix="disk-"))
    try:
        t = time.perf_counter()
        for i in range(n):
            fd = os.open(d / f"f{i}", os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, b"x" * 300)
            os.fsync(fd)
            os.close(fd)
        creates = n / (time.perf_counter() - t)
        t = time.perf_counter()
        for _ in range(n):
            _fsync_dir(d)
        dir_fsyncs = n / (time.perf_counter() - t)
        t = time.perf_counter()
        for i in range(n):
            os.rename(d / f"f{i}", d / f"g{i}")
        renames = n / (time.perf_counter() - t)
        return {"fsync_creates_per_s": round(creates), "dir_fsyncs_per_s": round(dir_fsyncs),
                "renames_per_s": round(renames)}
    finally:
        discard(d)


def make_backlog(state, messages, agents, body_size=200):
    names = [f"agent{i:03d}" for i in range(agents)]
    for name in names:
        (state / "outbox" / name).mkdir(parents=True, exist_ok=True)
        for sub in ("tmp", "new", "cur"):
            (state / "inbox" / name / sub).mkdir(parents=True, exist_ok=True)
    old = time.time() - 60
    body = "x" * body_size
    for i in range(messages):
        sender = names[i % agents]
        to = names[(i + 1) % agents]
        path = state / "outbox" / sender / f"m{i}"
        path.write_text(f"TO: {to}\nSUBJECT: bench {i}\n\n{body}")
        os.utime(path, (old, old))
    return names


def naive(base, messages, agents, durable, stats=None):
    """The simplest correct loop with no ledger: per file, read, write an envelope to tmp
    (+fsync), rename into new/ (+fsync dir), move the original to the archive (+fsync dir).
    `stats`, a dict, gets the loop's CPU seconds as "cpu_s"."""
    root = Path(tempfile.mkdtemp(dir=base, prefix="naive-"))
    try:
        state = root / ".relay"
        names = make_backlog(state, messages, agents)
        archive = state / "archive"
        for n in names:
            (archive / n).mkdir(parents=True)
        t, cpu = time.perf_counter(), time.process_time()
        for sender in names:
            box = state / "outbox" / sender
            for entry in os.scandir(box):
                data = open(entry.path, "rb").read()
                head, _, body = data.partition(b"\n\n")
                to = head.split(b"\n", 1)[0].split(b":", 1)[1].strip().decode()
                env = json.dumps({"from": sender, "to": [to], "body": body.decode(),
                                  "sha256": hashlib.sha256(data).hexdigest()}).encode()
                tmp = state / "inbox" / to / "tmp" / f"{entry.name}.json"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.write(fd, env)
                if durable:
                    os.fsync(fd)
                os.close(fd)
                os.rename(tmp, state / "inbox" / to / "new" / tmp.name)
                if durable:
                    _fsync_dir(state / "inbox" / to / "new")
                os.rename(entry.path, archive / sender / entry.name)
                if durable:
                    _fsync_dir(archive / sender)
        took = time.perf_counter() - t
        if stats is not None:
            stats["cpu_s"] = time.process_time() - cpu
        return messages / took
    finally:
        discard(root)


LIMITS_OFF = {"pair_rate": 0, "pair_window": 0, "queue_limit": 0}
FLOW_RUNS = 3           # runs with the limits off, for the ratio with the limits on
PAIRS = 3               # alternated runs of the naive durable loop and of run --once


def relay_once(base, messages, agents, durability, preload=0, limits=True, timing=None, stats=None):
    """relay run --once on a backlog; messages/s of the drain alone. `limits`: flow control's
    defaults (True) or all turned off (False). `timing`, a dict, receives the seconds of the
    drain ("total") and of flow control's own work in it ("flow"). `stats`, a dict, gets the
    drain's CPU seconds as "cpu_s" (all threads of this process)."""
    root = Path(tempfile.mkdtemp(dir=base, prefix=f"relay-{durability}-"))
    try:
        state = root / ".relay"
        make_backlog(state, messages, agents)
        cfg = config_mod.load(root, ".relay", env={},
                              overrides={"durability": durability, **({} if limits else LIMITS_OFF)})
        with Relay(cfg) as relay:
            if preload:
                preload_ledger(relay.ledger, preload)
            if timing is not None:
                _time_flow(relay.flow, timing)
            t, cpu = time.perf_counter(), time.process_time()
            total = relay.drain()
            took = time.perf_counter() - t
            if timing is not None:
                timing["total"] = took
            if stats is not None:
                stats["cpu_s"] = time.process_time() - cpu
        if total.archived + (total.failed if total.shed else 0) != messages:
            raise BenchError(f"bench: relay archived {total.archived} of {messages} messages")
        if total.shed:
            logging.getLogger("relay").warning("bench: flow control shed %d deliveries of this backlog (more than "
                                               "pair_rate per pair)", total.shed)
        return messages / took
    finally:
        discard(root)


def _time_flow(flow, timing):
    """Add the seconds spent in flow control's decisions (admit) and bookkeeping (commit) to
    timing["flow"]: its cost measured inside the run, apart from the disk's noise."""
    timing["flow"] = 0.0
    for name in ("admit", "commit"):
        real = getattr(flow, name)

        def timed(*a, real=real, **k):
            t = time.perf_counter()
            try:
                return real(*a, **k)
            finally:
                timing["flow"] += time.perf_counter() - t
        setattr(flow, name, timed)


def preload_ledger(ledger, rows, chunk=50_000):
    """Fill the ledger with `rows` archived messages (as a long-running project would have)."""
    now = time.time() - 3600
    done = 0
    while done < rows:
        n = min(chunk, rows - done)
        ledger.operations.add_archived((f"00000000{done + i:018d}", f"agent{(done + i) % 20:03d}", f"old{done + i}",
                             '["agent001"]', "message", "s", "b", 10, "h", now, f"archive/x/old{done + i}")
                            for i in range(n))
        done += n


class Floor:
    """The floor of one durable delivery on this file system: a small envelope written into
    tmp/ and fsynced while a SQLite commit at synchronous FULL runs beside it (the record), then
    a link into new/ and a rename (the original into the archive). What relay adds to it is its
    own. `sample(n, rate)` times `n` of them, one every 1/`rate` s (as the latency test offers
    messages); `close()` puts the directory aside (discard)."""

    ENVELOPE = b'{"id":"01KAAAAAAAAAAAAAAAAAAAAAAA","from":"a","to":["b"],"body":"' + b"x" * 200 + b'"}'

    def __init__(self, base):
        from relay.bench.commitprobe import CommitProbe
        self.dir = d = Path(tempfile.mkdtemp(dir=base, prefix="floor-"))
        try:
            for sub in ("tmp", "new", "out", "archive"):
                (d / sub).mkdir()
            self.db = CommitProbe(d / "ledger.sqlite")
        except BaseException:
            discard(d)
            raise
        self.done = 0

    def sample(self, n, rate):
        import threading
        d, times = self.dir, []
        for i in range(self.done, self.done + n):
            (d / "out" / f"m{i}").write_bytes(b"TO: b\n\nx")
            began = time.perf_counter()

            record = threading.Thread(target=self.db.commit, args=(i,))
            record.start()
            fd = os.open(d / "tmp" / f"{i}.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, self.ENVELOPE)
            os.fsync(fd)
            os.close(fd)
            record.join()
            os.link(d / "tmp" / f"{i}.json", d / "new" / f"{i}.json")
            os.rename(d / "out" / f"m{i}", d / "archive" / f"m{i}")
            times.append((time.perf_counter() - began) * 1000)
            time.sleep(max(0.0, 1.0 / rate - (time.perf_counter() - began)))
        self.done += n
        return times

    def close(self):
        self.db.close()
        discard(self.dir)


def percentile(values, p):
    """The p-th quantile (0-1) of `values`, as the figures here take it (no interpolation)."""
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def floor(base, n=200, rate=100.0):
    """The floor's p50 and p99 in ms, of `n` deliveries one every 1/`rate` s (see Floor)."""
    probe = Floor(base)
    try:
        times = probe.sample(n, rate)
    finally:
        probe.close()
    return {"p50_ms": round(percentile(times, 0.50), 3), "p99_ms": round(percentile(times, 0.99), 3)}


FLOOR_BLOCKS = 5        # side by side: the floor's samples and the daemon's messages, in turns


def latency(base, rate=100.0, seconds=5.0, agents=8, durability="full", floor_blocks=0):
    """Offer `rate` messages/s from `agents` agents to a running daemon; time from each rename
    into an outbox to its envelope appearing in the recipient's new/ (seen by inotify). With
    `floor_blocks`, the messages are offered in that many blocks, each after a block of the
    floor's deliveries (Floor, half as many, at the same rate, the daemon idle): a disk whose
    speed drifts within minutes is measured by both in the same minutes. Then "floor" holds the
    floor's p50/p99 over every block and "block_ratios" each block's p50 over its floor's p50."""
    count = offered(rate, seconds)
    root = Path(tempfile.mkdtemp(dir=base, prefix="latency-"))
    names = [f"agent{i}" for i in range(agents)]

    # An abstract socket: no path, so no length limit from a deep benchmark directory.
    sock_path = f"@relay-bench-{os.getpid()}-{os.urandom(4).hex()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + sock_path[1:])
    sock.settimeout(1)
    env = dict(os.environ, RELAY_ROOT=str(root), NOTIFY_SOCKET=sock_path, RELAY_AGENTS=",".join(names),
               RELAY_DURABILITY=durability, RELAY_LOG_LEVEL="WARNING")
    # Its log in a file, not a pipe read at the end only: a daemon that filled the pipe would stop.
    log = tempfile.TemporaryFile(dir=base)
    proc = subprocess.Popen([sys.executable, "-m", "relay", "run"], env=env, stderr=log)
    from relay.bench.sustained import peak_rss_mb
    probe, floors, blocks, lat, idle, ready = None, [], [], [], None, None
    alive = lambda: proc.poll() is None     # noqa: E731
    try:
        probe = Floor(base) if floor_blocks else None
        state = root / ".relay"
        inboxes = [state / "inbox" / n / "new" for n in names]
        route = lambda i: (state / "outbox" / names[i % agents], names[(i + 1) % agents])   # noqa: E731
        turns = max(1, min(floor_blocks, count))       # no block without a message
        ready = wait_ready(sock, alive)
        sock.close()        # unread, its queue would fill with the daemon's STATUS= lines
        for b in range(turns if ready else 0):
            if not alive():
                break
            start, end = count * b // turns, count * (b + 1) // turns
            if probe is not None:
                floors.append(probe.sample(max(10, (end - start) // 2), rate))
            got = offer(end - start, rate, route, inboxes, 30, start=start, alive=alive)
            lat += got
            blocks.append(got)
            if not alive():
                break
        if ready and alive():       # idle CPU: the daemon's CPU time over two idle seconds
            before = _cpu(proc.pid)
            time.sleep(2.0)
            cpu, rss_mb = _cpu(proc.pid), peak_rss_mb(proc.pid)
            if alive() and rss_mb is not None:      # not a process that died meanwhile
                idle = (cpu - before) / 2.0 * 100
    finally:
        try:
            stop(proc)
        finally:
            sock.close()
            try:
                if probe is not None:
                    probe.close()
            finally:
                discard(root)
            log.seek(0)
            lines = log.read()[-4000:].decode(errors="replace").strip().splitlines()[-5:]
            log.close()
    if idle is None:
        said = (": " + " | ".join(lines)) if lines else ""
        if ready is None:
            raise BenchError(f"bench: the daemon under test did not say READY=1 within 30 s{said}")
        raise BenchError(f"bench: the daemon under test exited ({proc.returncode}) during the latency run, "
                         f"after {len(lat)} of {count} messages{said}")
    if not lat:
        raise BenchError(f"bench: none of the {count} messages offered arrived within 30 s")
    out = {"messages": count, "delivered": len(lat), "p50_ms": round(percentile(lat, 0.50), 2),
           "p99_ms": round(percentile(lat, 0.99), 2), "max_ms": round(max(lat), 2),
           "idle_cpu_percent": round(idle, 3), "daemon_peak_rss_mb": rss_mb}
    if probe is not None:
        every = [t for f in floors for t in f]
        out["floor"] = {"p50_ms": round(percentile(every, 0.50), 3), "p99_ms": round(percentile(every, 0.99), 3)}
        out["block_ratios"] = [round(percentile(got, 0.5) / percentile(f, 0.5), 2) if got else None
                               for f, got in zip(floors, blocks)]     # None: a block that saw nothing
    return out


def offered(rate, seconds):
    """How many messages `rate` msg/s for `seconds` s offer; BenchError when that is none."""
    if not (0 < rate < math.inf and 0 < seconds < math.inf and rate * seconds >= 1):
        raise BenchError(f"bench: {rate:g} msg/s for {seconds:g} s offers no message; offer at least one")
    return int(rate * seconds)


def stop(proc, timeout=30):
    """SIGTERM to a daemon under test, SIGKILL if it has not exited `timeout` s later."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_ready(sock, alive, patience=30.0):
    """Wait for a daemon's READY=1 on `sock` (its NOTIFY_SOCKET, a timeout of a second or so
    set): True; False once it exited (`alive()` false); None when it said nothing for `patience`
    seconds."""
    deadline = time.monotonic() + patience
    while alive():
        try:
            if b"READY=1" in sock.recv(4096):
                return True
        except TimeoutError:
            if time.monotonic() > deadline:
                return None
    return False


def _cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(base=None, messages=5000, agents=20, rate=100.0, seconds=5.0, echo=print):
    logging.getLogger("relay").setLevel(logging.WARNING)
    quiet_gc()          # as `relay run` has it, for the naive loop too
    base = Path(base or tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    out = {"dir": str(base), "messages": messages, "agents": agents}
    echo(f"relay bench in {base}: backlog {messages} messages from {agents} agents")
    out["create_us"] = us = create_cost_us(base)
    echo(create_cost_note(us))
    out["disk"] = d = disk(base)
    echo(f"disk: {d['fsync_creates_per_s']} fsync'd creates/s, {d['dir_fsyncs_per_s']} dir fsyncs/s, "
         f"{d['renames_per_s']} renames/s")
    # The naive durable loop and run --once, alternated: the disk and the CPU of a shared
    # machine drift by a third within minutes, so each ratio is of two runs side by side.
    pairs = []
    for _ in range(PAIRS):
        pairs.append((round(naive(base, messages, agents, True)), round(relay_once(base, messages, agents, "full"))))
    ratios = sorted(rf / nd for nd, rf in pairs)
    out["naive_durable_per_s"] = nd = round(median(nd for nd, _ in pairs))
    out["naive_nosync_per_s"] = nn = round(naive(base, messages, agents, False))
    echo(f"naive loop: {nd} msg/s with fsyncs (median of {PAIRS}), {nn} msg/s without")
    out["relay_full_per_s"] = rf = round(median(rf for _, rf in pairs))
    out["relay_normal_per_s"] = rn = round(relay_once(base, messages, agents, "normal"))
    out["full_naive_pairs"] = [{"naive_per_s": a, "relay_per_s": b, "ratio": round(b / a, 2)} for a, b in pairs]
    out["ratio_full_to_naive_durable"] = round(median(ratios), 2)
    out["ratio_normal_to_naive_nosync"] = round(rn / nn, 2)
    echo(f"relay run --once: durability full {rf} msg/s ({out['ratio_full_to_naive_durable']:.2f}x the naive durable "
         f"loop, the median of {PAIRS} alternated pairs: " + ", ".join(f"{b} vs {a}" for a, b in pairs)
         + f"; target 4x), normal {rn} msg/s ({rn / nn:.2f}x the naive loop without fsyncs; target 0.8x)")
    # Flow control's cost: the same backlog with the limits at their defaults and all off,
    # alternated, the best of three runs each.
    on, off, timing = [], [], {}
    for _ in range(FLOW_RUNS):
        off.append(round(relay_once(base, messages, agents, "full", limits=False)))
        on.append(round(relay_once(base, messages, agents, "full", timing=timing)))
    out["flow_control"] = fc = {"limits_on_per_s": max(on), "limits_off_per_s": max(off), "runs_on": on,
                                "runs_off": off, "ratio": round(max(on) / max(off), 3),
                                "own_seconds": round(timing["flow"], 4), "run_seconds": round(timing["total"], 3),
                                "own_share": round(timing["flow"] / timing["total"], 4)}
    fc["within_5_percent"] = abs(1 - fc["ratio"]) <= 0.05
    echo(f"flow control: run --once with the limits on (defaults) {fc['limits_on_per_s']} msg/s, off (all 0) "
         f"{fc['limits_off_per_s']} msg/s, best of {FLOW_RUNS} each: ratio {fc['ratio']:.3f} "
         f"({'within' if fc['within_5_percent'] else 'NOT within'} 5%; target within 5%); its own work in the last "
         f"run with the limits on: {fc['own_seconds'] * 1000:.0f} ms of {fc['run_seconds']:.2f} s "
         f"({fc['own_share'] * 100:.1f}%)")
    # The floor and the daemon's latency in turns, in the same minutes: this disk's sync time
    # drifted from 0.85 to 2.5 ms within minutes, which a floor taken before the daemon's run
    # put into the ratio.
    out["latency"] = lat = latency(base, rate, seconds, floor_blocks=FLOOR_BLOCKS)
    out["floor"] = fl = lat.pop("floor")
    echo(f"floor of one durable delivery here (envelope fsync beside a FULL commit, a link, a rename; one every "
         f"{1000 / rate:g} ms, in {FLOOR_BLOCKS} blocks taken in turns with the daemon's below): p50 {fl['p50_ms']} ms, "
         f"p99 {fl['p99_ms']} ms")
    lat["p50_to_floor"] = round(lat["p50_ms"] / fl["p50_ms"], 2)
    lat["p99_to_floor"] = round(lat["p99_ms"] / fl["p50_ms"], 2)
    blocks = ", ".join("-" if r is None else f"{r:g}" for r in lat["block_ratios"])
    echo(f"daemon latency at {rate:g} msg/s from 8 agents (durability full): p50 {lat['p50_ms']} ms "
         f"({lat['p50_to_floor']}x the floor; each block's: {blocks}; "
         f"target 1.25x), p99 {lat['p99_ms']} ms ({lat['p99_to_floor']}x the floor's p50; target 3x), max "
         f"{lat['max_ms']} ms ({lat['delivered']}/{lat['messages']} seen); idle CPU {lat['idle_cpu_percent']}%")
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    echo(f"peak RSS: bench process {out['peak_rss_mb']} MB, daemon {lat['daemon_peak_rss_mb']} MB")
    empty_trash(base)
    return out
