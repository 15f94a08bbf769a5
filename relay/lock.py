"""One daemon per state directory: an flock on relay.lock, which holds the daemon's pid."""
import fcntl
import os

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

