"""Where a cross-node message's time goes: `benchmarks/federation.py latency` with both daemons
timing the stages of each message on its way, by id, then the p50/p90/p99 of each stage.

    python benchmarks/fedstages.py --rate 100 --seconds 10

The daemons are started with a `sitecustomize` of this script's own on their PYTHONPATH, which
wraps these steps (time.time_ns before and after each call, per message id):

    n1  (the file's mtime)  written and renamed into the outbox by the benchmark
        Messages.register_and_claim the step that found it: its register and claim
        Pipeline.process    the claimed batch: parse, claim sync, custody, offer, ...
        Router.offer        the message handed to the link
        Publisher._xadd     its XADD (before, after): the publisher's round trip, or
        Wire.send           the XADD written by the loop itself (its reply read by the publisher)
    n2  Incoming.handle     the read entry handled: checks, then ...
        Inbox.deliver       the envelope written, fsynced and linked into new/ (before, after)

Last, the floor of the server's hop on this machine: an XADD of plain redis-py to another
process blocked in XREAD (two wake-ups: the server's, the reader's), at the same rate.

Timing costs a little itself (the stages read slightly long); the script prints the benchmark's
own figures beside the stages'. Nothing of relay is changed on disk.
"""
import argparse
import collections
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SITE = r'''
import functools, importlib, os, threading, time
EVENTS = []
def _ids(kind):
    if kind == "register":
        return lambda a: [r[0] for r in a[1]]
    if kind == "rows":
        return lambda a: [r["id"] for r in a[1]]
    if kind == "offer":
        return lambda a: [w.id for w in a[1] if w.remote]
    if kind == "xadd":
        return lambda a: [e[0] for e in a[1]]
    if kind == "entries":
        return lambda a: [(f.get(b"id") or b"").decode() for _, _, f in a[1] if isinstance(f, dict)]
    return lambda a: [w.id for w in a[1]]
TARGETS = [("relay.ledger.messages", "Messages", "register_and_claim", "register"),
           ("relay.core.pipeline", "Pipeline", "process", "rows"), ("relay.core.routes", "Router", "offer", "offer"),
           ("relay.federation.publisher", "Publisher", "_xadd", "xadd"), ("relay.federation.wire", "Wire", "send", "xadd"),
           ("relay.federation.receiver", "Incoming", "handle", "entries"), ("relay.core.inbox", "Inbox", "deliver", "works")]
def _wrap(name, f, ids, kind):
    @functools.wraps(f)
    def timed(*a, **k):
        t = time.time_ns()
        try:
            return f(*a, **k)
        finally:
            t2 = time.time_ns()
            try:
                EVENTS.extend((name, i, t, t2) for i in ids(a))
                if kind == "register":      # the file's mtime: when it was written (and renamed)
                    EVENTS.extend(("written", r[0], int(r[3] * 1e9), 0) for r in a[1])
            except Exception:
                pass
    return timed
def _patch():
    for mod, cls, fn, kind in TARGETS:
        c = getattr(importlib.import_module(mod), cls)
        name = "XADD" if kind == "xadd" else f"{cls}.{fn}"      # by the publisher, or written by the loop
        setattr(c, fn, _wrap(name, getattr(c, fn), _ids(kind), kind))
def _dump():
    with open(os.environ["RELAY_STAGES"] + f".{os.getpid()}", "w") as f:
        f.writelines("%s %s %d %d\n" % e for e in list(EVENTS))
def _run():
    time.sleep(0.3)         # relay imported by then (python -m relay run)
    _patch()
    while True:
        time.sleep(1)
        _dump()
if os.environ.get("RELAY_STAGES"):
    threading.Thread(target=_run, daemon=True).start()
'''

STAGES = [("n1", "written", 0), ("n1", "Messages.register_and_claim", 0), ("n1", "Pipeline.process", 0), ("n1", "Router.offer", 0), ("n1", "XADD", 0),
          ("n1", "XADD", 1), ("n2", "Incoming.handle", 0), ("n2", "Inbox.deliver", 0),
          ("n2", "Inbox.deliver", 1)]
NAMES = ["written to the step's register and claim", "register and claim (commit, unsynced)", "claim sync, custody, up to the offer", "hand-off to the XADD", "XADD (written, or round trip)",
         "the server to the receiver's handling", "the receiver's checks before writing",
         "envelope written, fsynced, linked"]


def join(prefix):
    events = collections.defaultdict(dict)
    for path in glob.glob(prefix + ".*"):
        lines = Path(path).read_text().splitlines()
        node = "n1" if any(line.startswith("Router.offer") for line in lines) else "n2"
        for line in lines:
            name, mid, t, t2 = line.split()
            events[mid].setdefault((node, name), (int(t), int(t2)))
    rows = [[e[(node, name)][k] for node, name, k in STAGES] for e in events.values()
            if all((node, name) in e for node, name, _ in STAGES)]
    return rows


HOP = r'''
import sys, time, redis
r = redis.Redis.from_url(sys.argv[1])
last, out = "$", []
while len(out) < int(sys.argv[2]):
    got = r.xread({"s": last}, block=5000, count=16)
    if not got:
        break
    t = time.time_ns()
    for _, entries in got:
        for eid, fields in entries:
            last = eid
            out.append(t - int(fields[b"t"]))
print(" ".join(map(str, out)))
'''


def hop(count=500, rate=100.0):
    """The server's hop alone, the floor of "XADD to the receiver": an XADD of redis-py to a
    process blocked in XREAD on the same redis-server, messages 1/rate apart (us per entry)."""
    import importlib.util
    import redis
    spec = importlib.util.spec_from_file_location("fedkit", Path(__file__).parent / "fedkit.py")
    fedkit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fedkit)
    base = Path(tempfile.mkdtemp(prefix="relay-hop-"))
    server = fedkit.RedisServer(base / "redis", appendfsync="everysec").start()
    try:
        reader = subprocess.Popen([sys.executable, "-c", HOP, server.url, str(count)], stdout=subprocess.PIPE, text=True)
        writer = redis.Redis.from_url(server.url)
        while not any(c.get("cmd") == "xread" for c in writer.client_list()):
            time.sleep(0.01)
        for _ in range(count):
            writer.xadd("s", {"t": str(time.time_ns()), "env": "x" * 400})
            time.sleep(1 / rate)
        out, _ = reader.communicate(timeout=30)
        return [int(v) / 1000 for v in out.split()]
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="relay-fedstages-"))
    (work / "sitecustomize.py").write_text(SITE)
    prefix = str(work / "events")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(work), os.environ.get("PYTHONPATH")])),
               RELAY_STAGES=prefix)
    try:
        out = subprocess.run([sys.executable, str(Path(__file__).parent / "federation.py"), "latency", "--rate",
                              str(args.rate), "--seconds", str(args.seconds)], env=env, capture_output=True, text=True)
        print(out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr.strip()[-500:])
        rows = join(prefix)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not rows:
        print("no message was seen at every stage", file=sys.stderr)
        sys.exit(1)
    print(f"{len(rows)} messages timed at every stage (us):")
    print(f"  {'stage':<42} {'p50':>8} {'p90':>8} {'p99':>8}")
    for j, name in enumerate(NAMES, start=1):
        spans = [(r[j] - r[j - 1]) / 1000 for r in rows]
        print(f"  {name:<42} {pct(spans, .5):8.0f} {pct(spans, .9):8.0f} {pct(spans, .99):8.0f}")
    whole = [(r[-1] - r[0]) / 1000 for r in rows]
    print(f"  {'the claimed batch to the link in new/':<42} {pct(whole, .5):8.0f} {pct(whole, .9):8.0f} "
          f"{pct(whole, .99):8.0f}")
    alone = hop(rate=args.rate)
    if alone:
        print(f"  {'(floor) the server hop alone, XADD to XREAD':<42} {pct(alone, .5):8.0f} {pct(alone, .9):8.0f} "
              f"{pct(alone, .99):8.0f}")


if __name__ == "__main__":
    main()
