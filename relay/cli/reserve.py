"""The verbs of file reservations: reserve, release, reservations (built on the Agent's, so the
shell, Python and MCP check the same things), and guard (install, uninstall, check: the git
pre-commit hook that enforces exclusive reservations)."""
import os
import sys
import time

import click

from relay.agent import guard as guard_mod
from relay.agent.api import Agent, Project
from relay.agent.leases import MAX_TTL, Reservation, left
from relay.cli.context import out_json, pass_ctx
from relay.errors import LedgerError, RelayError
from relay.arguments import checked, duration, handle_errors, sender_name
from relay.ledger.reservations import utc
from relay.terminal import echo

AGENT = click.option("--agent", envvar="RELAY_AGENT", required=True, callback=checked(sender_name),
                     help="The agent (default: $RELAY_AGENT).")
SCOPES = {"file": "the file", "tree": "and all under it", "glob": "what it matches"}


def here(ctx):
    """Where relative paths start: the current directory when it is inside the project, else
    the project root (`relay --root /abs/project reserve src` from anywhere)."""
    cwd = os.getcwd()
    return cwd if guard_mod.inside(ctx.cfg.root, [cwd]) else None


def _agent(ctx, name):
    ctx.strict = False      # an agent's verb: a mistake in relay.toml warns
    return Agent(name, project=Project(config=ctx.cfg), role="agent (--agent)")


def lease_text(r, now):
    why = f"; {r.reason}" if r.reason else ""
    return (f"{r.path} ({'exclusive' if r.exclusive else 'shared'}, {SCOPES.get(r.scope, r.scope)}) until "
            f"{utc(r.expires_at)} (in {left(r.expires_at - now)}{why})")


@click.command()
@AGENT
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@click.option("--for", "ttl", default="1h", show_default=True,
              help="How long the lease lasts (90s, 30m, 2h; at most 7d). Reserving again renews it.")
@click.option("--exclusive", is_flag=True, help="No other agent may hold an overlapping reservation; the git "
              "guard refuses their commits on these paths.")
@click.option("--reason", help="One line for the others: what you are doing.")
@click.option("--json", "as_json", is_flag=True, help="Print the reservations made as JSON.")
@pass_ctx
@handle_errors
def reserve(ctx, agent, paths, ttl, exclusive, reason, as_json):
    """Reserve PATHs (files, directories or globs, relative to the current directory inside the
    project, else to its root) for the agent: advisory leases the others see. Granted whole, or refused whole (exit 1) naming who
    holds what until when, when another agent holds an overlapping exclusive reservation (or
    any overlapping one, for --exclusive); the holder is told by a notice in its inbox."""
    seconds = duration(ttl, "--for")
    if not 0 < seconds <= MAX_TTL:
        raise click.BadParameter("a lease lasts more than 0s and at most 7d (reserve again to renew it)",
                                 param_hint="--for")
    me = _agent(ctx, agent)
    try:
        got = me.reserve(paths, seconds, exclusive=exclusive, reason=reason, base=here(ctx))
    finally:
        me.close()
    now = time.time()
    if as_json:
        out_json([r.as_dict(now) for r in got])
        return
    for r in got:
        echo(f"{agent} holds {lease_text(r, now)}")


@click.command()
@AGENT
@click.argument("paths", nargs=-1, metavar="[PATH...]")
@click.option("--all", "everything", is_flag=True, help="Every reservation of the agent.")
@pass_ctx
@handle_errors
def release(ctx, agent, paths, everything):
    """Release the agent's reservations of PATHs (as reserved: the same path or glob), or --all."""
    if not paths and not everything:
        raise click.UsageError("name the paths to release, or --all")
    me = _agent(ctx, agent)
    try:
        base = here(ctx)
        asked = [] if everything else me.normalised(paths, base)
        gone = me.release(None if everything else paths, base=base)
    finally:
        me.close()
    for p in gone:
        echo(f"released {p}")
    for p in asked:
        if p not in gone:
            echo(f"{p}: not held by {agent}; nothing to release (relay reservations --agent {agent})")
    if everything and not gone:
        echo(f"{agent} held no reservation")


@click.command()
@click.option("--agent", help="Only this agent's.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@pass_ctx
@handle_errors
def reservations(ctx, agent, as_json):
    """The file reservations held now: path, agent, exclusive or shared, until when, reason."""
    now = time.time()
    with ctx.reader() as led:
        held = [Reservation.of(r) for r in led.reservations.held(now, agent=agent)]
    if as_json:
        out_json([r.as_dict(now) for r in held])
        return
    if not held:
        echo("no reservations held")
        return
    echo(f"{'AGENT':<16} {'MODE':<9} {'UNTIL':<20} {'LEFT':>7}  PATH")
    for r in held:
        echo(f"{r.agent:<16} {'exclusive' if r.exclusive else 'shared':<9} {utc(r.expires_at):<20} "
             f"{left(r.expires_at - now):>7}  {r.path}" + (f"  ({r.reason})" if r.reason else ""))


@click.group()
def guard():
    """The git pre-commit guard: a commit touching another agent's exclusive reservation is
    refused, naming the holder."""


HOOKS_PATH = click.option("--hooks-path", "hooks_path", metavar="DIR",
                          help="The hooks directory core.hooksPath names, when it lies outside the repository "
                               "(refused unless named here).")


@guard.command("install")
@click.option("--chain", is_flag=True, help="Keep a pre-commit hook relay did not write as "
              "pre-commit.before-relay, which relay's hook runs first.")
@HOOKS_PATH
@pass_ctx
@handle_errors
def guard_install(ctx, chain, hooks_path):
    """Write the pre-commit hook into the repository's hooks directory (core.hooksPath
    honoured inside the repository; a place outside it only when --hooks-path names it). A hook
    relay did not write is never replaced without --chain; a link is never written through. Who
    commits: $RELAY_AGENT, else `git config relay.agent`; RELAY_GUARD=off lets a person commit
    past it."""
    for line in guard_mod.install(ctx.cfg.root, ctx.cfg.state_dir, chain=chain, named=hooks_path):
        echo(line)


@guard.command("uninstall")
@HOOKS_PATH
@pass_ctx
@handle_errors
def guard_uninstall(ctx, hooks_path):
    """Remove relay's pre-commit hook (the hook it ran first, if any, takes its place again)."""
    for line in guard_mod.uninstall(ctx.cfg.root, named=hooks_path):
        echo(line)


@guard.command("check")
@click.option("--agent", help="Who commits (default: $RELAY_AGENT, else `git config relay.agent`).")
@click.argument("paths", nargs=-1, metavar="[PATH...]")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON (exit 0 unless an error).")
@pass_ctx
@handle_errors
def guard_check(ctx, agent, paths, as_json):
    """Exit 1 naming the holders when PATHs (default: the files staged for commit) touch
    another agent's exclusive reservation; what the hook runs. RELAY_GUARD=off: exit 0."""
    off = os.environ.get("RELAY_GUARD", "").strip().lower() in guard_mod.OFF
    if off and not as_json:
        echo("relay guard: RELAY_GUARD=off: this commit is not checked against file reservations", err=True)
        return
    ctx.strict = False
    root = ctx.cfg.root
    start = here(ctx) or str(root)
    files = guard_mod.inside(root, [os.path.join(start, p) for p in paths]) if paths else guard_mod.staged(root)
    agent = agent or guard_mod.committer(root, os.environ)
    now = time.time()
    try:
        found = guard_mod.conflicts(ctx.layout.ledger, agent, files, now)
    except (LedgerError, RelayError) as e:
        echo(f"relay guard: the reservations cannot be read ({e}); not checked", err=True)
        found = []
    if as_json:
        out_json({"ok": not found or off, "off": off, "agent": agent, "paths": files,
                  "conflicts": [{**Reservation.of(r).as_dict(now), "path": p, "held": r["pattern"]} for p, r in found]})
        return
    if not found:
        return
    echo("relay guard: refused: another agent holds these files by an exclusive reservation:", err=True)
    for path, r in found:
        why = f"; reason: {r['reason']}" if r["reason"] else ""
        held = "" if r["pattern"] == path else f" (as {r['pattern']})"
        echo(f"  {path}: {r['agent']}{held} until {utc(r['expires_at'])} (in {left(r['expires_at'] - now)}{why})",
             err=True)
    holders = ", ".join(dict.fromkeys(r["agent"] for _, r in found))
    who = (f"ask {holders} (relay send --from {agent} --to {holders.split(', ')[0]})" if agent else
           "who commits is not known (RELAY_AGENT=NAME, or git config relay.agent NAME); ask " + holders)
    echo(f"relay guard: {who}, wait for the lease to end, or commit with RELAY_GUARD=off to override", err=True)
    sys.exit(1)


COMMANDS = [reserve, release, reservations, guard]
