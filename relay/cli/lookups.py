"""Lookups for people: `relay commands` (the operator commands recorded in the ledger, newest
first, or one by its id) and what `relay show --path` needs to read the outbox path it is given.
Both open the ledger read-only."""
import os

import click
import orjson

from relay.cli.context import one_row, out_json, pass_ctx
from relay.config import AGENT_NAME, AGENT_NAME_RULE
from relay.arguments import handle_errors
from relay.ledger.history import sift
from relay.operator import views
from relay.operator.commands import check_id
from relay.terminal import echo

TABLE_LIMIT = 50        # commands in the table unless --limit says otherwise


def outbox_source(text, layout):
    """(agent, name) of the outbox path `text`: `outbox/AGENT/NAME` (relative to the state
    directory), the same after the state directory (`.relay/outbox/AGENT/NAME`, from the
    project root) or its absolute path. click.BadParameter (exit 2) naming what is wrong else."""
    def bad(why):
        return click.BadParameter(f"{text!r}: {why}; give outbox/AGENT/NAME (a file name in an agent's outbox)",
                                  param_hint="--path")
    if "\0" in text:
        raise bad("a path holds no NUL character")
    state = str(layout.state)
    if os.path.isabs(text):
        if not text.startswith(state.rstrip("/") + "/"):
            raise bad(f"not inside the state directory {state}")
        rel = text[len(state.rstrip("/")) + 1:]
    else:
        rel = text
        try:
            prefix = str(layout.state.relative_to(layout.root))
        except ValueError:          # a state directory outside the root: only its own paths
            prefix = None
        if prefix and prefix != "." and rel.startswith(prefix + "/"):
            rel = rel[len(prefix) + 1:]
    parts = rel.split("/")
    if len(parts) != 3 or parts[0] != "outbox":
        raise bad("not an outbox path")
    agent, name = parts[1], parts[2]
    if not AGENT_NAME.match(agent):
        raise bad(f"{agent!r} is no agent name ({AGENT_NAME_RULE})")
    if name in ("", ".", ".."):
        raise bad("no file name")
    return agent, name


def command_doc(row):
    """An operator command as JSON: its arguments and result as recorded (objects), its time ISO."""
    return {"id": row["id"], "verb": row["verb"], "arguments": orjson.loads(row["arguments"]),
            "actor": row["actor"], "at": views.when(row["at"]),
            "result": orjson.loads(row["result"]) if row["result"] is not None else None}


def outcome(doc):
    """A command's result in one word: ok, exit N, or unfinished (it never recorded one)."""
    result = doc["result"]
    if result is None:
        return "unfinished"
    code = result.get("code")
    return "ok" if code == 0 else f"exit {code}"


def _arguments(doc):
    return orjson.dumps(doc["arguments"], option=orjson.OPT_SORT_KEYS).decode()


@click.command()
@click.argument("command_id", required=False, metavar="[ID]")
@click.option("--verb", help="Only the commands of this verb (retry, expire, ping, archive-agent).")
@click.option("--limit", type=click.IntRange(1, 10**12), default=None,
              help=f"At most N commands (default {TABLE_LIMIT} in the table); stderr says when more were recorded.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (a list; with ID, one object).")
@pass_ctx
@handle_errors
def commands(ctx, command_id, verb, limit, as_json):
    """The operator commands recorded in the ledger (retry, expire, ping, archive-agent), newest
    first: time, id, verb, actor, result, arguments. With ID, that one and what it printed."""
    if command_id is not None:
        check_id(command_id)
        with ctx.reader() as led:
            row = one_row(led.lookups.command(command_id), "commands",
                          f"no operator command with id {command_id!r} in the ledger (relay commands lists them)")
        doc = command_doc(row)
        if as_json:
            out_json(doc)
            return
        echo(_one(doc))
        return
    if limit is None and not as_json:
        limit = TABLE_LIMIT
    bad, docs, more = [], [], False
    with ctx.reader() as led:
        for row in sift(led.lookups.recent_commands(verb), bad, "commands"):
            if limit and len(docs) == limit:
                more = True
                break
            docs.append(command_doc(row))
    for b in bad:
        echo(f"relay: {b}", err=True)
    if more:
        echo(f"relay: stopped at the limit of {limit} command(s); more were recorded (--limit N shows more)", err=True)
    if as_json:
        out_json(docs)
        return
    if not docs:
        echo("no operator commands recorded" + (f" of relay {verb}" if verb else ""))
        return
    echo(f"{'AT':<27} {'ID':<31} {'VERB':<14} {'ACTOR':<20} {'RESULT':<10} ARGUMENTS")
    for d in docs:
        echo(f"{d['at']:<27} {views.clip(d['id'], 31):<31} {views.clip(d['verb'], 14):<14} "
             f"{views.clip(d['actor'], 20):<20} {outcome(d):<10} {views.clip(_arguments(d), 80)}")


def _one(doc):
    out = [f"command {doc['id']}", f"  verb       relay {doc['verb']}", f"  arguments  {_arguments(doc)}",
           f"  actor      {doc['actor']}", f"  at         {doc['at']}", f"  result     {outcome(doc)}"]
    result = doc["result"] or {}
    for label, key in (("printed", "lines"), ("errors", "errors")):
        lines = result.get(key) or []
        lines = lines if isinstance(lines, list) else [lines]
        if lines:
            out.append(f"  {label}:")
            out += [f"    {line}" for line in lines]
    return "\n".join(out)


COMMANDS = [commands]
