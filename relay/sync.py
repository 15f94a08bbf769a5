"""How relay makes files and directories durable before the ledger records a state.

With durability "full", one batch makes its writes durable either file by file (fsync of each
file and each directory touched) or, on Linux, with one syncfs(2) of the state directory's file
system per phase, which flushes the whole batch in one journal commit. With "normal" nothing is
fsynced: the kernel writes back on its own schedule.

An fsync error raises DurabilityError and is never retried: the data may be lost.
"""
import ctypes
import ctypes.util
import errno
import os

from .errors import DurabilityError

_libc = None


def _syncfs_fn():
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            _libc.syncfs.argtypes = [ctypes.c_int]
        except (OSError, AttributeError):
            _libc = False
    return getattr(_libc, "syncfs", None) if _libc else None


def syncfs(fd):
    fn = _syncfs_fn()
    if fn is None:
        raise OSError(errno.ENOSYS, "syncfs is not available")
    if fn(fd) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def fsync(fd):
    os.fsync(fd)


class Syncer:
    """Collects what a batch wrote and makes it durable in one call per phase."""

    def __init__(self, durability, anchor, mode=None):
        self.durable = durability == "full"
        self.anchor = str(anchor)
        if mode is None:
            mode = "fs" if _syncfs_fn() is not None else "file"
        self.mode = mode
        self.dirs = set()

    def file_written(self, fd):
        """Called with the fd of each file written, before it is closed."""
        if self.durable and self.mode == "file":
            self._fsync(fd)

    def dir_changed(self, path):
        if self.durable:
            self.dirs.add(str(path))

    def flush(self, what):
        """Make everything noted so far durable. `what` names it for the error."""
        if not self.durable:
            self.dirs.clear()
            return
        if self.mode == "fs":
            fd = os.open(self.anchor, os.O_RDONLY | os.O_DIRECTORY)
            try:
                self._call(syncfs, fd, what)
            finally:
                os.close(fd)
        else:
            for path in sorted(self.dirs):
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
                except FileNotFoundError:
                    continue
                try:
                    self._call(fsync, fd, f"{what} ({path})")
                finally:
                    os.close(fd)
        self.dirs.clear()

    def _fsync(self, fd):
        self._call(fsync, fd, "a written file")

    @staticmethod
    def _call(fn, fd, what):
        try:
            fn(fd)
        except OSError as e:
            raise DurabilityError(f"fsync of {what} failed: {e.strerror or e}; "
                                  "the data may not be on disk, so relay does not count it as written") from e
