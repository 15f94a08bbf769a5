"""Where the daemon's time goes per message under sustained load, and run --once's on a backlog.

    python benchmarks/profile_daemon.py daemon [--scenario "full, cap 50/agent"] [--seconds 5]
                                               [--profiler yappi|cprofile|pyspy|none] [--strace]
    python benchmarks/profile_daemon.py once [--messages 5000] [--agents 20] [--profiler cprofile|yappi|none] [--strace]

`daemon` runs one scenario of relay/sustained.py (producer processes writing while the daemon
delivers) with this file's `serve` as the daemon: `relay run` itself (the same config from the
environment, lock, service.Daemon), with counters put around relay's public seams and the
watchdog calls, and a profiler when asked:

- file events: inotify events read (by kind), watchdog events built, events passed to the
  handler, hints given to the loop (by kind), per message;
- per-hint checks: Outbox.check calls and what they found;
- batches: steps, messages claimed per step (a histogram), steps that claimed nothing;
- hand-offs: loop wake-ups, and each thread's CPU seconds and context switches (/proc);
- ledger transactions, syncer flushes, syncfs and fsync calls from Python;
- with --strace, every system call of every thread counted (strace -f -c; slow, so its own
  run): the SQLite WAL's fsyncs show there, and nowhere else;
- Python time by function, top 25 cumulative: yappi (every thread, CPU clock), cProfile (the
  loop's thread only, its CPU clock), or py-spy (every thread, sampled, the least overhead).

Profilers slow the daemon: its batch sizes under a profiler are not those of a plain run, which
is why the counters are also taken with --profiler none. `once` does the same for relay.drain()
on a backlog in this process. `serve` is the daemon itself (used by `daemon`; reads RELAY_* from
the environment like `relay run`).
"""
import argparse
import collections
import cProfile
import functools
import io
import json
import os
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
INOTIFY_BITS = {0x1: "access", 0x2: "modify", 0x4: "attrib", 0x8: "close_write", 0x10: "close_nowrite",
                0x20: "open", 0x40: "moved_from", 0x80: "moved_to", 0x100: "create", 0x200: "delete",
                0x400: "delete_self", 0x800: "move_self", 0x4000: "overflow", 0x8000: "ignored"}


class Counters:
    """Counts from any thread (a lock: the watcher's threads count too)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.c = collections.Counter()
        self.batches = collections.Counter()

    def add(self, key, n=1):
        with self.lock:
            self.c[key] += n


def count_calls(owner, name, counters, key=None, result=None, timed=False):
    """Wrap owner.name (a class's method or an instance's attribute) to count its calls;
    `result(value, args, kwargs)` may count more from each call's return value; `timed` adds
    up the calls' wall time (milliseconds) under "<key> ms". Nothing when owner has no such
    name (another version of relay or watchdog): the counter is then absent, not zero."""
    original = getattr(owner, name, None)
    if original is None:
        return
    key = key or name

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        counters.add(key)
        t = time.perf_counter() if timed else 0.0
        value = original(*args, **kwargs)
        if timed:
            counters.add(f"{key} ms", round((time.perf_counter() - t) * 1000, 3))
        if result is not None:
            result(value, args, kwargs)
        return value
    setattr(owner, name, wrapper)


def bucket(n):
    for b in BUCKETS:
        if n <= b:
            return b
    return BUCKETS[-1] + 1


def instrument(counters):
    """Counters around relay's seams and the watcher's calls (class level: before any instance).
    Either watcher is counted: relay's own inotify reader (watcher.hints_of, Relay.hint_many)
    or watchdog's observer (its inotify thread, emitter and the handler, Relay.hint)."""
    from relay.core import daemon as daemon_mod
    from relay.ledger import ledger, messages, senders
    from relay.core import outbox
    from relay.files import sync
    from relay.core import watcher

    try:
        from watchdog.observers import api as wd_api
        from watchdog.observers.inotify import InotifyWatchGroup
        from watchdog.observers.inotify_c import InotifyFD
    except (ImportError, OSError):
        wd_api = InotifyWatchGroup = InotifyFD = None

    def inotify_kind(value, args, kwargs):
        event = args[1]
        mask = event.mask
        names = [n for bit, n in INOTIFY_BITS.items() if mask & bit]
        counters.add("inotify:" + "+".join(names) + (" (dir)" if event.is_directory else ""))
        name = os.fsdecode(event.name or b"")
        counters.add("inotify on in-progress names" if name.startswith(".") else "inotify on message names")
    count_calls(InotifyFD, "handle_event", counters, "inotify events read", inotify_kind)
    count_calls(InotifyWatchGroup, "on_event", counters, "inotify events to the watch group")
    count_calls(getattr(wd_api, "EventEmitter", None), "queue_event", counters, "watchdog events built")

    def dispatched(value, args, kwargs):
        counters.add("handler: " + type(args[1]).__name__)
    count_calls(getattr(watcher, "Handler", None), "dispatch", counters, "watchdog events to the handler", dispatched)

    def read_by_relay(value, args, kwargs):     # relay's own reader: events in, hints out
        events = args[0]
        counters.add("inotify events read", len(events))
        for _, mask, raw in events:
            names = [n for bit, n in INOTIFY_BITS.items() if mask & bit]
            counters.add("inotify:" + "+".join(names) + (" (dir)" if mask & 0x40000000 else ""))
            counters.add("inotify on in-progress names" if raw[:1] == b"." else "inotify on message names")
        for kind, _, _ in value[0]:
            counters.add("hint: " + kind)
        counters.add("hints", len(value[0]))
    count_calls(watcher, "hints_of", counters, "watcher reads turned into hints", read_by_relay)

    def parsed(value, args, kwargs):    # relay's own inotify reader (watcher.Inotify)
        counters.add("inotify events read", len(value))
        for _, mask, name in value:
            counters.add("inotify:" + "+".join(n for bit, n in INOTIFY_BITS.items() if mask & bit))
            counters.add("inotify on in-progress names" if name.startswith(b".") else "inotify on message names")
    count_calls(watcher, "parse", counters, "inotify reads", parsed)

    def hinted_many(value, args, kwargs):
        for h in args[1]:
            counters.add("hints")
            counters.add("hint: " + h[0])
    count_calls(daemon_mod.Relay, "hint_many", counters, "hint batches", hinted_many)

    def hinted(value, args, kwargs):
        counters.add("hint: " + (args[1] if len(args) > 1 else kwargs.get("kind")))
    count_calls(daemon_mod.Relay, "hint", counters, "hints", hinted)
    count_calls(daemon_mod.Relay, "hint_many", counters, "hint batches (one wake each)")

    def checked(value, args, kwargs):
        hinted_ = kwargs.get("hinted", False)
        counters.add(f"check ({'hinted' if hinted_ else 'scan/unhinted'}): " + ("found" if value else "nothing"))
    count_calls(outbox.Outbox, "check", counters, "outbox checks", checked)

    def stepped(value, args, kwargs):
        if value.claimed:
            counters.batches[bucket(value.claimed)] += 1
            counters.add("messages claimed", value.claimed)
        else:
            counters.add("steps claiming nothing")
    count_calls(daemon_mod.Relay, "step", counters, "steps", stepped, timed=True)
    count_calls(daemon_mod.Relay, "guarded_step", counters, "loop turns")
    count_calls(daemon_mod.Relay, "finish", counters, "group commits finished", timed=True)
    count_calls(ledger.Ledger, "transaction", counters, "ledger transactions")
    for part, name in ((messages.Messages, "register_and_claim"), (messages.Messages, "record"),
                       (senders.Senders, "identify")):
        count_calls(part, name, counters, f"ledger.{name}", timed=True)
    count_calls(sync.Syncer, "flush", counters, "syncer flushes", timed=True)
    count_calls(sync.Syncer, "flush_later", counters, "syncer flushes overlapped (group commit)")


def archived(ledger_path):
    """Messages the ledger holds archived (its public history, read-only): the denominator."""
    from relay.ledger.history import History
    from relay.ledger.ledger import Ledger
    with History(Ledger(ledger_path, readonly=True)) as history:
        return history.counts()["archived"]


def instrument_instance(relay, counters):
    """The Syncer's own seams (syncfs, fsync) and the loop's wake event."""
    from relay.core.waker import Waker
    count_calls(relay.syncer, "syncfs", counters, "syncfs calls", timed=True)
    count_calls(relay.syncer, "fsync", counters, "fsync calls (Python)", timed=True)
    wake = relay.wake

    class CountingWaker(Waker):
        def set(self):
            counters.add("wake.set calls")
            if not self.is_set():
                counters.add("wake.set that woke (flag was clear)")
            super().set()

        def poll(self, timeout, fds=()):
            ready = super().poll(timeout, fds)
            counters.add("loop waits ended by a wake or a file event" if ready or self.is_set()
                         else "loop waits timed out")
            return ready
    relay.wake = CountingWaker()
    if wake.is_set():
        relay.wake.set()
    wake.close()


def threads_now(since=None):
    """Each live thread's CPU seconds and context switches, from /proc/self/task (less those of
    `since`, an earlier result, for the threads in both)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = []
    for t in threading.enumerate():
        tid = t.native_id
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            status = dict(line.split(":", 1) for line in open(f"/proc/self/task/{tid}/status") if ":" in line)
        except (OSError, TypeError):
            continue
        out.append({"thread": f"{t.name} ({type(t).__name__})", "tid": tid,
                    "cpu_s": (int(fields[11]) + int(fields[12])) / tick,
                    "voluntary_switches": int(status["voluntary_ctxt_switches"]),
                    "involuntary_switches": int(status["nonvoluntary_ctxt_switches"])})
    before = {t["tid"]: t for t in since or ()}
    for t in out:
        b = before.get(t["tid"])
        if b is not None:
            for k in ("cpu_s", "voluntary_switches", "involuntary_switches"):
                t[k] = round(t[k] - b[k], 3)
    return out


class Profiler:
    def __init__(self, kind, out):
        self.kind, self.out = kind, Path(out)
        self.prof = self.spy = None

    def start(self):
        if self.kind == "yappi":
            import yappi
            yappi.set_clock_type("cpu")
            yappi.start(builtins=True, profile_threads=True)
        elif self.kind == "cprofile":
            self.prof = cProfile.Profile(time.thread_time)
            self.prof.enable()
        elif self.kind == "pyspy":
            spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            self.spy = subprocess.Popen([spy, "record", "--pid", str(os.getpid()), "--rate", "200", "--format", "raw",
                                         "--output", str(self.out / "pyspy.txt"), "--threads", "--nonblocking"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)     # attached before the load starts

    def stop(self):
        stats = self.out / "profile.pstats"
        if self.kind == "yappi":
            import yappi
            yappi.stop()
            yappi.get_func_stats().save(str(stats), type="pstat")
            with open(self.out / "threads.txt", "w") as f:
                yappi.get_thread_stats().print_all(out=f)
        elif self.kind == "cprofile":
            self.prof.disable()
            self.prof.dump_stats(str(stats))
        elif self.kind == "pyspy":
            self.spy.send_signal(signal.SIGINT)
            self.spy.wait(60)


def attach_strace(out):
    proc = subprocess.Popen(["strace", "-f", "-c", "-o", str(out / "strace.txt"), "-p", str(os.getpid())],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    return proc


# -- serve: the daemon itself -------------------------------------------------------------------

def cmd_serve(args):
    from relay import config as config_mod
    from relay import service
    from relay.cli.context import setup_logging
    from relay.files.layout import Layout
    from relay.files.lock import DaemonLock

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    counters = Counters()
    instrument(counters)
    cfg = config_mod.load()
    setup_logging(cfg)
    layout = Layout(cfg.root, cfg.state_dir)
    layout.state.mkdir(parents=True, exist_ok=True)
    strace = attach_strace(out) if args.strace else None
    profiler = Profiler(args.profiler, out)
    snapshot = {}
    with DaemonLock(layout.lock) as lock:
        daemon = service.Daemon(cfg, lock=lock)
        daemon.overrides = {}
        instrument_instance(daemon.relay, counters)
        start_watcher, stop_watcher = daemon.watcher.start, daemon.watcher.stop

        def start_and_snapshot():       # the threads once they all run: what start-up cost is left out
            start_watcher()
            snapshot["threads"] = threads_now()

        def stop_and_snapshot():        # and before the watcher's end
            snapshot["threads"] = threads_now(snapshot.get("threads"))
            stop_watcher()
        daemon.watcher.start, daemon.watcher.stop = start_and_snapshot, stop_and_snapshot
        profiler.start()
        try:
            code = daemon.run()
        finally:
            profiler.stop()
            if strace is not None:
                strace.send_signal(signal.SIGINT)
                strace.wait(60)
    counters.c["messages archived"] = archived(layout.ledger)
    doc = {"counters": dict(counters.c), "batches": {str(k): v for k, v in sorted(counters.batches.items())},
           **snapshot}
    (out / "counters.json").write_text(json.dumps(doc, indent=1))
    return code


# -- the report ---------------------------------------------------------------------------------

def breakdown(out, written=None, echo=print, top=25):
    """Print the counters per message, the batch histogram, threads, syscalls and the top
    functions from what `serve` (or `once`) left in `out`. Per message: per message archived,
    and per message written when `written` is known (the file events come with each file
    written, whether or not the daemon got to it in the run)."""
    out = Path(out)
    doc = json.loads((out / "counters.json").read_text())
    c = doc["counters"]
    n = c.get("messages archived", 0)
    echo(f"messages archived: {n}" + (f", written: {written}" if written else ""))
    if not n:
        return doc
    echo(f"  {'counter':<58} {'total':>10}  {'/archived':>9}" + (f"  {'/written':>9}" if written else ""))
    for key in sorted(c):
        if key != "messages archived":
            echo(f"  {key:<58} {c[key]:>10.10g}  {c[key] / n:9.3f}" + (f"  {c[key] / written:9.3f}" if written else ""))
    steps = sum(doc["batches"].values())
    echo(f"batch sizes (messages claimed per step; {steps} steps that claimed, mean {c.get('messages claimed', 0) / max(steps, 1):.1f}):")
    prev = 0
    for b, k in doc["batches"].items():
        echo(f"  {prev + 1:>4}-{int(b):<4} {k:>7}  {'#' * max(1, round(60 * k / max(doc['batches'].values())))}")
        prev = int(b)
    if doc.get("threads"):
        echo("threads (CPU s, per message ms, context switches voluntary/involuntary):")
        for t in sorted(doc["threads"], key=lambda t: -t["cpu_s"]):
            echo(f"  {t['thread']:<44} {t['cpu_s']:7.2f} s {t['cpu_s'] / n * 1000:7.3f} ms "
                 f"{t['voluntary_switches']:>8}/{t['involuntary_switches']:<8}")
    strace = out / "strace.txt"
    if strace.exists():
        echo("system calls per message archived (strace -f -c; futex: threads handing the GIL and locks over):")
        for line in strace.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 5 and parts[-1].isidentifier() and parts[3].isdigit() and parts[-1] != "total":
                calls = int(parts[3])
                if calls / n >= 0.01 or "sync" in parts[-1]:
                    echo(f"  {parts[-1]:<22} {calls:>9}  {calls / n:8.3f}   {parts[2]:>6} us/call")
    stats = out / "profile.pstats"
    if stats.exists():
        buf = io.StringIO()
        p = pstats.Stats(str(stats), stream=buf)
        p.sort_stats("cumulative").print_stats(top)
        echo(f"Python time by function, top {top} cumulative:")
        echo(_trim(buf.getvalue()))
        buf.seek(0)
        buf.truncate()
        p.sort_stats("tottime").print_stats(15)
        echo("and the top 15 by own time:")
        echo(_trim(buf.getvalue()))
    spy = out / "pyspy.txt"
    if spy.exists():
        echo(f"py-spy samples, top {top} by cumulative (every thread):")
        for line in pyspy_top(spy, top):
            echo(line)
    return doc


def _trim(text):
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    return "\n".join(lines[max(0, start - 2):])


def pyspy_top(path, top):
    """Cumulative and self samples per function from py-spy's raw (collapsed) stacks, every
    thread together (this file's counting wrappers left out), and the samples per thread."""
    cum, own, per_thread = collections.Counter(), collections.Counter(), collections.Counter()
    total = 0
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        k = int(count)
        total += k
        frames = stack.split(";")
        if frames[0].startswith("thread ("):
            per_thread[frames.pop(0).split(": ", 1)[-1]] += k
        frames = [_frame(f) for f in frames if "count_calls.<locals>.wrapper" not in f]
        for f in set(frames):
            cum[f] += k
        if frames:
            own[frames[-1]] += k
    rows = ["  samples per thread: " + ", ".join(f"{t} {k / total * 100:.0f}%" for t, k in per_thread.most_common()),
            f"  {'cumulative':>10} {'self':>6}  function   ({total} samples)"]
    for f, k in cum.most_common(top):
        rows.append(f"  {k / total * 100:9.1f}% {own[f] / total * 100:5.1f}%  {f}")
    return rows


def _frame(f):
    """'Relay.step (relay/daemon.py:150)' -> 'Relay.step (relay/daemon.py)': lines merged."""
    name, _, where = f.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if where else name


# -- the drivers ---------------------------------------------------------------------------------

def cmd_daemon(args):
    sys.path.insert(0, str(HERE.parent.parent))
    from relay.bench import bench
    from relay.bench import sustained
    sys.path.insert(0, str(HERE.parent))
    from sustained import scenario_args

    out = Path(args.out or tempfile.mkdtemp(prefix="relay-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(HERE), "serve", "--out", str(out), "--profiler", args.profiler]
    if args.strace:
        cmd.append("--strace")
    work = Path(tempfile.mkdtemp(prefix="profile-", dir=args.dir))
    try:
        print(bench.create_cost_note(bench.cheap_creates(work, args.settle_timeout)))
        before = sustained.quiet_disk()
        row = sustained.scenario(work, args.scenario, cmd=cmd, **scenario_args(args, args.scenario))
    finally:
        # Deleted once the run is measured (the next run waits for creates to be cheap again).
        shutil.rmtree(work, ignore_errors=True)
    row.update(sustained.pressure(), load_before=before["load_avg"])
    print(sustained.table([row]))
    print(json.dumps(row))
    breakdown(out, written=row["written"])
    print(f"(files in {out})")


def cmd_once(args):
    import logging
    sys.path.insert(0, str(HERE.parent.parent))
    from relay.bench import bench
    from relay import config as config_mod
    from relay.core.daemon import Relay

    logging.getLogger("relay").setLevel(logging.WARNING)
    out = Path(args.out or tempfile.mkdtemp(prefix="relay-profile-once-"))
    out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="profile-once-", dir=args.dir))
    counters = Counters()
    instrument(counters)
    try:
        bench.make_backlog(root / ".relay", args.messages, args.agents)
        with Relay(config_mod.load(root, ".relay", env={})) as relay:
            instrument_instance(relay, counters)
            profiler = Profiler(args.profiler, out)
            strace = attach_strace(out) if args.strace else None
            t, cpu, before = time.perf_counter(), time.process_time(), threads_now()
            profiler.start()
            total = relay.drain()
            profiler.stop()
            if strace is not None:
                strace.send_signal(signal.SIGINT)
                strace.wait(60)
            took, cpu = time.perf_counter() - t, time.process_time() - cpu
            threads = threads_now(before)
            counters.c["messages archived"] = total.archived
    finally:
        shutil.rmtree(root, ignore_errors=True)
    (out / "counters.json").write_text(json.dumps({
        "counters": dict(counters.c), "batches": {str(k): v for k, v in sorted(counters.batches.items())},
        "threads": threads}, indent=1))
    print(json.dumps({"messages": args.messages, "archived": total.archived, "per_s": round(total.archived / took),
                      "cpu_s_per_1000": round(cpu / args.messages * 1000, 3), "profiler": args.profiler,
                      "load_avg": [round(x, 2) for x in os.getloadavg()]}))
    breakdown(out)
    print(f"(files in {out})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    serve = sub.add_parser("serve", help="be the daemon (relay run) with counters and a profiler")
    serve.add_argument("--out", required=True)
    serve.add_argument("--profiler", choices=["yappi", "cprofile", "pyspy", "none"], default="none")
    serve.add_argument("--strace", action="store_true")
    d = sub.add_parser("daemon", help="a sustained-load scenario with `serve` as the daemon")
    d.add_argument("--scenario", default="full, cap 50/agent")
    d.add_argument("--profiler", choices=["yappi", "cprofile", "pyspy", "none"], default="none")
    d.add_argument("--strace", action="store_true")
    d.add_argument("--agents", type=int, default=20)
    d.add_argument("--seconds", type=float, default=5.0)
    d.add_argument("--out")
    d.add_argument("--dir", default=tempfile.gettempdir())
    d.add_argument("--settle-timeout", type=float, default=400.0,
                   help="seconds to wait first, at most, for file creation to be cheap (0: do not wait)")
    o = sub.add_parser("once", help="relay.drain() on a backlog, with counters and a profiler")
    o.add_argument("--messages", type=int, default=5000)
    o.add_argument("--agents", type=int, default=20)
    o.add_argument("--profiler", choices=["yappi", "cprofile", "none"], default="cprofile")
    o.add_argument("--strace", action="store_true")
    o.add_argument("--out")
    o.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    if args.what == "daemon":
        args.full_seconds = args.seconds
        cmd_daemon(args)
    elif args.what == "once":
        cmd_once(args)
    else:
        sys.exit(cmd_serve(args))


if __name__ == "__main__":
    main()
