"""The confined file system: every operation relay makes inside the state directory.

Paths are relative to the state directory ("inbox/Bob/new/<id>.json") and are walked from a
descriptor of the state directory one component at a time with `O_NOFOLLOW | O_DIRECTORY`, so
a symbolic link at any level (an agent directory, `inbox/<x>`, `new/`, `archive`, a day of the
archive) is refused, never followed, and nothing outside the state directory is ever read,
written, renamed or deleted. The last component is always acted on with `dir_fd=` and
`follow_symlinks=False` (or `O_NOFOLLOW`).

Directory descriptors are cached. `forget()` closes them; `recheck()` (the relay calls it at
the start of every step) keeps them but has each looked up again, by name in its parent, the
first time a path through it is used after: one that is no longer the directory its name gives
(swapped for a link, another directory or nothing between two steps) is closed with everything
cached under it, and the path is walked again, so a swap is seen as it is now. (A directory
whose descriptor is held keeps its inode number: a name giving that number is that directory.)

Names are str as the OS gives them (undecodable bytes as surrogate escapes); `bad_name` tells
whether one is fit for the ledger, the logs and an envelope, and `shown` escapes any name for a
log line or a report.
"""
import errno
import os
import stat
import sys

from relay.terminal import escaped


def full_fsync(fd):
    """fsync that reaches the medium: F_FULLFSYNC where the platform has it (macOS)."""
    import fcntl
    fcntl.fcntl(fd, fcntl.F_FULLFSYNC)


default_fsync = full_fsync if sys.platform == "darwin" else os.fsync
fdatasync = getattr(os, "fdatasync", os.fsync)

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
DIR_MODE = 0o755
MAX_CACHED = 256         # directory descriptors kept open between operations


class Unsafe(OSError):
    """A path component is a symbolic link or not a directory: relay does not go there."""


def bad_name(name):
    """Why a file name cannot be taken as a message name (not UTF-8, control characters: C0,
    DEL and C1), or None."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "its name is not valid UTF-8"
    if any(c < " " or "\x7f" <= c <= "\x9f" for c in name):
        return "its name holds control characters"
    return None


def shown(name):
    """A name fit for one log line or report: undecodable bytes, control and bidi characters
    (terminal.UNSAFE) escaped, and a backslash doubled, so that the escape is unambiguous."""
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    return escaped(name.replace("\\", "\\\\"), keep="")


def split(rel):
    """The components of a relative path, each checked: no empty, '.', '..' or NUL."""
    if isinstance(rel, str):
        parts = rel.split("/")
        if "\0" not in rel and "" not in parts and "." not in parts and ".." not in parts:
            return parts            # each part checked at once (split by "/", none holds one)
    else:
        parts = list(rel)
    for p in parts:
        if not p or p in (".", "..") or "\0" in p or "/" in p:
            raise Unsafe(errno.EINVAL, f"{shown('/'.join(parts))!r} is not a path inside the state directory")
    return parts


def _refusal(e, where):
    if e.errno in (errno.ELOOP, errno.ENOTDIR):
        return Unsafe(e.errno, f"{shown(where)} is a symbolic link or not a directory; relay never follows links "
                               "under its state directory")
    return e


class StateDir:
    """A descriptor of the state directory and confined operations relative to it."""

    def __init__(self, path, on_dir_created=None):
        self.path = str(path)
        self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._dirs = {"": self.fd}
        self._ids = {}              # relative path -> (st_dev, st_ino) of its cached descriptor
        self._looked_up = {""}          # cached paths looked up since the last recheck()
        # Called with the relative path of a directory whose entries changed because relay
        # created a sub-directory in it (the syncer makes that change durable).
        self.on_dir_created = on_dir_created

    def close(self):
        """Close every descriptor. A closed StateDir walks from nothing (dir() refuses, EBADF):
        never from the closed descriptor's number, which the next open may reuse."""
        fd, self.fd = self.fd, None
        self.forget()
        if fd is not None:
            os.close(fd)

    def __del__(self):
        # Descriptors are plain ints: one dropped without close() stays open for the life of
        # the process (a program making an Agent per look ran out of them).
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown, or closed already
            pass

    def forget(self):
        """Close cached directory descriptors: the next operation walks from the top again."""
        for key, fd in list(self._dirs.items()):
            if key:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._dirs = {} if self.fd is None else {"": self.fd}
        self._ids = {}
        self._looked_up = set(self._dirs)

    def recheck(self, top=None):
        """Have every cached directory (or `top` and those under it) looked up again by name
        before it is next used."""
        if top is None:
            self._looked_up = set(self._dirs) & {""}
        else:
            under = top + "/"
            self._looked_up = {k for k in self._looked_up if k != top and not k.startswith(under)}

    def _drop(self, rel):
        """Close the cached descriptor of `rel` and of everything cached under it."""
        under = rel + "/"
        for key in [k for k in self._dirs if k == rel or k.startswith(under)]:
            try:
                os.close(self._dirs.pop(key))
            except OSError:
                pass
            self._ids.pop(key, None)
            self._looked_up.discard(key)

    def _trim(self):
        """Keep the cache bounded; called before an operation, never in the middle of one."""
        if len(self._dirs) > MAX_CACHED:
            self.forget()

    def open_dir(self, rel):
        """A descriptor of the directory at `rel` that the caller owns (and closes)."""
        self._trim()
        return os.dup(self.dir(rel))

    def abspath(self, rel):
        return os.path.join(self.path, rel) if rel else self.path

    # -- directories ------------------------------------------------------------------------

    def dir(self, rel, create=False):
        """A descriptor of the directory at `rel` (cached; do not close it). With `create`,
        missing components are made (each creation noted for the syncer)."""
        if rel in self._looked_up:
            return self._dirs[rel]
        if self.fd is None:
            raise OSError(errno.EBADF, "the state directory was closed", self.path)
        parts = split(rel)
        i = len(parts)
        while i > 0 and "/".join(parts[:i]) not in self._looked_up:
            i -= 1
        fd = self._dirs["/".join(parts[:i])]
        for j in range(i, len(parts)):
            name, here = parts[j], "/".join(parts[:j + 1])
            kept = self._dirs.get(here)
            if kept is not None:
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    same = (st.st_dev, st.st_ino) == self._ids[here] and stat.S_ISDIR(st.st_mode)
                except OSError:
                    same = False
                if same:
                    self._looked_up.add(here)
                    fd = kept
                    continue
                self._drop(here)
            try:
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, DIR_MODE, dir_fd=fd)
                    if self.on_dir_created is not None:
                        self.on_dir_created("/".join(parts[:j]))
                except FileExistsError:
                    pass
                try:
                    child = os.open(name, DIR_FLAGS, dir_fd=fd)
                except OSError as e:
                    raise _refusal(e, here) from None
            except OSError as e:
                raise _refusal(e, here) from None
            try:
                st = os.fstat(child)
            except OSError:
                os.close(child)
                raise
            self._dirs[here] = child
            self._ids[here] = (st.st_dev, st.st_ino)
            self._looked_up.add(here)
            fd = child
        return fd

    def _at(self, rel, create=False, first=True):
        """(directory fd, last component) of `rel`. For the `first` path of an operation the
        cache is kept bounded first (as _trim), never between the two paths of a rename."""
        if first and len(self._dirs) > MAX_CACHED:
            self.forget()
        d, _, name = rel.rpartition("/")
        if not name or name in (".", "..") or "\0" in name:
            split(rel)              # raises with the reason
        return (self._dirs[d] if d in self._looked_up else self.dir(d, create=create)), name

    def makedirs(self, rel):
        self._trim()
        self.dir(rel, create=True)

    def scandir(self, rel):
        """The entries of the directory at `rel` (DirEntry objects; their .path is the name)."""
        self._trim()
        fd = self.dir(rel)
        with os.scandir(fd) as it:
            return list(it)

    def names(self, rel):
        return [e.name for e in self.scandir(rel)]

    def count(self, rel, keep=lambda entry: True):
        """How many entries of the directory at `rel` pass `keep` (0 when it is not one)."""
        try:
            return sum(1 for e in self.scandir(rel) if keep(e))
        except OSError:
            return 0

    def walk_files(self, rel):
        """Relative paths of every file under `rel` (not following links, never leaving it)."""
        try:
            entries = self.scandir(rel)
        except OSError:
            return
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                yield from self.walk_files(f"{rel}/{e.name}")
            else:
                yield f"{rel}/{e.name}"

    # -- files ------------------------------------------------------------------------------

    def lstat(self, rel):
        fd, name = self._at(rel)
        return os.stat(name, dir_fd=fd, follow_symlinks=False)

    def exists(self, rel):
        try:
            self.lstat(rel)
            return True
        except OSError:
            return False

    def open_read(self, rel):
        """A read-only descriptor of the file at `rel`, never through a link, never blocking
        on a FIFO. The caller closes it."""
        fd, name = self._at(rel)
        return os.open(name, READ_FLAGS, dir_fd=fd)

    def read(self, rel, limit=None):
        fd = self.open_read(rel)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise Unsafe(errno.EINVAL, f"{shown(rel)} is not a regular file")
            chunks, total = [], 0
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
                total += len(chunk)
                if limit is not None and total > limit:
                    break
            return b"".join(chunks)
        finally:
            os.close(fd)

    def create(self, rel, mode=0o644, make_parents=False):
        """A new file at `rel` opened for writing. A file already there (a stale temporary, or
        something planted) is unlinked first, never truncated: it may be a hard link to a file
        outside. The caller writes, syncs (see sync.Syncer) and closes."""
        dfd, name = self._at(rel, create=make_parents)
        try:
            return os.open(name, CREATE_FLAGS, mode, dir_fd=dfd)
        except FileExistsError:
            os.unlink(name, dir_fd=dfd)
            return os.open(name, CREATE_FLAGS, mode, dir_fd=dfd)

    def put(self, rel, data, mode=0o644, fsync=None):
        """Write a whole new file at `rel` durably and atomically: a hidden temporary beside it,
        written in full, synced, renamed into place, the directory synced. `fsync`: the sync
        to use (default: the platform's, F_FULLFSYNC on macOS); False syncs nothing."""
        if fsync is None:
            fsync = default_fsync
        parts = split(rel)
        tmp = "/".join(parts[:-1] + [f".{parts[-1]}.tmp"])
        fd = self.create(tmp, mode, make_parents=True)
        try:
            write_all(fd, data)
            if fsync:
                fsync(fd)
        finally:
            os.close(fd)
        self.rename(tmp, rel)
        if fsync:
            fsync(self.dir("/".join(parts[:-1])))

    def rename(self, src, dst, make_parents=False):
        sfd, sname = self._at(src)
        dfd, dname = self._at(dst, create=make_parents, first=False)
        os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)

    def link(self, src, dst):
        sfd, sname = self._at(src)
        dfd, dname = self._at(dst, first=False)
        os.link(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd, follow_symlinks=False)

    def unlink(self, rel):
        fd, name = self._at(rel)
        os.unlink(name, dir_fd=fd)

    def unlink_quietly(self, rel):
        try:
            self.unlink(rel)
            return True
        except OSError:
            return False

    def rmdir(self, rel):
        fd, name = self._at(rel)
        os.rmdir(name, dir_fd=fd)
        self._drop(rel)


def replace_file(path, data, fsync=None):
    """Put `data` at `path`, a file a person named (anywhere, not under the state directory), as
    a new file: a hidden temporary beside it, written in full, synced, renamed over the name, the
    directory synced. A symbolic link at the name is refused (Unsafe), never written through; a
    hard link there is replaced, the file its other names share left as it was. An existing
    file's permissions are kept; a new one gets 0o666 less the umask. A character device or a
    FIFO at the name (/dev/full, a pipe a reader holds) is written into as it is; a FIFO no one
    reads is refused at once, never waited on."""
    if fsync is None:
        fsync = default_fsync
    parent, name = os.path.split(os.path.abspath(path))
    dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    tmp = None
    try:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise Unsafe(errno.ELOOP, f"{shown(path)} is a symbolic link; relay never writes through one (agents "
                                      "can plant them): remove it, or name another file")
        if st is not None and (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
            return _write_into(dfd, name, path, data)
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise Unsafe(errno.EINVAL, f"{shown(path)} is not a regular file; name a file to write")
        tmp = f".{name}.{os.urandom(6).hex()}.tmp"
        fd = os.open(tmp, CREATE_FLAGS, 0o666, dir_fd=dfd)
        try:
            if st is not None:
                os.fchmod(fd, stat.S_IMODE(st.st_mode))
            write_all(fd, data)
            fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        tmp = None
        fsync(dfd)
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
        os.close(dfd)


def _write_into(dfd, name, path, data):
    try:
        fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise Unsafe(errno.ENXIO, f"{shown(path)} is a FIFO no one reads; name a file to write") from None
        raise
    try:
        os.set_blocking(fd, True)
        write_all(fd, data)
    finally:
        os.close(fd)


def write_all(fd, data):
    """Write every byte of `data` to `fd` (a short write is continued)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
