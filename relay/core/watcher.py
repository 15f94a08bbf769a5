"""The file watcher: turns file events into hints for the relay loop; the loop decides everything
by looking at the file system itself (events are hints, never the truth).

On Linux relay reads inotify itself (`Inotify` below): one descriptor, which the daemon's loop
reads itself (Relay.run's `watch`: at the top of each turn, and in its idle poll beside the
loop's wake-up pipe; no thread, no hand-off, one read for all the events since the last turn),
or a thread that blocks in poll() and hands the loop one batch of hints per read; and a mask
with only the events relay needs: on outbox/, a directory created or moved in (a new agent); on outbox/<agent>/, a file
renamed in or closed after writing (complete: the message) or created (a writer in place, whose
file the settle rule then watches). A tmp file's open, modify and the rename's "from" half are
never asked for, and the events of names relay ignores (dot-files, *.tmp ...: layout's
is_in_progress_name) are dropped as they are read, before they cost a hint. A queue overflow
asks for a rescan. Elsewhere (no inotify: relay/files/inotify.py) a watchdog Observer does the same.
"""
import errno
import logging
import os
import select
import struct
import threading

from watchdog.events import (DirCreatedEvent, DirMovedEvent, FileClosedEvent, FileCreatedEvent,
                             FileModifiedEvent, FileMovedEvent, FileSystemEventHandler)
from watchdog.observers import Observer

from relay.files.layout import is_in_progress_name, valid_agent

from relay.files import inotify
from relay.files.inotify import inotify_add_watch, inotify_init

log = logging.getLogger(__name__)

if inotify.available:
    _K = inotify.Constants
    IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = _K.IN_CLOSE_WRITE, _K.IN_MOVED_TO, _K.IN_CREATE
    IN_DELETE_SELF, IN_MOVE_SELF = _K.IN_DELETE_SELF, _K.IN_MOVE_SELF
    IN_Q_OVERFLOW, IN_IGNORED, IN_ONLYDIR = _K.IN_Q_OVERFLOW, _K.IN_IGNORED, _K.IN_ONLYDIR
    IN_DONT_FOLLOW, IN_ISDIR = _K.IN_DONT_FOLLOW, _K.IN_ISDIR
else:                               # the reader is not used: the values only keep the masks defined
    IN_CLOSE_WRITE = IN_MOVED_TO = IN_CREATE = IN_DELETE_SELF = IN_MOVE_SELF = 0
    IN_Q_OVERFLOW = IN_IGNORED = IN_ONLYDIR = IN_DONT_FOLLOW = IN_ISDIR = 0
InotifyMoveEventGrouper = inotify.MoveEventGrouper
ROOT_MASK = IN_CREATE | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW
AGENT_MASK = IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE | IN_ONLYDIR | IN_DONT_FOLLOW
HEADER = struct.Struct("iIII")      # wd, mask, cookie, len: struct inotify_event
READ_SIZE = 1 << 16
GONE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)     # the outbox missing or no directory: nothing to watch


def hints_of(events, names, root_wd):
    """The hints of a list of inotify events (wd, mask, name bytes), with what to watch:
    (hints, agent directories to watch, watch descriptors gone, whether the outbox itself went).
    `names`: wd -> agent name. Pure, so that tests drive it without a kernel."""
    hints, watch, gone, lost = [], [], [], False
    for wd, mask, raw in events:
        if mask & IN_Q_OVERFLOW:
            hints.append(("rescan", None, None))
            continue
        if mask & IN_IGNORED:
            gone.append(wd)
            continue
        if wd == root_wd:
            if mask & (IN_DELETE_SELF | IN_MOVE_SELF):
                lost = True
            elif mask & IN_ISDIR and raw:
                name = os.fsdecode(raw)
                watch.append(name)
                hints.append(("dir", name, None))
            continue
        sender = names.get(wd)
        if sender is None or mask & IN_ISDIR or not raw or raw[:1] == b".":
            continue
        name = os.fsdecode(raw)
        if is_in_progress_name(name):
            continue
        hints.append(("closed" if mask & (IN_MOVED_TO | IN_CLOSE_WRITE) else "file", sender, name))
    return hints, watch, gone, lost


def parse(buf):
    """(wd, mask, name bytes) of each event in what one read returned."""
    out, off, end = [], 0, len(buf)
    while off + HEADER.size <= end:
        wd, mask, _, size = HEADER.unpack_from(buf, off)
        off += HEADER.size
        out.append((wd, mask, buf[off:off + size].rstrip(b"\0")))
        off += size
    return out


class Inotify:
    """relay's own inotify reader (Linux): a thread that hands hints to the relay in batches."""

    def __init__(self, relay):
        self.relay = relay
        self.outbox = os.fsencode(str(relay.layout.outbox))
        self.fd = inotify_init()
        if self.fd < 0:
            e = inotify.errno_now()
            raise OSError(e, f"inotify: {os.strerror(e)}")
        os.set_inheritable(self.fd, False)
        self.names = {}             # wd -> agent name
        self.root_wd = None
        self.stop_r, self.stop_w = os.pipe()
        self.thread = None
        self.started = False
        self._poller = None
        self.lost = False

    def start(self, thread=True):
        self.root_wd = self._add(self.outbox, ROOT_MASK)
        if self.root_wd is None:
            e = inotify.errno_now() or errno.ENOENT
            raise OSError(e, f"cannot watch {os.fsdecode(self.outbox)}: {os.strerror(e)}")
        try:
            entries = list(os.scandir(self.outbox))
        except OSError:
            entries = []
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                self._watch_agent(os.fsdecode(entry.name))
        self.started = True
        if thread:
            self.thread = threading.Thread(target=self._run, name="relay-inotify", daemon=True)
            self.thread.start()

    def _add(self, path, mask):
        wd = inotify_add_watch(self.fd, path, mask)
        return None if wd < 0 else wd

    def _watch_agent(self, name):
        if not valid_agent(name):
            return
        wd = inotify_add_watch(self.fd, self.outbox + b"/" + os.fsencode(name), AGENT_MASK)
        if wd < 0:
            e = inotify.errno_now()
            if e not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                log.warning("cannot watch outbox/%s (%s); its files are found by the rescan every %gs",
                            name, os.strerror(e), self.relay.config.rescan_interval)
            return
        self.names[wd] = name

    def _run(self):
        try:
            while self.pump(None):
                pass
        except OSError as e:
            log.error("the file watcher failed: %s", e)
            self.lost = True

    def pump(self, timeout):
        """Wait up to `timeout` seconds (None: for ever) for events, then hand the loop their
        hints in one batch. False when the watcher must end (stopped, or the outbox went). The
        thread's body; tests call it directly (start(thread=False))."""
        if self._poller is None:
            self._poller = select.poll()
            self._poller.register(self.fd, select.POLLIN)
            self._poller.register(self.stop_r, select.POLLIN)
        ready = {fd for fd, _ in self._poller.poll(None if timeout is None else timeout * 1000)}
        if self.stop_r in ready:
            return False
        if self.fd not in ready:
            return True
        try:
            buf = os.read(self.fd, READ_SIZE)
        except (InterruptedError, BlockingIOError):
            return True
        hints, watch, gone, lost = hints_of(parse(buf), self.names, self.root_wd)
        for wd in gone:
            self.names.pop(wd, None)
        for name in watch:          # watched before the loop scans it: nothing slips between
            self._watch_agent(name)
        if hints:
            self.relay.hint_many(hints)
        if lost:                    # the outbox itself went: alive() says so, the daemon restarts it
            self.lost = True
            return False
        return True

    def alive(self):
        if self.lost or not self.started:
            return False
        return self.thread is None or self.thread.is_alive()

    def stop(self):
        if self.thread is not None:
            os.write(self.stop_w, b"x")
            self.thread.join(timeout=5)
            self.thread = None
        for fd in (self.fd, self.stop_r, self.stop_w):
            try:
                os.close(fd)
            except OSError:
                pass




# -- the fallback: watchdog --------------------------------------------------------------------

# The events that can mean "a message may be complete" or "a new agent directory": every other
# kind (opened, closed without writing, deleted, attributes) is dropped before it costs anything.
# Modifications are kept for writers in place, whose file the settle rule then watches.
EVENTS = [FileMovedEvent, FileClosedEvent, FileCreatedEvent, FileModifiedEvent, DirCreatedEvent, DirMovedEvent]


def observer():
    """A watchdog Observer that hands on each event at once."""
    if InotifyMoveEventGrouper is None:
        return Observer()
    # watchdog holds each IN_MOVED_FROM for 0.5 s to pair it with its IN_MOVED_TO, and its
    # queue sleeps out that delay even when the pair arrives at once: every rename would wait
    # half a second. relay needs no pairing (it only wants the destination, which full events
    # report on their own), so no delay.
    InotifyMoveEventGrouper.delay = 0
    return Observer(generate_full_events=True)


class _LostEvents(logging.Handler):
    """watchdog recovers from an inotify queue overflow by itself but only logs it; relay
    must rescan then, since events were dropped."""

    def __init__(self, relay):
        super().__init__(logging.WARNING)
        self.relay = relay

    def emit(self, record):
        if "overflow" in record.getMessage().lower():
            self.relay.hint("rescan")


class Handler(FileSystemEventHandler):
    def __init__(self, relay, outbox):
        self.relay = relay
        self.outbox = os.path.realpath(outbox)

    def _where(self, path):
        """(sender, path) for a file directly in an agent directory, (sender, None) for an
        agent directory itself, None for anything else."""
        rel = os.path.relpath(path, self.outbox)
        parts = rel.split(os.sep)
        if rel.startswith("..") or len(parts) > 2:
            return None
        if len(parts) == 1:
            return parts[0], None
        return parts[0], path

    def dispatch(self, event):
        path = event.dest_path if isinstance(event, (FileMovedEvent, DirMovedEvent)) else event.src_path
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not path:        # the "from" half of a move reported on its own
            return
        where = self._where(path)
        if where is None:
            return
        sender, file_path = where
        if event.is_directory:
            if file_path is None and isinstance(event, (DirCreatedEvent, DirMovedEvent)):
                self.relay.hint("dir", sender)
            return
        if file_path is None:
            return
        if event.event_type == "deleted":
            return
        name = os.path.basename(file_path)
        if is_in_progress_name(name):       # a dot-tmp file on its way: no hint
            return
        complete = isinstance(event, (FileMovedEvent, FileClosedEvent))
        self.relay.hint("closed" if complete else "file", sender, name)


class Watcher:
    """The daemon's watcher: relay's own inotify reader where there is inotify, else a watchdog
    Observer (also when no inotify instance can be had: it says so the same way). With `thread`
    False the inotify reader has no thread: the loop reads it (`fileno`, `pump`)."""

    def __init__(self, relay, thread=True, own_reader=True):
        self.relay = relay
        self.thread = thread
        self.own_reader = own_reader    # False: watchdog's Observer even where relay could read inotify
        self.observer = None
        self.inotify = None
        self.lost = _LostEvents(relay)
        self.missing = False        # the outbox was missing (or no directory) at the last start

    def fileno(self):
        """The descriptor the loop polls for events, or None (a thread of the watcher's reads
        them, or the reader is lost: nothing to wait on until the daemon starts it again)."""
        reader = self.inotify
        return reader.fd if reader is not None and reader.thread is None and not reader.lost else None

    def pump(self, timeout):
        """Read the events there are (waiting up to `timeout` seconds) and hand the loop their
        hints, where the loop reads the watcher itself; an error marks it lost (alive() False:
        the daemon starts it again, with a rescan)."""
        reader = self.inotify
        if reader is None or reader.thread is not None or reader.lost:
            return
        try:
            reader.pump(timeout)
        except OSError as e:
            log.error("the file watcher failed: %s", e)
            reader.lost = True
        if reader.lost:             # the loop steps now, and the daemon starts the watcher again
            self.relay.wake.set()

    def start(self):
        """Start watching the outbox; False when it is missing or no directory (moved away, say):
        nothing is watched then (alive() False), it is said once, and the daemon tries again
        after each of its steps, which the rescan schedules meanwhile."""
        outbox = self.relay.layout.outbox
        try:
            self._start(outbox)
        except OSError as e:
            self.stop()
            if e.errno not in GONE:
                raise
            if not self.missing:
                log.warning("%s is missing or no directory (%s); no file watcher until it is back: "
                            "its files are found by the rescan every %gs", outbox, os.strerror(e.errno),
                            self.relay.config.rescan_interval)
            self.missing = True
            return False
        if self.missing:
            log.info("%s is back; watching it again", outbox)
            self.missing = False
        return True

    def _start(self, outbox):
        if inotify_init is not None and self.own_reader:
            try:
                self.inotify = Inotify(self.relay)
                self.inotify.start(thread=self.thread)
                return
            except OSError as e:
                if self.inotify is not None:
                    self.inotify.stop()
                    self.inotify = None
                if e.errno in GONE:         # watchdog cannot watch it either
                    raise
                log.info("relay's own inotify reader cannot start (%s); watching through watchdog", e)
        obs = observer()
        obs.daemon = True
        try:
            obs.schedule(Handler(self.relay, outbox), str(outbox), recursive=True, event_filter=EVENTS)
            obs.start()
        except BaseException:
            obs.unschedule_all()
            raise
        self.observer = obs             # started: stop() joins it
        logging.getLogger("watchdog").addHandler(self.lost)

    def alive(self):
        if self.inotify is not None:
            return self.inotify.alive()
        return self.observer is not None and self.observer.is_alive()

    def restart(self):
        """Start the watcher again (after each step while it is not alive) and rescan, unless
        the outbox is still missing: then quietly, and no step follows at once."""
        if not self.missing:
            log.warning("the file watcher stopped; restarting it and rescanning every outbox")
        self.stop()
        if self.start():
            self.relay.hint("rescan")

    def stop(self):
        if self.inotify is not None:
            self.inotify.stop()
            self.inotify = None
        logging.getLogger("watchdog").removeHandler(self.lost)
        if self.observer is not None:
            self.observer.stop()
            self.observer.join(timeout=5)
            self.observer = None
