"""The operator's set-up verbs: `relay config` (the configuration in force and where each value
came from) and `relay service` (a systemd unit or launchd property list for this project, with
this installation's absolute path)."""
import click

from relay import config as config_mod
from relay.operator import units, views
from relay.cli.context import out_json, pass_ctx
from relay.arguments import handle_errors
from relay.terminal import echo


@click.command("config")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
@handle_errors
def config_(ctx, as_json):
    """The configuration in force, and where each value came from (default, relay.toml, env, flag).
    A key that was not taken (misspelt, a bad value) is listed after them with why."""
    cfg = ctx.cfg
    rows = config_mod.describe(cfg)
    if as_json:         # (JSON escapes control characters itself)
        out_json({"values": {key: {"value": value, "text": text, "from": origin} for key, value, text, origin in rows},
                  "warnings": list(cfg.warnings),
                  "problems": [{"key": key, "problem": problem} for key, problem in cfg.rejected]})
        return
    # relay.toml lies where agents can write: no control character in it reaches the terminal
    rows = [(key, value, views.plain(text), views.plain(origin)) for key, value, text, origin in rows]
    width = max(len(key) for key, *_ in rows)
    text_width = min(40, max(len(text) for _, _, text, _ in rows))
    for key, _, text, origin in rows:
        echo(f"{key:<{width}}  {text:<{text_width}}  ({origin})")
    for key, problem in cfg.rejected:
        echo(f"{views.plain(key):<{width}}  NOT TAKEN: {views.plain(problem)}; ignored (relay run refuses to start on it)")


@click.command()
@click.argument("manager", type=click.Choice(["systemd", "launchd"]))
@click.option("--user", is_flag=True, help="A unit of the user's own service manager (systemd --user, a "
              "LaunchAgent); without it, a system unit (a LaunchDaemon) that runs as the current user.")
@pass_ctx
@handle_errors
def service(ctx, manager, user):
    """Print a systemd unit or launchd property list that runs relay for this project, with this
    installation's absolute path; where to save it goes to stderr."""
    root = ctx.cfg.root
    argv = units.command()
    text = units.systemd(argv, root, user) if manager == "systemd" else units.launchd(argv, root, user)
    echo(text, nl=False)
    echo(units.install_hint(manager, root, user), err=True)


@click.group()
def federation():
    """The federation's set-up: what the Redis server must hold for each node."""


def _team(ctx, node, team):
    """The team (--team, else the [federation] section's), both names checked."""
    from relay.config.federation import NAME, NAME_RULE
    if team is None:
        fed = ctx.cfg.federation if ctx.cfg is not None else None
        if fed is None:
            raise click.UsageError("no [federation] section here: give --team")
        team = fed.team
    for value, what in ((node, "NODE"), (team, "--team")):
        if not NAME.match(value):
            raise click.BadParameter(f"{value!r} is not a valid name ({NAME_RULE})", param_hint=what)
    return team


@federation.command("acl")
@click.argument("node")
@click.option("--team", help="The team (default: the [federation] section's).")
@click.option("--password", help="The node's password (default: a new random one).")
@click.option("--save/--no-save", default=True, show_default=True,
              help="Also print ACL SAVE, which keeps the users in the server's aclfile across restarts.")
@pass_ctx
@handle_errors
def federation_acl(ctx, node, team, password, save):
    """Print the ACL SETUSER line that gives NODE least privilege on the team's keys: it writes
    only its own directory entry and streams, and reads the other nodes' entries and what is
    sent to it. Run the line with redis-cli as the server's admin, one user per node; the URL
    that node uses goes to stderr."""
    import secrets

    from relay.federation.keys import SAVE, acl, registration
    team = _team(ctx, node, team)
    if password is not None and (not password or not password.isprintable() or any(c.isspace() for c in password)):
        raise click.BadParameter("a password of printable characters without spaces (no control or format "
                                 "character)", param_hint="--password")
    secret = password or secrets.token_urlsafe(24)
    echo(acl(team, node, secret))
    echo(registration(team, node))      # the team's registry, which no node may write
    if save:
        echo(SAVE)
    user = f"relay-{team}-{node}"
    encoded = __import__("urllib.parse").parse.quote(secret, safe="")
    echo(f"# node {node} then uses: RELAY_FEDERATION_URL='redis://{user}:{encoded}@<redis-host>:6379/0' "
         f"(or the rediss://, redis+sentinel:// or redis+cluster:// form with the same user and password; "
         f"and node = \"{node}\" in its [federation] section)", err=True)



@federation.command("retire")
@click.argument("node")
@click.option("--team", help="The team (default: the [federation] section's).")
@pass_ctx
@handle_errors
def federation_retire(ctx, node, team):
    """Print the redis-cli line that releases the agent names of NODE, a node gone for good: its
    entry then lists nothing, and each name goes to the node that lists it. A node merely stopped,
    or whose entry the server lost, keeps its names until it announces again."""
    from relay.federation.keys import retire
    team = _team(ctx, node, team)
    echo(retire(team, node))


def _agent_name(name):
    """An agent NAME as a claim names it: a valid agent name, none of relay's own."""
    from relay.files.layout import valid_agent
    from relay.names import reserved
    if not valid_agent(name) or reserved(name):
        raise click.BadParameter(f"{name!r} is not an agent name" + (f" ({reserved(name)} is relay's own)"
                                                                      if reserved(name) else ""), param_hint="NAME")
    return name


@federation.command("claim-grant")
@click.argument("name")
@click.argument("node")
@click.option("--team", help="The team (default: the [federation] section's).")
@pass_ctx
@handle_errors
def federation_claim_grant(ctx, name, node, team):
    """Print the redis-cli line that gives the agent NAME (in every case) to NODE, whoever claimed
    it: the team routes NAME to NODE once NODE lists it, within seconds."""
    from relay.federation.keys import claim_grant
    team = _team(ctx, node, team)
    echo(claim_grant(team, _agent_name(name), node))


@federation.command("claim-free")
@click.argument("name")
@click.option("--team", help="The team (default: the [federation] section's).")
@pass_ctx
@handle_errors
def federation_claim_free(ctx, name, team):
    """Print the redis-cli line that frees the claim on the agent NAME (in every case): the next
    node to announce NAME claims it."""
    from relay.federation.keys import claim_free
    team = _team(ctx, "n", team)
    echo(claim_free(team, _agent_name(name)))


COMMANDS = [config_, service, federation]
