"""Outbox files: which are messages, which are complete (contract §2), custody and reading.

A regular file is complete when an event said so (renamed in, closed after writing) or it has
stayed the same for `settle`, and, on Linux, no process holds it open for writing (a read lease
can be taken). Its mtime only says how long it has stayed the same when that mtime lies in the
past: a file dated in the future is watched by relay's own clock instead. A file with other
hard links waits out a writer's link-then-unlink moment, then is delivered from a private copy.
Files that are not regular are reported at once so they can be quarantined; they are never
opened. A name that is not UTF-8 or holds control characters is quarantined without a claim.

Custody: a claimed file is renamed into `spool/<agent>/<id>--<name>` before it is read.
"""
import errno
import hashlib
import logging
import os
import signal
import stat
import typing

from relay.core import flow, oversize
from relay.core.senders import undeclared
from relay.errors import TransientError
from relay.files.fs import Unsafe, bad_name, shown, write_all
from relay.files.layout import is_in_progress_name
from relay.core.readahead import ReadAhead

log = logging.getLogger(__name__)

try:
    import fcntl
    F_SETLEASE = getattr(fcntl, "F_SETLEASE", None)
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None
    F_SETLEASE = None

MIN_RECHECK = 0.05          # seconds before a busy file is looked at again
HEADER_ALLOWANCE = 256 * 1024


class Found(typing.NamedTuple):
    """A file found in an outbox, to register (one per file a step finds: a plain tuple)."""
    sender: str
    name: str
    sent_at: float
    regular: bool = True
    bad: str = None             # why the name itself is refused


def ignore_sigio():
    """The kernel tells the end of a file lease (OpenWriters) with SIGIO, whose default action
    ends the process."""
    if hasattr(signal, "SIGIO"):
        try:
            signal.signal(signal.SIGIO, signal.SIG_IGN)
        except ValueError:  # not the main thread: the caller's main thread must do it
            pass


class OpenWriters:
    """Asks the kernel whether any process holds a file open for writing, by taking a read
    lease on it (fcntl F_SETLEASE: refused while a writer holds it open). The kernel's file
    lease only; agents' path reservations (agent/leases.py) are another thing."""

    def __init__(self):
        self.supported = F_SETLEASE is not None

    def writers(self, fd):
        """True when another process has the file open for writing. Otherwise a read lease is
        held on `fd` until the caller closes it (at once: a writer's open waits for it)."""
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
        return False        # the lease taken goes with the descriptor: each caller closes it at once


class Outbox:
    """Finds complete message files in outbox/<agent>/ directories and takes custody of them."""

    def __init__(self, layout, settle, syncer, open_writers=None):
        self.layout = layout
        self.fs = layout.fs
        self.settle = settle
        self.syncer = syncer
        self.open_writers = open_writers or OpenWriters()
        self.waiting = {}        # (sender, name) -> (time to look again, why, waiting since)
        self.seen = {}           # (sender, name) -> ((size, mtime_ns, ino), first seen) for future mtimes
        self.reported = set()    # bad directories already logged
        self.declared = None     # senders = "declared": whether an agent is declared (name -> bool)
        self.read_ahead = ReadAhead()     # what the checks of a scan read (readahead.py)

    # -- finding ----------------------------------------------------------------------------

    def agent_dirs(self):
        if self.declared is not None:
            self.declared.names = None      # who is declared, read again at each look at outbox/
        for name, rel, problem in self.layout.outbox_dirs():
            if problem is None and not self.serves(name):
                problem = undeclared(name)
            if problem:
                if name not in self.reported:
                    self.reported.add(name)
                    log.warning("outbox/%s is not read: %s", shown(name), problem)
                continue
            self.reported.discard(name)
            yield name

    def serves(self, name):
        """Whether relay reads this agent's outbox: every valid one, or with `senders =
        "declared"` (`self.declared` is then set: name -> bool) the declared agents' only."""
        return self.declared is None or self.declared(name)

    def scan_all(self, now):
        """Every complete file in every valid outbox (a generator)."""
        self.read_ahead.drop()
        for name in self.agent_dirs():
            yield from self.scan_dir(name, now)

    def scan_dir(self, sender, now):
        try:
            entries = self.fs.scandir(f"outbox/{sender}")
        except OSError as e:
            if e.errno != errno.ENOENT:
                log.warning("cannot list outbox/%s: %s", sender, e.strerror or e)
            return
        for entry in entries:
            if is_in_progress_name(entry.name):
                continue
            found = self.check(sender, entry.name, now)
            if found:
                yield found

    def check(self, sender, name, now, hinted=False):
        """A Found when the file is ready to be taken, else None (maybe waiting)."""
        if is_in_progress_name(name):
            return None
        key = (sender, name)
        try:
            st = self.fs.lstat(f"outbox/{sender}/{name}")
        except (OSError, ValueError):
            self._forget(key)
            return None
        if stat.S_ISDIR(st.st_mode):
            return None
        reason = bad_name(name)
        if reason or not stat.S_ISREG(st.st_mode):
            self._forget(key)
            return Found(sender, name, st.st_mtime, regular=stat.S_ISREG(st.st_mode), bad=reason)
        age = now - st.st_mtime
        if st.st_nlink > 1 and not hinted and age < self.settle:
            return self._wait(key, now, st.st_mtime + self.settle, "has other hard links")
        if age < 0 and not hinted:                      # dated in the future: relay's clock decides
            mark = (st.st_size, st.st_mtime_ns, st.st_ino)
            first = self.seen.get(key)
            if first is None or first[0] != mark:
                self.seen[key] = (mark, now)
                return self._wait(key, now, now + self.settle, "settling (dated in the future)")
            if now - first[1] < self.settle:
                return self._wait(key, now, first[1] + self.settle, "settling (dated in the future)")
        elif not hinted and age < self.settle:
            return self._wait(key, now, st.st_mtime + self.settle, "settling")
        # A closed (or renamed-in) file is taken at once: a writer that still holds it is found
        # by the lease read() takes on the spooled file, which defers it.
        if not hinted and self._busy(sender, name):
            return self._wait(key, now, now + max(self.settle, MIN_RECHECK), "held open for writing")
        self._forget(key)
        return Found(sender, name, st.st_mtime)

    def _wait(self, key, now, at, why):
        since = self.waiting.get(key, (None, None, now))[2]
        self.waiting[key] = (at, why, since)
        return None

    def _forget(self, key):
        self.waiting.pop(key, None)
        self.seen.pop(key, None)

    def _busy(self, sender, name):
        """Whether a writer holds the file; if none does and it is a plain file (as peek()
        reads), its bytes are read under the lease, for peek() to take after the claim."""
        try:
            fd = self.fs.open_read(f"outbox/{sender}/{name}")
        except OSError:
            return False
        try:
            if self.open_writers.writers(fd):
                return True
            st = os.fstat(fd)
            if plain(st) and self.read_ahead.wants((sender, name), st.st_size):
                data = os.read(fd, st.st_size + 1)
                if len(data) == st.st_size:
                    self.read_ahead.put((sender, name), data, (*as_read(st), st.st_mode), st.st_mtime)
            return False
        except OSError:
            return False
        finally:
            os.close(fd)

    def due_waiting(self, now):
        """Waiting files whose time to look again has come."""
        due = [key for key, (at, _, _) in self.waiting.items() if at <= now]
        for sender, name in due:
            found = self.check(sender, name, now)
            if found:
                yield found

    def next_deadline(self):
        return min((at for at, _, _ in self.waiting.values()), default=None)

    def left(self, now, patience):
        """(rel path, why, seconds waited) of files waiting longer than `patience`."""
        return [(f"outbox/{s}/{n}", why, now - since) for (s, n), (_, why, since) in sorted(self.waiting.items())
                if now - since >= patience]

    # -- custody and reading ----------------------------------------------------------------

    def take(self, w):
        """Take custody of a claimed message: its file into the spool. Sets w.path, or
        w.refused / w.error."""
        spool = self.layout.spool_rel(w.sender, w.spool_id or w.id, w.name)
        fs = self.fs
        if (w.earlier_attempt or w.spooled) and fs.exists(spool):    # taken by an earlier attempt
            w.path = spool
            return
        if w.spooled:       # moved aside, or its directory swapped: looked for again later
            w.error = TransientError(f"{spool} is not there (moved away, or spool/{w.sender} replaced); "
                                     "relay looks for it again")
            return
        src = f"outbox/{w.sender}/{w.name}"
        try:
            st = fs.lstat(src)
        except (FileNotFoundError, Unsafe) as e:
            if w.peeked is not None:     # the name (or its outbox) gives nothing, or a link, now
                return self._keep_read(w, spool, "was deleted" if isinstance(e, FileNotFoundError)
                                       else "is no longer in its outbox (moved away, or a link put there)")
            if isinstance(e, Unsafe):
                w.error = TransientError(f"cannot look at outbox/{w.sender}/{w.name}: {e.strerror or e}")
                return
            if fs.exists(spool):        # taken before a power cut that the row did not see
                w.path = spool
                return
            w.refused = (f"outbox/{w.sender}/{w.name} disappeared before relay could read it "
                         "(deleted or moved away by someone else)")
            return
        except OSError as e:
            w.error = TransientError(f"cannot look at outbox/{w.sender}/{w.name}: {e.strerror or e}")
            return
        if w.peeked is not None and as_read(st) != w.peeked[:5] and not self._same_bytes(w, src, st):
            return self._keep_read(w, spool, "was written again")
        if not stat.S_ISREG(st.st_mode):
            w.path = src
            w.refused = not_regular(st)
            return
        try:
            fs.rename(src, spool, make_parents=True)
        except FileNotFoundError:
            if w.peeked is not None:
                return self._keep_read(w, spool, "was deleted")
            w.refused = f"outbox/{w.sender}/{w.name} disappeared before relay could read it"
            return
        except OSError as e:
            w.error = TransientError(f"cannot take outbox/{w.sender}/{w.name} into spool/{w.sender}: "
                                     f"{e.strerror or e}")
            return
        self.syncer.dir_changed(f"outbox/{w.sender}")
        self.syncer.dir_changed(f"spool/{w.sender}")
        w.path = spool
        if w.peeked is not None:
            self._still_as_read(w)

    def _same_bytes(self, w, src, st):
        """Whether the file at `src` (lstat `st`) is the one read and holds the bytes read.
        Its change time moved (no agent can set it back, as it can its mtime, with the same
        size): a chmod or a link leaves the bytes as read, a write may not."""
        if not stat.S_ISREG(st.st_mode) or st.st_dev != w.peeked[0] or st.st_ino != w.peeked[1] \
                or st.st_size != w.peeked[2]:       # a FIFO with its inode number and size 0: never opened
            return False
        try:
            return hashlib.sha256(self.fs.read(src, st.st_size)).hexdigest() == w.sha256
        except OSError:
            return False

    def _keep_read(self, w, spool, what):
        """A file read before custody whose name no longer gives it (deleted, written again or
        replaced since): claimed, its bytes are this message all the same, kept in the spool as
        a private copy; what is at the name now, if anything, is a new message."""
        w.path = spool
        self._private_copy(w, w.data, stat.S_IMODE(w.peeked[5]) & ~0o022,
                           f"outbox/{w.sender}/{w.name} {what} after relay read it: relay delivers "
                           "and archives the bytes it read")

    def _still_as_read(self, w):
        """After custody of a file read before it, as read() would find it: the file spooled is
        the one read (not one swapped in between the look and the rename: that one is read
        next time), no writer holds it (deferred), it holds the bytes read (a write between
        the look and the rename, or through a descriptor opened before it and closed since: its
        mtime may have been set back, and the rename changed its change time; read again),
        and it is relay's alone."""
        try:
            fd = self.fs.open_read(w.path)
        except OSError as e:
            w.error = TransientError(f"cannot open the message: {e.strerror or e}")
            return
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != w.peeked[:4]:
                w.error = TransientError(f"outbox/{w.sender}/{w.name} was replaced while relay took it; "
                                         "relay reads it again")
            elif self.open_writers.writers(fd):
                w.defer = True
            elif hashlib.sha256(os.pread(fd, st.st_size + 1, 0)).hexdigest() != w.sha256:
                # No writer now (a lease is held until the close): the bytes spooled are what
                # it holds; the bytes read were never in relay's custody.
                w.error = TransientError(f"outbox/{w.sender}/{w.name} was written again while relay took it; "
                                         "relay reads it again")
            elif st.st_nlink > 1:           # linked elsewhere since it was read
                self._private_copy(w, w.data, stat.S_IMODE(st.st_mode) & ~0o022,
                                   "has other hard links: relay delivers and archives a private copy")
            elif st.st_mode & 0o022:        # made writable since: the archived original is not
                os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~0o022)
        except OSError as e:
            w.error = TransientError(f"reading the message: {e.strerror or e}")
        finally:
            os.close(fd)

    def peek(self, w, max_body_bytes):
        """Read a claimed message where its sender left it, before custody, so that its
        envelopes are written and synced together with the claim (pipeline.py). Only a plain
        case: a regular file with one link, not writable by group or other, within the limit;
        read for it by a scan's check already (read_ahead) or now. Returns whether it was read;
        anything else is left to take() and read(), which say what is wrong. take() checks
        that the file it moves is the one read, with the bytes read, and that no writer holds
        it (else it is deferred, its envelopes never linked)."""
        limit = max_body_bytes + HEADER_ALLOWANCE
        ahead = self.read_ahead.take((w.sender, w.name))
        if ahead is not None and ahead[3] == w.id and len(ahead[0]) <= limit:
            data, peeked, sent_at, _ = ahead
        else:
            src = f"outbox/{w.sender}/{w.name}"
            try:            # never opened unless a regular file: opening a device may act on it
                if not stat.S_ISREG(self.fs.lstat(src).st_mode):
                    return False
                fd = self.fs.open_read(src)
            except OSError:
                return False
            try:
                st = os.fstat(fd)
                # A writer that holds it is found by the lease custody takes on the spooled file.
                if not plain(st) or st.st_size > limit:
                    return False
                data = os.read(fd, st.st_size + 1)
                if len(data) != st.st_size:     # written to since the fstat (take() checks again)
                    return False
            except OSError:
                return False
            finally:
                os.close(fd)
            peeked, sent_at = (*as_read(st), st.st_mode), st.st_mtime
        w.data, w.size, w.sent_at, w.peeked = data, len(data), sent_at, peeked
        w.sha256 = hashlib.sha256(data).hexdigest()
        return True

    def read(self, w, max_body_bytes):
        """Read the spooled file into w.data (bounded), or set w.refused / w.error / w.defer."""
        try:
            fd = self.fs.open_read(w.path)
        except OSError as e:
            try:
                st = self.fs.lstat(w.path)
                if not stat.S_ISREG(st.st_mode):    # a link or a FIFO put in its place
                    w.refused = not_regular(st)
                    return
            except OSError:
                pass
            w.error = TransientError(f"cannot open the message: {e.strerror or e}")
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                w.refused = not_regular(st)
                return
            if self.open_writers.writers(fd):
                w.defer = True
                return
            limit = max_body_bytes + HEADER_ALLOWANCE
            if st.st_size > limit:
                return too_large(w, max_body_bytes, st.st_size, f"the file is {st.st_size} bytes, over "
                                 f"max_body_bytes ({max_body_bytes}) plus room for headers", fd)
            chunks, total = [], 0
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
                total += len(chunk)
                if total > limit:
                    return too_large(w, max_body_bytes, total, f"the file grew past {limit} bytes while relay "
                                     "read it, over max_body_bytes plus room for headers", fd)
            if st.st_nlink > 1:
                data = b"".join(chunks)
                self._private_copy(w, data, stat.S_IMODE(st.st_mode) & ~0o022,
                                   "has other hard links: relay delivers and archives a private copy")
                chunks = [data]
            elif st.st_mode & 0o022:    # the archived original is not writable by group/other
                os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~0o022)
            w.data = b"".join(chunks)
            w.sent_at = st.st_mtime
        except OSError as e:
            w.error = TransientError(f"reading the message: {e.strerror or e}")
            return
        finally:
            os.close(fd)
        w.size = len(w.data)
        w.sha256 = hashlib.sha256(w.data).hexdigest()

    def _private_copy(self, w, data, mode, why):
        """Put at w.path (in the spool) a copy of the bytes `data` that relay alone holds, to
        deliver and archive: the file shares its inode with another name (maybe outside the
        state directory), or its name holds another file now. The file, its other names and
        the inode they share are left as they are."""
        tmp = f"spool/{w.sender}/.copy-{w.id}"
        fd = self.fs.create(tmp, mode, make_parents=True)
        try:
            write_all(fd, data)
            self.syncer.sync_now(fd, f"the private copy of {w.id}")
        finally:
            os.close(fd)
        self.fs.rename(tmp, w.path)
        self.syncer.dir_changed(f"spool/{w.sender}")
        log.info("%s from %s: %s", w.id, w.sender, why)


def plain(st):
    """A file read before custody: regular, one link, not writable by group or other."""
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and not st.st_mode & 0o022


def as_read(st):
    """What says a file is still the one read: (dev, inode, size, mtime ns, change time ns)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def too_large(w, limit, observed, text, fd):
    """A file too large to read: shed (body_size) for its recipients, unread (`*`); what its
    first bytes say (its headers: core/oversize.py) is its record's."""
    w.shed = flow.body_size(limit, observed, text=text)
    w.refused = flow.summary(w.shed)
    try:
        w.message = oversize.said(os.pread(fd, oversize.MAX_HEADER_BYTES + oversize.BODY_KEPT, 0), w.name, limit,
                                  whole=False)
    except OSError:
        pass


def not_regular(st):
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        what = "a symbolic link"
    elif stat.S_ISFIFO(mode):
        what = "a FIFO (named pipe)"
    elif stat.S_ISSOCK(mode):
        what = "a socket"
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        what = "a device file"
    else:
        what = "not a regular file"
    return f"{what}: relay only relays regular files and never opens these; write the message as a plain file"


__all__ = ["Found", "OpenWriters", "Outbox", "Unsafe", "ignore_sigio", "not_regular"]
