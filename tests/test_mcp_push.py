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


def channel_session(pushed, name="claude-code", **more):
    """A client that says it is `name` (version 2.1.90), whose channel events `pushed` records."""
    return dict(client_info=types.Implementation(name=name, version="2.1.90"),
                notification_bindings=[NotificationBinding(method=CHANNEL, params_type=ChannelParams,
                                                           handler=pushed.channel)], **more)


def run_with_alice(team, tmp_path, scenario, **session):
    """run() with `scenario(bob, alice)`: Alice an Agent of the project, closed afterwards."""
    alice = relay.Agent("Alice", root=team.root)
    try:
        run(team.root, tmp_path, lambda bob: scenario(bob, alice), **session)
    finally:
        alice.close()


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

    async def scenario(bob, alice):
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
    run_with_alice(team, tmp_path, scenario, **pushed_session(pushed))


def test_claude_code_is_sent_each_message_as_a_channel_event(team, tmp_path):
    pushed = Pushed()

    async def scenario(bob, alice):
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
    run_with_alice(team, tmp_path, scenario, **channel_session(pushed))


def _received(**fields):
    from relay.agent.api import Received
    doc = {"id": "m-1", "from": "Alice", "to": ["Bob"], "kind": "message", "body": "the body", **fields}
    return Received.of(doc, "new", "/x/m-1.json")


def test_a_channel_event_names_urgent_and_high_priorities_and_no_other():
    from relay.agent.mcp_push import channel_event
    for priority in ("urgent", "high"):
        event = channel_event(_received(priority=priority))
        assert event["content"].startswith(f"relay: a new {priority} message from Alice (id m-1). ")
        assert event["meta"]["priority"] == priority
    for priority in ("normal", "low"):
        event = channel_event(_received(priority=priority))
        assert event["content"].startswith("relay: a new message from Alice (id m-1). ")
        assert event["meta"]["priority"] == priority


def test_a_channel_event_of_a_message_without_subject_thread_or_ack_says_so_plainly():
    from relay.agent.mcp_push import channel_event
    event = channel_event(_received())
    assert event["content"] == ("relay: a new message from Alice (id m-1). "
                                "Read it with the relay tool read(id=m-1) and answer with reply(id, body).")
    assert event["meta"] == {"id": "m-1", "sender": "Alice", "subject": "", "thread": "m-1",
                             "priority": "normal", "ack_required": "false"}


def test_a_channel_event_quotes_the_subject_and_names_its_own_thread_and_the_ask():
    import dataclasses

    from relay.agent.mcp_push import channel_event
    event = channel_event(dataclasses.replace(_received(subject="merge it?", thread="T-9"), ack_required=True))
    assert event["content"] == ('relay: a new message from Alice "merge it?" (id m-1). '
                                "Read it with the relay tool read(id=m-1) and answer with reply(id, body). "
                                "It asks you to acknowledge it: acknowledge(id, note) once dealt with.")
    assert event["meta"]["thread"] == "T-9" and event["meta"]["subject"] == "merge it?"
    assert event["meta"]["ack_required"] == "true"


def test_a_channel_event_of_an_envelope_without_sender_or_priority_gives_empty_and_normal():
    import dataclasses

    from relay.agent.mcp_push import channel_event
    m = dataclasses.replace(_received(), sender=None, priority=None)
    assert channel_event(m)["meta"]["sender"] == "" and channel_event(m)["meta"]["priority"] == "normal"


def test_the_push_uris_parse_a_thread_the_own_inbox_and_refuse_the_rest():
    from relay.agent.mcp_push import Pusher
    pusher = Pusher("Bob Smith", None)
    assert pusher.inbox_uri == "relay://inbox/Bob%20Smith"
    assert pusher.parse("relay://thread/review%2042") == ("thread", "review 42")
    assert pusher.parse("relay://inbox/Bob%20Smith") == ("inbox", None)
    assert pusher.parse("relay://inbox/Bob Smith") == ("inbox", None)
    with pytest.raises(MCPError) as e:
        pusher.parse("relay://thread/")          # a thread URI without an id is no resource
    assert "no such resource (relay serves relay://inbox/Bob%20Smith and relay://thread/ID)" in str(e.value)
    with pytest.raises(MCPError) as e:
        pusher.parse("relay://inbox/Alice")
    assert "Bob Smith reads only its own inbox, relay://inbox/Bob%20Smith" in str(e.value)
    assert e.value.error.data == {"uri": "relay://inbox/Alice"}


def test_a_client_declaring_the_channel_extension_under_any_name_is_sent_channel_events(team, tmp_path):
    pushed = Pushed()

    async def scenario(bob, alice):
        await bob.call("agents")
        mid = alice.send("Bob", "the body", subject="plan")
        await anyio.to_thread.run_sync(deliver, team)
        [(kind, event)] = await pushed.until(1, 1.0)
        assert kind == "channel" and event["meta"]["id"] == mid and event["meta"]["priority"] == "normal"
    run_with_alice(team, tmp_path, scenario,
                   **channel_session(pushed, name="some-editor", extensions={"claude/channel": {}}))


def test_a_client_neither_claude_code_nor_declaring_the_channel_is_sent_no_channel_event(team, tmp_path):
    pushed = Pushed()

    async def scenario(bob, alice):
        await bob.session.subscribe_resource("relay://inbox/Bob")
        alice.send("Bob", "the body", subject="plan")
        await anyio.to_thread.run_sync(deliver, team)
        assert await pushed.until(1, 1.0) == [("updated", "relay://inbox/Bob")]
        await bob.call("agents")        # what the push sent after the update came before this answer
        assert pushed.items == [("updated", "relay://inbox/Bob")]
    run_with_alice(team, tmp_path, scenario, **pushed_session(pushed),
                   **channel_session(pushed, name="claude-code-fork", extensions={"other/extension": {}}))


def test_a_thread_subscription_by_a_messages_id_is_told_of_that_message_without_a_thread(team, tmp_path):
    pushed = Pushed()

    async def scenario(bob, alice):
        mid = alice.send("Bob", "no thread named")          # sent, not delivered yet: its id is its thread
        await bob.session.subscribe_resource(f"relay://thread/{mid}")
        await anyio.to_thread.run_sync(deliver, team)
        assert await pushed.until(1, 1.0) == [("updated", f"relay://thread/{mid}")]
    run_with_alice(team, tmp_path, scenario, **pushed_session(pushed))


def test_a_file_planted_in_new_that_is_no_envelope_is_no_channel_event(team, tmp_path):
    pushed = Pushed()

    async def scenario(bob, alice):
        await bob.call("agents")
        new = team.state / "inbox" / "Bob" / "new"
        (new / ".planted").write_text("{not an envelope")
        os.rename(new / ".planted", new / "01KC3000000000000000000000.json")
        await bob.call("agents")
        mid = alice.send("Bob", "the body", subject="real")
        await anyio.to_thread.run_sync(deliver, team)
        [(kind, event)] = await pushed.until(1, 1.0)
        assert kind == "channel" and event["meta"]["id"] == mid
        await bob.call("agents")
        assert len(pushed.items) == 1
    run_with_alice(team, tmp_path, scenario, **channel_session(pushed))
