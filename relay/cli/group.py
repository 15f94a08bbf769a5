"""The `relay` command: one click group (its options find the project) and the verbs of every
module of this package added to it. What the verbs share is in context.py."""
import click

from relay.version import __version__
import relay.cli.admin as admin
import relay.cli.adopt as adopt
import relay.cli.agent as agent
import relay.cli.hook as hook
import relay.cli.imports as imports
import relay.cli.inspect as inspect
import relay.cli.lookups as lookups
import relay.cli.mcp as mcp
import relay.cli.operator as operator
import relay.cli.receipts as receipts
import relay.cli.reserve as reserve
import relay.cli.run as run
import relay.cli.state as state
import relay.cli.web as web
from relay.cli.context import Context, Group

@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="relay")
@click.option("--root", type=click.Path(file_okay=False), help="Project root (env RELAY_ROOT; default: the current directory).")
@click.option("--state-dir", help="State directory, relative to the root (env RELAY_STATE_DIR; default .relay).")
@click.pass_context
def main(ctx, root, state_dir):
    """relay: deliver agents' outbox files into each other's inboxes, exactly once."""
    ctx.obj = Context(root, state_dir)



def entry():
    main(prog_name="relay")


# The verbs, each module's list (cli_mcp imports the SDK only when run).
for module in (run, agent, reserve, state, inspect, lookups, operator, admin, adopt, hook, imports, mcp, web, receipts):
    for command in module.COMMANDS:
        main.add_command(command)
