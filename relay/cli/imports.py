"""`relay import`: a team's history brought over from another relay. One source so far,
agent-relay 2.0 (`relay import agent-relay [PATH]`; operator/importer.py does the work)."""
import os
import sys
import time

import click

from relay.cli.context import out_json, pass_ctx
from relay.files.lock import wake
from relay.arguments import handle_errors
from relay.operator.importer import import_agent_relay
from relay.terminal import echo


@click.group("import")
def import_():
    """Bring a team's history over from another relay: `relay import agent-relay [PATH]`."""


@import_.command("agent-relay")
@click.argument("path", required=False)
@click.option("--dry-run", is_flag=True, help="Say what would come over; write nothing.")
@click.option("--accept-missing", is_flag=True,
              help="Import archived messages whose archive file is missing or does not match as archived "
                   "without one (their error says why), instead of leaving them out.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@pass_ctx
@handle_errors
def agent_relay(ctx, path, dry_run, accept_missing, as_json):
    """Import agent-relay's ledger (PATH: the ledger file, its .agent-relay directory, or the
    project holding it; without PATH it is looked for in the project's .agent-relay, then in
    $AGENT_RELAY_DATA_DIR, $XDG_DATA_HOME/agent-relay and ~/.agent-relay, as
    meta/file-ledger.sqlite, then meta/ledger.sqlite, and the summary says which it took),
    read-only: archived and delivered messages become archived (their files
    checked and copied into the archive), failed ones failed, pending and processing ones pending
    (delivered once by relay); agents and orchestrator state too. Run again, it changes nothing.
    Exit 1 when something was not imported (each named)."""
    cfg = ctx.cfg
    with ctx.writer() as led:
        summary = import_agent_relay(led, ctx.layout, path, time.time(), durability=cfg.durability,
                                     dry_run=dry_run, accept_missing=accept_missing, env=os.environ)
    if not dry_run and summary.became["pending"]:
        wake(ctx.layout.lock)       # a running daemon delivers them now, not at its next rescan
    if as_json:
        out_json(summary.doc())
    else:
        for line in summary.lines():
            echo(line)
    if summary.problems:
        sys.exit(1)


COMMANDS = [import_]
