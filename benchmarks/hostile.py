"""Hostile soak: while the daemon runs and well-behaved producers send messages, hostile agents
keep planting, at random, what contract §4 says relay must survive: symlinks at every level of
.relay/, hard links to files outside the project, names that are not UTF-8 or hold control
characters (C0 or C1), 250-byte names, names starting with '-', far-future and far-past mtimes,
files held open for writing, FIFOs, directories in outboxes, an outbox named System, messages whose
subject, thread and body are terminal escapes (OSC 52, OSC 8, CSI), C1 controls and bidi overrides;
made-up senders (new outbox directories with messages for the producers' agents) and ids copied
from another agent's outbox into a back-dated file (the producers send half their messages with
relay's API, whose ids the ledger binds to their sender); outboxes named as relay's reserved names
in any case (system, SYSTEM, broadcast ...) with files of kind bounce, an agent's own file of
kind bounce, messages to an agent an operator archived, and an agent's search and reserve with
queries and patterns at and past their bounds.

    python benchmarks/hostile.py --seconds 20 --seed 1 --producers 3 --rate 10 [--skip bad-utf8]

The daemon runs with `senders = "declared"` (`--senders any` for the default). A decoy tree beside
the project and the project's own files are checksummed before and after. Exits 1 when anything
outside .relay/ changed, a producer's message was lost, duplicated or misdelivered, a message
relay's API sent was delivered under another id than the one it printed, a decoy or project file
or a half-written or oddly named file was delivered, a made-up sender's file was delivered (in
declared mode) or lost, a raw escape, control or bidi character reached the daemon's log or the
output of audit, show, tail or inbox, a file from a reserved name or of kind bounce from an agent
was delivered, an archived agent got mail, a search or reserve printed a traceback, or the daemon
died or did not exit 0 on SIGTERM.
"""
import argparse
import collections
import hashlib
import json
import os
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

AGENTS = ["A0", "A1", "A2", "A3"]
OLD = time.time() - 2 * 86400
HOSTILES = 3
KINDS = {"file-link": 3, "agent-link": 2, "ghost-inbox": 1, "swap": 2, "hardlink": 2, "bad-utf8": 2,
         "control-name": 2, "long-name": 2, "dash-name": 2, "future-mtime": 2, "past-mtime": 2,
         "held-open": 1, "fifo": 2, "dir": 1, "system-outbox": 1, "made-up-sender": 2, "copied-id": 3,
         "escapes": 2, "c1-name": 1, "reserved-outbox": 2, "bounce-kind": 2, "archived-recipient": 2,
         "long-query": 1, "long-pattern": 1}
ARCHIVED = "Z9"                 # declared, then archived by the operator before the daemon starts
RESERVED = ("system", "SYSTEM", "sYsTeM", "broadcast", "BROADCAST", "Broadcast")
# an agent's search and reserve at and past their bounds (1,000 bytes and 64 words; 1,000 characters)
QUERIES = ("parser " * 3000, " ".join(f"w{i}" for i in range(64)), "x" * 999, "a b " * 20000)
PATTERNS = ("*a" * 240, "*" * 999, "**/" * 300 + "x", "?*" * 400 + "z")
# What a message may hold to drive a terminal: none of it may reach one raw.
ESCAPES = ("\x1b]52;c;cm0gLXJmIH4K\x07\x1b]8;;https://evil.example/\x1b\\link\x1b]8;;\x1b\\\x1b[2J\x1b[31m"
           "\x9b2J\x9d0;t\x9c\x85\u202e\u2066\u2069\u2028\r\x08\x7f")
UNSAFE = ({chr(c) for c in range(0x20)} - {"\n", "\t"}) | {chr(c) for c in range(0x7F, 0xA0)} | set(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029")
BUSY, BUSY_LOCK = set(), threading.Lock()     # directories a hostile has swapped for a symlink
RECENT = collections.deque(maxlen=8)         # (sender, id) of the latest messages sent by relay's API


def write(path, text, mtime=None):
    with open(path, "wb") as f:
        f.write(text.encode())
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def make_decoy(base, project):
    """Files and directories outside the state dir that relay must never touch."""
    d = base / "decoy"
    for sub in ("box/old", "maildir/tmp", "maildir/new", "maildir/cur", "linked", "empty"):
        (d / sub).mkdir(parents=True)
    for i in range(4):
        write(d / "box" / f"d{i}", f"TO: A{i}\n\nDECOY-box-{i}", OLD if i % 2 else None)
        write(d / "linked" / f"L{i}", f"TO: A{(i + 1) % 4}\n\nLINKED-{i}")
    write(d / "box" / "d.json", json.dumps({"to": "A1", "body": "DECOY-json"}))
    write(d / "box" / "old" / "o1", "TO: A2\n\nDECOY-old", OLD)
    write(d / "maildir" / "tmp" / "stale.json", json.dumps({"body": "DECOY-tmp"}), OLD)
    write(d / "maildir" / "new" / "e1.json", json.dumps({"to": ["A1"], "body": "DECOY-env"}), OLD)
    write(d / "secret.txt", "TO: A0\n\nDECOY-secret", OLD)
    os.chmod(d / "secret.txt", 0o600)
    write(project / "README.md", "TO: A1\n\nPROJECT-readme")
    (project / "src").mkdir()
    write(project / "src" / "main.py", "TO: A2\n\nPROJECT-main", OLD)
    files = [p for p in d.rglob("*") if p.is_file() and p.parent.name != "linked"]
    dirs = [d / "box", d / "maildir", d / "maildir" / "new", d / "maildir" / "tmp", d / "empty"]
    return files, dirs, sorted((d / "linked").iterdir())


def snapshot(base, state, skip):
    """rel path -> its attributes, for everything under base outside the state dir."""
    inside = collections.Counter()                # regular-file inodes named inside the state dir
    for dirpath, dirs, files in os.walk(os.fsencode(state)):
        for n in dirs + files:
            st = os.lstat(os.path.join(dirpath, n))
            inside[(st.st_dev, st.st_ino)] += stat.S_ISREG(st.st_mode)
    out, state_b, skip_b = {}, os.fsencode(state), os.fsencode(skip)
    for dirpath, dirs, files in os.walk(os.fsencode(base)):
        dirs[:] = [n for n in dirs if os.path.join(dirpath, n) != state_b]
        for p in (os.path.join(dirpath, n) for n in dirs + files if os.path.join(dirpath, n) != skip_b):
            st = os.lstat(p)
            rec = {"mode": oct(st.st_mode), "mtime": st.st_mtime_ns}
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    rec["sha"] = hashlib.sha256(f.read()).hexdigest()[:16]
                rec["links"] = st.st_nlink - inside[(st.st_dev, st.st_ino)]
            elif stat.S_ISLNK(st.st_mode):
                rec["target"] = os.readlink(p)
            out[os.path.relpath(p, os.fsencode(base))] = rec
    return out


def differences(before, after):
    for k in sorted(set(before) | set(after)):
        b, a = before.get(k), after.get(k)
        if b is None or a is None:
            yield k, "created" if b is None else "removed", a or b
        elif a != b:
            yield k, "changed", {f: (b.get(f), a.get(f)) for f in sorted(set(a) | set(b)) if a.get(f) != b.get(f)}


def restore(real, aside):
    """Put a directory moved aside back, merging into one relay may have created meanwhile."""
    if os.path.islink(real):
        os.unlink(real)
    if not os.path.lexists(real):
        return os.rename(aside, real)
    for n in os.listdir(aside):
        s, d = os.path.join(aside, n), os.path.join(real, n)
        if os.path.isdir(s) and not os.path.islink(s) and os.path.isdir(d) and not os.path.islink(d):
            restore(d, s)
        elif not os.path.lexists(d):
            os.rename(s, d)
    os.rmdir(aside)


class Hostile:
    def __init__(self, n, project, decoy, seed):
        self.n, self.project, self.state = n, project, project / ".relay"
        self.files, self.dirs, self.linked = decoy
        self.rnd = random.Random(f"{seed}-hostile-{n}")
        self.planted = collections.Counter()
        self.held, self.asides, self.count = [], [], 0     # held: (file, rest, when to finish it)
        self.made_up = []                                   # files planted in made-up senders' outboxes
        self.cli = []                                       # (verb, exit code, CPU seconds, traceback printed)

    def box(self):
        return self.state / "outbox" / self.rnd.choice(AGENTS)

    def body(self, kind):
        ghosts = [p.name for p in (self.state / "inbox").iterdir() if p.name.startswith("G")]
        to = self.rnd.choice(AGENTS + ["*", "System"] + ghosts[-2:])
        if kind == "escapes":
            return f"TO: {to}\nSUBJECT: {ESCAPES}\nTHREAD: t{ESCAPES}\n\nhostile-{kind}-{self.n}-{self.count}{ESCAPES}"
        return f"TO: {to}\n\nhostile-{kind}-{self.n}-{self.count}"

    def drop(self, kind, name, mtime=None, box=None, text=None):
        """A hostile message renamed into an outbox under `name` (bytes), its mtime set first."""
        box = os.fsencode(box or self.box())
        tmp = os.path.join(box, b".h%d-%d.tmp" % (self.n, self.count))
        write(tmp, text or self.body(kind))
        if mtime is not None:             # a file system may clamp it (ext4: year 2446)
            os.utime(tmp, (mtime, mtime))
        os.rename(tmp, os.path.join(box, name))

    def agent_link(self):
        targets = {"decoy": self.rnd.choice(self.dirs), "root": self.project, "state": self.state,
                   "inbox-new": self.state / "inbox" / self.rnd.choice(AGENTS) / "new"}
        days = [p for p in (self.state / "archive").glob("20*") if p.is_dir() and not p.is_symlink()]
        if days:
            d = self.rnd.choice(days)
            targets["archive-day"] = self.rnd.choice([d] + [p for p in d.iterdir() if p.is_dir()])
        kind = self.rnd.choice(sorted(targets))
        os.symlink(targets[kind], self.state / "outbox" / f"H{self.n}x{self.count}")
        return "agent-link:" + kind

    def swap(self):
        """Move a directory relay owns aside, put a symlink to a decoy dir there for a moment."""
        a = self.rnd.choice(AGENTS)
        kind, real = self.rnd.choice([("inbox-tmp", self.state / "inbox" / a / "tmp"),
                                      ("inbox-new", self.state / "inbox" / a / "new"),
                                      ("spool", self.state / "spool" / a),
                                      ("archive", self.state / "archive"), ("failed", self.state / "failed")])
        with BUSY_LOCK:
            if real in BUSY or os.path.islink(real) or not os.path.isdir(real):
                return None
            BUSY.add(real)
        try:
            aside = real.with_name(f".{real.name}.aside-{self.n}-{self.count}")
            os.rename(real, aside)
            self.asides.append((real, aside))
            try:
                os.symlink(self.rnd.choice(self.dirs), real)
            except FileExistsError:       # relay made the directory again meanwhile
                pass
            time.sleep(self.rnd.uniform(0.05, 0.5))
            restore(real, aside)
            self.asides.remove((real, aside))
        finally:
            with BUSY_LOCK:
                BUSY.discard(real)
        return "swap:" + kind

    def made_up_sender(self):
        """A new outbox directory nobody declared, with a message for a producer's agent."""
        box = self.state / "outbox" / f"M{self.n}x{self.count}"
        box.mkdir()
        self.drop("madeup", b"m", box=box)
        self.made_up.append(box / "m")

    def copied_id(self):
        """The id of a message relay's API wrote in one agent's outbox, copied into an older file
        of another agent's (which an agent can read before relay takes the file)."""
        mine, theirs = self.rnd.sample(AGENTS, 2)
        try:
            names = [n for n in os.listdir(self.state / "outbox" / theirs) if n.startswith("msg-")]
            text = (self.state / "outbox" / theirs / self.rnd.choice(names)).read_text()
            mid = next(line[4:].strip() for line in text.splitlines() if line.startswith("ID: "))
        except (OSError, IndexError, StopIteration, UnicodeDecodeError):
            # relay took them all already: one just sent, as an agent watching the outbox saw it
            sent = [(a, m) for a, m in list(RECENT) if a != mine]
            if not sent:
                return None
            mid = self.rnd.choice(sent)[1]
        box = self.state / "outbox" / mine
        tmp = box / f".c{self.n}-{self.count}.tmp"
        write(tmp, f"ID: {mid}\nTO: {self.rnd.choice([a for a in AGENTS if a != mine])}\n\n"
                   f"hostile-copied-{self.n}-{self.count}", time.time() - self.rnd.uniform(60, 86400))
        os.rename(tmp, box / f"c-{self.n}-{self.count}")
        return "copied-id"

    def reserved_outbox(self, tag):
        """An outbox named as relay's own (System) or every agent (Broadcast), in some case, with a
        file of kind bounce for a producer's agent: it must never be delivered."""
        box = self.state / "outbox" / self.rnd.choice(RESERVED)
        box.mkdir(exist_ok=True)
        self.drop("reserved", b"r-" + tag, box=box,
                  text=f"TO: {self.rnd.choice(AGENTS)}\nKIND: bounce\n\nhostile-reserved-{self.n}-{self.count}")

    def agent_cli(self, verb, arg):
        """An agent's relay search or reserve with a query or pattern at or past its bound."""
        cmd = [sys.executable, "-m", "relay", "--root", str(self.project), verb, "--agent",
               self.rnd.choice(AGENTS), arg]
        start = os.times()
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=300)
        end = os.times()
        cpu = (end.children_user + end.children_system) - (start.children_user + start.children_system)
        self.cli.append((verb, r.returncode, cpu, "Traceback" in r.stdout + r.stderr))
        if verb == "reserve" and r.returncode == 0:         # let the others reserve again
            subprocess.run(cmd[:-3] + ["release", "--agent", cmd[-2], "--all"], capture_output=True, timeout=120)

    def held_open(self, path):
        """Half a message written, the file held open for seconds, then finished."""
        text = self.body("open") + "-" + "x" * 300 + "-END"
        f = open(path, "w")
        f.write(text[: len(text) // 2])
        f.flush()
        self.held.append((f, text[len(text) // 2:], time.monotonic() + self.rnd.uniform(1, 8)))

    def plant(self, kind):
        r, n, c, box, outbox = self.rnd, self.n, self.count, self.box(), self.state / "outbox"
        self.count += 1
        tag = b"%d-%d" % (n, c)
        long_name = (f"long-{n}-{c}-" + "\u00e9" * 125).encode()[:249].decode(errors="ignore").encode()
        act = {"file-link": lambda: os.symlink(r.choice(self.files), box / f"s-{n}-{c}"),
               "agent-link": self.agent_link,
               "ghost-inbox": lambda: os.symlink(r.choice(self.dirs[:2]), self.state / "inbox" / f"G{n}x{c}"),
               "swap": self.swap,
               "hardlink": lambda: os.link(r.choice(self.linked), box / f"h-{n}-{c}"),
               "bad-utf8": lambda: self.drop(kind, b"bad\xff\xfe-" + tag),
               "control-name": lambda: self.drop(kind, b"ctl\n%d\x01%d\t\x1b[31m\r" % (n, c)),
               "c1-name": lambda: self.drop(kind, "c1\x9b%d\x9d%d\x85".encode() % (n, c)),
               "escapes": lambda: self.drop(kind, b"esc-" + tag),
               "long-name": lambda: self.drop(kind, long_name + b"x" * (250 - len(long_name))),
               "dash-name": lambda: self.drop(kind, r.choice([b"-rf-", b"--help-", b"-"]) + tag),
               "future-mtime": lambda: self.drop(kind, b"fut-" + tag, r.choice([4102444800, 2 ** 40, 2 ** 62])),
               "past-mtime": lambda: self.drop(kind, b"past-" + tag, r.choice([0, 1, -2 ** 31, -10 ** 12])),
               "held-open": lambda: self.held_open(box / f"open-{n}-{c}"),
               "fifo": lambda: os.mkfifo(box / f"fifo-{n}-{c}"),
               "dir": lambda: (os.mkdir(box / f"d-{n}-{c}"), write(box / f"d-{n}-{c}" / "in", self.body(kind))),
               "system-outbox": lambda: (os.makedirs(outbox / "System", exist_ok=True),
                                         self.drop(kind, b"sys-" + tag, box=outbox / "System")),
               "made-up-sender": self.made_up_sender, "copied-id": self.copied_id,
               "reserved-outbox": lambda: self.reserved_outbox(tag),
               "bounce-kind": lambda: self.drop(kind, b"b-" + tag, text=f"TO: {r.choice(AGENTS)}\nKIND: bounce\n\n"
                                                                     f"hostile-bounce-{n}-{c}"),
               "archived-recipient": lambda: self.drop(kind, b"z-" + tag, text=f"TO: {ARCHIVED}\n\n"
                                                                            f"hostile-archived-{n}-{c}"),
               "long-query": lambda: self.agent_cli("search", r.choice(QUERIES)),
               "long-pattern": lambda: self.agent_cli("reserve", r.choice(PATTERNS))}[kind]()
        kind = act if kind in ("agent-link", "swap", "copied-id") else kind     # these say which, or None
        if kind:
            self.planted[kind] += 1

    def attempt(self, kind):
        try:
            self.plant(kind)
        except OSError:                   # e.g. the file system refused a name or an mtime
            self.planted["error:" + kind] += 1

    def finish_held(self, now=float("inf")):
        for item in [h for h in self.held if h[2] <= now]:
            item[0].write(item[1])
            item[0].close()
            self.held.remove(item)

    def run(self, stop, skip=()):
        kinds = [k for k in KINDS if k not in skip]
        while kinds and not stop.is_set():
            self.attempt(self.rnd.choices(kinds, [KINDS[k] for k in kinds])[0])
            self.finish_held(time.monotonic())
            stop.wait(self.rnd.uniform(0.02, 0.2))
        self.finish_held()
        for real, aside in self.asides:           # a restore that failed above
            restore(real, aside)


def producer(state, idx, rate, seed, stop, sent, printed):
    """Messages from the producers' agents: half through relay's API (`printed`: token -> the id
    it printed), half as files renamed into the outbox."""
    import relay
    rnd = random.Random(f"{seed}-producer-{idx}")
    agents = {}
    i = 0
    try:
        while not stop.is_set():
            sender = rnd.choice(AGENTS)
            recipients = rnd.sample([a for a in AGENTS if a != sender], rnd.choice([1, 1, 2, 3]))
            token, box = f"p{idx}-{i}-s{seed}", state / "outbox" / sender
            if rnd.random() < 0.5:
                if sender not in agents:
                    agents[sender] = relay.Agent(sender, root=state.parent)
                try:
                    printed[token] = agents[sender].send(recipients, token)
                    RECENT.append((sender, printed[token]))
                except relay.RelayError as e:   # e.g. outbox/<sender> swapped for a link just now
                    print(f"producer {idx}: {token} not sent: {e}", file=sys.stderr)
                    continue
            else:
                write(box / f".m-{token}.tmp", f"TO: {', '.join(recipients)}\n\n{token}")
                os.rename(box / f".m-{token}.tmp", box / f"m-{token}")
            sent.extend((r, token) for r in recipients)
            i += 1
            stop.wait(rnd.expovariate(rate))
    finally:
        for a in agents.values():
            a.close()


def inboxes(state, seen):
    """(agent, body) -> envelopes held in the producers' inboxes, how many were unreadable, and
    (agent, body) -> the ids they bear. `seen` caches each envelope's (body, id) by path (a
    complete envelope never changes)."""
    got, bad, ids = collections.Counter(), 0, collections.defaultdict(set)
    for d in (state / "inbox" / a / sub for a in AGENTS for sub in ("new", "cur")):
        for p in (d.iterdir() if d.is_dir() and not d.is_symlink() else ()):
            if p not in seen:
                try:
                    if not stat.S_ISREG(os.lstat(p).st_mode):
                        raise ValueError("not a regular file")
                    doc = json.loads(p.read_bytes())
                    seen[p] = (str(doc["body"]), str(doc["id"]))
                except (OSError, ValueError, KeyError, TypeError):
                    bad += 1
                    continue
            got[(d.parent.name, seen[p][0])] += 1
            ids[(d.parent.name, seen[p][0])].add(seen[p][1])
    return got, bad, ids


def run(seconds, seed, producers, rate, settle, skip=(), keep=False, senders="declared"):
    base = Path(tempfile.mkdtemp(prefix="relay-hostile-"))
    project, log = base / "project", base / "daemon.log"
    state = project / ".relay"
    project.mkdir()
    cli = [sys.executable, "-m", "relay", "--root", str(project)]
    init = subprocess.run(cli + ["init", *sum((["--agent", a] for a in AGENTS + [ARCHIVED]), [])],
                          capture_output=True, text=True)
    if not init.returncode:
        init = subprocess.run(cli + ["archive-agent", ARCHIVED], capture_output=True, text=True)
    if init.returncode:
        shutil.rmtree(base, ignore_errors=True)
        sys.exit(f"relay init failed: {init.stderr.strip()[-500:]}")
    decoy = make_decoy(base, project)
    env = dict(os.environ, RELAY_ROOT=str(project), RELAY_AGENTS=",".join(AGENTS + [ARCHIVED]), RELAY_SETTLE="100ms",
               RELAY_RESCAN_INTERVAL="1s", RELAY_MAX_RETRIES="8", RELAY_RETRY_BACKOFF="50ms",
               RELAY_LOG_LEVEL="ERROR", RELAY_SENDERS=senders)
    logf = open(log, "wb")
    before = snapshot(base, state, log)
    hostiles = [Hostile(n, project, decoy, seed) for n in range(HOSTILES)]
    for kind in KINDS:                    # one of each before the start: start-up recovery meets them
        if kind not in ("swap", "held-open", *skip):
            hostiles[0].attempt(kind)
    proc = subprocess.Popen(cli + ["run"], env=env, stdout=logf, stderr=subprocess.STDOUT)
    stop, sent, seen, printed = threading.Event(), [], {}, {}
    threads = [threading.Thread(target=h.run, args=(stop, skip)) for h in hostiles]
    threads += [threading.Thread(target=producer, args=(state, i, rate, seed, stop, sent, printed))
                for i in range(producers)]
    try:
        for t in threads:
            t.start()
        stop.wait(seconds)
        stop.set()
        for t in threads:
            t.join()
        expected = collections.Counter(sent)
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline and proc.poll() is None:
            got = inboxes(state, seen)[0]
            if all(got[k] for k in expected):
                break
            time.sleep(0.5)
        try:
            out = subprocess.run(cli + ["status", "--json"], capture_output=True, text=True, timeout=60)
            status = out.stdout or out.stderr
        except subprocess.TimeoutExpired:
            status = "relay status timed out"
        leaked = shown_raw(cli)
        alive = proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rc = "hung on SIGTERM"
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        logf.close()
    diffs = list(differences(before, snapshot(base, state, log)))
    planted = sum((h.planted for h in hostiles), collections.Counter())
    made_up = [p for h in hostiles for p in h.made_up]
    archived_mail = sum(1 for sub in ("new", "cur") for _ in (state / "inbox" / ARCHIVED / sub).glob("*"))
    waiting = sum(1 for p in made_up if p.is_file())
    leaked += [f"daemon log: {c}" for c in raw(log.read_text(errors="replace"))]
    failed = report(planted, diffs, status, inboxes(state, seen), expected, alive, rc, log, base,
                    printed, (senders, len(made_up), waiting), leaked,
                    (archived_mail, [c for h in hostiles for c in h.cli]))
    if not keep:
        shutil.rmtree(base, ignore_errors=True)
    return not failed


def raw(text):
    """The unsafe characters of `text`, as code points."""
    return sorted({f"U+{ord(c):04X}" for c in text if c in UNSAFE})


def shown_raw(cli):
    """What the verbs people read print raw of the hostile messages: ["verb: U+...", ...]."""
    def run(*args):
        r = subprocess.run(cli + list(args), capture_output=True, text=True, errors="replace", timeout=120)
        return r.stdout, r.stderr
    found = []
    try:
        doc = json.loads(run("audit", "--json", "--grep", "hostile-escapes")[0] or "[]")
        verbs = [["audit", "--limit", "1000000"], ["tail", "-n", "100000"], ["audit", "--jsonl"],
                 *(["inbox", a, "--all"] for a in AGENTS), ["inbox", AGENTS[0], "--all", "--json"],
                 *(["show", d["id"]] for d in doc[:5]), *(["show", d["id"], "--json"] for d in doc[:2])]
        for args in verbs:
            for text in run(*args):
                found += [f"relay {' '.join(args)}: {c}" for c in raw(text)]
    except (ValueError, subprocess.TimeoutExpired) as e:
        found.append(f"could not look: {e}")
    return found


def report(planted, diffs, status, inbox, expected, alive, rc, log, base, printed, made_up, leaked=(),
           bounds=(0, ())):
    print("planted:", " ".join(f"{k}={v}" for k, v in sorted(planted.items())))
    groups = collections.defaultdict(list)
    for path, what, detail in diffs:
        groups[(os.path.dirname(path), what)].append((path, detail))
    print(f"outside the state dir: {len(diffs)} differences" + ", in the first 30 places:" * (len(groups) > 30))
    for (parent, what), items in sorted(groups.items())[:30]:
        more = f" (and {len(items) - 1} more there)" if len(items) > 1 else ""
        print(f"  {what} {os.fsdecode(items[0][0])!r}{more}: {items[0][1]}")
    try:
        print("relay status:", json.dumps({k: json.loads(status)[k] for k in ("daemon", "counts")}))
    except (ValueError, KeyError):
        print("relay status:", status.strip()[-300:])
    got, bad, ids = inbox
    odd = ("hostile-bad-utf8", "hostile-control", "hostile-c1-name")
    senders, made_up_planted, made_up_waiting = made_up
    made_up_delivered = sum(n for k, n in got.items() if k[1].startswith("hostile-madeup"))
    result = {"messages": len({t for _, t in expected}), "deliveries": sum(expected.values()),
              "lost": sum(1 for k in expected if not got[k]),
              "duplicated": sum(1 for k, n in got.items() if k in expected and n > 1),
              "unexpected": sum(1 for k in got if k[1].startswith("p") and k not in expected),
              "followed": sum(n for k, n in got.items() if k[1].startswith(("DECOY", "PROJECT"))),
              "partial": sum(n for k, n in got.items() if k[1].startswith("hostile-open") and k[1][-3:] != "END"),
              "odd_names_delivered": sum(n for k, n in got.items() if k[1].startswith(odd)),
              "decoy_changes": sum(1 for d in diffs if d[0].startswith(b"decoy")),
              "outside_created_removed": sum(1 for d in diffs if d[1] != "changed"),
              "bad_envelopes": bad, "escapes_shown_raw": len(leaked),
              "hostile_deliveries": sum(n for k, n in got.items() if not k[1].startswith("p")),
              "sent_by_api": len(printed),
              "ids_taken": sum(1 for k in expected if k[1] in printed and ids[k] - {printed[k[1]]}),
              "copied_ids_delivered": sum(n for k, n in got.items() if k[1].startswith("hostile-copied")),
              "made_up_planted": made_up_planted, "made_up_waiting": made_up_waiting,
              "made_up_delivered": made_up_delivered,
              "made_up_lost": made_up_planted - made_up_waiting - made_up_delivered if senders == "declared" else 0,
              "reserved_delivered": sum(n for k, n in got.items() if k[1].startswith("hostile-reserved")),
              "bounce_kind_delivered": sum(n for k, n in got.items() if k[1].startswith("hostile-bounce")),
              "archived_got_mail": bounds[0],
              "bounded_verbs": len(bounds[1]), "bounded_verb_tracebacks": sum(1 for c in bounds[1] if c[3]),
              "bounded_verb_cpu_max_s": round(max((c[2] for c in bounds[1]), default=0.0), 3),
              "daemon_alive": alive, "daemon_exit": rc, "dir": str(base)}
    failed = [k for k in ("lost", "duplicated", "unexpected", "followed", "partial", "odd_names_delivered",
                          "decoy_changes", "outside_created_removed", "ids_taken", "made_up_lost",
                          "escapes_shown_raw", "reserved_delivered", "bounce_kind_delivered",
                          "archived_got_mail", "bounded_verb_tracebacks") if result[k]]
    failed += ["made_up_delivered"] if senders == "declared" and made_up_delivered else []
    if leaked:
        print("raw in what people read, e.g.:", *sorted(set(leaked))[:10], sep="\n  ")
    failed += [] if alive and rc == 0 else ["daemon"]
    for what, keys in (("lost", [k for k in expected if not got[k]]),
                       ("duplicated", [k for k in expected if got[k] > 1])):
        if keys:
            print(f"{what} (recipient, body), e.g.:", sorted(keys)[:5])
    if failed:
        lines = log.read_text(errors="replace").splitlines()
        errors = collections.Counter(x for x in lines if re.match(r"[\w.]*(Error|Exception)\b", x))
        print(f"daemon log: {len(lines)} lines",
              *(f"  {n} x {x[:250]}" for x, n in errors.most_common(5)), "its last lines:",
              *("  " + x[:250] for x in lines[-4:]), sep="\n")
    print(json.dumps(result))
    print("FAIL: " + ", ".join(failed) if failed else "OK")
    return failed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20, help="how long producers and hostiles run (default 20)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--producers", type=int, default=3, help="well-behaved producer threads (default 3)")
    ap.add_argument("--rate", type=float, default=10, help="messages per second per producer (default 10)")
    ap.add_argument("--settle", type=float, default=60, help="wait at most this for delivery (default 60)")
    ap.add_argument("--skip", default="", help="plant kinds left out, comma-separated: " + ",".join(KINDS))
    ap.add_argument("--keep", action="store_true", help="keep the temp directory")
    ap.add_argument("--senders", choices=("declared", "any"), default="declared",
                    help="the daemon's `senders` setting (default declared: made-up senders' files must wait)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # stop the daemon on the way out
    skip = [k for k in args.skip.split(",") if k]
    if set(skip) - set(KINDS):
        ap.error(f"unknown kind in --skip: {', '.join(set(skip) - set(KINDS))}")
    sys.exit(0 if run(args.seconds, args.seed, args.producers, args.rate, args.settle, skip, args.keep,
                      args.senders) else 1)


if __name__ == "__main__":
    main()
