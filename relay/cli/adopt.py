"""`relay adopt`: write (or update in place) an agent's relay instructions in a file it reads.
The text and the file handling are in adopt.py."""
import click

from relay.agent import adopt as adopt_mod, claude_settings
from relay.agent.instructions import command
from relay.cli.context import pass_ctx
from relay.errors import RelayError
from relay.arguments import acting, handle_errors, sender_name
from relay.terminal import echo


@click.command()
@click.argument("agent", required=False, callback=acting(sender_name, "AGENT"))
@click.option("--file", "file_", type=click.Path(dir_okay=False),
              help=f"The instructions file, relative to the project root and inside it, never through a "
                   f"symbolic link (default {adopt_mod.DEFAULT_FILE}; CLAUDE.md is a common choice).")
@click.option("--create", is_flag=True, help="AGENT is new on purpose: create its outbox and inbox.")
@click.option("--claude-hooks", is_flag=True,
              help="Also install relay's Claude Code hooks for AGENT (relay hook install claude --agent AGENT).")
@pass_ctx
@handle_errors
def adopt(ctx, agent, file_, create, claude_hooks):
    """Put AGENT (default: RELAY_AGENT) in the relay instructions of AGENTS.md: one marked block
    per file (who reads it and how each knows its name, the others, how to send, read, wait,
    search and reply, by shell, Python and MCP, with relay's absolute path where it is not on
    PATH); run again to update it in place. Text outside the block is never changed."""
    cfg = ctx.cfg
    layout = ctx.layout
    if not layout.state.is_dir():
        raise RelayError(f"no relay state directory at {layout.state}: run `relay init` in the project first")
    path = adopt_mod.target(cfg.root, cfg.state_dir, file_)
    try:
        done = adopt_mod.adopt(layout, cfg.agents, agent, path, create=create, root=cfg.root)
    finally:
        layout.close()
    echo({"added": f"added the relay block for {agent} to {path}",
                "updated": f"updated the relay block for {agent} in {path}",
                "unchanged": f"the relay block for {agent} in {path} is up to date"}[done])
    if claude_hooks:
        where, done = claude_settings.install(cfg.root, agent)
        echo(f"relay's Claude Code hooks for {agent} in {where}: {done}")
    else:
        echo(f"In Claude Code, `{command()} hook install claude --agent {agent}` puts {agent}'s new mail into its "
             "sessions and holds a stop while mail waits (docs/agents.md, \"Claude Code hooks\").")


COMMANDS = [adopt]
