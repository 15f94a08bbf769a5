"""`relay mcp --agent NAME`: the agent's side of relay as a Model Context Protocol server over
stdio, for agents in MCP clients (Claude Code, Cursor, Codex and the like).

It is built with the official `mcp` SDK (the `relay[mcp]` extra; its MCPServer, the name FastMCP
had before version 2) on api.py's Agent, so its tools check what the shell and Python check:

    send(to, body, subject, thread, request_id)  -> {id, repeated, relay_running}
    inbox(limit)        the new messages with their bodies, oldest first; marks read exactly those
    wait(timeout_s)     blocks (inotify, in a worker thread) until a message is there, then as inbox
    agents()            who the agent is and the known agents
    thread(thread)      a conversation oldest first, as the ledger has it

inbox and wait read only the envelopes they return (the oldest `limit`), in worker threads.

A refusal (an unknown recipient with the closest match, a bad request id, ...) comes back as a
tool error carrying relay's one-line message; the server goes on. Only this module imports
`mcp`; cli_mcp.py loads it when `relay mcp` runs.
"""
import contextlib
import functools
import os
import signal
import sqlite3
import threading
import time
from typing import Annotated, Optional

import anyio
import anyio.to_thread
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field
from typing_extensions import TypedDict     # pydantic reads typing's only from Python 3.12

from . import __version__
from .api import Agent, Project, Stop
from .errors import RelayError
from .guards import explain
from .lock import holder

MAX_WAIT = 600.0            # seconds: the longest one wait call blocks
MAX_WAITS = 8               # waits blocking at once (each a thread and an inotify instance); more queue
MAX_LIMIT = 500             # messages one inbox or wait call returns at most
DEFAULT_LIMIT = 50
LIMIT = f"At most this many messages (1 to {MAX_LIMIT}); the others stay new for the next call."
# api.py's messages name the shell's flags; through MCP they name the tool's parameters
FLAGS = ((" (--create adds a new agent on purpose)", ""), ("--request-id ", "request_id "))

# A message as the inbox and wait tools return it (`from` is a Python keyword: functional form).
Message = TypedDict("Message", {
    "id": str, "from": Optional[str], "to": list[str], "kind": Optional[str], "thread": Optional[str],
    "subject": Optional[str], "body": str, "sent_at": Optional[str], "relayed_at": Optional[str],
    "headers": dict[str, str]})


class Unreadable(TypedDict):
    id: str
    error: str


class Messages(TypedDict):
    messages: list[Message]
    more: int                   # new messages left in the inbox past those returned (not read yet)
    unreadable: list[Unreadable]    # envelopes relay cannot read met on the way: never marked read
    timed_out: bool             # wait only: the time ran out with no new message


class Sent(TypedDict):
    id: str
    repeated: bool              # the request id was used before: nothing was sent, `id` is the first's
    relay_running: bool         # false: the message waits in the outbox until `relay run`


class Agents(TypedDict):
    me: str
    agents: list[str]


ThreadMessage = TypedDict("ThreadMessage", {
    "id": str, "from": Optional[str], "to": list[str], "kind": Optional[str], "thread": Optional[str],
    "subject": Optional[str], "body": Optional[str], "sent_at": Optional[str], "status": str,
    "delivered_at": Optional[str], "error": Optional[str]})


class Thread(TypedDict):
    thread: str
    messages: list[ThreadMessage]


INSTRUCTIONS = """\
You are the agent {me} on relay, which carries messages between the agents of this project.
Call inbox() for your new messages (with bodies; it marks read what it returns) and wait(timeout_s)
to block until one comes. send(to, body, subject, thread, request_id) sends; to reply, send to the
message's `from` with its thread (its id when it has none). Give a request_id to make a retried
send harmless. agents() lists who you can write to; thread(thread) shows a conversation."""


def build(agent):
    """The MCP server for `agent` (an api.Agent, checked); serve it with `.run()` (stdio)."""
    server = MCPServer("relay", version=__version__, instructions=INSTRUCTIONS.format(me=agent.name),
                       log_level="WARNING")
    reading = threading.Lock()      # one inbox/wait at a time marks messages read
    waits = anyio.CapacityLimiter(MAX_WAITS)    # the other tools keep the SDK's worker threads
    name, config = agent.name, agent.project.config

    @contextlib.contextmanager
    def me():
        """The agent for one call, on a state directory opened afresh: a long-lived server sees a
        directory swapped or re-made since (as each CLI run does), and calls share no descriptor."""
        with tool_errors():
            fresh = Agent(name, project=Project(config=config))
        try:
            yield fresh
        finally:
            fresh.close()
            fresh.layout.close()

    @server.tool()
    def send(to: Annotated[str, Field(description="Recipient(s): NAME, NAME,NAME, '*' (everyone) or System.")],
             body: Annotated[str, Field(description="The message text.")],
             subject: Annotated[Optional[str], Field(description="One line.")] = None,
             thread: Annotated[Optional[str], Field(description="The conversation's thread id: a reply "
                                                    "uses the message's thread (its id when it has none).")] = None,
             request_id: Annotated[Optional[str], Field(description="Your id for this request: a second send "
                                                        "with it is not delivered again.")] = None) -> Sent:
        """Send a message to other agents. Returns its id; `repeated` is true when request_id was
        used before (nothing new was sent: the id is the first message's)."""
        with me() as agent, tool_errors():
            mid = agent.send(to, body, subject=subject, thread=thread, request_id=request_id)
            return {"id": mid, "repeated": agent.repeated, "relay_running": holder(agent.layout.lock) is not None}

    @server.tool()
    def inbox(limit: Annotated[int, Field(description=LIMIT)] = DEFAULT_LIMIT) -> Messages:
        """Your new messages, whole (from, to, thread, subject, body, sent_at, id), oldest first.
        Marks read exactly the messages it returns; `more` counts those left for the next call."""
        limit = clamp(limit, 1, MAX_LIMIT)
        with me() as agent, tool_errors():
            return take(agent, reading, agent.inbox(limit=limit), limit)

    @server.tool()
    async def wait(timeout_s: Annotated[float, Field(description=f"Seconds to wait at most (0 to {MAX_WAIT:g}; "
                                                     "more is taken as the most).")] = 60.0,
                   limit: Annotated[int, Field(description=LIMIT)] = DEFAULT_LIMIT) -> Messages:
        """Block until at least one new message is there (or timeout_s passes: `timed_out`), then
        return the new messages as inbox does, marked read."""
        limit = clamp(limit, 1, MAX_LIMIT)

        def waiting(seconds, stop):
            with me() as agent:     # its own: a cancelled call leaves this thread running a moment
                return agent.wait(seconds, stop=stop, limit=limit)

        deadline = time.monotonic() + clamp(timeout_s, 0, MAX_WAIT)
        while True:
            stop = Stop()
            try:
                with tool_errors():
                    got = await anyio.to_thread.run_sync(
                        functools.partial(waiting, max(0, deadline - time.monotonic()), stop),
                        abandon_on_cancel=True, limiter=waits)
            finally:
                stop.set()          # a cancelled call's thread returns at once, having marked nothing read
            with me() as agent, tool_errors():
                out = take(agent, reading, got, limit)
            # all it saw were taken by another reader meanwhile: wait on for the time left
            if out["messages"] or out["unreadable"] or not got or time.monotonic() >= deadline:
                return out | {"timed_out": not out["messages"] and not out["unreadable"]}

    @server.tool()
    def agents() -> Agents:
        """Your name and the agents you can send to."""
        with me() as agent, tool_errors():
            return {"me": agent.name, "agents": agent.project.agents()}

    @server.tool()
    def thread(thread: Annotated[str, Field(description="A thread id (a message's `thread`).")]) -> Thread:
        """The messages of a thread, oldest first, with their bodies and delivery status."""
        with me() as agent, tool_errors():
            rows = agent.project.thread(thread)
        keys = ThreadMessage.__annotations__
        return {"thread": thread, "messages": [{k: r.get(k) for k in keys} for r in rows]}

    return server


def take(agent, lock, items, limit):
    """Up to `limit` readable new messages of `items` (agent.inbox's), marked read (one by one:
    a message another reader took meanwhile is left out), and how many are left in new/ past
    them (counted, not read)."""
    unreadable = [{"id": m.id, "error": m.error} for m in items if m.error]
    new = [m for m in items if m.state == "new" and not m.error]
    taken = []
    fs = agent.layout.fs
    with lock:
        for m in new[:limit]:
            try:
                agent.inbox_.ack(m.path)    # raises when the envelope left new/ (Agent.ack would not)
            except OSError as e:
                if isinstance(e, FileNotFoundError) and not fs.exists(os.path.relpath(m.path, fs.path)):
                    continue        # read by someone else since it was listed
                if taken:
                    break           # return those marked read; the next call meets the error
                raise
            taken.append(m)
    more = 0
    if len(new) >= limit:           # the listing stopped there: count what is past it, unopened
        last = os.path.basename(new[limit - 1].path)
        more = sum(1 for n in agent.inbox_.names(agent.name) if n > last)
    return {"messages": [message(m) for m in taken], "more": more, "unreadable": unreadable, "timed_out": False}


def clamp(value, low, high):
    """`value` within low..high (NaN is `low`)."""
    return low if value != value else min(max(value, low), high)


def message(m):
    return {"id": m.id, "from": m.sender, "to": m.to, "kind": m.kind, "thread": m.thread, "subject": m.subject,
            "body": m.body, "sent_at": m.sent_at, "relayed_at": m.relayed_at,
            "headers": {str(k): str(v) for k, v in m.headers.items()}}


@contextlib.contextmanager
def tool_errors():
    """A RelayError, OSError or SQLite error inside becomes a ToolError with the one line the
    CLI would print (the server goes on)."""
    try:
        yield
    except (RelayError, OSError, sqlite3.Error) as error:
        text = explain(error)
        for flag, parameter in FLAGS:
            text = text.replace(flag, parameter)
        raise ToolError(text) from None


def serve(agent):
    """Serve `agent` over stdio until the client closes it (or goes away: a broken pipe ends
    the server quietly, as the end of its input does)."""
    server = build(agent)
    agent.layout.close()            # each call opens the state directory afresh
    # Ctrl-C ends the server at once, as SIGTERM does: the SDK's shutdown would wait for its stdin
    # reader, a thread blocked in read(). Nothing is left half done that relay does not tolerate
    # (a send is a hidden temporary in the outbox until its rename).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        server.run("stdio")
    except* (BrokenPipeError, ConnectionResetError):
        pass
