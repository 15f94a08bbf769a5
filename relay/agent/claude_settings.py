"""`relay hook install claude` and `relay hook uninstall claude`: relay's hooks in a Claude Code
settings file of the project (.claude/settings.local.json, or with `shared` the committed
.claude/settings.json), next to whatever else the file holds.

relay's hooks are command hooks running `RELAY hook claude [--agent NAME]` and nothing more, RELAY
being relay's program (a path whose last part is `relay`, or PYTHON -m relay): one for each event
of claude_hooks.EVENTS. The hook of an install is recognised by its exact command (`hook_command`:
this relay by its absolute path, so that a session whose PATH lacks relay's virtual environment
runs it, and the agent's --agent): installing for Bob adds that command where it is missing and
refreshes it where it is (its timeout), and never touches a hook of another agent, of the
session's RELAY_AGENT (no --agent), or of another relay program (another install) — every other
hook, matcher and key is kept as it was, in its order; it does nothing when they are there as
they would be written. Uninstalling with an agent takes out that exact command only; without
one, every relay hook of the file (each agent's, each install's); and the groups and event lists
that held nothing else. A file that is not a JSON object with a `hooks` object of lists is
refused with one line and left as it is.

The settings lie in the project, where agents write too: a symbolic link anywhere on the way
from the project root to the file (`.claude/` or the file itself) is refused with one line and
nothing is written (adopt.first_link, as relay adopt refuses one); the directory is then held by
a descriptor walked without following links (adopt.open_parent), and the new text is written
whole beside the file through it and renamed over it, unless the file changed since it was read."""
import errno
import json
import os
import secrets
import shlex
import shutil
import sys
from pathlib import Path

from relay.agent.adopt import first_link, open_parent
from relay.agent.claude_hooks import EVENTS
from relay.errors import RelayError

LOCAL = ".claude/settings.local.json"
SHARED = ".claude/settings.json"
MATCHERS = {"PostToolUse": "*"}     # every tool; the other events take no matcher, or match all without one
TIMEOUT = 30                        # seconds Claude Code gives the hook (it fails open within them)


def relay_argv():
    """relay's own command, absolute: the console script beside this Python, or the one on PATH
    that this process was started as, else this Python with -m relay."""
    beside = Path(sys.executable).parent / "relay"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside.absolute())]
    started = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if started is not None and started.name == "relay" and started.is_file():
        return [str(started.resolve())]
    found = shutil.which("relay")
    if found:
        return [str(Path(found).absolute())]
    return [sys.executable, "-m", "relay"]


def hook_command(agent=None, argv=None):
    """The command line of relay's hook, for `agent` (None: the session's RELAY_AGENT)."""
    return shlex.join([*(argv or relay_argv()), "hook", "claude", *(["--agent", agent] if agent else [])])


def _words(hook):
    if not isinstance(hook, dict) or hook.get("type") != "command" or not isinstance(hook.get("command"), str):
        return None
    try:
        return shlex.split(hook["command"])
    except ValueError:
        return None


def is_relays(hook):
    """Whether a hook entry is one of relay's: a command hook running `RELAY hook claude` with
    `--agent NAME` or nothing after, RELAY one word naming a program `relay` or PYTHON -m relay."""
    words = _words(hook)
    if not words:
        return False
    for tail in (2, 4):
        program, rest = words[:-tail], words[-tail:]
        if rest[:2] == ["hook", "claude"] and (tail == 2 or rest[2] == "--agent"):
            return (len(program) == 1 and os.path.basename(program[0]) == "relay") or (
                len(program) == 3 and program[1:] == ["-m", "relay"])
    return False


def is_install(hook, command):
    """Whether a hook entry is the one an install writes as `command` (its exact words)."""
    return _words(hook) == shlex.split(command)


def settings_path(root, shared=False):
    return Path(root) / (SHARED if shared else LOCAL)


def install(root, agent=None, shared=False, argv=None):
    """Put relay's hooks into the settings file; returns (path, "installed" | "updated" | "unchanged")."""
    path = settings_path(root, shared)
    _no_link(root, path)
    doc, before = _load(path)
    hooks = doc.setdefault("hooks", {})
    command = hook_command(agent, argv)
    outcome = "installed"
    for event in EVENTS:
        groups = hooks.setdefault(event, [])
        want = {"type": "command", "command": command, "timeout": TIMEOUT}
        ours = [(g, h) for g in groups if isinstance(g, dict) and isinstance(g.get("hooks"), list)
                for h in g["hooks"] if is_install(h, command)]
        if ours:
            outcome = "updated"
            group, first = ours[0]
            group["hooks"][group["hooks"].index(first)] = want
            for g, h in ours[1:]:           # a second of relay's in the same event: one is enough
                g["hooks"].remove(h)
            groups[:] = [g for g in groups if not (isinstance(g, dict) and g.get("hooks") == [])]
        else:
            groups.append({**({"matcher": MATCHERS[event]} if event in MATCHERS else {}), "hooks": [want]})
    if _text(doc) == before:
        return path, "unchanged"
    _save(root, path, doc, before)
    return path, outcome


def uninstall(root, shared=False, agent=None, argv=None):
    """Take relay's hooks out of the settings file: with `agent`, the hooks an install for it
    writes (hook_command), else every relay hook; returns (path, how many were taken out)."""
    path = settings_path(root, shared)
    _no_link(root, path)
    if not path.exists():
        return path, 0
    command = hook_command(agent, argv) if agent else None

    def ours(h):
        return is_install(h, command) if command else is_relays(h)
    doc, before = _load(path)
    hooks = doc.get("hooks")
    removed = 0
    for event in list(hooks or {}):
        groups = hooks[event]
        kept = []
        for g in groups:
            if isinstance(g, dict) and isinstance(g.get("hooks"), list) and any(ours(h) for h in g["hooks"]):
                left = [h for h in g["hooks"] if not ours(h)]
                removed += len(g["hooks"]) - len(left)
                if not left:
                    continue
                g["hooks"] = left
            kept.append(g)
        if len(kept) != len(groups):
            if kept:
                hooks[event] = kept
            else:
                del hooks[event]
        else:
            hooks[event] = kept
    if removed and not hooks:
        del doc["hooks"]
    if removed:
        _save(root, path, doc, before)
    return path, removed


def _no_link(root, path):
    """Refuse a symbolic link anywhere from the project root down to the settings file."""
    link = first_link(Path(root), "/".join(Path(path).relative_to(root).parts))
    if link is not None:
        raise RelayError(_LINK.format(link=link))


_LINK = ("{link} is a symbolic link; relay hook writes Claude Code's settings only through real directories "
         "into a plain file, never through a link (agents can plant them): nothing was changed; remove the link")


def _load(path):
    """(the settings as a dict, the text read) — ({}, None) for no file; RelayError for one
    that is not Claude Code's settings shape (the file is left as it is)."""
    if path.is_symlink():
        raise RelayError(f"{path} is a symbolic link; relay writes Claude Code's settings only into a plain file "
                         "(it was left unchanged)")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}, None
    except (OSError, UnicodeDecodeError) as e:
        raise RelayError(f"cannot read {path} ({getattr(e, 'strerror', None) or e}); it was left unchanged") from None
    try:
        doc = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as e:
        raise RelayError(f"{path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); it was left "
                         "unchanged: correct it and run again") from None
    if not isinstance(doc, dict):
        raise RelayError(f"{path} is not a JSON object; it was left unchanged")
    hooks = doc.get("hooks", {})
    if not isinstance(hooks, dict) or not all(isinstance(v, list) for v in hooks.values()):
        raise RelayError(f'{path}: "hooks" is not an object of lists (one per event), as Claude Code reads it; '
                         "it was left unchanged")
    return doc, text


def _text(doc):
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def _save(root, path, doc, before):
    """Write the settings whole beside the file and rename them over it, through a descriptor
    of its directory walked from the project root without following a link, unless the file no
    longer holds `before` (changed since it was read)."""
    path.parent.mkdir(exist_ok=True)            # .claude/ in the root (no link: _no_link)
    try:
        dfd = open_parent(path, Path(root))
    except RelayError:
        _no_link(root, path)                    # a link made since the look is said as one
        raise
    tmp = f".{path.name}.{secrets.token_hex(4)}.tmp"
    done = False
    try:
        try:
            mode = os.stat(path.name, dir_fd=dfd, follow_symlinks=False).st_mode & 0o777
        except FileNotFoundError:
            mode = 0o644
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(_text(doc))
            f.flush()
            os.fsync(f.fileno())
        if _read_at(dfd, path) != before:
            raise RelayError(f"{path} changed while relay was writing it; it was left as it is now: run again")
        os.rename(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        done = True
    finally:
        if not done:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
        os.close(dfd)


def _read_at(dfd, path):
    """The text of the file `path` names in the directory `dfd`, never through a link; None
    when there is none."""
    try:
        fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RelayError(_LINK.format(link=path)) from None
        raise
    with os.fdopen(fd, "r", encoding="utf-8") as f:
        return f.read()
