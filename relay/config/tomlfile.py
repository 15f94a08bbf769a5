"""relay.toml as a file. It lies where agents can write: it is read without following a link
and without blocking on a FIFO, and a new one (`relay init`'s) is made whole beside it and linked
into place, never over one that is there. A TOML slip in it (`retention = 7d`, which TOML takes
for the number 7 followed by a stray `d`) is TomlSlip: the file, the line, and where relay can
tell, what to write instead (`retention = "7d"`)."""
import errno
import json
import os
import re
import secrets
import stat
import tomllib

from relay.errors import ConfigError

_AT = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*\Z")
_AT_END = re.compile(r"\s*\(at end of document\)\s*\Z")
_ASSIGNMENT = re.compile(r"\s*([A-Za-z0-9_-]+)\s*=\s*([^\"'\[{#]*?)\s*(#.*)?\Z")
SHOWN = 120         # characters of the offending line shown at most


class TomlSlip(ConfigError):
    """relay.toml is no TOML; `text` is what the file holds."""

    def __init__(self, message, text):
        super().__init__(message)
        self.text = text


def _valid(value):
    try:
        tomllib.loads(f"v = {value}")
        return True
    except tomllib.TOMLDecodeError:
        return False


def explain(path, text, error):
    """The one line a TOMLDecodeError of `text` (the file at `path`) becomes: its line, the
    parser's words, and for a bare word where a value goes, the same quoted."""
    said = str(error)
    lines = text.splitlines()
    at = _AT.search(said)
    if at:
        number, column = int(at.group(1)), int(at.group(2))
        said = said[:at.start()]
    else:
        number, column = len(lines) or 1, None
        said = _AT_END.sub("", said)
    said = said[:1].lower() + said[1:] + (f", column {column}" if column else "")
    line = lines[number - 1].strip() if 0 < number <= len(lines) else ""
    if not line:
        return f"{path} line {number} is not TOML ({said})"
    shown = line if len(line) <= SHOWN else line[:SHOWN] + "..."
    out = f"{path} line {number}: {shown} is not TOML ({said})"
    m = _ASSIGNMENT.match(line)
    if m and m.group(2) and not _valid(m.group(2)) and _valid(json.dumps(m.group(2))):
        out += (f": write {m.group(1)} = {json.dumps(m.group(2))} (in TOML a duration, a size or a word is "
                "quoted text; only numbers, true and false are not)")
    return out


def read(path):
    """The parsed relay.toml at `path`, or None when there is none; ConfigError when it cannot
    be read, TomlSlip when it is no TOML."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ConfigError(f"{path} is a symbolic link; relay reads its configuration only from a plain "
                              "file there") from None
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{path} is not a regular file; relay reads its configuration only from a "
                              "plain file there")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TomlSlip(f"{path} is not UTF-8 text (byte {e.start}); a TOML file is", "") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TomlSlip(explain(path, text, e), text) from None


def write_new(path, text):
    """Make the file at `path` hold `text`, unless something is there already (a file, a link,
    anything): written whole into a temporary beside it, synced, then linked to the name, which
    never replaces what is there. True when written."""
    directory, name = os.path.split(os.fspath(path))
    tmp = os.path.join(directory, f".{name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path, follow_symlinks=False)
        except FileExistsError:
            return False
    finally:
        os.unlink(tmp)
    dfd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return True
