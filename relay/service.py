"""`relay run` as a process: what only a process has around the loop (Relay.run, daemon.py).
Signal handlers that set flags (SIGTERM/SIGINT stop, a second one at once; SIGHUP reloads
relay.toml and applies every key it can, naming those that need a restart; SIGUSR1 looks at the
ledger now), systemd notify (READY, STATUS, STOPPING) and watchdog pings, the file watcher, the
attestation of the ledger's settings at start and at each reload, and the hold on the state
directory: its relay.lock and ledger must stay the files it opened."""
import logging
import os
import signal
import socket
import sys
import time

from relay import config as config_mod
from relay.version import __version__
from relay.core.daemon import Relay
from relay.errors import ConfigError, StateLost
from relay.files.lock import identity
from relay.core.watcher import Watcher

log = logging.getLogger(__name__)

SWITCH_INTERVAL = 0.0005    # seconds: the GIL's switch interval while the daemon runs
STATUS_EVERY = 5.0          # seconds between two systemd STATUS lines while messages flow
NOTIFY_WAIT = 0.1           # seconds notify() waits at most for room in the supervisor's queue


def notify(message):
    """sd_notify(3) in a few lines: a datagram to $NOTIFY_SOCKET, when systemd set one. A
    supervisor busy for a moment gets NOTIFY_WAIT to make room (a watchdog ping is not lost to a
    burst); one that stopped reading misses the line, and the loop goes on delivering."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.settimeout(NOTIFY_WAIT)
            s.connect(addr)
            s.send(message.encode())
        return True
    except OSError as e:
        log.debug("notify %r failed: %s", message, e)
        return False


def _texts(cfg):
    """(key, value as relay config shows it) of a configuration."""
    return [(key, "none" if key == "federation" and value is None else text)
            for key, value, text, _ in config_mod.describe(cfg)]


class Signals:
    """What the signal handlers asked for: plain attributes, set by a handler that may take no
    lock (it runs on the loop's thread, maybe while that thread holds one) and read by the loop."""

    def __init__(self):
        self.stop = False       # SIGTERM, SIGINT
        self.reload = False     # SIGHUP: read relay.toml again
        self.poke = False       # SIGUSR1: an operator changed the ledger

    def is_set(self):
        """Whether a stop was asked for (Relay.run's `stop`)."""
        return self.stop


class Daemon:
    """`relay run`: one Relay, run by its loop inside this process."""

    def __init__(self, cfg, clock=time.time, lock=None, load=None, on_config=None):
        self.cfg = cfg
        # `load()` reads the configuration again as at start (a SIGHUP); `on_config(cfg)` applies
        # what belongs to the process (its logging) after a reload.
        self.load = load or (lambda: config_mod.load(cfg.root, os.path.relpath(cfg.state_dir, cfg.root)))
        self.on_config = on_config
        if cfg.federation:
            from relay import federation
            federation.redis_module()        # no redis package: one line naming the extra, before anything starts
        self.metrics = listener(cfg, clock) if cfg.metrics else None     # [metrics] listen: bound before the start
        self.relay = Relay(cfg, clock=clock)
        self.link = None
        # The ledger file the connection has just opened; `lock`: the DaemonLock held.
        self.ledger_identity = identity(self.relay.ledger.path)
        self.lock = lock
        self.watcher = Watcher(self.relay, thread=False)     # read by the loop itself (Relay.run's watch)
        self.signals = Signals()
        usec = int(os.environ.get("WATCHDOG_USEC", "0") or 0)
        self.ping_every = usec / 2e6 if usec else None      # twice per watchdog interval
        self.next_ping = self.next_status = 0.0
        self.relayed = self.failed = 0

    def on_signal(self, signum, frame):
        if signum == signal.SIGHUP:
            self.signals.reload = True
        elif signum == signal.SIGUSR1:
            self.signals.poke = True
        elif self.signals.stop:
            # Second signal: stop now. What was claimed is recovered at the next start; running
            # on_deliver hooks are killed, not left behind.
            self.relay.hooks.kill()
            os._exit(1)
        else:
            self.signals.stop = True
        # The waker takes no lock (a flag and a byte in a pipe): set from the handler itself,
        # it wakes the loop's poll, or its next turn sees the flag.
        self.relay.wake.set()

    def do_reload(self):
        self.signals.reload = False
        try:
            new = self.load()
        except ConfigError as e:
            log.error("SIGHUP: the new configuration is refused, the old one stays: %s", e)
            return
        applied, restart = self.relay.reconfigure(new)
        self.cfg = self.relay.config
        if self.on_config is not None:
            self.on_config(self.cfg)
        log.info("SIGHUP: configuration reloaded from %s; %s", new.source,
                 f"applied {', '.join(applied)}" if applied else "no value changed")
        shown, running = dict(_texts(new)), dict(_texts(self.cfg))     # a URL's password hidden
        for key in restart:
            log.warning("SIGHUP: %s changed (%s, running with %s); it takes effect only when relay is restarted",
                        key, shown[key], running[key])
        self.relay.attest("daemon", "reload")

    def run(self):
        relay = self.relay
        cfg = self.cfg
        # Other threads (the federation's link, on_deliver's workers) hand work to this loop; a
        # short GIL switch interval lets it run as soon as it is woken instead of waiting out
        # another thread's 5 ms slice.
        sys.setswitchinterval(SWITCH_INTERVAL)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(sig, self.on_signal)
        log.info("relay %s started (pid %d): root %s, state dir %s, durability %s, config from %s",
                 __version__, os.getpid(), cfg.root, cfg.state_dir, cfg.durability, cfg.source)
        relay.attest("daemon", "start")
        recovered = relay.recover()
        if recovered:
            log.info("recovered %d message(s) left processing", recovered)
        self.watcher.start()
        if cfg.federation:
            from relay.federation import Link
            self.link = Link(cfg, router=relay.router, on_directory=lambda: relay.hint("dir"), hooks=relay.hooks)
            self.link.start()
        if self.metrics is not None:
            self.metrics.start()
        notify("READY=1\nSTATUS=watching " + str(relay.layout.outbox))
        self.next_ping = time.monotonic()
        try:
            relay.run(self.signals, before=self.turn, after=self.stepped, check=self.hold,
                      max_wait=self.ping_every, watch=self.watcher)
        finally:
            notify("STOPPING=1")
            if self.metrics is not None:
                self.metrics.stop()
            if self.link is not None:
                self.link.close()
            self.watcher.stop()
            relay.close()
        log.info("relay stopped")
        return 0

    def turn(self):
        """The top of each turn of the loop: the hold checked, then what signals asked for."""
        self.hold()
        if self.signals.poke:
            # An operator changed the ledger (relay retry, expire): the step that follows
            # claims what is due there, without waiting for the next deadline.
            self.signals.poke = False
            log.info("SIGUSR1: looking at the ledger now")
            self.relay.hint("rescan")       # and at the outboxes: an agent may have been declared
        if self.signals.reload:
            # Before the step, so that the step this SIGHUP woke runs with the new file.
            self.do_reload()

    def stepped(self, counts):
        """After each step: systemd's status line and watchdog ping; a stopped watcher restarted."""
        self.relayed += counts.archived
        self.failed += counts.failed
        if (counts.archived or counts.failed) and time.monotonic() >= self.next_status:
            notify(f"STATUS=relayed {self.relayed}, failed {self.failed} since start")
            self.next_status = time.monotonic() + STATUS_EVERY
        if self.ping_every and time.monotonic() >= self.next_ping:
            notify("WATCHDOG=1")
            self.next_ping = time.monotonic() + self.ping_every
        if not self.watcher.alive():
            self.watcher.restart()

    def lost(self):
        """Why this daemon must stop working on its state directory, or None: its relay.lock
        or its ledger was removed or replaced while it ran."""
        if self.lock is not None and not self.lock.held():
            return (f"{self.lock.path} was removed or replaced while this daemon ran; stopping so that "
                    "two daemons never run on one state directory")
        if identity(self.relay.ledger.path) != self.ledger_identity:
            return (f"{self.relay.ledger.path} was removed or replaced while this daemon ran; stopping, "
                    "since what it records would go to a file no other process reads")
        return None

    def hold(self):
        """Raise StateLost (logged) when lost() has a reason; cheap: a few stat calls. Run at
        every turn of the loop and every second while it waits."""
        reason = self.lost()
        if reason:
            log.error("%s", reason)
            raise StateLost(reason)


def listener(cfg, clock):
    """The /metrics listener of `[metrics] listen` (web/scrape.py), its address bound; ConfigError
    when it cannot listen there, or saying how to install the web extra (prometheus-client)."""
    try:
        from relay.web import scrape
    except ImportError as e:
        if (e.name or "").split(".")[0] not in ("prometheus_client", "starlette", "jinja2", "markupsafe"):
            raise
        raise ConfigError("[metrics] listen needs the web extra (prometheus-client): pip install "
                          "'agent-outbox-relay[web]' (from a checkout: pip install '.[web]')") from None
    return scrape.Listener(cfg, clock)


def serve(cfg, lock=None, load=None, on_config=None):
    """Run the daemon on `cfg` while this process holds `lock`; `load()` reads the configuration
    again on SIGHUP, `on_config(cfg)` applies its logging (see Daemon)."""
    return Daemon(cfg, lock=lock, load=load, on_config=on_config).run()
