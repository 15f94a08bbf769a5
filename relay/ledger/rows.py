"""Which stored rows this build can read. A ledger row may hold what this build cannot use: a
status it does not know, a time that is no number, a malformed id or agent name, a path outside
its place in the state directory (a ledger from another build, an edit by hand, damage). Such a
row is never fatal: `unreadable(row)` finds its first bad column, a `BadRow` names every one of
them in one line with the row's id, and `sift()` passes on the readable rows of a query while it collects the
others, so that every verb names them and goes on without them. No path such a row holds is ever
followed. The checks know the columns of the messages, events, deliveries and agents tables, and
of those flow control and the operator's commands keep: sheds, commands, pings, archived_agents
and attestations; the hash chain's checkpoints; the agent registry and the team state."""
import dataclasses
import re

import orjson

from relay.config import AGENT_NAME
from relay.ledger.schema import AGENT_STATES, REASONS
from relay.files.fs import Unsafe, split
from relay.ids import ALPHABET
from relay.times import END, FIRST, is_time
from relay.ledger.schema import STATUSES

_ID = re.compile(f"[{ALPHABET}]{{26}}\\Z")       # layout.valid_id, as one regular expression
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")


def _number(v):
    return isinstance(v, (int, float))


# The times a stored row may hold: seconds within the calendar years 1 to 9999 (relay/times.py).
_time = is_time


def _maybe(check):
    fast = _OPTIONAL.get(check)         # the common checks, written out: one call per column
    return fast if fast is not None else (lambda v: v is None or check(v))


def _count(v):
    return isinstance(v, int) and v >= 0


def _text(v):
    return isinstance(v, str)


def _id(v):
    return isinstance(v, str) and _ID.match(v) is not None


def _agent(v):
    return isinstance(v, str) and AGENT_NAME.match(v) is not None


def _one_of(*values):
    return lambda v: isinstance(v, str) and v in values


def _command_id(v):
    """commands.check_id's rule: 1 to 200 printable characters."""
    return isinstance(v, str) and 0 < len(v) <= 200 and not any(c < " " or c == "\x7f" for c in v)


def _file_name(v):
    return isinstance(v, str) and v not in ("", ".", "..") and "/" not in v and "\0" not in v


def _under(top):
    """A stored relative path that lies under `top`/ inside the state directory."""
    def check(v):
        if not isinstance(v, str):
            return False
        try:
            parts = split(v)
        except Unsafe:
            return False
        return len(parts) >= 2 and parts[0] == top
    return check


def _json(kind):
    def check(v):
        if not isinstance(v, str):
            return False
        try:
            value = orjson.loads(v)
        except orjson.JSONDecodeError:
            return False
        return isinstance(value, kind) and (kind is not list or all(isinstance(x, str) for x in value))
    return check


def _sha256(v):
    return isinstance(v, str) and _SHA256.match(v) is not None


_OPTIONAL = {
    _number: lambda v: v is None or isinstance(v, (int, float)),
    _time: lambda v: v is None or isinstance(v, (int, float)) and FIRST <= v < END,
    _count: lambda v: v is None or isinstance(v, int) and v >= 0,
    _text: lambda v: v is None or isinstance(v, str),
    _id: lambda v: v is None or isinstance(v, str) and _ID.match(v) is not None,
    _agent: lambda v: v is None or isinstance(v, str) and AGENT_NAME.match(v) is not None,
    _sha256: lambda v: v is None or isinstance(v, str) and _SHA256.match(v) is not None,
}


STATE_KEY_RULE = "[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}"     # a team state key (state.py)
STATE_KEY = re.compile(STATE_KEY_RULE + r"\Z")

CHECKS = {
    "messages": {
        # "?": the sender of an entry another node sent that could not be read (federation/receiver.py)
        "id": _id, "sender": lambda v: v == "?" or isinstance(v, str) and AGENT_NAME.match(v) is not None, "name": _file_name, "status": lambda v: v in STATUSES,
        "spooled": lambda v: v in (0, 1), "recipients": _maybe(_json(list)), "kind": _maybe(_text),
        "thread": _maybe(_text), "subject": _maybe(_text), "body": _maybe(_text), "headers": _maybe(_json(dict)),
        "size": _maybe(_count), "sha256": _maybe(_sha256), "sent_at": _maybe(_time),
        "discovered_at": _time, "claimed_at": _maybe(_time), "delivered_at": _maybe(_time),
        "archived_at": _maybe(_time), "failed_at": _maybe(_time), "retries": _count, "attempts": _count,
        "interrupted": _count, "next_attempt_at": _time, "failing_since": _maybe(_time),
        "error": _maybe(_text), "archive_path": _maybe(_under("archive")), "failed_path": _maybe(_under("failed")),
        "content_type": _maybe(_text), "max_retries": _maybe(_count),
    },
    "events": {
        "seq": _count, "message_id": _maybe(_id), "at": _time, "event": _text, "detail": _maybe(_text),
        "actor": _text, "sender": _maybe(_agent), "recipients": _maybe(_json(list)),
    },
    "deliveries": {
        "message_id": _id, "recipient": _agent, "delivered_at": _time, "size": _maybe(_count),
        "sha256": _maybe(_sha256),
    },
    "agents": {"name": _agent, "first_seen": _time, "last_seen": _time},
    "sheds": {
        "message_id": _id, "recipient": lambda v: v == "*" or _agent(v), "sender": _agent,
        "reason": _one_of(*REASONS), "limit_value": _maybe(_number), "observed": _maybe(_number), "at": _time,
        "released_at": _maybe(_time),
    },
    "commands": {
        "id": _command_id, "verb": _one_of("retry", "expire", "ping", "archive-agent"), "arguments": _json(dict),
        "actor": _text, "at": _time, "result": _maybe(_json(dict)),
    },
    "pings": {"id": _id, "agent": _agent, "sent_at": _time, "actor": _text},
    "bounces": {
        "message_id": _id, "recipients": _json(list), "id": _id, "sender": _agent, "reason": _text, "at": _time,
        "emitted_at": _maybe(_time),
    },
    "checkpoints": {"seq": _count, "at": _time, "upto": _count, "head": _sha256, "removed": _count},
    "archived_agents": {"name": _agent, "at": _time, "actor": _text},
    "agent_registry": {
        "name": _agent, "state": _one_of(*AGENT_STATES), "metadata": _json(dict), "spawned_at": _maybe(_time),
        "spawned_by": _maybe(_agent), "spawn_id": _maybe(_id), "released_at": _maybe(_time),
        "released_by": _maybe(_agent), "release_id": _maybe(_id), "updated_at": _time,
    },
    "attestations": {
        "seq": _count, "at": _time, "pid": _count, "host": _text, "version": _text, "mode": _one_of("daemon", "once"),
        "event": _one_of("start", "reload"), "durability": _one_of("full", "normal"), "journal_mode": _text,
        "synchronous": _one_of("OFF", "NORMAL", "FULL", "EXTRA", "?"), "busy_timeout_ms": _count,
        "foreign_keys": lambda v: v in (0, 1),
    },
    "team_state": {
        "key": lambda v: isinstance(v, str) and STATE_KEY.match(v) is not None,
        "value": lambda v: v is None or isinstance(v, str),
        "version": lambda v: isinstance(v, int) and v >= 0,
        "updated_at": is_time,
        "updated_by": lambda v: isinstance(v, str),
    },
}
KEYS = {"messages": "id", "events": "seq", "deliveries": "message_id", "agents": "name", "sheds": "message_id",
        "commands": "id", "pings": "id", "archived_agents": "name", "attestations": "seq", "checkpoints": "seq",
        "bounces": "id", "agent_registry": "name", "team_state": "key"}


def unreadable(row, table="messages", need=()):
    """(column, value) of the first column of `row` (any of `table`'s columns it holds) that
    this build cannot read, or None. Columns in `need` must also not be NULL."""
    checks = CHECKS[table]
    items = row.items() if isinstance(row, dict) else zip(row.keys(), row)
    if not need:
        for column, value in items:
            check = checks.get(column)
            if check is not None and not check(value):
                return column, value
        return None
    for column, value in items:
        check = checks.get(column)
        if check is not None and not check(value) or value is None and column in need:
            return column, value
    return None


def every_unreadable(row, table="messages", need=()):
    """[(column, value)] of every column of `row` this build cannot read (as unreadable())."""
    checks = CHECKS[table]
    items = row.items() if isinstance(row, dict) else zip(row.keys(), row)
    return [(column, value) for column, value in items
            if (check := checks.get(column)) is not None and not check(value) or value is None and column in need]


def _clip(value):
    """A stored value as one short line: its repr (control characters escaped), cut at 60."""
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"


@dataclasses.dataclass(frozen=True)
class BadRow:
    """A stored row this build cannot read: which (table and key) and where: its first bad
    (column, value), and `more` of them when several columns are bad."""
    table: str
    key: object
    column: str
    value: object
    more: tuple = ()

    @classmethod
    def of(cls, row, table="messages", need=()):
        """The BadRow of `row`, or None when this build can read it."""
        if unreadable(row, table, need) is None:     # the common case: one pass, stopping at the first
            return None
        first, *more = every_unreadable(row, table, need)
        key = KEYS[table]
        return cls(table, row[key] if key in row.keys() else None, *first, more=tuple(more))

    @property
    def columns(self):
        """Every (column, value) of the row this build cannot read."""
        return ((self.column, self.value), *self.more)

    def __str__(self):
        key = _clip(self.key)
        what = f"message {key}" if self.table == "messages" else f"{self.table} row {key}"
        if self.table == "deliveries":
            what = f"delivery of message {key}"
        held = [f"column {column} holds {_clip(value)}" for column, value in self.columns]
        held = held[0] if len(held) == 1 else ", ".join(held[:-1]) + " and " + held[-1]
        return f"ledger {what}: {held}, which this relay cannot read; skipped"


def sift(rows, bad, table="messages"):
    """The rows this build can read, in order; each other one is appended to `bad` as a BadRow."""
    for row in rows:
        problem = BadRow.of(row, table)
        if problem is None:
            yield row
        else:
            bad.append(problem)


def unreadable_rows(rows, table):
    """The BadRows among `rows` (of `table`)."""
    for row in rows:
        problem = BadRow.of(row, table)
        if problem is not None:
            yield problem
