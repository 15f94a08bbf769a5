"""The scale figures behind README's Performance section.

    python benchmarks/scale.py ledger   [--rows 1000000] [--messages 5000]   throughput, empty vs full ledger
    python benchmarks/scale.py startup  [--rows 1000000] [--files 10000]     recovery + reconciliation + first scan
    python benchmarks/scale.py rss      [--files 100000]                      peak RSS while draining a backlog
    python benchmarks/scale.py agents   [--agents 1000] [--messages 3000]     1,000 outboxes, watched and served

Each prints one JSON line. Runs in a temporary directory (or --dir) on the disk under test.
"""
import argparse
import json
import logging
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from relay.bench import bench

from relay import config as config_mod
from relay.core.daemon import Relay

logging.getLogger("relay").setLevel(logging.CRITICAL)


def project(base):
    root = Path(tempfile.mkdtemp(dir=base, prefix="scale-"))
    return root, root / ".relay"


def drain_rate(base, messages, rows, durability="full"):
    root, state = project(base)
    try:
        bench.make_backlog(state, messages, 20)
        relay = Relay(config_mod.load(root, ".relay", env={}, overrides={"durability": durability}))
        if rows:
            bench.preload_ledger(relay.ledger, rows)
        t = time.perf_counter()
        total = relay.drain()
        took = time.perf_counter() - t
        relay.close()
        assert total.archived == messages, total
        return messages / took
    finally:
        shutil.rmtree(root, ignore_errors=True)


def cmd_ledger(args):
    empty = drain_rate(args.dir, args.messages, 0)
    full = drain_rate(args.dir, args.messages, args.rows)
    print(json.dumps({"figure": "throughput with a large ledger", "rows": args.rows, "messages": args.messages,
                      "empty_ledger_per_s": round(empty), "full_ledger_per_s": round(full),
                      "change_percent": round((full - empty) / empty * 100, 1), "target": "within 20%"}))


def cmd_startup(args):
    root, state = project(args.dir)
    try:
        bench.make_backlog(state, args.files, 20)
        cfg = config_mod.load(root, ".relay", env={})
        relay = Relay(cfg)
        bench.preload_ledger(relay.ledger, args.rows)
        # leave some rows processing, as a killed relay would
        relay.ledger.db.execute("UPDATE messages SET status = 'processing' WHERE rowid <= 100")
        relay.close()
        t = time.perf_counter()
        relay = Relay(cfg)
        relay.recover()
        while True:             # the first full scan registers every waiting file
            found = relay.intake.gather(relay.clock())
            relay.ledger.messages.register_and_claim(
                [(relay.ids.new(relay.clock()), f.sender, f.name, f.sent_at) for f in found], relay.clock(), 0, None)
            if relay.intake.scan is None:
                break
        took = time.perf_counter() - t
        first = relay.step()
        registered = relay.history.counts()["pending"] + first.claimed
        relay.close()
        print(json.dumps({"figure": "start-up: recovery + reconciliation + first scan", "rows": args.rows,
                          "files": args.files, "registered": registered, "seconds": round(took, 2),
                          "target": "under 3 s"}))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def cmd_rss(args):
    if args.child:
        root = Path(args.child)
        relay = Relay(config_mod.load(root, ".relay", env={}))
        t = time.perf_counter()
        total = relay.drain()
        took = time.perf_counter() - t
        relay.close()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps({"figure": "peak RSS draining a backlog", "files": args.files, "archived": total.archived,
                          "seconds": round(took, 1), "per_s": round(total.archived / took),
                          "peak_rss_mb": round(rss, 1), "target": "under 100 MB"}))
        return
    root, state = project(args.dir)
    try:
        bench.make_backlog(state, args.files, 20)
        subprocess.run([sys.executable, __file__, "rss", "--files", str(args.files), "--child", str(root)], check=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def cmd_agents(args):
    root, state = project(args.dir)
    try:
        names = bench.make_backlog(state, args.messages, args.agents)
        relay = Relay(config_mod.load(root, ".relay", env={}))
        t = time.perf_counter()
        total = relay.drain()
        took = time.perf_counter() - t
        relay.close()
        served = sum(1 for n in names if os.listdir(state / "inbox" / n / "new"))
        lat = bench.latency(args.dir, rate=100, seconds=3, agents=args.agents)
        print(json.dumps({"figure": f"{args.agents} agent outboxes", "backlog_per_s": round(args.messages / took),
                          "archived": total.archived, "agents_with_mail": served,
                          "daemon_latency_p50_ms": lat["p50_ms"], "daemon_latency_p99_ms": lat["p99_ms"],
                          "daemon_seen": f"{lat['delivered']}/{lat['messages']}"}))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["ledger", "startup", "rss", "agents"])
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--messages", type=int, default=5000)
    ap.add_argument("--files", type=int, default=None)
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.files is None:
        args.files = 100_000 if args.what == "rss" else 10_000
    if args.what == "agents" and args.messages == 5000:
        args.messages = 3000
    {"ledger": cmd_ledger, "startup": cmd_startup, "rss": cmd_rss, "agents": cmd_agents}[args.what](args)


if __name__ == "__main__":
    main()
