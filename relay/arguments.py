"""What a user passes, checked at the edge (the CLI's verbs, and the MCP server and web pages
that share their checks): agent names are checked before a verb touches anything, a verb's
failure becomes one line on stderr (exit 1), and the duration and date flags are read (exit 2 for
a bad one): every duration flag takes `90s`, `15m`, `12h`, `7d`, `250ms` or a bare number of seconds."""
import datetime
import errno
import functools
import os
import sqlite3
import sys
import time

import click

from relay import config as config_mod
from relay import names
from relay.config import AGENT_NAME, AGENT_NAME_RULE, AGENT_VARIABLE, SYSTEM, default_agent
from relay.errors import FREE_SPACE, InvalidName, LedgerCorrupt, RelayError, sqlite_cause


def agent_name(name, where="agent"):
    """`name` when it is an agent name (never a path: no `/`, no leading `.`); InvalidName else."""
    if not AGENT_NAME.match(name):
        raise InvalidName(f"invalid agent name {name!r} ({where}): agent names match {AGENT_NAME_RULE}")
    return name


def sender_name(name, where="sender"):
    """An agent that may have an outbox: any agent name but a reserved one (System, Broadcast,
    `*`, in any case: names.py)."""
    agent_name(name, where)
    return names.agent(name, where)


def recipient_names(value, where="recipients"):
    """A TO value: NAME[,NAME...], where a name may also be `*`; a reserved name only as relay
    spells it (System, Broadcast, `*`)."""
    given = [n.strip() for n in value.split(",") if n.strip()]
    if not given:
        raise InvalidName(f"no recipient in {value!r} ({where}): give NAME[,NAME...], '*' or {SYSTEM}")
    for name in given:
        if name != "*":
            agent_name(name, where)
        problem = names.address_problem(name)
        if problem is not None:
            raise InvalidName(f"{problem} ({where})")
    return value


def checked(check):
    """A click callback that runs `check(value, where)` on a parameter's value (each value of
    a repeated option) while the command line is read, before the verb runs; a refusal is one
    line and exit 1, like every other error."""
    def callback(ctx, param, value):
        where = param.opts[0] if param.param_type_name == "option" else param.human_readable_name
        try:
            for v in value if isinstance(value, tuple) else [value]:
                if v is not None:
                    check(v, where)
        except RelayError as e:
            raise click.ClickException(str(e)) from None
        return value
    return callback


def acting(check, flag, required=True):
    """A click callback for the agent a verb acts as: the name given, else RELAY_AGENT's (an empty
    one is none), checked like `checked(check)` does; when there is neither and the verb needs an
    agent, a usage error (exit 2) that says both ways to name one (`flag`: how the verb takes it)."""
    def callback(ctx, param, value):
        value = value or default_agent()
        if value is None:
            if required:
                raise click.UsageError(f"name the agent: {flag}, or set {AGENT_VARIABLE}=NAME")
            return None
        return checked(check)(ctx, param, value)
    return callback


def explain(error, ledger=None):
    """The one line a failure becomes: what happened and, where it helps, what to do.
    `ledger`: the ledger's path, when known."""
    if isinstance(error, RelayError):
        return str(error)
    if isinstance(error, OSError):
        where = f" ({error.filename})" if error.filename else ""
        what = f"{error.strerror or error}{where}"
        if error.errno == errno.ENOSPC:
            return f"the disk is full: {what}; {FREE_SPACE}"
        if error.errno == errno.EDQUOT:
            return f"the disk quota is used up: {what}; {FREE_SPACE} (or raise the quota)"
        return what
    cause = sqlite_cause(error)
    if cause == "full":
        return f"the disk holding {ledger or 'the ledger'} (or the temporary directory) is full ({error}); {FREE_SPACE}"
    if cause == "corrupt":
        return str(LedgerCorrupt(ledger or "ledger.sqlite", error))
    if cause == "locked":
        return f"ledger error: {error} (is another process holding the ledger locked?)"
    return f"ledger error: {error}"


EXIT_PIPE = 141         # 128 + SIGPIPE: what a shell reports for a command whose reader went away


def quiet_pipe():
    """The reader of standard output went away (`relay audit | head`): end at once and quietly,
    as a command killed by SIGPIPE would, without a traceback or a line about it. Standard
    output is pointed at /dev/null first, so that the interpreter's last flush fails no more."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):     # no real descriptor (a test's capture)
        pass
    sys.exit(EXIT_PIPE)


def handle_errors(fn):
    """A verb's RelayError, OSError or sqlite3 error leaves as one line on stderr and exit 1; a
    closed pipe on standard output ends it quietly (EXIT_PIPE)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BrokenPipeError:
            quiet_pipe()
        except (RelayError, OSError, sqlite3.Error) as e:
            raise click.ClickException(explain(e, _ledger_path(args))) from None
        except UnicodeError as e:
            raise click.ClickException(f"{e.object[e.start:e.end]!r} in an argument or on standard input is "
                                       "not valid UTF-8; relay takes names, ids and text as UTF-8") from None
    return wrapper


def _ledger_path(args):
    """The ledger's path from a verb's Context (its first argument), if it can tell."""
    try:
        return str(args[0].layout.ledger)
    except (IndexError, AttributeError, RelayError, OSError):
        return None


def seconds(value):
    """A duration given on the command line: `90s`, `15m`, `12h`, `7d`, `250ms`, or a bare number
    of seconds (`600`, `0.5`), as timeout(1) and sleep(1) take it (relay.toml and RELAY_<KEY>
    need the unit: config.parse_duration). ValueError when it is neither."""
    text = str(value).strip()
    if text.replace(".", "", 1).isdigit():
        return float(text)
    return config_mod.parse_duration(text)


def duration(value, what):
    """A duration flag's seconds (`seconds`); exit 2 naming the flag when it is none."""
    try:
        return seconds(value)
    except ValueError as e:
        raise click.BadParameter(f"{e} (or a bare number of seconds)", param_hint=what) from None


def setting(value, what):
    """A flag that overrides a duration key of the configuration (run --settle, --retention):
    as `duration` reads it, written with its unit for the configuration to take."""
    return None if value is None else f"{duration(value, what):f}s"


def moment(value, what):
    """An instant: ISO date/time (UTC) or a duration meaning that long ago (a bare number: seconds)."""
    if value is None:
        return None
    try:
        return time.time() - seconds(value)
    except ValueError:
        pass
    try:
        dt = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither a date (2026-11-30, 2026-11-30T10:00) "
                                 "nor a duration (90s, 15m, 12h, 7d, or a number of seconds)", param_hint=what) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=datetime.timezone.utc)
    return dt.timestamp()
