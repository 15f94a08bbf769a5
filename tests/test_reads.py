"""What an agent takes is never lost: it lists its inbox without marking anything read, reads a
message by id whether read or not, marks read exactly the ids it names, and lists the messages it
read most recently (to get back a result it lost). The shell, Python and MCP alike."""
import json

import anyio
import pytest

import relay
from conftest import error_line
from mcp_client import ToolFailed, deliver, serve, until_async

UNKNOWN = "01KC3000000000000000000000"


def prefix(mid, ids, at_least):
    """The shortest prefix of `mid`, of `at_least` characters or more, that no other of `ids`
    starts with (ids made in one millisecond share their first 10 characters, and more)."""
    n = at_least
    while any(other != mid and other.startswith(mid[:n]) for other in ids):
        n += 1
    return mid[:n]


@pytest.fixture
def mail(cli, project):
    """Bob holds three new messages from Alice; `mail.sent` their ids, oldest first."""
    cli("init", "--agent", "Alice", "--agent", "Bob")
    with relay.Agent("Alice", root=project.root) as alice:
        project.sent = [alice.send("Bob", f"body {i}", subject=f"s{i}") for i in range(3)]
    deliver(project)
    project.cli = cli
    return project


def test_python_lists_without_taking_marks_read_by_id_and_lists_the_recently_read(mail):
    one, two, three = mail.sent
    with relay.Agent("Bob", root=mail.root) as bob:
        assert [(m.id, m.state) for m in bob.inbox()] == [(one, "new"), (two, "new"), (three, "new")]
        assert [m.state for m in bob.inbox()] == ["new"] * 3               # listing took nothing
        done = bob.mark_read([one, prefix(two, mail.sent, 12).lower()])     # ids, or unique prefixes
        assert [(m.id, m.state) for m in done] == [(one, "cur"), (two, "cur")]
        assert [m.id for m in bob.inbox()] == [three]
        assert [(m.id, m.state) for m in bob.mark_read([one])] == [(one, "cur")]   # read already: as it is
        with pytest.raises(relay.NotFound) as e:
            bob.mark_read([three, UNKNOWN])
        assert str(e.value) == f"no message {UNKNOWN!r} in the inbox of Bob; nothing was marked read"
        other = "0" * 26
        with pytest.raises(relay.NotFound) as e:
            bob.mark_read([UNKNOWN, other])
        assert str(e.value) == f"no messages {UNKNOWN!r}, {other!r} in the inbox of Bob; nothing was marked read"
        assert [m.id for m in bob.inbox()] == [three]                      # refused whole: three still new
        # a result lost after it was taken: the newest read ones, and any one by id
        assert [m.id for m in bob.recent(1)] == [two]
        assert [(m.id, m.state) for m in bob.recent(5)] == [(one, "cur"), (two, "cur")]
        assert [(m.id, m.state) for m in bob.inbox(recent=1)] == [(two, "cur"), (three, "new")]
        got = bob.read(one)
        assert (got.id, got.state, got.body) == (one, "cur", "body 0")
        with pytest.raises(relay.RelayError):
            bob.recent(-1)


def test_the_shell_marks_read_by_id_and_lists_the_recently_read(mail):
    one, two, three = mail.sent
    cli = mail.cli
    assert [d["state"] for d in json.loads(cli("inbox", "Bob", "--json").output)] == ["new"] * 3
    out = cli("mark-read", "--agent", "Bob", one, two).output
    assert out.splitlines() == [f"{one}: marked read", f"{two}: marked read"]
    assert cli("mark-read", "--agent", "Bob", one).output == f"{one}: read already\n"
    r = cli("mark-read", "--agent", "Bob", three, UNKNOWN, ok=False)
    assert r.exit_code == 1
    assert error_line(r) == f"no message {UNKNOWN!r} in the inbox of Bob; nothing was marked read"
    docs = json.loads(cli("inbox", "Bob", "--recent", "1", "--json").output)
    assert [(d["id"], d["state"]) for d in docs] == [(two, "cur"), (three, "new")]
    text = cli("inbox", "Bob", "--recent", "2").output
    assert "body 0" in text and "body 1" in text and "body 2" in text
    # the read ones are shown, not taken again; --ack marks read only the new one
    cli("inbox", "Bob", "--recent", "2", "--ack")
    assert relay.Agent("Bob", root=mail.root).inbox() == []


def test_mcp_lists_without_taking_reads_by_id_marks_read_and_gets_a_lost_result_back(mail, tmp_path):
    one, two, three = mail.sent
    new = mail.state / "inbox" / "Bob" / "new"

    async def main():
        with open(tmp_path / "server.err", "w") as err:
            async with serve(mail.root, "Bob", err) as bob:
                tools = await bob.tools()
                assert {"read", "mark_read"} <= set(tools)
                for name in ("inbox", "wait", "read", "mark_read"):
                    assert "Marks read" in tools[name].description or "Marks it read" in tools[name].description, name
                for name in ("send", "agents", "thread"):
                    assert "Marks nothing read" in tools[name].description, name

                got = await bob.call("inbox", mark_read=False)
                assert [(m["id"], m["read"]) for m in got["messages"]] == [(one, False), (two, False), (three, False)]
                got = await bob.call("inbox", mark_read=False, limit=1)
                assert [m["id"] for m in got["messages"]] == [one] and got["more"] == 2
                assert len(list(new.iterdir())) == 3                        # nothing taken

                got = await bob.call("read", id=two)
                assert (got["id"], got["body"], got["read"]) == (two, "body 1", False)
                await until_async(lambda: not (new / f"{two}.json").exists(), "read() marks it read once sent")
                got = await bob.call("read", id=prefix(two, mail.sent, 10))
                assert (got["id"], got["read"]) == (two, True)
                with pytest.raises(ToolFailed) as e:
                    await bob.call("read", id=UNKNOWN)
                assert e.value.args[0].endswith(f"no message {UNKNOWN!r} in the inbox of Bob")

                done = await bob.call("mark_read", ids=[one, two])
                assert done == {"marked": [one], "already": [two]}
                assert [p.name for p in new.iterdir()] == [f"{three}.json"]

                taken = await bob.call("inbox")             # taken, then "lost" (compaction)
                assert [m["id"] for m in taken["messages"]] == [three]
                await until_async(lambda: not any(new.iterdir()), "inbox() marks read what it returned")
                back = await bob.call("inbox", recent=2)
                assert back["messages"] == []
                assert [(m["id"], m["body"], m["read"]) for m in back["recent"]] == [
                    (two, "body 1", True), (three, "body 2", True)]
    anyio.run(main)
    assert "Traceback" not in (tmp_path / "server.err").read_text()


def test_recent_takes_a_whole_number_from_0_and_with_include_read_adds_nothing_twice(mail):
    one, two, three = mail.sent
    with relay.Agent("Bob", root=mail.root) as bob:
        bob.mark_read([one, two])
        assert bob.recent(0) == []
        for bad in (-1, True, 1.0, "1", None):
            with pytest.raises(relay.RelayError) as e:
                bob.recent(bad)
            assert str(e.value) == f"the number of read messages must be a whole number, 0 or more, not {bad!r}"
        # the read ones are listed already: recent adds none of them again
        assert sorted(m.id for m in bob.inbox(include_read=True, recent=2)) == [one, two, three]
        assert [m.id for m in bob.inbox(recent=0)] == [three]
