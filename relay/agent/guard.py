"""The git guard of file reservations: `relay guard install` writes a pre-commit hook into the
repository's hooks directory (`git rev-parse --git-path hooks`: core.hooksPath is honoured)
that runs `relay guard check`, which refuses a commit whose staged files another agent holds
by an exclusive reservation, naming the holder.

Who commits: $RELAY_AGENT, else `git config relay.agent`; unknown, every exclusive reservation
is another's. RELAY_GUARD=off (or 0, false, no) lets a person commit past it. The check is
advisory like the leases: a ledger it cannot read, or a relay no longer installed where the
hook names it, lets the commit through with a warning rather than stopping all work.

The hook is written the way relay writes into places others can write: the hooks directory is
opened without following a link (a link there is refused), a hook that is a link is refused,
never written through, and a hook relay did not write is never replaced unless asked
(`--chain` keeps it as pre-commit.before-relay, which relay's hook runs first). The new hook is
a temporary file beside the old one, synced, renamed over it, the directory synced.
"""
import errno
import os
import secrets
import shlex
import stat
import subprocess
from pathlib import Path

from relay.errors import RelayError
from relay.files.patterns import covers
from relay.ledger.history import History
from relay.ledger.ledger import Ledger
from relay.operator.units import command
from relay.terminal import unsafe

HOOK = "pre-commit"
CHAINED = "pre-commit.before-relay"
MARK = "# relay-guard: written by `relay guard install`"
OFF = ("off", "0", "false", "no")

SCRIPT = """\
#!/bin/sh
{mark}; `relay guard uninstall` removes it.
# It refuses a commit touching another agent's exclusive file reservation (relay reservations).
# Who commits: $RELAY_AGENT, else `git config relay.agent`. RELAY_GUARD=off commits past it.
hooks=$(dirname -- "$0")
if [ -x "$hooks/{chained}" ]; then
    "$hooks/{chained}" "$@" || exit $?
fi
if [ ! -x {program} ]; then
    echo "relay guard: "{program}" is not there any more: this commit is not checked (relay guard install again)" >&2
    exit 0
fi
exec {argv} guard check
"""


def git(args, cwd):
    """The output of a git command (bytes); RelayError with git's own line when it fails."""
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=60)
    except FileNotFoundError:
        raise RelayError("git is not installed (or not on PATH)") from None
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise RelayError(f"git {' '.join(args)}: {said[-1] if said else f'exit {done.returncode}'}")
    return done.stdout


def toplevel(root):
    try:
        return Path(os.fsdecode(git(["rev-parse", "--show-toplevel"], root).rstrip(b"\n")))
    except RelayError as e:
        raise RelayError(f"{root} is not in a git repository ({e}); the guard is a git hook") from None


def hooks_dir(root, named=None, verb="install"):
    """The directory git runs the hooks from (core.hooksPath honoured), when it lies inside the
    repository: its work tree or its git directory. core.hooksPath is in .git/config, which an
    agent can write: a place outside is refused, naming it, unless the operator names that same
    place (`named`, --hooks-path); a `named` place git does not run hooks from is refused too."""
    top = toplevel(root)
    hooks = top / os.fsdecode(git(["rev-parse", "--git-path", "hooks"], top).rstrip(b"\n"))
    hooks = Path(os.path.realpath(hooks)) if ".." in hooks.parts else hooks     # as the kernel takes it
    common = top / os.fsdecode(git(["rev-parse", "--git-common-dir"], top).rstrip(b"\n"))
    real = os.path.join(os.path.realpath(hooks.parent), hooks.name)    # a link there itself: _open_dir refuses it
    if named is not None:
        named_ = Path(os.path.abspath(named))
        if os.path.join(os.path.realpath(named_.parent), named_.name) != real:
            raise RelayError(f"git runs the hooks from {hooks}, not {named} (--hooks-path); nothing was changed")
        return hooks
    if not any(real == base or real.startswith(base.rstrip(os.sep) + os.sep)
               for base in (os.path.realpath(top), os.path.realpath(common))):
        raise RelayError(f"core.hooksPath points outside the repository, to {hooks}; nothing was changed "
                         f"(`relay guard {verb} --hooks-path {shlex.quote(str(hooks))}` if you mean it)")
    return hooks


def script(root, state_dir):
    argv = command()
    for p in (root, state_dir, *argv):
        if any(unsafe(c) or 0xD800 <= ord(c) < 0xE000 for c in str(p)):
            raise RelayError(f"{p!r} holds a control character or bytes that are not UTF-8; a hook cannot name "
                             "it: move the project (or relay) to a plain path")
    full = [*argv, "--root", str(root), "--state-dir", str(state_dir)]
    return SCRIPT.format(mark=MARK, chained=CHAINED, program=shlex.quote(argv[0]),
                         argv=" ".join(shlex.quote(a) for a in full))


def _open_dir(path):
    """The hooks directory, made when missing, opened without following a link."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        os.makedirs(path, 0o755, exist_ok=True)
        return _open_dir(path)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise RelayError(f"{path} is a symbolic link or not a directory; relay never writes a hook through "
                             "one: make it a plain directory") from None
        raise


def _existing(fd, name, hooks):
    """The text of hook `name` there, or None; RelayError when it is a link or no regular file."""
    try:
        st = os.lstat(name, dir_fd=fd)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise RelayError(f"{hooks / name} is a symbolic link; relay never writes a hook through one: remove it "
                         "(or replace it by the file it points to), then install again")
    if not stat.S_ISREG(st.st_mode):
        raise RelayError(f"{hooks / name} is not a regular file; remove it, then install again")
    hook = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    with os.fdopen(hook, "rb") as f:
        return f.read(1 << 20).decode("utf-8", "replace")


def _write(fd, name, text):
    """`text` as the executable hook `name`: a temporary beside it, synced, renamed over it."""
    tmp = f".{name}.relay-{secrets.token_hex(4)}"
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o755, dir_fd=fd)
    try:
        with os.fdopen(out, "wb") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            os.fchmod(f.fileno(), 0o755)
            os.fsync(f.fileno())
        os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=fd)
        except OSError:
            pass
        raise
    os.fsync(fd)


def install(root, state_dir, chain=False, named=None):
    """Write relay's pre-commit hook; returns the lines that say what was done. `named`: the
    hooks directory the operator named (--hooks-path), needed when it lies outside the repository."""
    hooks = hooks_dir(root, named, "install")
    text = script(root, state_dir)
    fd = _open_dir(hooks)
    try:
        there = _existing(fd, HOOK, hooks)
        chained = _existing(fd, CHAINED, hooks) is not None
        if there is not None and MARK not in there:
            if not chain:
                raise RelayError(f"{hooks / HOOK} is a hook relay did not write; nothing was changed. "
                                 f"`relay guard install --chain` keeps it as {CHAINED}, which relay's hook runs first")
            if chained:
                raise RelayError(f"{hooks / CHAINED} is there already; nothing was changed: merge the two hooks by "
                                 f"hand, or remove {CHAINED}")
            os.link(HOOK, CHAINED, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
        _write(fd, HOOK, text)
    finally:
        os.close(fd)
    done = [f"{'updated' if there is not None and MARK in there else 'installed'} {hooks / HOOK}: a commit touching "
            "another agent's exclusive reservation is refused (RELAY_GUARD=off overrides it)"]
    if there is not None and MARK not in there:
        done.append(f"the hook that was there is kept as {hooks / CHAINED} and runs first")
    elif chained:
        done.append(f"{hooks / CHAINED} runs first")
    done.append("who commits: $RELAY_AGENT, else `git config relay.agent NAME` in the agent's work tree")
    return done


def uninstall(root, named=None):
    """Remove relay's hook (a chained one takes its place again); returns what was done."""
    hooks = hooks_dir(root, named, "uninstall")
    fd = _open_dir(hooks)
    try:
        there = _existing(fd, HOOK, hooks)
        if there is None:
            return [f"no hook at {hooks / HOOK}; nothing to do"]
        if MARK not in there:
            raise RelayError(f"{hooks / HOOK} is not relay's hook; it was left as it is")
        if _existing(fd, CHAINED, hooks) is not None:
            os.rename(CHAINED, HOOK, src_dir_fd=fd, dst_dir_fd=fd)
            done = [f"removed relay's hook; {hooks / HOOK} is the one it ran first again"]
        else:
            os.unlink(HOOK, dir_fd=fd)
            done = [f"removed {hooks / HOOK}"]
        os.fsync(fd)
    finally:
        os.close(fd)
    return done


def committer(top, env):
    """Who commits: $RELAY_AGENT, else `git config relay.agent`, else None."""
    if env.get("RELAY_AGENT"):
        return env["RELAY_AGENT"]
    try:
        return os.fsdecode(git(["config", "--get", "relay.agent"], top)).strip() or None
    except RelayError:
        return None


def staged(root):
    """The files the commit being made touches (added, changed, deleted; both sides of a
    rename), relative to the project root; those outside it are left out."""
    top = toplevel(root)
    out = git(["diff", "--cached", "--name-only", "-z", "--no-renames"], top)
    names = [os.fsdecode(n) for n in out.split(b"\0") if n]
    return inside(root, [os.path.join(top, n) for n in names])


def inside(root, paths):
    """Paths (absolute, or relative to the current directory) relative to the project root,
    which is taken as named and as resolved; those outside it are left out."""
    bases = list(dict.fromkeys([os.path.abspath(root), os.path.realpath(root)]))
    out = []
    for p in paths:
        for base in bases:
            rel = os.path.relpath(os.path.abspath(p), base)
            if rel != os.pardir and not rel.startswith(os.pardir + os.sep):
                out.append(rel.replace(os.sep, "/"))
                break
    return out


def conflicts(ledger_path, agent, paths, now):
    """(path, reservation row) for each path another agent than `agent` holds exclusively.
    No ledger: none."""
    if not Path(ledger_path).exists():
        return []
    with History(Ledger(ledger_path, readonly=True)) as history:
        rows = [r for r in history.reservations.held(now) if r["exclusive"] and r["agent"] != agent]
    return [(p, r) for p in paths for r in rows if covers(r["pattern"], p, r["scope"])]

