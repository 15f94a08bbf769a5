"""What `relay mcp` pushes: the resources relay://inbox/NAME and relay://thread/ID, their
subscriptions and notifications/resources/updated on a delivery, and Claude Code's channel
events. Through the SDK's own client on the server as a subprocess; deliveries by a real
`relay run` or the relay's drain in this process."""
import os
import socket
import subprocess
import sys
import tempfile
import time

import anyio
import pytest

pytestmark = pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed")
from mcp import types
from mcp.client.extension import NotificationBinding
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

import relay
from mcp_client import deliver, serve, team  # noqa: F401 - team: a fixture

CHANNEL = "notifications/claude/channel"


class Pushed:
    """What the server pushed to the client, in order: ("updated", uri) and ("channel", params)."""

    def __init__(self):
        self.items = []
        self.changed = None

    async def handler(self, message):
        if isinstance(message, types.ResourceUpdatedNotification):
            self.add(("updated", str(message.params.uri)))

    async def channel(self, params):
        self.add(("channel", params.model_dump()))

    def add(self, item):
        self.items.append(item)
        if self.changed is not None:
            self.changed.set()

    async def until(self, count, seconds):
        """The first `count` items, once there; fails after `seconds` (a deadline, not a sleep)."""
        with anyio.fail_after(seconds):
            while len(self.items) < count:
                self.changed = anyio.Event()
                await self.changed.wait()
        return self.items[:count]


class ChannelParams(BaseModel):
    content: str
    meta: dict[str, str]


def run(root, tmp_path, scenario, **session):
    errlog = tmp_path / "server.err"

    async def main():
        with open(errlog, "w") as err:
            async with serve(root, "Bob", err, **session) as client:
                await scenario(client)
    anyio.run(main)
    text = errlog.read_text()
    assert "Traceback" not in text, text


def pushed_session(pushed, **more):
    return dict(message_handler=pushed.handler, **more)


class Daemon:
    """`relay run` on the project as a process; ready once it said READY=1 to its notify socket."""

    def __init__(self, root):
        self.dir = tempfile.mkdtemp(dir=root)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(os.path.join(self.dir, "notify.sock"))
        self.sock.settimeout(20)
        env = dict(os.environ, RELAY_ROOT=str(root), NOTIFY_SOCKET=os.path.join(self.dir, "notify.sock"))
        self.log = open(os.path.join(self.dir, "relay.log"), "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "relay", "run"], env=env, stdout=subprocess.DEVNULL,
                                     stderr=self.log)
        while b"READY=1" not in self.sock.recv(4096):
            pass

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self.sock.close()
        self.log.close()


def drop(root, sender, text):
    """A message file written under a hidden name and renamed into the sender's outbox."""
    outbox = root / ".relay" / "outbox" / sender
    name = f"msg-{time.time_ns()}"
    (outbox / f".{name}").write_text(text)
    os.rename(outbox / f".{name}", outbox / name)


def test_a_subscribed_inbox_is_told_of_a_delivery_by_a_running_daemon_within_a_second(team, tmp_path):
    pushed = Pushed()
    daemon = Daemon(team.root)
    try:
        async def scenario(bob):
            capabilities = bob.session.server_capabilities
            assert capabilities.resources.subscribe is True and capabilities.prompts is None
            await bob.session.subscribe_resource("relay://inbox/Bob")
            drop(team.root, "Alice", "TO: Bob\nSUBJECT: the plan\n\nread it")
            # from the rename into Alice's outbox: the daemon delivers, the server notices, the client hears
            assert await pushed.until(1, seconds=1.0) == [("updated", "relay://inbox/Bob")]
            [m] = team.agent("Bob").inbox()
            assert (m.sender, m.subject) == ("Alice", "the plan")
        run(team.root, tmp_path, scenario, **pushed_session(pushed))
    finally:
        daemon.stop()


def test_the_resources_show_only_what_the_agent_may_see(cli, team, tmp_path):
    cli("send", "--from", "Alice", "--to", "Bob", "--thread", "T-1", "--subject", "plan", "--priority", "low",
        "first")
    cli("send", "--from", "Alice", "--to", "Bob", "--thread", "T-1", "--priority", "urgent", "second")
    cli("send", "--from", "Alice", "--to", "Alice", "--thread", "T-1", "a note to herself")
    deliver(team)

    async def scenario(bob):
        listed = [str(r.uri) for r in (await bob.session.list_resources()).resources]
        assert listed == ["relay://inbox/Bob"]
        templates = {t.uri_template for t in (await bob.session.list_resource_templates()).resource_templates}
        assert templates == {"relay://inbox/{name}", "relay://thread/{thread}"}
        [inbox] = (await bob.session.read_resource("relay://inbox/Bob")).contents
        got = __import__("json").loads(inbox.text)
        assert [m["body"] for m in got["messages"]] == ["second", "first"]          # urgent first
        assert len(team.agent("Bob").inbox()) == 2                                 # nothing marked read
        [thread] = (await bob.session.read_resource("relay://thread/T-1")).contents
        assert [m["body"] for m in __import__("json").loads(thread.text)["messages"]] == ["first", "second"]
        for uri in ("relay://inbox/Alice", "relay://inbox/bob"):
            with pytest.raises(MCPError) as e:
                await bob.session.read_resource(uri)
            assert "Bob reads only its own inbox" in str(e.value), e.value
            with pytest.raises(MCPError) as e:
                await bob.session.subscribe_resource(uri)
            assert "Bob reads only its own inbox" in str(e.value), e.value
        with pytest.raises(MCPError) as e:
            await bob.session.subscribe_resource("relay://outbox/Bob")
        assert "no such resource" in str(e.value)
    run(team.root, tmp_path, scenario)


def test_a_thread_subscription_is_told_of_its_messages_and_unsubscribing_ends_it(team, tmp_path):
    pushed = Pushed()
    alice = relay.Agent("Alice", root=team.root)

    async def scenario(bob):
        await bob.session.subscribe_resource("relay://inbox/Bob")
        await bob.session.subscribe_resource("relay://thread/review%2042")
        alice.send("Bob", "in another thread", thread="other")
        await anyio.to_thread.run_sync(deliver, team)
        assert await pushed.until(1, 1.0) == [("updated", "relay://inbox/Bob")]
        alice.send("Bob", "in the thread", thread="review 42")
        await anyio.to_thread.run_sync(deliver, team)
        assert (await pushed.until(3, 1.0))[1:] == [("updated", "relay://inbox/Bob"),
                                                     ("updated", "relay://thread/review%2042")]
        await bob.session.unsubscribe_resource("relay://inbox/Bob")
        alice.send("Bob", "again in the thread", thread="review 42")
        await anyio.to_thread.run_sync(deliver, team)
        # in order on the wire: the thread's update, and no inbox update before it
        assert (await pushed.until(4, 1.0))[3:] == [("updated", "relay://thread/review%2042")]
    try:
        run(team.root, tmp_path, scenario, **pushed_session(pushed))
    finally:
        alice.close()


def test_claude_code_is_sent_each_message_as_a_channel_event(team, tmp_path):
    pushed = Pushed()
    alice = relay.Agent("Alice", root=team.root)

    async def scenario(bob):
        assert "claude/channel" in bob.session.server_capabilities.experimental
        # no subscription: a channel client is told of every delivery; the pushes start once the
        # server has the client's initialized notification, which a first call comes after
        await bob.call("agents")
        mid = alice.send("Bob", "the body", subject="merge it?", priority="urgent", ack_required=True)
        await anyio.to_thread.run_sync(deliver, team)
        [(kind, event)] = await pushed.until(1, 1.0)
        assert kind == "channel"
        assert event["meta"] == {"id": mid, "sender": "Alice", "subject": "merge it?", "thread": mid,
                                 "priority": "urgent", "ack_required": "true"}
        assert mid in event["content"] and "read(id=" in event["content"] and "acknowledge" in event["content"]
        assert "the body" not in event["content"]           # the body is read with read(id)
    try:
        run(team.root, tmp_path, scenario, client_info=types.Implementation(name="claude-code", version="2.1.90"),
            notification_bindings=[NotificationBinding(method=CHANNEL, params_type=ChannelParams, handler=pushed.channel)])
    finally:
        alice.close()
