"""The daemon under sustained load: producer processes writing while `relay run` delivers.

    python benchmarks/sustained.py [--agents 20] [--rates 100,700,1000] [--seconds 10]
                                   [--full-seconds 5] [--cap 50] [--many-agents 1000] [--repeat 1] [--dir DIR]
                                   [--settle-timeout 400]
    python benchmarks/sustained.py --only "full, cap 50/agent" --daemon-cmd "python benchmarks/profile_daemon.py serve --out p"

Starts `relay run` as a process on a fresh project in a temporary directory under --dir (default:
the system's temporary directory; the table's first line names its file system), then producer processes (one
per agent, at most 20; each of the 1,000-outbox run's 20 producers writes for 50 agents) that
write a dot-temporary file and rename it into their outbox, at each offered total rate, then as
fast as they can (closed loop: at most --cap files waiting per outbox; open loop, last: unbounded).

Figures per run: delivered msg/s, p50/p95/p99 latency from the rename to the envelope's link into
new/ (inotify), the daemon's CPU seconds per 1,000 messages, its peak RSS, the producers' own rate
and CPU; then `run --once` and the naive durable loop on a backlog of the size the full-speed run
delivered, the daemon's idle CPU, each with the load average. A table, then one JSON line.
(relay/sustained.py is the machinery; `relay bench --sustained` is a short run of it.)
"""
import argparse
import json
import logging
import shlex
import shutil
import tempfile
from pathlib import Path

from relay.bench import bench

from relay.bench import sustained

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=20)
    ap.add_argument("--rates", default="100,700,1000", help="offered total msg/s, comma-separated ('' for none)")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each fixed-rate run")
    ap.add_argument("--full-seconds", type=float, default=5.0, help="length of each full-speed run (0: none)")
    ap.add_argument("--cap", type=int, default=50, help="closed loop: files waiting per outbox at most")
    ap.add_argument("--many-agents", type=int, default=1000, help="the many-outboxes run's agents (0: none)")
    ap.add_argument("--many-rate", type=float, default=100.0)
    ap.add_argument("--idle-seconds", type=float, default=3.0)
    ap.add_argument("--no-once", action="store_true", help="leave out run --once and the naive loop")
    ap.add_argument("--repeat", type=int, default=1, help="runs per scenario; the median run is shown, the spread beside")
    ap.add_argument("--only", help="run this one scenario (a label as the table prints it, e.g. 'rate 100')")
    ap.add_argument("--daemon-cmd", help="the command that serves the project instead of `python -m relay run`")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where (its file system is the one measured)")
    ap.add_argument("--keep", action="store_true",
                    help="leave the projects (in a directory it names) instead of deleting them at the end")
    ap.add_argument("--settle-timeout", type=float, default=400.0,
                    help="seconds to wait first, at most, for file creation to be cheap (0: do not wait)")
    args = ap.parse_args()
    logging.getLogger("relay").setLevel(logging.WARNING)
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="sustained-", dir=base))
    cmd = shlex.split(args.daemon_cmd) if args.daemon_cmd else None
    try:
        if args.only:
            print(bench.create_cost_note(bench.cheap_creates(work, args.settle_timeout)))
            before = sustained.quiet_disk()
            row = sustained.scenario(work, args.only, cmd=cmd, **scenario_args(args, args.only))
            row.update(sustained.pressure(), load_before=before["load_avg"])
            print(sustained.table([row]))
            print(json.dumps(row))
            return
        rates = [float(r) for r in args.rates.split(",") if r.strip()]
        out = sustained.run(work, agents=args.agents, rates=rates, seconds=args.seconds,
                            full_seconds=args.full_seconds, cap=args.cap, many_agents=args.many_agents,
                            settle_timeout=args.settle_timeout,
                            many_rate=args.many_rate, idle_seconds=args.idle_seconds, once=not args.no_once,
                            cmd=cmd, repeat=args.repeat, keep=args.keep)
        print(json.dumps(out))
    finally:
        if args.keep:
            print(f"the projects are left in {work / bench.TRASH}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def scenario_args(args, label):
    """The keyword arguments of sustained.scenario for a label of the table."""
    if label.startswith("rate "):
        return dict(rate=float(label.split()[1]), seconds=args.seconds, agents=args.agents)
    if label == "full, open loop":
        return dict(rate=None, seconds=args.full_seconds, agents=args.agents)
    if label.startswith("full, cap "):
        return dict(rate=None, seconds=args.full_seconds, agents=args.agents, cap=int(label.split()[2].split("/")[0]))
    if "outboxes" in label:
        return dict(rate=float(label.split()[-1]), seconds=args.seconds, agents=int(label.split()[0]))
    raise SystemExit(f"--only: no scenario {label!r}; one of 'rate N', 'full, open loop', 'full, cap N/agent', "
                     "'N outboxes, rate R'")


if __name__ == "__main__":
    main()
