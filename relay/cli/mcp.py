"""`relay mcp --agent NAME`: serve the agent's side of relay over the Model Context Protocol
(stdio). The server is in mcp_server.py, which needs the `mcp` extra; no other verb imports it."""
import importlib
import sys

import click

from relay.agent.api import Agent, Project
from relay.cli.agent import EXIT_INTERRUPTED
from relay.cli.context import pass_ctx
from relay.errors import RelayError, UnknownAgent
from relay.arguments import acting, handle_errors, sender_name

INSTALL = ("relay mcp needs the MCP SDK (the mcp package), which is not installed: pip install 'agent-outbox-relay[mcp]' "
           "(from a checkout of relay: pip install '.[mcp]')")


def server_module():
    """relay.agent.mcp_server; RelayError saying how to install the SDK when `mcp` cannot be imported."""
    try:
        return importlib.import_module("relay.agent.mcp_server")
    except ImportError as e:
        if (e.name or "").split(".")[0] not in ("mcp", "pydantic", "anyio"):
            raise
        raise RelayError(INSTALL) from None


@click.command()
@click.option("--agent", callback=acting(sender_name, "--agent NAME"),
              help="The agent this server speaks for; default: RELAY_AGENT.")
@pass_ctx
@handle_errors
def mcp(ctx, agent):
    """Serve AGENT's side of relay over MCP on stdin/stdout: the tools send, reply, inbox, wait,
    read, mark_read, search, agents, thread, reserve, release and reservations. Register it in an
    MCP client with the command
    `relay mcp --agent NAME --root /abs/project`."""
    try:
        _serve(ctx, agent)
    except KeyboardInterrupt:       # Ctrl-C before the server took SIGINT over: as after, quietly
        sys.exit(EXIT_INTERRUPTED)


def _serve(ctx, agent):
    server = server_module()
    project = Project(config=ctx.cfg)
    try:
        me = Agent(agent, project=project, role="agent (--agent)")
    except UnknownAgent as e:       # no --create here: the agent is made with relay init --agent
        project.layout.close()
        raise UnknownAgent(str(e).replace("(--create adds a new agent on purpose)",
                                          "(relay init --agent NAME adds one)")) from None
    except BaseException:
        project.layout.close()
        raise
    server.serve(me)


COMMANDS = [mcp]
