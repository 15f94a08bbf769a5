"""One daemon per state directory: an flock on relay.lock, which holds the daemon's pid; and
one process at a time running an operator command under a given id: an flock on commands.lock.

relay.lock lies where agents can write: it is opened without following a link and without
blocking (a FIFO planted there), and used only while it is a regular file with no other link;
anything else is refused with what to do, never truncated or written.
"""
import contextlib
import errno
import fcntl
import os
import signal
import stat
import time

from relay.errors import DaemonRunning, RelayError

OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _checked(fd, path):
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise RelayError(f"{path} is not a plain file of relay's ({'not a regular file' if not stat.S_ISREG(st.st_mode) else 'it has other hard links'}); "
                         "relay never writes through it: remove it and start again")
    return fd


def _open(path, flags, mode=0o644):
    try:
        return _checked(os.open(path, flags | OPEN, mode), path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RelayError(f"{path} is a symbolic link; relay never writes through it: remove it and "
                             "start again") from None
        raise


class DaemonLock:
    def __init__(self, path):
        self.path = str(path)
        self.fd = None

    def acquire(self):
        fd = _open(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise DaemonRunning(pid, self.path) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def held(self):
        """True while this lock still guards the state directory: the flock'ed file is still
        linked and still the one at the path. Once it is removed or replaced, another daemon can
        take a new lock there."""
        if self.fd is None:
            return False
        st = os.fstat(self.fd)
        return st.st_nlink > 0 and identity(self.path) == (st.st_dev, st.st_ino)

    def release(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


@contextlib.contextmanager
def exclusive(path, wait, busy, poll=0.05):
    """Hold an flock on the file at `path` for the block, waiting up to `wait` seconds for
    another process to let it go; then RelayError(`busy`). A process that dies lets it go."""
    fd = _open(str(path), os.O_RDWR | os.O_CREAT)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise RelayError(busy) from None
                time.sleep(poll)
        yield
    finally:
        os.close(fd)


def holder(path):
    """The pid of the running daemon, or None when no daemon holds the lock."""
    try:
        fd = _open(str(path), os.O_RDONLY)
    except (FileNotFoundError, RelayError):
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 32).decode(errors="replace").strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def identity(path, follow=False):
    """(st_dev, st_ino) of the file at `path` itself (a link is followed only when asked, as
    for /proc/<pid>/fd/<n>), or None when there is none."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def wake(path, sig=signal.SIGUSR1):
    """Tell the daemon holding the lock at `path` to look at the ledger now (after an operator
    changed it). Returns the pid signalled, or None: no daemon holds the lock, or it cannot be
    signalled (it then finds the work at its next rescan)."""
    try:
        pid = holder(path)
        if pid is None or pid <= 0 or pid == os.getpid() or not _expects(pid, path, sig):
            return None
        os.kill(pid, sig)
    except OSError:        # a lock file not ours to read, a daemon gone meanwhile or another user's
        return None
    return pid


def _expects(pid, path, sig):
    """Where /proc can tell (Linux): the process catches `sig` (a relay too old to know it would
    be ended by it) and, when its fds are readable, has the lock file open (so a pid read from
    the file that means another process here, as across pid namespaces, is never signalled)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next((int(line.split()[1], 16) for line in f if line.startswith("SigCgt:")), None)
    except FileNotFoundError:
        return not os.path.isdir("/proc/self")      # no /proc at all (macOS): trust the lock
    except OSError:
        return False
    if caught is None or not caught >> (sig - 1) & 1:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return True                                 # not ours to read: the signal check stands
    lock = identity(path)
    return any(identity(f"/proc/{pid}/fd/{fd}", follow=True) == lock for fd in fds)
