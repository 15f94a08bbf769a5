"""A thread named by a message's id (what a reply to a message with no thread is in) holds that
message first: `relay audit --thread ID`, Project.thread and MCP thread() alike; thread() takes a
limit (the newest messages, oldest first, and how many earlier ones were left out)."""
import json

import anyio

import relay
from mcp_client import deliver, serve


def conversation(project):
    """Alice asks (no thread), Bob replies twice (the thread is the question's id), and an
    unrelated message in another thread."""
    alice, bob = relay.Agent("Alice", root=project.root), relay.Agent("Bob", root=project.root)
    question = alice.send("Bob", "can you review the parser?", subject="review")
    alice.send("Bob", "unrelated", thread="other")
    deliver(project)
    [q, _] = bob.inbox()
    first = bob.reply(q, "yes, this afternoon")
    deliver(project)
    second = bob.reply(q, "done: two nits")
    deliver(project)
    alice.close()
    bob.close()
    return question, first, second


def test_audit_thread_by_a_message_id_starts_with_that_message(cli, project):
    cli("init", "--agent", "Alice", "--agent", "Bob")
    question, first, second = conversation(project)
    docs = json.loads(cli("audit", "--thread", question, "--json").output)
    assert [d["id"] for d in docs] == [question, first, second]
    assert docs[0]["thread"] is None and {d["thread"] for d in docs[1:]} == {question}
    table = cli("audit", "--thread", question).output
    assert question in table and first in table and second in table
    rows = relay.Project(project.root).thread(question)
    assert [r["id"] for r in rows] == [question, first, second]
    assert rows[0]["body"] == "can you review the parser?"
    assert [r["id"] for r in relay.Project(project.root).thread(question, limit=2)] == [first, second]


def test_mcp_thread_by_a_message_id_and_its_limit(cli, project, tmp_path):
    cli("init", "--agent", "Alice", "--agent", "Bob")
    question, first, second = conversation(project)

    async def main():
        with open(tmp_path / "server.err", "w") as err:
            async with serve(project.root, "Alice", err) as client:
                got = await client.call("thread", thread=question)
                assert [m["id"] for m in got["messages"]] == [question, first, second]
                assert got["more"] == 0 and got["messages"][0]["body"] == "can you review the parser?"
                got = await client.call("thread", thread=question, limit=2)
                assert [m["id"] for m in got["messages"]] == [first, second] and got["more"] == 1
                tools = await client.tools()
                assert "limit" in tools["thread"].input_schema["properties"]
    anyio.run(main)
    assert "Traceback" not in (tmp_path / "server.err").read_text()
