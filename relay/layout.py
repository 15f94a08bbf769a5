"""The state directory's layout (SPEC section 1) and the small file-system helpers it needs."""
import errno
import os
from pathlib import Path

from .config import AGENT_NAME, SYSTEM

IGNORED_SUFFIXES = (".tmp", ".part", ".pending", ".swp", "~")


def is_in_progress_name(name):
    """Names an agent uses while it still writes: ignored by relay (SPEC section 1)."""
    return name.startswith(".") or name.endswith(IGNORED_SUFFIXES)


def valid_agent(name):
    return bool(AGENT_NAME.match(name))


def is_inside(path, root):
    """True when `path` (resolved) lies inside `root` (resolved)."""
    try:
        Path(os.path.realpath(path)).relative_to(os.path.realpath(root))
        return True
    except ValueError:
        return False


class Layout:
    """Where everything lives under the state directory."""

    def __init__(self, root, state_dir):
        self.root = Path(root)
        self.state = Path(state_dir)
        self.outbox = self.state / "outbox"
        self.inbox = self.state / "inbox"
        self.archive = self.state / "archive"
        self.failed = self.state / "failed"
        self.spool = self.state / "spool"
        self.ledger = self.state / "ledger.sqlite"
        self.lock = self.state / "relay.lock"

    def init(self, agents=()):
        """Create the layout and each agent's outbox and inbox. Idempotent."""
        for d in (self.state, self.outbox, self.inbox, self.archive, self.failed, self.spool):
            d.mkdir(parents=True, exist_ok=True)
        self.make_inbox(SYSTEM)
        for name in agents:
            (self.outbox / name).mkdir(exist_ok=True)
            self.make_inbox(name)

    def make_inbox(self, agent):
        base = self.inbox / agent
        for sub in ("tmp", "new", "cur"):
            (base / sub).mkdir(parents=True, exist_ok=True)
        return base

    def outbox_dirs(self):
        """(name, path, problem) for each entry of outbox/: problem is None for a served agent."""
        try:
            entries = list(os.scandir(self.outbox))
        except FileNotFoundError:
            return []
        out = []
        for entry in sorted(entries, key=lambda e: e.name):
            problem = self.outbox_problem(entry.name, entry.path)
            if problem == "not a directory":
                continue
            out.append((entry.name, Path(entry.path), problem))
        return out

    def outbox_problem(self, name, path):
        """Why relay will not read this outbox directory, or None."""
        if not valid_agent(name):
            return "invalid agent name (must match [A-Za-z0-9][A-Za-z0-9._-]{0,63})"
        if os.path.islink(path):
            if not is_inside(path, self.root):
                return f"symlink to {os.path.realpath(path)}, outside the project root"
            if not os.path.isdir(path):
                return "not a directory"
            return None
        if not os.path.isdir(path):
            return "not a directory"
        return None

    def agent_names(self, configured=()):
        """Known agents: an outbox or inbox directory, or listed in config (SPEC section 2)."""
        names = set(configured)
        for name, _, problem in self.outbox_dirs():
            if problem is None:
                names.add(name)
        try:
            for entry in os.scandir(self.inbox):
                if entry.is_dir() and valid_agent(entry.name):
                    names.add(entry.name)
        except FileNotFoundError:
            pass
        names.discard(SYSTEM)
        return names

    def archive_rel(self, day, sender, message_id, name):
        return f"archive/{day}/{sender}/{message_id}--{fit(name)}"

    def failed_rel(self, sender, message_id, name):
        return f"failed/{sender}/{message_id}--{fit(name)}"

    def spool_path(self, sender, message_id, name):
        """Where a claimed message waits while relay delivers it. The name says whose and
        which message it is, so a file found there with no ledger record can be registered
        again after a power loss."""
        return f"{self.spool}/{sender}/{message_id}--{fit(name)}"

    def spooled(self):
        """(sender, id, name, path) of every file in the spool."""
        try:
            senders = list(os.scandir(self.spool))
        except FileNotFoundError:
            return
        for d in senders:
            if not d.is_dir(follow_symlinks=False):
                continue
            for e in os.scandir(d.path):
                mid, sep, name = e.name.partition("--")
                if sep and len(mid) == 26:
                    yield d.name, mid, name, e.path


MAX_NAME = 255 - 26 - 2 - len(".error.json")


def fit(name):
    """A file name short enough to stand after `<id>--` (and before `.error.json`)."""
    data = name.encode("utf-8", "surrogateescape")
    if len(data) <= MAX_NAME:
        return name
    return data[:MAX_NAME].decode("utf-8", "ignore")



def move(src, dst):
    """Rename `src` to `dst`; copy + fsync + unlink only across file systems."""
    try:
        os.rename(src, dst)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        with open(src, "rb") as fin, open(dst, "xb") as fout:
            while chunk := fin.read(1 << 20):
                fout.write(chunk)
            fout.flush()
            os.fsync(fout.fileno())
        os.unlink(src)


def write_file(path, data, mode=0o644, sync=True):
    """Write `data` to a new file at `path` (truncating a stale one), fsync when asked."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
