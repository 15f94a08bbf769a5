"""The verbs of the relay itself: init, run (the daemon, or one pass), status, sweep, demo and
bench."""
import itertools
import json
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

import click

from relay import config as config_mod
from relay.config import template as config_template
from relay.core import health
from relay.core.daemon import Relay
from relay.core.loop import DRAIN_PATIENCE, GC_YOUNG, quiet_gc
from relay.errors import FederationError, RelayError
from relay.core.flow import REASONS
from relay.arguments import checked, duration, handle_errors, sender_name, setting
from relay.core.inbox import Inbox
from relay.files.fs import shown
from relay.agent.api import declare
from relay.agent.project import check_new
from relay.agent.leases import Reservation
from relay.files.layout import Layout
from relay.ledger.history import History
from relay.ledger.ledger import STATUSES, Ledger
from relay.files.lock import DaemonLock, holder
from relay.core.senders import declared, undeclared_outboxes
from relay.operator import views
from relay.operator.gitignore import keep_out_of_git
from relay.terminal import echo


from relay.cli.context import (EXIT_LEFT, Context, fail, log, out_json, pass_ctx, setup_logging,  # noqa: F401
                                warn)


@click.command()
@click.option("--agent", "agents", multiple=True, callback=checked(sender_name),
              help="Create this agent's outbox and inbox (repeatable).")
@pass_ctx
@handle_errors
def init(ctx, agents):
    """Create the layout (idempotent), with an outbox and inbox for each agent. In a
    directory inside a project, that project; elsewhere, the current directory. In a git
    repository, the state directory is added to the .gitignore beside it."""
    ctx.new_project = True
    cfg = ctx.cfg
    layout = Layout(cfg.root, cfg.state_dir)
    if layout.state.is_dir():       # no agent's name in another case, known to the ledger or not
        check_new(layout, agents, cfg.agents)
    problems = layout.init(agents)
    if problems:
        raise RelayError("; ".join(problems))
    Ledger(layout.ledger, durability=cfg.durability).close()
    declare(layout, list(agents), "relay init", cfg.durability)
    with History(Ledger(layout.ledger, readonly=True)) as history:
        archived = history.archived_agents()
    ready = [a for a in agents if a not in archived]
    echo(f"initialised {layout.state}" + (f" with agents {', '.join(ready)}" if ready else ""))
    for name in (a for a in agents if a in archived):       # its outbox and inbox are there; nothing moves
        at, by = archived[name]
        echo(f"relay: {name} is archived (by {by} at {views.when(at)}): nothing is delivered to it or from it; "
             f"restore it with: relay archive-agent --undo {name}", err=True)
    toml = config_template.write(cfg)
    if toml is not None:
        echo(f"wrote {toml}: every key commented out at its default (relay config shows what is in force)")
    done, problem = keep_out_of_git(cfg.root, cfg.state_dir)
    if done:
        echo(done)
    if problem:
        echo(f"relay: warning: {problem}", err=True)


@click.command()
@click.option("--once", is_flag=True, help="One full pass over everything present, then exit.")
@click.option("--durability", type=click.Choice(["full", "normal"]), help="Override `durability`.")
@click.option("--settle", help="Override `settle` (e.g. 250ms; a bare number is seconds).")
@click.option("--retention", help="Override `retention` (e.g. 7d; a bare number is seconds; 0 keeps forever).")
@click.option("--patience", metavar="DURATION",
              help=f"With --once: how long to wait for files that make no progress (held open for writing) "
                   f"before leaving them for a later run and exiting {EXIT_LEFT} (default "
                   f"{DRAIN_PATIENCE:.0f}s).")
@click.option("--log-format", type=click.Choice(["text", "json"]), help="Override `log_format`.")
@click.option("--log-level", help="Override `log_level`.")
@click.option("-q", "--quiet", is_flag=True, help="Log warnings and errors only.")
@pass_ctx
@handle_errors
def run(ctx, once, durability, settle, retention, patience, log_format, log_level, quiet):
    """Run the relay: watch, deliver, archive, sweep (until SIGTERM/SIGINT)."""
    if patience is not None and not once:
        raise click.UsageError("--patience is for --once (the daemon waits for held files as long as they are held)")
    patience = DRAIN_PATIENCE if patience is None else duration(patience, "--patience")
    ctx.overrides.update(durability=durability, settle=setting(settle, "--settle"),
                         retention=setting(retention, "--retention"),
                         log_format=log_format, log_level=log_level)
    ctx.strict = True       # a mistake in relay.toml stops the daemon, with the key and its hint
    ctx.logged = True
    cfg = ctx.cfg
    if cfg.federation is not None and cfg.federation.url is None:
        from relay.federation.client import NO_URL
        raise FederationError(f"[federation] of team {cfg.federation.team}: {NO_URL}")
    setup_logging(cfg, quiet)
    warn(cfg, lambda text: log.warning("%s", text))
    layout = Layout(cfg.root, cfg.state_dir)
    layout.create()
    quiet_gc(GC_YOUNG if once else None)
    with DaemonLock(layout.lock) as lock:
        if once:
            link = None
            if cfg.federation:
                from relay.federation import Link
                link = Link(cfg)
                link.heartbeat()        # the team's directory, before messages are routed
            with Relay(cfg) as relay:
                relay.attest("once")
                t0 = time.monotonic()
                relay.bounces.before = time.time()      # its own pass's bounces wait for the next one
                total = relay.drain(patience=patience)
                took = time.monotonic() - t0
                left = relay.left
            shed = f", {total.shed} delivery(ies) shed by flow control" if total.shed else ""
            bounced = f", {total.bounced} bounce(s) to their senders" if total.bounced else ""
            echo(f"relayed {total.archived} message(s), {total.failed} failed, {total.retried} to retry"
                 f"{shed}{bounced}, in {took:.2f}s")
            if link is not None:
                with link:
                    published, received = link.once()
                    waiting = link.history.remote.outbound_counts()["pending"]
                echo(f"federation: published {published}, received {received}"
                           + (f", {waiting} waiting for the server" if waiting else ""))
            if left:
                shown_left = "; ".join(f"{shown(what)} ({why})" for what, why in left[:20])
                more = f" and {len(left) - 20} more" if len(left) > 20 else ""
                echo(f"relay: left {len(left)} file(s) for a later run, no progress in "
                           f"{config_mod.show_duration(patience)}: {shown_left}{more}", err=True)
                sys.exit(EXIT_LEFT)
            return
        from relay.service import serve

        def relog(new):
            setup_logging(new, quiet)
            warn(new, lambda text: log.warning("%s", text))
        sys.exit(serve(cfg, lock, load=ctx.load, on_config=relog))


@click.command()
@click.option("--max-pending-age", default=config_mod.show_duration(health.MAX_PENDING_AGE), show_default=True,
              help="Exit 4 when the oldest pending message is older than this (e.g. 10m; a bare number is "
                   "seconds; 0: never).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
@handle_errors
def status(ctx, max_pending_age, as_json):
    """Counts per state, oldest pending age, agents, daemon pid, attested durability; a health
    check: exit 3 when no daemon runs, 4 when the oldest pending message is older than
    --max-pending-age, else 0. With --json the verdict is the document's "health" and the exit
    is 0 (1 on an error), as for every read-only verb's JSON."""
    max_age = duration(max_pending_age, "--max-pending-age")
    cfg = ctx.cfg
    layout = ctx.layout
    with_ledger = layout.ledger.exists()
    pid = holder(layout.lock)
    counts = dict.fromkeys(STATUSES, 0)
    oldest = None
    att = {"attested": False, "running": False}
    unknown, bad = 0, []
    undeclared = []
    federation = None
    if cfg.federation:
        from relay.federation import redis_module
        redis_module()          # without the package: one line naming the extra
    sheds = dict.fromkeys(REASONS, 0)
    held, opened, overdue = [], None, 0
    now = time.time()
    if with_ledger:
        with ctx.reader() as led:
            opened = led.ledger.access         # read-only, or immutable in a project no one here may write
            counts = led.counts()
            held = led.reservations.held(now)
            sheds.update(led.shed_counts())
            overdue = led.receipts.overdue_count(now - cfg.ack_overdue)     # acknowledgements waiting too long
            first = led.oldest_pending()
            oldest = round(time.time() - first, 3) if first is not None else None
            att = health.attestation(led, pid)
            undeclared = [{"agent": n, "waiting": w} for n, w in undeclared_outboxes(layout, declared(cfg, led))]
            unknown, bad = led.unknown_statuses()
            # the sheds counted and the attestation shown: rows this relay cannot read are named, left out
            others = list(itertools.islice(led.bad_rows(tables=("sheds", "attestations")), 20))
            unknown, bad = unknown + len(others), bad + others
            if cfg.federation:
                from relay.federation import probe
                federation = probe(cfg, led)
    code, problems = health.check(pid, oldest, max_age)
    if federation is not None:
        more, said = health.federation(federation, pid is not None, now, max_age)
        code, problems = code or more, problems + [views.plain(p) for p in said]
    settings = {k: att.get(k) for k in ("journal_mode", "synchronous", "busy_timeout_ms", "foreign_keys")}
    doc = {"root": str(cfg.root), "state_dir": str(cfg.state_dir),
           "daemon": {"running": pid is not None, "pid": pid}, "messages": views.headline(counts), "counts": counts,
           "agents": sorted(layout.agent_names(cfg.agents)), "undeclared": undeclared,
           "oldest_pending_age_s": oldest, "sheds": sheds, "acks_overdue": overdue,
           "reservations": [Reservation.of(r).as_dict(now) for r in held],
           "durability": {**settings, **att, "setting": cfg.durability},
           "unreadable": {"count": unknown, "rows": [str(b) for b in bad]},
           "health": {"ok": code == 0, "exit": code, "problems": problems},
           "ledger": health.ledger_access(layout, opened)}
    if federation is not None:
        doc["federation"] = federation
    for b in bad:
        echo(f"relay: {b}", err=True)
    if as_json:
        out_json(doc)
        return
    _echo_status(doc, cfg, att, held, with_ledger)
    sys.exit(code)


def _echo_status(doc, cfg, att, held, with_ledger):
    """relay status's lines, from its JSON document (and the reservations held, the attestation)."""
    pid, unknown, counts, sheds = doc["daemon"]["pid"], doc["unreadable"]["count"], doc["counts"], doc["sheds"]
    oldest, overdue, undeclared = doc["oldest_pending_age_s"], doc["acks_overdue"], doc["undeclared"]
    federation, problems = doc.get("federation"), doc["health"]["problems"]
    echo(f"root       {doc['root']}\nstate dir  {doc['state_dir']}")
    echo(f"daemon     {'running, pid ' + str(pid) if pid else 'not running'}")
    echo("messages   {delivered} delivered, {on_the_way} on the way, {failed} failed".format(**doc["messages"])
         + (f"; {unknown} with a status this relay cannot read" if unknown else ""))
    echo("states     " + views.ledger_states(counts) + "  (the ledger's)")
    echo("sheds      " + ", ".join(f"{k} {v}" for k, v in sheds.items()) + "  (relay audit --status shed)")
    if oldest is not None:
        echo(f"oldest pending  {oldest:.1f}s")
    if overdue:
        echo(f"acks overdue {overdue} (waiting longer than ack_overdue, "
             f"{config_mod.show_duration(cfg.ack_overdue)}: relay overdue)")
    echo(f"agents     {', '.join(doc['agents']) or '(none)'}")
    if held:
        shown_ = ", ".join(f"{r['agent']} {r['pattern']}{' (exclusive)' if r['exclusive'] else ''}" for r in held[:8])
        echo(f"reservations {len(held)}: {shown_}" + (" ..." if len(held) > 8 else "") + "  (relay reservations)")
    if undeclared:
        echo("undeclared " + ", ".join(f"{u['agent']} ({u['waiting']} waiting)" for u in undeclared)
             + ': not read (senders = "declared"; relay init --agent NAME declares one)')
    echo("durability " + (health.describe(att, pid) if with_ledger else "not attested"))
    if not doc["ledger"]["writable"]:
        echo("ledger     " + health.describe_access(doc["ledger"]))
    if federation is not None:
        echo(views.federation(federation, running=pid is not None, now=time.time()))
    if not with_ledger:
        echo("no ledger yet: run `relay init` or `relay run`")
    echo("health     " + ("ok" if not problems else "; ".join(problems)))


@click.command()
@click.option("--older-than", help="Sweep entries older than this instead of `retention` (e.g. 7d; a bare "
              "number is seconds; 0 sweeps everything).")
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
@handle_errors
def sweep(ctx, older_than, dry_run, as_json):
    """The retention sweep now: delete archived and failed entries older than retention."""
    from relay.core import retention
    ctx.strict = True       # it acts by `retention`: never by a default standing in for a misspelt key
    cfg = ctx.cfg
    # Only the `retention` key's 0 keeps forever; an explicit --older-than 0s means everything.
    keep = duration(older_than, "--older-than") if older_than is not None else cfg.retention
    if older_than is None and not keep:
        echo("retention is 0 (keep forever): nothing to sweep")
        return
    layout = Layout(cfg.root, cfg.state_dir)
    with Relay(cfg) as relay:
        now = relay.clock()
        result = retention.sweep_all_before(relay.ledger, relay.archive, now, now - keep, dry_run=dry_run)
    if as_json:
        out_json({"dry_run": dry_run, "archived": result.archived, "failed": result.failed, "ids": result.ids})
        return
    verb = "would delete" if dry_run else "deleted"
    echo(f"{verb} {result.archived} archived and {result.failed} failed message(s) older than "
         f"{config_mod.show_duration(keep) if keep else '0s'} from {layout.state}")
    if dry_run:
        for mid in result.ids:
            echo(f"  {mid}")


@click.command()
@click.argument("outboxes", required=False, type=click.Path(exists=True, file_okay=False))
@click.option("--keep", is_flag=True, help="Keep the temporary project (its path is printed).")
@pass_ctx
@handle_errors
def demo(ctx, outboxes, keep):
    """Run relay once over a copy of OUTBOXES (default examples/outboxes) and show the result."""
    src = Path(outboxes or "examples/outboxes")
    if not src.is_dir():
        fail(f"no {src} here: pass the path of an outboxes directory (examples/outboxes in the checkout)")
    project = Path(tempfile.mkdtemp(prefix="relay-demo-"))
    try:
        cfg = config_mod.load(project, ".relay", env={})
        agents = sorted(p.name for p in src.iterdir() if p.is_dir())
        layout = Layout(cfg.root, cfg.state_dir)
        layout.init(agents)
        for agent in agents:
            for f in sorted((src / agent).iterdir()):
                if f.is_file():
                    shutil.copyfile(f, layout.outbox / agent / f.name)
        setup_logging(cfg, quiet=True)
        logging.getLogger("relay").setLevel("CRITICAL")
        with Relay(cfg) as relay:
            total = relay.drain(now_fn=lambda: time.time() + cfg.settle)
            rows = list(relay.history.audit(oldest_first=True))
        bounced = f", {total.bounced} bounce(s) to their senders" if total.bounced else ""
        echo(f"relayed {total.archived} message(s) from {len(agents)} agents; {total.failed} "
             f"quarantined{bounced}\n")
        box = Inbox(layout, None)
        for agent in ["System"] + sorted(layout.agent_names()):    # those the run spawned too
            items = box.list(agent)
            echo(f"inbox/{agent}/new: {len(items)} message(s)")
            for _, _, doc in items:
                title = doc.get("subject") or views.clip(doc.get("body") or "", 50)
                echo(f"  from {doc['from']:<8} [{doc['kind']}] {title}")
        echo("\nrelay audit:")
        echo(views.table(rows))
        for p in sorted(layout.failed.rglob("*.error.json")):
            echo(f"\nquarantined: {p.relative_to(layout.state)}\n  reason: {json.loads(p.read_text())['reason']}")
        if keep:
            echo(f"\nproject kept at {project}")
    finally:
        if not keep:
            shutil.rmtree(project, ignore_errors=True)


@click.command()
@click.option("--dir", "base", type=click.Path(file_okay=False),
              help="Where to measure (default: a temporary directory in the project root, so on its file system).")
@click.option("--messages", type=click.IntRange(1), default=5000, show_default=True, help="Backlog size.")
@click.option("--agents", type=click.IntRange(2), default=20, show_default=True, help="Agents in the backlog.")
@click.option("--rate", type=click.FloatRange(1), default=100.0, show_default=True, help="Offered msg/s for latency.")
@click.option("--seconds", type=click.FloatRange(0.5), default=5.0, show_default=True, help="Latency run length.")
@click.option("--sustained", is_flag=True,
              help="Instead, sustained load on a running daemon: --agents producer processes at 100, 700 and "
                   "1,000 msg/s and at full speed for --seconds each, and 1,000 outboxes at 100 msg/s "
                   "(benchmarks/sustained.py has every knob).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
@handle_errors
def bench(ctx, base, messages, agents, rate, seconds, sustained, as_json):
    """Measure this disk's limits and relay's throughput and latency side by side."""
    from relay.bench import bench as bench_mod
    if not sustained:
        try:
            bench_mod.offered(rate, seconds)
        except bench_mod.BenchError as e:
            raise click.BadParameter(str(e).removeprefix("bench: "), param_hint="--rate/--seconds") from None
    root, _ = config_mod.resolve_dirs(ctx.root, ctx.state_dir)
    work = Path(tempfile.mkdtemp(prefix=".relay-bench-", dir=base or root))
    say = (lambda *_: None) if as_json else echo
    try:
        if sustained:
            from relay.bench import sustained as sustained_mod
            result = sustained_mod.run(work, agents=agents, seconds=seconds, full_seconds=seconds, echo=say)
        else:
            result = bench_mod.run(work, messages, agents, rate, seconds, echo=say)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if as_json:
        out_json(result)


COMMANDS = [init, run, status, sweep, demo, bench]
