"""The agent registry: which agents are active, and what the `spawn` that started each said of
it (contract §2's control kinds; the rows are the ledger's, ledger/registry.py).

- A `spawn` message registers the agent its NAME names: active, with its metadata (CLI, CWD,
  MODEL and ACTION as given, the task: a TASK key, else the body, at most TASK_CHARS characters;
  who spawned it, when, the spawn's id). A spawn of an agent registered before makes it active
  again, its metadata replaced. An agent that had no directory gets its outbox and inbox.
- A `release` marks the agent its NAME names inactive; its metadata stays.
- Both are recorded in the transaction that records the control message as delivered
  (ledger.messages.record, on the loop thread): the registry never says what the ledger does not.
- Refused, like any message relay cannot deliver (quarantined with the reason, its sender
  bounced): a spawn or release with no NAME, a NAME that is no agent name or a reserved one
  (System, Broadcast, `*`, in any case: names.py); a release of an agent relay does not know;
  a spawn of an agent an operator archived, or of a new agent named as a known or archived one
  in another case (`bob` beside `Bob`: names.namesake).
- An agent no spawn or release named (it has an outbox or inbox, or is in config `agents`) is
  active, with empty metadata.
- A message to a released agent is delivered as any other; the sender is told when it sends
  (`relay send`, Agent.send, MCP send: `released()` below).
- An agent an operator archived (`relay archive-agent`) is shown in state `archived` (not
  active) whatever its row says; a send from it or to it is refused at once (archived_refusal).
"""
import dataclasses

import orjson

from relay import names as reserved_names
from relay.config import AGENT_NAME, AGENT_NAME_RULE, SYSTEM
from relay.core.message import closest, iso
from relay.core.work import Outcome
from relay.errors import MessageRefused
from relay.ledger.registry import Change
from relay.ledger.rows import sift
from relay.ledger.schema import AGENT_STATES

KINDS = ("spawn", "release")
ACTIVE, INACTIVE = AGENT_STATES
ARCHIVED = "archived"   # no registry row's state: the state an operator's archive-agent shows, whatever the row says
TASK_CHARS = 4096       # the task a spawn's metadata keeps (the whole body stays in its message)


def _refused(message, text):
    e = MessageRefused(text)
    e.parsed = message
    return e


def check(message, known, archived):
    """Whether relay can apply this spawn or release: MessageRefused with the reason when it
    cannot. `known(refresh=False)`: the known agents' names; `archived()`: the agents an operator
    archived. Returns the name of the agent a spawn makes (one with no directory yet), else None."""
    kind, name = message.kind, message.control.get("name")
    if name is None or not name.strip():
        raise _refused(message, f"a {kind} message names its agent: add 'NAME: <agent>' (\"name\" in JSON)")
    why = reserved_names.why_reserved(name)
    if why is not None:
        done = "spawned" if kind == "spawn" else "released"
        raise _refused(message, f"{why}: it is never {done} (NAME of a {kind} message)")
    if not AGENT_NAME.match(name):
        raise _refused(message, f"invalid agent name {name[:70]!r} in NAME of a {kind} message: agent names "
                                f"match {AGENT_NAME_RULE}")
    names = known()
    if name not in names:
        names = known(refresh=True)
    if kind == "release":
        if name not in names:
            near = closest(name, names)
            hint = f"; did you mean {near}?" if near else ""
            raise _refused(message, f"a release of {name!r}, which is no known agent{hint}")
        return None
    gone = archived()
    if name in gone:
        raise _refused(message, f"agent {name} is archived by an operator: relay delivers nothing to it, so it is "
                                f"not spawned (`relay archive-agent --undo {name}` restores it)")
    if name in names:
        return None
    why = reserved_names.namesake_problem(name, set(names) | set(gone))     # `bob` beside `Bob`, even archived
    if why is not None:
        raise _refused(message, f"{why} (NAME of a spawn message)")
    return name


def everyone(layout, configured=(), history=None):
    """Every agent name relay knows by any account, what a new agent's name may not be in another
    case (names.namesake): a directory in outbox/ or inbox/, config `agents`, and in the ledger
    (`history`, when given) a declared agent, a sender or recipient it saw, a registry row, an
    archived agent."""
    found = layout.listed() | set(configured)
    if history is not None:
        found |= history.declared_agents() | set(history.archived_agents())
        found |= {r["name"] for r in history.agents()} | {r["name"] for r in history.registry.rows()}
    return {n for n in found if isinstance(n, str)}


def metadata(message, sender, mid, at):
    """What a spawn says of the agent it registers."""
    task = next((v for k, v in message.headers.items() if k.lower() == "task" and isinstance(v, str)), None)
    if task is None:
        task = message.body.strip() or None
    meta = {"cli": message.control.get("cli"), "cwd": message.control.get("cwd"),
            "model": message.control.get("model"), "task": task[:TASK_CHARS] if task else None}
    if message.control.get("action") is not None:
        meta["action"] = message.control["action"]
    meta.update(spawned_by=sender, spawned_at=iso(at), spawn_id=mid)
    return meta


def changes(works, at):
    """The registry's changes (ledger Change) a recorded batch makes, in its messages' order:
    each spawn and release delivered to every recipient in it (`at`: when it is recorded)."""
    out = []
    for w in works:
        m = w.message
        if (m is None or m.kind not in KINDS or w.duplicate_of or w.sender == SYSTEM
                or w.outcome not in (Outcome.ARCHIVED, Outcome.DELIVERED) or w.refused):
            continue
        name = m.control.get("name")
        if reserved_names.agent_problem(name) is not None:
            continue        # refused when it was read (check): never here
        out.append(Change(m.kind, name, w.sender, w.id, metadata(m, w.sender, w.id, at) if m.kind == "spawn" else None))
    return out


def _when(ts):
    return None if ts is None else iso(ts)


@dataclasses.dataclass(frozen=True)
class Registered:
    """One agent as the registry has it; an agent with no row is active with empty metadata.
    Times are UTC ISO 8601."""
    name: str
    state: str = ACTIVE
    metadata: dict = dataclasses.field(default_factory=dict)
    spawned_at: str = None
    spawned_by: str = None
    released_at: str = None
    released_by: str = None

    @property
    def active(self):
        return self.state == ACTIVE

    @classmethod
    def of(cls, row):
        """The Registered of a registry row this build can read (rows.sift)."""
        return cls(name=row["name"], state=row["state"], metadata=orjson.loads(row["metadata"]),
                   spawned_at=_when(row["spawned_at"]), spawned_by=row["spawned_by"],
                   released_at=_when(row["released_at"]), released_by=row["released_by"])

    def fields(self):
        """The registry's fields, without the name: state, metadata, spawned_at, spawned_by,
        released_at, released_by."""
        return {"state": self.state, "metadata": self.metadata, "spawned_at": self.spawned_at,
                "spawned_by": self.spawned_by, "released_at": self.released_at, "released_by": self.released_by}

    def as_dict(self):
        return {"name": self.name, **self.fields()}


def roster(history, names, bad=None):
    """{name: Registered} of the agents `names` and of every agent the registry has, sorted by
    name. A registry row this build cannot read is appended to `bad` (a BadRow) and its agent
    shown as one never spawned."""
    rows = {r["name"]: Registered.of(r) for r in sift(history.registry.rows(), [] if bad is None else bad,
                                                        "agent_registry")}
    archived = history.archived_agents()
    out = {n: rows.get(n) or Registered(n) for n in sorted(set(names) | set(rows))}
    return {n: dataclasses.replace(r, state=ARCHIVED) if n in archived else r for n, r in out.items()}


def archived_refusal(name, archived, sender=False, outcome="nothing was sent"):
    """The reason a send is refused at once when `name` (the sender, with `sender`; else a
    recipient) is an agent an operator archived (`archived`: History.archived_agents()), or None.
    `outcome`: what became of the request."""
    if name not in archived:
        return None
    at, actor = archived[name]
    what = "relay accepts nothing from it" if sender else "relay delivers nothing to it"
    since = f" since {iso(at)}" if isinstance(at, (int, float)) else ""
    return (f"agent {name} is archived{since} by {actor or 'an operator'}: {what}, so {outcome} "
            f"(an operator restores it: `relay archive-agent --undo {name}`)")


def released(history, names):
    """The Registered of each of `names` that a release made inactive, by name."""
    return [Registered.of(r) for r in sift(history.registry.rows(names), [], "agent_registry")
            if r["state"] == INACTIVE]
