"""Outbox scanning: which files are messages, and which of them are complete (SPEC section 2).

A regular file is complete when an event said so (renamed in, closed after writing) or its
mtime is at least `settle` old, and, on Linux, no process holds it open for writing (a read
lease can be taken). Files that are not regular are reported at once so they can be
quarantined; they are never opened.
"""
import dataclasses
import errno
import logging
import os
import signal
import stat

from .layout import is_in_progress_name

log = logging.getLogger(__name__)

try:
    import fcntl
    F_SETLEASE = getattr(fcntl, "F_SETLEASE", None)
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None
    F_SETLEASE = None

OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


@dataclasses.dataclass(frozen=True)
class Found:
    sender: str
    name: str
    path: str
    sent_at: float
    regular: bool


def ignore_lease_breaks():
    """A lease break is signalled with SIGIO, whose default action ends the process."""
    if hasattr(signal, "SIGIO"):
        try:
            signal.signal(signal.SIGIO, signal.SIG_IGN)
        except ValueError:  # not the main thread: the caller's main thread must do it
            pass


class Leases:
    """Asks the kernel whether any process holds a file open for writing."""

    def __init__(self, enabled=True):
        self.supported = enabled and F_SETLEASE is not None

    def writers(self, fd):
        """True when another process has the file open for writing."""
        if not self.supported:
            return False
        try:
            fcntl.fcntl(fd, F_SETLEASE, fcntl.F_RDLCK)
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EBUSY):
                return True
            if e.errno in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
                log.info("file leases are not supported here (%s); completeness by the settle time alone", e)
                self.supported = False
            return False
        fcntl.fcntl(fd, F_SETLEASE, fcntl.F_UNLCK)
        return False

    def busy(self, path):
        try:
            fd = os.open(path, OPEN_FLAGS)
        except OSError:
            return False
        try:
            return self.writers(fd)
        finally:
            os.close(fd)


class Outbox:
    """Finds complete message files in outbox/<agent>/ directories."""

    def __init__(self, layout, settle, leases=None):
        self.layout = layout
        self.settle = settle
        self.leases = leases or Leases()
        self.waiting = {}        # path -> time at which to look again
        self.reported = set()    # bad directories already logged

    def agent_dirs(self):
        for name, path, problem in self.layout.outbox_dirs():
            if problem:
                if name not in self.reported:
                    self.reported.add(name)
                    log.warning("outbox/%s is not read: %s", name, problem)
                continue
            yield name, path

    def scan_all(self, now):
        """Every complete file in every valid outbox (a generator)."""
        for name, path in self.agent_dirs():
            yield from self.scan_dir(name, path, now)

    def scan_dir(self, sender, path, now):
        try:
            entries = os.scandir(path)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as e:
            log.warning("cannot list outbox/%s: %s", sender, e)
            return
        with entries:
            for entry in entries:
                if is_in_progress_name(entry.name):
                    continue
                found = self.check(sender, entry.path, now)
                if found:
                    yield found

    def check(self, sender, path, now, hinted=False):
        """A Found when the file at `path` is ready to be taken, else None (maybe waiting)."""
        name = os.path.basename(path)
        if is_in_progress_name(name):
            return None
        try:
            st = os.lstat(path)
        except OSError:
            self.waiting.pop(path, None)
            return None
        if stat.S_ISDIR(st.st_mode):
            return None
        if not stat.S_ISREG(st.st_mode):
            self.waiting.pop(path, None)
            return Found(sender, name, path, st.st_mtime, regular=False)
        if not hinted and now - st.st_mtime < self.settle:
            self.waiting[path] = (sender, st.st_mtime + self.settle)
            return None
        if self.leases.busy(path):
            self.waiting[path] = (sender, now + max(self.settle, 0.05))
            return None
        self.waiting.pop(path, None)
        return Found(sender, name, path, st.st_mtime, regular=True)

    def due_waiting(self, now):
        """Waiting files whose time to look again has come."""
        due = [(p, s) for p, (s, at) in self.waiting.items() if at <= now]
        for path, sender in due:
            found = self.check(sender, path, now)
            if found:
                yield found

    def next_deadline(self):
        return min((at for _, at in self.waiting.values()), default=None)


def not_regular(path, st):
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        what = f"a symbolic link (to {target})"
    elif stat.S_ISFIFO(mode):
        what = "a FIFO (named pipe)"
    elif stat.S_ISSOCK(mode):
        what = "a socket"
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        what = "a device file"
    else:
        what = "not a regular file"
    return f"{what}: relay only relays regular files and never opens these; write the message as a plain file"
