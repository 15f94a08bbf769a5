"""Receipts and acknowledgements from the shell: `relay ack ID [--note TEXT]`, `relay overdue`,
the receipts `relay show ID` prints, and `relay send --wait-read / --wait-acked` (agent.py's
options, waited for here)."""
import sys

import click

from relay.agent.api import Agent, Project
from relay.agent.receipts import shown, wait_step
from relay.cli.context import out_json, pass_ctx
from relay.config import default_agent, show_duration
from relay.core.message import iso
from relay.files.lock import holder
from relay.arguments import acting, agent_name, handle_errors
from relay.operator import views
from relay.terminal import echo

EXIT_TIMEOUT = 124
EXIT_INTERRUPTED = 130
STEP_WORDS = {"read": "read", "acked": "acknowledged"}


def wait_for_step(me, mid, step, timeout):
    """--wait-read / --wait-acked: exit 0 once every recipient has `step` it, 1 when it failed
    (the reason), EXIT_TIMEOUT when the time ran out (what it still waits for)."""
    running = holder(me.layout.lock) is not None
    try:
        done, reason = wait_step(me.project, mid, step, timeout)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    if done is None:
        waited = show_duration(timeout) if timeout else "0s"
        echo(f"relay: {mid} was not {STEP_WORDS[step]} by every recipient in {waited} ({reason}"
             f"{'' if running else '; no relay daemon is running'})", err=True)
        sys.exit(EXIT_TIMEOUT)
    if done is False:
        echo(f"relay: {mid} was not delivered: {reason}", err=True)
        sys.exit(1)


def receipts_text(led, row):
    """The lines `relay show` adds for a message's receipts (each recipient's steps)."""
    priority, ack = led.receipts.asks(row["id"])
    copies = led.receipts.of(row["id"])
    out = [f"  {'priority':<14} {priority}", f"  {'ack_required':<14} {'yes' if ack else 'no'}"]
    if copies:
        out.append("receipts:        delivered                    surfaced                     read"
                   "                         acknowledged")
        for c in copies:
            cells = [iso(c[k]) if isinstance(c[k], (int, float)) else "-" for k in
                     ("delivered_at", "surfaced_at", "read_at", "acked_at")]
            out.append(f"  {views.plain(c['recipient']):<14} " + " ".join(f"{x:<28}" for x in cells).rstrip())
            if c["note"]:
                out.append(f"  {'':<14} note: {views.plain(c['note'])[:200]} (reply {c['reply_id']})")
    return out


def receipts_json(led, row):
    priority, ack = led.receipts.asks(row["id"])
    return {"priority": priority, "ack_required": ack, "receipts": [shown(c) for c in led.receipts.of(row["id"])]}


@click.command()
@click.argument("message_id", metavar="ID")
@click.option("--note", help="A note for the sender: it goes back as a reply in the message's thread.")
@click.option("--agent", callback=acting(agent_name, "--agent NAME"),
              help="The agent whose inbox holds it; default: RELAY_AGENT.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
@handle_errors
def ack(ctx, message_id, note, agent, as_json):
    """Acknowledge message ID of AGENT's inbox: it is marked read, its sender sees it in the
    receipts, and --note goes back to the sender as a reply in the thread."""
    me = Agent(agent, project=Project(config=ctx.cfg), role="agent")
    done = me.ack_message(message_id, note=note)
    if as_json:
        out_json(done)
    elif done["acked"]:
        echo(f"{done['id']}: acknowledged" + (f"; the note went back as {done['reply_id']}" if done["reply_id"] else ""))
    else:
        echo(f"{done['id']}: acknowledged before; nothing sent again")


@click.command()
@click.option("--agent", help="Only the messages this agent sent (default: RELAY_AGENT; without it, all).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@pass_ctx
@handle_errors
def overdue(ctx, agent, as_json):
    """The acknowledgements asked for (ACK: required) that wait longer than ack_overdue: each
    message and recipient, oldest first. An agent sees its own messages; an operator all."""
    agent = agent or default_agent()
    project = Project(config=ctx.cfg)
    if agent is not None:
        agent = Agent(agent, project=project, role="agent").name
    now = project.clock()
    history = project.history()
    rows = []
    if history is not None:
        with history:
            rows = history.receipts.overdue(now - ctx.cfg.ack_overdue, sender=agent)
    if as_json:
        out_json([shown(r) | {"waiting_s": round(now - r["delivered_at"], 3)} for r in rows])
        return
    if not rows:
        echo(f"no acknowledgement waits longer than {show_duration(ctx.cfg.ack_overdue)}")
        return
    for r in rows:
        seen = "read" if r["read_at"] else "surfaced" if r["surfaced_at"] else "not seen"
        echo(views.plain(f"{r['id']}  {r['sender']} -> {r['recipient']}  waiting {_age(now - r['delivered_at'])}"
                         f"  ({seen})  {r['subject'] or ''}").rstrip())


def _age(seconds):
    s = int(max(0, seconds))
    return f"{s}s" if s < 60 else f"{s // 60}m" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m" if s < 86400 \
        else f"{s // 86400}d{s % 86400 // 3600}h"


COMMANDS = [ack, overdue]
