"""The team state verbs: relay state get, set, delete and list. The changes are made through the
Project's and the Agent's (agent/state.py), so the shell and Python check the same things; the
reads open the ledger read-only, as every read-only verb does."""
import sys

import click

from relay.agent.api import Agent, Project
from relay.agent.state import StateEntry, check_key
from relay.cli.context import one_row, out_json, pass_ctx
from relay.arguments import acting, handle_errors, sender_name
from relay.ledger.history import sift
from relay.ledger.reservations import utc
from relay.operator import views
from relay.terminal import echo

AS_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
AS = click.option("--as", "actor", callback=acting(sender_name, "--as NAME", required=False),
                  help="The agent making the change (default: $RELAY_AGENT; with neither, the operator).")
IF_VERSION = click.option("--if-version", type=click.IntRange(1), metavar="N",
                          help="Only if the key's value now has version N (compare-and-set).")


@click.group()
def state():
    """The team state: a small durable key/value table in the ledger for a team's coordinator,
    with compare-and-set (get, set, delete, list)."""


def _changer(ctx, actor):
    """(what makes the change: an Agent when one is named, else the Project; the actor's keyword)."""
    ctx.strict = False      # an agent's verb: a mistake in relay.toml warns
    project = Project(config=ctx.cfg)
    if actor is None:
        from relay.operator.doctor import actor as operator
        return project, {"actor": operator()}
    return Agent(actor, project=project, role="agent (--as)"), {}


def _text(entry):
    return f"{entry.key}: version {entry.version}, set by {entry.updated_by} at {views.when(entry.updated_at)}"


@state.command("get")
@click.argument("key")
@AS_JSON
@pass_ctx
@handle_errors
def state_get(ctx, key, as_json):
    """Print KEY's value (--json: with its version, when and by whom it was set); exit 1 when
    the key has no value."""
    check_key(key)
    with ctx.reader() as led:
        row = led.state.get(key)
    row = one_row(row, "team_state", f"state key {key!r} has no value (relay state list shows the keys that have one)")
    entry = StateEntry.of(row)
    if as_json:
        out_json(entry.as_dict())
    else:
        echo(entry.value)


@state.command("set")
@click.argument("key")
@click.argument("value")
@IF_VERSION
@click.option("--if-absent", is_flag=True, help="Only if the key has no value now (take it, as a lock).")
@AS
@AS_JSON
@pass_ctx
@handle_errors
def state_set(ctx, key, value, if_version, if_absent, actor, as_json):
    """Set KEY to VALUE ('-': standard input), text of at most 64 KiB. With --if-absent or
    --if-version N, refused (exit 1, nothing changed, the version there and who set it named)
    when the key is not as expected: of two agents taking one key, one gets it."""
    if if_absent and if_version is not None:
        raise click.UsageError("give --if-absent or --if-version, not both")
    if value == "-":
        value = sys.stdin.read()
    who, kw = _changer(ctx, actor)
    try:
        entry = who.state_set(key, value, if_version=if_version, if_absent=if_absent, **kw)
    finally:
        who.close()
    if as_json:
        out_json(entry.as_dict())
    else:
        echo(_text(entry))


@state.command("delete")
@click.argument("key")
@IF_VERSION
@AS
@AS_JSON
@pass_ctx
@handle_errors
def state_delete(ctx, key, if_version, actor, as_json):
    """Delete KEY's value; exit 1 when it has none, or (--if-version N) when its value has
    another version now."""
    who, kw = _changer(ctx, actor)
    try:
        was = who.state_delete(key, if_version=if_version, **kw)
    finally:
        who.close()
    if as_json:
        out_json({**was.as_dict(), "deleted": True})
    else:
        echo(f"deleted {was.key} (was version {was.version}, set by {was.updated_by} at {views.when(was.updated_at)})")


@state.command("list")
@click.option("--prefix", help="Only the keys starting with this.")
@AS_JSON
@pass_ctx
@handle_errors
def state_list(ctx, prefix, as_json):
    """Every key that has a value, by key: version, when and by whom it was set, its value."""
    bad = []
    with ctx.reader() as led:
        entries = [StateEntry.of(r) for r in sift(led.state.entries(prefix), bad, "team_state")]
    for b in bad:
        echo(f"relay: {b}", err=True)
    if as_json:
        out_json([e.as_dict() for e in entries])
        return
    if not entries:
        echo("no team state" + (f" under {prefix!r}" if prefix else ""))
        return
    width = max(12, *(len(e.key) for e in entries))
    echo(f"{'KEY':<{width}} {'VERSION':>7}  {'UPDATED':<20} {'BY':<16} VALUE")
    for e in entries:
        echo(f"{e.key:<{width}} {e.version:>7}  {utc(e.updated_at):<20} {views.clip(e.updated_by, 16):<16} "
             f"{views.clip(e.value, 60)}")


COMMANDS = [state]
