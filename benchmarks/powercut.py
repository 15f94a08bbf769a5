"""Power-loss soak: relay on a LazyFS mount, the power cut at random instants again and again; after
each cut and one recovery pass, every durably sent message must be in each recipient's inbox
exactly once and complete, with nothing left behind.

    python benchmarks/powercut.py --lazyfs /path/to/lazyfs --mode both --cuts 40 --messages 60 --seed 1

LazyFS (FUSE) keeps written data in its own cache until the file is fsynced; `lazyfs::clear-cache`
drops every unsynced byte, as a power cut does (kill -9 never tests fsync: the kernel keeps the
data). A cut: SIGKILL relay and the producers, clear the cache, unmount, mount the same backing
directory again, `relay run --once` to recover, count. Producers (child processes) write durably
(dot-tmp file, fsync, rename into outbox/<agent>/, fsync the directory; sent = that returned) to
1-3 of 4 agents or `TO: *`, reusing a file name now and then. `--mode once` cuts during `relay run
--once` over --messages new messages (sometimes just after it exited 0); `--mode daemon` cuts while
producers send to `relay run` at up to 300 msg/s (--messages a cut on average). A project lives for
8 cuts (later cuts hit its history); a trial where LazyFS itself crashed or deadlocked is rerun on
a fresh project. `--control`: the same on a plain directory, kill -9 only.

One line per cut (counts over the project after its recovery pass), one summary per mode:
`powercut once: 40 cuts, N messages, lost 0, duplicated 0, stuck 0, damaged 0`. Lost/duplicated:
deliveries (message x recipient) with no complete envelope, or several, in new/ or cur/; stuck:
messages left in outbox/, spool/ or pending/processing in the ledger; damaged: empty or unparsable
envelopes (counted as lost too). Exit 1 when any is not 0 or a recovery pass failed; 2 without a
LazyFS binary (--lazyfs or env LAZYFS). Everything lives in one temporary directory, unmounted and
removed at exit, also on Ctrl-C (--keep keeps it).
"""
import argparse
import collections
import contextlib
import errno
import json
import os
import random
import select
import shlex
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
PRODUCERS = 2
RATE = 300                  # daemon mode: messages/s from all producers together
CUTS_PER_PROJECT = 8
CHILDREN = []               # every process this script started, killed at exit


class LazyFSCrash(Exception):
    """LazyFS itself crashed or hung: the trial says nothing about relay."""


def produce(state, prefix, reuse, seed, rate, count):
    """Child process: write `count` messages durably; print `token recipients` once each is."""
    rnd = random.Random(seed)
    dirs = {a: os.open(f"{state}/outbox/{a}", os.O_RDONLY | os.O_DIRECTORY) for a in AGENTS}
    t0 = time.monotonic()
    for i in range(count):
        sender = rnd.choice(AGENTS)
        others = [a for a in AGENTS if a != sender]
        token, roll = f"{prefix}-{i}", rnd.random()
        rcpt = others if roll < 0.1 else rnd.sample(others, 1 if roll < 0.7 else rnd.choice([2, 3]))
        box = f"{state}/outbox/{sender}"
        name = reuse if rnd.random() < 0.2 and not os.path.exists(f"{box}/{reuse}") else f"m-{token}"
        fd = os.open(f"{box}/.{token}.tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, f"TO: {'*' if roll < 0.1 else ', '.join(rcpt)}\n\n{token}".encode())
        os.fsync(fd)
        os.close(fd)
        os.rename(f"{box}/.{token}.tmp", f"{box}/{name}")
        os.fsync(dirs[sender])
        os.write(1, f"{token} {','.join(rcpt)}\n".encode())
        if rate:
            time.sleep(max(0.0, t0 + (i + 1) / rate - time.monotonic()))


def spawn(cmd, **kw):
    p = subprocess.Popen(cmd, start_new_session=True, **kw)
    CHILDREN.append(p)
    return p


def reap(p, timeout=10):
    if p.poll() is None:
        p.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=timeout)


def bounded(fn, timeout=30):
    """fn(), which touches the mount, in a thread: a hung LazyFS must not hang the soak."""
    box = {}

    def run():
        try:
            box["v"] = fn()
        except Exception as e:
            box["e"] = e
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise LazyFSCrash("LazyFS hung")
    if isinstance(box.get("e"), OSError) and box["e"].errno in (errno.ENOTCONN, errno.ECONNABORTED):
        raise LazyFSCrash(f"LazyFS died ({box['e']})")
    if "e" in box:
        raise box["e"]
    return box["v"]


def mounted(path):
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == str(path) for line in f)


def sync(d, files):
    for fd in [os.open(os.path.join(d, f), os.O_RDONLY) for f in files] + [os.open(d, os.O_RDONLY)]:
        os.fsync(fd)
        os.close(fd)


class Disk:
    """A project's file system: a LazyFS mount over a backing directory, or a plain directory."""

    def __init__(self, base, lazyfs):
        self.dir = Path(tempfile.mkdtemp(prefix="project_", dir=base))
        self.root, self.backing, self.lazyfs, self.proc = self.dir / "mnt", self.dir / "backing", lazyfs, None
        self.root.mkdir()
        self.backing.mkdir()
        self.fifo, self.done, self.config = (self.dir / n for n in ("faults.fifo", "completed.fifo", "lazyfs.toml"))
        if "-o" in str(self.config).lower():   # LazyFS takes such a --config-path for an option
            sys.exit(f"powercut: LazyFS cannot take a config path containing '-o': {self.config} (set TMPDIR)")
        self.config.write_text(f'[faults]\nfifo_path = "{self.fifo}"\nfifo_path_completed = "{self.done}"\n'
                               '[cache]\napply_eviction = false\n[cache.simple]\ncustom_size = "128mb"\n'
                               'blocks_per_page = 1\n[filesystem]\nlog_all_operations = false\n'
                               f'logfile = "{self.dir / "lazyfs.log"}"\n')

    def mount(self):
        if not self.lazyfs:
            return
        with open(self.dir / "lazyfs.out", "ab") as log:
            self.proc = spawn([self.lazyfs, str(self.root), "--config-path", str(self.config), "-o", "allow_other",
                               "-o", "modules=subdir", "-o", f"subdir={self.backing}", "-f"], stdout=log, stderr=log)
        deadline = time.monotonic() + 15
        while not mounted(self.root):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise LazyFSCrash(f"mount failed (exit {self.proc.poll()})")
            time.sleep(0.01)

    def healthy(self):
        """LazyFS runs and answers a create, fsync and unlink (it deadlocks now and then)."""
        def probe():
            with open(self.root / ".relay" / ".probe.tmp", "w") as f:
                os.fsync(f.fileno())
            os.unlink(self.root / ".relay" / ".probe.tmp")
            return self.proc.poll() is None
        try:
            return not self.lazyfs or bounded(probe, 5)
        except (LazyFSCrash, OSError):
            return False

    def clear_cache(self, timeout=15):
        deadline = time.monotonic() + timeout
        done = os.open(self.done, os.O_RDONLY | os.O_NONBLOCK)   # LazyFS answers only to a reader
        try:
            fd = None
            while fd is None:
                try:
                    fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
                except OSError:                                   # ENXIO: LazyFS is not reading yet
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise LazyFSCrash("LazyFS does not read its faults fifo")
                    time.sleep(0.01)
            os.write(fd, b"lazyfs::clear-cache\n")
            os.close(fd)
            reply = b""
            while b"\n" not in reply:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise LazyFSCrash("no reply to lazyfs::clear-cache")
                if select.select([done], [], [], 0.1)[0]:
                    chunk = os.read(done, 4096)
                    reply += chunk
                    if not chunk:          # EOF while LazyFS has not opened it to reply
                        time.sleep(0.01)
        finally:
            os.close(done)

    def unmount(self, force=False):
        if not self.lazyfs or self.proc is None:
            return
        if force:                      # crashed or hung: the connection goes with the process
            reap(self.proc)
        for attempt in range(20):
            if not mounted(self.root):
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run(["fusermount3", "-u", str(self.root)], capture_output=True, timeout=10)
            time.sleep(0.05)
        else:                          # still busy: detach it lazily
            subprocess.run(["fusermount3", "-uz", str(self.root)], capture_output=True, timeout=10)
        reap(self.proc)                # LazyFS may abort as it unmounts: harmless
        self.proc = None

    def power_cut(self):
        if self.lazyfs:
            self.clear_cache()
            self.unmount()
            self.mount()


class Soak:
    def __init__(self, args, mode, base, relay):
        self.args, self.mode, self.base, self.relay = args, mode, base, relay
        self.rnd = random.Random(f"{args.seed}-{mode}")
        self.disk, self.project, self.cuts_here, self.expected = None, 0, 0, {}
        self.disks, self.bad = [], collections.defaultdict(set)
        self.messages, self.deliveries, self.crashes, self.once_est = 0, 0, 0, 1.0
        self.label = f"powercut {mode}" + (" (control, kill -9)" if args.control else "")

    def relay_proc(self, *args):
        # Cuts land at random, never because of a message: the claim budget is set out of reach
        # (tests/test_claim_budget.py tests it), so that what this soak counts is delivery.
        env = dict(os.environ, RELAY_ROOT=str(self.disk.root), RELAY_LOG_LEVEL="ERROR", RELAY_MAX_RETRIES="1000000")
        with open(self.base / "relay.log", "ab") as log:
            return spawn([*self.relay, *args], env=env, cwd=self.base, stdout=log, stderr=log)

    def wait(self, proc, timeout, what):
        """(exit code or "timeout", seconds); a hung LazyFS is LazyFS's failure, a hung relay relay's."""
        t0 = time.monotonic()
        try:
            return proc.wait(timeout=timeout), time.monotonic() - t0
        except subprocess.TimeoutExpired:
            reap(proc)
            if not self.disk.healthy():
                raise LazyFSCrash(f"LazyFS hung during {what}")
            return "timeout", time.monotonic() - t0

    def fresh_project(self):
        self.project += 1
        self.disk = Disk(self.base, None if self.args.control else self.args.lazyfs)
        self.disks.append(self.disk)
        self.disk.mount()
        rc, _ = self.wait(self.relay_proc("init", *sum((["--agent", a] for a in AGENTS), [])), 60, "relay init")
        if rc != 0:
            if not self.disk.healthy():
                raise LazyFSCrash("LazyFS died during relay init")
            sys.exit(f"powercut: relay init failed (exit {rc}); see {self.base / 'relay.log'}")
        # the project's setup is on disk before the first cut
        bounded(lambda: [sync(d, files) for d, _, files in os.walk(self.disk.root / ".relay")])
        self.cuts_here, self.expected = 0, {}

    def producers(self, prefix, rate, count):
        procs, outs = [], [self.base / f"{prefix}p{k}.out" for k in range(PRODUCERS)]
        for k, out in enumerate(outs):
            with open(out, "wb") as f:
                procs.append(spawn([sys.executable, os.path.abspath(__file__), "_produce",
                                    str(self.disk.root / ".relay"), f"{prefix}p{k}", f"msg-p{k}",
                                    str(self.rnd.randrange(2**32)), str(rate), str(count)],
                                   stdout=f))
        return procs, outs

    def trial(self, i):
        if self.mode == "once":
            prods, outs = self.producers(f"o{i}", 0, self.args.messages // PRODUCERS)
            if any(self.wait(p, 30, "the producers")[0] != 0 for p in prods):
                raise LazyFSCrash("a producer failed")
            relay, t0 = self.relay_proc("run", "--once"), time.monotonic()
            delay = 30 if self.rnd.random() < 0.2 else self.rnd.uniform(0, self.once_est)
            try:
                when = f"after it exited {relay.wait(timeout=delay)}"
                self.once_est = max(0.9 * self.once_est, time.monotonic() - t0)
            except subprocess.TimeoutExpired:
                when = f"mid-run at {delay:.2f}s"
        else:
            relay, lock, t0 = self.relay_proc("run"), self.disk.root / ".relay" / "relay.lock", time.monotonic()
            while relay.poll() is None and time.monotonic() < t0 + 10:   # up: its pid is in relay.lock
                if bounded(lambda: lock.exists() and lock.read_text().strip() == str(relay.pid), 10):
                    break
                time.sleep(0.02)
            up, t1 = time.monotonic() - t0, time.monotonic()
            prods, outs = self.producers(f"d{i}", RATE / PRODUCERS, 10**9)   # they send until the cut
            time.sleep(self.rnd.uniform(0.2, 0.2 + 2 * self.args.messages / RATE))
            when = f"{time.monotonic() - t1:.2f}s into sending (daemon up in {up:.2f}s)" + (
                f" (the daemon had exited {relay.poll()})" if relay.poll() is not None else "")
        for p in [relay, *prods]:
            reap(p)
        sent = {}
        for out in outs:
            for line in out.read_text().split("\n")[:-1]:   # a torn last line was never confirmed
                token, rcpt = line.split(" ")
                sent[token] = rcpt.split(",")
        if not self.disk.healthy():
            raise LazyFSCrash("LazyFS died or hung during the trial")
        self.disk.power_cut()
        rc, took = self.wait(self.relay_proc("run", "--once"), 60, "the recovery pass")
        self.once_est = max(0.9 * self.once_est, took)   # about one full pass
        if not self.disk.healthy():
            raise LazyFSCrash("LazyFS died during the recovery pass")
        self.expected.update(sent)
        found = bounded(self.check, 60)
        found["failed recovery passes"] = {(self.project, i)} if rc != 0 else set()
        self.messages += len(sent)
        self.deliveries += sum(map(len, sent.values()))
        self.cuts_here += 1
        for k, v in found.items():
            self.bad[k] |= v
        counts = ", ".join(f"{k} {len(found[k])}" for k in ("lost", "duplicated", "stuck", "damaged"))
        print(f"{self.label} cut {i}/{self.args.cuts}: project {self.project} cut {self.cuts_here}, "
              f"sent {len(sent)} ({len(self.expected)} on the project), cut {when}; "
              f"recovery exit {rc} in {took:.2f}s; {counts}", flush=True)

    def check(self):
        state = self.disk.root / ".relay"
        held, damaged, stuck = collections.Counter(), set(), set()
        for a in AGENTS:
            for p in [*(state / "inbox" / a / "new").iterdir(), *(state / "inbox" / a / "cur").iterdir()]:
                try:
                    held[(a, json.loads(p.read_bytes())["body"].strip())] += 1
                except (ValueError, KeyError, TypeError, AttributeError):
                    damaged.add(str(p.relative_to(state)))
            stuck |= {("outbox", a, p.name) for p in (state / "outbox" / a).iterdir() if not p.name.startswith(".")}
        lost = {(r, t) for t, rcpt in self.expected.items() for r in rcpt if held[(r, t)] == 0}
        dup = {k for k, n in held.items() if n > 1}
        stuck |= {("id", p.name.split("--")[0]) for p in (state / "spool").rglob("*") if p.is_file()}
        try:
            with contextlib.closing(sqlite3.connect(f"file:{state / 'ledger.sqlite'}?mode=ro", uri=True)) as db:
                stuck |= {("id", r[0]) for r in db.execute(
                    "SELECT id FROM messages WHERE status IN ('pending', 'processing')")}
        except sqlite3.Error as e:
            stuck.add(("ledger unreadable", str(e)))
        return {name: {(self.project, k) for k in keys}
                for name, keys in (("lost", lost), ("duplicated", dup), ("stuck", stuck), ("damaged", damaged))}

    def run(self):
        for i in range(1, self.args.cuts + 1):
            for attempt in range(5):
                try:
                    if self.disk is None or self.cuts_here >= CUTS_PER_PROJECT:
                        if self.disk is not None:
                            self.disk.unmount()
                        self.fresh_project()
                    self.trial(i)
                    break
                except LazyFSCrash as e:
                    self.crashes += 1
                    print(f"{self.label} cut {i}: {e}; trial rerun on a fresh project", flush=True)
                    for p in CHILDREN:
                        reap(p, timeout=5)
                    self.disk.unmount(force=True)
                    self.disk = None
            else:
                sys.exit("powercut: LazyFS failed 5 times in a row; giving up")
        if self.disk is not None:
            self.disk.unmount()
        b = self.bad
        print(f"{self.label}: {self.args.cuts} cuts, {self.messages} messages, lost {len(b['lost'])}, "
              f"duplicated {len(b['duplicated'])}, stuck {len(b['stuck'])}, damaged {len(b['damaged'])}"
              + (f", failed recovery passes {len(b['failed recovery passes'])}" if b["failed recovery passes"] else "")
              + f" (of {self.deliveries} deliveries"
              + (f"; LazyFS failed {self.crashes}x, trials rerun)" if self.crashes else ")"), flush=True)
        return any(b.values())


def interrupted(*_):
    raise KeyboardInterrupt


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_produce":
        state, prefix, reuse, seed, rate, count = sys.argv[2:]
        return produce(state, prefix, reuse, int(seed), float(rate), int(count))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lazyfs", default=os.environ.get("LAZYFS"), help="LazyFS binary (default: env LAZYFS)")
    ap.add_argument("--mode", choices=["once", "daemon", "both"], default="both")
    ap.add_argument("--cuts", type=int, default=40, help="power cuts per mode (default 40)")
    ap.add_argument("--messages", type=int, default=60, help="messages per cut (default 60)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--relay", help="relay command (default: this Python -m relay)")
    ap.add_argument("--control", action="store_true", help="plain directory, kill -9 only, no LazyFS")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    if not args.control and not (args.lazyfs and os.access(args.lazyfs, os.X_OK)):
        where = f"at {args.lazyfs}" if args.lazyfs else "(pass --lazyfs PATH or set LAZYFS)"
        print(f"powercut: no LazyFS binary {where}; build one with `../shared/tools/lazyfs/build.sh DIR` "
              "from the project root (it prints the binary's path)", file=sys.stderr)
        sys.exit(2)
    args.lazyfs = args.lazyfs and os.path.abspath(args.lazyfs)
    relay = shlex.split(args.relay) if args.relay else [sys.executable, "-m", "relay"]
    base = Path(tempfile.mkdtemp(prefix="relay_powercut_"))
    signal.signal(signal.SIGTERM, interrupted)
    soaks, failed = [], False
    try:
        for mode in (["once", "daemon"] if args.mode == "both" else [args.mode]):
            soaks.append(Soak(args, mode, base, relay))
            failed |= soaks[-1].run()
    except KeyboardInterrupt:
        print("powercut: interrupted", file=sys.stderr)
        failed = 130
    finally:
        for p in CHILDREN:     # relay, producers and LazyFS (a killed LazyFS unmounts cleanly)
            reap(p, timeout=5)
        for disk in (d for soak in soaks for d in soak.disks):
            try:
                disk.unmount(force=True)
            except (OSError, subprocess.SubprocessError) as e:
                print(f"powercut: could not unmount {disk.root}: {e}", file=sys.stderr)
        if args.keep:
            print(f"powercut: kept {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)
    sys.exit(130 if failed == 130 else int(bool(failed)))


if __name__ == "__main__":
    main()
