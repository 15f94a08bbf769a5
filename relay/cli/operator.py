"""The operator's commands: retry, expire, ping, archive-agent. Each is recorded in the ledger
(commands.py) and takes `--command-id ID`: the same id again prints the first result and
changes nothing. Each wakes a running daemon (SIGUSR1) when it changed something."""
import sys

import click

from relay.operator import commands, doctor as operator, roster
from relay.cli.context import out_json, pass_ctx
from relay.arguments import agent_name, checked, handle_errors
from relay.files.lock import wake
from relay.terminal import echo

COMMAND_ID = click.option("--command-id", help="An id for this command: given again, the first result is printed "
                                              "and nothing changes.")
AS_JSON = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


def _run(ctx, verb, arguments, command_id, action, as_json):
    """Run one recorded command, print its result, wake the daemon when it changed something."""
    with ctx.writer() as led:
        result = commands.run(led, verb, arguments, command_id, lambda: action(led), operator.actor(),
                              lock=ctx.layout.command_lock)
    if not result.existing and not result.code:
        wake(ctx.layout.lock)       # a running daemon looks at the ledger now, not at its next rescan
    if as_json:
        out_json({"command_id": result.id, "existing": result.existing, "lines": result.lines,
                  "errors": result.errors, "exit": result.code})
    else:
        for line in result.lines:
            echo(line)
        for line in result.errors:
            echo(line, err=True)
    if result.code:
        sys.exit(result.code)


@click.command()
@click.argument("ids", nargs=-1)
@click.option("--failed", "all_failed", is_flag=True,
              help="Every failed message, except those an operator expired.")
@COMMAND_ID
@AS_JSON
@pass_ctx
@handle_errors
def retry(ctx, ids, all_failed, command_id, as_json):
    """Put failed messages back to pending: their files go back into the flow."""
    if not ids and not all_failed:
        raise click.UsageError("name message ids, or --failed for all failed messages")
    if all_failed:
        def action(led):
            return operator.retry_failed(led, ctx.layout)
    else:
        def action(led):
            return operator.retry(led, ctx.layout, ids)
    _run(ctx, "retry", {"ids": list(ids), "failed": all_failed}, command_id, action, as_json)


@click.command()
@click.argument("message_id")
@COMMAND_ID
@AS_JSON
@pass_ctx
@handle_errors
def expire(ctx, message_id, command_id, as_json):
    """A pending or failed message will not be delivered; its file moves to failed/."""
    _run(ctx, "expire", {"id": message_id}, command_id,
         lambda led: operator.expire(led, ctx.layout, message_id), as_json)


@click.command()
@click.argument("agent", callback=checked(agent_name))
@COMMAND_ID
@AS_JSON
@pass_ctx
@handle_errors
def ping(ctx, agent, command_id, as_json):
    """Put a ping from System in AGENT's inbox; `relay queues` shows when it is read."""
    cfg = ctx.cfg
    _run(ctx, "ping", {"agent": agent}, command_id,
         lambda led: roster.ping(led, ctx.layout, agent, operator.actor(), cfg.agents, durability=cfg.durability),
         as_json)


@click.command("archive-agent")
@click.argument("name", callback=checked(agent_name))
@click.option("--undo", is_flag=True, help="Restore an archived agent.")
@COMMAND_ID
@AS_JSON
@pass_ctx
@handle_errors
def archive_agent(ctx, name, undo, command_id, as_json):
    """Retire an agent: nothing more is accepted from it or delivered to it (--undo restores it)."""
    cfg = ctx.cfg
    _run(ctx, "archive-agent", {"name": name, "undo": undo}, command_id,
         lambda led: roster.archive_agent(led, ctx.layout, name, operator.actor(), cfg.agents, undo=undo), as_json)


COMMANDS = [retry, expire, ping, archive_agent]
