"""`relay run`: the daemon loop, signals (SIGHUP reload, SIGUSR1 look at the ledger now), the
hold on the state directory, systemd notify and watchdog pings."""
import logging
import os
import signal
import socket
import sys
import threading
import time

from . import __version__, config as config_mod
from .daemon import Counts, Relay
from .errors import ConfigError, StateLost
from .lock import identity
from .watcher import Watcher

log = logging.getLogger(__name__)

HOLD_CHECK = 1.0        # seconds between checks of the lock and the ledger while the loop is idle


def notify(message):
    """sd_notify(3) in a few lines: a datagram to $NOTIFY_SOCKET, when systemd set one."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(message.encode())
        return True
    except OSError as e:
        log.debug("notify %r failed: %s", message, e)
        return False


class Daemon:
    def __init__(self, cfg, clock=time.time, lock=None):
        self.cfg = cfg
        self.relay = Relay(cfg, clock=clock)
        # The ledger file the connection has just opened; `lock`: the DaemonLock held.
        self.ledger_identity = identity(self.relay.ledger.path)
        self.lock = lock
        self.watcher = Watcher(self.relay)
        self.stopping = False
        self.reload = False
        self.poked = False
        usec = int(os.environ.get("WATCHDOG_USEC", "0") or 0)
        self.ping_every = usec / 2e6 if usec else None

    def on_signal(self, signum, frame):
        if signum == signal.SIGHUP:
            self.reload = True
        elif signum == signal.SIGUSR1:
            self.poked = True
        elif self.stopping:
            # Second signal: stop now. What was claimed is recovered at the next start.
            os._exit(1)
        else:
            self.stopping = True
        # Not wake.set() here: the handler runs on the loop's thread, maybe while that thread
        # holds the event's lock (in wake.clear() or wake.wait()), and the lock is not
        # re-entrant. A short thread sets it once the loop lets go.
        threading.Thread(target=self.relay.wake.set, name="relay-signal", daemon=True).start()

    def do_reload(self):
        self.reload = False
        try:
            new = config_mod.load(self.cfg.root, os.path.relpath(self.cfg.state_dir, self.cfg.root),
                                  overrides=self.overrides)
        except ConfigError as e:
            log.error("SIGHUP: the new configuration is refused, the old one stays: %s", e)
            return
        relay = self.relay
        relay.config = new
        relay.outbox.settle = new.settle
        relay.syncer.durable = new.durability == "full"
        relay.ledger.set_durability(new.durability)
        self.cfg = new
        log.info("SIGHUP: configuration reloaded from %s", new.source)

    def run(self):
        relay = self.relay
        cfg = self.cfg
        # The watcher's threads hand events to this loop; a short GIL switch interval lets the
        # loop run as soon as it is woken instead of waiting out another thread's 5 ms slice.
        sys.setswitchinterval(0.0005)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(sig, self.on_signal)
        log.info("relay %s started (pid %d): root %s, state dir %s, durability %s, config from %s",
                 __version__, os.getpid(), cfg.root, cfg.state_dir, cfg.durability, cfg.source)
        recovered = relay.recover()
        if recovered:
            log.info("recovered %d message(s) left processing", recovered)
        self.watcher.start()
        notify("READY=1\nSTATUS=watching " + str(relay.layout.outbox))
        next_ping = time.monotonic()
        relayed = failed = 0
        next_status = 0.0
        try:
            while True:
                # Cleared before the flags are read: a signal from here on leaves the event set,
                # and the idle wait below returns at once instead of sleeping past it.
                relay.wake.clear()
                if self.stopping:
                    break
                self.hold()
                if self.poked:
                    # An operator changed the ledger (relay retry, expire): the step below
                    # claims what is due there, without waiting for the next deadline.
                    self.poked = False
                    log.info("SIGUSR1: looking at the ledger now")
                if self.reload:
                    # Before the step, so that the step this SIGHUP woke runs with the new file.
                    self.do_reload()
                counts = self.step()
                relayed += counts.archived
                failed += counts.failed
                if (counts.archived or counts.failed) and time.monotonic() >= next_status:
                    notify(f"STATUS=relayed {relayed}, failed {failed} since start")
                    next_status = time.monotonic() + 5.0
                if self.ping_every and time.monotonic() >= next_ping:
                    notify("WATCHDOG=1")
                    next_ping = time.monotonic() + self.ping_every
                if not self.watcher.alive():
                    self.watcher.restart()
                if counts.busy or relay.hints:
                    continue
                self.idle(self.timeout())
        finally:
            notify("STOPPING=1")
            self.watcher.stop()
            relay.close()
        log.info("relay stopped")
        return 0

    overrides = None

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
        """Raise StateLost (logged) when lost() has a reason; cheap: a few stat calls."""
        reason = self.lost()
        if reason:
            log.error("%s", reason)
            raise StateLost(reason)

    def idle(self, timeout):
        """Wait until woken or `timeout` passes, checking the hold every HOLD_CHECK seconds."""
        deadline = time.monotonic() + timeout
        while not self.stopping:
            left = deadline - time.monotonic()
            if left <= 0 or self.relay.wake.wait(min(left, HOLD_CHECK)):
                return
            self.hold()

    def step(self):
        """One step; an unforeseen error (a ledger locked past busy_timeout, a full disk under
        the ledger) is logged, waited out, and what the step had claimed is recovered."""
        try:
            counts = self.relay.step()
            self.pause = 1.0
            return counts
        except Exception:  # noqa: BLE001 - the daemon must outlive any one bad moment
            log.exception("the relay step failed; retrying in %.0fs", self.pause)
            self.relay.wake.wait(self.pause)
            self.pause = min(self.pause * 2, 60.0)
            try:
                self.relay.recover()
            except Exception:  # noqa: BLE001
                log.exception("recovery after the failed step failed too; will try again")
            return Counts()

    pause = 1.0

    def timeout(self):
        relay = self.relay
        now = relay.clock()
        deadlines = [relay._next_rescan, relay._next_sweep, relay._next_orphans, relay._next_archive_retry]
        for d in (relay.outbox.next_deadline(), relay.history.next_due()):
            if d is not None:
                deadlines.append(d)
        wait = min(deadlines) - now
        if self.ping_every:
            wait = min(wait, self.ping_every)
        return max(0.0, min(wait, 3600.0))


def serve(cfg, overrides=None, lock=None):
    daemon = Daemon(cfg, lock=lock)
    daemon.overrides = overrides
    return daemon.run()
