"""The CLI's edge: how a verb's failure becomes one line on stderr (exit 1), and how the
duration and date flags are read (exit 2 for a bad one)."""
import datetime
import functools
import sqlite3
import time

import click

from . import config as config_mod
from .errors import RelayError


def handle_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RelayError as e:
            raise click.ClickException(str(e)) from None
        except OSError as e:
            where = f" ({e.filename})" if e.filename else ""
            raise click.ClickException(f"{e.strerror or e}{where}") from None
        except sqlite3.Error as e:
            raise click.ClickException(f"ledger error: {e} (is another process holding the ledger locked?)") from None
    return wrapper


def duration(value, what):
    try:
        return config_mod.parse_duration(value)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint=what) from None


def moment(value, what):
    """An instant: ISO date/time (UTC) or a duration meaning that long ago."""
    if value is None:
        return None
    try:
        return time.time() - config_mod.parse_duration(value)
    except ValueError:
        pass
    try:
        dt = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither a date (2026-11-30, 2026-11-30T10:00) "
                                 "nor a duration (90s, 15m, 12h, 7d)", param_hint=what) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=datetime.timezone.utc)
    return dt.timestamp()
