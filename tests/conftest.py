import os
import threading
import time

import pytest

from relay import config as config_mod
from relay.daemon import Relay


class Clock:
    """An injected clock: starts at the real time (file mtimes are real) and moves when told."""

    def __init__(self):
        self.now = time.time() + 10.0   # past any settle time of files just written

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds
        return self.now


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


@pytest.fixture
def project(tmp_path, clock):
    p = Project(tmp_path, clock)
    yield p
    for r in p.relays:
        try:
            r.close()
        except Exception:
            pass
