"""relay web on a ledger of 100,000 messages: the time to answer a page (the issue asks under 50 ms
of server time), and how soon a delivery reaches an open live stream.

    python benchmarks/web_page.py [--rows 100000] [--messages 2000] [--repeat 20]

The ledger holds `rows` archived messages (bench.preload_ledger) and `messages` more drained by
the relay (with deliveries, the search index, a thread). Each address is asked `repeat` times
from this process over HTTP to the server on its thread: the figures are the whole answer
(request, handler, template, response), so server time is at most that. Prints one JSON line.
"""
import argparse
import json
import logging
import shutil
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from relay import config as config_mod
from relay.bench import bench
from relay.core.daemon import Relay
from relay.web.server import Server

logging.getLogger("relay").setLevel(logging.CRITICAL)


def fill(root, rows, messages):
    state = root / ".relay"
    bench.make_backlog(state, messages, 20)
    for i in range(0, messages, 50):        # one thread among them
        path = state / "outbox" / f"agent{i % 20:03d}" / f"m{i}"
        text = path.read_text().replace("SUBJECT:", "THREAD: bench-thread\nSUBJECT:", 1)
        path.write_text(text)
    relay = Relay(config_mod.load(root, ".relay", env={}))
    bench.preload_ledger(relay.ledger, rows)
    relay.drain()
    relay.close()


def ask(srv, path):
    req = urllib.request.Request(srv.base + path, headers={"Authorization": f"Bearer {srv.token}"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()
        assert r.status == 200, (path, r.status)
    return (time.perf_counter() - t) * 1000


def live_latency(root, srv, samples=10):
    """ms from a message dropped into an outbox (and drained at once) to its update read from an
    open stream: the relay's own drain included."""
    req = urllib.request.Request(srv.base + "/events", headers={"Authorization": f"Bearer {srv.token}"})
    stream = urllib.request.urlopen(req, timeout=30)
    stream.readline(), stream.readline()
    got, out = threading.Event(), []

    def read():
        while True:
            try:
                line = stream.readline()
            except (OSError, AttributeError, ValueError):      # the stream closed under the reader
                return
            if not line:
                return
            if line.startswith(b"data:"):
                out.append(time.perf_counter())
                got.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    relay = Relay(config_mod.load(root, ".relay", env={}))
    lat = []
    time.sleep(0.5)
    for i in range(samples):
        got.clear()
        done = time.perf_counter()
        (root / ".relay" / "outbox" / "agent000" / f"live{i}").write_text("TO: agent001\n\nlive")
        relay.drain()
        got.wait(5)
        lat.append((out[-1] - done) * 1000 if got.is_set() else None)
        time.sleep(0.05)
    relay.close()
    stream.close()
    return lat


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(dir=args.dir, prefix="web-"))
    try:
        fill(root, args.rows, args.messages)
        srv = Server(config_mod.load(root, ".relay", env={})).start()
        try:
            first = ask(srv, "/messages")
            body = urllib.request.urlopen(urllib.request.Request(
                srv.base + "/messages?from=agent003", headers={"Authorization": f"Bearer {srv.token}"})).read().decode()
            mid = body.split('data-id="', 1)[1][:26]
            paths = ["/messages", "/messages?from=agent003", "/messages?to=agent007", "/messages?agent=agent011",
                     "/messages?status=archived", "/messages?kind=message", "/messages?q=bench",
                     "/messages?thread=bench-thread", "/messages?since=1h&status=archived",
                     "/messages?from=agent003&before=" + mid, "/messages?kind=nothing", "/messages?since=2099-01-01",
                     "/messages?until=2000-01-01", "/messages?to=nobody", f"/messages/{mid}", "/threads/bench-thread",
                     "/agents", "/", "/metrics"]
            figures = {}
            for p in paths:
                ask(srv, p)
                times = sorted(ask(srv, p) for _ in range(args.repeat))
                figures[p] = {"median_ms": round(statistics.median(times), 1),
                              "p95_ms": round(times[int(len(times) * 0.95) - 1], 1)}
            live = live_latency(root, srv)
        finally:
            srv.stop()
        seen = [x for x in live if x is not None]
        print(json.dumps({"figure": "relay web page time", "rows": args.rows + args.messages, "first_ms": round(first, 1),
                          "pages": figures, "target_ms": 50,
                          "live_ms": {"median": round(statistics.median(seen), 1) if seen else None,
                                      "max": round(max(seen), 1) if seen else None, "missed": len(live) - len(seen)}}))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
