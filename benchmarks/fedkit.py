"""What the federation benchmarks and tests share: a real redis-server on a free local port in a
directory of its own (AOF with appendfsync always), and relay nodes (project roots) linked
through it as `relay run` processes."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REDIS_SERVER = shutil.which("redis-server")
MISSING = ("redis-server is not installed: apt-get install redis-server (Debian's package; .ci/run installs "
           "it), so the federation tests cannot run here")


def cpu_ticks():
    """(all, stolen) CPU ticks of this machine so far (/proc/stat), or None where it cannot
    be read. Stolen: time a virtual CPU was ready and the hypervisor ran someone else."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(fields[:8]), (fields[7] if len(fields) > 7 else 0)


def stolen_percent(before, after):
    """The share of CPU time stolen by the hypervisor between two cpu_ticks(), in %."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    return round(100 * (after[1] - before[1]) / (after[0] - before[0]), 1)


def free_port(below=None):
    """A free local port; with `below`, one under it and with `port + 10000` free too (a cluster's bus)."""
    if below is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    import random
    for _ in range(1000):
        port = random.randrange(20000, below)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair")


def pong(port, proc, timeout):
    """Whether the server on `port` answers PING within `timeout` (False at once if it exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                if s.recv(64).startswith((b"+PONG", b"-NOAUTH")):
                    return True
        except OSError:
            pass
        if proc.poll() is not None:
            return False
        time.sleep(0.02)
    return False


class RedisServer:
    """One redis-server process; stop() and start() again keep its data (AOF, fsync always)."""

    def __init__(self, directory, port=None, appendfsync="always", extra=(), program=None):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.appendfsync = appendfsync
        self.extra = list(extra)          # more redis-server arguments (TLS, replicaof, ...)
        self.program = program or REDIS_SERVER
        self.proc = None

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout=10.0):
        self.proc = subprocess.Popen(
            [self.program, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--appendonly", "yes", "--appendfsync", self.appendfsync, "--save", "", "--daemonize", "no",
             "--protected-mode", "no", "--logfile", str(self.dir / "redis.log"), *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if pong(self.port, self.proc, timeout):
            return self
        raise RuntimeError(f"redis-server did not start on port {self.port}: see {self.dir / 'redis.log'}")

    def stop(self, sig=signal.SIGTERM):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=15)
        self.proc = None


class Sentinel:
    """One redis-sentinel watching a master as `service` (failover after 1 s down)."""

    def __init__(self, directory, master_port, service="mymaster", port=None):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.service = service
        conf = self.dir / "sentinel.conf"
        conf.write_text(f"port {self.port}\nbind 127.0.0.1\nprotected-mode no\ndir {self.dir}\n"
                        f"sentinel monitor {service} 127.0.0.1 {master_port} 1\n"
                        f"sentinel down-after-milliseconds {service} 1000\n"
                        f"sentinel failover-timeout {service} 5000\n")
        self.conf = conf
        self.proc = None

    @property
    def url(self):
        return f"redis+sentinel://127.0.0.1:{self.port}/{self.service}/0"

    def start(self, timeout=10.0):
        program = shutil.which("redis-sentinel") or REDIS_SERVER
        args = [program, str(self.conf)] + ([] if program.endswith("redis-sentinel") else ["--sentinel"])
        self.proc = subprocess.Popen(args + ["--logfile", str(self.dir / "sentinel.log")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if pong(self.port, self.proc, timeout):
            return self
        raise RuntimeError(f"redis-sentinel did not start on port {self.port}")

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=15)
        self.proc = None


class Cluster:
    """A Redis Cluster of `masters` redis-servers on free ports, slots spread by redis-cli."""

    def __init__(self, directory, masters=3):
        self.servers = [RedisServer(Path(directory) / f"m{i}", port=free_port(below=55535), extra=["--cluster-enabled", "yes",
                                                                      "--cluster-config-file", "nodes.conf"])
                        for i in range(masters)]

    @property
    def url(self):
        return f"redis+cluster://127.0.0.1:{self.servers[0].port}/0"

    def start(self, timeout=30.0):
        for s in self.servers:
            s.start()
        subprocess.run([shutil.which("redis-cli"), "--cluster", "create",
                        *(f"127.0.0.1:{s.port}" for s in self.servers), "--cluster-replicas", "0", "--cluster-yes"],
                       check=True, capture_output=True, timeout=timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = subprocess.run([shutil.which("redis-cli"), "-p", str(self.servers[0].port), "cluster", "info"],
                                 capture_output=True, text=True).stdout
            if "cluster_state:ok" in out:
                return self
            time.sleep(0.1)
        raise RuntimeError("the cluster did not come up")

    def stop(self):
        for s in self.servers:
            s.stop()


def write_config(root, url, team, node, agents, extra="", heartbeat="1s"):
    state = Path(root) / ".relay"
    state.mkdir(parents=True, exist_ok=True)
    (state / "relay.toml").write_text(
        f'agents = {json.dumps(list(agents))}\n{extra}\n[federation]\nurl = "{url}"\nteam = "{team}"\n'
        f'node = "{node}"\nheartbeat = "{heartbeat}"\n')
    for a in agents:
        (state / "outbox" / a).mkdir(parents=True, exist_ok=True)
        for sub in ("tmp", "new", "cur"):
            (state / "inbox" / a / sub).mkdir(parents=True, exist_ok=True)
    return state


def drop(state, sender, name, text):
    box = Path(state) / "outbox" / sender
    box.mkdir(parents=True, exist_ok=True)
    tmp = box / f".{name}.tmp"
    tmp.write_text(text)
    os.rename(tmp, box / name)
    return box / name


def held(state, agent):
    """The envelopes an agent holds (new/ and cur/)."""
    out = []
    for sub in ("new", "cur"):
        d = Path(state) / "inbox" / agent / sub
        if d.is_dir():
            out += [json.loads(p.read_bytes()) for p in sorted(d.iterdir()) if not p.name.startswith(".")]
    return out


def start_daemon(root, log_dir=None, env=None):
    """`relay run` on a project root, its log in a file beside it."""
    fd, log = tempfile.mkstemp(dir=log_dir or root, prefix="relay-", suffix=".log")
    environment = dict(os.environ, RELAY_ROOT=str(root), RELAY_SETTLE="50ms", RELAY_LOG_LEVEL="INFO")
    environment.update(env or {})
    with os.fdopen(fd, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "relay", "run"], env=environment, stdout=subprocess.DEVNULL,
                                stderr=f)
    proc.log = log
    return proc

