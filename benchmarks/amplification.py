"""Worst-case memory and disk amplification: what relay holds and writes per byte sent.

    python benchmarks/amplification.py --messages 40 --agents 10000

1. memory: `relay run --once` over N messages whose 1 MiB bodies are control bytes (each escaped
   to six in the JSON envelope), peak RSS of the process beside the bytes sent.
2. disk: one small broadcast to a team of M agents, bytes written into inboxes beside the bytes
   sent (an envelope per recipient; a broadcast's envelope does not list the team).
Prints the figures and ratios.
"""
import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time


def relay(root, *args):
    return subprocess.run([sys.executable, "-m", "relay", *args], env=dict(os.environ, RELAY_ROOT=str(root)),
                          capture_output=True, text=True, check=True)


def peak_rss_of(cmd, env):
    """Run `cmd` and return (seconds, peak RSS in MiB) of that child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.monotonic()
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    took = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return took, max(after, before) / 1024


def du(path):
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
    return total


def memory(n):
    with tempfile.TemporaryDirectory(prefix="relay-amp-") as root:
        relay(root, "init", "--agent", "Ann", "--agent", "Ben")
        body = "\x01" * (1024 * 1024 - 64)
        for i in range(n):
            with open(f"{root}/.relay/outbox/Ann/m{i}", "w") as f:
                f.write(f"TO: Ben\n\n{body}")
            os.utime(f"{root}/.relay/outbox/Ann/m{i}", (1_700_000_000, 1_700_000_000))
        sent = n * len(body)
        took, rss = peak_rss_of([sys.executable, "-m", "relay", "run", "--once", "-q"],
                                dict(os.environ, RELAY_ROOT=root))
        inbox = du(f"{root}/.relay/inbox/Ben")
        print(f"memory: {n} x 1 MiB bodies of control bytes ({sent / 2**20:.0f} MiB sent) relayed in {took:.1f}s; "
              f"peak RSS {rss:.0f} MiB ({rss / (sent / 2**20):.2f} x the bytes sent); "
              f"inbox {inbox / 2**20:.0f} MiB ({inbox / sent:.1f} x: each byte escaped to six)")


def disk(agents):
    with tempfile.TemporaryDirectory(prefix="relay-amp-") as root:
        names = [f"a{i:05d}" for i in range(agents)]
        os.makedirs(f"{root}/.relay", exist_ok=True)
        with open(f"{root}/.relay/relay.toml", "w") as f:
            f.write("agents = [" + ", ".join(f'"{n}"' for n in names) + "]\n")
        relay(root, "init")
        text = "TO: *\n\nhello, team"
        os.makedirs(f"{root}/.relay/outbox/a00000", exist_ok=True)
        with open(f"{root}/.relay/outbox/a00000/all", "w") as f:
            f.write(text)
        before = du(f"{root}/.relay/inbox")
        took, _ = peak_rss_of([sys.executable, "-m", "relay", "run", "--once", "-q"],
                              dict(os.environ, RELAY_ROOT=root))
        written = du(f"{root}/.relay/inbox") - before
        one = os.path.getsize(next(os.scandir(f"{root}/.relay/inbox/a00001/new")).path)
        print(f"disk: a {len(text)}-byte broadcast to {agents} agents in {took:.1f}s: envelope {one} bytes each, "
              f"{written / 2**20:.1f} MiB of inbox blocks in all ({written / agents:.0f} bytes per recipient, "
              f"the file system's block)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=40)
    ap.add_argument("--agents", type=int, default=10000)
    args = ap.parse_args()
    memory(args.messages)
    disk(args.agents)


if __name__ == "__main__":
    main()
