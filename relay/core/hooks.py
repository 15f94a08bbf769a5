"""The on_deliver hook: a command run once per delivered envelope, off the delivery path.

The relay's loop only hands each recorded delivery to `Hooks.delivered()`, which queues it and
returns; a few worker threads run the command, each run within `on_deliver_timeout`. A hook
that fails is logged with its exit status and the tail of its output; one that runs past its
limit is killed with its whole process group and logged. Neither delays or fails a delivery.

- Fired only after the batch's ledger record committed, for the recipients that record adds
  (never for one the ledger had before), so a retry or a recovery never fires it twice. A crash
  between the commit and the hook's start loses that hook: at most once.
- Bounded: at most `limit` hooks waiting or running; past that a delivery's hook is dropped,
  counted and logged (once when the queue fills, once with the number dropped when it drains).
- The command: a string runs under /bin/sh -c, a tuple is the argv (no shell). It runs in the
  project root, in a session of its own, stdin /dev/null, stdout and stderr captured together
  (the last OUTPUT_TAIL bytes kept), no descriptor of relay's inherited, with the relay's
  environment (less its service manager's NOTIFY_SOCKET, watchdog and socket variables) plus
  RELAY_ROOT, RELAY_STATE_DIR and the delivery's RELAY_* variables.
- `stop()` (relay's stop, the end of run --once) waits a second past `on_deliver_timeout` (at
  most STOP_GRACE) for what is queued and running, then drops the rest and kills what still runs.
"""
import dataclasses
import logging
import os
import queue
import selectors
import signal
import subprocess
import threading
import time

from relay.config import SYSTEM
from relay.files.fs import shown
from relay.terminal import spaced

log = logging.getLogger(__name__)

WORKERS = 2             # hooks running at once
LIMIT = 1000            # hooks waiting or running at once; more are dropped
OUTPUT_TAIL = 2048      # bytes of a hook's output kept for the log
VALUE_MAX = 1024        # characters of a subject, thread or kind passed in the environment
TICK = 0.1              # without pidfd_open: how often a hook's exit is looked for while a child holds its output
REAP_WAIT = 5.0         # how long a killed hook may take to die
DROP_LOG_EVERY = 10.0   # seconds between two log lines about dropped hooks
STOP_GRACE = 30.0       # the longest stop() waits for hooks (within a service manager's stop timeout)
# relay's own line to its service manager: not for a command relay.toml names
SERVICE_VARIABLES = frozenset({"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID",
                               "LISTEN_FDNAMES"})


@dataclasses.dataclass(frozen=True)
class Delivery:
    """One envelope delivered to one recipient, as the hook sees it."""
    message_id: str
    sender: str
    recipient: str
    envelope: str       # absolute path of the envelope in the recipient's new/
    subject: str
    thread: str
    kind: str
    priority: str = "normal"

    def environment(self):
        """The delivery's RELAY_* variables: every value from the message through `plain` (the
        envelope's path is the state directory's, which relay.toml cannot give such a character,
        and must name the file exactly)."""
        return {"RELAY_MESSAGE_ID": plain(self.message_id), "RELAY_SENDER": plain(self.sender),
                "RELAY_RECIPIENT": plain(self.recipient), "RELAY_ENVELOPE": self.envelope,
                "RELAY_SUBJECT": plain(self.subject), "RELAY_THREAD": plain(self.thread),
                "RELAY_KIND": plain(self.kind), "RELAY_PRIORITY": plain(self.priority)}


def plain(value):
    """A value an agent wrote, fit for one environment variable a hook may type somewhere: each
    control character (C0 with newlines, DEL, C1), bidi override and line separator
    (terminal.UNSAFE) becomes a space, at most VALUE_MAX characters."""
    return spaced(value)[:VALUE_MAX]


def argv(command):
    """The argv of a configured command: a string through /bin/sh -c, a tuple as it is."""
    if command is None:
        return None
    return ("/bin/sh", "-c", command) if isinstance(command, str) else tuple(command)


@dataclasses.dataclass(eq=False)
class _Run:
    """A hook process: `killed` once it was sent SIGKILL (never signalled twice)."""
    delivery: Delivery
    proc: subprocess.Popen
    killed: bool = False


class Hooks:
    """The on_deliver runner of one relay. `delivered()` on the loop's thread; the rest anywhere."""

    def __init__(self, config, workers=WORKERS, limit=LIMIT):
        self.root = str(config.root)
        self.state_dir = str(config.state_dir)
        self.workers = workers
        self.limit = limit
        self.configure(config)
        self.ran = self.failed = self.killed = self.dropped = 0     # counts since start
        self._queue = queue.SimpleQueue()
        self._threads = []
        self._lock = threading.RLock()      # re-entrant: kill() may run in a signal handler
        self._idle = threading.Condition(self._lock)
        self._pending = 0                   # queued or running
        self._unreported = 0                # dropped since the last log line about it
        self._next_drop_log = 0.0           # time.monotonic() of the next such line
        self._running = {}                  # pid -> _Run
        self._closing = False               # stop() began: nothing more is queued
        self._killing = False               # stop()'s grace is over: nothing more is started

    def configure(self, config):
        """Take the command, time limit and System switch of `config` (start, SIGHUP): hooks
        queued from now on use them."""
        self.argv = argv(config.on_deliver)
        self.timeout = config.on_deliver_timeout
        self.system = config.on_deliver_system

    # -- the loop's side --------------------------------------------------------------------

    def delivered(self, works):
        """Queue a hook for each delivery a batch's ledger record has just made durable (the
        recipients in each work's `got`). Returns how many were queued."""
        if self.argv is None:
            return 0
        queued = 0
        inbox = os.path.join(self.state_dir, "inbox")
        try:
            for w in works:
                m = w.message
                for r in w.delivered_now:
                    if r == SYSTEM and not self.system:
                        continue
                    d = Delivery(w.id, w.sender, r, os.path.join(inbox, r, "new", f"{w.id}.json"),
                                 plain(getattr(m, "subject", None)), plain(getattr(m, "thread", None)),
                                 plain(getattr(m, "kind", None)), plain(getattr(m, "priority", "normal")))
                    queued += self.fire(d)
        except Exception:  # noqa: BLE001 - the deliveries are recorded: nothing here may fail the step
            log.exception("on_deliver: hooks of this batch not queued")
        return queued

    def fire(self, delivery, command=None, timeout=None, report=None):
        """Queue one hook; False when it is dropped (the queue is full, or stop() began).
        `command`, `timeout`, `report`: another job on the same workers (the [wake]'s, wake.py),
        its own argv, time limit and report(run, tail, ended, timeout, took) of how it ended."""
        command = command or self.argv
        with self._lock:
            if self._closing or command is None:
                return False
            if self._pending >= self.limit:
                self._drop(delivery, f"{self._pending} hooks are waiting or running (the limit)")
                return False
            self._pending += 1
            while len(self._threads) < self.workers:
                t = threading.Thread(target=self._work, name=f"relay-hook-{len(self._threads) + 1}", daemon=True)
                self._threads.append(t)
                t.start()
        self._queue.put((delivery, command, timeout or self.timeout, report))
        return True

    def _drop(self, d, why):
        """Count a hook not run; log it, at most one line every DROP_LOG_EVERY seconds (a flood
        must not flood the log). Called with the lock held."""
        self.dropped += 1
        self._unreported += 1
        now = time.monotonic()
        if now >= self._next_drop_log:
            log.warning("%s: on_deliver for %s dropped: %s; %d dropped since the last such line, %d in all",
                        d.message_id, d.recipient, why, self._unreported, self.dropped)
            self._unreported = 0
            self._next_drop_log = now + DROP_LOG_EVERY

    # -- waiting and stopping ---------------------------------------------------------------

    @property
    def pending(self):
        """Hooks queued or running."""
        with self._lock:
            return self._pending

    def running(self):
        """The deliveries whose hook runs now."""
        with self._lock:
            return [r.delivery for r in self._running.values()]

    def join(self, timeout=None):
        """Wait until no hook is queued or running, at most `timeout` seconds; True if so."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def stop(self, grace=None):
        """Wait up to `grace` seconds for the hooks queued and running (default: a second past
        the time limit, so that a hook just started meets its own limit first; at most
        STOP_GRACE); then drop those queued, kill those running, and end the workers. Nothing is
        queued after this."""
        grace = min(self.timeout + 1.0, STOP_GRACE) if grace is None else grace
        with self._lock:
            self._closing = True
            busy = self._pending
        if busy:
            log.info("waiting up to %gs for %d on_deliver hook(s)", grace, busy)
        if not self.join(grace):
            with self._lock:
                left = self._take_queued()
                self.kill()
                if left:
                    self.dropped += len(left)
                    log.warning("on_deliver: %d queued hook(s) dropped at stop: %s%s", len(left),
                                ", ".join(f"{d.message_id} to {d.recipient}" for d, *_ in left[:20]),
                                " ..." if len(left) > 20 else "")
        with self._lock:
            if self._unreported:
                log.warning("on_deliver: %d more hook(s) dropped while the queue was full (%d in all)",
                            self._unreported, self.dropped)
                self._unreported = 0
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(REAP_WAIT + 1.0)
        self._threads = [t for t in self._threads if t.is_alive()]
        if self._threads:
            log.error("on_deliver: %d hook worker(s) did not end", len(self._threads))

    def _take_queued(self):
        left = []
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return left
            if job is not None:
                left.append(job)
                self._pending -= 1
                self._idle.notify_all()

    def kill(self):
        """Kill every hook running now, with its process group, and start no other. Safe in a
        signal handler of the thread that holds the lock (it is re-entrant)."""
        with self._lock:
            self._killing = True
            for run in list(self._running.values()):
                self._kill(run)

    def _kill(self, run):
        """SIGKILL to a hook's process group, once, while its leader is not reaped (so the
        group's id is still its own). Called with the lock held."""
        if run.killed or run.proc.returncode is not None:
            return
        run.killed = True
        try:
            os.killpg(run.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    # -- the workers ------------------------------------------------------------------------

    def _work(self):
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self._run(*job)
            except Exception:  # noqa: BLE001 - a worker outlives any one hook
                log.exception("%s: on_deliver for %s failed unexpectedly", job[0].message_id, job[0].recipient)
            finally:
                with self._lock:
                    self._pending -= 1
                    self._idle.notify_all()

    def _run(self, d, command, timeout, report=None):
        env = {k: v for k, v in os.environ.items() if k not in SERVICE_VARIABLES}
        env.update(RELAY_ROOT=self.root, RELAY_STATE_DIR=self.state_dir, **d.environment())
        started = time.monotonic()
        with self._lock:
            if self._killing:
                self._drop(d, "relay is stopping")
                return
        try:        # not under the lock: the loop's thread takes it to queue the next hook
            proc = subprocess.Popen(command, cwd=self.root, env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            with self._lock:
                self.failed += 1
            log.warning("%s: on_deliver for %s (from %s) could not start: %s", d.message_id, d.recipient,
                        d.sender, e)
            return
        with self._lock:
            run = self._running[proc.pid] = _Run(d, proc)
            if self._killing:           # kill() ran while it started
                self._kill(run)
        try:
            tail, ended = self._watch(run, started + timeout)
            if not ended:
                with self._lock:
                    self._kill(run)
                try:
                    proc.wait(REAP_WAIT)
                except subprocess.TimeoutExpired:
                    log.error("%s: on_deliver for %s: process %d did not die after SIGKILL", d.message_id,
                              d.recipient, proc.pid)
        finally:
            with self._lock:
                self._running.pop(proc.pid, None)
            proc.stdout.close()
        (report or self._outcome)(run, tail, ended, timeout, time.monotonic() - started)

    def _outcome(self, run, tail, ended, timeout, took):
        d, code = run.delivery, run.proc.returncode
        output = shown(bytes(tail).decode("utf-8", "replace").strip()) or "(none)"
        with self._lock:
            if not ended or run.killed:
                self.killed += 1
            elif code == 0:
                self.ran += 1
            else:
                self.failed += 1
        if not ended:
            log.warning("%s: on_deliver for %s (from %s) ran past its time limit of %gs: killed with its "
                        "process group; output: %s", d.message_id, d.recipient, d.sender, timeout, output)
        elif run.killed:
            log.warning("%s: on_deliver for %s (from %s) killed at relay's stop; output: %s", d.message_id,
                        d.recipient, d.sender, output)
        elif code == 0:
            log.debug("%s: on_deliver for %s ran in %.3fs", d.message_id, d.recipient, took)
        else:
            status = f"exit status {code}" if code > 0 else f"signal {-code}"
            log.warning("%s: on_deliver for %s (from %s) failed with %s; output: %s", d.message_id,
                        d.recipient, d.sender, status, output)

    def _watch(self, run, deadline):
        """Keep the tail of the hook's output until its process ends (True) or the deadline
        passes (False). The end of the process counts, not the end of its output: a child it
        left behind may hold the pipe."""
        proc = run.proc
        fd = proc.stdout.fileno()
        os.set_blocking(fd, False)
        tail = bytearray()
        pidfd = _pidfd(proc.pid)
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ, "out")
            if pidfd is not None:
                sel.register(pidfd, selectors.EVENT_READ, "exit")
            try:
                while True:
                    with self._lock:        # reaped under the lock: _kill() never signals a reaped id
                        if proc.poll() is not None:
                            _read(fd, tail, reads=16)
                            return tail, True
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return tail, False
                    for key, _ in sel.select(left if pidfd is not None else min(left, TICK)):
                        if key.data == "out" and not _read(fd, tail, reads=1):
                            sel.unregister(fd)
            finally:
                if pidfd is not None:
                    os.close(pidfd)


def _read(fd, tail, reads):
    """Read what the pipe holds (at most `reads` chunks) into the bounded tail; False at its end."""
    for _ in range(reads):
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not chunk:
            return False
        tail += chunk
        del tail[:-OUTPUT_TAIL]
    return True


def _pidfd(pid):
    """A descriptor that becomes readable when the process ends (Linux 5.3+), or None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
