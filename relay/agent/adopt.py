"""`relay adopt`: the agents' instructions for talking through relay, kept in a marked block of a
file they read (AGENTS.md, CLAUDE.md). The text is instructions.py's, which also gives
contrib/AGENT_SNIPPET.md, so the two cannot drift; `python -m relay.agent.adopt >
contrib/AGENT_SNIPPET.md` writes the snippet again after the template changes.

One block per file, between `<!-- relay:begin agents=NAME,... -->` and `<!-- relay:end -->`
lines, for every agent adopted into that file: a second run updates it in place, adding its agent;
text outside it is never changed. Blocks an earlier version wrote, one per agent (`<!--
relay:begin agent=NAME -->`), are taken into it. A file whose relay markers do not pair up is
refused, never rewritten.

The file lies outside the state directory, in the project, where agents write too: its path is
relative to the project root (no '..'; an absolute one only inside the root), and its directory is
reached from the root one component at a time without following a link (fs.StateDir, opened on
the root), then held by its descriptor, through which everything after goes;
the file is read with O_NOFOLLOW (a symbolic link is refused, never written through) and must
be a regular file; the new text goes to a temporary file beside it, synced, renamed over the
old one only if that is still the file that was read, and the directory is synced. Two adopt
runs take turns (flock on the directory); a hand edit made while one runs, up to the instant
of its rename, is noticed and not overwritten.
"""
import errno
import fcntl
import os
import re
import secrets
import stat
import sys
from pathlib import Path

from relay import names as reserved_names
from relay.agent.api import check_known, declare
from relay.agent.project import archived, check_new
from relay.core import registry
from relay.agent.instructions import render, snippet
from relay.errors import RelayError
from relay.files.fs import StateDir, Unsafe, write_all
from relay.files.layout import is_inside

DEFAULT_FILE = "AGENTS.md"
MAX_FILE_BYTES = 4 * 1024 * 1024    # an instructions file larger than this is not one

NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
BEGIN, END = "<!-- relay:begin agents={} -->", "<!-- relay:end -->"
MARKER = re.compile(r"<!--\s*relay:")                                   # any line that claims to be one
EXACT = re.compile(rf"<!-- relay:(?:begin agents=(?P<agents>{NAME}(?:,{NAME})*)|(?P<end>end)) -->\Z")
# A block of a version before the shared one: one per agent, taken into the shared block.
EXACT_OLD = re.compile(rf"<!-- relay:(begin|end) agent=({NAME}) -->\Z")


def block(adopted, known=(), **how):
    """The marked block for a file the agents `adopted` read, ending in a newline (render()'s
    text; `how`: its relay, python and root)."""
    names = sorted(adopted)
    return (BEGIN.format(",".join(names)) + "\n<!-- written by `relay adopt`: run it again to update; "
            "edit outside the markers -->\n" + render(names, known, **how) + END + "\n")


# -- placing the block in a file ----------------------------------------------------------------

def blocks(text, where):
    """[(agents, start, end)]: the character offsets of each relay block (end marker's line
    included) and the agents it is for, in order. A marker that is not exactly one of ours, a
    begin with no end, an end with no begin, blocks inside each other and two blocks for one
    agent are refused: RelayError naming the line."""
    found, open_, offset, seen = [], None, 0, set()
    for number, line in enumerate(text.split("\n"), 1):
        start, offset = offset, offset + len(line) + 1
        if number == 1 and line.startswith("\ufeff"):     # a byte order mark stays where it is
            start, line = 1, line[1:]
        bare = line.strip()
        if not MARKER.match(bare):
            continue
        new, old = EXACT.match(bare), EXACT_OLD.match(bare)
        if not (new or old):
            raise refused(where, number, f"{bare[:80]!r} is not a relay marker adopt can read "
                          f"(expected {BEGIN.format('NAME,...')!r} or {END!r})")
        if new and new["end"] or old and old[1] == "end":
            agent = old[2] if old else None
            if open_ is None or (open_[0] != (agent,) if agent else open_[3]):
                what = f"an end marker for {agent} with no begin marker for {agent}" if agent else \
                    "an end marker with no begin marker"
                raise refused(where, number, f"{what} before it")
            found.append((open_[0], open_[1], min(offset, len(text))))
            open_ = None
            continue
        agents = tuple(new["agents"].split(",")) if new else (old[2],)
        if open_ is not None:
            raise refused(where, number, f"a begin marker for {', '.join(agents)} inside the block of "
                          f"{', '.join(open_[0])}, whose end marker is missing")
        again = sorted(seen & set(agents))
        if again:
            raise refused(where, number, f"a second block for agent {again[0]}")
        seen |= set(agents)
        open_ = (agents, start, number, bool(old))
    if open_ is not None:
        raise refused(where, open_[2], f"the begin marker for {', '.join(open_[0])} has no end marker")
    return found


def adopted(text, where):
    """The agents the relay blocks of `text` are for."""
    return {a for agents, _, _ in blocks(text, where) for a in agents}


def refused(where, line, what):
    return RelayError(f"{where}:{line}: {what}; mend the markers by hand (the file is left as it is)")


def place(text, new_block, where):
    """`text` with its relay blocks replaced by `new_block` (where the first one was), or with
    `new_block` added at the end."""
    newline = "\r\n" if "\r\n" in text else "\n"
    if newline != "\n":
        new_block = new_block.replace("\n", newline)
    found = blocks(text, where)
    if not found:
        if text and not text.endswith("\n"):
            text += newline
        if text.strip():
            text += newline
        return text + new_block
    out, pos = [], 0
    for i, (_, start, end) in enumerate(found):
        before = text[pos:start]
        if i and before.endswith(newline * 2):       # the blank line that set a removed block apart
            before = before[:-len(newline)]
        out.append(before)
        if i == 0:
            out.append(new_block[:-len(newline)] if end == len(text) and not text.endswith("\n") else new_block)
        pos = end
    return "".join(out) + text[pos:]


# -- the file -----------------------------------------------------------------------------------

def target(root, state, file_=None):
    """The file to write: `file_` relative to the project root (an absolute path only inside
    it), or AGENTS.md there. No '..', never a file inside the state directory. The directories on
    the way are looked at only when it is opened (`open_parent`, never through a link)."""
    given = file_ or DEFAULT_FILE
    path = Path(given)
    where = f"--file {given!r}"
    if ".." in path.parts:
        raise RelayError(f"{where} holds '..'; relay adopt writes a file relative to the project root "
                         f"{root}, inside it")
    if path.is_absolute():
        try:
            path = path.relative_to(root)
        except ValueError:
            raise RelayError(f"{where} is not inside the project root {root}; relay adopt writes a file "
                             "relative to the project root, inside it") from None
    if not path.parts or path.name in ("", "."):
        raise RelayError(f"{where} names no file; relay adopt writes a file relative to the project root")
    path = Path(root) / path
    if is_inside(path, state) or is_inside(path.parent, state):
        raise RelayError(f"{path} is inside the state directory {state}; relay adopt writes an "
                         "instructions file of the project (e.g. AGENTS.md or CLAUDE.md)")
    return path


def open_parent(path, root=None):
    """A descriptor of the directory `path` is in. With `root` (the project root) it is walked
    down from there one directory at a time with O_NOFOLLOW (fs.StateDir): a symbolic link on
    the way is refused, and everything after goes through the descriptor, so a directory
    swapped for a link later changes nothing."""
    parent = path.parent
    rel = "" if root is None else "/".join(parent.relative_to(root).parts)
    top = None
    try:
        top = StateDir(parent if root is None else root)
        return top.open_dir(rel) if rel else os.dup(top.fd)
    except FileNotFoundError:
        raise RelayError(f"no directory {parent} to write {path.name} in") from None
    except Unsafe:
        link = first_link(Path(parent if root is None else root), rel)
        if link is None:
            raise RelayError(f"{parent} is not a directory to write {path.name} in") from None
        raise RelayError(f"{link} is a symbolic link; relay adopt never writes through one (agents can plant "
                         "them): give --file the real path, or remove the link") from None
    finally:
        if top is not None:
            top.close()


def first_link(root, rel):
    """The first symbolic link on the way from `root` down `rel` (what made the walk stop), if any."""
    parts = rel.split("/") if rel else []
    for i in range(1, len(parts) + 1):
        if root.joinpath(*parts[:i]).is_symlink():
            return root.joinpath(*parts[:i])
    return None


def check(path, root=None):
    """Refuse, as `update` would, a file that cannot take a block (a link, broken markers)."""
    path = Path(path)
    dfd = open_parent(path, root)
    try:
        blocks(read(dfd, path)[0] or "", path)
    finally:
        os.close(dfd)


def update(path, me, new_block, fsync=None, root=None):
    """Put agent `me` in the relay block of the file at `path`: 'added', 'updated' or
    'unchanged'. `new_block(agents)` gives the block for the agents the file's blocks are for,
    `me` among them (a string: that block). `root`: where the walk to `path` starts (open_parent)."""
    if fsync is None:
        from relay.files.sync import default_fsync as fsync
    path = Path(path)
    dfd = open_parent(path, root)
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX)         # two adopt runs on one directory take turns
        old, seen = read(dfd, path)
        had = adopted(old or "", path)
        text = new_block(had | {me}) if callable(new_block) else new_block
        new = place(old or "", text, path)
        if new == old:
            return "unchanged"
        replace(dfd, path, new.encode("utf-8"), seen, fsync)
        return "updated" if me in had else "added"
    finally:
        os.close(dfd)


def read(dfd, path):
    """(text, stat) of the file, or (None, None) when there is none. Never through a link."""
    link = RelayError(f"{path} is a symbolic link; relay adopt never writes through one (agents can "
                      "plant them): give --file the real path, or remove the link")
    try:
        if stat.S_ISLNK(os.stat(path.name, dir_fd=dfd, follow_symlinks=False).st_mode):
            raise link
        fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        if e.errno == errno.ELOOP:              # made a link since the look
            raise link from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RelayError(f"{path} is not a regular file; relay adopt writes only a plain text file")
        if st.st_size > MAX_FILE_BYTES:
            raise RelayError(f"{path} is {st.st_size} bytes, more than an instructions file of "
                             f"{MAX_FILE_BYTES // 1024 // 1024} MiB; give --file another file")
        data = b""
        while chunk := os.read(fd, 1 << 20):
            data += chunk
            if len(data) > MAX_FILE_BYTES:
                raise RelayError(f"{path} grew past {MAX_FILE_BYTES // 1024 // 1024} MiB while it was read")
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8"), st
    except UnicodeDecodeError as e:
        raise RelayError(f"{path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                         "relay adopt changes only a text file") from None


def same_file(a, b):
    return (a is None) == (b is None) and (a is None or (a.st_dev, a.st_ino, a.st_size, a.st_mtime_ns)
                                           == (b.st_dev, b.st_ino, b.st_size, b.st_mtime_ns))


def replace(dfd, path, data, seen, fsync):
    """Put `data` at `path` atomically, if the file there is still `seen` (None: there was none)."""
    tmp = f".{path.name}.relay-adopt-{secrets.token_hex(6)}.tmp"
    mode = stat.S_IMODE(seen.st_mode) if seen else 0o666         # a new file: 0o666 less the umask
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
    done = False
    try:
        try:
            if seen:
                os.fchmod(fd, mode)
                if (seen.st_uid, seen.st_gid) != (os.geteuid(), os.getegid()):
                    try:
                        os.fchown(fd, seen.st_uid, seen.st_gid)
                    except PermissionError:
                        pass
            write_all(fd, data)
            fsync(fd)
        finally:
            os.close(fd)
        try:
            now = os.stat(path.name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            now = None
        if not same_file(seen, now):
            raise RelayError(f"{path} changed while relay adopt ran; nothing was written: run it again")
        os.rename(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        done = True
        fsync(dfd)
    finally:
        if not done:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass


# -- the agent ----------------------------------------------------------------------------------

def adopt(layout, configured, agent, path, create=False, fsync=None, root=None):
    """Put agent `agent` in the relay block of `path` (walked from `root`, never through a link).
    An agent relay does not know is refused unless `create`, which makes its outbox and inbox.
    Returns 'added', 'updated' or 'unchanged'."""
    reserved_names.agent(agent)
    gone = archived(layout)         # archived agents are no one to write to, nor to adopt
    why = registry.archived_refusal(agent, gone, sender=True, outcome="it is not adopted")
    if why is not None:
        raise RelayError(why)
    known = {n for n in layout.agent_names(configured) if n not in gone}
    if agent not in known:
        if not create:
            check_known(agent, known, "agent")
        check(path, root)                       # a file adopt would refuse creates no agent
        check_new(layout, [agent], configured)      # no other agent's name in another case
        problems = layout.init([agent])
        if problems:
            raise RelayError("; ".join(problems))
        declare(layout, [agent], "relay adopt --create")
        known = known | {agent}
    return update(path, agent, lambda agents: block(agents, known, root=root), fsync=fsync, root=root)


if __name__ == "__main__":
    sys.stdout.write(snippet())
