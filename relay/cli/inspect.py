"""The verbs that look without changing anything: audit, show, verify, doctor, agents, tail,
report. They open the ledger read-only, so they work beside a running daemon. A stored row this
build cannot read is named on stderr (with its id and column) and left out; the verb goes on."""
import sys
import time

import click
import orjson

from relay.agent.leases import Reservation
from relay.config import SYSTEM
from relay.core import health, registry
from relay.core.message import closest
from relay.operator import views
from relay.cli.context import out_json, pass_ctx, verdict
from relay.cli.lookups import outbox_source
from relay.cli.receipts import receipts_json, receipts_text
from relay.arguments import acting, agent_name, checked, duration, handle_errors, moment
from relay.agent.project import Project, check_known
from relay.errors import NotFound, RelayError
from relay.files.fs import replace_file
from relay.ledger.history import BadRow, sift
from relay.core.inbox import Inbox
from relay.ledger.ledger import STATUSES
from relay.files.lock import holder
from relay.core.senders import declared
from relay.terminal import echo, echo_json, escaped

TABLE_LIMIT = 50        # messages in audit's table unless --limit says otherwise
PATH_LIMIT = 10         # messages relay show --path prints unless --limit says otherwise
REPORT = "report.html"  # relay report's page in the state directory, unless --html names another
OPERATOR_TABLES = ("sheds", "pings", "archived_agents")    # what agents and queues read beside messages


def skipped(bad):
    """Name on stderr each stored row this build could not read (a verb then goes on without it)."""
    for b in bad:
        echo(f"relay: {b}", err=True)
    bad.clear()


def _audit_options(fn):
    for opt in reversed([
        click.option("--from", "sender", callback=checked(agent_name), help="Sent by this agent."),
        click.option("--to", "recipient", callback=checked(agent_name), help="Addressed to this agent."),
        click.option("--status", type=click.Choice(STATUSES + ("shed",)),
                     help="In this state; `shed`: shed by flow control for at least one recipient."),
        click.option("--kind", help="Of this kind."),
        click.option("--thread", help="In this thread (shown oldest first, as a conversation); a thread named "
                     "by a message's id starts with that message."),
        click.option("--since", help="Discovered at or after (2026-11-30, 2026-11-30T10:00, or 2h = 2 hours ago)."),
        click.option("--until", help="Discovered before (same forms as --since)."),
        click.option("--grep", help="Subject, body or file name contains TEXT (case-insensitive)."),
        click.option("--limit", type=click.IntRange(1, 10**12), default=None,
                     help=f"At most N messages (default {TABLE_LIMIT} in the table); stderr says when more match."),
    ]):
        fn = opt(fn)
    return fn


@click.command()
@_audit_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of message records.")
@click.option("--jsonl", is_flag=True, help="Print one JSON record per line.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv"]), default="table", help="Table or CSV.")
@pass_ctx
@handle_errors
def audit(ctx, sender, recipient, status, kind, thread, since, until, grep, limit, as_json, jsonl, fmt):
    """The ledger, newest first, for humans (a thread: oldest first)."""
    with ctx.reader() as led:
        if limit is None and not (as_json or jsonl or fmt == "csv"):
            limit = TABLE_LIMIT
        bad = []
        # No LIMIT in SQL: the rows stream, and a row skipped as unreadable does not count.
        found = led.audit(sender=sender, recipient=recipient, status=status, kind=kind, thread=thread,
                          since=moment(since, "--since"), until=moment(until, "--until"), grep=grep,
                          oldest_first=bool(thread))
        rows = _limited(sift(found, bad), limit, bad)
        if as_json:
            out_json([views.record(r) for r in rows])
        elif jsonl:
            for r in rows:
                echo_json(views.record(r))
        elif fmt == "csv":
            import csv
            writer = None
            for r in rows:
                rec = views.record(r)
                rec["to"] = ",".join(rec["to"])
                rec = {k: escaped(v) if isinstance(v, str) else v for k, v in rec.items()}     # as the table shows them
                if writer is None:
                    writer = csv.DictWriter(sys.stdout, fieldnames=list(rec))
                    writer.writeheader()
                writer.writerow(rec)
        else:
            rows = list(rows)
            if not rows:
                echo("no messages match")
            else:
                echo(views.table(rows, remote=led.remote.routes([r["id"] for r in rows])))
        skipped(bad)


def _limited(rows, limit, bad):
    """The first `limit` rows of `rows`; when there are more, stderr says so once the rows are
    out (and the bad rows met are named)."""
    for i, row in enumerate(rows):
        if limit and i == limit:
            skipped(bad)
            echo(f"relay: stopped at the limit of {limit} message(s); more match (--limit N shows more)",
                       err=True)
            return
        yield row


@click.command()
@click.argument("message_id", required=False, metavar="[ID]")
@click.option("--path", "source", metavar="outbox/AGENT/NAME",
              help="The messages this outbox path has carried, newest first (names are reused), instead of ID.")
@click.option("--limit", type=click.IntRange(1, 10**12), default=None,
              help=f"With --path: at most N messages (default {PATH_LIMIT}; with --json, all).")
@click.option("--agent", callback=acting(agent_name, "--agent NAME", required=False),
              help="As this agent: only a message it sent or received (default: RELAY_AGENT; without "
                   "either, any message).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (with --path, a list).")
@pass_ctx
@handle_errors
def show(ctx, message_id, source, limit, agent, as_json):
    """One message: every field, deliveries, lifecycle events, files and body (--path: each
    message an outbox path has carried, newest first). Run as an agent, only the messages it
    sent or received."""
    if (message_id is None) == (source is None):
        raise click.UsageError("name a message ID, or --path outbox/AGENT/NAME (not both)")
    if limit is not None and source is None:
        raise click.UsageError("--limit goes with --path")
    if agent is not None:
        agent = check_known(agent, Project(config=ctx.cfg).agents(), "agent")
    if source is not None:
        return _show_path(ctx, source, limit, as_json, agent)
    led = ctx.reader()
    layout = ctx.layout
    try:
        try:
            row = led.find(message_id, visible_to=agent)
        except NotFound:
            owner = led.id_owner(message_id.upper())
            if agent is not None and owner not in (None, agent):
                waiting = None          # another agent's send, not taken yet: not this agent's to see
            else:                       # as an agent, a file of its own outbox only
                waiting = _waiting(layout, message_id, agent or owner)
            if waiting is None:
                raise
            if as_json:
                out_json({"id": message_id.upper(), "status": "waiting", "source_path": waiting})
            else:
                echo(f"message {message_id.upper()}\n  status         waiting in {waiting}: relay has not "
                           "taken it yet (is the daemon running? see relay status)")
            return
        problem = BadRow.of(row)
        if problem is not None:     # shown as it is stored, each unreadable value marked
            skipped([problem])
        story = _told(led, layout, row, as_json, agent)
        if as_json:
            out_json(story)
        else:
            echo(story)
    finally:
        led.close()


def _told(led, layout, row, as_json, agent):
    """A message as `relay show` tells it (by id or --path alike): its story, with its receipts
    for its sender and for an operator (`agent` None)."""
    story = _story(led, layout, row, as_json)
    if agent is not None and row["sender"] != agent:
        return story
    if as_json:
        return story | receipts_json(led, row)
    return story.replace("\nevents:", "\n".join(["", *receipts_text(led, row), "events:"]), 1)


def _story(led, layout, row, as_json):
    """One message's story: its JSON document, or its text."""
    bad = []
    deliveries = list(sift(led.deliveries(row["id"]), bad, "deliveries"))
    events = list(sift(led.events(row["id"]), bad, "events"))
    sheds = led.sheds(row["id"])      # each shown as stored, an unreadable one named and marked
    bad += [b for b in (BadRow.of(s, "sheds") for s in sheds) if b is not None]
    sheds = [views.shed(s) for s in sheds]
    skipped(bad)
    box = Inbox(layout, None)
    paths = {}
    for d in deliveries:
        held = box.holder(d["recipient"], row["id"])
        paths[d["recipient"]] = str(held) if held else None
    body = views.value(row["body"])
    remote = led.remote.outbound(row["id"])
    if not as_json:
        return views.show(row, deliveries, events, paths, body, remote, sheds)
    return {**views.record(row), "body": body, "headers": views.headers(row),
            "remote": [{"node": o["node"], "recipients": orjson.loads(o["recipients"]), "status": o["status"],
                        "entry_id": o["entry_id"], "published_at": views.when(o["published_at"]),
                        "acknowledged_at": views.when(o["acked_at"]),
                        "ack_deadline": views.when(o["ack_deadline"]),
                        "attempts": o["attempts"], "error": o["error"],
                        "state": views.remote_state(o)} for o in remote],
            "deliveries": [{"recipient": d["recipient"], "delivered_at": views.when(d["delivered_at"]),
                            "inbox_path": paths.get(d["recipient"])} for d in deliveries],
            "events": [{"at": views.when(e["at"]), "event": e["event"], "detail": e["detail"],
                        "actor": e["actor"]} for e in events], "sheds": sheds}


def _show_path(ctx, source, limit, as_json, agent=None):
    """relay show --path: every message found at an outbox path, newest first (as `agent`: those
    it sent or received); exit 1 when none."""
    layout = ctx.layout
    sender, name = outbox_source(source, layout)
    rel = f"outbox/{sender}/{name}"
    if limit is None and not as_json:
        limit = PATH_LIMIT
    with ctx.reader() as led:
        bad, stories, more = [], [], False
        for row in led.lookups.by_source(sender, name, visible_to=agent):
            if limit and len(stories) == limit:
                more = True
                break
            problem = BadRow.of(row)
            if problem is not None:     # shown as it is stored, each unreadable value marked
                bad.append(problem)
            stories.append(_told(led, layout, row, as_json, agent))
        skipped(bad)
    if not stories:
        there = agent in (None, sender) and layout.fs.exists(rel)
        raise NotFound(f"no message from {rel} in the ledger" + (
            "; a file is there now that relay has not taken yet (is the daemon running? see relay status)"
            if there else ""))
    if more:
        echo(f"relay: stopped at the limit of {limit} message(s); {rel} carried more (--limit N shows more)", err=True)
    if as_json:
        out_json(stories)
        return
    echo(f"{len(stories)} message(s) from {rel}, newest first\n")
    echo("\n\n".join(stories))


def _waiting(layout, mid, owner):
    """The outbox path of a message `relay send` wrote that relay has not taken yet, or None:
    in the outbox of the agent `relay send` gave the id to (`owner`), never another's. An id
    the ledger does not bind (an older relay send's) is looked for in every outbox, and files of
    more than one agent named after it are refused, not chosen between."""
    name = f"msg-{mid.lower()}"
    agents = [owner] if owner else [agent for agent, _, problem in layout.outbox_dirs() if problem is None]
    found = [f"outbox/{agent}/{name}" for agent in agents if layout.fs.exists(f"outbox/{agent}/{name}")]
    if len(found) > 1:
        raise RelayError(f"no message has the id {mid.upper()} yet, and files of more than one agent are named "
                         f"{name}; relay will not say which is meant")
    return found[0] if found else None


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
@handle_errors
def verify(ctx, as_json):
    """Check archive files against their sha256 and the ledger's hash chain."""
    from relay.operator import doctor as operator
    with ctx.reader() as led:
        checked, problems = operator.verify(led, ctx.layout)
        seq, head = led.checks.head()
    if not isinstance(seq, int) or not isinstance(head, str):     # a checkpoint row this build cannot read
        problems.append(f"ledger chain head {seq!r}:{head!r}: this relay cannot read it")
        seq, head = -1, str(head)
    # The head, noted somewhere else, also reveals records removed from the end of the chain.
    verdict(as_json, problems, {"checked": checked, "head": {"seq": seq, "hash": head}},
            f"verified {checked} archived message(s): " + ("ok" if not problems else f"{len(problems)} problem(s)")
            + f"; chain head {seq}:{head[:16]}")


def federation_problems(fed, link):
    """What doctor says of the federation: a directory that cannot be read (and why), a link
    down, a URL that switches TLS verification off."""
    from relay.config.federation import warnings
    out = [views.plain(w) for w in warnings(fed)]
    if link is not None and link["directory_error"]:
        out.append(f"federation: the team's directory cannot be read: {views.plain(link['directory_error'])}; "
                   "messages to names this node does not know wait, then fail")
    if link is not None and not link["connected"] and link["error"]:
        out.append(f"federation: the link to the server is down: {views.plain(link['error'])}")
    return out


@click.command()
@click.option("--quick", is_flag=True, help="Skip verify's checks (re-hashing archive files and envelopes, "
              "the hash chain); the summary says they were not run.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
@handle_errors
def doctor(ctx, quick, as_json):
    """Integrity, migrations, attested durability, rows this relay cannot read, verify's archive
    checks and ledger-vs-files reconciliation; exit 1 on a problem."""
    from relay.operator import doctor as operator
    pid = holder(ctx.layout.lock)
    with ctx.reader() as led:
        problems, facts = operator.doctor(led, ctx.layout, pid, configured=ctx.cfg.durability, quick=quick,
                                          declared=declared(ctx.cfg, led))
        migrations = led.checks.migrations()
        if ctx.cfg.federation:
            problems += federation_problems(ctx.cfg.federation, led.remote.link())
    verified = ("verify's checks not run (--quick): archive files and envelopes not re-hashed, hash chain "
                "not walked; run `relay verify`") if quick else f"verified {facts['verified']} archived message(s)"
    if not as_json:
        echo(f"durability: {health.describe(facts['durability'], pid)}")
        if facts["unreadable"]:
            echo(f"unreadable: {facts['unreadable']} ledger row(s) this relay cannot read")
    verdict(as_json, problems,
            {"migrations": [{"version": v, "name": n, "checksum_ok": ok} for v, n, ok in migrations],
             "durability": facts["durability"], "unreadable": facts["unreadable"], "verified": facts["verified"]},
            "doctor: " + ("no problems" if not problems else f"{len(problems)} problem(s)") + f"; {verified}")


@click.command()
@click.argument("name", required=False, callback=checked(agent_name))
@click.option("--active", is_flag=True, help="Only the active agents (neither released nor archived).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (with NAME: one object).")
@pass_ctx
@handle_errors
def agents(ctx, name, active, as_json):
    """Each agent (or NAME alone): state (active or inactive) and what its spawn said, outbox,
    inbox new/cur, sent/received, sheds, last ping, archived, last error."""
    from relay.operator import doctor as operator
    bad = []
    now = time.time()
    with ctx.reader() as led:
        local = ctx.layout.agent_names(ctx.cfg.agents)
        roster = registry.roster(led, local, bad)
        rows = operator.agents_report(led, ctx.layout, set(roster), bad)
        bad += led.bad_rows(tables=OPERATOR_TABLES)     # left out of the report: named here
        if ctx.cfg.federation:      # agents of other nodes: their node and when it was last seen
            rows = [{**r, "node": ctx.cfg.federation.node} for r in rows] + operator.remote_agents_report(led, local)
        held = {}                   # this node's file reservations (they are not shared with other nodes)
        for r in led.reservations.held(now):
            held.setdefault(r["agent"], []).append(Reservation.of(r).as_dict(now))
        rows = [{**r, "reservations": held.get(r["agent"], []),
                 **(roster.get(r["agent"]) or registry.Registered(r["agent"])).fields()} for r in rows]
    skipped(bad)
    if name is not None:
        rows = [r for r in rows if r["agent"] == name]
        if not rows:
            near = closest(name, sorted(set(roster) | {SYSTEM}))
            raise NotFound(f"no agent {name!r}{f'; did you mean {near}?' if near else ''} (no outbox or inbox "
                           "directory, not in config `agents`, never spawned)")
    if active:
        rows = [r for r in rows if r["state"] == registry.ACTIVE]
    docs = [{**r, "last_seen": views.when(r["last_seen"])} for r in rows]
    if as_json:
        out_json(docs if name is None else (docs or [None])[0])     # NAME inactive, with --active: null
        return
    if not rows:
        echo(f"{name} is inactive (released); `relay agents {name}` shows it" if name else "no active agents")
        return
    node = "NODE" if ctx.cfg.federation else ""
    echo(f"{'AGENT':<16} {'STATE':<8} {node:<14} {'OUTBOX':>6} {'NEW':>5} {'CUR':>5} {'SENT':>6} {'RECV':>6} "
         f"{'SHED':>9} {'RESERVED':>8}  {'LAST SEEN':<15} {'PING':<14} LAST ERROR")
    dash = lambda v: "-" if v is None else v     # noqa: E731 - what a remote node does not tell
    for r in rows:
        shed = f"{sum(r['shed_to'].values())}/{sum(r['shed_from'].values())}" if "shed_to" in r else "-"
        agent = f"{r['agent']} (archived)" if r.get("archived") else r["agent"]
        echo(f"{agent:<16} {r['state']:<8} {views.clip(r.get('node') or '', 14):<14} {dash(r['outbox_waiting']):>6} "
                   f"{dash(r['inbox_new']):>5} {dash(r['inbox_cur']):>5} {r['sent']:>6} {dash(r['received']):>6} "
                   f"{shed:>9} {reserved(r['reservations']):>8}  {views.short_time(r['last_seen']):<15} "
                   f"{views.ping(r.get('ping')):<14} "
                   f"{views.clip(r['last_error'] or '', 60)}")
        for line in views.registered(r):
            echo(f"    {line}")
    echo("STATE: active, or inactive once released (a spawn makes it active again), or archived by an operator "
         "(relay archive-agent; nothing is sent to it or from it); SHED: messages shed on the "
         "way to the agent / from it (relay queues, relay audit --status shed); RESERVED: file reservations held, "
         "exclusive ones marked x (relay reservations)")


def reserved(held):
    """An agent's reservations in the agents table: 3 (2x) for three, two of them exclusive."""
    if not held:
        return "-"
    exclusive = sum(1 for r in held if r["exclusive"])
    return f"{len(held)}" + (f" ({exclusive}x)" if exclusive else "")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
@handle_errors
def queues(ctx, as_json):
    """Queue depth per agent and per sender -> recipient pair, worst first: pending plus unread,
    oldest unread age, last delivery, sheds by reason, last ping."""
    from relay.operator import queues as queues_mod
    with ctx.reader() as led:
        doc = queues_mod.project(led, ctx.layout, ctx.layout.agent_names(ctx.cfg.agents), time.time())
        skipped(list(led.bad_rows(tables=OPERATOR_TABLES)))     # left out of the projection: named here
    if as_json:
        out_json(doc)
        return
    echo(views.queues(doc))


@click.command()
@click.option("--follow", "-f", is_flag=True, help="Keep printing events as they happen.")
@click.option("-n", "lines", type=click.IntRange(0), default=20, show_default=True, help="Events to show first.")
@click.option("--timeout", help="With --follow: stop after this long (e.g. 10m).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event.")
@pass_ctx
@handle_errors
def tail(ctx, follow, lines, timeout, as_json):
    """relay's lifecycle events as they happen (reads the ledger only)."""
    led = ctx.reader()
    stop_at = time.monotonic() + duration(timeout, "--timeout") if timeout else None
    try:
        last = led.last_event()
        seq = max(0, last - lines)
        while True:
            for e in led.events_after(seq):
                seq = e["seq"]
                problem = BadRow.of(e, "events")
                if problem is not None:
                    skipped([problem])
                    continue
                if as_json:
                    echo_json({"seq": seq, "at": views.when(e["at"]), "id": e["message_id"], "event": e["event"],
                               "detail": e["detail"], "actor": e["actor"], "from": e["sender"]})
                else:
                    who = f" from {e['sender']}" if e["sender"] else \
                        f" by {e['actor']}" if e["message_id"] is None and e["actor"] != "relay" else ""
                    detail = f": {e['detail']}" if e["detail"] else ""
                    echo(f"{views.when(e['at'])}  {e['message_id'] or '-':<26}  {e['event']:<10}{who}{detail}")
            if not follow or (stop_at is not None and time.monotonic() >= stop_at):
                return
            time.sleep(0.2)
    except KeyboardInterrupt:
        return
    finally:
        led.close()


@click.command()
@click.option("--since", help="Messages discovered since (a date, or a duration meaning that long ago).")
@click.option("--html", "html_file", type=click.Path(dir_okay=False, allow_dash=True),
              help="Write the page to this file (a new file renamed over the name, never through a "
                   f"symbolic link there); '-': to standard output. Default: {REPORT} in the state directory.")
@pass_ctx
@handle_errors
def report(ctx, since, html_file):
    """One self-contained HTML page: traffic matrix, messages per hour, failures, threads
    (written to .relay/report.html unless --html names another file)."""
    from relay.operator import report as report_mod
    with ctx.reader() as led:
        data = report_mod.gather(led, moment(since, "--since"))
    skipped(list(data["unreadable"]))
    page = report_mod.render(data, title=f"relay report: {ctx.cfg.root.name}", now=time.time())
    if html_file == "-":
        echo(page, nl=False)
        return
    html_file = html_file or str(ctx.layout.state / REPORT)
    replace_file(html_file, page.encode("utf-8"))
    echo(f"wrote {html_file}")


COMMANDS = [audit, show, verify, doctor, agents, queues, tail, report]
