"""Service units for `relay service`: a systemd unit or a launchd property list that runs one
project's relay daemon with this installation's absolute path (systemd does not search PATH,
and launchd has none of a shell's), one unit (systemd instance, launchd label) per project.

Nothing here writes a file: the unit is text for the operator to save where the service
manager looks (`install_hint` says where and what to run then).
"""
import getpass
import hashlib
import os
import plistlib
import re
import sys
from pathlib import Path

from relay.errors import RelayError
from relay.files.fs import shown
from relay.terminal import unsafe

_SYSTEMD_SAFE = re.compile(r"[A-Za-z0-9/._:+,=@-]+\Z")    # an ExecStart word needing no quotes


def command():
    """The argv that runs this installation's relay: the console script beside the interpreter
    (a venv's bin/relay) when there is one, else the interpreter itself with `-P -m relay`
    (-P: a directory named relay in the project never stands in for the installed one). The
    interpreter's path is kept as it is, not resolved: a venv is known by it."""
    exe = Path(sys.executable).absolute()
    script = exe.parent / "relay"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [str(exe), "-P", "-m", "relay"]


def _checked(*paths):
    """Refuse a path a unit cannot hold as it is: one that is not UTF-8 (a unit file and a property
    list are UTF-8 text), or holds a control character (C0, DEL, C1: a line break, XML 1.0 has no
    room for most) or a bidi override or line separator (terminal.UNSAFE: the unit would not read
    as what it runs)."""
    for p in paths:
        text = str(p)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise RelayError(f"'{shown(text)}' is not valid UTF-8; a service unit cannot name it: move the "
                             "project (or relay) to a plain path") from None
        if any(unsafe(c) for c in text):
            raise RelayError(f"'{shown(text)}' holds a control character or bidi control; a service unit cannot name "
                             "it: move the project (or relay) to a plain path")


def _path_value(path):
    """A path as the value of a setting that takes it unquoted (WorkingDirectory=, and the same
    words in Description=): `%` written `%%`; a path ending in a backslash gets a '/' after it,
    which names the same directory, so that the line does not end in one (systemd would join
    the next line to it, and lose that setting)."""
    text = _specifiers(path)
    return text + "/" if text.endswith("\\") else text


def escape_path(path):
    """The instance name of a path, as `systemd-escape --path` makes it: '/' becomes '-', and
    every byte outside [A-Za-z0-9:_.] (a '.' only after the first) becomes \\xNN."""
    trimmed = os.path.normpath(str(path)).strip("/")
    if not trimmed:
        return "-"
    out = []
    for i, ch in enumerate(trimmed):
        if ch == "/":
            out.append("-")
        elif ch.isascii() and (ch.isalnum() or ch in ":_" or (ch == "." and i > 0)):
            out.append(ch)
        else:
            out.extend(f"\\x{b:02x}" for b in ch.encode("utf-8", "surrogateescape"))
    return "".join(out)


def systemd_name(root):
    name = f"relay@{escape_path(root)}.service"
    if len(name) > 255:
        raise RelayError(f"the project path {str(root)!r} is too long for a systemd unit name (255 bytes at most)")
    return name


def _specifiers(text):
    """A value with systemd's specifier (%) written literally."""
    return text.replace("%", "%%")


def _word(arg):
    """One ExecStart word: quoted (C-style) when it needs it; % and $ written literally."""
    if not _SYSTEMD_SAFE.match(arg):
        arg = '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return _specifiers(arg).replace("$", "$$")


def systemd(argv, root, user=True):
    """A systemd service unit running `argv --root ROOT run` for the project at `root` (a user
    unit, or with `user` False a system unit that runs as the current user)."""
    root = os.path.normpath(str(root))
    _checked(root, *argv)
    run = " ".join(_word(a) for a in [*argv, "--root", root, "run"])
    scope = " --user" if user else ""
    # systemd strips the white space that ends a value, and WorkingDirectory= has no quoting:
    # a path ending in a space is named by ExecStart's --root alone (relay's hooks run in the
    # project root whatever the service's directory).
    exact = root == root.rstrip()
    lines = [
        f"# relay for {root if exact else repr(root)}: written by `relay service systemd{scope}`; save it as {systemd_name(root)}",
        "[Unit]",
        f"Description=relay outbox daemon for {_path_value(root if exact else repr(root))}",
        "After=local-fs.target",
        "",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
        f"ExecStart={run}",
        "ExecReload=/bin/kill -HUP $MAINPID",
        *([f"WorkingDirectory={_path_value(root)}"] if exact else []),
        "Restart=on-failure",
        "RestartSec=1",
        "WatchdogSec=30",
        "KillSignal=SIGTERM",
        "TimeoutStopSec=30",
    ]
    if not user:
        lines.append(f"User={getpass.getuser()}")
    lines += ["", "[Install]", f"WantedBy={'default.target' if user else 'multi-user.target'}", ""]
    return "\n".join(lines)


def launchd_label(root):
    """A label of its own for each project: com.relay.<the directory's name>.<8 hex of its path>."""
    root = os.path.normpath(str(root))
    slug = re.sub(r"[^a-z0-9]+", "-", os.path.basename(root).lower()).strip("-")[:40].strip("-") or "project"
    return f"com.relay.{slug}.{hashlib.sha256(root.encode('utf-8', 'surrogateescape')).hexdigest()[:8]}"


def launchd(argv, root, user=True, home=None):
    """A launchd property list running `argv --root ROOT run` for the project at `root`: a
    LaunchAgent (user), or with `user` False a LaunchDaemon that runs as the current user. Its
    log goes to ~/Library/Logs (or /Library/Logs), outside the state directory agents write in."""
    root = os.path.normpath(str(root))
    _checked(root, *argv)
    label = launchd_label(root)
    logs = Path(home or Path.home()) / "Library/Logs" if user else Path("/Library/Logs")
    doc = {"Label": label, "ProgramArguments": [*argv, "--root", root, "run"], "WorkingDirectory": root,
           "RunAtLoad": True, "KeepAlive": {"SuccessfulExit": False}, "StandardErrorPath": str(logs / f"{label}.log")}
    if not user:
        doc["UserName"] = getpass.getuser()
    return plistlib.dumps(doc, sort_keys=False).decode()


def install_hint(kind, root, user=True):
    """Where to save the unit and what to run then (for the operator, on stderr)."""
    if kind == "systemd":
        name = systemd_name(root)
        where = f"~/.config/systemd/user/{name}" if user else f"/etc/systemd/system/{name}"
        ctl = "systemctl --user" if user else "sudo systemctl"
        return (f"save this unit as {where}, then:\n"
                f"  {ctl} daemon-reload && {ctl} enable --now '{name}'\n"
                f"  ({ctl} reload '{name}' rereads relay.toml; journalctl {'--user ' if user else ''}-u '{name}' shows its log)")
    label = launchd_label(root)
    where = f"~/Library/LaunchAgents/{label}.plist" if user else f"/Library/LaunchDaemons/{label}.plist"
    domain = "gui/$(id -u)" if user else "system"
    return (f"save this property list as {where}, then:\n"
            f"  {'' if user else 'sudo '}launchctl bootstrap {domain} {where}\n"
            f"  (launchctl kill HUP {domain}/{label} rereads relay.toml)")
