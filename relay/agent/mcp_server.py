"""`relay mcp --agent NAME`: the agent's side of relay as a Model Context Protocol server over
stdio, for agents in MCP clients (Claude Code, Cursor, Codex and the like).

It is built with the official `mcp` SDK (the `agent-outbox-relay[mcp]` extra; its MCPServer, the name FastMCP
had before version 2) on api.py's Agent, so its tools check what the shell and Python check:

    send(to, body, subject, thread, request_id, kind, wait_delivered_s)   (kind: message or continuity)
                        -> {id, repeated, relay_running, delivered, error, timed_out, released}
    reply(id, body)     to the message's sender (its recipients when the agent sent it), in its
                        thread, "Re: " its subject
    inbox(limit, mark_read, recent)  the new messages with their bodies, oldest first; marks read
                        exactly those (unless mark_read is false); the newest read ones too
    wait(timeout_s)     blocks (inotify, in a worker thread) until a message is there, then as inbox
    read(id)            one message, new or read; marks it read
    mark_read(ids)      marks read the messages named
    search(query, ...)  full text over what the agent may see, newest first, with snippets
    agents(active)      who the agent is and the known agents, each active or inactive (released),
                        with what its spawn said of it
    spawn(name, task, cli, cwd, model, action, ...), release_agent(name, note, ...)
                        a spawn or release of an agent (registering.py), as send returns
    thread(thread, limit)  a conversation oldest first, as the ledger has it (from the message
                        whose id names it): the messages the agent sent or received
    reserve(paths, ttl, exclusive, reason), release(paths), reservations(mine)
                        file reservations (leases.py): refused whole, naming the holders
    receipts(id, wait_for, wait_s), acknowledge(id, note)
                        receipts and acknowledgements (mcp_receipts.py); send takes priority
                        and ack_required, and inbox puts urgent first

inbox and wait read only the envelopes they return (the oldest `limit`), in worker threads. A
message is marked read only once the reply holding it was written whole to the client
(mcp_wire.py, relay's stdio transport, says when); until then no other call returns it, and a
reply that is not written (the client gone, the call cancelled) leaves it new. A server whose
client no longer reads exits.

A refusal (an unknown recipient with the closest match, a bad request id, an argument a tool
does not take or of another type than its schema's (mcp_schema.py), a number below its range,
...) comes back as a tool error carrying relay's one-line message; the server goes on. Only this
module, mcp_wire.py, mcp_handover.py (the hand-off), mcp_schema.py (the tools held to their
schemas) and mcp_push.py (the resources relay://inbox/NAME and relay://thread/ID, their
subscriptions, notifications/resources/updated and Claude Code's channel events) import `mcp`;
cli/mcp.py loads them when `relay mcp` runs.
"""
import functools
import logging
import os
import signal
import time
from typing import Annotated, Literal, Optional

import anyio
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field, ValidationError

from relay.version import __version__
from relay.agent.api import Stop
from relay.agent.delivery import wait_delivered
from relay.agent.mcp_handover import (Handover, argument_errors, bounded, fresh, message, tool_errors,  # noqa: F401
                                      words)      # (Handover: offered here too)
from relay.files.lock import holder
from relay.agent.mcp_wire import serve as serve_stdio
from relay.agent.mcp_schema import strict, takes, unadvertised
from relay.agent.mcp_receipts import ReceiptTools
from relay.agent.mcp_push import CHANNEL, Pusher
from relay.agent.mcp_names import TOOLS
from relay.agent.mcp_results import (Agents, Leases, MarkedRead, Message, Messages, Released, Results, Sent,
                                     Thread, ThreadMessage)

log = logging.getLogger(__name__)

MAX_WAIT = 600.0            # seconds: the longest one wait call blocks
MAX_WAITS = 8               # waits blocking at once (each a thread and an inotify instance); more queue
MAX_LIMIT = 500             # messages one inbox or wait call returns at most
DEFAULT_LIMIT = 50
MOST = "more is taken as the most"       # the tools' numbers: less than the least is refused
LIMIT = f"At most this many messages (1 to {MAX_LIMIT}; {MOST}); the others stay new for the next call."
MARK_READ = "False: list them and mark nothing read (mark_read(ids) does it later)."
REQUEST_ID = "Your id for this request: a second call with it is not delivered again."
WAIT_DELIVERED = (f"Then wait up to this many seconds (0 to {MAX_WAIT:g}; {MOST}) until relay has delivered it: "
                  "`delivered` true, or false with `error` when it failed; `timed_out` when the time ran out first.")
Kind = Literal["message", "continuity"]     # what send sends (relay writes bounces; spawn() and release_agent())
Priority = Literal["urgent", "high", "normal", "low"]

INSTRUCTIONS = """\
You are the agent {me} on relay, which carries messages between the agents of this project.
Call inbox() for your new messages (with bodies; it marks read what it returns) and wait(timeout_s)
to block until one comes; inbox(mark_read=false) lists them and marks nothing read, mark_read(ids)
marks them later. A result you lost is still there: read(id), or inbox(recent=5) for the newest
read ones. send(to, body, subject, thread, request_id) sends; reply(id, body) answers a message
in its thread. Give a request_id to make a retried send harmless. agents() lists who you can
write to; spawn(name, task, ...) registers an agent and release_agent(name) says its work is done;
thread(thread) shows a conversation; search(query) finds messages by their words.
Before editing files others may edit, reserve(paths, exclusive=true) them (paths relative to the
project root; reserve again to renew) and release(paths) when done; reservations() lists who
holds what. A refusal names the holder and until when: ask them, or work elsewhere.
Urgent messages come first in inbox(). A message with ack_required asks you to acknowledge(id,
note) it once dealt with; send(..., ack_required=true) asks it of others, and receipts(id) shows
who has read and acknowledged what you sent."""


class Server(MCPServer):
    """The SDK's MCPServer, with the arguments its validation refuses said on one line: which
    argument, what it must be and what it was (pydantic's own text and URLs never reach the
    agent)."""

    def __init__(self, *args, tools=(), **kw):
        super().__init__(*args, tools=list(tools), **kw)
        self.takes = {t.name: takes(t) for t in tools}

    async def call_tool(self, name, arguments, context=None):
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as e:
            if not isinstance(e.__cause__, ValidationError):
                raise
            said = argument_errors(e.__cause__, name, self.takes.get(name, ()))
            raise ToolError(f"Error executing tool {name}: {said}") from e.__cause__


class Tools(ReceiptTools):
    """The tools of one server: each a method (its name the tool's, its docstring the tool's
    description, its parameters the tool's), on the agent's name and configuration, the
    Handover and the limiter of blocking waits."""

    NAMES = TOOLS           # mcp_names.py: the adopt text lists the same

    def __init__(self, agent, handover):
        self.name, self.config = agent.name, agent.project.config
        self.handover = handover or Handover(self.name, self.config)
        self.me = functools.partial(fresh, self.name, self.config)
        self.waits = anyio.CapacityLimiter(MAX_WAITS)    # the other tools keep the SDK's worker threads

    @staticmethod
    def sent(agent, mid, wait=None):
        """What send, reply, spawn and release_agent return; with `wait` (seconds), once the
        message is delivered, failed or the time ran out."""
        out = {"id": mid, "repeated": agent.repeated, "relay_running": holder(agent.layout.lock) is not None,
               "delivered": None, "error": None, "timed_out": False,
               "released": [{"name": r.name, "released_at": r.released_at, "released_by": r.released_by}
                            for r in agent.released]}
        if wait is not None:
            outcome = wait_delivered(agent.project, mid, wait)
            out.update(delivered=outcome.delivered, timed_out=outcome.delivered is None,
                       error=outcome.reason if outcome.delivered is False else None)
        return out

    def send(self, to: Annotated[list[str] | str, Field(description="Recipient(s): NAME, NAME,NAME, a JSON array of "
                                                        "names, '*' (everyone) or System.")],
             body: Annotated[str, Field(description="The message text.")],
             subject: Annotated[Optional[str], Field(description="One line.")] = None,
             thread: Annotated[Optional[str], Field(description="The conversation's thread id: a reply "
                                                    "uses the message's thread (its id when it has none).")] = None,
             request_id: Annotated[Optional[str], Field(description="Your id for this request: a second send "
                                                        "with it is not delivered again.")] = None,
             kind: Annotated[Kind, Field(description="The message's kind: message, or continuity (a control kind, "
                                         "for System); spawn() and release_agent() send the others.")] = "message",
             priority: Annotated[Priority, Field(description="urgent, high, normal or low: inboxes put urgent "
                                                 "first.")] = "normal",
             ack_required: Annotated[bool, Field(description="Ask each recipient to acknowledge it (their "
                                                 "acknowledge tool); receipts(id) shows who did.")] = False,
             wait_delivered_s: Annotated[Optional[float], Field(description=(
                 f"Then wait up to this many seconds (0 to {MAX_WAIT:g}; {MOST}) until every "
                 "recipient has it: `delivered` true, or false with `error` when it failed; `timed_out` when the "
                 "time ran out first."))] = None) -> Sent:
        """Send a message to other agents. Returns its id; `repeated` is true when request_id was
        used before (nothing new was sent: the id is the first message's). With wait_delivered_s,
        returns once it is delivered to every recipient or failed (`delivered`, `error`).
        Marks nothing read."""
        wait = None if wait_delivered_s is None else bounded(wait_delivered_s, "wait_delivered_s", 0, MAX_WAIT)
        with self.me() as agent, tool_errors():
            mid = agent.send(words(to, "names"), body, subject=subject, thread=thread, kind=kind,
                             request_id=request_id, priority=priority, ack_required=ack_required)
            return self.sent(agent, mid, wait)

    def reply(self, id: Annotated[str, Field(description="The id of the message to answer (or a unique start of it).")],
              body: Annotated[str, Field(description="The answer.")],
              request_id: Annotated[Optional[str], Field(description="Your id for this request: a second reply "
                                                         "with it is not delivered again.")] = None) -> Sent:
        """Answer a message: to its sender (to its recipients when you sent it), in its thread
        (its id when it had none), with the subject "Re: " and its subject. Returns what send
        returns. Marks nothing read."""
        with self.me() as agent, tool_errors():
            return self.sent(agent, agent.reply(id, body, request_id=request_id))

    def inbox(self, ctx: Context, limit: Annotated[int, Field(description=LIMIT)] = DEFAULT_LIMIT,
              mark_read: Annotated[bool, Field(description=MARK_READ)] = True,
              recent: Annotated[int, Field(description=f"Also return (in `recent`) this many of the newest messages "
                                           f"read already (0 to {MAX_LIMIT}; {MOST}): to see again what a lost "
                                           "result held.")] = 0) -> Messages:
        """Your new messages, whole (from, to, thread, subject, body, sent_at, id), oldest first.
        Marks read the messages it returns, once this reply has reached you (unless mark_read is
        false); `more` counts those left for the next call."""
        key, limit = self.handover.key(ctx), bounded(limit, "limit", 1, MAX_LIMIT)
        recent = bounded(recent, "recent", 0, MAX_LIMIT)
        with self.me() as agent, tool_errors():
            before = [message(m) for m in agent.recent(recent)]
            got = self.handover.take(agent, agent.inbox(limit=limit, skip=self.handover.held), limit, key,
                                     mark=mark_read)
            return got | {"recent": before}

    async def wait(self, ctx: Context,
                   timeout_s: Annotated[float, Field(description=f"Seconds to wait at most (0 to {MAX_WAIT:g}; "
                                                     f"{MOST}).")] = 60.0,
                   limit: Annotated[int, Field(description=LIMIT)] = DEFAULT_LIMIT,
                   mark_read: Annotated[bool, Field(description=MARK_READ)] = True) -> Messages:
        """Block until at least one new message is there (or timeout_s passes: `timed_out`), then
        return the new messages as inbox does. Marks read the messages it returns, once this reply
        has reached you (unless mark_read is false)."""
        key, limit = self.handover.key(ctx), bounded(limit, "limit", 1, MAX_LIMIT)

        def waiting(seconds, stop):
            # In this thread from the wait to the taking: a cancelled call leaves it running a
            # moment, and `stop` (set then) makes it take nothing.
            with self.me() as agent, tool_errors():
                got = agent.wait(seconds, stop=stop, limit=limit, skip=self.handover.held)
                return self.handover.take(agent, got, limit, key, stop=stop, mark=mark_read)

        deadline = time.monotonic() + bounded(timeout_s, "timeout_s", 0, MAX_WAIT)
        while True:
            stop = Stop()
            try:
                out = await anyio.to_thread.run_sync(
                    functools.partial(waiting, max(0, deadline - time.monotonic()), stop),
                    abandon_on_cancel=True, limiter=self.waits)
            finally:
                stop.set()
            # all it saw were taken by another reader meanwhile: wait on for the time left
            if out["messages"] or out["unreadable"] or time.monotonic() >= deadline:
                return out | {"timed_out": not out["messages"] and not out["unreadable"], "recent": []}

    def read(self, ctx: Context,
             id: Annotated[str, Field(description="The message's id (or a unique start of it).")]) -> Message:
        """One message of your inbox, whole, new or read already (`read`): a result you lost is
        still here. Marks it read, once this reply has reached you."""
        key = self.handover.key(ctx)
        with self.me() as agent, tool_errors():
            return self.handover.take_one(agent, agent.read(id), key)

    def mark_read(self, ids: Annotated[list[str] | str, Field(description="The ids (or unique starts of them) of "
                                                              "messages in your inbox: a list, or one string.")]
                  ) -> MarkedRead:
        """Marks read the messages of your inbox with these ids: after inbox(mark_read=false), once
        you have dealt with them. An id that is not in your inbox refuses the whole call."""
        with self.me() as agent, tool_errors():
            done = agent.mark_read(words(ids))
            return {"marked": agent.marked, "already": [m.id for m in done if m.id not in agent.marked]}

    def agents(self, active: Annotated[bool, Field(description="Only the active agents (neither released nor "
                                                        "archived).")] = False) -> Agents:
        """Your name and the agents you can send to, yourself marked (`me`), each with its state
        (`active`; `inactive` once released: mail to it is still delivered; `archived` by an
        operator: nothing is sent to it or from it) and what its spawn said of it (`metadata`: cli,
        cwd, model, task, spawned_by, ...; {} when never spawned). Marks nothing read."""
        with self.me() as agent, tool_errors():
            return {"me": agent.name, "agents": [{"name": r.name, "me": r.name == agent.name, **r.fields()}
                                                 for r in agent.agents(active)]}

    def spawn(self, name: Annotated[str, Field(description="The agent's name: a new one, or one to make active "
                                               "again.")],
              task: Annotated[Optional[str], Field(description="What it is to do (the spawn's body; its first 4,096 "
                                                   "characters are kept as the agent's `task`).")] = None,
              cli: Annotated[Optional[str], Field(description="The program that runs it (claude, codex, ...).")] = None,
              cwd: Annotated[Optional[str], Field(description="Where it works (a directory).")] = None,
              model: Annotated[Optional[str], Field(description="Its model.")] = None,
              action: Annotated[Optional[str], Field(description="One word more for what starts it.")] = None,
              request_id: Annotated[Optional[str], Field(description=REQUEST_ID)] = None,
              wait_delivered_s: Annotated[Optional[float], Field(description=WAIT_DELIVERED)] = None) -> Sent:
        """Register an agent: relay makes it active with what this spawn says of it (task, cli,
        cwd, model, action; agents() shows them) and gives a new one its outbox and inbox. relay
        starts no process: whatever starts agents reads the spawn in System's inbox. Refused at
        once: a name that is no agent name or is relay's own; an agent an operator archived.
        Returns what send returns (wait_delivered_s: `delivered` once registered). Marks nothing read."""
        wait = None if wait_delivered_s is None else bounded(wait_delivered_s, "wait_delivered_s", 0, MAX_WAIT)
        with self.me() as agent, tool_errors():
            mid = agent.spawn(name, task, cli=cli, cwd=cwd, model=model, action=action, request_id=request_id)
            return self.sent(agent, mid, wait)

    def release_agent(self, name: Annotated[str, Field(description="The agent's name.")],
                      note: Annotated[Optional[str], Field(description="A word on why (the release's body).")] = None,
                      request_id: Annotated[Optional[str], Field(description=REQUEST_ID)] = None,
                      wait_delivered_s: Annotated[Optional[float], Field(description=WAIT_DELIVERED)] = None
                      ) -> Sent:
        """Say an agent's work is done: relay marks it inactive (agents() shows it so; its
        metadata stays, mail to it is still delivered; a spawn makes it active again). An agent
        relay does not know is refused at once. Returns what send returns. Marks nothing read."""
        wait = None if wait_delivered_s is None else bounded(wait_delivered_s, "wait_delivered_s", 0, MAX_WAIT)
        with self.me() as agent, tool_errors():
            return self.sent(agent, agent.release_agent(name, note, request_id=request_id), wait)

    def thread(self, thread: Annotated[str, Field(description="A thread id: a message's `thread`, or the id of the "
                                                  "message a thread started from.")],
               limit: Annotated[int, Field(description=f"At most this many messages, the newest (1 to {MAX_LIMIT}; "
                                           f"{MOST}).")] = DEFAULT_LIMIT) -> Thread:
        """The messages of a thread that you sent or received, oldest first, with their bodies and
        delivery status; a thread named by a message's id starts with that message. `more` counts the earlier messages left
        out by `limit`. Marks nothing read."""
        with self.me() as agent, tool_errors():
            rows, more = agent.thread_page(thread, bounded(limit, "limit", 1, MAX_LIMIT))
        keys = ThreadMessage.__annotations__
        return {"thread": thread, "messages": [{k: r.get(k) for k in keys} for r in rows], "more": more}

    def search(self, query: Annotated[str, Field(description='Words that must all be in the subject or body, any case; '
                                           '"a phrase"; prefix* for words that start so.')],
               sender: Annotated[Optional[str], Field(description="Only messages from this agent.")] = None,
               thread: Annotated[Optional[str], Field(description="Only this thread (a thread named by a message's "
                                                      "id holds that message).")] = None,
               since: Annotated[Optional[str], Field(description="Only messages since then: a duration ago (2h, 7d) "
                                                     "or a date (2026-11-30, 2026-11-30T10:00, UTC).")] = None,
               limit: Annotated[int, Field(description=f"At most this many messages, the newest (1 to {MAX_LIMIT}; "
                                           f"{MOST}).")] = 20) -> Results:
        """Search the messages you may see (your inbox and what you sent) by the words of their
        subject and body: newest first, each with a snippet of its body (the words found between
        ** and **); read(id) or thread(thread) for the whole. Marks nothing read."""
        with self.me() as agent, tool_errors():
            return {"results": agent.search(query, sender=sender, thread=thread, since=since,
                                            limit=bounded(limit, "limit", 1, MAX_LIMIT))}

    def reserve(self, paths: Annotated[list[str], Field(description="Files, directories or globs (*, ?, [ab], ** for "
                                                        "any depth), relative to the project root.")],
                ttl: Annotated[str, Field(description="How long the lease lasts: 90s, 30m, 2h (at most 7d); "
                                          "reserving again renews it.")] = "1h",
                exclusive: Annotated[bool, Field(description="No other agent may hold an overlapping "
                                                 "reservation (and the git guard refuses their commits).")] = False,
                reason: Annotated[Optional[str], Field(description="One line for the others.")] = None) -> Leases:
        """Reserve files for yourself: all the paths, or none when another agent holds an
        overlapping exclusive reservation (any overlapping one, if you ask for exclusive): the
        error names who holds what until when, and they are told. Advisory: nothing stops a
        write, but the others see it and the git guard enforces exclusive ones at commit.
        Marks nothing read."""
        with self.me() as agent, tool_errors():
            now = agent.project.clock()
            return {"reservations": [r.as_dict(now) for r in agent.reserve(paths, ttl, exclusive=exclusive,
                                                                              reason=reason)]}

    def release(self, paths: Annotated[Optional[list[str]], Field(description="The paths as you reserved them; "
                                                                  "leave out to release all of yours.")] = None
                ) -> Released:
        """Release your reservations (when your work on those files is done or committed).
        Marks nothing read."""
        with self.me() as agent, tool_errors():
            gone = agent.release(paths)
            asked = [] if paths is None else agent.normalised(paths)
        return {"released": gone, "not_held": [p for p in asked if p not in gone]}

    def reservations(self, mine: Annotated[bool, Field(description="Only yours.")] = False) -> Leases:
        """The file reservations held now: who holds which paths, exclusive or shared, until when.
        Marks nothing read."""
        with self.me() as agent, tool_errors():
            now = agent.project.clock()
            return {"reservations": [r.as_dict(now) for r in agent.reservations(mine=mine)]}




def build(agent, handover=None):
    """The MCP server for `agent` (an api.Agent, checked); serve it with `serve()` (stdio), or
    call its tools in process. `handover`: what marks read the messages a reply holds (a
    Handover; by default one with no wire: a call's return is the hand-off)."""
    tools = Tools(agent, handover)
    server = Server("relay", version=__version__, instructions=INSTRUCTIONS.format(me=agent.name),
                    log_level="WARNING", tools=[strict(getattr(tools, name)) for name in Tools.NAMES])
    server.pusher = Pusher(agent.name, agent.project.config)
    server.pusher.register(server)      # before unadvertised(): the resources are served
    unadvertised(server)
    return server


EXIT_INTERRUPTED = 130      # Ctrl-C: 128 + SIGINT, as a shell reports it (and relay inbox --wait exits)


def serve(agent):
    """Serve `agent` over stdio until the client closes its input (or goes away: mcp_wire.ClientGone,
    a BrokenPipeError, which the CLI turns into a quiet exit)."""
    handover = Handover(agent.name, agent.project.config, wire=True)
    server = build(agent, handover)
    agent.layout.close()            # each call opens the state directory afresh
    # Ctrl-C ends the server at once, as SIGTERM does, with exit 130 (128 + SIGINT) and not a
    # word: the SDK's shutdown would wait for the tools' worker threads. Nothing is left half done
    # that relay does not tolerate (a send is a hidden temporary in the outbox until its rename; a
    # message is new until its reply is out).
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(EXIT_INTERRUPTED))
    # The SDK's Server under MCPServer, run on relay's transport (MCPServer.run_stdio_async
    # runs it on the SDK's, which cannot say whether a reply was written).
    lowlevel = server._lowlevel_server
    options = lowlevel.create_initialization_options(experimental_capabilities={CHANNEL: {}})

    async def run(read_stream, write_stream):
        async with anyio.create_task_group() as tg:     # the pushes (mcp_push.py) beside the server
            tg.start_soon(server.pusher.run)
            await lowlevel.run(read_stream, write_stream, initialization_options=options)
            tg.cancel_scope.cancel()
    anyio.run(serve_stdio, run, handover)
