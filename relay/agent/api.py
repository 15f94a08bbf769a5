"""The agent's side of relay, for programs: send, read, wait, acknowledge, reply.

    import relay
    me = relay.Agent("bob")                 # finds .relay/ here or in a parent, like git
    mid = me.send("alice", "the tests are green", subject="review", thread="review-42")
    for m in me.wait(timeout=60):           # blocks until a message is there; [] on timeout
        print(m.sender, m.subject, m.body)
        me.reply(m, "thanks")
    me.ack(...)                             # marks read what was shown

The project, a message as read (Received) and the agents' names are in project.py; which
agents are active, and what their spawn said of them, in the agent registry (Agent.agents(),
Project.registry(), core/registry.py). The CLI's agent verbs (send, inbox, read) are built on
this, so both check the same things:
names against the known agents (an unknown one is refused with the closest match), an id that
`relay show` finds at once (the sender's file carries it, and the ledger records it as that
sender's before the file is written), request ids that make a repeated send harmless. Messages are written the way contract §2 asks: a hidden temporary, synced, renamed
into the outbox under a name no other message uses.
"""
import dataclasses
import os
import time

from relay.config import AGENT_VARIABLE, SYSTEM, default_agent
from relay.agent.delivery import delivered, seconds_of, wait_seconds
from relay.errors import InvalidName, MessageRefused, NotFound, RelayError
from relay.files.fs import Unsafe
from relay.ids import IdGenerator
from relay.core.inbox import Inbox
from relay.files.layout import valid_id
from relay.agent.leases import Leases
from relay.agent.state import AgentState
from relay.agent.registering import Registering
from relay.agent.receipts import AgentReceipts, by_priority
from relay.agent.mail import NewMail, Stop  # noqa: F401  (Stop is part of the API: Agent.wait's `stop=`)
from relay.agent.project import (Project, Received, check_known, closest, create_agents, declare)  # noqa: F401  (offered here too)
from relay.core.message import BROADCAST, MAX_HEADER_BYTES, MAX_HEADER_LINE, MAX_REQUEST_ID, retry_budget
from relay.core.message import content_type as message_content_type, request_id as checked_request_id
from relay.core.message import ack_required as checked_ack, priority as checked_priority
from relay.files.sync import Syncer

_ids = IdGenerator()


def one_line(value, what):
    if value is not None and ("\n" in value or "\r" in value):
        raise RelayError(f"{what} must be one line")
    return value


def compose(to, body, *, mid, kind=None, thread=None, subject=None, request_id=None, content_type=None,
            max_retries=None, control=None, priority=None, ack_required=False):
    """The bytes of a message file in the header format (contract §2); `control`: a spawn's or
    release's keys ({"name": ..., "cli": ...})."""
    lines = [f"ID: {mid}", f"TO: {', '.join(to)}"]
    for key, value in (("KIND", kind), ("THREAD", thread), ("SUBJECT", subject), ("REQUEST-ID", request_id),
                       ("CONTENT-TYPE", content_type),
                       ("MAX-RETRIES", None if max_retries is None else str(max_retries)),
                       ("PRIORITY", None if priority in (None, "normal") else priority),
                       ("ACK", "required" if ack_required else None),
                       *((k.upper(), v) for k, v in (control or {}).items())):
        if value is not None:
            lines.append(f"{key}: {one_line(value, key.lower())}")
    # What relay's parser would refuse is refused here, before the file is written.
    for line in lines:
        if len(line) > MAX_HEADER_LINE:
            key, _, value = line.partition(": ")
            what = "the recipient list" if key == "TO" else f"the {key.lower()}"
            raise RelayError(f"{what} is {len(value)} characters long; a header line holds at most "
                             f"{MAX_HEADER_LINE - len(key) - 2} of them")
    head = "\n".join(lines)
    if len(head) > MAX_HEADER_BYTES:
        raise RelayError(f"the headers are {len(head)} characters long, over the {MAX_HEADER_BYTES} relay reads; "
                         "shorten the subject or thread")
    return (head + "\n\n" + body).encode("utf-8")


class Agent(Leases, AgentState, Registering):
    """One agent's side: its outbox to send from, its inbox to read, its file reservations
    (leases.py: reserve, release, reservations), the team state in its name (state.py:
    state_get, state_set, state_delete, state_list), the spawn and release of agents
    (registering.py: spawn, release_agent); its receipts and acknowledgements are receipts.py's
    (`steps`)."""

    def __init__(self, name=None, root=None, *, state_dir=None, create=False, project=None, role="agent"):
        """`name`: the agent's (default: RELAY_AGENT's); `root`: the project's, found like git
        when None."""
        self._mail = None           # the inbox watch wait() keeps
        name = name or default_agent()
        if name is None:
            raise RelayError(f'name the agent: relay.Agent("NAME"), or set {AGENT_VARIABLE}=NAME')
        self.project = project or Project(root, state_dir)
        self.repeated = False       # the last send's request id was used before: nothing was sent
        self.released = []          # the recipients the last send named that a release made inactive (Registered)
        self.marked = []            # the ids the last mark_read() marked read (the others were read already)
        self.layout = self.project.layout
        self._inbox = None          # the Inbox on the layout's current file system (inbox_)
        if not self.layout.state.is_dir():
            raise RelayError(f"no relay state directory at {self.layout.state}: run `relay init` first")
        if create and name != SYSTEM:
            create_agents(self.layout, [name], "created by an agent", self.project.config.agents)
        # System, relay's own inbox (control messages), may be read; it never sends.
        self.name = name if name == SYSTEM else check_known(name, self.project.agents(), role)

    def __repr__(self):
        return f"Agent({self.name!r}, root={str(self.project.config.root)!r})"

    @property
    def steps(self):
        """Receipts and acknowledgements (receipts.py), made per use: an Agent holds no object
        that holds it back, so one dropped without close() frees its descriptors at once."""
        return AgentReceipts(self)

    @property
    def inbox_(self):
        """The inbox on the state directory's descriptors as they are now: after close() they
        are opened again, and the Inbox follows them (never the closed ones)."""
        fs = self.layout.fs
        if self._inbox is None or self._inbox.fs is not fs:
            self._inbox = Inbox(self.layout, Syncer("normal", fs))
        return self._inbox

    def _team_names(self, wanted, wait=2.0, every=0.25):
        """The names of the team's other nodes, as the server has them now. A name not there yet
        may be one another node is announcing (it does within a second of the agent's making):
        the server is asked again for up to `wait` seconds before the name is called unknown."""
        from relay.federation.link import directory
        deadline = time.monotonic() + wait
        while True:
            names = set(directory(self.project.config))
            if all(n in names for n in wanted) or time.monotonic() >= deadline:
                return names
            time.sleep(every)

    # -- sending ----------------------------------------------------------------------------

    def send(self, to, body="", *, subject=None, thread=None, kind=None, request_id=None, create=False,
             wait_delivered=None, content_type=None, max_retries=None, priority=None, ack_required=False):
        """Write a message into this agent's outbox; returns its id, which `relay show` finds.
        `to`: a name, a list of names, "*" (or its alias "Broadcast") or "System". With a request id used before by this
        agent (on a message that did not fail), nothing is written and that message's id is
        returned: a send retried after a timeout is not delivered twice. A recipient named that
        a release made inactive is written to all the same; `released` then lists it (each a
        Registered: name, released_at, released_by, ...). With `wait_delivered`
        (seconds, or True: for ever) it returns once every recipient has the message, and
        raises NotDelivered with the reason when it failed (DeliveryTimeout when the time ran
        out first). `content_type` (default text/plain) says how to read the body; `max_retries`
        how many times a transient failure is retried (at most relay's max_retries); `priority`
        urgent, high, normal (the default) or low; `ack_required` asks each recipient to
        acknowledge it (ack_message)."""
        waits = wait_delivered is not None and wait_delivered is not False
        timeout = None if wait_delivered is True or not waits else wait_seconds(wait_delivered)   # before a write
        mid = self._send(to, body, subject=subject, thread=thread, kind=kind, request_id=request_id, create=create,
                         content_type=content_type, max_retries=max_retries, priority=priority,
                         ack_required=ack_required)
        if waits:
            delivered(self.project, mid, timeout)
        return mid

    def _send(self, to, body, *, subject, thread, kind, request_id, create, content_type=None, max_retries=None,
              control=None, priority=None, ack_required=False):
        if self.name == SYSTEM:
            raise InvalidName(f"{SYSTEM!r} is relay's own name and never a sender: only agents have outboxes")
        names = [n.strip() for n in (to.split(",") if isinstance(to, str) else to) if n.strip()]
        if not names:
            raise RelayError("no recipient: give a name, a list of names, '*' or System")
        refusal = self.project.refusal(self.name, names, kind)     # a reserved name or kind, an archived agent
        if refusal is not None:
            raise InvalidName(refusal)
        known = set(self.project.agents())
        special = (*BROADCAST, SYSTEM)         # '*' and its alias Broadcast, relay's own inbox
        unknown = [n for n in names if n not in special and n not in known]
        federation = self.project.config.federation
        if unknown and federation is not None and federation.url is not None:    # a node not heard of yet
            known |= self._team_names(unknown, wait=0.0 if create else 2.0)
            unknown = [n for n in unknown if n not in known]
        if unknown and create:
            create_agents(self.layout, unknown, "created by an agent", self.project.config.agents)
            known |= set(unknown)
        for n in names:
            if n not in special:
                check_known(n, known, "recipient")
        self.repeated, self.released = False, []
        if request_id is not None:
            try:
                request_id = checked_request_id(request_id)
            except RelayError:
                raise RelayError(f"--request-id must be one line of at most {MAX_REQUEST_ID} characters") from None
        if not isinstance(body, str):
            raise RelayError(f"the body must be text, not {type(body).__name__}")
        try:        # what the daemon would refuse is refused here
            content_type = None if content_type is None else message_content_type(str(content_type))
            if max_retries is not None:
                if isinstance(max_retries, bool) or not isinstance(max_retries, int):
                    raise MessageRefused(f"max_retries {max_retries!r} is not a whole number from 0 up")
                retry_budget(str(max_retries))
            priority = None if priority is None else checked_priority(str(priority))
            if not isinstance(ack_required, bool):
                checked_ack(str(ack_required))
                raise MessageRefused(f"ack_required must be true or false, not {ack_required!r}")
        except MessageRefused as e:
            raise RelayError(str(e)) from None
        size, limit = len(body.encode("utf-8")), self.project.config.max_body_bytes
        if size > limit:        # refused now, not after an exit 0, in the daemon's log
            raise RelayError(f"the body is {size} bytes, over max_body_bytes ({limit}); relay would refuse it: "
                             "send it in parts, or raise max_body_bytes in relay.toml")
        mid = _ids.new(time.time())
        data = compose(names, body, mid=mid, kind=kind, thread=thread, subject=subject, request_id=request_id,
                       content_type=content_type, max_retries=max_retries, control=control, priority=priority,
                       ack_required=ack_required)
        # The id is this sender's before any file names it; a request id sent before (its file
        # maybe still in the outbox) gives that message's id, and nothing is written.
        first = self.project.reserve(mid, self.name, request_id)
        if first is not None:
            self.repeated = True
            return first
        self.layout.fs.put(f"outbox/{self.name}/msg-{mid.lower()}", data)
        # Delivered all the same (its inbox keeps mail); the sender is told (core/registry.py).
        self.released = self.project.released([n for n in names if n not in special])
        return mid

    def receipts(self, mid):
        """What became of a message this agent sent, per recipient (receipts.py)."""
        return self.steps.receipts(mid)

    def wait_receipts(self, mid, step, timeout=None):
        """Block until every recipient has `step` ("read", "acked") the message (receipts.py)."""
        return self.steps.wait_receipts(mid, step, timeout)

    def ack_message(self, mid, note=None):
        """Acknowledge a message of this inbox; `note` goes back as a reply (receipts.py)."""
        return self.steps.ack_message(mid, note)

    def unacknowledged(self):
        """The messages received that ask for an acknowledgement not given yet (receipts.py)."""
        return self.steps.unacknowledged()

    def agents(self, active=False):
        """The project's agents as the agent registry has them (Project.registry): each a
        Registered (name, state, active, metadata, spawned_at/by, released_at/by); with
        `active`, only the active ones."""
        return self.project.registry(active)

    def reply(self, message, body, *, to=None, thread=None, subject=None, **kw):
        """Answer `message` (a Received or an id of a message this agent sent or received): to
        its sender (or `to`), in its thread (or `thread`), subject "Re: " and its subject (or
        `subject`). A reply to a message this agent sent goes to that message's recipients, as a
        mail client's reply to a sent message does (to itself only when it alone was one). A
        message from System (a bounce, a notice) is not answered: System reads no replies
        (RelayError, unless `to` names whom to send to)."""
        if not isinstance(message, Received):
            message = self.find(message)
        if to is None and message.sender == SYSTEM:
            thread = f" --thread {message.reply_thread}" if message.reply_thread else ""
            raise RelayError(f"{message.id} is from {SYSTEM} (a bounce or a notice), and {SYSTEM} reads no replies: "
                             "to answer the people it is about, write to them yourself (relay send --to NAME"
                             f"{thread}; send(to=...) in MCP or Python)")
        if subject is None and message.subject:
            subject = message.subject if message.subject.lower().startswith("re:") else f"Re: {message.subject}"
        if not message.sender:
            raise RelayError(f"{message.id} names no sender to reply to")
        if to is None and message.sender == self.name:
            to = [n for n in message.to if n != self.name] or [self.name]
        return self.send(to or message.sender, body, thread=thread or message.reply_thread, subject=subject, **kw)

    def find(self, mid):
        """A message by id that this agent sent or received: its own copy, else the project's
        (a recipient's copy, or the ledger's). Any other message is NotFound, as one not there."""
        try:
            return self.read(mid)
        except NotFound:
            return self.project.message(mid, agent=self.name)

    def thread(self, thread, limit=None):
        """The messages of `thread` that this agent sent or received, oldest first, as ledger
        records with their bodies (Project.thread, for this agent); with `limit`, the newest that many."""
        return self.project.thread(thread, limit, agent=self.name)

    def thread_page(self, thread, limit=None):
        """(thread(thread, limit), how many earlier messages of it this agent may see were left out)."""
        return self.project.thread_page(thread, limit, agent=self.name)

    def search(self, query, sender=None, thread=None, since=None, limit=20):
        """What this agent may see (its inbox and what it sent) whose subject or body holds every
        word of `query`, newest first: Project.search for this agent."""
        return self.project.search(query, agent=self.name, sender=sender, thread=thread, since=since, limit=limit)

    def sent_before(self, request_id):
        """The id of this agent's message with this request id (not failed: read by relay, or
        one `relay send` wrote that still waits in the outbox), or None."""
        history = self.project.history()
        if history is None:
            return None
        with history:
            return history.by_request(self.name, request_id)

    # -- reading ----------------------------------------------------------------------------

    def inbox(self, ack=False, include_read=False, limit=None, skip=(), recent=0):
        """The new messages (with `include_read`, the read ones too), urgent first (then high,
        normal, low), oldest first within each; nothing is marked read unless `ack`, which marks
        read the new ones returned; each is recorded as surfaced. With `limit`, at most that many
        messages (an unreadable entry ranked before the last of them is among them, not counted),
        and no envelope past them is read (the ledger tells their priority). `skip`: names of new/ entries ("<id>.json")
        to leave out, unread. `recent`: the `recent` newest read messages first (recent())."""
        self._check_inbox()
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise RelayError(f"the limit must be a whole number of messages, 1 or more, not {limit!r}")
        before = self.recent(recent) if recent and not include_read else []
        listed = self.inbox_.list(self.name, include_read, limit=limit, skip=skip, order=self.steps.ranked)
        items = by_priority([Received.of(doc, sub, path) for sub, path, doc in listed])
        self.steps.record("surfaced", [m for m in items if m.state == "new"])
        return before + (self.ack(items) if ack else items)

    def recent(self, n=10):
        """The `n` newest messages of this inbox that are read already (newest by id: by the time
        they were sent), oldest first: what to look at when what a read returned was lost."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise RelayError(f"the number of read messages must be a whole number, 0 or more, not {n!r}")
        self._check_inbox()
        return [Received.of(doc, sub, path) for sub, path, doc in self.inbox_.recent(self.name, n)]

    def mark_read(self, ids):
        """Mark read (new/ -> cur/) the messages of this inbox with these ids (or unique prefixes
        of them); returns them as they are now, in the order named. `marked` says which of them
        this call marked read (the others were read already). An id that is not in the inbox
        refuses the whole call (NotFound) before anything is marked."""
        found, missing = {}, []
        for mid in [ids] if isinstance(ids, str) else ids:
            try:
                m = self.read(mid)
                found.setdefault(m.id, m)
            except NotFound:
                missing.append(mid)
        if missing:
            named = ", ".join(repr(m) for m in missing)
            raise NotFound(f"no message{'s' if len(missing) > 1 else ''} {named} in the inbox of {self.name}; "
                           "nothing was marked read")
        self.marked = [m.id for m in found.values() if m.state == "new" and not m.error]
        return self.ack(list(found.values()))

    def _check_inbox(self):
        """The agent's inbox is plain directories inside the state directory, or RelayError.
        Walked from the top again at each look: a long-lived Agent must not keep reading a
        directory that was renamed away or swapped since its last look."""
        self.layout.fs.forget()
        for where in (f"inbox/{self.name}", f"inbox/{self.name}/new", f"inbox/{self.name}/cur"):
            try:
                self.layout.fs.dir(where)
            except Unsafe as e:
                raise RelayError(f"{e.strerror}: it may lead outside the state directory, and relay reads and "
                                 "moves only files inside it") from None
            except FileNotFoundError:
                pass

    def ack(self, messages):
        """Mark these messages read (new/ -> cur/); returns them as they are now. A message
        read already (here or by another reader of this inbox meanwhile), an envelope relay
        could not read, or another agent's copy (find() may return one) is left as it is."""
        out, moved = [], []
        for m in [messages] if isinstance(messages, Received) else messages:
            if self.unread_own(m):
                try:
                    m = dataclasses.replace(m, state="cur", path=str(self.inbox_.ack(m.path)))
                    moved.append(m)
                except FileNotFoundError:   # taken from new/ by another reader since it was listed?
                    if os.path.lexists(m.path):
                        raise               # no: cur/ is missing, say so
                    done = self.inbox_.read_path(m.path)
                    if os.path.lexists(done):
                        m = dataclasses.replace(m, state="cur", path=str(done))
            out.append(m)
        self.steps.record("read", moved)
        return out

    def unread_own(self, m):
        """Whether `m` is this agent's own copy, readable and still in its new/: what ack() moves."""
        return (m.state == "new" and not m.error and bool(m.path)
                and os.path.dirname(str(m.path)) == os.path.join(str(self.layout.inbox), self.name, "new"))

    def read(self, mid, ack=False):
        """One message of this agent's inbox by id (or unique prefix of it)."""
        self._check_inbox()
        full = mid.upper()
        if full and not valid_id(full):         # a prefix: the ledger knows which message it is
            history = self.project.history()
            if history is not None:
                with history:
                    try:
                        full = history.find(full, visible_to=self.name)["id"]
                    except NotFound:
                        pass
        found = self.inbox_.envelope(self.name, full) if full else None
        if found is None:
            raise NotFound(f"no message {mid!r} in the inbox of {self.name}")
        m = Received.of(found[2], found[0], found[1])
        self.steps.record("surfaced", [m])
        return self.ack([m])[0] if ack else m

    def wait(self, timeout=None, ack=False, listening=None, stop=None, limit=None, skip=()):
        """Block until at least one new message is there and return the new ones (marked read
        with `ack`; an unreadable entry of new/ is among them, never marked read, but does not
        end the wait by itself); [] when `timeout` seconds pass first, or at once when `stop` (a
        Stop) is set from another thread. Woken by inotify (watchdog), not a polling loop.
        `listening` (a threading.Event) is set once an arrival would wake it. `limit` and
        `skip` as for inbox()."""
        if timeout is not None:
            seconds = seconds_of(timeout)
            if seconds != seconds:          # NaN, or no number: no time at all can be meant
                raise RelayError(f"the timeout must be a number of seconds, not {timeout!r}")
            timeout = max(0.0, seconds)
        # A message is what wakes it: an entry of new/ that is no envelope (junk an agent put
        # there) is listed with the messages, but alone it would make every wait return at once.
        got = self.inbox(ack=ack, limit=limit, skip=skip)
        if any(not m.error for m in got) or (stop is not None and stop.is_set()):
            return got
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            # The watch is armed before each look, so nothing that arrives after the look is
            # missed; one whose directory was since replaced (or swapped for a link) is armed
            # again on the directory there now, or the wait ends with the reason.
            if self._mail is None or self._mail.stale():
                self._unwatch()
                self._check_inbox()                     # a link in the way: the reason, at once
                self.layout.make_inbox(self.name)
                box = self.layout.inbox
                self._mail = NewMail([box, box / self.name, box / self.name / "new"]).open()
            if listening is not None:
                listening.set()
            got = self.inbox(ack=ack, limit=limit, skip=skip)
            if any(not m.error for m in got):
                return got
            if stop is not None and stop.is_set():
                return []
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return []
            self._mail.wait(left, stop)

    def close(self):
        """Stop watching the inbox (wait() keeps its watch for the next call: closing an inotify
        descriptor waits for the kernel, some milliseconds) and close the descriptors of the
        state directory. The Agent may be used again: they are opened when next needed."""
        self._unwatch()
        self.project.close()

    def _unwatch(self):
        if self._mail is not None:
            self._mail.close()
            self._mail = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "layout", None) is not None:
            self.close()
        else:           # refused in __init__ before it had a layout
            self._unwatch()


def agents(root=None, state_dir=None, active=False):
    """The known agents of the project found from the current directory (or `root`); with
    `active`, only those the agent registry has active."""
    with Project(root, state_dir) as project:
        return project.agents(active)


__all__ = ["Agent", "Project", "Received", "Stop", "agents"]
