"""Federation under faults, one after another: two `relay run` daemons (n1 with A0, A1; n2 with
B0, B1) exchange messages both ways at a steady rate while the link to the server, or the server
itself, fails. Each node has its own ACL user (`relay federation acl NODE --team TEAM`, applied by
an admin connection and saved to an ACL file, so the users survive a restart of the server).

    python benchmarks/fedfaults.py                          # every fault, about 2-3 minutes
    python benchmarks/fedfaults.py --only cut --seconds 10  # one fault (or several: --only cut,oom)

Faults of the link: each node talks to redis-server through a TCP proxy of its own (in this
script, loopback only), which for `--seconds`:
  blackhole  keeps every connection open and forwards nothing (held, as by a partition);
  reset      resets every connection (RST), again every 0.2 s;
  latency    delays every chunk by 50 ms each way;
  cut        forwards only the first half of a server reply, then resets the connection (half
             of the replies, at random);
Faults of the server (the nodes still go through the proxies):
  flushall   n2's daemon stopped, 100 messages sent to it from n1 (and published), FLUSHALL by
             the admin, n2 started again;
  restart    redis-server stopped, its data (AOF) removed, started again (its ACL file kept);
  oom        maxmemory below what the server holds (noeviction: writes refused), n2's daemon
             restarted, `--seconds` later maxmemory raised again;
  failover   a master, a replica and a redis-sentinel (the nodes use the redis+sentinel:// URL):
             the replica's replication paused (CLIENT PAUSE WRITE on it), messages published,
             the master killed (SIGKILL), the lagging replica promoted by Sentinel.

Per fault: sent (messages written, both ways), lost and duplicated (deliveries: a recipient
holding a message 0 or 2+ times, counted again at the end of the run), the longest delay (the
rename into an outbox to the envelope's mtime in the recipient's new/), resume (the end of the
fault to the first delivery after it) and drained (the end of the fault to the delivery of the
last message written before that end). Exits 1 when any fault lost or duplicated a message; the
directory (logs, ledgers, inboxes) is then kept and named.
"""
import argparse
import collections
import importlib.util
import json
import os
import random
import secrets
import selectors
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

_spec = importlib.util.spec_from_file_location("fedkit", Path(__file__).parent / "fedkit.py")
fedkit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fedkit)

NODES = {"n1": ["A0", "A1"], "n2": ["B0", "B1"]}
PROXY_FAULTS = ("blackhole", "reset", "latency", "cut")
SERVER_FAULTS = ("flushall", "restart", "oom")
FAULTS = PROXY_FAULTS + SERVER_FAULTS + ("failover",)
LEAD = 1.0              # seconds of traffic before a fault ...
TAIL = 1.5              # ... and after it
LATENCY = 0.05          # seconds added each way by the latency fault
RESET_EVERY = 0.2       # seconds between two resets of every connection
CUT_RATIO = 0.5         # the share of server replies cut
BACKLOG = 100           # messages for the stopped node in the flushall fault
ADMIN = "admin-" + secrets.token_hex(8)
# What is measured is the way across, not flow control: its limits are off (as in federation.py).
LIMITS = "pair_rate = 0\nqueue_limit = 0"


# -- the proxy --------------------------------------------------------------------------------

class _Pipe:
    """One proxied connection: the client's socket ("c"), the server's ("s"), and what waits to
    be written to each, as [due, bytes]."""
    __slots__ = ("socks", "queue", "size", "events", "last_due", "eof", "cut")

    def __init__(self, client, server):
        self.socks = {"c": client, "s": server}
        self.queue = {"c": collections.deque(), "s": collections.deque()}
        self.size = {"c": 0, "s": 0}
        self.events = {"c": 0, "s": 0}
        self.last_due = {"c": 0.0, "s": 0.0}
        self.eof = None         # the side that closed: the pipe closes once the other side got the rest
        self.cut = False        # a reply was cut: the pipe closes once the client got its first part


class Proxy:
    """A TCP proxy on 127.0.0.1 to one upstream port, in one thread (selectors). Bounded: at
    most MAX_CONNS connections, MAX_BUFFER bytes held per direction of each (reading stops past
    it), a tick of TICK seconds. `mode` is None or one of PROXY_FAULTS, set from another thread."""
    MAX_CONNS = 64
    MAX_BUFFER = 1 << 20
    TICK = 0.005

    def __init__(self, upstream):
        self.upstream = upstream
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self.pipes = set()
        self.mode = None
        self.rnd = random.Random(self.port)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=f"proxy-{self.port}", daemon=True)
        self.accepted = self.resets = self.cuts = 0

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.stopping.set()
        self.thread.join(timeout=5)
        for pipe in list(self.pipes):
            self._close(pipe)
        self.sel.close()
        self.listener.close()

    def _loop(self):
        next_reset = 0.0
        while not self.stopping.is_set():
            now = time.monotonic()
            mode = self.mode
            if mode == "reset" and now >= next_reset:
                for pipe in list(self.pipes):
                    self._close(pipe, rst=True)
                    self.resets += 1
                next_reset = now + RESET_EVERY
            held = mode == "blackhole"
            for pipe in list(self.pipes):
                for side, other in (("c", "s"), ("s", "c")):
                    ev = 0
                    if not held and pipe.eof is None and not pipe.cut and pipe.size[other] < self.MAX_BUFFER:
                        ev |= selectors.EVENT_READ
                    if not held and pipe.queue[side] and pipe.queue[side][0][0] <= now:
                        ev |= selectors.EVENT_WRITE
                    self._want(pipe, side, ev)
            for key, mask in self.sel.select(self.TICK):
                if key.data is None:
                    self._accept()
                    continue
                pipe, side = key.data
                if pipe not in self.pipes:
                    continue
                try:
                    if mask & selectors.EVENT_WRITE:
                        self._write(pipe, side)
                    if mask & selectors.EVENT_READ and pipe in self.pipes:
                        self._read(pipe, side, mode)
                except OSError:
                    self._close(pipe)
            for pipe in list(self.pipes):
                if pipe.eof is not None and not pipe.queue["s" if pipe.eof == "c" else "c"]:
                    self._close(pipe)
                elif pipe.cut and not pipe.queue["c"]:
                    self._close(pipe, rst=True)

    def _want(self, pipe, side, ev):
        if ev == pipe.events[side]:
            return
        sock = pipe.socks[side]
        if pipe.events[side] == 0:
            self.sel.register(sock, ev, (pipe, side))
        elif ev == 0:
            self.sel.unregister(sock)
        else:
            self.sel.modify(sock, ev, (pipe, side))
        pipe.events[side] = ev

    def _accept(self):
        try:
            client, _ = self.listener.accept()
        except OSError:
            return
        if len(self.pipes) >= self.MAX_CONNS:
            client.close()
            return
        try:
            server = socket.create_connection(("127.0.0.1", self.upstream), timeout=1.0)
        except OSError:             # the server is down: the client sees its connection closed
            client.close()
            return
        for s in (client, server):
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.pipes.add(_Pipe(client, server))
        self.accepted += 1

    def _read(self, pipe, side, mode):
        data = pipe.socks[side].recv(65536)
        if not data:
            pipe.eof = side
            return
        other = "s" if side == "c" else "c"
        if side == "s" and mode == "cut" and self.rnd.random() < CUT_RATIO:
            data = data[:len(data) // 2]
            pipe.cut = True
            self.cuts += 1
        if not data:
            return
        now = time.monotonic()
        due = max(now + (LATENCY if mode == "latency" else 0.0), pipe.last_due[other])
        pipe.last_due[other] = due
        pipe.queue[other].append([due, data])
        pipe.size[other] += len(data)

    def _write(self, pipe, side):
        q = pipe.queue[side]
        while q and q[0][0] <= time.monotonic():
            head = q[0]
            n = pipe.socks[side].send(head[1])
            pipe.size[side] -= n
            if n < len(head[1]):
                head[1] = head[1][n:]
                return
            q.popleft()

    def _close(self, pipe, rst=False):
        self.pipes.discard(pipe)
        for side, sock in pipe.socks.items():
            if pipe.events[side]:
                try:
                    self.sel.unregister(sock)
                except (KeyError, ValueError):
                    pass
            try:
                if rst:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                sock.close()
            except OSError:
                pass


# -- servers ----------------------------------------------------------------------------------

class Server(fedkit.RedisServer):
    """A redis-server whose default user (the admin) has a password, its users in an ACL file
    outside its data directory (kept when the data is removed), noeviction."""

    def __init__(self, directory, extra=()):
        directory = Path(directory)
        self.aclfile = directory.parent / f"{directory.name}.acl"
        directory.parent.mkdir(parents=True, exist_ok=True)
        self.aclfile.write_text(f"user default on >{ADMIN} ~* &* +@all\n")
        super().__init__(directory, extra=["--aclfile", str(self.aclfile), "--maxmemory-policy", "noeviction",
                                           *extra])

    def start(self, timeout=10.0):
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [self.program, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--appendonly", "yes", "--appendfsync", self.appendfsync, "--save", "", "--daemonize", "no",
             "--protected-mode", "no", "--logfile", str(self.dir / "redis.log"), *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.admin(timeout=0.5).ping():
                    return self
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError(f"redis-server did not start on port {self.port}: see {self.dir / 'redis.log'}")

    def admin(self, timeout=5.0):
        import redis
        return redis.Redis(host="127.0.0.1", port=self.port, username="default", password=ADMIN,
                           socket_timeout=timeout, socket_connect_timeout=timeout)

    def wipe(self):
        """Remove the data directory's contents (its log kept)."""
        for p in self.dir.iterdir():
            if p.name != "redis.log":
                shutil.rmtree(p) if p.is_dir() else p.unlink()


def acl_lines(team, passwords, cwd):
    """`relay federation acl NODE --team TEAM --password PW`, one line per node."""
    lines = []
    for node, password in passwords.items():
        out = subprocess.run([sys.executable, "-m", "relay", "federation", "acl", node, "--team", team,
                              "--password", password, "--no-save"], cwd=cwd, capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, RELAY_LOG_LEVEL="ERROR"))
        if out.returncode != 0:
            raise RuntimeError(f"relay federation acl {node} failed: {out.stderr.strip()}")
        lines.extend(out.stdout.splitlines())     # the user, and the node's line in the team's registry
    return lines


def apply_acls(server, lines, replica=False):
    """The lines on `server`; on a replica only the ACL lines (users are not replicated, the
    registry's SADD is, and a replica refuses writes)."""
    admin = server.admin()
    try:
        for line in lines:
            words = shlex.split(line)
            if replica and words[0].upper() != "ACL":
                continue
            admin.execute_command(*words)
        admin.execute_command("ACL", "SAVE")
    finally:
        admin.close()


def wait_for(what, check, timeout, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return True
        except Exception:  # noqa: BLE001 - not yet
            pass
        time.sleep(step)
    raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")


def query(state, sql, args=()):
    db = sqlite3.connect(f"file:{state / 'ledger.sqlite'}?mode=ro", uri=True, timeout=10)
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


def known(state, name):
    try:
        return bool(query(state, "SELECT 1 FROM remote_agents WHERE name = ?", (name,)))
    except sqlite3.Error:
        return False


# -- a team: servers, proxies, the two daemons --------------------------------------------------

class Team:
    """kind "plain": one redis-server, a proxy per node. kind "sentinel": a master, a replica and
    a redis-sentinel, the nodes on the redis+sentinel:// URL (no proxy)."""

    def __init__(self, base, kind):
        self.base = Path(base) / kind
        self.kind = kind
        self.team = f"ff{kind[0]}"
        self.passwords = {n: secrets.token_urlsafe(12) for n in NODES}
        self.proxies = {}
        self.servers = []
        self.sentinel = None
        self.procs = {}
        self.logs = collections.defaultdict(list)
        lines = acl_lines(self.team, self.passwords, self.base.parent)
        if kind == "plain":
            self.server = Server(self.base / "redis").start()
            self.servers = [self.server]
            apply_acls(self.server, lines)
            self.proxies = {n: Proxy(self.server.port).start() for n in NODES}
            urls = {n: f"redis://relay-{self.team}-{n}:{self.passwords[n]}@127.0.0.1:{self.proxies[n].port}/0"
                    for n in NODES}
        else:
            self.server = Server(self.base / "master", extra=["--repl-diskless-sync-delay", "0"]).start()
            self.replica = Server(self.base / "replica", extra=["--replicaof", "127.0.0.1", str(self.server.port),
                                                                "--masterauth", ADMIN]).start()
            self.servers = [self.server, self.replica]
            for s in self.servers:
                apply_acls(s, lines, replica=s is self.replica)
            r = self.replica.admin()
            wait_for("the replica's first sync", lambda: r.info("replication")["master_link_status"] == "up", 30)
            r.close()
            self.sentinel = fedkit.Sentinel(self.base / "sentinel", self.server.port)
            with open(self.sentinel.conf, "a") as f:
                f.write(f"sentinel auth-pass {self.sentinel.service} {ADMIN}\n")
            self.sentinel.start()
            urls = {n: f"redis+sentinel://relay-{self.team}-{n}:{self.passwords[n]}@127.0.0.1:{self.sentinel.port}"
                       f"/{self.sentinel.service}/0" for n in NODES}
        self.states = {n: fedkit.write_config(self.base / n, urls[n], self.team, n, agents, LIMITS)
                       for n, agents in NODES.items()}
        for n in NODES:
            self.start(n)
        wait_for("the nodes to see each other", lambda: known(self.states["n1"], "B0")
                 and known(self.states["n2"], "A0"), 60)

    def start(self, node):
        proc = fedkit.start_daemon(self.base / node, self.base, {"RELAY_LOG_LEVEL": "INFO"})
        self.procs[node] = proc
        self.logs[node].append(proc.log)

    def stop(self, node):
        proc = self.procs.pop(node, None)
        if proc is None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def left(self):
        """Outbound rows not yet acknowledged, per node, and entries left in the streams."""
        out = {}
        for n, state in self.states.items():
            out[f"{n}_unacknowledged"] = query(state, "SELECT count(*) FROM outbound WHERE status IN "
                                                      "('pending', 'published')")[0][0]
        try:
            admin = self.current_master().admin()
            for a in NODES:
                for b in NODES:
                    if a == b:
                        continue
                    entries = admin.xrange(f"relay:{{{self.team}}}:from:{a}:to:{b}", count=10_000)
                    out[f"stream_{a}_{b}"] = len(entries)
                    ids = [f.get(b"id", b"").decode() for _, f in entries]
                    done = [i for i in ids if query(self.states[a], "SELECT 1 FROM outbound WHERE message_id = ? AND "
                                                                   "node = ? AND status = 'acknowledged'", (i, b))]
                    if done:        # entries of messages acknowledged: nobody deletes them any more
                        out[f"stream_{a}_{b}_of_acknowledged"] = len(done)
                        out[f"stream_{a}_{b}_of_acknowledged_ids"] = done[:5]
            admin.close()
        except Exception as e:  # noqa: BLE001 - the server away: said
            out["server"] = str(e)
        return out

    def current_master(self):
        if self.sentinel is None:
            return self.server
        import redis
        s = redis.Redis(port=self.sentinel.port, socket_timeout=2)
        try:
            _, port = s.sentinel_get_master_addr_by_name(self.sentinel.service)
        finally:
            s.close()
        return next(x for x in self.servers if x.port == int(port))

    def close(self):
        for n in list(self.procs):
            self.stop(n)
        for p in self.proxies.values():
            p.stop()
        if self.sentinel is not None:
            self.sentinel.stop()
        for s in self.servers:
            s.stop()


# -- traffic and what arrived -----------------------------------------------------------------

class Traffic:
    """A producer per node writing to the other node's agents at `rate` messages a second (one
    in ten to both); each message's token, recipients and the time of its rename recorded."""

    def __init__(self, rate, seed):
        self.rate = rate
        self.rnd = random.Random(seed)
        self.sent = {}              # token -> (fault, node, [recipients], written at)
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = []
        self.counter = 0

    def message(self, state, node, fault, sender=None, recipients=None):
        other = [a for n, agents in NODES.items() if n != node for a in agents]
        with self.lock:
            self.counter += 1
            token = f"{fault}-{node}-{self.counter}"
            sender = sender or self.rnd.choice(NODES[node])
            recipients = recipients or (other if self.rnd.random() < 0.1 else [self.rnd.choice(other)])
        fedkit.drop(state, sender, f"m-{token}", f"TO: {', '.join(recipients)}\n\n{token}")
        with self.lock:
            self.sent[token] = (fault, node, recipients, time.time())

    def start(self, team, fault):
        self.stopping.clear()
        self.threads = [threading.Thread(target=self._produce, args=(team.states[n], n, fault), daemon=True)
                        for n in NODES]
        for t in self.threads:
            t.start()

    def _produce(self, state, node, fault):
        t0, i = time.monotonic(), 0
        while not self.stopping.is_set():
            self.message(state, node, fault)
            i += 1
            ahead = t0 + i / self.rate - time.monotonic()
            if ahead < -1.0:        # behind by more than a second: no burst to catch up
                t0, i = time.monotonic(), 0
            elif ahead > 0:
                self.stopping.wait(ahead)

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=10)
        self.threads = []

    def expected(self, fault):
        with self.lock:
            return [(r, token, at) for token, (f, _, rs, at) in self.sent.items() if f == fault for r in rs]


class Inboxes:
    """What the recipients hold: (agent, body) -> [mtime of each envelope], read incrementally."""

    def __init__(self):
        self.dirs = []
        self.seen = set()
        self.got = collections.defaultdict(list)

    def watch(self, team):
        self.dirs += [(a, team.states[n] / "inbox" / a / "new") for n, agents in NODES.items() for a in agents]

    def scan(self):
        for agent, d in self.dirs:
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            for e in entries:
                if e.name.startswith(".") or e.path in self.seen:
                    continue
                try:
                    doc = json.loads(Path(e.path).read_bytes())
                    mtime = e.stat().st_mtime
                except (OSError, ValueError):
                    continue
                self.seen.add(e.path)
                self.got[(agent, doc.get("body"))].append(mtime)


# -- the faults -------------------------------------------------------------------------------
# Each takes the team and `seconds` and returns (the time the fault ended, notes).

def proxy_fault(kind):
    def fault(team, seconds):
        for p in team.proxies.values():
            p.mode = kind
        time.sleep(seconds)
        for p in team.proxies.values():
            p.mode = None
        notes = {"connections": sum(p.accepted for p in team.proxies.values())}
        if kind == "reset":
            notes["resets"] = sum(p.resets for p in team.proxies.values())
        if kind == "cut":
            notes["cuts"] = sum(p.cuts for p in team.proxies.values())
        return time.time(), notes
    return fault


def flushall(team, seconds, traffic):
    team.stop("n2")
    for i in range(BACKLOG):
        traffic.message(team.states["n1"], "n1", "flushall", sender=NODES["n1"][i % 2],
                        recipients=[NODES["n2"][i % 2]])
    admin = team.server.admin()
    key = f"relay:{{{team.team}}}:from:n1:to:n2"
    try:
        wait_for("the backlog to be published", lambda: admin.xlen(key) >= BACKLOG, 30)
        flushed = admin.xlen(key)
        admin.flushall()
    finally:
        admin.close()
    team.start("n2")
    return time.time(), {"flushed_entries": flushed}


def restart(team, seconds):
    team.server.stop()
    team.server.wipe()
    time.sleep(1.0)
    team.server.start()
    return time.time(), {"down_s": 1.0}


def oom(team, seconds):
    admin = team.server.admin()
    try:
        used = int(admin.info("memory")["used_memory"])
        admin.config_set("maxmemory", str(used // 2))
        team.stop("n2")
        team.start("n2")
        time.sleep(seconds)
        refused = admin.info("stats").get("total_error_replies")
        admin.config_set("maxmemory", "0")
    finally:
        admin.close()
    return time.time(), {"maxmemory": used // 2, "error_replies": refused}


def failover(team, seconds):
    import redis
    master, replica = team.server, team.replica
    s = redis.Redis(port=team.sentinel.port, socket_timeout=2)
    r = replica.admin()
    m = master.admin()
    try:
        wait_for("Sentinel to know the replica", lambda: any(
            int(x["port"]) == replica.port and not x.get("is_sdown") and not x.get("is_disconnected")
            for x in s.sentinel_slaves(team.sentinel.service)), 30)
        r.execute_command("CLIENT", "PAUSE", "60000", "WRITE")     # the replica stops applying the stream
        time.sleep(max(1.0, seconds / 2))                            # messages published meanwhile
        lag = int(m.info("replication")["master_repl_offset"]) - int(r.info("replication")["slave_repl_offset"])
        master.stop(signal.SIGKILL)
        wait_for("the replica to see its master gone",
                 lambda: r.info("replication")["master_link_status"] == "down", 10)
        r.execute_command("CLIENT", "UNPAUSE")          # what it had not applied is gone with the link
        wait_for("Sentinel to promote the replica", lambda: int(
            s.sentinel_get_master_addr_by_name(team.sentinel.service)[1]) == replica.port, 60, 0.1)
        wait_for("the replica to take writes", lambda: r.info("replication")["role"] == "master", 30)
    finally:
        for c in (s, r, m):
            c.close()
    return time.time(), {"lag_bytes": lag}


# -- running ----------------------------------------------------------------------------------

def figures(fault, traffic, inboxes, end):
    expected = traffic.expected(fault)
    firsts, delays = [], []
    lost = duplicated = 0
    drained = 0.0
    for agent, token, at in expected:
        got = inboxes.got.get((agent, token), [])
        if not got:
            lost += 1
            continue
        duplicated += len(got) > 1
        first = min(got)
        firsts.append(first)
        delays.append(first - at)
        if at <= end:
            drained = max(drained, first - end)
    after = [t for t in firsts if t >= end]
    return {"sent": len({t for _, t, _ in expected}), "deliveries": len(expected), "lost": lost,
            "duplicated": duplicated, "max_delay_s": round(max(delays), 2) if delays else None,
            "resume_s": round(min(after) - end, 2) if after else None,
            "drained_s": None if lost else round(drained, 2)}


def scenario(fault, team, traffic, inboxes, seconds, drain, echo):
    traffic.start(team, fault)
    time.sleep(LEAD)
    if fault in PROXY_FAULTS:
        end, notes = proxy_fault(fault)(team, seconds)
    elif fault == "flushall":
        end, notes = flushall(team, seconds, traffic)
    else:
        end, notes = {"restart": restart, "oom": oom, "failover": failover}[fault](team, seconds)
    notes["end"] = time.strftime("%H:%M:%S", time.localtime(end)) + f".{int(end % 1 * 1000):03d}"
    time.sleep(TAIL)
    traffic.stop()
    deadline = time.monotonic() + drain
    while time.monotonic() < deadline:
        inboxes.scan()
        if all(inboxes.got.get((a, t)) for a, t, _ in traffic.expected(fault)):
            break
        time.sleep(0.05)
    inboxes.scan()
    for node, proc in list(team.procs.items()):
        if proc.poll() is not None:     # a daemon that died is said, and started again for the next fault
            last = [x.strip() for x in open(proc.log, errors="replace") if x.strip()][-1:] or [""]
            notes[f"{node}_exited"] = f"rc={proc.returncode}: {last[0][:200]}"
            team.procs.pop(node)
            team.start(node)
    result = dict(figures(fault, traffic, inboxes, end), **notes)
    echo(line(fault, result))
    return end, result


HEADER = f"{'fault':<10} {'sent':>5} {'lost':>5} {'dup':>4} {'max_delay_s':>11} {'resume_s':>8} {'drained_s':>9}  notes"


def line(fault, r):
    def num(v):
        return "-" if v is None else f"{v:.2f}"
    notes = " ".join(f"{k}={v}" for k, v in r.items() if k not in ("sent", "deliveries", "lost", "duplicated",
                                                                      "max_delay_s", "resume_s", "drained_s"))
    return (f"{fault:<10} {r['sent']:>5} {r['lost']:>5} {r['duplicated']:>4} {num(r['max_delay_s']):>11} "
            f"{num(r['resume_s']):>8} {num(r['drained_s']):>9}  {notes}")


def explain(team, traffic, inboxes, fault, limit=5):
    """For up to `limit` messages lost or duplicated: the sender's and the receiver's ledgers, and
    what the daemons logged of their id."""
    out = []
    for agent, token, _ in traffic.expected(fault):
        n = len(inboxes.got.get((agent, token), []))
        if n == 1:
            continue
        if len(out) >= limit:
            break
        _, node, _, _ = traffic.sent[token]
        other = next(x for x in NODES if x != node)
        rows = query(team.states[node], "SELECT id, status FROM messages WHERE name = ?", (f"m-{token}",))
        mid = rows[0][0] if rows else None
        text = [f"{token} to {agent}: held {n} times; sender {node}: {rows}"]
        if mid:
            outbound = query(team.states[node], "SELECT node, status, attempts, entry_id, error FROM outbound "
                                                "WHERE message_id = ?", (mid,))
            received = query(team.states[other], "SELECT status, entry_id FROM messages WHERE id = ?", (mid,))
            text += [f"  outbound: {outbound}", f"  receiver {other}: {received}"]
            for n2 in NODES:
                for log in team.logs[n2]:
                    text += [f"  {n2}: {x.rstrip()}" for x in open(log, errors="replace") if mid in x][:12]
        out.append("\n".join(text))
    return out


def run(seconds=6.0, rate=50.0, only=None, drain=90.0, seed=1, keep=False, base=None, echo=print):
    """Run the faults (`only`: a list of names) in order; returns {fault: figures}, and under
    "_run" the directory, the leftovers of each team and the explanations of any loss."""
    faults = [f for f in FAULTS if not only or f in only]
    if "failover" in faults and shutil.which("redis-sentinel") is None:
        echo("failover skipped: redis-sentinel is not installed")
        faults.remove("failover")
    base = Path(tempfile.mkdtemp(prefix="relay-fedfaults-", dir=base))
    traffic, inboxes = Traffic(rate, seed), Inboxes()
    results, teams, explained, left = {}, {}, [], {}
    echo(HEADER)
    try:
        for fault in faults:
            kind = "sentinel" if fault == "failover" else "plain"
            if kind not in teams:
                teams[kind] = Team(base, kind)
                inboxes.watch(teams[kind])
            _, results[fault] = scenario(fault, teams[kind], traffic, inboxes, seconds, drain, echo)
        time.sleep(2.0)             # a late repeat would show now
        inboxes.scan()
        for fault in faults:
            team = teams["sentinel" if fault == "failover" else "plain"]
            final = figures(fault, traffic, inboxes, 0)
            for k in ("lost", "duplicated"):
                results[fault][k] = final[k]
            if final["lost"] or final["duplicated"]:
                explained += [f"[{fault}] {x}" for x in explain(team, traffic, inboxes, fault)]
        for kind, team in teams.items():
            left[kind] = team.left()
    finally:
        for team in teams.values():
            team.close()
    bad = any(r["lost"] or r["duplicated"] for r in results.values())
    echo(f"left at the end: {json.dumps(left)}")
    for x in explained:
        echo(x)
    results["_run"] = {"dir": str(base) if (keep or bad) else None, "left": left, "explained": explained}
    if bad:
        echo(f"lost or duplicated messages: the logs, ledgers and inboxes are kept in {base}")
    if not (keep or bad):
        shutil.rmtree(base, ignore_errors=True)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=6.0, help="how long a proxy fault or the OOM lasts (default 6)")
    ap.add_argument("--rate", type=float, default=50.0, help="messages a second each way (default 50)")
    ap.add_argument("--only", help=f"the faults to run, comma-separated, of {','.join(FAULTS)}")
    ap.add_argument("--drain", type=float, default=90.0, help="seconds to wait for a fault's messages (default 90)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the directory (logs, ledgers, inboxes)")
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    args = ap.parse_args()
    if fedkit.REDIS_SERVER is None:
        print(fedkit.MISSING, file=sys.stderr)
        sys.exit(2)
    only = [f.strip() for f in args.only.split(",")] if args.only else None
    if only and any(f not in FAULTS for f in only):
        ap.error(f"--only takes {', '.join(FAULTS)}")
    results = run(args.seconds, args.rate, only, args.drain, args.seed, args.keep)
    if args.json:
        print(json.dumps(results))
    sys.exit(1 if any(r["lost"] or r["duplicated"] for k, r in results.items() if k != "_run") else 0)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
