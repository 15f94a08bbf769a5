"""One daemon per state directory: an flock on relay.lock, which holds the daemon's pid."""
import fcntl
import os
import signal

from .errors import DaemonRunning


class DaemonLock:
    def __init__(self, path):
        self.path = str(path)
        self.fd = None

    def acquire(self):
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
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


def holder(path):
    """The pid of the running daemon, or None when no daemon holds the lock."""
    try:
        fd = os.open(str(path), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
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


def identity(path):
    """(st_dev, st_ino) of the file at `path` (symlinks followed, as open() does), or None when
    there is none."""
    try:
        st = os.stat(path)
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
    return any(identity(f"/proc/{pid}/fd/{fd}") == lock for fd in fds)
