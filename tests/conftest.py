import os
import signal
import sys
import threading
import time
import traceback

import pytest

from relay import config as config_mod
from relay.core.daemon import Relay


class Clock:
    """An injected clock: starts at the real time (file mtimes are real) and moves when told."""

    def __init__(self):
        self.now = time.time() + 10.0   # past any settle time of files just written

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds
        return self.now


DEFAULT_TIME_LIMIT_S = 60.0
_deadline = pytest.StashKey[float]()


def time_limit(item):
    mark = item.get_closest_marker("timeout_s")
    return float(mark.args[0]) if mark else DEFAULT_TIME_LIMIT_S


class _Alarm:
    """Fail the running phase of a test when its time is up: SIGALRM raises pytest's failure in
    the main thread, wherever the test is waiting, so a hang fails fast with its traceback."""

    def __init__(self, item, deadline):
        self.item = item
        self.deadline = deadline
        self.armed = (hasattr(signal, "setitimer")
                      and threading.current_thread() is threading.main_thread())

    def __enter__(self):
        if self.armed:
            self.previous = signal.signal(signal.SIGALRM, self.expired)
            signal.setitimer(signal.ITIMER_REAL, max(self.deadline - time.monotonic(), 0.001))
        return self

    def __exit__(self, *exc):
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)

    def expired(self, signum, frame):
        limit = time_limit(self.item)
        frames = sys._current_frames()
        others = "".join(f"\nthread {t.name}:\n" + "".join(traceback.format_stack(frames[t.ident]))
                         for t in threading.enumerate()
                         if t is not threading.current_thread() and t.ident in frames)
        pytest.fail(f"{self.item.nodeid} ran past its time limit of {limit:g} s "
                    f"(@pytest.mark.timeout_s(N) gives a test N seconds){others}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    item.stash[_deadline] = time.monotonic() + time_limit(item)
    with _Alarm(item, item.stash[_deadline]):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _Alarm(item, item.stash[_deadline]):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    # Teardown gets a time limit of its own, so what a timed-out test started is still cleaned up.
    with _Alarm(item, time.monotonic() + time_limit(item)):
        yield


@pytest.fixture(autouse=True)
def no_leaked_threads():
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5
    while True:
        leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert not leaked, f"test leaked threads: {leaked}"


@pytest.fixture(autouse=True)
def restore_logging():
    """The CLI sets up the `relay` logger (its job in a real process); undo it between tests."""
    import logging
    logger = logging.getLogger("relay")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("RELAY_") or key in ("NOTIFY_SOCKET", "WATCHDOG_USEC"):
            monkeypatch.delenv(key)


@pytest.fixture
def clock():
    return Clock()


class Project:
    def __init__(self, root, clock):
        self.root = root
        self.clock = clock
        self.state = root / ".relay"
        self.relays = []

    def config(self, **values):
        return config_mod.load(self.root, ".relay", env={}, overrides=values)

    def relay(self, agents=("Ann", "Ben", "Cy"), fsync=None, sync_mode=None, **values):
        values.setdefault("agents", list(agents))
        relay = Relay(self.config(**values), clock=self.clock, fsync=fsync, sync_mode=sync_mode)
        self.relays.append(relay)
        return relay

    def drop(self, sender, name, text, in_place=False):
        """Write a message into an outbox, by rename (default) or in place."""
        box = self.state / "outbox" / sender
        box.mkdir(parents=True, exist_ok=True)
        data = text.encode() if isinstance(text, str) else text
        if in_place:
            (box / name).write_bytes(data)
        else:
            tmp = box / f".{name}.tmp"
            tmp.write_bytes(data)
            os.rename(tmp, box / name)
        return box / name

    def inbox(self, agent, sub="new"):
        import json
        d = self.state / "inbox" / agent / sub
        return [json.loads(p.read_bytes()) for p in sorted(d.iterdir())] if d.is_dir() else []

    def files(self, sub):
        return sorted(p for p in (self.state / sub).rglob("*") if p.is_file())


def failing_create(relay, error, when=lambda rel: rel.startswith("inbox/")):
    """Make the relay's confined file system refuse to create matching files with `error`
    (an OSError) while `switch["on"]`; returns the switch."""
    real = relay.fs.create
    switch = {"on": True}

    def create(rel, *a, **k):
        if switch["on"] and when(rel):
            raise error
        return real(rel, *a, **k)

    relay.fs.create = create
    return switch


def fill_disk(fs, room):
    """Make the disk of pyfakefs's file system `fs` full but for `room` bytes: a file can still be
    created, its bytes then stop fitting (what a disk filling up under a writer gives)."""
    fs.set_disk_usage(1 << 40)          # pyfakefs counts what is there once the disk has a size
    fs.set_disk_usage(fs.get_disk_usage("/").used + room)


@pytest.fixture
def project(tmp_path, clock):
    p = Project(tmp_path, clock)
    yield p
    for r in p.relays:
        try:
            r.close()
        except Exception:
            pass


@pytest.fixture
def cli(tmp_path):
    """The CLI in-process on a project at tmp_path; a traceback in the output fails the test."""
    from click.testing import CliRunner

    from relay.cli import main
    runner = CliRunner()

    def run(*args, input=None, ok=True):
        result = runner.invoke(main, ["--root", str(tmp_path), *args], input=input, catch_exceptions=False)
        if ok:
            assert result.exit_code == 0, result.output
        assert "Traceback" not in result.output
        return result
    run.root = tmp_path
    run.state = tmp_path / ".relay"
    return run


def error_line(result):
    """The one line a refusal prints (stderr), without relay's prefix (`relay: `, which it has)."""
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("relay: "), result.output
    return lines[0].removeprefix("relay: ")


@pytest.fixture
def team(cli):
    """A project with the agents Alice, Bob and Carol, driven through the CLI."""
    cli("init", "--agent", "Alice", "--agent", "Bob", "--agent", "Carol")
    return cli


@pytest.fixture
def crew(team, clock):
    """Alice, Bob and Carol (team: through the CLI) as relay.Agents on one injected clock."""
    made = []

    import relay
    from relay.agent.project import Project as Team

    def agent(name, tick=clock):
        made.append(relay.Agent(name, project=Team(team.root, clock=tick)))
        return made[-1]
    team.agent = agent
    team.clock = clock
    yield team
    for a in made:
        a.close()
