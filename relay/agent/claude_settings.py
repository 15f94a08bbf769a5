"""`relay hook install claude` and `relay hook uninstall claude`: relay's hooks in a Claude Code
settings file of the project (.claude/settings.local.json, or with `shared` the committed
.claude/settings.json), next to whatever else the file holds.

relay's hooks are the command hooks whose command runs relay's `hook claude` (relay by its
absolute path, so that a session whose PATH lacks relay's virtual environment runs it): one for
each event of claude_hooks.EVENTS. Installing merges them in (a hook of relay's already there is
updated in place; every other hook, matcher and key is kept as it was, in its order) and does
nothing when they are there as they would be written; uninstalling takes out relay's hooks
only, and the groups and event lists that held nothing else. A file that is not a JSON object
with a `hooks` object of lists is refused with one line and left as it is. The new text is
written whole beside the file and renamed over it, unless the file changed since it was read."""
import json
import os
import secrets
import shlex
import shutil
import sys
from pathlib import Path

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


def is_relays(hook):
    """Whether a hook entry is one of relay's: a command that runs relay's `hook claude`."""
    if not isinstance(hook, dict) or hook.get("type") != "command" or not isinstance(hook.get("command"), str):
        return False
    try:
        words = shlex.split(hook["command"])
    except ValueError:
        return False
    for i in range(len(words) - 1):
        if words[i:i + 2] == ["hook", "claude"] and i > 0:
            program = words[:i]
            return os.path.basename(program[-1]) == "relay" or program[-2:] == ["-m", "relay"]
    return False


def settings_path(root, shared=False):
    return Path(root) / (SHARED if shared else LOCAL)


def install(root, agent=None, shared=False, argv=None):
    """Put relay's hooks into the settings file; returns (path, "installed" | "updated" | "unchanged")."""
    path = settings_path(root, shared)
    doc, before = _load(path)
    hooks = doc.setdefault("hooks", {})
    command = hook_command(agent, argv)
    outcome = "installed"
    for event in EVENTS:
        groups = hooks.setdefault(event, [])
        want = {"type": "command", "command": command, "timeout": TIMEOUT}
        ours = [(g, h) for g in groups if isinstance(g, dict) and isinstance(g.get("hooks"), list)
                for h in g["hooks"] if is_relays(h)]
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
    _save(path, doc, before)
    return path, outcome


def uninstall(root, shared=False):
    """Take relay's hooks out of the settings file; returns (path, how many were taken out)."""
    path = settings_path(root, shared)
    if not path.exists() and not path.is_symlink():
        return path, 0
    doc, before = _load(path)
    hooks = doc.get("hooks")
    removed = 0
    for event in list(hooks or {}):
        groups = hooks[event]
        kept = []
        for g in groups:
            if isinstance(g, dict) and isinstance(g.get("hooks"), list) and any(is_relays(h) for h in g["hooks"]):
                left = [h for h in g["hooks"] if not is_relays(h)]
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
        _save(path, doc, before)
    return path, removed


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


def _save(path, doc, before):
    """Write the settings whole beside the file and rename them over it, unless the file no
    longer holds `before` (changed since it was read)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(_text(doc))
            f.flush()
            os.fsync(f.fileno())
        try:
            now = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            now = None
        if now != before:
            raise RelayError(f"{path} changed while relay was writing it; it was left as it is now: run again")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
