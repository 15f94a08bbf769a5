"""The verbs agents use: send, inbox (with --wait), read, mark-read and search. They are built on api.py, so the
shell and Python check the same things. A message is marked read only once it has been printed."""
import sys

import click

from relay.operator import views
from relay.agent.api import Agent, Project
from relay.cli.context import out_json, pass_ctx
from relay.agent.delivery import wait_delivered
from relay.config import AGENT_VARIABLE, default_agent, show_duration
from relay.core.message import PRIORITIES
from relay.errors import RelayError
from relay.files.lock import holder
from relay.arguments import acting, agent_name, checked, handle_errors, moment, recipient_names, seconds, sender_name
from relay.terminal import echo, echo_json

EXIT_TIMEOUT = 124      # relay inbox --wait: the time ran out with no new message (as timeout(1))
EXIT_INTERRUPTED = 130  # relay inbox --wait ended by Ctrl-C (128 + SIGINT, as a shell reports it)


def _project(ctx):
    return Project(config=ctx.cfg)


@click.command()
@click.option("--from", "sender", callback=acting(sender_name, "--from NAME"),
              help="The sending agent (its outbox); default: RELAY_AGENT.")
@click.option("--to", "to", callback=checked(recipient_names),
              help="Recipient(s): NAME[,NAME...], '*' or System.")
@click.option("--reply-to", "reply_to", metavar="ID",
              help="Answer this message: to its sender (to its recipients when you sent it), in its thread, "
                   "subject 'Re: ...'.")
@click.option("--kind", help="Message kind (default: message).")
@click.option("--thread", help="Thread id.")
@click.option("--subject", help="Subject line.")
@click.option("--request-id", "request_id",
              help="Your id for this request: a second send with it is not delivered again.")
@click.option("--content-type", "content_type", metavar="TYPE",
              help="How to read the body: a media type (default text/plain; text/markdown, application/json ...).")
@click.option("--max-retries", "max_retries", type=click.IntRange(0, None), metavar="N",
              help="Retry a transient failure at most N times (at most relay's max_retries).")
@click.option("--create", is_flag=True, help="Allow agents that do not exist yet (they are created).")
@click.option("--priority", type=click.Choice(PRIORITIES), help="urgent, high, normal (default) or low: "
              "inboxes put urgent first.")
@click.option("--ack-required", "ack_required", is_flag=True,
              help="Ask each recipient to acknowledge it (relay ack); relay overdue lists what waits.")
@click.option("--wait-read", "wait_read", is_flag=False, flag_value="forever", default=None, metavar="[DURATION]",
              help="Then block until every recipient has read it (exit 0), it failed (exit 1) or DURATION "
                   f"passed (exit {EXIT_TIMEOUT}).")
@click.option("--wait-acked", "wait_acked", is_flag=False, flag_value="forever", default=None, metavar="[DURATION]",
              help="Then block until every recipient has acknowledged it (exit 0), it failed (exit 1) or "
                   f"DURATION passed (exit {EXIT_TIMEOUT}).")
@click.option("--wait-delivered", "wait", is_flag=False, flag_value="forever", default=None, metavar="[DURATION]",
              help="Then block until every recipient has it (exit 0), it failed (exit 1, the reason on "
                   f"stderr) or DURATION (600 or 600s, 5m) passed (exit {EXIT_TIMEOUT}); without a DURATION, "
                   "for ever.")
@click.argument("body", required=False)
@pass_ctx
@handle_errors
def send(ctx, sender, to, reply_to, kind, thread, subject, request_id, content_type, max_retries, create, priority,
         ack_required, wait_read, wait_acked, wait, body):
    """Write a message atomically into SENDER's outbox and print its id.

    BODY '-' (or none) reads standard input. Names are checked against the known agents first:
    an unknown one is refused with the closest match."""
    if to is None and reply_to is None:
        raise click.UsageError("give --to NAME[,NAME...] (or --reply-to ID)")
    wait, timeout = _wait_for(wait, body, "--wait-delivered")
    if body is None and wait not in (None, "forever") and timeout is None:
        body, wait = wait, "forever"        # `--wait-delivered "the body"`: the body, waited for ever
    steps = []                              # --wait-read, --wait-acked: (step, timeout)
    for step, value, flag in (("read", wait_read, "--wait-read"), ("acked", wait_acked, "--wait-acked")):
        value, limit = _wait_for(value, body, flag)
        if body is None and value not in (None, "forever") and limit is None:
            body, value = value, "forever"
        if value is not None:
            steps.append((step, limit))
    if body is None or body == "-":
        body = sys.stdin.read()
    me = Agent(sender, project=_project(ctx), create=create, role="sender")
    if reply_to is not None:
        original = me.find(reply_to)
        mid = me.reply(original, body, to=to, kind=kind, thread=thread, subject=subject,
                       request_id=request_id, create=create, content_type=content_type, max_retries=max_retries,
                       priority=priority, ack_required=ack_required)
    else:
        mid = me.send(to, body, kind=kind, thread=thread, subject=subject, request_id=request_id, create=create,
                      content_type=content_type, max_retries=max_retries, priority=priority,
                      ack_required=ack_required)
    if me.repeated:
        echo(f"relay: request id {request_id!r} was sent before as {mid}; not sent again", err=True)
    for r in me.released:
        echo(f"relay: warning: {r.name} was released (inactive since {r.released_at}, by {r.released_by}); "
             "the message is delivered to its inbox all the same", err=True)
    echo(mid)
    if wait is not None:
        sys.stdout.flush()
        _wait_delivered(me, mid, timeout)
    if steps:
        from relay.cli.receipts import wait_for_step
        sys.stdout.flush()
        for step, limit in steps:
            wait_for_step(me, mid, step, limit)
    elif wait is None and not me.repeated and holder(me.layout.lock) is None:     # queued all the same: a relay started later delivers it
        echo(f"relay: no relay is running here: {mid} waits in {me.name}'s outbox until one runs (start one: "
             "relay run; as a service: relay service systemd)", err=True)


def _wait_delivered(me, mid, timeout):
    """--wait-delivered: exit 0 delivered, 1 failed (the reason), EXIT_TIMEOUT when the time ran out."""
    running = holder(me.layout.lock) is not None
    if not running:
        echo(f"relay: no relay daemon is running; {mid} is delivered when one runs", err=True)
    try:
        outcome = wait_delivered(me.project, mid, timeout)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    if outcome.delivered is None:
        waited = show_duration(timeout) if timeout else "0s"
        echo(f"relay: {mid} was not delivered to every recipient in {waited} ({outcome.reason}"
             f"{'' if running else '; no relay daemon is running'})", err=True)
        sys.exit(EXIT_TIMEOUT)
    if not outcome.delivered:
        echo(f"relay: {mid} was not delivered: {outcome.reason}", err=True)
        sys.exit(1)


@click.command()
@click.argument("agent", required=False)
@click.option("--all", "show_all", is_flag=True, help="Include messages already read (cur/).")
@click.option("--ack", is_flag=True, help="Mark read the new messages printed (new/ -> cur/).")
@click.option("--wait", "wait", is_flag=False, flag_value="forever", default=None, metavar="[TIMEOUT]",
              help="Block until a new message is there: at most TIMEOUT (600 or 600s, 5m, 2h) when one "
                   f"follows, for ever when none does; exit {EXIT_TIMEOUT} when none came. "
                   "`--wait AGENT` waits for ever for AGENT.")
@click.option("--recent", type=click.IntRange(0, None), default=0, metavar="N",
              help="Also show the N newest messages read already, first (to see again what was taken).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.option("--jsonl", is_flag=True, help="Print one JSON object per line.")
@pass_ctx
@handle_errors
def inbox(ctx, agent, show_all, ack, wait, recent, as_json, jsonl):
    """Print AGENT's new messages whole, oldest first; nothing is marked read unless --ack.
    AGENT defaults to RELAY_AGENT.

    A bare --wait waits for ever; Ctrl-C ends it (exit 130)."""
    agent = agent or None           # an empty name is none
    wait, timeout = _wait_for(wait, agent, "--wait")
    if agent is None and wait not in (None, "forever") and timeout is None:
        agent, wait = wait, "forever"       # `--wait lead`: the name, not a timeout
    agent = agent or default_agent()
    if agent is None:
        raise click.UsageError(f"name the agent: AGENT, or set {AGENT_VARIABLE}=NAME")
    me = Agent(agent, project=_project(ctx), role="agent")
    if wait is not None:
        try:
            got = me.wait(timeout)
        except KeyboardInterrupt:
            sys.exit(EXIT_INTERRUPTED)      # (click would print "Aborted!" and exit 1)
        if not got:
            echo(f"relay: no new message for {agent} in {show_duration(timeout) if timeout else '0s'}", err=True)
            sys.exit(EXIT_TIMEOUT)
        items = me.inbox(include_read=show_all, recent=recent) if show_all or recent else got
    else:
        items = me.inbox(include_read=show_all, recent=recent)
    _show(me, items, ack, as_json, jsonl, empty=f"no {'messages' if show_all else 'new messages'} for {agent}")


def _wait_for(wait, after, flag):
    """(the value of a --wait flag, its timeout in seconds or None for ever). A value that is no
    duration is left as it is when no argument follows (`after` None: it is that argument, the
    agent's name or the body, and the wait is for ever); else exit 2."""
    if wait is None or wait == "forever":
        return wait, None
    try:
        return wait, seconds(wait)
    except ValueError as e:
        if after is None:
            return wait, None
        raise click.BadParameter(f"{e} (or a bare number of seconds)", param_hint=flag) from None


@click.command()
@click.argument("message_id")
@click.option("--agent", help="Read it from this agent's inbox, and mark it read there (default: RELAY_AGENT's, "
                                "or the ledger's copy when that agent's inbox does not hold it).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
@handle_errors
def read(ctx, message_id, agent, as_json):
    """Print one message whole: from an agent's inbox, or as the ledger has it."""
    project = _project(ctx)
    name = agent or default_agent()
    if name:
        me = Agent(name, project=project, role="agent")
        m = me.read(message_id) if agent else me.find(message_id)     # RELAY_AGENT's: any message it may name
        _show(me, [m], me.unread_own(m), as_json, False, single=True)      # find() may give another's copy
    else:
        _show(None, [project.message(message_id)], False, as_json, False, single=True)


@click.command("mark-read")
@click.argument("message_ids", nargs=-1, required=True, metavar="ID...")
@click.option("--agent", callback=acting(agent_name, "--agent NAME"),
              help="The agent whose inbox holds them; default: RELAY_AGENT.")
@pass_ctx
@handle_errors
def mark_read(ctx, message_ids, agent):
    """Mark read the messages of AGENT's inbox with these ids (or unique prefixes). An id that is
    not in the inbox refuses the whole command (exit 1) before anything is marked."""
    me = Agent(agent, project=_project(ctx), role="agent")
    for m in me.mark_read(message_ids):
        echo(f"{m.id}: {'marked read' if m.id in me.marked else 'read already'}")


@click.command()
@click.argument("query")
@click.option("--agent", callback=acting(agent_name, "--agent NAME", required=False),
              help="Search as this agent: its inbox and what it sent (default: RELAY_AGENT; without it, every message).")
@click.option("--from", "sender", callback=checked(agent_name), help="Sent by this agent.")
@click.option("--thread", help="In this thread (a thread named by a message's id holds that message).")
@click.option("--since", help="Discovered at or after (2026-11-30, 2026-11-30T10:00, or 2h = 2 hours ago).")
@click.option("--limit", type=click.IntRange(1, None), default=20, show_default=True, help="At most N messages.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@pass_ctx
@handle_errors
def search(ctx, query, agent, sender, thread, since, limit, as_json):
    """Messages whose subject or body holds every word of QUERY (any case; "a phrase", prefix*),
    newest first, each with a snippet of its body."""
    project = _project(ctx)
    if agent is not None:
        agent = Agent(agent, project=project, role="agent").name
    found = project.search(query, agent=agent, sender=sender, thread=thread, since=moment(since, "--since"),
                           limit=limit)
    if as_json:
        out_json(found)
    elif not found:
        echo("no messages match")
    else:
        for i, f in enumerate(found):
            thread_ = f"  [{f['thread']}]" if f["thread"] else ""
            echo(views.plain(f"{f['id']}  {f['sent_at'] or ''}  {f['from']} -> {', '.join(f['to'])}{thread_}  "
                             f"{f['subject'] or ''}").rstrip())
            echo("    " + views.plain(" ".join((f["snippet"] or "").split())))


def _show(me, items, ack, as_json, jsonl, empty=None, single=False):
    """Print, flush, then mark read what was printed: nothing is marked read unseen."""
    shown = [m for m in items if m.state == "new" and not m.error] if ack else []
    docs = [m.as_dict() | ({"state": "cur", "path": str(me.inbox_.read_path(m.path))} if m in shown else {})
            for m in items]
    if as_json:
        out_json(docs[0] if single else docs)
    elif jsonl:
        for d in docs:
            echo_json(d)
    elif not items:
        echo(empty)
    else:
        for i, m in enumerate(items):
            if i:
                echo()
            echo(views.message_text(m, i + 1, len(items), state="cur" if m in shown else None))
    sys.stdout.flush()
    if shown:
        try:
            me.ack(shown)
        except (RelayError, OSError) as e:
            if not single:
                raise
            # `relay read` of a project it cannot write (a read-only mount): it was read all the same
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            echo(f"relay: {shown[0].id} could not be marked read ({why}); it stays new", err=True)


COMMANDS = [send, inbox, read, mark_read, search]
