"""`relay inbox --wait` latency: from an envelope's link into new/ to the wait returning.

    python benchmarks/wait_latency.py [--rounds 200] [--cli-rounds 30] [--dir DIR]

Three figures (milliseconds, p50/p90/p99/max, one JSON line):
- api: a thread blocked in `relay.Agent.wait()`; the time from the link (made the way relay
  delivers: tmp/ file, fsync, link into new/) to `wait()` returning the message in that thread.
- api_ack: the same with `ack=True`: the message is also moved to cur/ before wait() returns
  (a rename, which may wait for the file system's journal).
- cli_ack_output / cli_ack_exit: a `relay inbox AGENT --wait --ack` process, already blocked;
  from the link to the first byte of its output, and to its exit (the interpreter's shutdown
  included).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

import relay
from relay.ids import IdGenerator


def figures(samples):
    s = sorted(samples)
    pick = lambda q: round(s[min(len(s) - 1, int(q * len(s)))] * 1000, 3)     # noqa: E731
    return {"n": len(s), "p50_ms": pick(0.5), "p90_ms": pick(0.9), "p99_ms": pick(0.99),
            "max_ms": round(s[-1] * 1000, 3), "mean_ms": round(statistics.fmean(s) * 1000, 3)}


def deliver(box, mid):
    """An envelope the way relay delivers one; returns the instant of the link."""
    tmp, new = box / "tmp" / f"{mid}.json", box / "new" / f"{mid}.json"
    with open(tmp, "wb") as f:
        f.write(orjson.dumps({"id": mid, "from": "Alice", "to": ["Bob"], "kind": "message", "body": "ping"}))
        f.flush()
        os.fsync(f.fileno())
    t0 = time.perf_counter()
    os.link(tmp, new)
    os.unlink(tmp)
    return t0


def api_round(bob, box, ids, ack):
    listening, done = threading.Event(), {}

    def waiter():
        got = bob.wait(timeout=30, ack=ack, listening=listening)
        done["t"] = time.perf_counter()
        done["got"] = got
    t = threading.Thread(target=waiter)
    t.start()
    listening.wait(10)
    time.sleep(0.002)           # the waiter is in its wait, not in its first look at new/
    t0 = deliver(box, ids.new(time.time()))
    t.join(30)
    assert done["got"], "the wait returned nothing"
    if not ack:
        bob.ack(done["got"])
    return done["t"] - t0


def cli_round(root, box, ids):
    p = subprocess.Popen([sys.executable, "-m", "relay", "--root", str(root), "inbox", "Bob", "--wait", "30", "--ack"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(0.6)             # the process has started and is blocked in its wait
    t0 = deliver(box, ids.new(time.time()))
    first = os.read(p.stdout.fileno(), 65536)
    t1 = time.perf_counter()
    out, err = p.communicate(timeout=30)
    t2 = time.perf_counter()
    assert p.returncode == 0 and b"ping" in first + out, (p.returncode, out, err)
    return t1 - t0, t2 - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--cli-rounds", type=int, default=30)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="relay-wait-", dir=args.dir) as d:
        root = Path(d)
        cfg = relay.load(root, ".relay", env={})
        from relay.files.layout import Layout
        Layout(cfg.root, cfg.state_dir).create().init(["Alice", "Bob"])
        box = root / ".relay" / "inbox" / "Bob"
        bob = relay.Agent("Bob", root=root)
        ids = IdGenerator()
        api = [api_round(bob, box, ids, False) for _ in range(args.rounds)]
        acked = [api_round(bob, box, ids, True) for _ in range(args.rounds)]
        cli = [cli_round(root, box, ids) for _ in range(args.cli_rounds)]
    print(json.dumps({"api": figures(api), "api_ack": figures(acked), "cli_ack_output": figures([c[0] for c in cli]),
                      "cli_ack_exit": figures([c[1] for c in cli])}))


if __name__ == "__main__":
    main()
