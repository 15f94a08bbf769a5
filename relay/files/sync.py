"""How relay makes files and directories durable before anything depends on them.

The rule (README, "Durability"): a file's content is synced before anything refers to it (an
envelope before its link into new/), a directory's changes are synced before anything depends
on them (the links in new/ before the ledger records a delivery), and no rename that depends on
a ledger record happens before that record's commit is durable.

A batch notes what it wrote (`file_written(fd)`, which takes the descriptor over), the ledger's
log when its claim was committed without a sync (`log_written`: synced first, as SQLite would,
its failure a LogSyncError that fails the step), and which directories it changed
(`dir_changed(rel)`), then calls `flush()` once per phase. Two ways to
flush, chosen per file system:

- "file": fsync of every noted file, then of every noted directory, many in flight at once on a
  small thread pool (the file system groups concurrent syncs into few journal commits). Correct
  on any POSIX file system that honours fsync.
- "fs": one syncfs(2) of the state directory's file system. Used only on file systems known to
  flush everything on syncfs (ext2/3/4, XFS, Btrfs, tmpfs), decided by the statfs magic of the
  state directory. syncfs returns 0 and flushes nothing on FUSE (and so LazyFS), NFS, 9p and
  many other mounts; there "file" is used. A small flush (at most FEW files and FEW_DIRS
  directories noted, a daemon delivering a steady trickle) is made by fsyncs even there, one
  after another: syncfs walks every cached inode of the file system and waits for whatever any
  process wrote on it, where an fsync waits for one journal commit, which the later fsyncs of
  the same flush find done. A message for another node changes three directories (its outbox,
  the spool, its archive day): synced so where one directory's fsync commits every change
  before it (ext4, XFS), it does not wait on what other processes of the machine are writing
  (the receiving node's envelopes, when it is on the same machine).

With durability "normal" nothing is synced. An fsync error raises DurabilityError and is never
retried: the data may be lost. `fsync` is a seam: on macOS it is fcntl(F_FULLFSYNC), since
fsync there does not flush the drive's cache; tests pass their own to inject faults.
"""
import concurrent.futures
import ctypes
import ctypes.util
import errno
import logging
import os
import struct
import sys
import threading

from relay.errors import DurabilityError, LogSyncError
from relay.files.fs import Unsafe, default_fsync, fdatasync, full_fsync  # noqa: F401  (the sync primitives, here too)

log = logging.getLogger(__name__)

# statfs f_type of file systems whose syncfs(2) writes back every dirty page and inode.
SYNCFS_HONOURED = {0xEF53: "ext4", 0x58465342: "xfs", 0x9123683E: "btrfs", 0x01021994: "tmpfs"}
POOL_SIZE = 16
MAX_HELD = 256           # files held open for the batch's sync before an early flush
FEW = 4                  # "fs" mode: a flush of at most this many files ...
FEW_DIRS = 3             # ... and directories is made by fsyncs, not syncfs, on a file system whose
                         # directory fsync commits every change made before it (ORDERED) ...
FEW_DIRS_ELSEWHERE = 2   # ... and of this many elsewhere (Btrfs logs one directory's entries)
# ext3/ext4 (a journal commit) and XFS (the log forced to the directory's last change, the
# renames logged in order): synced one by one, the directories of a message moved outbox ->
# spool -> archive are durable together at the first fsync. (ext2 shares ext4's magic and
# orders nothing, with syncfs or without.)
ORDERED = {0xEF53, 0x58465342}

_libc = None


def _lib():
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        except OSError:
            _libc = False
    return _libc or None


def syncfs(fd):
    fn = getattr(_lib(), "syncfs", None)
    if fn is None:
        raise OSError(errno.ENOSYS, "syncfs is not available")
    if fn(ctypes.c_int(fd)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def fs_type(fd):
    """The statfs magic of the file system holding `fd`, or None where it cannot be read."""
    fn = getattr(_lib(), "fstatfs", None)
    if fn is None or not sys.platform.startswith("linux"):
        return None
    buf = ctypes.create_string_buffer(256)
    if fn(ctypes.c_int(fd), buf) != 0:
        return None
    return struct.unpack_from("l", buf.raw)[0]




def choose_mode(fd):
    """'fs' where syncfs is known to flush this file system, else 'file'."""
    if getattr(_lib(), "syncfs", None) is None:
        return "file"
    return "fs" if fs_type(fd) in SYNCFS_HONOURED else "file"


def _done():
    return None


class Syncer:
    """Collects what a batch wrote and makes it durable in one call per phase."""

    def __init__(self, durability, state, mode=None, fsync=None):
        self.durable = durability == "full"
        self.state = state                     # a fs.StateDir
        self.mode = mode or choose_mode(state.fd)
        self.few_dirs = FEW_DIRS if fs_type(state.fd) in ORDERED else FEW_DIRS_ELSEWHERE
        self.fsync = fsync or default_fsync
        self.syncfs = syncfs                   # a seam too: tests count or fail it
        self.log_sync = fdatasync              # the ledger's log, as SQLite syncs it (a seam too)
        self.files = []                        # descriptors held until the next flush
        self.logs = []                         # (descriptor, done) synced by the next flush alone (log_written)
        self.dirs = set()                      # relative paths of changed directories
        self.many = False                      # "fs" mode: more than FEW files since the last flush
        self._pool = None
        self._later = None                     # the one thread of flush_later()
        self._lock = threading.Lock()

    def close(self):
        self._close_files(logs=True)
        for pool in (self._later, self._pool):
            if pool is not None:
                pool.shutdown(wait=True)
        self._pool = self._later = None

    def file_written(self, fd):
        """Take over the descriptor of a file just written; it is synced by the next flush."""
        if not self.durable:
            os.close(fd)
        elif self.mode == "file":
            self.files.append(fd)
            if len(self.files) >= MAX_HELD:
                self._sync_files("written files")
        elif self.many or len(self.files) + len(self.logs) >= FEW:     # a syncfs flushes them all
            self.many = True
            self._close_files()
            os.close(fd)
        else:
            self.files.append(fd)

    def log_written(self, fd, done):
        """Take over the descriptor of a log whose commits are not synced yet (the ledger's):
        it is synced first by the next flush() or flush_later(), before anything else noted,
        never by the early sync of written files (MAX_HELD); `done()` is called once it is.
        Its sync failing raises LogSyncError (a syncfs that fails, whatever it was for): never
        taken for a file's, never retried."""
        if not self.durable:
            os.close(fd)
            done()
        else:
            self.logs.append((fd, done))

    def _sync_logs(self, what, whole=False):
        """Sync the logs noted (or, `whole`, only close them: the caller's syncfs syncs them)."""
        logs, self.logs = self.logs, []
        try:
            if not whole:
                for fd, _ in logs:
                    self._call(self.log_sync, fd, f"{what} (the ledger's log)")
        except DurabilityError as e:
            raise LogSyncError(str(e)) from e
        finally:
            for fd, _ in logs:
                os.close(fd)
        return [done for _, done in logs]

    def sync_now(self, fd, what):
        """Sync one file at once (rare paths that must not wait for the batch)."""
        if self.durable:
            self._call(self.fsync, fd, what)

    def dir_changed(self, rel):
        if self.durable:
            self.dirs.add(rel)

    def flush(self, what, dirs=True):
        """Make everything noted so far durable. `what` names it for the error. With `dirs`
        False, in "fs" mode, the files written (their content) at least: the directories noted
        may wait for the next flush (which a syncfs makes needless, and so forgets them). In
        "file" mode they are synced all the same: there a directory synced orders nothing
        about another, and the moves that follow (a file out of the spool into the archive or
        failed/) depend on the renames noted so far (the file into the spool) being durable;
        were the archive durable and the outbox not, the file would come back in both."""
        if not self.durable:
            self.dirs.clear()
            return
        dirs = dirs or self.mode == "file"
        whole = self._whole(dirs)
        try:
            if whole:
                self._close_files()
                done = self._sync_logs(what, whole=True)
                try:
                    self._call(self.syncfs, self.state.fd, what)
                except DurabilityError as e:
                    if done:
                        raise LogSyncError(str(e)) from e
                    raise
                for fn in done:
                    fn()
            else:
                for fn in self._sync_logs(what):
                    fn()
                self._sync_files(what)
                if dirs:
                    self._sync_dirs(what)
        finally:
            if dirs or whole:
                self.dirs.clear()
            self.many = False

    def _whole(self, dirs=True):
        """Whether this flush is one syncfs ("fs" mode, and more than a few things to sync)."""
        return self.mode == "fs" and (self.many or (dirs and len(self.dirs) > self.few_dirs))

    def flush_later(self, what, submit=None):
        """Start making durable everything noted so far on another thread (`submit(fn, *args)`,
        an executor's submit: a seam; by default one thread of the syncer's own), and return a callable that waits for it and raises its
        DurabilityError: the group commit of core/pipeline.py overlaps this sync with the next batch's
        reading. What is noted after this call belongs to the next flush. Directories are
        opened here, on the caller's thread (the confined file system is not shared)."""
        if not self.durable:
            self.dirs.clear()
            return _done
        if submit is None:
            if self._later is None:
                self._later = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="relay-commit")
            submit = self._later.submit
        for fn in self._sync_logs(what):       # not overlapped: what depends on it waits for it
            fn()
        if self._whole():
            self._close_files()
            self.dirs.clear()
            self.many = False
            return submit(self._call, self.syncfs, self.state.fd, what).result
        self.many = False
        files, self.files = self.files, []
        jobs = [(fd, what) for fd in files]
        try:
            jobs += self._open_dirs(sorted(self.dirs), what)
        except BaseException:
            for fd, _ in jobs:
                os.close(fd)
            raise
        finally:
            self.dirs.clear()
        return submit(self._sync_and_close, jobs).result

    # -- internals --------------------------------------------------------------------------

    def _sync_and_close(self, jobs):
        try:
            self._all(jobs)
        finally:
            for fd, _ in jobs:
                os.close(fd)

    def _open_dirs(self, rels, what):
        """(fd, what) of each directory to sync that is still there (see _sync_dirs)."""
        jobs = []
        try:
            for rel in rels:
                try:
                    jobs.append((self.state.open_dir(rel), f"{what} ({rel or '.'})"))
                except FileNotFoundError:
                    continue
                except Unsafe as e:
                    log.warning("%s; not synced", e.strerror)
                    continue
                except OSError as e:
                    raise DurabilityError(f"cannot open {rel} to sync it: {e.strerror or e}") from e
        except BaseException:
            for fd, _ in jobs:
                os.close(fd)
            raise
        return jobs

    def _close_files(self, logs=False):
        files, self.files = self.files, []
        if logs:
            files, self.logs = files + [fd for fd, _ in self.logs], []
        for fd in files:
            os.close(fd)

    def _sync_files(self, what):
        files, self.files = self.files, []
        try:
            self._all([(fd, what) for fd in files])
        finally:
            for fd in files:
                os.close(fd)

    def _sync_dirs(self, what):
        rels = sorted(self.dirs)
        for i in range(0, len(rels), MAX_HELD):
            jobs = []
            try:
                for rel in rels[i:i + MAX_HELD]:
                    try:
                        jobs.append((self.state.open_dir(rel), f"{what} ({rel or '.'})"))
                    except FileNotFoundError:
                        continue    # removed since (an emptied archive day): nothing to make durable
                    except Unsafe as e:
                        # Swapped for a link by an agent since the batch changed it: what the batch
                        # put there went away with the directory the agent moved.
                        log.warning("%s; not synced", e.strerror)
                        continue
                    except OSError as e:
                        raise DurabilityError(f"cannot open {rel} to sync it: {e.strerror or e}") from e
                self._all(jobs)
            finally:
                for fd, _ in jobs:
                    os.close(fd)

    def _all(self, jobs):
        """fsync every (fd, what), many at once; the first error is raised after all ran. In "fs"
        mode (a journalling file system: the first fsync commits what the others wait for) and
        for two or fewer, one after another on this thread."""
        if len(jobs) <= 2 or self.mode == "fs":
            for fd, what in jobs:
                self._call(self.fsync, fd, what)
            return
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(POOL_SIZE, thread_name_prefix="relay-sync")
        futures = [self._pool.submit(self._call, self.fsync, fd, what) for fd, what in jobs]
        first = None
        for f in futures:
            try:
                f.result()
            except DurabilityError as e:
                first = first or e
        if first is not None:
            raise first

    @staticmethod
    def _call(fn, fd, what):
        try:
            fn(fd)
        except OSError as e:
            raise DurabilityError(f"fsync of {what} failed: {e.strerror or e}; the data may not be on disk, "
                                  "so relay does not count it as written") from e
