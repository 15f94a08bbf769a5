"""Federation soak: two nodes (n1 with A0, A1; n2 with B0, B1) and one redis-server (AOF,
appendfsync always) on this machine. Producers on both nodes write messages to agents of either
node (some to `*`) while either node is killed with SIGKILL again and again, and the server a
few times; at the end every recipient must hold every message addressed to it exactly once.

    python benchmarks/fedchaos.py --kills 60 --server-kills 4 --messages 3000 --seed 1

Prints kills, server kills, messages, deliveries, lost, duplicated, unexpected and left (one JSON
line); exits 1 when any of the last four is not 0. `left` counts files still in an outbox or
the spool, outbound rows not acknowledged by their node and stream entries not deleted.
"""
import argparse
import collections
import importlib.util
import json
import os
import random
import shutil
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

_spec = importlib.util.spec_from_file_location("fedkit", Path(__file__).parent / "fedkit.py")
fedkit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fedkit)

NODES = {"n1": ["A0", "A1"], "n2": ["B0", "B1"]}
EVERYONE = [a for agents in NODES.values() for a in agents]
TEAM = "chaos"


def producer(state, agents, count, seed, expected, lock, done):
    rnd = random.Random(seed)
    for i in range(count):
        sender = rnd.choice(agents)
        others = [a for a in EVERYONE if a != sender]
        token = f"t{seed}-{i}"
        if rnd.random() < 0.1:
            to, recipients = "*", others
        else:
            recipients = rnd.sample(others, rnd.choice([1, 1, 2]))
            to = ", ".join(recipients)
        with lock:
            for r in recipients:
                expected[(r, token)] += 1
        fedkit.drop(state, sender, f"m-{token}", f"TO: {to}\n\n{token}")
        time.sleep(rnd.uniform(0, 0.006))
    done.set()


def query(state, sql):
    db = sqlite3.connect(f"file:{state / 'ledger.sqlite'}?mode=ro", uri=True, timeout=10)
    try:
        return db.execute(sql).fetchone()[0]
    finally:
        db.close()


def leftovers(states, server):
    """What is not finished yet: files in outboxes and spools, rows not done, entries not acked."""
    left = 0
    for state in states:
        left += len([p for sub in ("outbox", "spool") for p in (state / sub).rglob("*") if p.is_file()])
        left += query(state, "SELECT count(*) FROM messages WHERE status IN ('pending', 'processing', 'delivered')")
        left += query(state, "SELECT count(*) FROM outbound WHERE status IN ('pending', 'published')")
    import redis
    r = redis.Redis.from_url(server.url, socket_timeout=5)
    try:
        for sender in NODES:
            for receiver in NODES:
                if sender != receiver:
                    left += r.xlen(f"relay:{{{TEAM}}}:from:{sender}:to:{receiver}")
    finally:
        r.close()
    return left


def known(state, name):
    try:
        return bool(query(state, f"SELECT count(*) FROM remote_agents WHERE name = '{name}'"))
    except sqlite3.Error:
        return False


def run(kills, server_kills, messages, seed, keep=False, echo=print):
    rnd = random.Random(seed)
    base = Path(tempfile.mkdtemp(prefix="relay-fedchaos-"))
    server = fedkit.RedisServer(base / "redis").start()
    states = {n: fedkit.write_config(base / n, server.url, TEAM, n, agents) for n, agents in NODES.items()}
    # Kills here land at random, never because of a message: the claim budget (a message being
    # handled when relay stopped max_retries times is quarantined; tests/test_claim_budget.py) is
    # set out of reach, as in chaos.py, or a batch killed three times is counted lost.
    env = {"RELAY_LOG_LEVEL": "WARNING", "RELAY_RESCAN_INTERVAL": "2s", "RELAY_MAX_RETRIES": "1000000"}
    procs = {n: fedkit.start_daemon(base / n, base, env) for n in NODES}
    deadline = time.monotonic() + 60
    while not (known(states["n1"], "B0") and known(states["n2"], "A0")):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the nodes did not see each other; logs in {base}")
        time.sleep(0.05)
    expected, lock = collections.Counter(), threading.Lock()
    dones = []
    threads = []
    for k, (n, agents) in enumerate(NODES.items()):
        done = threading.Event()
        dones.append(done)
        threads.append(threading.Thread(target=producer, args=(states[n], agents, messages // 2, seed * 10 + k,
                                                                expected, lock, done)))
    for t in threads:
        t.start()
    killed = server_killed = 0
    every = max(1, kills // (server_kills + 1))
    while killed < kills or not all(d.is_set() for d in dones):
        time.sleep(rnd.uniform(0.05, 0.4))
        node = rnd.choice(list(NODES))
        procs[node].send_signal(signal.SIGKILL)
        procs[node].wait()
        killed += 1
        procs[node] = fedkit.start_daemon(base / node, base, env)
        if server_killed < server_kills and killed % every == 0:
            server.stop(signal.SIGKILL)
            server_killed += 1
            time.sleep(rnd.uniform(0.2, 1.5))
            server.start()
    for t in threads:
        t.join()
    deadline = time.monotonic() + 180
    left = None
    while time.monotonic() < deadline:
        left = leftovers(states.values(), server)
        if not left:
            break
        time.sleep(0.2)
    for p in procs.values():
        p.send_signal(signal.SIGTERM)
    for p in procs.values():
        p.wait(timeout=60)
    held = collections.Counter()
    for n, agents in NODES.items():
        for agent in agents:
            for env_doc in fedkit.held(states[n], agent):
                held[(agent, env_doc["body"])] += 1
    left = leftovers(states.values(), server)
    server.stop()
    result = {"kills": killed, "server_kills": server_killed, "messages": messages,
              "deliveries": sum(expected.values()), "lost": sum(1 for k in expected if held[k] == 0),
              "duplicated": sum(1 for k, n in held.items() if n > 1),
              "unexpected": sum(1 for k in held if k not in expected), "left": left, "dir": str(base)}
    echo(json.dumps(result))
    if not keep:
        shutil.rmtree(base, ignore_errors=True)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=50, help="SIGKILLs of a node, at least (default 50)")
    ap.add_argument("--server-kills", type=int, default=3, help="SIGKILLs of the server (default 3)")
    ap.add_argument("--messages", type=int, default=2000, help="messages written, half on each node (default 2000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the directory (logs, ledgers, inboxes)")
    args = ap.parse_args()
    if fedkit.REDIS_SERVER is None:
        print(fedkit.MISSING, file=sys.stderr)
        sys.exit(2)
    r = run(args.kills, args.server_kills, args.messages, args.seed, args.keep)
    sys.exit(1 if r["lost"] or r["duplicated"] or r["unexpected"] or r["left"] else 0)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
