"""What `relay mcp` serves besides its tools (mcp_server.py builds it): two resources, their
subscriptions, and what it pushes when mail arrives.

- `relay://inbox/NAME`: the agent's new messages, whole, urgent first (as inbox(mark_read=false):
  nothing is marked read; each is recorded as surfaced). Only the agent's own inbox: another
  agent's is refused, in the words of a resource that is not there.
- `relay://thread/ID`: the messages of a thread the agent sent or received, oldest first (as the
  thread tool; "What an agent sees", docs/agents.md). ID is percent-encoded where it must be.
- resources/subscribe and resources/unsubscribe on either: once subscribed, a message delivered
  to the agent's inbox (linked into new/) sends `notifications/resources/updated` for its inbox,
  and for its thread when that thread is subscribed (a message without a thread is the thread
  of its id). The inbox's new/ is watched with inotify (mail.py's NewMail) in one worker thread,
  armed at the first subscription and kept while the client is there: no polling.
- Claude Code's channels: the server declares `experimental["claude/channel"]`; a client that
  declares it too (in `experimental` or `extensions`), or says it is Claude Code
  (clientInfo `claude-code`), is sent `notifications/claude/channel` for each message delivered
  (content: who sent it, its subject and id, how to read it; meta: id, sender, subject, thread,
  priority, ack_required), so that the message enters its session unasked. Other clients are
  sent nothing they did not ask for.

Messages already in new/ when the watch is armed are not announced: they are what a read finds.
"""
import contextlib
import functools
import json
import logging
import sqlite3
import urllib.parse
from typing import Any, Literal

import anyio
import anyio.to_thread
from mcp import types
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

from relay.agent.api import Received, Stop, by_priority
from relay.agent.mail import NewMail
from relay.agent.mcp_handover import fresh, message
from relay.errors import RelayError
from relay.arguments import explain

log = logging.getLogger(__name__)

INBOX, THREAD = "relay://inbox/", "relay://thread/"
CHANNEL = "claude/channel"
CLAUDE_CODE = "claude-code"     # the clientInfo name Claude Code gives
LIMIT = 50                      # messages one read of a resource gives
INVALID_PARAMS = -32602


class ChannelEvent(BaseModel):
    """A Claude Code channel event (the SDK's typed notifications do not name it)."""
    method: Literal["notifications/claude/channel"] = "notifications/claude/channel"
    params: dict[str, Any]


def refused(uri, why):
    return MCPError(code=INVALID_PARAMS, message=f"{uri}: {why}", data={"uri": uri})


class Pusher:
    """The resources, subscriptions and pushes of one server (one client)."""

    def __init__(self, name, config):
        self.name, self.config = name, config
        self.inbox_uri = INBOX + urllib.parse.quote(name, safe="")
        self.inbox_subscribed = False
        self.threads = {}           # thread -> the URIs it was subscribed under
        self.channel = False        # the client takes Claude Code's channel events
        self.session = None         # the ServerSession to notify
        self.known = None           # the names in new/ at the last look
        self.wanted = None          # an anyio.Event: set once there is something to push

    # -- what the server serves --------------------------------------------------------------

    def register(self, server):
        """Add the resources, the subscription requests and the initialized notification's
        handler to `server` (an MCPServer)."""
        server.resource(self.inbox_uri, name="inbox", mime_type="application/json",
                        description=f"{self.name}'s new messages, whole, urgent first; reading marks nothing "
                                    "read. Subscribe to be told when one arrives.")(self._own_inbox)
        server.resource(INBOX + "{name}", name="an inbox", mime_type="application/json",
                        description="An agent's inbox: only your own.")(self.read_inbox)
        server.resource(THREAD + "{thread}", name="thread", mime_type="application/json",
                        description="The messages of a thread that you sent or received, oldest first. Subscribe "
                                    "to be told when one arrives in your inbox.")(self.read_thread)
        low = server._lowlevel_server
        low.add_request_handler("resources/subscribe", types.SubscribeRequestParams, self.on_subscribe)
        low.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, self.on_unsubscribe)
        low.add_notification_handler("notifications/initialized", types.NotificationParams, self.on_initialized)

    def _own_inbox(self):
        return self.read_inbox(self.name)

    def read_inbox(self, name):
        if name != self.name:
            raise refused(INBOX + urllib.parse.quote(name, safe=""),
                          f"no such resource: {self.name} reads only its own inbox, {self.inbox_uri}")
        with self._agent(self.inbox_uri) as agent:
            items = agent.inbox(limit=LIMIT)
            left = len(agent.inbox_.names(self.name)) - len(items)
        return json.dumps({"agent": self.name, "messages": [message(m) for m in items if not m.error],
                           "unreadable": [{"id": m.id, "error": m.error} for m in items if m.error],
                           "more": max(0, left)}, ensure_ascii=False)

    def read_thread(self, thread):
        uri = THREAD + urllib.parse.quote(thread, safe="")
        with self._agent(uri) as agent:
            rows, more = agent.thread_page(thread, LIMIT)
        keys = ("id", "from", "to", "kind", "thread", "subject", "body", "sent_at", "status")
        return json.dumps({"thread": thread, "messages": [{k: r.get(k) for k in keys} for r in rows], "more": more},
                          ensure_ascii=False, default=str)

    def _agent(self, uri):
        return opened(self.name, self.config, uri)

    # -- subscriptions -------------------------------------------------------------------------

    def parse(self, uri):
        """("inbox", None) or ("thread", ID) for a URI this server serves; refused otherwise."""
        if uri.startswith(THREAD) and len(uri) > len(THREAD):
            return "thread", urllib.parse.unquote(uri[len(THREAD):])
        if uri.startswith(INBOX):
            if urllib.parse.unquote(uri[len(INBOX):]) == self.name:
                return "inbox", None
            raise refused(uri, f"no such resource: {self.name} reads only its own inbox, {self.inbox_uri}")
        raise refused(uri, f"no such resource (relay serves {self.inbox_uri} and {THREAD}ID)")

    async def on_subscribe(self, ctx, params):
        uri = str(params.uri)
        what, thread = self.parse(uri)
        if self.known is None:              # what is there now is no arrival
            self.known = await anyio.to_thread.run_sync(self.names)
        if what == "inbox":
            self.inbox_subscribed = True
        else:
            self.threads.setdefault(thread, set()).add(uri)
        self._want(ctx.session)
        return types.EmptyResult()

    async def on_unsubscribe(self, ctx, params):
        uri = str(params.uri)
        what, thread = self.parse(uri)
        if what == "inbox":
            self.inbox_subscribed = False
        else:
            uris = self.threads.get(thread, set())
            uris.discard(uri)
            if not uris:
                self.threads.pop(thread, None)
        return types.EmptyResult()

    async def on_initialized(self, ctx, params):
        session = ctx.session
        caps = session.client_capabilities
        client = session.client_params.client_info.name if session.client_params is not None else None
        declared = caps is not None and any(CHANNEL in (getattr(caps, k, None) or {})
                                            for k in ("experimental", "extensions"))
        if declared or client == CLAUDE_CODE:
            self.channel = True
            if self.known is None:
                self.known = await anyio.to_thread.run_sync(self.names)
            self._want(session)

    def _want(self, session):
        self.session = session
        self._event().set()

    def _event(self):
        if self.wanted is None:
            self.wanted = anyio.Event()
        return self.wanted

    # -- the watch -----------------------------------------------------------------------------

    def names(self):
        """The names of the inbox's new/ (a listing; nothing opened)."""
        try:
            with self._agent(self.inbox_uri) as agent:
                return set(agent.inbox_.names(self.name))
        except MCPError:
            return set()

    async def run(self):
        """Push until cancelled: waits for a subscription (or a channel client), then watches
        the inbox's new/ in a worker thread and notifies what arrives."""
        await self._event().wait()
        mail = []
        try:
            while True:
                stop = Stop()
                try:
                    arrived = await anyio.to_thread.run_sync(functools.partial(self.arrivals, mail, stop),
                                                             abandon_on_cancel=True)
                finally:
                    stop.set()
                if arrived:
                    await self.push(arrived)
        finally:
            if mail:
                mail[0].close()

    def arrivals(self, mail, stop):
        """In the worker thread: block until new/ holds names it did not hold at the last look,
        and return them as Received (an envelope already taken from new/ by a reader: just its id)."""
        box = self.config.state_dir / "inbox" / self.name
        while not stop.is_set():
            if not mail or mail[0].stale():
                if mail:
                    mail.pop().close()
                mail.append(NewMail([box.parent, box, box / "new"]).open())
            now = self.names()
            new = sorted(now - (self.known or set()))
            self.known = now
            if new:
                return self.envelopes(new)
            mail[0].wait(None, stop)
        return []

    def envelopes(self, names):
        if not (self.threads or self.channel):
            return [None] * len(names)      # only the inbox is told: nothing to open
        out = []
        with self._agent(self.inbox_uri) as agent:
            for name in names:
                item = agent.inbox_.entry(self.name, "new", name)
                if item is not None and "error" not in item[2]:
                    out.append(Received.of(item[2], item[0], item[1]))
        return by_priority(out) if out else [None] * len(names)

    async def push(self, arrived):
        session = self.session
        uris = [self.inbox_uri] if self.inbox_subscribed else []
        for m in arrived:
            if m is not None:
                uris += sorted(self.threads.get(m.thread or m.id, ()))
        try:
            for uri in dict.fromkeys(uris):
                await session.send_resource_updated(uri)
            if self.channel:
                for m in arrived:
                    if m is not None:
                        await session.send_notification(ChannelEvent(params=channel_event(m)))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass        # the client is gone: the server ends


def channel_event(m):
    """What Claude Code shows its session of a message (the sender's words only as the subject)."""
    subject = f' "{m.subject}"' if m.subject else ""
    urgent = f"{m.priority} " if m.priority in ("urgent", "high") else ""
    ask = " It asks you to acknowledge it: acknowledge(id, note) once dealt with." if m.ack_required else ""
    content = (f"relay: a new {urgent}message from {m.sender}{subject} (id {m.id}). "
               f"Read it with the relay tool read(id={m.id}) and answer with reply(id, body).{ask}")
    meta = {"id": m.id, "sender": m.sender or "", "subject": m.subject or "", "thread": m.thread or m.id,
            "priority": m.priority or "normal", "ack_required": "true" if m.ack_required else "false"}
    return {"content": content, "meta": meta}


@contextlib.contextmanager
def opened(name, config, uri):
    """The agent for one read, on a state directory opened afresh (mcp_handover.fresh), with
    relay's refusals as the resource's error: one line, as a tool's."""
    try:
        with fresh(name, config) as agent:
            yield agent
    except ToolError as e:
        raise refused(uri, str(e)) from None
    except (RelayError, OSError, sqlite3.Error) as e:
        raise refused(uri, explain(e)) from None
