"""watchdog adapter. The handler only turns events into hints for the relay loop; the loop
decides everything by looking at the file system itself (events are hints, never the truth)."""
import logging
import os

from watchdog.events import (DirCreatedEvent, DirMovedEvent, FileClosedEvent, FileCreatedEvent,
                             FileModifiedEvent, FileMovedEvent, FileSystemEventHandler)
from watchdog.observers import Observer

try:
    from watchdog.observers.inotify_move_event_grouper import InotifyMoveEventGrouper
except ImportError:  # other platforms, other watchdog versions
    InotifyMoveEventGrouper = None

log = logging.getLogger(__name__)


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
        complete = isinstance(event, (FileMovedEvent, FileClosedEvent))
        self.relay.hint("closed" if complete else "file", sender, os.path.basename(file_path))


class Watcher:
    def __init__(self, relay):
        self.relay = relay
        self.observer = None
        self.lost = _LostEvents(relay)

    def start(self):
        outbox = self.relay.layout.outbox
        self.observer = observer()
        self.observer.schedule(Handler(self.relay, outbox), str(outbox), recursive=True, event_filter=EVENTS)
        logging.getLogger("watchdog").addHandler(self.lost)
        self.observer.daemon = True
        self.observer.start()

    def alive(self):
        return self.observer is not None and self.observer.is_alive()

    def restart(self):
        log.warning("the file watcher stopped; restarting it and rescanning every outbox")
        self.stop()
        self.start()
        self.relay.hint("rescan")

    def stop(self):
        logging.getLogger("watchdog").removeHandler(self.lost)
        if self.observer is not None:
            self.observer.stop()
            self.observer.join(timeout=5)
            self.observer = None
