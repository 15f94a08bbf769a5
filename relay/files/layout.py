"""The state directory's layout (contract §1): where each thing lives, and which entries relay
serves."""
import errno
import logging
import os
import re
import time
from pathlib import Path

from relay import names
from relay.config import AGENT_NAME, AGENT_NAME_RULE, SYSTEM, linked, state_parts
from relay.files.fs import DIR_FLAGS, DIR_MODE, StateDir, Unsafe, bad_name, shown
from relay.ids import ALPHABET

log = logging.getLogger(__name__)

IGNORED_SUFFIXES = (".tmp", ".part", ".pending", ".swp", "~")


def is_in_progress_name(name):
    """Names an agent uses while it still writes: ignored by relay (contract §1)."""
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


RACY = 0.1                  # seconds: a directory changed this recently may change again unseen ...
COARSE_RACY = 2.5           # ... or this, where the file system keeps whole seconds (FAT: even ones)


class Layout:
    """Where everything lives under the state directory. Paths for people (`Path` objects) and
    relative paths for the confined file system (`self.fs`, opened on first use)."""

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
        self.command_lock = self.state / "commands.lock"    # held while an operator command runs under its id
        self._fs = None
        self._names = None          # (the key of outbox/ and inbox/ as listed, the names there)
        self.now = time.time        # the wall clock file times are compared with (a seam)

    @property
    def fs(self):
        """The confined file system of the state directory (which must exist: `create()`)."""
        if self._fs is None:
            self._fs = StateDir(self.state)
        return self._fs

    def close(self):
        if self._fs is not None:
            self._fs.close()
            self._fs = None

    def create(self):
        """Make the state directory itself. Inside the project root it is made (and looked at)
        from the root down one directory at a time, never through a symbolic link (config.load
        refused one already; this holds against one planted since). Elsewhere the operator chose
        the place, and it is made as named."""
        parts = state_parts(self.root, self.state)
        if not parts:
            os.makedirs(self.state, exist_ok=True)
            return self
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for i, part in enumerate(parts):
                try:
                    os.mkdir(part, DIR_MODE, dir_fd=fd)
                except FileExistsError:
                    pass
                try:
                    child = os.open(part, DIR_FLAGS, dir_fd=fd)
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        link = self.root.joinpath(*parts[:i + 1])
                        if link.is_symlink():
                            raise linked(self.state, link, "as configured") from None
                    raise
                os.close(fd)
                fd = child
        finally:
            os.close(fd)
        return self

    def init(self, agents=()):
        """Create the layout and each agent's outbox and inbox. Idempotent. A place that is a
        symbolic link (or not a directory) is left as it is and returned as a problem: the
        steps that use it wait until it is a directory again."""
        self.create()
        problems = [f"{names.why_reserved(a)}: no outbox or inbox is made for it" for a in agents if names.reserved(a)]
        agents = [a for a in agents if not names.reserved(a)]
        there, kept = self.listed(), []
        for a in agents:      # no agent in another case: a case-folding file system would share its directories
            problem = names.namesake_problem(a, there | set(kept))
            if problem is None:
                kept.append(a)
            else:
                problems.append(f"{problem}: no outbox or inbox is made for it")
        agents = kept
        for rel in ["outbox", "inbox", "archive", "failed", "spool"] + [f"outbox/{a}" for a in agents] + [
                f"inbox/{a}/{sub}" for a in (SYSTEM, *agents) for sub in ("tmp", "new", "cur")]:
            try:
                self.fs.makedirs(rel)
            except Unsafe as e:
                problems.append(e.strerror or str(e))
        return list(dict.fromkeys(problems))        # an inbox's tmp, new and cur: its one problem, once

    def make_inbox(self, agent):
        for sub in ("tmp", "new", "cur"):
            self.fs.makedirs(f"inbox/{agent}/{sub}")
        return self.inbox / agent

    def outbox_dirs(self):
        """(name, rel, problem) for each entry of outbox/: problem is None for a served agent."""
        try:
            entries = self.fs.scandir("outbox")
        except OSError:
            return []
        out = []
        for entry in sorted(entries, key=lambda e: e.name):
            problem = outbox_problem(entry)
            if problem == "not a directory":
                continue
            out.append((entry.name, f"outbox/{entry.name}", problem))
        return self._namesakes(out)

    def _namesakes(self, out):
        """outbox_dirs() with each lookalike outbox refused: of directories whose names are the same
        once case-folded (`Ann`, `ann`), those relay knows (an inbox directory of that spelling)
        keep working; another beside one of them is not read, its files left where they are. When
        none or all of them have an inbox, relay cannot tell which is the agent: all are read."""
        valid = [name for name, _, problem in out if problem is None]
        if len({names.fold(n) for n in valid}) == len(valid):      # the common case: no two alike
            return out
        groups = {}
        for name in valid:
            groups.setdefault(names.fold(name), []).append(name)
        groups = [g for g in groups.values() if len(g) > 1]
        try:
            inboxes = {e.name for e in self.fs.scandir("inbox") if e.is_dir(follow_symlinks=False)}
        except OSError:
            return out
        refused = {}
        for group in groups:
            known = [n for n in group if n in inboxes]
            if known and len(known) < len(group):
                refused.update((n, known[0]) for n in group if n not in inboxes)
        return [(name, rel, problem if name not in refused else
                 f"{names.namesake_problem(name, {refused[name]})}: relay does not read it (its files stay where "
                 f"they are; move them into outbox/{refused[name]})") for name, rel, problem in out]

    def listed(self):
        """The names of the directories in outbox/ and inbox/ that could be agents' (valid names, no
        links), whatever relay makes of them: what a new agent's name is compared with."""
        found = set()
        for where in ("outbox", "inbox"):
            try:
                found |= {e.name for e in self.fs.scandir(where) if valid_agent(e.name)
                          and e.is_dir(follow_symlinks=False)}
            except (OSError, Unsafe):
                pass
        return found

    def agent_names(self, configured=()):
        """Known agents: an outbox or inbox directory, or listed in config (contract §2).
        A symbolic link is no agent directory. The names the directories give are kept while
        neither directory changed (the same inode, modification and change times; a listing
        taken within racy() seconds of a change is not kept, as a change in the same tick of the
        file system's clock would leave the times as they were)."""
        key = self._names_key()
        if key is not None and self._names is not None and self._names[0] == key:
            found = self._names[1]
        else:
            found = set()
            for name, _, problem in self.outbox_dirs():
                if problem is None:
                    found.add(name)
            try:
                for entry in self.fs.scandir("inbox"):
                    if valid_agent(entry.name) and entry.is_dir(follow_symlinks=False):
                        found.add(entry.name)
            except OSError:
                pass
            found = frozenset(found)
            settled = key is not None and self.now() - max(key[2::4] + key[3::4]) / 1e9 > racy(key)
            self._names = (key, found) if settled else None
        return {n for n in set(configured) | found if not names.reserved(n)}

    def _names_key(self):
        """(device, inode, mtime, ctime) of outbox/ and of inbox/, or None (one cannot be looked at)."""
        try:
            out, into = self.fs.lstat("outbox"), self.fs.lstat("inbox")
        except (OSError, Unsafe):
            return None
        return (out.st_dev, out.st_ino, out.st_mtime_ns, out.st_ctime_ns,
                into.st_dev, into.st_ino, into.st_mtime_ns, into.st_ctime_ns)

    def archive_rel(self, day, sender, message_id, name):
        return f"archive/{day}/{sender}/{message_id}--{fit(name)}"

    def failed_rel(self, sender, message_id, name):
        return f"failed/{sender}/{message_id}--{fit(name)}"

    def spool_rel(self, sender, message_id, name):
        """Where a claimed message waits while relay delivers it. The name says whose and
        which message it is, so a file found there with no ledger record can be registered
        again after a power loss."""
        return f"spool/{sender}/{message_id}--{fit(name)}"

    def spool_of(self, row):
        """The spool path of a ledger row: named by the id relay gave the file when it found it,
        which a sender-chosen id (`spool_id` keeps the first) does not change."""
        return self.spool_rel(row["sender"], row["spool_id"] or row["id"], row["name"])

    def spooled(self):
        """(sender, id, name, rel) of every file in the spool whose name relay made. Anything
        else there (a planted link, an odd name) is skipped and logged, never fatal."""
        try:
            senders = self.fs.scandir("spool")
        except OSError:
            return
        for d in senders:
            if not valid_agent(d.name) or not d.is_dir(follow_symlinks=False):
                log.warning("spool/%s is not a directory relay made; it is left alone", shown(d.name))
                continue
            try:
                entries = self.fs.scandir(f"spool/{d.name}")
            except OSError as e:
                log.warning("cannot list spool/%s: %s", d.name, e.strerror or e)
                continue
            for e in entries:
                mid, sep, name = e.name.partition("--")
                if sep and valid_id(mid) and name and bad_name(name) is None and not e.is_dir(follow_symlinks=False):
                    yield d.name, mid, name, f"spool/{d.name}/{e.name}"
                else:
                    log.warning("spool/%s/%s is not a file relay made; it is left alone", d.name, shown(e.name))


def outbox_problem(entry):
    """Why relay will not read this entry of outbox/ as an agent's outbox, or None."""
    if not valid_agent(entry.name):
        return f"invalid agent name (must match {AGENT_NAME_RULE})"
    if names.reserved(entry.name):
        return f"{names.why_reserved(entry.name)}; no agent sends as it"
    if entry.is_symlink():
        return "a symbolic link; relay never follows links under its state directory"
    if not entry.is_dir(follow_symlinks=False):
        return "not a directory"
    return None


ID = re.compile(f"[{ALPHABET}]{{26}}")


def valid_id(mid):
    return ID.fullmatch(mid) is not None


MAX_NAME = 255 - 26 - 2 - len(".error.json")


def fit(name):
    """A file name short enough to stand after `<id>--` (and before `.error.json`)."""
    data = name.encode("utf-8", "surrogateescape")
    if len(data) <= MAX_NAME:
        return name
    return data[:MAX_NAME].decode("utf-8", "ignore")


def racy(key):
    """How long after its directories' last change a listing is not kept: longer where a
    directory's times are whole seconds (both of them: ext3's small inodes, HFS+, FAT, many
    network file systems), where two changes a second apart may carry the same times."""
    coarse = any(not (mtime % 1_000_000_000 or ctime % 1_000_000_000) for mtime, ctime in (key[2:4], key[6:8]))
    return COARSE_RACY if coarse else RACY
