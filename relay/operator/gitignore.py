"""`relay init` in a git repository: the state directory (the ledger, every inbox and the
archive) is kept out of the repository, or an agent's `git add -A` commits it. A line naming it
is added to the `.gitignore` beside it, at the project root, once."""
import errno
import os
import stat
from pathlib import Path

from relay.config import state_parts


def in_git(root):
    """True when `root` lies in a git work tree: a `.git` (a directory, or a worktree's file)
    there or in a parent."""
    return any((d / ".git").exists() for d in (Path(root), *Path(root).parents))


def keep_out_of_git(root, state):
    """Add `<state>/` to `root/.gitignore` when the root lies in a git work tree, the state
    directory inside the root, and no line of the file names it yet. Returns (what was done,
    problem): each None or one line. A `.gitignore` that is a link or no plain file is not
    written through (agents can plant one): the problem says so."""
    parts = state_parts(root, state)
    if not parts or not in_git(root):
        return None, None
    rel = "/".join(parts)
    path = Path(root) / ".gitignore"
    names = {rel, f"{rel}/", f"/{rel}", f"/{rel}/"}
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        why = "a symbolic link" if e.errno == errno.ELOOP else e.strerror or str(e)
        return None, f"{path} is {why}; relay did not add {rel}/ to it: add it yourself to keep relay's state out of git"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, f"{path} is not a plain file; relay did not add {rel}/ to it"
        with os.fdopen(os.dup(fd), "rb") as f:
            text = f.read().decode("utf-8", "replace")
        if any(line.strip() in names for line in text.splitlines()):
            return None, None
        os.write(fd, (("\n" if text and not text.endswith("\n") else "") + f"{rel}/\n").encode())
    finally:
        os.close(fd)
    return f"added {rel}/ to {path} (a git repository: relay's state stays out of it)", None
