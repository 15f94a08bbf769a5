"""Waiting for mail: `NewMail` wakes a waiter when a file arrives in an inbox's new/ (or a
directory above it is replaced), `Stop` ends a wait from another thread. On Linux the waiting
thread itself blocks (poll) on an inotify descriptor (relay/files/inotify.py): no thread,
no hand-off. Elsewhere, or with no inotify instance to be had, a watchdog Observer or a timed
look stands in. Agent.wait (api.py) is built on them."""
import fcntl
import logging
import math
import os
import select
import threading

from relay.files.inotify import Constants as InotifyConstants, inotify_add_watch, inotify_init

log = logging.getLogger(__name__)

MAX_SLICE = 86400.0     # the longest one sleep of a wait; a longer timeout is slept in slices
OBSERVER_RECHECK = 5.0  # without inotify, how often a wait checks that its directory is still there
DEGRADED_RECHECK = 0.5  # with no watch to be had at all, how often a wait looks for new messages


class Stop:
    """Ends Agent.wait calls early from another thread: pass it as `stop=`, then `set()` it
    (a byte in a pipe wakes a poll on inotify; an event wakes the observer's wait)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._set = False
        self._events = set()        # the observer waits to wake
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def set(self):
        with self._lock:
            if not self._set:
                self._set = True
                os.write(self._w, b"x")
            for event in self._events:
                event.set()

    def is_set(self):
        return self._set

    def fileno(self):
        return self._r

    def watch(self, event, on=True):
        """Set `event` when this is set (`on=False` forgets it)."""
        with self._lock:
            if on:
                self._events.add(event)
                if self._set:
                    event.set()
            else:
                self._events.discard(event)

    def close(self):
        fds, self._r, self._w = (self._r, self._w), -1, -1
        for fd in fds:
            if fd >= 0:
                os.close(fd)

    def __del__(self):
        try:
            self.close()
        except OSError:
            pass


class NewMail:
    """Woken when a file arrives in a directory (the last of `paths`), or when that directory
    or one above it is replaced: `stale()` then says the watch looks at a directory that is no
    longer there, and the caller arms a new one. On Linux the waiting thread itself blocks on
    an inotify descriptor (relay/files/inotify.py): no thread, no hand-off; a link is never
    followed at the last step. Elsewhere a watchdog Observer sets an event."""

    def __init__(self, paths):
        self.paths = [str(p) for p in paths]
        self.path = self.paths[-1]
        self.arrived = threading.Event()
        self.observer = self.fd = None
        self.identity = None

    def open(self):
        self.identity = self._identity()
        if inotify_init is None:
            return self._observe()
        K = InotifyConstants
        fd = inotify_init()
        if fd < 0:      # the user's inotify instances are used up (EMFILE), or no inotify here
            return self._observe()
        self.fd = fd
        fcntl.fcntl(fd, fcntl.F_SETFD, fcntl.FD_CLOEXEC)
        gone = K.IN_DELETE_SELF | K.IN_MOVE_SELF | K.IN_ONLYDIR | K.IN_DONT_FOLLOW
        for path in self.paths:
            # The directory itself: what arrives. Those above it: an entry swapped, so that the
            # path leads elsewhere now (an event there only makes the waiter look again).
            mask = K.IN_CREATE | K.IN_MOVED_TO | K.IN_CLOSE_WRITE | gone    # closed: written in place
            if path != self.path:
                mask |= K.IN_MOVED_FROM | K.IN_DELETE
            if inotify_add_watch(fd, os.fsencode(path), mask) < 0:
                os.close(fd)
                self.fd = None
                return self._observe()
        return self

    def _identity(self):
        out = []
        for path in self.paths:
            try:
                st = os.lstat(path)
                out.append((st.st_dev, st.st_ino, st.st_mode))
            except OSError:
                out.append(None)
        return out

    def stale(self):
        """True when a watched directory is no longer the one at its path (renamed, removed,
        replaced by a link): this watch would never hear of what arrives there now."""
        return self._identity() != self.identity

    def _observe(self):
        from watchdog.events import FileCreatedEvent, FileMovedEvent, FileSystemEventHandler

        from relay.core.watcher import observer
        arrived = self.arrived

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event):
                arrived.set()

        try:
            self.observer = observer()
            self.observer.schedule(Handler(), self.path, recursive=False,
                                   event_filter=[FileCreatedEvent, FileMovedEvent])
            self.observer.daemon = True
            self.observer.start()
        except OSError as e:
            # No watch to be had (inotify instances or watches used up: every daemon, editor
            # and IDE of this user holds some). Waiting still works, looking every so often.
            log.warning("cannot watch %s (%s); the wait looks for new messages every %gs instead",
                        self.path, e.strerror or e, DEGRADED_RECHECK)
            started, self.observer = self.observer, None
            if started is not None:
                started.stop()      # a start that failed has started its emitter's threads
                if started.is_alive():
                    started.join(timeout=5)
        return self

    def wait(self, timeout, stop=None):
        # poll() and Event.wait() refuse a time past what the platform can count (a
        # `--wait 99999999999d`): the caller's loop looks again after a slice and sleeps on.
        timeout = None if timeout is None else min(timeout, MAX_SLICE)
        if self.fd is not None:
            # poll(), not select(): select() refuses a descriptor numbered past 1023, which a
            # process holding many files (an MCP server, an agent's harness) hands out.
            poller = select.poll()
            for fd in [self.fd] + ([stop.fileno()] if stop is not None else []):
                poller.register(fd, select.POLLIN)
            ready = poller.poll(None if timeout is None else math.ceil(timeout * 1000))
            if any(fd == self.fd for fd, _ in ready):
                os.read(self.fd, 65536)         # what arrived matters, not its name: looked for after
            return
        # No inotify: the observer cannot tell of a swapped directory, so look again now and then;
        # with no watch at all, more often.
        every = OBSERVER_RECHECK if self.observer is not None else DEGRADED_RECHECK
        if stop is not None:
            stop.watch(self.arrived)
        try:
            self.arrived.wait(min(every, MAX_SLICE if timeout is None else timeout))
        finally:
            if stop is not None:
                stop.watch(self.arrived, on=False)
        self.arrived.clear()

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.observer is not None:
            self.observer.stop()
            self.observer.join(timeout=5)
            self.observer = None
