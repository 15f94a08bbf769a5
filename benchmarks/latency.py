"""Daemon latency: from a file's rename into an outbox to its envelope in the recipient's new/.

    python benchmarks/latency.py [--rate 100] [--seconds 10] [--agents 8] [--durability full]

Starts `relay run` as a process, offers messages at a steady rate from several agents, and
prints p50/p99/max in milliseconds and the daemon's CPU at idle (one JSON line).
"""
import argparse
import json
import tempfile

from relay.bench import bench


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--durability", choices=["full", "normal"], default="full")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    print(json.dumps(bench.latency(args.dir, args.rate, args.seconds, args.agents, args.durability)))


if __name__ == "__main__":
    main()
