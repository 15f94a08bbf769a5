"""Agent.spawn and Agent.release_agent: an agent's `spawn` and `release` messages (contract
§2's control kinds, to System) with their fields, for programs and the MCP server, as a file
written by hand would carry them (docs/agents.md, "Spawning and releasing agents"):

    me.spawn("dana", "review the parser", cli="claude", model="opus", cwd="worktrees/dana")
    me.release_agent("dana")

What relay would refuse when it reads the message (and bounce) is refused here at once, with
the same reason (core/registry.check): no name or one that is no agent name, System or `*`; a
release of an agent relay does not know (with the closest name); a spawn of an agent an
operator archived. Each returns the message's id; `request_id` makes a retry harmless and
`wait_delivered` waits for relay to deliver it, as for send (NotDelivered: it failed, saying
why). The registry changes when relay delivers the message (relay's daemon, or `relay run`).
"""
import types

from relay.config import SYSTEM
from relay.agent.delivery import delivered
from relay.core import registry
from relay.errors import MessageRefused, RelayError
from relay.files.layout import is_inside

FIELDS = ("cli", "cwd", "model", "action")      # a spawn's metadata besides its task, as given


class Registering:
    """The spawn and release of agents, mixed into api.Agent (its _send and project)."""

    def spawn(self, name, task=None, *, cli=None, cwd=None, model=None, action=None, request_id=None,
              wait_delivered=None):
        """Send a `spawn` of agent `name`: relay registers it (active, with `task`, the spawn's
        body, and `cli`, `cwd`, `model`, `action` as its metadata) and makes its outbox and
        inbox when it is new. Whatever starts agents reads the spawn in System's inbox."""
        fields = {"name": name, "cli": cli, "cwd": cwd, "model": model, "action": action}
        return self._control("spawn", fields, task, request_id, wait_delivered)

    def release_agent(self, name, note=None, *, request_id=None, wait_delivered=None):
        """Send a `release` of agent `name`: relay marks it inactive (its metadata stays; mail to
        it is still delivered). `note`: the message's body."""
        return self._control("release", {"name": name}, note, request_id, wait_delivered)

    def _control(self, kind, fields, body, request_id, wait_delivered):
        for key, value in fields.items():
            if value is not None and not isinstance(value, str):
                raise RelayError(f"{key} must be text, not {type(value).__name__}")
        if body is not None and not isinstance(body, str):
            raise RelayError(f"the body must be text, not {type(body).__name__}")
        control = {k: v.strip() for k, v in fields.items() if v is not None and v.strip()}
        root = self.project.config.root
        if "cwd" in control and not is_inside(root / control["cwd"], root):     # as relay would refuse it
            raise RelayError(f"cwd {control['cwd']!r} is outside the project root {root}: a spawned agent works "
                             "inside the project (name a directory of it, or leave cwd out)")
        try:
            registry.check(types.SimpleNamespace(kind=kind, control=control),
                           lambda refresh=False: self.project.agents(), self._archived)
        except MessageRefused as e:
            raise RelayError(str(e)) from None
        mid = self._send([SYSTEM], body or "", subject=None, thread=None, kind=kind, request_id=request_id,
                         create=False, control=control)
        if wait_delivered is not None and wait_delivered is not False:
            delivered(self.project, mid, None if wait_delivered is True else wait_delivered)
        return mid

    def _archived(self):
        history = self.project.history()
        if history is None:
            return set()
        with history:
            return set(history.archived_agents())
