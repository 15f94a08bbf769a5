"""Configuration: `.relay/relay.toml`, overridden by env `RELAY_<KEY>`, overridden by flags.

An unknown key or a bad value raises ConfigError naming the key and where it came from.
"""
import dataclasses
import errno
import os
import stat
import re
import tomllib
from pathlib import Path

from .errors import ConfigError, NotInProject

AGENT_NAME_RULE = "[A-Za-z0-9][A-Za-z0-9._-]{0,63}"     # agent names (SPEC section 1), as people read it
AGENT_NAME = re.compile(AGENT_NAME_RULE + r"\Z")
SYSTEM = "System"

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*\Z")
_SIZES = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 10**6, "mb": 10**6,
          "mib": 1024**2, "g": 10**9, "gb": 10**9, "gib": 1024**3}
_SIZE = re.compile(r"\s*(\d+)\s*([a-z]*)\s*\Z", re.I)


def parse_duration(value):
    """Seconds from `90s`, `15m`, `12h`, `7d`, `250ms` or a plain number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"{value!r} is negative")
        return float(value)
    m = _DURATION.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a duration (use e.g. 250ms, 90s, 15m, 12h, 7d)")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def parse_size(value):
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"{value!r} must be positive")
        return value
    m = _SIZE.match(str(value))
    if not m or m.group(2).lower() not in _SIZES:
        raise ValueError(f"{value!r} is not a size (use e.g. 1048576, 512KiB, 1MiB)")
    size = int(m.group(1)) * _SIZES[m.group(2).lower()]
    if size <= 0:
        raise ValueError(f"{value!r} must be positive")
    return size


def _int(value, minimum=0):
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a whole number")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{value!r} is not a whole number") from None
    if number < minimum:
        raise ValueError(f"{value!r} is below {minimum}")
    return number


def _choice(*choices):
    def parse(value):
        if value not in choices:
            raise ValueError(f"{value!r} is not one of {', '.join(choices)}")
        return value
    return parse


def _agents(value):
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list):
        raise ValueError(f"{value!r} is not a list of agent names")
    for name in value:
        if not isinstance(name, str) or not AGENT_NAME.match(name):
            raise ValueError(f"{name!r} is not a valid agent name ({AGENT_NAME_RULE})")
    return tuple(value)


def _level(value):
    value = str(value).upper()
    if value not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ValueError(f"{value!r} is not a log level (debug, info, warning, error)")
    return value


def _state_dir(value):
    if not isinstance(value, str) or not value:
        raise ValueError(f"{value!r} is not a directory path")
    return value


_PARSERS = {
    "state_dir": _state_dir,
    "retention": parse_duration,
    "max_retries": lambda v: _int(v, 0),
    "retry_backoff": parse_duration,
    "settle": parse_duration,
    "rescan_interval": parse_duration,
    "sweep_interval": parse_duration,
    "max_body_bytes": parse_size,
    "retry_period": parse_duration,
    "batch_bytes": parse_size,
    "durability": _choice("full", "normal"),
    "unknown_recipient": _choice("fail", "create"),
    "agents": _agents,
    "log_format": _choice("text", "json"),
    "log_level": _level,
}


@dataclasses.dataclass(frozen=True)
class Config:
    root: Path
    state_dir: Path
    retention: float = 7 * 86400.0
    max_retries: int = 3
    retry_backoff: float = 1.0
    settle: float = 0.25
    rescan_interval: float = 30.0
    sweep_interval: float = 3600.0
    max_body_bytes: int = 1024 * 1024
    retry_period: float = 3600.0        # transient failures are retried at least this long
    batch_bytes: int = 64 * 1024 * 1024  # message bytes one batch holds in memory at most
    durability: str = "full"
    unknown_recipient: str = "fail"
    agents: tuple = ()
    log_format: str = "text"
    log_level: str = "INFO"
    source: str = "defaults"


def _clean(values, where):
    out = {}
    for key, raw in values.items():
        parser = _PARSERS.get(key)
        if parser is None:
            known = ", ".join(sorted(_PARSERS))
            raise ConfigError(f"unknown configuration key {key!r} in {where} (known keys: {known})")
        try:
            out[key] = parser(raw)
        except ValueError as e:
            raise ConfigError(f"bad value for {key!r} in {where}: {e}") from None
    return out


def resolve_dirs(root=None, state_dir=None, env=None):
    """The project root and state directory from flags, then env, then defaults."""
    env = os.environ if env is None else env
    root = Path(root or env.get("RELAY_ROOT") or os.getcwd()).absolute()
    state = state_dir or env.get("RELAY_STATE_DIR") or None
    return root, (root / state if state else None)


def discover(root=None, state_dir=None, env=None, cwd=None, uid=None):
    """The project root as every verb finds it, like git: `root` (a flag) or RELAY_ROOT when
    given, else the current directory or its nearest parent holding the state directory
    (`.relay/`, or the name given by `state_dir` / RELAY_STATE_DIR). NotInProject when none.

    A state directory found so must belong to the user relay runs as (`uid`, default the
    effective uid), as git asks of a `.git` it finds: one another user put in a shared parent
    (/tmp, a team directory) would otherwise receive this user's messages and configure this
    user's relay. NotInProject names it; `--root` uses it on purpose."""
    env = os.environ if env is None else env
    uid = os.geteuid() if uid is None else uid
    given = root or env.get("RELAY_ROOT")
    if given:
        return Path(given).absolute()
    name = state_dir or env.get("RELAY_STATE_DIR") or ".relay"
    start = Path(cwd or os.getcwd()).absolute()
    if Path(name).is_absolute():
        return start
    for place in (start, *start.parents):
        if (place / name).is_dir():
            owners = {os.lstat(place / name).st_uid, os.stat(place / name).st_uid}
            if owners != {uid}:
                other = min(owners - {uid})
                e = NotInProject(f"{place / name} belongs to another user (uid {other}), so relay does not take it "
                                 f"for your project; run relay init here for one of your own, or give --root "
                                 f"{place} to use it on purpose")
                e.foreign = place
                raise e
            return place
    raise NotInProject(f"not in a relay project (no {name.rstrip('/')}/ here or above); run relay init")


def _read_toml(path):
    """The parsed relay.toml, or None when there is none. Read without following a link and
    without blocking on a FIFO: it lies where agents can write."""
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
            return tomllib.load(f)
    except (tomllib.TOMLDecodeError, OSError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from None
    finally:
        os.close(fd)


def load(root=None, state_dir=None, env=None, overrides=None):
    """Build the Config. `overrides` are flag values (None means not given)."""
    env = os.environ if env is None else env
    root, state = resolve_dirs(root, state_dir, env)
    sources = []
    values = {}
    # The state dir named in relay.toml only counts when flags and env named none:
    # the file is looked for in the default state dir then.
    candidate = state or root / ".relay"
    toml_path = candidate / "relay.toml"
    data = _read_toml(toml_path)
    if data is not None:
        values.update(_clean(data, str(toml_path)))
        sources.append(str(toml_path))
        if state is None and "state_dir" in values:
            where = Path(values["state_dir"])
            # relay.toml lies where agents can write: from there the state directory may only
            # move to another place inside the project.
            if where.is_absolute() or ".." in where.parts:
                raise ConfigError(f"bad value for 'state_dir' in {toml_path}: {values['state_dir']!r} must be a "
                                  "relative path inside the project root (use --state-dir or "
                                  "RELAY_STATE_DIR for any other place)")
            state = root / where
    env_values = {k[len("RELAY_"):].lower(): v for k, v in env.items()
                  if k.startswith("RELAY_") and k not in ("RELAY_ROOT", "RELAY_STATE_DIR")}
    if env_values:
        values.update(_clean(env_values, "environment (RELAY_<KEY>)"))
        sources.append("environment")
    flags = {k: v for k, v in (overrides or {}).items() if v is not None}
    if flags:
        values.update(_clean(flags, "command-line flags"))
        sources.append("flags")
    values.pop("state_dir", None)
    state = (state or root / ".relay").absolute()
    return Config(root=root, state_dir=state, source=" + ".join(sources) or "defaults", **values)

