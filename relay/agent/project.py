"""A relay project as an agent finds it (Project: the configuration, the known agents and the
agent registry's view of them, the ledger read for a message or a thread), a message as an
agent reads it (Received), and the agents' names: checked against the known ones with the
closest match, created and declared. api.py's Agent is built on them."""
import contextlib
import dataclasses
import datetime
import os
import sqlite3
import threading
import time

import orjson

from relay import config as config_mod
from relay import names as reserved_names
from relay.config import AGENT_NAME, AGENT_NAME_RULE
from relay.errors import InvalidName, NotFound, RelayError, UnknownAgent
from relay.ledger.history import History
from relay.core import registry
from relay.core.inbox import Inbox
from relay.files.layout import Layout
from relay.files.lock import wake
from relay.ledger.ledger import Ledger
from relay.ledger.search import match
from relay.core.message import TEXT_PLAIN, closest, iso
from relay.agent.state import TeamState


@dataclasses.dataclass(frozen=True)
class Received:
    """One message in an agent's inbox (its envelope, contract §3)."""
    id: str
    sender: str
    to: list
    kind: str
    thread: str
    subject: str
    body: str
    headers: dict
    sent_at: str
    relayed_at: str
    state: str              # "new" (not read yet) or "cur" (read)
    path: str
    error: str = None       # an envelope relay could not read: shown, never marked read
    content_type: str = TEXT_PLAIN
    priority: str = "normal"        # urgent, high, normal or low (PRIORITY:)
    ack_required: bool = False      # the sender asks for an acknowledgement (ACK: required)

    @classmethod
    def of(cls, doc, state, path):
        def text(key):
            value = doc.get(key)
            return value if isinstance(value, str) else None
        to = doc.get("to")
        return cls(id=text("id") or os.path.basename(str(path)).split(".")[0], sender=text("from"),
                   to=[t for t in to if isinstance(t, str)] if isinstance(to, list) else [],
                   kind=text("kind"), thread=text("thread"), subject=text("subject"), body=text("body") or "",
                   headers=doc.get("headers") if isinstance(doc.get("headers"), dict) else {},
                   sent_at=text("sent_at"), relayed_at=text("relayed_at"), state=state, path=str(path),
                   error=text("error"), content_type=text("content_type") or TEXT_PLAIN,
                   priority=text("priority") or "normal", ack_required=doc.get("ack_required") is True)

    def as_dict(self):
        """The envelope's fields (`from` for the sender), with `state` and `path`."""
        doc = {"id": self.id, "from": self.sender, "to": self.to, "kind": self.kind, "thread": self.thread,
               "subject": self.subject, "body": self.body, "headers": self.headers, "sent_at": self.sent_at,
               "relayed_at": self.relayed_at, "state": self.state, "path": self.path,
               "content_type": self.content_type, "priority": self.priority, "ack_required": self.ack_required}
        if self.error:
            doc["error"] = self.error
        return doc

    @property
    def reply_thread(self):
        """The thread a reply belongs to: this message's, or its id when it had none or one no
        reply can name (a thread of several lines, which a JSON message file may hold)."""
        if self.thread and "\n" not in self.thread and "\r" not in self.thread:
            return self.thread
        return self.id


def check_known(name, known, role):
    """`name` when it is a known agent; UnknownAgent naming the closest match and the known
    ones otherwise."""
    if not AGENT_NAME.match(name):
        raise InvalidName(f"invalid agent name {name!r} ({role}): agent names match {AGENT_NAME_RULE}")
    if name in known:
        return name
    near = closest(name, known)
    hint = f"; did you mean {near}?" if near else ";"
    names = sorted(known)
    listed = ", ".join(names[:30]) + (f" ... ({len(names)} in all)" if len(names) > 30 else "")
    raise UnknownAgent(f"unknown {role} {name!r}{hint} known agents: {listed or '(none)'} "
                       "(--create adds a new agent on purpose)")


class Project(TeamState):
    """A relay project found like git: `root` when given, else RELAY_ROOT, else the current
    directory or its nearest parent holding the state directory. Its team state: state.py."""

    def __init__(self, root=None, state_dir=None, env=None, cwd=None, config=None, clock=time.time):
        self.clock = clock          # what time it is for leases (file reservations)
        if config is None:
            found = config_mod.discover(root, state_dir, env, cwd=cwd)
            config = config_mod.load(found, state_dir, env=env)
        self.config = config
        self.layout = Layout(self.config.root, self.config.state_dir)
        self._writer = None         # the ledger, for the ids sent (reserve)
        self._writing = threading.Lock()

    def close(self):
        """Close the descriptors of the state directory and the ledger (opened again when next
        needed)."""
        with self._writing:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        self.layout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def agents(self, active=False):
        """The known agents, sorted (contract §2), with a federation's agents of other nodes;
        with `active`, only those the agent registry has active (registry())."""
        if active:
            return [r.name for r in self.registry() if r.active]
        names = self.layout.agent_names(self.config.agents)
        if self.config.federation is not None:
            history = self.history()
            if history is not None:
                with history:
                    names |= {n for n, (node, _) in history.remote.agents().items()
                              if node != self.config.federation.node}
        return sorted(names)

    def registry(self, active=False):
        """The known agents (agents()) as the agent registry has them (core/registry.Registered:
        name, state, metadata, spawned_at/by, released_at/by), sorted by name; one never spawned
        or released is active with empty metadata. With `active`, only the active ones."""
        names = self.agents()
        history = self.history()
        if history is None:
            found = [registry.Registered(n) for n in names]
        else:
            with history:
                roster = registry.roster(history, names)
            found = [roster[n] for n in names]
        return [r for r in found if r.active] if active else found

    def registered(self, name):
        """One agent as the registry has it (registry()); NotFound naming the closest known agent
        when relay knows no agent `name`."""
        found = {r.name: r for r in self.registry()}
        if name not in found:
            near = closest(name, list(found))
            raise NotFound(f"no agent {name!r}{f'; did you mean {near}?' if near else ''} (no outbox or inbox "
                           "directory, not in config `agents`, never spawned)")
        return found[name]

    def released(self, names):
        """The Registered of each of `names` a release made inactive (what a send tells its sender);
        [] when the ledger cannot say (a send does not fail for it)."""
        if not names or not self.layout.ledger.exists():
            return []
        try:
            with self.writing() as ledger:
                return registry.released(History(ledger), names)
        except (sqlite3.Error, RelayError):
            return []

    def archived(self):
        """{name: (archived_at, actor)} of the agents an operator archived; {} with no ledger."""
        return archived(self.layout)

    def refusal(self, sender, names, kind=None):
        """Why `sender` cannot send a message of `kind` to `names` at all, or None: a reserved name
        spelt otherwise than relay spells it (names.py), a kind relay writes itself, an archived
        sender or recipient (with the operator's way back)."""
        for n in names:
            problem = reserved_names.address_problem(n)
            if problem is not None:
                return problem
        problem = reserved_names.kind_problem(kind, sender)
        if problem is not None:
            return problem
        archived = self.archived()
        for name, sending in ((sender, True), *((n, False) for n in names)):
            why = registry.archived_refusal(name, archived, sender=sending)
            if why is not None:
                return why
        return None

    @contextlib.contextmanager
    def writing(self):
        """The ledger to write, one caller at a time. The connection is kept for the next write
        (closing the last one checkpoints the log) until close()."""
        with self._writing:
            if self._writer is None:
                self._writer = Ledger(self.layout.ledger, durability=self.config.durability)
            yield self._writer

    def reserve(self, mid, sender, request_id=None):
        """Record in the ledger that `relay send` gives `mid` to `sender` (ledger/senders.py): a file
        of another outbox that copies it cannot have it. With a request id the sender used on a
        message that did not fail (read by relay or still in the outbox), nothing is recorded and
        that message's id is returned (None otherwise)."""
        try:
            with self.writing() as ledger:
                return ledger.senders.reserve_id(mid, sender, time.time(), request_id)
        except sqlite3.Error as e:
            raise RelayError(f"cannot record the message's id in the ledger ({e}); nothing was sent") from None

    def history(self):
        """The ledger read-only (close it, or use `with`); None when there is no ledger yet."""
        if not self.layout.ledger.exists():
            return None
        return History(Ledger(self.layout.ledger, readonly=True))

    def message(self, mid, agent=None):
        """A message from any recipient's inbox, or from the ledger when no inbox holds it; with
        `agent`, only one that agent sent or received (NotFound else, as for no message)."""
        history = self.history()
        if history is None:
            raise NotFound(f"no message with id {mid!r}: the project has no ledger yet")
        with history:
            row = history.find(mid, visible_to=agent)
        box = Inbox(self.layout, None)
        for recipient in _recipients(row):
            found = box.envelope(recipient, row["id"])
            if found is not None:
                return Received.of(found[2], found[0], found[1])
        return Received(id=row["id"], sender=row["sender"], to=_recipients(row), kind=row["kind"],
                        thread=row["thread"], subject=row["subject"], body=row["body"] or "",
                        headers=_json(row["headers"]) or {}, sent_at=_when(row["sent_at"]),
                        relayed_at=_when(row["delivered_at"]), state=row["status"], path=None,
                        error=row["error"], content_type=row["content_type"] or TEXT_PLAIN)

    def search(self, query, agent=None, sender=None, thread=None, since=None, limit=20):
        """Messages whose subject or body holds every word of `query` (`"a phrase"`, `prefix*`),
        newest first, at most `limit`: with `agent`, only those it may see (its inbox and what it
        sent); `sender`, `thread` and `since` (epoch seconds, a duration such as "2h" meaning
        that long ago, or an ISO date) narrow them. Each a dict: id, from, to, kind, thread,
        subject, snippet (the body around the words found, each between ** and **), sent_at,
        status."""
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise RelayError(f"the limit must be a whole number of messages, 1 or more, not {limit!r}")
        since = instant(since)
        match(query)                    # a query past its bounds is refused, with a ledger or without
        history = self.history()
        if history is None:
            return []
        with history:
            rows = history.search.messages(query, agent=agent, sender=sender, thread=thread, since=since, limit=limit)
        return [{"id": r["id"], "from": r["sender"], "to": _recipients(r), "kind": r["kind"], "thread": r["thread"],
                 "subject": r["subject"], "snippet": r["snippet"], "sent_at": _when(r["sent_at"]),
                 "status": r["status"]} for r in rows]

    def thread(self, thread, limit=None, agent=None):
        """The messages of a thread, oldest first, as ledger records with their bodies; a thread
        named by a message's id starts with that message. With `limit`, the newest that many;
        with `agent`, only those that agent sent or received."""
        return self.thread_page(thread, limit, agent)[0]

    def thread_page(self, thread, limit=None, agent=None):
        """(thread(thread, limit, agent), how many earlier messages of it were left out)."""
        from relay.operator import views
        history = self.history()
        if history is None:
            return [], 0
        with history:
            rows = [views.record(r) | {"body": r["body"]}
                    for r in history.audit(thread=thread, limit=limit, visible_to=agent)]
            more = history.thread_size(thread, agent) - len(rows) if limit and len(rows) == limit else 0
        return rows[::-1], max(more, 0)


def archived(layout):
    """{name: (archived_at, actor)} of the agents an operator archived (`relay archive-agent`);
    {} with no ledger."""
    if not layout.ledger.exists():
        return {}
    with History(Ledger(layout.ledger, readonly=True)) as history:
        return history.archived_agents()


def check_new(layout, names, configured=()):
    """InvalidName when one of `names`, agents about to be made, is a name relay keeps for itself,
    or would be another agent's in another case (`ann` beside `Ann`: registry.everyone, whether
    it has directories, is declared, in the ledger or archived; or another of `names`)."""
    for name in names:
        reserved_names.agent(name)
    if layout.ledger.exists():
        with History(Ledger(layout.ledger, readonly=True)) as history:
            existing = registry.everyone(layout, configured, history)
    else:
        existing = registry.everyone(layout, configured)
    names = list(names)
    for i, name in enumerate(names):
        problem = reserved_names.namesake_problem(name, existing | set(names[:i]))
        if problem is not None:
            raise InvalidName(problem)


def create_agents(layout, names, how, configured=()):
    check_new(layout, names, configured)
    problems = layout.init(names)
    if problems:
        raise RelayError("; ".join(problems))
    declare(layout, names, how)


def declare(layout, names, how, durability="full"):
    """Record in the ledger that these agents are senders (with `senders = "declared"` relay
    reads only the outboxes of declared agents and those listed in `agents`); `how` says what
    declared them. A running daemon is woken to look at their outboxes now."""
    if not names:
        return
    try:
        with Ledger(layout.ledger, durability=durability) as ledger:
            ledger.senders.declare(names, time.time(), how)
    except sqlite3.Error as e:
        raise RelayError(f"cannot record the agents {', '.join(names)} in the ledger ({e})") from None
    wake(layout.lock)


def instant(value):
    """An instant as epoch seconds: a number is one; a string is a duration meaning that long ago
    ("90s", "2h", "7d") or an ISO date or time (UTC unless it says otherwise); None stays None."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    if isinstance(value, str):
        try:
            return time.time() - config_mod.parse_duration(value)
        except ValueError:
            pass
        try:
            moment = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=datetime.timezone.utc)
            return moment.timestamp()
    raise RelayError(f"{value!r} is neither a date (2026-11-30, 2026-11-30T10:00) nor a duration (90s, 15m, 12h, 7d)")


def _json(raw):
    try:
        return orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return None


def _recipients(row):
    value = _json(row["recipients"])
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _when(ts):
    return iso(ts) if isinstance(ts, (int, float)) else None
