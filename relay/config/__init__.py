"""Configuration: `.relay/relay.toml`, overridden by env `RELAY_<KEY>`, overridden by flags.

An unknown key or a bad value raises ConfigError naming the key and where it came from (and,
for an unknown one, the closest known key: "did you mean retention?"). A
duration needs its unit (`90s`, `15m`); only 0 needs none. An environment variable that merely
starts with `RELAY_` but names no key is not configuration: it becomes a warning in
`Config.warnings`, like (when `strict` is off: every verb but the daemon's and the sweep's) an
unknown key or a bad value in relay.toml, which then counts as not given (`Config.rejected`). `Config.origins` says
where each value came from; `describe()` lays it out for `relay config`.

The package: this module (the keys, their defaults and their loading); tomlfile.py (relay.toml as
a file: read safely, written whole); template.py (the commented file `relay init` writes); and one
module for each table of its own: federation.py, wake.py, metrics.py.
"""
import dataclasses
import difflib
import os
import re
from pathlib import Path

from relay import names
from relay.config import metrics as metrics_section, tomlfile, wake as wake_section
from relay.errors import ConfigError
from relay.names import AGENT_NAME, AGENT_NAME_RULE, SYSTEM  # noqa: F401 - where the rest of relay takes them
from relay.statedir import (absolute, check_state, discover, linked, resolve_dirs,  # noqa: F401 - as config.<name>
                            state_link, state_parts)
from relay.terminal import unsafe

AGENT_VARIABLE = "RELAY_AGENT"      # the agent an agent's verbs, the Python API and MCP act as by default


def default_agent(env=None):
    """The agent named by RELAY_AGENT, or None (unset or empty)."""
    return (os.environ if env is None else env).get(AGENT_VARIABLE) or None

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*\Z")
_SIZES = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 10**6, "mb": 10**6,
          "mib": 1024**2, "g": 10**9, "gb": 10**9, "gib": 1024**3}
_SIZE = re.compile(r"\s*(\d+)\s*([a-z]*)\s*\Z", re.I)


def parse_duration(value):
    """Seconds from `90s`, `15m`, `12h`, `7d`, `250ms`; a number without a unit only when it is 0
    (`retention = 3` is refused: three seconds, minutes or days?)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"{value!r} is negative")
        number, unit = value, None
    else:
        m = _DURATION.match(str(value))
        if not m:
            raise ValueError(f"{value!r} is not a duration (use e.g. 250ms, 90s, 15m, 12h, 7d)")
        number, unit = float(m.group(1)), m.group(2)
    if unit is None:
        if number == 0:
            return 0.0
        raise ValueError(f"{value!r} has no unit: write {number:g}s, {number:g}m, {number:g}h or {number:g}d "
                         "(only 0 needs no unit)")
    return number * _UNITS[unit]


def show_duration(seconds):
    """A duration as it would be written: the largest unit that divides it (7d, 90s, 250ms)."""
    if not seconds:
        return "0"
    for unit in ("d", "h", "m", "s"):
        n = seconds / _UNITS[unit]
        if n == int(n):
            return f"{int(n)}{unit}"
    return f"{round(seconds * 1000, 3):g}ms"


def show_size(size):
    for unit, n in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size % n == 0:
            return f"{size // n}{unit}"
    return str(size)


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
        if names.reserved(name):
            raise ValueError(names.why_reserved(name))
    twins = names.twins(value)      # `Ann` and `ann`: one directory on a file system that folds case
    if twins is not None:
        raise ValueError(twins)
    return tuple(value)


def _level(value):
    value = str(value).upper()
    if value not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ValueError(f"{value!r} is not a log level (debug, info, warning, error)")
    return value


def _command(value):
    """on_deliver: a string for /bin/sh -c, or a list taken as argv; an empty string is none."""
    if isinstance(value, str):
        if "\0" in value:
            raise ValueError("a command cannot hold a NUL byte")
        return value if value.strip() else None
    if isinstance(value, list) and value and all(isinstance(a, str) and a and "\0" not in a for a in value):
        return tuple(value)
    raise ValueError(f"{value!r} is not a command (a string run by /bin/sh -c, or a non-empty list of "
                     "non-empty strings taken as its arguments)")


def _positive_duration(value):
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"{value!r} must be longer than 0s")
    return seconds


def _bool(value):
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in ("true", "yes", "on", "1"):
        return True
    if word in ("false", "no", "off", "0"):
        return False
    raise ValueError(f"{value!r} is not true or false")


def _table(value):
    if not isinstance(value, dict):
        raise ValueError(f"{value!r} is not a table ([federation] with url, team and node)")
    return dict(value)


def _state_dir(value):
    if not isinstance(value, str) or not value:
        raise ValueError(f"{value!r} is not a directory path")
    if any(unsafe(c) for c in value):
        raise ValueError(f"{value!r} holds a control or bidi character; name a plain directory")
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
    "pair_rate": lambda v: _int(v, 0),
    "pair_window": parse_duration,
    "queue_limit": lambda v: _int(v, 0),
    "durability": _choice("full", "normal"),
    "unknown_recipient": _choice("fail", "create"),
    "agents": _agents,
    "senders": _choice("any", "declared"),
    "log_format": _choice("text", "json"),
    "log_level": _level,
    "on_deliver": _command,
    "on_deliver_timeout": _positive_duration,
    "on_deliver_system": _bool,
    "bounces": _bool,
    "ack_overdue": _positive_duration,
    "federation": _table,       # checked whole in load(), with the root: federation_section.parse
    "wake": wake_section.parse,   # [wake]: relay wakes agents through tmux (core/wake.py)
    "metrics": metrics_section.parse,     # [metrics] listen: relay run serves /metrics alone (web/scrape.py)
}

# Set by relay for an on_deliver hook (hooks.py), not configuration: a hook that runs relay
# inherits them.
HOOK_VARIABLES = frozenset({"RELAY_MESSAGE_ID", "RELAY_SENDER", "RELAY_RECIPIENT", "RELAY_ENVELOPE",
                            "RELAY_SUBJECT", "RELAY_THREAD", "RELAY_KIND", "RELAY_PRIORITY"})


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
    pair_rate: int = 600                # messages per pair_window from one sender to one recipient (0: off)
    pair_window: float = 600.0
    queue_limit: int = 10_000           # unread envelopes a recipient may hold in new/ (0: off)
    durability: str = "full"
    unknown_recipient: str = "fail"
    agents: tuple = ()
    senders: str = "any"                # "declared": only declared agents' outboxes are read (roster.py)
    log_format: str = "text"
    log_level: str = "INFO"
    on_deliver: object = None           # a command run per delivered envelope (hooks.py): str or tuple
    on_deliver_timeout: float = 10.0
    on_deliver_system: bool = False     # also for envelopes delivered to System's inbox
    bounces: bool = True                # a sender hears of a message that failed (core/bounces.py)
    ack_overdue: float = 1800.0         # an acknowledgement asked for is overdue after this (relay overdue)
    federation: object = None           # federation_section.Federation, or None: this machine only
    wake: object = None                 # WakeConfig, or None: relay wakes no agent itself
    metrics: object = None              # MetricsConfig, or None: relay run serves no /metrics
    source: str = dataclasses.field(default="defaults", compare=False)
    # (key, where its value came from) for root, state_dir and every key not at its default
    origins: tuple = dataclasses.field(default=(), compare=False)
    warnings: tuple = dataclasses.field(default=(), compare=False)     # what was not taken, and why
    rejected: tuple = dataclasses.field(default=(), compare=False)     # (key, problem) of the keys not taken

    def origin(self, key):
        """Where the value of `key` came from: "default", "relay.toml (path)", "env RELAY_KEY", "flag"."""
        return dict(self.origins).get(key, "default")


KEYS = tuple(_PARSERS)
# environment variables that are not RELAY_<KEY>s: where the project is, who an agent is (every
# agent verb, the Python API, MCP, reserve and release, the git guard), the git guard switched off
NOT_KEYS = ("RELAY_ROOT", "RELAY_STATE_DIR", AGENT_VARIABLE, "RELAY_GUARD")


def _clean(values, where, warnings=None, rejected=None):
    """The parsed values. A problem raises ConfigError, or with a `warnings` list (not strict)
    is appended to it, (key, problem) to `rejected`, and the key left out (state_dir excepted:
    where relay is must be right)."""
    out = {}
    for key, raw in values.items():
        parser = _PARSERS.get(key)
        try:
            if parser is None:
                known = ", ".join(sorted(_PARSERS))
                near = difflib.get_close_matches(str(key), _PARSERS, 1)
                hint = f"; did you mean {near[0]}?" if near else ""
                raise ConfigError(f"unknown configuration key {key!r} in {where}{hint} (known keys: {known})")
            try:
                out[key] = parser(raw)
            except ValueError as e:
                raise ConfigError(f"bad value for {key!r} in {where}: {e}") from None
        except ConfigError as e:
            if warnings is None or key == "state_dir":
                raise
            warnings.append(f"{e}; ignored")
            if rejected is not None:
                rejected.append((str(key), str(e)))
    return out


def load(root=None, state_dir=None, env=None, overrides=None, strict=True):
    """Build the Config. `overrides` are flag values (None means not given). With `strict`
    off, an unknown key or a bad value in relay.toml or the environment is a warning in
    `Config.warnings` instead of an error (the value stays at what else gives it)."""
    env = os.environ if env is None else env
    origins = {"root": "flag" if root else "env RELAY_ROOT" if env.get("RELAY_ROOT") else "default (the current directory)",
               "state_dir": "flag" if state_dir else "env RELAY_STATE_DIR" if env.get("RELAY_STATE_DIR") else "default"}
    root, state = resolve_dirs(root, state_dir, env)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"the project root {root} is not a directory")
    got = _Gathered(origins, warnings=[] if not strict else None)
    state = _read_file(got, root, state)
    fed_env = _read_env(got, env)
    flags = {k: v for k, v in (overrides or {}).items() if v is not None}
    if flags:
        found = _clean(flags, "command-line flags")
        got.values.update(found)
        got.origins.update({k: "flag" for k in found})
        got.sources.append("flags")
    got.values.pop("state_dir", None)
    _federation(got, root, fed_env)
    state = (state or root / ".relay").absolute()
    return Config(root=root, state_dir=state, source=" + ".join(dict.fromkeys(got.sources)) or "defaults",
                  origins=tuple(sorted(got.origins.items())), warnings=tuple(got.notes + (got.warnings or [])),
                  rejected=tuple(got.rejected), **got.values)


@dataclasses.dataclass
class _Gathered:
    """What load() gathers on its way through relay.toml, the environment and the flags: the
    values, where each came from, the sources read, the notes, and (not strict) the warnings
    and the (key, problem) of each value rejected."""
    origins: dict
    warnings: list = None
    rejected: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)
    sources: list = dataclasses.field(default_factory=list)
    values: dict = dataclasses.field(default_factory=dict)


def _read_file(got, root, state):
    """relay.toml's values into `got`; the state directory (None: the default), which the file
    names only when flags and env named none: the file is looked for in the default one then."""
    candidate = state or root / ".relay"
    check_state(root, candidate, {"flag": "--state-dir", "env RELAY_STATE_DIR": "RELAY_STATE_DIR"}.get(
        got.origins["state_dir"], "the default .relay"))
    toml_path = candidate / "relay.toml"
    try:
        data = tomlfile.read(toml_path)
    except tomlfile.TomlSlip as e:
        if got.warnings is None:
            raise
        if re.search(r"(?m)^\s*[\"']?state_dir\b", e.text):       # where relay is must be right, always
            raise ConfigError(f"{e}; the file names state_dir, which no verb guesses: correct it first") from None
        got.warnings.append(f"{e}; relay.toml is read as if it were not there (every key at what else gives it)")
        got.rejected.append(("relay.toml", str(e)))
        return state
    if data is None:
        return state
    found = _clean(data, str(toml_path), got.warnings, got.rejected)
    got.values.update(found)
    got.origins.update({k: f"relay.toml ({toml_path})" for k in found if k != "state_dir" or state is None})
    got.sources.append(str(toml_path))
    if state is None and "state_dir" in got.values:
        where = Path(got.values["state_dir"])
        # relay.toml lies where agents can write: from there the state directory may only
        # move to another place inside the project.
        if where.is_absolute() or ".." in where.parts:
            raise ConfigError(f"bad value for 'state_dir' in {toml_path}: {got.values['state_dir']!r} must be a "
                              "relative path inside the project root (use --state-dir or "
                              "RELAY_STATE_DIR for any other place)")
        state = root / where
        check_state(root, state, f"state_dir in {toml_path}")
    return state


def _read_env(got, env):
    """The RELAY_<KEY> variables' values into `got`; returns the RELAY_FEDERATION_<KEY> ones."""
    from relay.config import federation as federation_section
    env_values, fed_env = {}, {}
    for name, value in env.items():
        if not name.startswith("RELAY_") or name in NOT_KEYS or name in HOOK_VARIABLES:
            continue
        key = name[len("RELAY_"):].lower()
        if key.startswith("federation_") and key[len("federation_"):] in federation_section.KEYS:
            fed_env[key[len("federation_"):]] = value
        elif key in _PARSERS and key not in ("state_dir", "federation"):
            env_values[key] = value
        else:
            got.notes.append(f"{name} is set in the environment but names no relay configuration key; it is ignored "
                             "(`relay config` lists the keys, each as RELAY_<KEY>)")
    if env_values:
        found = _clean(env_values, "environment (RELAY_<KEY>)", got.warnings, got.rejected)
        got.values.update(found)
        got.origins.update({k: f"env RELAY_{k.upper()}" for k in found})
        got.sources.append("environment")
    return fed_env


def _federation(got, root, fed_env):
    """The federation table (relay.toml, flags) with the RELAY_FEDERATION_<KEY>s over it, parsed."""
    from relay.config import federation as federation_section
    fed = got.values.pop("federation", None)
    if fed_env:
        got.sources.append("environment")
        fed = {**(fed or {}), **fed_env}
    if fed is None:
        return
    try:
        got.values["federation"] = federation_section.parse(fed, root, parse_duration)
        got.notes.extend(federation_section.warnings(got.values["federation"]))
    except ValueError as e:
        error = ConfigError(f"bad value for 'federation' in {' + '.join(dict.fromkeys(got.sources))}: {e}")
        if got.warnings is None:
            raise error from None
        got.warnings.append(f"{error}; ignored")        # (not strict: this machine only, then)
        got.rejected.append(("federation", str(error)))


def describe(cfg):
    """The configuration in force, key by key, for `relay config`: (key, value as JSON would
    have it, value as it would be written, where it came from)."""
    out = [("root", str(cfg.root), str(cfg.root), cfg.origin("root")),
           ("state_dir", str(cfg.state_dir), str(cfg.state_dir), cfg.origin("state_dir"))]
    for key in KEYS:
        if key == "state_dir":
            continue
        value = getattr(cfg, key)
        if isinstance(value, float):        # every float of the configuration is a duration
            text = show_duration(value)
        elif _PARSERS[key] is parse_size:
            text = show_size(value)
        elif key == "agents":
            value, text = list(value), ", ".join(value) or "(none)"
        elif key == "federation":
            value = None if value is None else {"url": value.shown_url, "team": value.team, "node": value.node}
            text = "(none: this machine only)" if value is None else \
                f"url {value['url']}, team {value['team']}, node {value['node']}"
        elif key in ("wake", "metrics"):
            value = None if value is None else dataclasses.asdict(value)
            text = "(none)" if value is None else ", ".join(f"{k} {v}" for k, v in value.items() if v)
        else:
            text = str(value).lower() if key == "log_level" else str(value)
        out.append((key, value, text, cfg.origin(key)))
    return out

