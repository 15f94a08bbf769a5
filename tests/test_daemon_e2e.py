"""The real daemon as a process: files dropped by rename and in place, a new agent directory,
a slow writer, signals, one daemon per state directory, kill -9 and restart."""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest


def wait_for(predicate, timeout=15.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class Daemon:
    def __init__(self, root, *args):
        self.root = root
        self.state = root / ".relay"
        self.sock_path = str(root / "notify.sock")
        if os.path.exists(self.sock_path):
            os.unlink(self.sock_path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.sock_path)
        self.sock.settimeout(15)
        env = dict(os.environ, RELAY_ROOT=str(root), NOTIFY_SOCKET=self.sock_path,
                   RELAY_AGENTS="Ann,Ben,Cy", RELAY_SETTLE="200ms")
        # The log goes to a file, so a test can wait for a line while the daemon runs.
        fd, self.log_path = tempfile.mkstemp(dir=root, prefix="relay-", suffix=".log")
        with os.fdopen(fd, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "relay", "run", *args], env=env,
                                         stdout=subprocess.DEVNULL, stderr=log)

    def ready(self):
        while True:
            msg = self.sock.recv(4096).decode()
            if "READY=1" in msg:
                return msg

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM, timeout=15):
        self.proc.send_signal(sig)
        self.proc.wait(timeout=timeout)
        self.sock.close()
        return self.proc.returncode, self.log()

    def inbox(self, agent):
        d = self.state / "inbox" / agent / "new"
        return [json.loads(p.read_bytes()) for p in d.iterdir()] if d.is_dir() else []


@pytest.fixture
def daemon(tmp_path):
    started = []

    def start(*args):
        d = Daemon(tmp_path, *args)
        started.append(d)
        return d
    yield start
    for d in started:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()
        d.sock.close()


def rename_in(box, name, text):
    box.mkdir(parents=True, exist_ok=True)
    tmp = box / f".{name}.tmp"
    tmp.write_text(text)
    os.rename(tmp, box / name)


def test_delivers_renamed_and_in_place_files_and_new_agent_dirs(daemon):
    d = daemon()
    d.ready()
    outbox = d.state / "outbox"
    rename_in(outbox / "Ann", "msg", "TO: Ben\n\nby rename")
    (outbox / "Cy" / "note").write_text("TO: Ben\n\nin place")
    wait_for(lambda: len(d.inbox("Ben")) == 2, what="two envelopes in Ben's inbox")
    # An agent directory created while relay runs, with a file written the same instant.
    (outbox / "Dee").mkdir()
    (outbox / "Dee" / "msg").write_text("TO: Ann\n\nfrom a new agent")
    wait_for(lambda: d.inbox("Ann"), what="the new agent's message")
    code, err = d.stop()
    assert code == 0, err
    assert "started" in err and "relay stopped" in err
    out = subprocess.run([sys.executable, "-m", "relay", "--root", str(d.root), "status", "--json"],
                         capture_output=True, text=True, env=dict(os.environ, RELAY_AGENTS="Ann"))
    counts = json.loads(out.stdout)["counts"]
    assert counts["processing"] == 0 and counts["archived"] == 3


def test_slow_writer_delivered_once_whole(daemon):
    d = daemon()
    d.ready()
    path = d.state / "outbox" / "Ann" / "slow"
    with open(path, "w") as f:
        f.write("TO: Ben\n\npart one ")
        f.flush()
        time.sleep(1.0)          # the writer pauses, file open, for longer than the settle time
        assert d.inbox("Ben") == []
        f.write("part two")
    [env] = wait_for(lambda: d.inbox("Ben"), what="the slow writer's message")
    assert env["body"] == "part one part two"
    assert d.stop()[0] == 0
    assert len(d.inbox("Ben")) == 1


def test_second_daemon_refused(daemon):
    first = daemon()
    first.ready()
    second = subprocess.run([sys.executable, "-m", "relay", "--root", str(first.root), "run"],
                            capture_output=True, text=True, timeout=30)
    assert second.returncode == 1
    assert f"pid {first.proc.pid}" in second.stderr and "Traceback" not in second.stderr
    assert first.stop()[0] == 0


def test_sigkill_then_restart_delivers_everything_once(daemon):
    d = daemon()
    d.ready()
    box = d.state / "outbox" / "Ann"
    for i in range(200):
        rename_in(box, f"m{i}", f"TO: Ben, Cy\n\nmessage {i}")
    d.stop(signal.SIGKILL)
    again = daemon()
    again.ready()
    wait_for(lambda: len(again.inbox("Ben")) == 200 and len(again.inbox("Cy")) == 200, timeout=30,
             what="all 200 messages after restart")
    assert again.stop()[0] == 0
    bodies = sorted(e["body"] for e in again.inbox("Ben"))
    assert bodies == sorted(f"message {i}" for i in range(200))
    assert not list(box.iterdir()) and not [p for p in (d.state / "spool").rglob("*") if p.is_file()]


def test_sighup_reloads_and_refuses_a_bad_config(daemon):
    d = daemon()
    d.ready()
    toml = d.state / "relay.toml"
    toml.write_text("retention = 'forever'\n")
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "refused, the old one stays" in d.log(), what="the bad configuration refused")
    rename_in(d.state / "outbox" / "Ann", "m1", "TO: Ben\n\nstill running")
    wait_for(lambda: d.inbox("Ben"), what="delivery after a refused reload")
    toml.write_text("retention = '2d'\n")
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "configuration reloaded" in d.log(), what="the good configuration loaded")
    rename_in(d.state / "outbox" / "Ann", "m2", "TO: Ben\n\nafter reload")
    wait_for(lambda: len(d.inbox("Ben")) == 2, what="delivery after a good reload")
    code, err = d.stop()
    assert code == 0
    assert "refused, the old one stays" in err and "bad value for 'retention'" in err
    assert "configuration reloaded" in err


def test_second_signal_stops_at_once_and_restart_recovers(daemon):
    d = daemon()
    d.ready()
    d.proc.send_signal(signal.SIGTERM)
    d.proc.send_signal(signal.SIGTERM)
    d.proc.wait(timeout=15)
    assert d.proc.returncode in (0, 1)
    d.sock.close()
    again = daemon()
    again.ready()
    rename_in(again.state / "outbox" / "Ann", "m", "TO: Ben\n\nafter")
    wait_for(lambda: again.inbox("Ben"), what="delivery after restart")
    assert again.stop()[0] == 0
