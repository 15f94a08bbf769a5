"""Who sees which message: every read an agent makes (the shell's read, search, inbox and show
run as an agent; Agent's read, find, search, inbox and thread; the MCP tools thread, read,
search and inbox) shows only the messages that agent sent or received. The operator's verbs
(audit, show without an agent) show every message."""
import json

import anyio
import pytest

import relay
from mcp_client import deliver

TEAM = ("Alice", "Bob", "Carol")
SECRET = "zebra for Carol only"
TO_BOB = "zebra to Bob"
FROM_BOB = "zebra from Bob"


@pytest.fixture
def review(crew, project):
    """In thread review-42: Alice -> Carol (not Bob's business), Alice -> Bob, Bob -> Carol."""
    alice, bob = crew.agent("Alice"), crew.agent("Bob")
    crew.secret = alice.send("Carol", SECRET, subject="zebra private", thread="review-42")
    crew.to_bob = alice.send("Bob", TO_BOB, subject="zebra one", thread="review-42")
    deliver(project, TEAM)
    crew.from_bob = bob.send("Carol", FROM_BOB, subject="zebra two", thread="review-42")
    deliver(project, TEAM)
    crew.ids = [crew.secret, crew.to_bob, crew.from_bob]
    return crew


def _tool(team, tool, **args):
    from mcp.server.mcpserver.exceptions import ToolError

    from relay.agent import mcp_server
    server = mcp_server.build(team.agent("Bob"))

    async def call():
        try:
            return json.dumps((await server.call_tool(tool, args)).structured_content)
        except ToolError as e:
            return str(e)
    return anyio.run(call)


def _each(look, team):
    """What a read by id shows of each of the three messages, refusals included."""
    out = []
    for mid in team.ids:
        try:
            out.append(look(mid))
        except relay.RelayError as e:
            out.append(str(e))
    return "\n".join(out)


def _as_bob(team, monkeypatch, *args):
    monkeypatch.setenv("RELAY_AGENT", "Bob")
    return team(*args, ok=False).output


def _api(team, fn):
    bob = team.agent("Bob")
    return fn(bob)


# name: (how Bob looks, whether what he sent is among what that read shows)
READS = {
    "cli read (RELAY_AGENT)": (lambda t, mp: "\n".join(_as_bob(t, mp, "read", m) for m in t.ids), True),
    "cli read --agent": (lambda t, mp: "\n".join(t("read", m, "--agent", "Bob", ok=False).output for m in t.ids),
                         False),
    "cli search --agent": (lambda t, mp: t("search", "zebra", "--agent", "Bob").output, True),
    "cli search (RELAY_AGENT)": (lambda t, mp: _as_bob(t, mp, "search", "zebra", "--json"), True),
    "cli search --thread": (lambda t, mp: t("search", "zebra", "--agent", "Bob", "--thread", "review-42").output,
                            True),
    "cli inbox --all": (lambda t, mp: t("inbox", "Bob", "--all", "--json").output, False),
    "cli show --agent": (lambda t, mp: "\n".join(t("show", m, "--agent", "Bob", ok=False).output for m in t.ids),
                         True),
    "cli show (RELAY_AGENT)": (lambda t, mp: "\n".join(_as_bob(t, mp, "show", m, "--json") for m in t.ids), True),
    "cli show --path (RELAY_AGENT)": (lambda t, mp: "\n".join(
        _as_bob(t, mp, "show", "--path", f"outbox/{s}/msg-{m.lower()}", "--json")
        for s, m in zip(("Alice", "Alice", "Bob"), t.ids)), True),
    "api read": (lambda t, mp: _each(lambda m: _api(t, lambda b: b.read(m).body), t), False),
    "api find": (lambda t, mp: _each(lambda m: _api(t, lambda b: b.find(m).body), t), True),
    "api search": (lambda t, mp: json.dumps(_api(t, lambda b: b.search("zebra"))), True),
    "api inbox": (lambda t, mp: json.dumps([m.as_dict() for m in _api(t, lambda b: b.inbox(include_read=True))]),
                  False),
    "api thread": (lambda t, mp: json.dumps(_api(t, lambda b: b.thread("review-42"))), True),
    "mcp thread": (lambda t, mp: _tool(t, "thread", thread="review-42"), True),
    "mcp read": (lambda t, mp: "\n".join(_tool(t, "read", id=m) for m in t.ids), False),
    "mcp search": (lambda t, mp: _tool(t, "search", query="zebra"), True),
    "mcp inbox": (lambda t, mp: _tool(t, "inbox", mark_read=False), False),
}


@pytest.mark.parametrize("read", list(READS))
def test_every_agent_read_shows_bob_his_own_mail_and_never_alice_to_carol(review, monkeypatch, read):
    look, sent_too = READS[read]
    seen = look(review, monkeypatch)
    assert SECRET not in seen and "zebra private" not in seen
    assert TO_BOB in seen or "zebra one" in seen
    if sent_too:
        assert FROM_BOB in seen or "zebra two" in seen


def test_the_thread_bob_sees_counts_only_his_messages(review):
    bob = review.agent("Bob")
    rows, more = bob.thread_page("review-42", limit=1)
    assert [r["id"] for r in rows] == [review.from_bob] and more == 1      # not 2: Alice -> Carol is not his
    assert [r["id"] for r in bob.thread("review-42")] == [review.to_bob, review.from_bob]


def test_a_refusal_does_not_say_the_message_exists(review):
    bob = review.agent("Bob")
    with pytest.raises(relay.NotFound) as e:
        bob.find(review.secret)
    assert str(e.value) == f"no message {review.secret!r} that Bob sent or received"
    with pytest.raises(relay.NotFound) as e:
        bob.find(review.secret[:20])    # a prefix names no message of another's either
    assert "that Bob sent or received" in str(e.value)


def test_a_reply_to_a_message_bob_was_not_party_to_is_refused(review, monkeypatch):
    r = review("send", "--from", "Bob", "--reply-to", review.secret, "me too", ok=False)
    assert r.exit_code == 1 and "that Bob sent or received" in r.output
    assert "that Bob sent or received" in _tool(review, "reply", id=review.secret, body="me too")
    assert list((review.state / "outbox" / "Bob").iterdir()) == []         # nothing was written


def test_the_operators_verbs_see_every_message(review):
    audit = review("audit", "--thread", "review-42", "--json").output
    assert {d["id"] for d in json.loads(audit)} == set(review.ids)
    assert json.loads(review("show", review.secret, "--json").output)["body"] == SECRET
    assert json.loads(review("read", review.secret, "--json").output)["body"] == SECRET
    assert [r["id"] for r in relay.Project(review.root).thread("review-42")] == review.ids
