"""What one hostile node, holding only its own ACL user, costs the others: each attack in turn,
with a phase without it just before, in the same run. Loopback only; stops by itself.

    python benchmarks/fedhostile.py                         # every attack, 10 s each way
    python benchmarks/fedhostile.py --only ackflood --seconds 5
    python benchmarks/fedhostile.py --small                 # the soak test's sizes

The honest node n1 (a `relay run` daemon: A0, A1, A2) and n2 (a daemon: B0) exchange traffic;
n3 is the hostile node, a raw client on n3's user that announces Eve and never acknowledges.
Throughout, A0 writes to A1 (local delivery, 20 a second: its p50 is measured) and B0 writes to
A1 (cross-node, 5 a second). The attacks, at the issue's rates:

  republish  n1 holds a backlog of BACKLOG messages for Eve (n3 never acknowledges); n3 deletes
             one entry of n1's stream to it (XDEL) every second
  keyspace   n3 stores KEYS keys under its own prefix, and writes an entry from a name nobody
             announced every 20 ms
  ackflood   n3 writes acknowledgements of made-up ids in bulk: entries of 8,192, 10 a second
  unknown    n3 writes an entry from a name nobody announced every 20 ms
  shed       n3 sends 512 KiB messages to A2 (queue_limit 64, nobody reads) 10 a second, and
             lists SYSTEM, writing from it every 100 ms
  squat      n3 polls the directory every 100 ms and lists (and claims, SETNX) every name n1 or n2
             lists, and a case variant of each, and claims every sender it reads in its stream
             from n1; meanwhile a new agent appears on n1 and writes to Eve at once, and B0 writes
             to it: the seconds until B0's message reaches it (`reach`, within REACH)
  wide-own   n3 writes the wide attack's entries to streams of its own no node reads: what its
             writes alone cost the server (the control of the next)
  wide       n3 writes an entry of WIDE empty fields (7 MB, within the byte bound) to n1's stream
             and one to its acknowledgements, every second
  flood      n3 writes malformed entries (v=1) to n1's stream, 240 every 20 ms (12,000 a second)

Per phase: the honest daemon's CPU (% of a core, /proc), redis-server's, the local delivery p50
(ms); per attack the ratios. At the end: local and cross-node messages lost or duplicated (each
held by its recipient exactly once), and the ledger growth of n1 in the shed phase. Exit 1 when
any was lost or duplicated or a budget (25% / 25% / 1.5x) was exceeded; the server's budget
leaves out, for the wide attack, what the same writes cost it with no node reading them (the
wide-own phase: a node may always spend the server's time writing its own keys, which only the
server's configuration bounds).
"""
import argparse
import importlib.util
import json
import multiprocessing
import os
import shlex
import signal
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

_spec = importlib.util.spec_from_file_location("fedkit", Path(__file__).parent / "fedkit.py")
fedkit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fedkit)

WIDE = 1_000_000            # empty fields of the wide attack's entries
ATTACKS = ("republish", "keyspace", "ackflood", "unknown", "shed", "squat", "wide-own", "wide", "flood")
BUDGET = {"daemon": 25.0, "redis": 25.0, "p50": 1.5}
REACH = 10.0                # seconds a new agent takes at most to be reached from n2 while n3 squats


def cpu_seconds(pid):
    """utime + stime of a process so far (seconds), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def query(state, sql, args=()):
    db = sqlite3.connect(f"file:{state / 'ledger.sqlite'}?mode=ro", uri=True, timeout=10)
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


def wait_for(what, check, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - not yet
            pass
        time.sleep(0.05)
    raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")


class Probe(threading.Thread):
    """Writes `sender` -> `to` at `rate` a second into `state`'s outbox; the times each was written."""

    def __init__(self, state, sender, to, rate, tag):
        super().__init__(daemon=True)
        self.state, self.sender, self.to, self.rate, self.tag = state, sender, to, rate, tag
        self.sent = {}              # body -> when written
        self.stop = threading.Event()

    def run(self):
        k = 0
        while not self.stop.wait(1.0 / self.rate):
            body = f"{self.tag}-{k}"
            self.sent[body] = time.time()
            fedkit.drop(self.state, self.sender, f"{self.tag}{k}", f"TO: {self.to}\n\n{body}")
            k += 1


class Reader(threading.Thread):
    """Reads A1's new/ every 5 ms: each envelope's body, and when it arrived (its mtime)."""

    def __init__(self, state, agent):
        super().__init__(daemon=True)
        self.box = Path(state) / "inbox" / agent / "new"
        self.got = {}               # body -> [arrival times]
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(0.005):
            self.sweep()

    def sweep(self):
        for p in list(self.box.iterdir()):
            if p.name.startswith("."):
                continue
            try:
                doc = json.loads(p.read_bytes())
                at = p.stat().st_mtime
                p.unlink()          # read: A1's queue stays short
            except (OSError, ValueError):
                continue
            body = doc.get("body") if isinstance(doc, dict) else None
            if isinstance(body, str):   # (a notice of relay's own has one too; any other is no probe)
                self.got.setdefault(body, []).append(at)


class Hostile:
    """n3 on its own ACL user: announces Eve, reads nothing, acknowledges nothing."""

    def __init__(self, url, team):
        import redis
        from relay.federation.keys import Keys
        self.r = redis.Redis.from_url(url)
        self.keys = Keys(team)
        self.n = 0
        self.read_after = "-"       # the squatter's cursor in n1's stream to n3
        self.announce(["Eve"])

    def announce(self, agents):
        secs, _ = self.r.time()
        self.r.hset(self.keys.node("n3"), mapping={"agents": json.dumps(agents), "v": f"v{len(agents)}-{agents[-1]}",
                                                   "seen": secs, "timeout": 3600, "owner": "n3-host"})

    def entry(self, sender, to, body="x", kind="message"):
        from relay.ids import IdGenerator
        mid = IdGenerator().new(time.time())
        env = {"id": mid, "from": sender, "to": [to], "kind": kind, "body": body, "sha256": "0" * 64, "headers": {}}
        self.r.xadd(self.keys.messages("n3", "n1"), {"v": "2", "id": mid, "to": json.dumps([to]), "env": json.dumps(env)})

    def unknown(self):
        self.n += 1
        self.entry(f"Ghost{self.n}", "A1")

    def prepare(self, name, small):
        """What an attack stores before it runs (outside the phases measured)."""
        if name == "keyspace":
            pipe = self.r.pipeline(transaction=False)
            for i in range(20_000 if small else 1_000_000):
                pipe.hset(f"{self.keys.prefix}from:n3:junk:{i}", "x", "1")
                if i % 10_000 == 9_999:
                    pipe.execute()
            pipe.execute()
        if name == "shed":
            self.announce(["Eve", "SYSTEM"])

    def squat(self):
        """List and claim every name n1 and n2 list, and every sender of n1's stream to n3."""
        names = set()
        for node in ("n1", "n2"):
            try:
                names.update(json.loads(self.r.hget(self.keys.node(node), "agents") or b"[]"))
            except ValueError:
                pass
        for eid, fields in self.r.xrange(self.keys.messages("n1", "n3"), self.read_after, count=1000):
            self.read_after = "(" + eid.decode()
            try:
                names.add(json.loads(fields[b"env"])["from"])
            except (KeyError, ValueError, TypeError):
                pass
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            pipe.setnx(f"{self.keys.prefix}claim:{name.casefold()}", "n3")
        pipe.execute(raise_on_error=False)
        self.announce(sorted(names | {n.upper() for n in names} | {"Eve"}))

    def wide(self, small, to="n1"):
        """The two commands of the wide attack, packed once (packing a million fields costs the
        attacker a second each time): an entry to `to`, and an acknowledgement entry."""
        fields = []
        for i in range(WIDE // 10 if small else WIDE):
            fields += [f"f{i}", ""]
        conn = self.r.connection_pool.get_connection()
        packed = conn.pack_commands([("XADD", self.keys.messages("n3", to), "*", "v", "2", *fields),
                                     ("XADD", self.keys.acks("n3", to), "*", "acks", "[]", *fields)])
        return conn, packed

    def attack(self, name, stop, small):
        period = {"republish": 1.0, "keyspace": 0.02, "unknown": 0.02, "ackflood": 0.1, "shed": 0.1, "squat": 0.1,
                  "wide": 1.0, "wide-own": 1.0, "flood": 0.02}[name]
        from relay.ids import IdGenerator
        ids, beat = IdGenerator(), 0
        if name in ("wide", "wide-own"):
            conn, packed = self.wide(small, "n1" if name == "wide" else "nobody")
        while not stop.wait(period):
            beat += 1
            if name == "republish":
                first = self.r.xrange(self.keys.messages("n1", "n3"), count=1)
                if first:
                    self.r.xdel(self.keys.messages("n1", "n3"), first[0][0])
            elif name in ("keyspace", "unknown"):
                self.unknown()
            elif name == "ackflood":
                self.r.xadd(self.keys.acks("n3", "n1"), {"acks": json.dumps([[ids.new(time.time()), None, None]
                                                                             for _ in range(8192)])}, maxlen=1000)
            elif name == "shed":
                self.entry("Eve", "A2", body="y" * (512 << 10))
                self.entry("SYSTEM", "A1", body="stop", kind="ping")
            elif name == "squat":
                self.squat()
            elif name in ("wide", "wide-own"):
                conn.send_packed_command(packed)
                conn.read_response(), conn.read_response()
            elif name == "flood":
                pipe = self.r.pipeline(transaction=False)
                for _ in range(240):
                    pipe.xadd(self.keys.messages("n3", "n1"), {"v": "1"})
                pipe.execute()
        if name == "keyspace":
            for i in range(0, 20_000 if small else 1_000_000, 10_000):
                self.r.delete(*[f"{self.keys.prefix}from:n3:junk:{j}" for j in range(i, i + 10_000)])
        if name in ("shed", "squat"):
            self.announce(["Eve"])


def reach(states, out, timeout=60.0):
    """A new agent on n1 (Neo) writes to Eve at once, and B0 on n2 writes to it: the seconds from
    its directories' making until B0's message is in its inbox, in out["reach"] (None: not within
    `timeout`), and who holds its claim."""
    began = time.monotonic()
    for sub in ("tmp", "new", "cur"):
        (states["n1"] / "inbox" / "Neo" / sub).mkdir(parents=True, exist_ok=True)
    fedkit.drop(states["n1"], "Neo", "neo-first", "TO: Eve\n\nNeo here")
    fedkit.drop(states["n2"], "B0", "to-neo", "TO: Neo\n\nwelcome, Neo")
    box = states["n1"] / "inbox" / "Neo" / "new"
    while time.monotonic() - began < timeout:
        if any(not p.name.startswith(".") for p in box.iterdir()):
            out["reach"] = time.monotonic() - began
            return
        time.sleep(0.05)
    out["reach"] = None


def setup(base, small):
    server = fedkit.RedisServer(base / "redis", appendfsync="everysec").start()
    import redis
    from relay.federation.keys import acl, registration
    admin = redis.Redis.from_url(server.url)
    team = "hostile"
    urls = {}
    for node in ("n1", "n2", "n3"):
        for line in (acl(team, node, f"pw-{node}"), registration(team, node)):
            admin.execute_command(*shlex.split(line))
        urls[node] = f"redis://relay-{team}-{node}:pw-{node}@127.0.0.1:{server.port}/0"
    states = {"n1": fedkit.write_config(base / "n1", urls["n1"], team, "n1", ["A0", "A1", "A2"],
                                        "queue_limit = 64\npair_rate = 0"),
              "n2": fedkit.write_config(base / "n2", urls["n2"], team, "n2", ["B0"])}
    hostile = Hostile(urls["n3"], team)
    procs = {n: fedkit.start_daemon(base / n) for n in ("n1", "n2")}
    wait_for("the directory", lambda: query(states["n1"], "SELECT 1 FROM remote_agents WHERE name = 'B0'")
             and query(states["n1"], "SELECT 1 FROM remote_agents WHERE name = 'Eve'")
             and query(states["n2"], "SELECT 1 FROM remote_agents WHERE name = 'A1'"), 60)
    return server, admin, states, hostile, procs


def commands(admin):
    """{command: (calls, microseconds)} the server counted since its start."""
    return {k[len("cmdstat_"):]: (v["calls"], v["usec"]) for k, v in admin.info("commandstats").items()}


def phase(seconds, procs, server, probe, admin):
    """CPU of the daemon and redis-server, the server's busiest commands (calls, ms), and the
    local p50, over `seconds`."""
    pid = procs["n1"].pid
    start = set(probe.sent)     # (copied at once: the probe's thread adds to it meanwhile)
    k0 = commands(admin)
    c0, r0, t0 = cpu_seconds(pid), cpu_seconds(server.proc.pid), time.monotonic()
    time.sleep(seconds)
    c1, r1, t1 = cpu_seconds(pid), cpu_seconds(server.proc.pid), time.monotonic()
    k1 = commands(admin)
    spent = sorted(((k1[k][1] - k0.get(k, (0, 0))[1], k1[k][0] - k0.get(k, (0, 0))[0], k) for k in k1), reverse=True)
    return {"daemon": 100 * (c1 - c0) / (t1 - t0), "redis": 100 * (r1 - r0) / (t1 - t0),
            "busiest": [(k, calls, usec // 1000) for usec, calls, k in spent[:3] if usec],
            "bodies": [b for b in list(probe.sent) if b not in start]}


def p50(bodies, probe, reader):
    lat = [1000 * (reader.got[b][0] - probe.sent[b]) for b in bodies if b in reader.got]
    return statistics.median(lat) if lat else None


def run(seconds=10.0, only=None, small=False, echo=print, base=None):
    attacks = [a for a in ATTACKS if only is None or a in only]
    made = base is None
    base = Path(base or tempfile.mkdtemp(prefix="relay-fedhostile-"))
    server, admin, states, hostile, procs = setup(base, small)
    local = Probe(states["n1"], "A0", "A1", 20, "local")
    cross = Probe(states["n2"], "B0", "A1", 5, "cross")
    reader = Reader(states["n1"], "A1")
    results = {}
    forked = multiprocessing.get_context("fork")
    try:
        backlog = 200 if small else 8000
        for k in range(backlog):    # what waits for n3 (it never acknowledges)
            fedkit.drop(states["n1"], "A0", f"eve{k}", f"TO: Eve\n\nbacklog {k}")
        wait_for("the backlog published", lambda: query(states["n1"], "SELECT count(*) FROM outbound WHERE "
                                                        "status = 'published'")[0][0] >= backlog, 120)
        for t in (local, cross, reader):
            t.start()
        for name in attacks:
            hostile.prepare(name, small)
            quiet = phase(seconds, procs, server, local, admin)
            # The attacker is a process of its own: its work must not take this one's interpreter
            # from the probes that time the local deliveries.
            stop = forked.Event()
            events0 = query(states["n1"], "SELECT count(*) FROM events")[0][0]
            size0 = (states["n1"] / "ledger.sqlite").stat().st_size
            attacker = forked.Process(target=hostile.attack, args=(name, stop, small), daemon=True)
            attacker.start()
            reached = {}
            if name == "squat":
                probe = threading.Thread(target=reach, args=(states, reached), daemon=True)
                probe.start()
            loud = phase(seconds, procs, server, local, admin)
            if name == "squat":
                probe.join()
                reached["claim"] = (admin.get(f"{hostile.keys.prefix}claim:neo") or b"").decode()
            stop.set()
            attacker.join(timeout=120)
            if attacker.is_alive():
                attacker.terminate()
            row = {**reached, "without": {k: quiet[k] for k in ("daemon", "redis")},
                   "with": {k: loud[k] for k in ("daemon", "redis")}, "busiest": loud["busiest"]}
            row["without"]["p50"], row["with"]["p50"] = p50(quiet["bodies"], local, reader), p50(loud["bodies"], local, reader)
            row["events"] = query(states["n1"], "SELECT count(*) FROM events")[0][0] - events0
            row["ledger_bytes"] = (states["n1"] / "ledger.sqlite").stat().st_size - size0
            results[name] = row
            echo(line(name, row))
        for t in (local, cross):
            t.stop.set()
            t.join()
        wanted = set(local.sent) | set(cross.sent)
        wait_for("every probe delivered", lambda: (reader.sweep() or True) and wanted <= set(reader.got), 120)
        reader.stop.set()
        reader.join()
        reader.sweep()
        lost = len(wanted - set(reader.got))
        duplicated = sum(1 for b, at in reader.got.items() if len(at) > 1)
        system = sum(1 for b in reader.got if b == "stop")
        results["_"] = {"sent": len(wanted), "lost": lost, "duplicated": duplicated, "system_delivered": system}
        echo(f"sent {len(wanted)} (local and from n2), lost {lost}, duplicated {duplicated}, "
             f"SYSTEM delivered {system}")
    finally:
        for t in (local, cross, reader):
            t.stop.set()
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=30)
            except Exception:  # noqa: BLE001 - a daemon that does not stop is killed
                p.kill()
        server.stop()
        if "_" not in results or results["_"]["lost"] or results["_"]["duplicated"]:
            echo(f"kept for a look: {base}")
        if made and "_" in results and not results["_"]["lost"] and not results["_"]["duplicated"]:
            import shutil
            shutil.rmtree(base, ignore_errors=True)
    return results


def line(name, row):
    w, o = row["with"], row["without"]
    ratio = f"{w['p50'] / o['p50']:.2f}x" if w["p50"] and o["p50"] else "-"
    shown = lambda v: f"{v:.1f}" if v is not None else "-"      # noqa: E731
    return (f"{name:10} daemon {o['daemon']:5.1f}% -> {w['daemon']:5.1f}%   redis {o['redis']:5.1f}% -> "
            f"{w['redis']:5.1f}%   local p50 {shown(o['p50'])} -> {shown(w['p50'])} ms ({ratio})   "
            f"n1 events +{row['events']}, ledger +{row['ledger_bytes'] >> 10} KiB   server's busiest "
            + ", ".join(f"{k} {calls}x {ms} ms" for k, calls, ms in row["busiest"])
            + (f"   new agent reached in {shown(row['reach'])} s, its claim {row['claim'] or '-'}'s"
               if "reach" in row else ""))


def own_writes(results, name):
    """What the server spends on the attacker's own writes alone, for an attack that has a
    control (the same writes to a stream no node reads, `<name>-own`): its CPU then, above the
    phase without it. A node may always spend the server's time writing its own keys; only the
    server's configuration bounds that."""
    control = results.get(f"{name}-own")
    return max(0.0, control["with"]["redis"] - control["without"]["redis"]) if control else 0.0


def within(results):
    bad = []
    for name, row in results.items():
        if name == "_":
            continue
        w, o = row["with"], row["without"]
        if w["daemon"] > BUDGET["daemon"] or w["redis"] - own_writes(results, name) > BUDGET["redis"]:
            bad.append(f"{name}: CPU over budget")
        if w["p50"] and o["p50"] and w["p50"] > BUDGET["p50"] * o["p50"]:
            bad.append(f"{name}: local p50 over {BUDGET['p50']}x")
        if "reach" in row and (row["reach"] is None or row["reach"] > REACH or row["claim"] != "n1"):
            bad.append(f"{name}: a new agent not reached within {REACH:g} s, or its name not its node's")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="each phase, with and without (default 10)")
    ap.add_argument("--only", help=f"attacks, comma separated (of {', '.join(ATTACKS)})")
    ap.add_argument("--small", action="store_true", help="the soak test's sizes (a backlog of 200, 20,000 keys)")
    ap.add_argument("--deadline", type=float, default=1800.0, help="seconds after which the run is stopped")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    if only and only - set(ATTACKS):
        sys.exit(f"fedhostile: no attack {', '.join(sorted(only - set(ATTACKS)))} (of {', '.join(ATTACKS)})")
    if fedkit.REDIS_SERVER is None:
        sys.exit(fedkit.MISSING)
    signal.signal(signal.SIGALRM, lambda *_: sys.exit("fedhostile: over its deadline; stopped"))
    signal.alarm(int(args.deadline))
    results = run(args.seconds, only, args.small)
    bad = within(results) + (["messages lost or duplicated"] if results["_"]["lost"] or results["_"]["duplicated"]
                             else [])
    print("budget: " + ("met" if not bad else "; ".join(bad)))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
