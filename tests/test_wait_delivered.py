"""`relay send --wait-delivered [DURATION]`, `Agent.send(..., wait_delivered=)`
and MCP `send(wait_delivered_s=)` block until every recipient has the message (exit 0), it failed
(exit 1, the reason on stderr) or the time is up (exit 124). The relay is driven by drain() in
this process, once the message is in the outbox."""
import json
import threading
import time

import pytest
from mcp_client import deliver, until

import relay
from relay.agent.delivery import wait_delivered
from relay.ledger.ledger import Ledger


@pytest.fixture
def crew(cli, project):
    cli("init", "--agent", "Alice", "--agent", "Bob", "--agent", "Carol")
    return project


def relay_once_written(project, agent="Alice", agents=("Alice", "Bob", "Carol"), archive=None):
    """A thread that runs one relay pass as soon as a message is in `agent`'s outbox; with
    `archive`, an operator archives that agent first, while the message waits (a send to an
    agent archived already is refused at once: tests/test_archived_agents.py)."""
    box = project.state / "outbox" / agent
    done = {}

    def run():
        until(lambda: any(p.name.startswith("msg-") for p in box.iterdir()), "the message is written")
        if archive is not None:
            with Ledger(project.state / "ledger.sqlite") as ledger:
                ledger.operations.archive_agent(archive, time.time(), "operator:test")
        done["total"] = deliver(project, agents)
    t = threading.Thread(target=run)
    t.start()
    return t, done


def test_send_wait_delivered_exits_0_once_every_recipient_has_it(crew, cli):
    t, done = relay_once_written(crew)
    r = cli("send", "--from", "Alice", "--to", "Bob,Carol", "--wait-delivered", "30", "hello")
    t.join()
    mid = r.stdout.strip()
    assert r.exit_code == 0 and done["total"].archived == 1
    assert [m.id for m in relay.Agent("Bob", root=crew.root).inbox()] == [mid]
    assert [m.id for m in relay.Agent("Carol", root=crew.root).inbox()] == [mid]


def test_send_wait_delivered_exits_1_with_the_reason_when_it_failed(crew, cli):
    t, _ = relay_once_written(crew, archive="Carol")
    r = cli("send", "--from", "Alice", "--to", "Carol", "--wait-delivered", "30s", "hello", ok=False)
    t.join()
    mid = r.stdout.strip()
    assert r.exit_code == 1 and mid
    assert f"relay: {mid} was not delivered: " in r.stderr and "recipient_archived" in r.stderr


def test_a_partial_shed_is_no_delivery(crew, cli):
    t, _ = relay_once_written(crew, archive="Carol")
    r = cli("send", "--from", "Alice", "--to", "Bob,Carol", "--wait-delivered", "30", "hello", ok=False)
    t.join()
    assert r.exit_code == 1 and "shed for Carol" in r.stderr and "recipient_archived" in r.stderr


def test_a_shed_released_by_a_retry_and_delivered_is_a_delivery(crew, cli):
    """Carol was archived when the message came (shed for her, so it failed); restored, `relay
    retry` releases the shed and delivers to her: the message is delivered now."""
    from relay.agent.delivery import standing
    from relay.ledger.history import History
    t, _ = relay_once_written(crew, archive="Carol")
    mid = cli("send", "--from", "Alice", "--to", "Carol", "hello").stdout.strip()
    t.join()
    cli("archive-agent", "--undo", "Carol")
    cli("retry", mid)
    deliver(crew, ("Alice", "Bob", "Carol"))
    assert [m.id for m in relay.Agent("Carol", root=crew.root).inbox()] == [mid]
    with History(Ledger(crew.state / "ledger.sqlite", readonly=True)) as history:
        got = standing(history, mid)
    assert got.delivered is True, got


def test_send_wait_delivered_times_out_with_124(crew, cli):
    r = cli("send", "--from", "Alice", "--to", "Bob", "--wait-delivered", "200ms", "hello", ok=False)
    mid = r.stdout.strip()
    assert r.exit_code == 124 and mid
    assert f"relay: {mid} was not delivered to every recipient in 200ms" in r.stderr
    assert "no relay daemon is running" in r.stderr


def test_a_bare_wait_delivered_takes_no_body_for_its_duration(crew, cli):
    t, _ = relay_once_written(crew)
    r = cli("send", "--from", "Alice", "--to", "Bob", "--wait-delivered", "the body")
    t.join()
    [m] = relay.Agent("Bob", root=crew.root).inbox()
    assert m.body == "the body" and m.id == r.stdout.strip()
    assert "for ever" in " ".join(cli("send", "--help").stdout.split())


def test_the_api_waits_and_raises_with_the_reason(crew, cli):
    alice = relay.Agent("Alice", root=crew.root)
    t, _ = relay_once_written(crew)
    mid = alice.send("Bob", "hello", wait_delivered=30)
    t.join()
    assert [m.id for m in relay.Agent("Bob", root=crew.root).inbox()] == [mid]
    t, _ = relay_once_written(crew, archive="Carol")
    with pytest.raises(relay.NotDelivered) as e:
        alice.send("Carol", "hello", wait_delivered=30)
    t.join()
    assert "recipient_archived" in e.value.reason and e.value.message_id and not e.value.timed_out
    with pytest.raises(relay.DeliveryTimeout) as e:
        alice.send("Bob", "again", wait_delivered=0.05)
    assert e.value.timed_out and isinstance(e.value, relay.NotDelivered)


def test_the_waiting_itself_driven_by_the_relay(crew):
    """wait_delivered's own loop with the relay's drain as its pause: no thread, no sleep."""
    alice = relay.Agent("Alice", root=crew.root)
    mid = alice.send("Bob", "hello")
    r = crew.relay(agents=("Alice", "Bob", "Carol"))
    crew.clock.advance(60)
    outcome = wait_delivered(alice.project, mid, 30, pause=lambda seconds: r.drain())
    assert outcome.delivered and outcome.id == mid
    (crew.state / "outbox/Alice/m").write_text("TO: Zed\n\nlost")
    r.drain()
    [failed] = [row["id"] for row in r.history.audit(status="failed")]
    outcome = wait_delivered(alice.project, failed, 30, pause=lambda seconds: None)
    assert not outcome.delivered and "unknown recipient Zed" in outcome.reason


def test_repeated_request_id_waits_for_the_first(crew, cli):
    t, _ = relay_once_written(crew)
    one = cli("send", "--from", "Alice", "--to", "Bob", "--request-id", "R", "--wait-delivered", "30", "x").stdout
    t.join()
    two = cli("send", "--from", "Alice", "--to", "Bob", "--request-id", "R", "--wait-delivered", "30", "x")
    assert two.exit_code == 0 and two.stdout == one
    assert json.loads(cli("show", one.strip(), "--json").stdout)["status"] == "archived"


def test_mcp_send_waits_for_delivery(crew, cli):
    pytest.importorskip("mcp")
    import anyio

    from relay.agent import mcp_server
    bob = relay.Agent("Bob", root=crew.root)
    server = mcp_server.build(bob)

    async def send(**args):
        return (await server.call_tool("send", {"to": "Alice", "body": "hi", **args})).structured_content

    not_waited = anyio.run(send)
    assert (not_waited["delivered"], not_waited["error"], not_waited["timed_out"]) == (None, None, False)
    deliver(crew)
    t, _ = relay_once_written(crew, agent="Bob")
    got = anyio.run(lambda: send(wait_delivered_s=30))
    t.join()
    assert got["delivered"] is True and got["error"] is None and not got["timed_out"]
    t, _ = relay_once_written(crew, agent="Bob", archive="Alice")
    got = anyio.run(lambda: send(wait_delivered_s=30))
    t.join()
    assert got["delivered"] is False and "recipient_archived" in got["error"]
    cli("archive-agent", "--undo", "Alice")
    got = anyio.run(lambda: send(wait_delivered_s=0.05))
    assert got["delivered"] is None and got["timed_out"]
    bob.close()


def test_send_with_no_daemon_running_says_so_on_stderr_and_exits_0(crew, cli):
    """Without --wait-delivered, a send with no relay running exited 0 saying nothing: the
    message waited in the outbox and nobody knew why it never came."""
    from relay.files.lock import DaemonLock
    r = cli("send", "--from", "Alice", "--to", "Bob", "hello")
    mid = r.stdout.strip()
    assert r.exit_code == 0 and mid
    [line] = r.stderr.splitlines()
    assert line.startswith(f"relay: no relay is running here: {mid} waits in Alice's outbox") and "relay run" in line
    assert len(list((crew.state / "outbox" / "Alice").iterdir())) == 1
    with DaemonLock(crew.state / "relay.lock"):
        r = cli("send", "--from", "Alice", "--to", "Bob", "again")
    assert r.exit_code == 0 and r.stdout.strip() and r.stderr == ""


def test_the_wait_pauses_double_up_to_a_quarter_second_and_end_exactly_at_the_deadline():
    from relay.agent.delivery import poll

    class NoLedger:
        def history(self):
            return None

    now, pauses = [100.0], []

    def pause(seconds):
        pauses.append(round(seconds, 6))
        now[0] += seconds
    got = poll(NoLedger(), None, "no ledger", lambda r: False, 1.0, pause=pause, clock=lambda: now[0])
    assert got == "no ledger"
    assert pauses == [0.01, 0.02, 0.04, 0.08, 0.16, 0.25, 0.25, 0.19]     # the last: what is left, not more
    assert round(now[0], 6) == 101.0


def test_a_wait_of_zero_looks_once_and_times_out_as_0s_and_a_negative_or_nan_wait_is_refused(crew):
    from relay.agent.delivery import delivered
    alice = relay.Agent("Alice", root=crew.root)
    mid = alice.send("Bob", "hello")
    with pytest.raises(relay.DeliveryTimeout) as e:
        delivered(alice.project, mid, 0)
    assert str(e.value).startswith(f"{mid} was not delivered to every recipient in 0s: ")
    for bad in (-1, -0.001, float("nan")):
        with pytest.raises(relay.RelayError) as e:
            delivered(alice.project, mid, bad)
        assert str(e.value) == f"the time to wait must be a number of seconds, not {bad!r}"
        assert not isinstance(e.value, relay.NotDelivered)


def test_a_wait_that_is_no_number_is_refused_by_name_and_a_send_given_one_writes_nothing(crew):
    from relay.agent.delivery import delivered
    alice = relay.Agent("Alice", root=crew.root)
    mid = alice.send("Bob", "hello")
    for bad in ("abc", "", [1], object):
        with pytest.raises(relay.RelayError) as e:
            delivered(alice.project, mid, bad)
        assert str(e.value) == f"the time to wait must be a number of seconds, not {bad!r}"
        with pytest.raises(relay.RelayError) as e:
            alice.wait_receipts(mid, "read", bad)
        assert str(e.value) == f"the time to wait must be a number of seconds, not {bad!r}"
    outbox = crew.root / ".relay" / "outbox" / "Alice"
    written = sorted(p.name for p in outbox.iterdir())
    with pytest.raises(relay.RelayError) as e:
        alice.send("Bob", "not sent", wait_delivered="soon")
    assert str(e.value) == "the time to wait must be a number of seconds, not 'soon'"
    assert sorted(p.name for p in outbox.iterdir()) == written


def test_a_bare_wait_delivered_with_no_body_reads_the_body_from_stdin_and_waits_for_ever(crew, cli):
    t, done = relay_once_written(crew)
    r = cli("send", "--from", "Alice", "--to", "Bob", "--wait-delivered", input="from stdin\n")
    t.join()
    mid = r.stdout.strip()
    assert r.exit_code == 0 and done["total"].archived == 1
    [m] = relay.Agent("Bob", root=crew.root).inbox()
    assert (m.id, m.body) == (mid, "from stdin\n")
