"""The `relay` command: the click group and what every verb shares (the Context, JSON output, a
verdict's exit code); the verbs that run relay or change something (init, run, sweep), status,
demo and bench. The agents' verbs (send, inbox, read) are in cli_agent.py, the verbs that only
look at the ledger in cli_inspect.py, the operator's recorded commands (retry, expire, ping,
archive-agent) in cli_operator.py, `relay config` and `relay service` in cli_admin.py; guards.py
checks names and turns a failure into one line (exit 1). The only place that sets up logging."""
import datetime
import functools
import itertools
import json
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

import click

from . import __version__, config as config_mod, health
from .daemon import Relay
from .loop import DRAIN_PATIENCE, GC_YOUNG, quiet_gc
from .errors import NotInProject, RelayError
from .flow import REASONS
from .guards import checked, duration, handle_errors, sender_name
from .inbox import Inbox
from .fs import shown
from .history import History
from .api import declare
from .layout import Layout
from .ledger import STATUSES, Ledger
from .lock import DaemonLock, holder
from .outbox import declared, undeclared_outboxes
from . import views
from .terminal import echo, echo_json, escaped, json_text

EXIT_LEFT = 3       # run --once finished but left files that made no progress (held open, changing)

log = logging.getLogger("relay")


class JsonFormatter(logging.Formatter):
    FIELDS = (("relay_id", "id"), ("relay_from", "from"), ("relay_to", "to"), ("relay_event", "event"))

    def format(self, record):
        doc = {"ts": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(),
               "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
        for attr, key in self.FIELDS:       # a line about one message (work.fields) carries them
            if hasattr(record, attr):
                doc[key] = getattr(record, attr)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json_text(doc)


class TextFormatter(logging.Formatter):
    """A log line as people read it, through the terminal's gate (terminal.py): a name or a
    reason that holds an escape is shown escaped."""

    def format(self, record):
        return escaped(super().format(record))


def setup_logging(cfg, quiet=False):
    # Neither format shows the caller's file, thread or process: not gathered for each record
    # (the logging HOWTO's "Optimization"), which halves what a line costs the daemon.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    if cfg.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger("relay")
    root.handlers[:] = [handler]
    root.setLevel("WARNING" if quiet else cfg.log_level)
    root.propagate = False


def fail(message):
    raise click.ClickException(message)


_WARNED = set()     # configuration warnings already printed by this process


def warn(cfg, say=None):
    """Print each of the configuration's warnings once per process (stderr, or `say`)."""
    for w in cfg.warnings:
        if w not in _WARNED:
            _WARNED.add(w)
            # relay.toml and the environment's names may hold anything: no control character is written
            (say or (lambda text: echo(f"relay: warning: {text}", err=True)))(views.plain(w))


class Context:
    def __init__(self, root, state_dir, overrides=None):
        self.root, self.state_dir = root, state_dir
        self.overrides = overrides or {}
        self.new_project = False    # relay init: the current directory when no project is found
        self.strict = True      # an agent's verbs (send, inbox) turn it off: relay.toml's mistakes warn
        self.logged = False     # run: the warnings go to the log instead
        self._cfg = None

    def load(self):
        """The configuration read afresh, as this verb reads it, of the project found from the
        current directory (config.discover) unless --root or RELAY_ROOT names one."""
        try:
            root = config_mod.discover(self.root, self.state_dir)
        except NotInProject as e:
            # relay init makes a project in the current directory, unless another user's
            # state directory is right there (above it, the new one is nearer and wins).
            if not self.new_project or (e.foreign is not None and e.foreign == Path.cwd().absolute()):
                raise
            root = None
        return config_mod.load(root, self.state_dir, overrides=self.overrides, strict=self.strict)

    @property
    def cfg(self):
        if self._cfg is None:
            self._cfg = self.load()
            if not self.logged:
                warn(self._cfg)
        return self._cfg

    @property
    def layout(self):
        return Layout(self.cfg.root, self.cfg.state_dir)

    def reader(self):
        """The ledger's history, read-only (works beside a running daemon)."""
        path = self.layout.ledger
        if not path.exists():
            raise RelayError(f"no ledger at {path}: run `relay init` (or `relay run`) in the project first")
        return History(Ledger(path, readonly=True))


    def writer(self):
        path = self.layout.ledger
        if not path.exists():
            raise RelayError(f"no ledger at {path}: run `relay init` (or `relay run`) in the project first")
        return Ledger(path, durability=self.cfg.durability)


_pass_context = click.make_pass_decorator(Context)


def pass_ctx(fn):
    """Pass the Context, and accept --root/--state-dir after the verb too
    (`relay run --state-dir .agent-relay`), overriding any given before it."""
    @click.option("--state-dir", "state_dir_", help="State directory, relative to the root (as before the verb).")
    @click.option("--root", "root_", type=click.Path(file_okay=False), help="Project root (as before the verb).")
    @_pass_context
    @functools.wraps(fn)
    def wrapper(ctx, *args, root_=None, state_dir_=None, **kwargs):
        if root_:
            ctx.root = root_
        if state_dir_:
            ctx.state_dir = state_dir_
        return fn(ctx, *args, **kwargs)
    return wrapper


def out_json(doc):
    echo_json(doc, indent=True)


class Group(click.Group):
    """relay's click group: an error line (a ClickException, relay's own turned into one by
    guards.handle_errors, or click's usage errors) goes out through the terminal's gate too,
    on one line."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.ClickException as e:
            e.message = escaped(e.message, keep="")
            raise


def verdict(as_json, problems, extra, summary):
    """Print one line per problem and a summary (or JSON); exit 1 when there is a problem."""
    if as_json:
        out_json({"ok": not problems, "problems": problems, **extra})
    else:
        for p in problems:
            echo(p)
        echo(summary)
    if problems:
        sys.exit(1)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="relay")
@click.option("--root", type=click.Path(file_okay=False), help="Project root (env RELAY_ROOT; default: the current directory).")
@click.option("--state-dir", help="State directory, relative to the root (env RELAY_STATE_DIR; default .relay).")
@click.pass_context
def main(ctx, root, state_dir):
    """relay: deliver agents' outbox files into each other's inboxes, exactly once."""
    ctx.obj = Context(root, state_dir)


@main.command()
@click.option("--agent", "agents", multiple=True, callback=checked(sender_name),
              help="Create this agent's outbox and inbox (repeatable).")
@pass_ctx
@handle_errors
def init(ctx, agents):
    """Create the layout (idempotent), with an outbox and inbox for each agent. In a
    directory inside a project, that project; elsewhere, the current directory."""
    ctx.new_project = True
    cfg = ctx.cfg
    layout = Layout(cfg.root, cfg.state_dir)
    problems = layout.init(agents)
    if problems:
        raise RelayError("; ".join(problems))
    Ledger(layout.ledger, durability=cfg.durability).close()
    declare(layout, list(agents), "relay init", cfg.durability)
    echo(f"initialised {layout.state}" + (f" with agents {', '.join(agents)}" if agents else ""))


@main.command()
@click.option("--once", is_flag=True, help="One full pass over everything present, then exit.")
@click.option("--durability", type=click.Choice(["full", "normal"]), help="Override `durability`.")
@click.option("--settle", help="Override `settle` (e.g. 250ms).")
@click.option("--retention", help="Override `retention` (e.g. 7d; 0 keeps forever).")
@click.option("--log-format", type=click.Choice(["text", "json"]), help="Override `log_format`.")
@click.option("--log-level", help="Override `log_level`.")
@click.option("-q", "--quiet", is_flag=True, help="Log warnings and errors only.")
@pass_ctx
@handle_errors
def run(ctx, once, durability, settle, retention, log_format, log_level, quiet):
    """Run the relay: watch, deliver, archive, sweep (until SIGTERM/SIGINT)."""
    ctx.overrides.update(durability=durability, settle=settle, retention=retention,
                         log_format=log_format, log_level=log_level)
    ctx.logged = True
    cfg = ctx.cfg
    setup_logging(cfg, quiet)
    warn(cfg, lambda text: log.warning("%s", text))
    layout = Layout(cfg.root, cfg.state_dir)
    layout.create()
    quiet_gc(GC_YOUNG if once else None)
    with DaemonLock(layout.lock) as lock:
        if once:
            link = None
            if cfg.federation:
                from .federation import Link
                link = Link(cfg)
                link.heartbeat()        # the team's directory, before messages are routed
            with Relay(cfg) as relay:
                relay.attest("once")
                t0 = time.monotonic()
                total = relay.drain()
                took = time.monotonic() - t0
                left = relay.left
            shed = f", {total.shed} delivery(ies) shed by flow control" if total.shed else ""
            echo(f"relayed {total.archived} message(s), {total.failed} failed, {total.retried} to retry{shed}, "
                       f"in {took:.2f}s")
            if link is not None:
                with link:
                    published, received = link.once()
                    waiting = link.history.outbound_counts()["pending"]
                echo(f"federation: published {published}, received {received}"
                           + (f", {waiting} waiting for the server" if waiting else ""))
            if left:
                shown_left = "; ".join(f"{shown(what)} ({why})" for what, why in left[:20])
                more = f" and {len(left) - 20} more" if len(left) > 20 else ""
                echo(f"relay: left {len(left)} file(s) for a later run, no progress in "
                           f"{DRAIN_PATIENCE:.0f}s: {shown_left}{more}", err=True)
                sys.exit(EXIT_LEFT)
            return
        from .service import serve

        def relog(new):
            setup_logging(new, quiet)
            warn(new, lambda text: log.warning("%s", text))
        sys.exit(serve(cfg, lock, load=ctx.load, on_config=relog))


@main.command()
@click.option("--max-pending-age", default=config_mod.show_duration(health.MAX_PENDING_AGE), show_default=True,
              help="Exit 4 when the oldest pending message is older than this (0: never).")
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
        from .federation import redis_module
        redis_module()          # without the package: one line naming the extra
    sheds = dict.fromkeys(REASONS, 0)
    if with_ledger:
        with ctx.reader() as led:
            counts = led.counts()
            sheds.update(led.shed_counts())
            first = led.oldest_pending()
            oldest = round(time.time() - first, 3) if first is not None else None
            att = health.attestation(led, pid)
            undeclared = [{"agent": n, "waiting": w} for n, w in undeclared_outboxes(layout, declared(cfg, led))]
            unknown, bad = led.unknown_statuses()
            # the sheds counted and the attestation shown: rows this relay cannot read are named, left out
            others = list(itertools.islice(led.bad_rows(tables=("sheds", "attestations")), 20))
            unknown, bad = unknown + len(others), bad + others
            if cfg.federation:
                from .federation import probe
                federation = probe(cfg, led)
    code, problems = health.check(pid, oldest, max_age)
    settings = {k: att.get(k) for k in ("journal_mode", "synchronous", "busy_timeout_ms", "foreign_keys")}
    doc = {"root": str(cfg.root), "state_dir": str(cfg.state_dir),
           "daemon": {"running": pid is not None, "pid": pid}, "counts": counts,
           "agents": sorted(layout.agent_names(cfg.agents)), "undeclared": undeclared,
           "oldest_pending_age_s": oldest, "sheds": sheds,
           "durability": {**settings, **att, "setting": cfg.durability},
           "unreadable": {"count": unknown, "rows": [str(b) for b in bad]},
           "health": {"ok": code == 0, "exit": code, "problems": problems}}
    if federation is not None:
        doc["federation"] = federation
    for b in bad:
        echo(f"relay: {b}", err=True)
    if as_json:
        out_json(doc)
        return
    echo(f"root       {doc['root']}\nstate dir  {doc['state_dir']}")
    echo(f"daemon     {'running, pid ' + str(pid) if pid else 'not running'}")
    echo("messages   " + ", ".join(f"{k} {v}" for k, v in counts.items())
               + (f"; {unknown} with a status this relay cannot read" if unknown else ""))
    echo("sheds      " + ", ".join(f"{k} {v}" for k, v in sheds.items()) + "  (relay audit --status shed)")
    if oldest is not None:
        echo(f"oldest pending  {oldest:.1f}s")
    echo(f"agents     {', '.join(doc['agents']) or '(none)'}")
    if undeclared:
        echo("undeclared " + ", ".join(f"{u['agent']} ({u['waiting']} waiting)" for u in undeclared)
             + ': not read (senders = "declared"; relay init --agent NAME declares one)')
    echo("durability " + (health.describe(att, pid) if with_ledger else "not attested"))
    if federation is not None:
        echo(views.federation(federation, running=pid is not None, now=time.time()))
    if not with_ledger:
        echo("no ledger yet: run `relay init` or `relay run`")
    echo("health     " + ("ok" if not problems else "; ".join(problems)))
    sys.exit(code)


@main.command()
@click.option("--older-than", help="Sweep entries older than this instead of `retention` (e.g. 7d; 0s sweeps everything).")
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
@handle_errors
def sweep(ctx, older_than, dry_run, as_json):
    """The retention sweep now: delete archived and failed entries older than retention."""
    from . import retention
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
               f"{older_than or f'{int(keep)}s'} from {layout.state}")
    if dry_run:
        for mid in result.ids:
            echo(f"  {mid}")


@main.command()
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
        echo(f"relayed {total.archived} message(s) from {len(agents)} agents; {total.failed} quarantined\n")
        box = Inbox(layout, None)
        for agent in ["System"] + agents:
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


@main.command()
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
    from . import bench as bench_mod
    root, _ = config_mod.resolve_dirs(ctx.root, ctx.state_dir)
    work = Path(tempfile.mkdtemp(prefix=".relay-bench-", dir=base or root))
    say = (lambda *_: None) if as_json else echo
    try:
        if sustained:
            from . import sustained as sustained_mod
            result = sustained_mod.run(work, agents=agents, seconds=seconds, full_seconds=seconds, echo=say)
        else:
            result = bench_mod.run(work, messages, agents, rate, seconds, echo=say)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if as_json:
        out_json(result)


def entry():
    main(prog_name="relay")


from . import cli_adopt, cli_admin, cli_agent, cli_inspect, cli_mcp, cli_operator  # noqa: E402,F401  (register their verbs on `main`; cli_mcp imports the SDK only when run)
