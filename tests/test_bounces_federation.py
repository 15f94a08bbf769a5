"""Bounces across nodes: a message the recipient's node refuses (its outbound row
becomes `refused`) bounces to its sender like a local failure, once."""
import pytest

from fednodes import MISSING, REDIS_SERVER, exchange, held, nodes, redis_server, team  # noqa: F401  (fixtures)

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason=MISSING)


@pytest.mark.timeout_s(120)
def test_a_message_another_node_refuses_bounces_to_its_sender(redis_server, team, nodes):
    """Federation: a message refused by the recipient's node (its outbound row `refused`) brings
    the sender a bounce naming the node and its reason."""
    n1 = nodes(redis_server.url, team, "n1", ["Ann"], extra='max_body_bytes = "8MiB"')
    n2 = nodes(redis_server.url, team, "n2", ["Bob"], extra='max_body_bytes = "1KiB"')
    exchange(n1, n2, rounds=1)
    n1.drop("Ann", "big", "TO: Bob\nSUBJECT: the big one\n\n" + "x" * 4096)
    n1.send()
    n2.receive()
    n1.link.publish()                       # reads n2's acknowledgement: refused
    [sent] = list(n1.relay.history.audit(sender="Ann"))
    assert n1.outbound(sent["id"])["n2"]["status"] == "refused"
    n1.relay.drain(now_fn=n1.clock, wait=lambda s: None)
    [b] = [e for e in held(n1.state, "Ann") if e["kind"] == "bounce"]
    assert b["headers"]["bounce_of"] == sent["id"] and b["headers"]["failed_recipients"] == ["Bob"]
    assert "refused by node n2" in b["headers"]["reason"] and b["subject"] == "Undelivered: the big one"
    n1.link.publish()
    n1.relay.drain(now_fn=n1.clock, wait=lambda s: None)
    assert len([e for e in held(n1.state, "Ann") if e["kind"] == "bounce"]) == 1
