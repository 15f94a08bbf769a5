"""`relay hook`: the command Claude Code runs for its hook events (`relay hook claude`), and the
settings that make it run it (`relay hook install claude`, `relay hook uninstall claude`). What
the hook answers is in agent/claude_hooks.py; the settings file in agent/claude_settings.py."""
import os
import sys

import click

from relay.agent import claude_hooks, claude_settings
from relay.agent.project import Project, check_known
from relay.cli.context import pass_ctx
from relay.arguments import acting, handle_errors, sender_name
from relay.terminal import echo

CLIENTS = click.Choice(["claude"])


@click.group()
def hook():
    """Hooks of the agents' clients: Claude Code runs `relay hook claude` at each of its hook
    events; `relay hook install claude` writes the settings that make it."""


@hook.command("claude")
@click.option("--agent", help="The agent the session is (default: RELAY_AGENT).")
@pass_ctx
def claude(ctx, agent):
    """Answer one Claude Code hook event (its JSON on standard input, the answer's on standard
    output): the agent's mail as context at SessionStart, UserPromptSubmit and PostToolUse, and
    a stop held while mail the session has not seen waits (Stop, SubagentStop). Always exits 0:
    a failure of relay's lets the session go on and is logged in the state directory's
    hooks.log."""
    env = dict(os.environ)
    if ctx.root:
        env["RELAY_ROOT"] = str(ctx.root)
    if ctx.state_dir:
        env["RELAY_STATE_DIR"] = str(ctx.state_dir)
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
    out, err = claude_hooks.run(data, agent, env)
    if out:
        click.echo(out, nl=False)
    if err:
        click.echo(err, nl=False, err=True)


@hook.command("install")
@click.argument("client", type=CLIENTS)
@click.option("--agent", callback=acting(sender_name, "--agent NAME", required=False),
              help="The agent the sessions are (default: RELAY_AGENT; with --shared, none: each session's "
                   "RELAY_AGENT then).")
@click.option("--shared", is_flag=True, help=f"Write {claude_settings.SHARED} (committed, read by everyone's "
                                              f"sessions) instead of {claude_settings.LOCAL}.")
@pass_ctx
@handle_errors
def install(ctx, client, agent, shared):
    """Write relay's hooks into the project's Claude Code settings (.claude/settings.local.json),
    merged with what is there: every other hook is kept; run again, nothing changes."""
    project = Project(ctx.root, ctx.state_dir)
    try:
        if agent is not None:
            check_known(agent, project.agents(), "agent")
        elif not shared:
            raise click.UsageError("name the agent: --agent NAME, or set RELAY_AGENT=NAME (with --shared it may "
                                   "be left to each session's RELAY_AGENT)")
        path, done = claude_settings.install(project.config.root, agent, shared)
    finally:
        project.close()
    who = agent or "each session's RELAY_AGENT"
    echo({"installed": f"installed relay's Claude Code hooks for {who} in {path}",
          "updated": f"updated relay's Claude Code hooks for {who} in {path}",
          "unchanged": f"relay's Claude Code hooks for {who} in {path} are up to date"}[done])


@hook.command("uninstall")
@click.argument("client", type=CLIENTS)
@click.option("--agent", help="Take out only the hooks `relay hook install claude --agent NAME` writes (this "
                              "relay's, for that agent); without it, every relay hook of the file.")
@click.option("--shared", is_flag=True, help=f"From {claude_settings.SHARED} instead of {claude_settings.LOCAL}.")
@pass_ctx
@handle_errors
def uninstall(ctx, client, agent, shared):
    """Take relay's hooks out of the project's Claude Code settings, and nothing else: with
    --agent, only those an install for that agent writes; without it, every relay hook."""
    path, removed = claude_settings.uninstall(ctx.cfg.root, shared, agent)
    whose = f" for {agent}" if agent else ""
    echo(f"took {removed} relay hook{'s' if removed != 1 else ''}{whose} out of {path}" if removed
         else f"no relay hook{whose} in {path}")


COMMANDS = [hook]
