"""The operator's hold on agents: `relay ping` (an envelope from System in the agent's inbox,
written the way relay delivers, whose move to cur/ says the agent is alive and reading) and
`relay archive-agent` (an agent retired: relay accepts nothing from it and delivers nothing to
it; its inbox and history stay), with its undo. Each returns a commands.Result."""
import hashlib
import time

from relay.operator.commands import Result
from relay.config import SYSTEM
from relay.errors import NotFound, RelayError
from relay.ledger.history import History
from relay.ids import IdGenerator
from relay.core.notices import put
from relay.core.message import Message, envelope, iso
from relay.operator.views import when_or_raw
from relay.core.work import Work

PING_BODY = ("relay ping: is this agent alive and reading its inbox? Take this message as any other "
             "(move it from new/ to cur/, e.g. `relay inbox {agent} --ack`); nothing else to do.")


def _known(layout, configured, name):
    return name in layout.agent_names(configured)


def ping(ledger, layout, agent, actor, configured=(), now=None, durability="full"):
    """A ping envelope in the agent's inbox (tmp/, synced, linked into new/, synced) and its
    record in the ledger."""
    now = time.time() if now is None else now
    if agent == SYSTEM:
        raise RelayError(f"{SYSTEM} is relay's own inbox; ping an agent")
    if agent in History(ledger).archived_agents():
        raise RelayError(f"agent {agent} is archived: relay delivers nothing to it "
                         f"(`relay archive-agent --undo {agent}` restores it)")
    if not _known(layout, configured, agent):
        raise NotFound(f"no agent {agent!r} (no outbox or inbox directory, not in config `agents`)")
    pid = IdGenerator().new(now)
    message = Message(to=(agent,), kind="ping", thread=None, subject="ping from relay",
                      body=PING_BODY.format(agent=agent), headers={}, control={}, format="json")
    data = envelope(pid, SYSTEM, [agent], message, now, now, "ping", None)
    work = Work(id=pid, sender=SYSTEM, name="ping", archive_rel=None, retries=0, earlier_attempt=False,
                recipients=[agent], envelope=data, envelope_sha256=hashlib.sha256(data).hexdigest())
    put(layout, work, "ping", durability)
    ledger.operations.ping(pid, agent, now, actor)
    return Result([f"pinged {agent}: inbox/{agent}/new/{pid}.json; `relay queues` or `relay agents` shows "
                   "when it is read"])


def ping_state(fs, agent, ping, now):
    """What became of an agent's last ping (id, sent_at): waiting in new/ (for `age_s`), read
    (in cur/; `read_after_s`: the file's change time there, which the move set, minus when it
    was sent), or gone (the agent deleted it). None when it was never pinged."""
    if ping is None:
        return None
    pid, sent = ping
    doc = {"id": pid, "sent_at": iso(sent) if isinstance(sent, (int, float)) else sent}
    try:
        fs.lstat(f"inbox/{agent}/new/{pid}.json")
        return {**doc, "state": "waiting", "age_s": round(now - sent, 3)}
    except (OSError, TypeError):
        pass
    try:
        for e in fs.scandir(f"inbox/{agent}/cur"):
            if e.name.startswith(f"{pid}.json"):
                read = e.stat(follow_symlinks=False).st_ctime
                return {**doc, "state": "read", "read_after_s": round(max(0.0, read - sent), 3)}
    except (OSError, TypeError):
        pass
    return {**doc, "state": "gone"}


def archive_agent(ledger, layout, name, actor, configured=(), now=None, undo=False):
    """Archive the agent (or, with `undo`, restore it). Idempotent."""
    now = time.time() if now is None else now
    if name == SYSTEM:
        raise RelayError(f"{SYSTEM} is relay's own inbox and cannot be archived")
    archived = History(ledger).archived_agents()
    if undo:
        if not ledger.operations.archive_agent(name, now, actor, undo=True):
            return Result([f"{name}: not archived; nothing changed"])
        return Result([f"{name}: restored; relay accepts its messages and delivers to it again. What was "
                       f"quarantined while it was archived stays in failed/{name}/ (`relay retry ID`)"])
    if name in archived:
        return Result([f"{name}: archived already (since {when_or_raw(archived[name][0])} by {archived[name][1]}); "
                       "nothing changed"])
    if not _known(layout, configured, name):
        raise NotFound(f"no agent {name!r} (no outbox or inbox directory, not in config `agents`)")
    ledger.operations.archive_agent(name, now, actor)
    return Result([f"{name}: archived; relay accepts nothing from it and delivers nothing to it (senders get the "
                   f"reason). What waits in outbox/{name}/ is quarantined by the daemon now, or by the next "
                   f"`relay run`. Its inbox and history stay. `relay archive-agent --undo {name}` restores it"])
