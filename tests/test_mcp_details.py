"""The MCP tools' details: `to` as a JSON array or a comma-separated string; an argument error as
one line (no pydantic text, no URL); reply(id, body) builds the thread and subject; send takes a
kind; agents() marks the caller; a number out of range is refused or clamped as its description
says. Through the SDK's own client on `relay mcp`."""
import json

import anyio
import pytest

import relay
from mcp_client import ToolFailed, deliver, serve

PREFIX = "Error executing tool "


@pytest.fixture
def team(cli, project):
    cli("init", "--agent", "Alice", "--agent", "Bob", "--agent", "Carol")
    return project


def run(project, tmp_path, scenario, agent="Bob"):
    async def main():
        with open(tmp_path / "server.err", "w") as err:
            async with serve(project.root, agent, err) as client:
                await scenario(client)
    anyio.run(main)
    assert "Traceback" not in (tmp_path / "server.err").read_text()


async def refused(client, tool, **args):
    with pytest.raises(ToolFailed) as e:
        await client.call(tool, **args)
    text = e.value.args[0]
    assert "\n" not in text and "pydantic" not in text and "http" not in text, text
    assert text.startswith(f"{PREFIX}{tool}: "), text
    return text[len(f"{PREFIX}{tool}: "):]


def test_send_takes_a_list_or_a_string_of_names_and_a_kind_and_reply_builds_the_thread(team, tmp_path):
    sent = {}

    async def scenario(bob):
        tools = await bob.tools()
        assert "kind" in tools["send"].input_schema["properties"]
        assert set(tools["reply"].input_schema["required"]) == {"id", "body"}
        sent["list"] = (await bob.call("send", to=["Alice", "Carol"], body="one", kind="continuity"))["id"]
        sent["json"] = (await bob.call("send", to='["Alice", "Carol"]', body="two"))["id"]
        sent["comma"] = (await bob.call("send", to="Alice, Carol", body="three", subject="plans"))["id"]
        deliver(team, ("Alice", "Bob", "Carol"))
        with relay.Agent("Alice", root=team.root) as alice:
            got = {m.id: m for m in alice.inbox()}
            assert [got[sent[k]].to for k in ("list", "json", "comma")] == [["Alice", "Carol"]] * 3
            assert got[sent["list"]].kind == "continuity"
            assert got[sent["json"]].kind == "message"
            question = alice.send("Bob", "what time?", subject="lunch")
            private = alice.send("Carol", "not for Bob")
        deliver(team, ("Alice", "Bob", "Carol"))
        answer = await bob.call("reply", id=question, body="noon")
        again = await bob.call("reply", id=question[:12], body="noon", request_id="r1")
        assert answer["repeated"] is False and again["id"] != answer["id"]
        deliver(team, ("Alice", "Bob", "Carol"))
        with relay.Agent("Alice", root=team.root) as alice:
            [a, _] = [m for m in alice.inbox() if m.sender == "Bob" and m.body == "noon"]
            assert (a.id, a.thread, a.subject, a.to) == (answer["id"], question, "Re: lunch", ["Alice"])
        listed = await bob.call("agents")
        assert listed["me"] == "Bob" and [(a["name"], a["me"], a["state"]) for a in listed["agents"]] == [
            ("Alice", False, "active"), ("Bob", True, "active"), ("Carol", False, "active")]
        assert (await refused(bob, "reply", id="01KC3000000000000000000000", body="x")) == (
            "no message '01KC3000000000000000000000' that Bob sent or received")
        # a message Bob was no party to is refused in the same words as one that is not there
        assert (await refused(bob, "reply", id=private, body="x")) == f"no message {private!r} that Bob sent or received"
    run(team, tmp_path, scenario)


def test_argument_errors_are_one_line_and_numbers_out_of_range_are_refused_or_clamped(team, tmp_path):
    with relay.Agent("Alice", root=team.root) as alice:
        alice.send("Bob", "hello")
    deliver(team, ("Alice", "Bob", "Carol"))

    async def scenario(bob):
        assert await refused(bob, "send", to="Alice") == "body: required"
        assert await refused(bob, "send", to=5, body="x") == (
            "to: must be a name, a comma-separated list of names or a JSON array of them")
        assert await refused(bob, "send", to="[Alice", body="x") == "'[Alice' is not a JSON array of names"
        assert await refused(bob, "send", to='["Alice", 5]', body="x") == (
            "to: must be a name, a comma-separated list of names or a JSON array of them")
        assert await refused(bob, "inbox", limit="many") == "limit: must be a whole number, not 'many'"
        assert await refused(bob, "inbox", limit=2.5) == "limit: must be a whole number, not 2.5"
        assert await refused(bob, "wait", timeout_s="soon") == "timeout_s: must be a number, not 'soon'"
        assert await refused(bob, "inbox", mark_read="perhaps") == "mark_read: must be true or false, not 'perhaps'"
        assert await refused(bob, "mark_read", ids=7) == "ids: must be a list of ids or one string of them"
        # the ranges, as each description says: below, refused; above, the most
        tools = await bob.tools()
        for tool, name, low in (("inbox", "limit", 1), ("inbox", "recent", 0), ("wait", "limit", 1),
                                ("thread", "limit", 1), ("search", "limit", 1), ("wait", "timeout_s", 0)):
            assert "more is taken as the most" in tools[tool].input_schema["properties"][name]["description"]
            args = {"thread": "t"} if tool == "thread" else {"query": "x"} if tool == "search" else {}
            text = await refused(bob, tool, **args, **{name: low - 1})
            assert text.startswith(f"{name} must be {low} to "), text
        got = await bob.call("inbox", limit=10_000, recent=10_000, mark_read=False)
        assert len(got["messages"]) == 1
        got = await bob.call("wait", timeout_s=10**9, limit=10_000)       # a message is there: at once
        assert len(got["messages"]) == 1 and not got["timed_out"]
        assert (await bob.call("thread", thread="none", limit=10_000))["messages"] == []
        # a whole number past any tool's bound (the schema's maximum, 10,000) is a mistake: refused
        assert all(p.get("maximum", p.get("anyOf", [{}])[0].get("maximum")) == 10_000
                   for t in tools.values() for p in t.input_schema["properties"].values()
                   if "integer" in (p.get("type"), *(a.get("type") for a in p.get("anyOf", ()))))
        for value in (10_001, 10**9, 1e30):
            text = await refused(bob, "inbox", limit=value, mark_read=False)
            assert text.startswith("limit: input should be less than or equal to 10000, not "), text
    run(team, tmp_path, scenario)


def test_what_is_not_in_a_tools_schema_is_refused_in_the_schemas_words(team, tmp_path):
    outbox = team.state / "outbox" / "Bob"

    async def scenario(bob):
        tools = await bob.tools()
        assert all(t.input_schema["additionalProperties"] is False for t in tools.values())
        assert tools["send"].input_schema["properties"]["kind"]["enum"] == ["message", "continuity"]
        assert await refused(bob, "send", to="Alice", body="x", kind="bogus") == (
            "kind: must be 'message' or 'continuity', not 'bogus'")
        assert await refused(bob, "send", to="Alice", body="x", colour="red") == (
            "colour: send takes no such argument (it takes to, body, subject, thread, request_id, kind, "
            "priority, ack_required, wait_delivered_s)")
        assert await refused(bob, "agents", active="yes") == "active: must be true or false, not 'yes'"
        assert await refused(bob, "agents", active=1) == "active: must be true or false, not 1"
        assert await refused(bob, "reservations", mine="true") == "mine: must be true or false, not 'true'"
        assert await refused(bob, "inbox", limit="5") == "limit: must be a whole number, not '5'"
        assert await refused(bob, "wait", timeout_s=True) == "timeout_s: must be a number, not True"
        assert await refused(bob, "inbox", since="2h") == (
            "since: inbox takes no such argument (it takes limit, mark_read, recent)")
        assert await refused(bob, "search", query=["a"]) == "query: must be text, not ['a']"
        assert not outbox.exists() or list(outbox.iterdir()) == []
        assert not outbox.exists() or list(outbox.iterdir()) == []
        # what the schema allows is taken: an integer for a number, a whole number written 3.0 for an
        # integer (JSON Schema's integer), text that reads as JSON for text, a JSON array for a list
        assert (await bob.call("wait", timeout_s=0, limit=3.0))["timed_out"] is True
        texts = {"subject": '{"plan": 1}', "thread": "[7]", "request_id": "null"}
        sent = await bob.call("send", to='["Alice"]', body="x", **texts)
        deliver(team, ("Alice", "Bob", "Carol"))
        with relay.Agent("Alice", root=team.root) as alice:
            [got] = [m for m in alice.inbox() if m.id == sent["id"]]
            assert (got.subject, got.thread, got.kind) == ('{"plan": 1}', "[7]", "message")
    run(team, tmp_path, scenario)


def test_tool_descriptions_are_dedented_and_resources_but_no_empty_prompts_are_advertised(team, tmp_path):
    async def scenario(bob):
        for name, tool in (await bob.tools()).items():
            lines = tool.description.splitlines()
            assert len(lines) > 1 and not any(line[:1].isspace() for line in lines), (name, tool.description)
        capabilities = bob.session.server_capabilities
        assert capabilities.tools is not None
        assert capabilities.resources.subscribe is True and capabilities.prompts is None
    run(team, tmp_path, scenario)


def test_spawn_and_release_agent_give_the_registry_their_fields(team, tmp_path):
    async def scenario(bob):
        tools = await bob.tools()
        assert set(tools["spawn"].input_schema["properties"]) == {"name", "task", "cli", "cwd", "model", "action",
                                                                  "request_id", "wait_delivered_s"}
        assert tools["spawn"].input_schema["required"] == ["name"]
        assert tools["release_agent"].input_schema["required"] == ["name"]
        sent = await bob.call("spawn", name="Dana", task="review the parser", cli="claude", cwd="work/dana",
                              model="opus", request_id="dana-1")
        assert sent["repeated"] is False and sent["relay_running"] is False
        assert (await bob.call("spawn", name="Dana", request_id="dana-1")) == sent | {"repeated": True}
        assert await refused(bob, "spawn", task="x") == "name: required"
        assert (await refused(bob, "spawn", name="System")).startswith("'System'")
        assert (await refused(bob, "spawn", name="bad name!")).startswith("invalid agent name 'bad name!'")
        assert await refused(bob, "release_agent", name="Zed") == "a release of 'Zed', which is no known agent"
        for outside in ("/", "../elsewhere"):       # refused at once, as relay would refuse the spawn later
            assert (await refused(bob, "spawn", name="Dana", cwd=outside)).startswith(
                f"cwd {outside!r} is outside the project root"), outside
        assert await refused(bob, "spawn", name="Dana", colour="red") == (
            "colour: spawn takes no such argument (it takes name, task, cli, cwd, model, action, request_id, "
            "wait_delivered_s)")
        deliver(team, ("Alice", "Bob", "Carol"))
        [dana] = [a for a in (await bob.call("agents"))["agents"] if a["name"] == "Dana"]
        assert (dana["state"], dana["spawned_by"]) == ("active", "Bob")
        assert {k: dana["metadata"][k] for k in ("task", "cli", "cwd", "model", "spawn_id")} == {
            "task": "review the parser", "cli": "claude", "cwd": "work/dana", "model": "opus", "spawn_id": sent["id"]}
        await bob.call("release_agent", name="Dana", note="merged")
        deliver(team, ("Alice", "Bob", "Carol", "Dana"))
        [dana] = [a for a in (await bob.call("agents"))["agents"] if a["name"] == "Dana"]
        assert (dana["state"], dana["released_by"], dana["metadata"]["cli"]) == ("inactive", "Bob", "claude")
        assert [a["name"] for a in (await bob.call("agents", active=True))["agents"]] == ["Alice", "Bob", "Carol"]
        (team.state / "outbox" / "Bob" / "lost").write_text("TO: Zed\n\nlost")     # bounces back to Bob
        deliver(team, ("Alice", "Bob", "Carol", "Dana"))
        deliver(team, ("Alice", "Bob", "Carol", "Dana"))
        [bounce] = [m for m in (await bob.call("inbox"))["messages"] if m["kind"] == "bounce"]
        assert "System reads no replies" in await refused(bob, "reply", id=bounce["id"], body="thanks")
    run(team, tmp_path, scenario)


@pytest.mark.parametrize("value, got", [("a, b c", ["a", "b", "c"]), (' ["a", " b "] ', ["a", "b"]), ("", []),
                                        (["a ", " ", "b"], ["a", "b"]), ("[]", [])])
def test_ids_or_names_are_taken_as_a_list_a_json_array_or_one_string_of_them(value, got):
    from relay.agent.mcp_handover import words
    assert words(value) == got


@pytest.mark.parametrize("value", ["[1, 2]", "[a, b]", '["a", null]', '[{"a": 1}]'])
def test_a_string_opening_a_json_array_that_is_no_array_of_strings_is_refused_naming_what(value):
    from relay.agent.mcp_handover import words
    with pytest.raises(relay.RelayError) as e:
        words(value, "names")
    assert str(e.value) == f"{value!r} is not a JSON array of names"


def test_a_bounded_argument_takes_its_low_bound_caps_at_its_high_one_and_refuses_less_or_nan():
    from mcp.server.mcpserver.exceptions import ToolError

    from relay.agent.mcp_handover import bounded
    assert bounded(1, "limit", 1, 50) == 1 and bounded(50, "limit", 1, 50) == 50 and bounded(51, "limit", 1, 50) == 50
    assert bounded(0.0, "wait", 0, 600) == 0.0 and bounded(1e9, "wait", 0, 600) == 600
    for bad in (0, -1, float("nan")):
        with pytest.raises(ToolError) as e:
            bounded(bad, "limit", 1, 50)
        assert str(e.value) == f"limit must be 1 to 50, not {bad!r}"


def test_each_refused_argument_is_said_once_in_the_tools_words_not_pydantics():
    from typing import Literal

    import pydantic

    from relay.agent.mcp_handover import argument_errors

    class Args(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        body: str
        limit: int = 1
        wait: float = 0
        ack: bool = False
        to: str = ""
        ids: list = []
        priority: Literal["urgent", "normal"] = "normal"

    def said(**given):
        with pytest.raises(pydantic.ValidationError) as e:
            Args(**given)
        return argument_errors(e.value, "send", ("body", "to"))
    assert said() == "body: required"
    assert said(body=5) == "body: must be text, not 5"
    assert said(body="x", limit="many", wait="soon") == "limit: must be a whole number, not 'many'; wait: must be a number, not 'soon'"
    assert said(body="x", limit=1.5) == "limit: must be a whole number, not 1.5"
    assert said(body="x", ack="perhaps") == "ack: must be true or false, not 'perhaps'"
    assert said(body="x", to=5) == "to: must be a name, a comma-separated list of names or a JSON array of them"
    assert said(body="x", ids=5) == "ids: must be a list of ids or one string of them"
    assert said(body="x", priority="soon") == "priority: must be 'urgent' or 'normal', not 'soon'"
    assert said(body="x", colour="red") == "colour: send takes no such argument (it takes body, to)"
    assert said(body=["a", "b"]) == "body: must be text, not ['a', 'b']"


def test_a_tool_takes_a_whole_float_for_an_integer_and_a_json_array_in_a_string_for_a_list(team):
    from mcp.server.mcpserver.exceptions import ToolError

    from relay.agent import mcp_server
    from test_agents import drain
    with relay.Agent("Alice", root=team.root) as alice, relay.Agent("Bob", root=team.root) as bob:
        ids = [alice.send("Bob", f"m{i}") for i in range(3)]
        drain(team.root)
        server = mcp_server.build(bob)

        def call(name, args):
            return anyio.run(server.call_tool, name, args).structured_content
        assert [m["id"] for m in call("inbox", {"limit": 2.0, "mark_read": False})["messages"]] == ids[:2]
        with pytest.raises(ToolError, match="limit: must be a whole number, not 2.5"):
            call("inbox", {"limit": 2.5, "mark_read": False})
        assert call("mark_read", {"ids": f' ["{ids[0]}"]'}) == {"marked": [ids[0]], "already": []}
        assert call("mark_read", {"ids": f"{ids[0]}, {ids[1]}"}) == {"marked": [ids[1]], "already": [ids[0]]}
        with pytest.raises(ToolError, match=r"'\[bad' is not a JSON array of ids"):
            call("mark_read", {"ids": "[bad"})
        with pytest.raises(ToolError, match="ids: must be a list of ids or one string of them"):
            call("mark_read", {"ids": "[1]"})
        assert [m.id for m in bob.inbox()] == ids[2:]


def test_the_receipts_tool_waits_no_time_without_wait_s_and_says_done_timed_out_or_the_failure(team, cli):
    from relay.agent import mcp_server
    from test_agents import drain
    with relay.Agent("Alice", root=team.root) as alice, relay.Agent("Bob", root=team.root) as bob:
        mid = alice.send("Bob", "read me")
        box = team.state / "outbox" / "Alice"
        (box / ".z").write_text("TO: Zed\n\nto no one")
        (box / ".z").rename(box / "z")
        drain(team.root)
        failed = next(r["id"] for r in json.loads(cli("audit", "--json", "--status", "failed").stdout))
        server = mcp_server.build(alice)

        def call(args):
            got = anyio.run(server.call_tool, "receipts", args).structured_content
            return {k: got[k] for k in ("done", "timed_out", "error")}
        assert call({"id": mid}) == {"done": None, "timed_out": False, "error": None}
        assert call({"id": mid, "wait_for": "read"}) == {"done": None, "timed_out": True, "error": None}
        bob.ack(bob.inbox())
        assert call({"id": mid, "wait_for": "read", "wait_s": 0}) == {"done": True, "timed_out": False, "error": None}
        assert call({"id": mid, "wait_for": "acked"})["timed_out"] is True
        got = call({"id": failed, "wait_for": "read"})
        assert got["done"] is False and got["timed_out"] is False and "Zed" in got["error"]


def test_an_argument_to_a_tool_that_takes_none_says_it_takes_none_and_a_missing_list_is_required():
    import pydantic

    from relay.agent.mcp_handover import argument_errors

    class Nothing(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")

    class Names(pydantic.BaseModel):
        to: str
        ids: list

    with pytest.raises(pydantic.ValidationError) as e:
        Nothing(colour="red")
    assert argument_errors(e.value, "agents") == "colour: agents takes no such argument (it takes none)"
    with pytest.raises(pydantic.ValidationError) as e:
        Names()
    assert argument_errors(e.value, "send", ("to", "ids")) == "to: required; ids: required"
