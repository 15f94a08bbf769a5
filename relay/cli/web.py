"""`relay web`: the team and its archive in a browser, and /metrics. The server is in relay/web/,
which needs the `web` extra; no other verb imports it."""
import importlib
import os

import click

from relay.cli.context import pass_ctx
from relay.errors import RelayError
from relay.arguments import agent_name, checked, handle_errors
from relay.terminal import echo

INSTALL = ("relay web needs the web extra (starlette, uvicorn, jinja2, prometheus-client), which is not "
           "installed: pip install 'agent-outbox-relay[web]' (from a checkout: pip install '.[web]')")
NICE = 10       # relay web's CPU priority below the daemon's: a web view under load slows itself, not delivery
WEB_PACKAGES = ("starlette", "uvicorn", "jinja2", "markupsafe", "prometheus_client", "anyio", "h11", "click")


def server_module():
    """relay.web.server; RelayError saying how to install the extra when a package of it is missing."""
    try:
        importlib.import_module("relay.web.metrics")    # the Site imports it late: its prometheus-client too
        return importlib.import_module("relay.web.server")
    except ImportError as e:
        if (e.name or "").split(".")[0] not in WEB_PACKAGES:
            raise
        raise RelayError(INSTALL) from None


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="The address to listen on (another than 127.0.0.1 shows the project to that network; the "
                   "token is still needed).")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="The port to listen on; 0: a free one.")
@click.option("--compose", "compose", is_flag=True,
              help="Let the person at the browser send messages, as the overseer agent (--as).")
@click.option("--as", "overseer", default="Human", show_default=True, callback=checked(agent_name),
              help="With --compose: the agent a person sends as (declared like any agent).")
@pass_ctx
@handle_errors
def web(ctx, host, port, compose, overseer):
    """Serve the project in a browser (Overview live, Messages, a thread, a message with its original,
    Agents) and /metrics for Prometheus; read-only unless --compose. Prints its address, with a
    fresh token, once: every page needs it."""
    server = server_module()
    if not ctx.layout.ledger.exists():
        raise RelayError(f"no ledger at {ctx.layout.ledger}: run `relay init` (or `relay run`) in the project first")
    try:
        run = server.Server(ctx.cfg, host=host, port=port, compose=overseer if compose else None)
    except OSError as e:
        raise RelayError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    echo(f"relay web: {run.url}")
    echo("(read-only; " if not compose else f"(compose on, sending as {overseer}; ", nl=False)
    echo("open the address above: the token in it is needed by every page and by /metrics; Ctrl-C stops)")
    try:
        os.nice(NICE)
    except OSError:         # not allowed here: served at the priority it has
        pass
    run.run()


COMMANDS = [web]
