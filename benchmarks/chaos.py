"""Randomized soak: producers keep writing while the daemon is killed with SIGKILL at random
instants, again and again; at the end every recipient must hold every message exactly once.

    python benchmarks/chaos.py --cycles 200 --messages 5000 --seed 1

Prints kills, messages, lost, duplicated and left; exits 1 when any of the last three is not 0.
"""
import argparse
import collections
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

AGENTS = ["A0", "A1", "A2", "A3"]


def producer(state, count, seed, expected, done):
    rnd = random.Random(seed)
    for i in range(count):
        sender = rnd.choice(AGENTS)
        others = [a for a in AGENTS if a != sender]
        token = f"t{seed}-{i}"
        roll = rnd.random()
        if roll < 0.1:
            to, recipients = "*", others
        else:
            recipients = rnd.sample(others, rnd.choice([1, 1, 2]))
            to = ", ".join(recipients)
        text = f"TO: {to}\n\n{token}"
        box = state / "outbox" / sender
        mode = rnd.random()
        if mode < 0.2 and not (box / "msg").exists():
            name = "msg"                            # agent-relay style name reuse
        else:
            name = f"m-{token}"
        if 0.2 <= mode < 0.4:                       # written in place, with a pause while open
            with open(box / name, "w") as f:
                f.write(text[: len(text) // 2])
                f.flush()
                time.sleep(rnd.uniform(0, 0.02))
                f.write(text[len(text) // 2:])
        else:
            tmp = box / f".{name}.tmp"
            tmp.write_text(text)
            os.rename(tmp, box / name)
        for r in recipients:
            expected[(r, token)] += 1
        time.sleep(rnd.uniform(0, 0.004))
    done.set()


def start(root):
    # Kills here land at random, never because of a message: the claim budget (a message being
    # handled when relay stopped max_retries times is quarantined; tests/test_claim_budget.py)
    # is set out of reach, so that what this soak counts is delivery, exactly once.
    env = dict(os.environ, RELAY_ROOT=str(root), RELAY_AGENTS=",".join(AGENTS), RELAY_SETTLE="100ms",
               RELAY_LOG_LEVEL="ERROR", RELAY_RESCAN_INTERVAL="2s", RELAY_MAX_RETRIES="1000000")
    return subprocess.Popen([sys.executable, "-m", "relay", "run"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def settled(state):
    outbox_left = [p for p in (state / "outbox").rglob("*") if p.is_file()]
    if outbox_left or [p for p in (state / "spool").rglob("*") if p.is_file()]:
        return False
    db = sqlite3.connect(f"file:{state / 'ledger.sqlite'}?mode=ro", uri=True)
    try:
        n = db.execute("SELECT count(*) FROM messages WHERE status IN ('pending','processing','delivered')"
                       ).fetchone()[0]
    finally:
        db.close()
    return n == 0


def run(cycles, messages, seed, keep=False, echo=print):
    root = Path(tempfile.mkdtemp(prefix="relay-chaos-"))
    state = root / ".relay"
    subprocess.run([sys.executable, "-m", "relay", "--root", str(root), "init",
                    *sum((["--agent", a] for a in AGENTS), [])], check=True, capture_output=True)
    rnd = random.Random(seed)
    expected = collections.Counter()
    done = threading.Event()
    thread = threading.Thread(target=producer, args=(state, messages, seed, expected, done))
    thread.start()
    kills = 0
    proc = start(root)
    while kills < cycles or not done.is_set():
        time.sleep(rnd.uniform(0.02, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        proc = start(root)
    thread.join()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not settled(state):
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    held = collections.Counter()
    for agent in AGENTS:
        for sub in ("new", "cur"):
            for p in (state / "inbox" / agent / sub).iterdir():
                held[(agent, json.loads(p.read_bytes())["body"])] += 1
    lost = sum(1 for k in expected if held[k] == 0)
    duplicated = sum(1 for k, n in held.items() if n > 1)
    unexpected = sum(1 for k in held if k not in expected)
    left = len([p for sub in ("outbox", "spool") for p in (state / sub).rglob("*") if p.is_file()])
    result = {"kills": kills, "messages": messages, "deliveries": sum(expected.values()), "lost": lost,
              "duplicated": duplicated, "unexpected": unexpected, "left": left, "dir": str(root)}
    echo(json.dumps(result))
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=20, help="SIGKILLs at least (default 20)")
    ap.add_argument("--messages", type=int, default=500, help="messages written (default 500)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the project directory")
    args = ap.parse_args()
    r = run(args.cycles, args.messages, args.seed, args.keep)
    sys.exit(1 if r["lost"] or r["duplicated"] or r["unexpected"] or r["left"] else 0)


if __name__ == "__main__":
    main()
