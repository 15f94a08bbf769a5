"""Operator commands, recorded and idempotent. Each run of `relay retry`, `expire`, `ping` and
`archive-agent` is kept in the ledger's commands table: its id, verb, arguments, actor, time and
result. Given `--command-id ID` again, the first result is printed again and nothing changes
("existing"); an id first used for another verb or other arguments is refused. A command whose
first run never finished (killed) runs again under its id: each of these verbs is harmless to
repeat. Two processes given the same id at once do not both run it: while one runs a command
under an id it holds commands.lock, and the other waits for it, then prints its result. Without
an id the command gets one of its own and is recorded the same way."""
import dataclasses
import time

import orjson

from relay.errors import InvalidName, RelayError
from relay.ids import IdGenerator
from relay.files.lock import exclusive
from relay.core.message import iso
from relay.ledger.rows import BadRow

MAX_ID = 200
WAIT = 30.0         # seconds a command waits for another process running one under an id


@dataclasses.dataclass
class Result:
    """What a command printed: lines for stdout, errors for stderr, its exit code."""
    lines: list = dataclasses.field(default_factory=list)
    errors: list = dataclasses.field(default_factory=list)
    code: int = 0
    id: str = None
    existing: bool = False

    def to_json(self):
        return orjson.dumps({"lines": self.lines, "errors": self.errors, "code": self.code}).decode()


def check_id(cid):
    """A command id: 1 to 200 printable characters."""
    if not cid or len(cid) > MAX_ID or any(c < " " or c == "\x7f" for c in cid):
        raise InvalidName(f"invalid command id {cid[:MAX_ID]!r}: give 1 to {MAX_ID} printable characters")
    return cid


def run(ledger, verb, arguments, command_id, action, actor, now=None, lock=None, wait=WAIT):
    """Run `action()` (which returns a Result or raises RelayError) once per command id and
    record it; the same id again returns the first Result, marked existing. With an id, the
    file `lock` (layout.command_lock) is held while it runs: another process given the same id
    meanwhile waits for it up to `wait` seconds, then finds its result (or is refused)."""
    now = time.time() if now is None else now
    args = orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()
    if command_id is None:
        return _run(ledger, verb, args, None, action, actor, now)
    check_id(command_id)
    if lock is None:
        return _run(ledger, verb, args, command_id, action, actor, now)
    busy = (f"command id {command_id!r} is being run by another process, or another operator command is; "
            "run it again when that one has finished (it then prints the first result)")
    with exclusive(lock, wait, busy):
        return _run(ledger, verb, args, command_id, action, actor, now)


def _run(ledger, verb, args, command_id, action, actor, now):
    if command_id is not None:
        first = ledger.operations.begin_command(command_id, verb, args, actor, now)
        bad = BadRow.of(first, "commands") if first is not None else None
        if bad is not None:
            raise RelayError(f"{bad}: command id {command_id!r} cannot be checked; give this command a new id")
        if first is not None:
            if (first["verb"], first["arguments"]) != (verb, args):
                raise RelayError(f"command id {command_id!r} was first used for `relay {first['verb']}` with "
                                 f"{first['arguments']}; give this command a new id")
            if first["result"] is not None:
                return existing(first)
    cid = command_id or f"auto-{IdGenerator().new(now)}"
    try:
        result = action()
    except RelayError as e:
        result = Result(errors=[str(e)], code=1)
    result.id = cid
    ledger.operations.finish_command(cid, verb, args, actor, now, result.to_json())
    return result


def existing(row):
    try:
        doc = orjson.loads(row["result"])
        first = Result(list(doc["lines"]), list(doc["errors"]), int(doc["code"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        first = Result(errors=[f"the recorded result is unreadable: {row['result']!r:.200}"], code=1)
    at = iso(row["at"]) if isinstance(row["at"], (int, float)) else row["at"]
    first.lines.insert(0, f"command {row['id']}: existing (first run {at} by {row['actor']}); nothing changed. "
                          "Its result then:")
    first.id, first.existing = row["id"], True
    return first
