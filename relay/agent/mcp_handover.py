"""What the MCP server (mcp_server.py) hands its client: each call's agent on a state directory
opened afresh, the messages on their way to the client (Handover: marked read only once the
reply holding them was written), a message as the tools return it, and relay's failures as the
SDK's tool errors, one line each."""
import contextlib
import json
import logging
import os
import sqlite3
import threading

from mcp.server.mcpserver.exceptions import ToolError

from relay.agent.api import Agent, Project
from relay.errors import RelayError
from relay.arguments import explain
from relay.files.fs import shown

log = logging.getLogger(__name__)

# api.py's messages name the shell's flags; through MCP they name the tool's parameters
FLAGS = ((" (--create adds a new agent on purpose)", ""), ("--request-id ", "request_id "))


@contextlib.contextmanager
def fresh(name, config):
    """The agent for one call, on a state directory opened afresh: a long-lived server sees a
    directory swapped or re-made since (as each CLI run does), and calls share no descriptor."""
    with tool_errors():
        agent = Agent(name, project=Project(config=config))
    try:
        yield agent
    finally:
        agent.close()
        agent.layout.close()


class Handover:
    """The messages on their way to the client. With a wire (`serve`), a call takes them by
    holding them (no other call of this server lists them), and they are marked read (new/ ->
    cur/) only when the transport says the reply holding them was written (`written`); a reply
    that was not (`unanswered`, `gone`) leaves them new. With no wire (calls in process) the
    return of the call is the hand-off: they are marked read as they are taken.
    A message another reader took from new/ after the listing is not returned again."""

    def __init__(self, name, config, wire=False):
        self.name, self.config, self.wire = name, config, wire
        self.lock = threading.Lock()    # one call at a time takes messages
        self.held = set()               # names in new/ ("<id>.json") of the messages replies hold
        self.replies = {}               # request id -> lists of the paths its replies hold
        self.closed = False

    def key(self, ctx):
        """The request id of a call, when its reply goes over the wire."""
        return ctx.request_id if self.wire else None

    def take(self, agent, items, limit, key=None, stop=None, mark=True, count=True):
        """Up to `limit` readable new messages of `items` (agent.inbox's), taken (with `mark`
        False only listed: nothing is held or marked read), and (with `count`) how many are left
        in new/ past them."""
        unreadable = [{"id": m.id, "error": m.error} for m in items if m.error]
        new = [m for m in items if m.state == "new" and not m.error]
        fs = agent.layout.fs
        taken = []
        with self.lock:
            if self.closed:
                raise ToolError("the client is gone: nothing is marked read")
            if stop is not None and stop.is_set():
                return {"messages": [], "more": 0, "unreadable": [], "timed_out": False}
            if new and self.wire and mark:  # where they will go: missing, the reason now, not a silent later
                fs.dir(f"inbox/{agent.name}/cur")
            for m in new[:limit]:
                name, rel = os.path.basename(m.path), os.path.relpath(m.path, fs.path)
                if name in self.held:
                    continue
                if not mark:
                    taken.append(m)
                    continue
                if self.wire:
                    if not fs.exists(rel):
                        continue    # read by someone else since it was listed
                    self.held.add(name)
                else:
                    try:
                        agent.inbox_.ack(m.path)    # raises when the envelope left new/ (Agent.ack would not)
                    except OSError as e:
                        if isinstance(e, FileNotFoundError) and not fs.exists(rel):
                            continue
                        if taken:
                            break   # return those marked read; the next call meets the error
                        raise
                taken.append(m)
            if self.wire and taken and mark:
                self.replies.setdefault(key, []).append([m.path for m in taken])
        more = 0
        if count and len(new) >= limit:     # the listing stopped there: count what is past it, unopened
            last = os.path.basename(new[limit - 1].path)
            more = sum(1 for n in agent.inbox_.names(agent.name) if n > last and n not in self.held)
        return {"messages": [message(m) for m in taken], "more": more, "unreadable": unreadable, "timed_out": False}

    def take_one(self, agent, m, key=None):
        """One message of the agent's inbox (agent.read's), taken as take() takes it when it is
        new; as it is when it is read already or on its way to the client in another reply."""
        if m.state == "new" and not m.error and os.path.basename(m.path) not in self.held:
            got = self.take(agent, [m], 1, key, count=False)["messages"]
            if got:
                return got[0]
        return message(m)

    def written(self, key):
        """The reply to request `key` was written whole: mark read what it holds."""
        paths = self._pop(key)
        if not paths:
            return
        try:
            with fresh(self.name, self.config) as agent:
                for path in paths:
                    try:
                        agent.inbox_.ack(path)
                    except FileNotFoundError:
                        if agent.layout.fs.exists(os.path.relpath(path, agent.layout.fs.path)):
                            raise   # not taken by another reader meanwhile: cur/ is missing
        except (ToolError, OSError) as e:
            log.warning("a reply was written but its messages could not be marked read (%s); they stay new", e)
        finally:
            self._release(paths)

    def unanswered(self, key):
        """Request `key` ended with no reply holding messages: they stay new."""
        self._release(self._pop(key))

    def gone(self):
        """The client is gone: every message held stays new, and no call takes any more."""
        with self.lock:
            self.closed = True
            self.replies.clear()
            self.held.clear()

    def _pop(self, key):
        with self.lock:
            queued = self.replies.get(key)
            if not queued:
                return []
            paths = queued.pop(0)
            if not queued:
                del self.replies[key]
            return paths

    def _release(self, paths):
        with self.lock:
            self.held.difference_update(os.path.basename(p) for p in paths)


def bounded(value, name, low, high):
    """`value` when it is `low` or more, and no more than `high` (more is taken as `high`, as
    the tools' descriptions say); a ToolError below, or for NaN."""
    if value != value or value < low:
        raise ToolError(f"{name} must be {low:g} to {high:g}, not {value!r}")
    return min(value, high)


# What the SDK's validation refuses, said the way the tools' descriptions say it.
NEEDS = {"missing": "required", "int_parsing": "must be a whole number", "int_from_float": "must be a whole number",
         "int_type": "must be a whole number", "float_parsing": "must be a number", "float_type": "must be a number",
         "bool_parsing": "must be true or false", "bool_type": "must be true or false", "string_type": "must be text",
         "list_type": "must be a list"}
FORMS = {"to": "must be a name, a comma-separated list of names or a JSON array of them",
         "ids": "must be a list of ids or one string of them"}


def argument_errors(error, tool="the tool", takes=()):
    """One line for a pydantic ValidationError of the arguments of `tool` (which `takes` these):
    each argument refused, what it must be and what it was (never pydantic's own text and its
    URLs); an argument it does not take, with those it takes; a value outside an enum, with the
    enum's values."""
    said = {}
    for e in error.errors():
        name = str(e["loc"][0]) if e.get("loc") else "arguments"
        if name in said:
            continue
        if e.get("type") == "extra_forbidden":
            said[name] = f"{tool} takes no such argument (it takes {', '.join(takes) or 'none'})"
            continue
        need = NEEDS.get(e.get("type"))
        if e.get("type") == "literal_error":
            need = f"must be {e.get('ctx', {}).get('expected', 'one of its values')}"
        if need != "required" and name in FORMS:
            said[name] = FORMS[name]
            continue
        need = need or str(e.get("msg", "not valid")).split("\n")[0].lower()
        given = repr(e["input"]) if "input" in e and need != "required" else None
        said[name] = need + (f", not {shown(given[:60])}" if given is not None else "")
    return "; ".join(f"{k}: {v}" for k, v in said.items()) or "the arguments are not valid"


def message(m):
    """A message as the tools return it: `read` says whether it was marked read before the call."""
    return {"id": m.id, "from": m.sender, "to": m.to, "kind": m.kind, "thread": m.thread, "subject": m.subject,
            "body": m.body, "sent_at": m.sent_at, "relayed_at": m.relayed_at,
            "headers": {str(k): str(v) for k, v in m.headers.items()}, "read": m.state != "new",
            "priority": m.priority, "ack_required": m.ack_required}


def words(value, what="ids"):
    """Names or ids as a tool is given them: a list, a JSON array in a string, or one string of
    them separated by commas (or spaces)."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except ValueError:
                value = None
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise RelayError(f"{shown(repr(text)[:80])} is not a JSON array of {what}")
        else:
            value = text.replace(",", " ").split()
    return [v.strip() for v in value if v.strip()]


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
