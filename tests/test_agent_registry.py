"""The agent registry: a `spawn` registers the agent it names (active, with its metadata), a
`release` marks it inactive, both recorded with the control message; `relay agents` (--active,
--json, NAME), the Python API and MCP agents() say which agents are active; a send to a released
agent is delivered and tells its sender; a spawn or release relay cannot apply fails with the
reason; a ledger from before migration 50 gets the registry when it is opened."""
import json
import sqlite3

import anyio
import pytest

import relay
from relay.core import registry
from relay.core.message import iso
from relay.ledger.history import History
from relay.ledger.ledger import Ledger

NEVER_SPAWNED = {"state": "active", "metadata": {}, "spawned_at": None, "spawned_by": None,
                 "released_at": None, "released_by": None}


def roster(relay_):
    return registry.roster(relay_.history, [])


def events(relay_, mid):
    return [(e["event"], e["detail"]) for e in relay_.history.events(mid) if e["event"].startswith("agent-")]


def by_kind(relay_, kind):
    return list(relay_.history.audit(kind=kind))


# -- spawn and release, as the daemon records them ------------------------------------------------

def test_a_spawn_registers_the_agent_it_names_with_its_metadata(project, clock):
    r = project.relay()
    project.drop("Ann", "spawn", "NAME: Dana\nCLI: claude\nMODEL: opus\nCWD: work/dana\n\nreview the parser\n")
    assert r.drain().failed == 0
    [spawn] = by_kind(r, "spawn")
    assert spawn["status"] == "archived"
    dana = roster(r)["Dana"]
    assert dana.active and (dana.spawned_by, dana.released_at, dana.released_by) == ("Ann", None, None)
    assert dana.metadata == {"cli": "claude", "cwd": "work/dana", "model": "opus", "task": "review the parser",
                             "spawned_by": "Ann", "spawned_at": dana.spawned_at, "spawn_id": spawn["id"]}
    assert dana.spawned_at.startswith(iso(clock.now)[:16])
    # recorded with the control message (its event), which System's inbox holds as any message
    assert events(r, spawn["id"]) == [("agent-spawned", "Dana: active")]
    [env] = project.inbox("System")
    assert (env["kind"], env["name"], env["cli"]) == ("spawn", "Dana", "claude")
    # a new agent: its outbox and inbox, so that it is known, can be written to and can send
    assert (project.state / "outbox" / "Dana").is_dir() and (project.state / "inbox" / "Dana" / "new").is_dir()
    assert "Dana" in r.known_agents(refresh=True)


def test_a_spawn_again_makes_the_agent_active_and_replaces_its_metadata(project, clock):
    r = project.relay()
    project.drop("Ann", "spawn", "NAME: Dana\nCLI: claude\nMODEL: opus\n\nfirst task")
    r.drain()
    project.drop("Ben", "release", "NAME: Dana\n\n")
    r.drain(now_fn=lambda: clock.advance(5))
    assert roster(r)["Dana"].state == "inactive"
    # JSON this time, from another agent, with a TASK key (the task, rather than the body)
    project.drop("Cy", "respawn.json", json.dumps({"kind": "spawn", "name": "Dana", "cli": "codex",
                                                   "task": "second task", "body": "notes"}))
    r.drain(now_fn=lambda: clock.advance(5))
    dana = roster(r)["Dana"]
    [_, second] = sorted(by_kind(r, "spawn"), key=lambda m: m["id"])
    assert dana.active and (dana.spawned_by, dana.released_at, dana.released_by) == ("Cy", None, None)
    assert dana.metadata == {"cli": "codex", "cwd": None, "model": None, "task": "second task", "spawned_by": "Cy",
                             "spawned_at": dana.spawned_at, "spawn_id": second["id"]}


def test_a_release_marks_the_agent_inactive_and_keeps_its_metadata(project, clock):
    r = project.relay()
    project.drop("Ann", "spawn", "NAME: Dana\nCLI: claude\n\ngo")
    r.drain()
    project.drop("Ben", "release", "NAME: Dana\n\ndone with it")
    r.drain(now_fn=lambda: clock.advance(5))
    dana = roster(r)["Dana"]
    assert not dana.active and dana.state == "inactive"
    assert (dana.released_by, dana.metadata["cli"], dana.spawned_by) == ("Ben", "claude", "Ann")
    first = dana.released_at
    [release] = by_kind(r, "release")
    assert release["status"] == "archived" and events(r, release["id"]) == [("agent-released", "Dana: inactive")]
    # released again: nothing changes; the row says when it was released first
    project.drop("Cy", "release", "NAME: Dana\n\n")
    r.drain(now_fn=lambda: clock.advance(5))
    again = roster(r)["Dana"]
    assert (again.state, again.released_at, again.released_by) == ("inactive", first, "Ben")
    [later] = [m for m in by_kind(r, "release") if m["id"] != release["id"]]
    assert events(r, later["id"]) == [("agent-released", "Dana: inactive already; nothing changed")]


def test_an_agent_never_spawned_is_released_and_so_registered(project):
    r = project.relay()
    project.drop("Ann", "release", "NAME: Ben\n\n")
    r.drain()
    ben = roster(r)["Ben"]
    assert (ben.state, ben.metadata, ben.spawned_at, ben.released_by) == ("inactive", {}, None, "Ann")


@pytest.mark.parametrize("name, text, reason", [
    ("spawn", "CLI: claude\n\nno name", "a spawn message names its agent: add 'NAME: <agent>'"),
    ("release", "\nlet go of someone", "a release message names its agent: add 'NAME: <agent>'"),
    ("spawn", "NAME: System\n\nme?", "'System' is a name relay keeps for itself (System: relay's own name)"),
    ("spawn.json", json.dumps({"kind": "spawn", "name": "*"}), "'*' is a name relay keeps for itself (*: every agent"),
    ("spawn", "NAME: bad name!\n\nx", "invalid agent name 'bad name!' in NAME of a spawn message"),
    ("release", "NAME: Dna\n\n", "a release of 'Dna', which is no known agent; did you mean Dan?"),
])
def test_a_spawn_or_release_relay_cannot_apply_fails_with_the_reason(project, name, text, reason):
    r = project.relay(agents=("Ann", "Ben", "Dan"))
    project.drop("Ann", name, text)
    counts = r.drain()
    assert counts.failed == 1 and counts.archived == 0
    [row] = [m for m in r.history.audit() if m["kind"] != "bounce"]
    assert row["status"] == "failed" and reason in row["error"]
    assert roster(r) == {}
    report = json.loads(next((project.state / "failed" / "Ann").glob("*.error.json")).read_text())
    assert reason in report["reason"]
    [bounce] = project.inbox("Ann")     # the sender is told, as of any message that fails
    assert bounce["kind"] == "bounce" and reason in bounce["headers"]["reason"]


def test_a_spawn_of_an_agent_an_operator_archived_is_refused(project, cli):
    r = project.relay()
    cli("archive-agent", "Ben")
    project.drop("Ann", "spawn", "NAME: Ben\nCLI: claude\n\ncome back")
    assert r.drain().failed == 1
    [row] = [m for m in r.history.audit() if m["kind"] == "spawn"]
    assert "agent Ben is archived by an operator" in row["error"] and "relay archive-agent --undo Ben" in row["error"]
    assert roster(r) == {}



def test_an_agent_spawns_and_releases_through_the_api_with_the_spawns_fields(project, cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    with relay.Agent("Ann", root=project.root) as ann:
        sid = ann.spawn("Dana", "review the parser\nthen the docs", cli="claude", cwd="work/dana", model="opus",
                        request_id="spawn-dana")
        assert ann.spawn("Dana", "review the parser\nthen the docs", request_id="spawn-dana") == sid
        assert ann.repeated
        for name, reason in ((" ", "a spawn message names its agent"), ("System", "'System'"), ("*", "'[*]'"),
                             ("bad name!", "invalid agent name 'bad name!'")):
            with pytest.raises(relay.RelayError, match=reason):
                ann.spawn(name, "x")
        with pytest.raises(relay.RelayError, match="a release of 'Benn', which is no known agent; did you mean Ben?"):
            ann.release_agent("Benn")
        with pytest.raises(relay.RelayError, match="cli must be text, not int"):
            ann.spawn("Dana", cli=5)
        with pytest.raises(relay.RelayError, match=r"cwd '/' is outside the project root"):
            ann.spawn("Erin", cwd="/")          # refused now, not failed later by relay
        assert ann.spawn("Erin", cwd=str(project.root / "work")) and ann.spawn("Erin", cwd="work/erin")
    cli("run", "--once")
    with relay.Agent("Ben", root=project.root) as ben:
        dana = ben.project.registered("Dana")
        assert dana.active and dana.spawned_by == "Ann"
        assert dana.metadata == {"cli": "claude", "cwd": "work/dana", "model": "opus",
                                 "task": "review the parser\nthen the docs", "spawned_by": "Ann",
                                 "spawned_at": dana.spawned_at, "spawn_id": sid}
        ben.release_agent("Dana", "done, thanks")
    cli("run", "--once")
    with relay.Agent("Ann", root=project.root) as ann:
        dana = ann.project.registered("Dana")
        assert (dana.state, dana.released_by, dana.metadata["cli"]) == ("inactive", "Ben", "claude")
        cli("archive-agent", "Dana")
        with pytest.raises(relay.RelayError, match="agent Dana is archived by an operator"):
            ann.spawn("Dana", "come back")
    assert not list((project.state / "failed").rglob("*.error.json"))


# -- relay agents ------------------------------------------------------------------------------------

@pytest.fixture
def spawned(cli):
    """Ann spawned Dana, Ben released Cy; relayed by `relay run --once`."""
    cli("init", "--agent", "Ann", "--agent", "Ben", "--agent", "Cy")
    (cli.state / "outbox" / "Ann" / "spawn").write_text("NAME: Dana\nCLI: claude\nMODEL: opus\n\nwrite the docs")
    (cli.state / "outbox" / "Ben" / "release").write_text("NAME: Cy\n\n")
    cli("run", "--once")
    return cli


def test_relay_agents_json_has_the_registry_fields_beside_the_others(spawned):
    rows = {r["agent"]: r for r in json.loads(spawned("agents", "--json").stdout)}
    assert set(rows) == {"Ann", "Ben", "Cy", "Dana", "System"}
    for name in ("Ann", "Ben", "System"):
        assert {k: rows[name][k] for k in NEVER_SPAWNED} == NEVER_SPAWNED
    dana, cy = rows["Dana"], rows["Cy"]
    assert {"outbox_waiting", "inbox_new", "inbox_cur", "sent", "received", "last_seen", "last_error", "archived",
            "shed_to", "shed_from", "ping", "reservations"} <= set(dana)      # the fields it had
    assert (dana["state"], dana["spawned_by"], dana["released_at"]) == ("active", "Ann", None)
    assert (dana["metadata"]["cli"], dana["metadata"]["model"], dana["metadata"]["task"]) == (
        "claude", "opus", "write the docs")
    assert dana["spawned_at"].endswith("Z") and dana["metadata"]["spawned_at"] == dana["spawned_at"]
    assert (cy["state"], cy["metadata"], cy["released_by"]) == ("inactive", {}, "Ben") and cy["released_at"]


def test_relay_agents_active_lists_only_the_active_ones(spawned):
    listed = [r["agent"] for r in json.loads(spawned("agents", "--active", "--json").stdout)]
    assert listed == ["Ann", "Ben", "Dana", "System"]
    table = spawned("agents", "--active").stdout
    assert "Dana" in table and "\nCy " not in table and "spawned by Ann at" in table and "task: write the docs" in table
    assert "inactive" not in spawned("agents", "--active").stdout.split("STATE:")[0]
    everyone = spawned("agents").stdout
    assert [ln.split()[:2] for ln in everyone.splitlines() if ln.startswith("Cy ")] == [["Cy", "inactive"]]
    assert "released by Ben at" in everyone


def test_relay_agents_name_shows_one_agent(spawned):
    dana = json.loads(spawned("agents", "Dana", "--json").stdout)
    assert dana["agent"] == "Dana" and dana["state"] == "active" and dana["metadata"]["cli"] == "claude"
    assert json.loads(spawned("agents", "Cy", "--active", "--json").stdout) is None
    assert "Cy is inactive (released)" in spawned("agents", "Cy", "--active").stdout
    r = spawned("agents", "Dama", ok=False)
    assert r.exit_code == 1 and "no agent 'Dama'; did you mean Dana?" in r.stderr
    r = spawned("agents", "../x", ok=False)
    assert r.exit_code == 1 and "invalid agent name '../x'" in r.stderr


def test_a_registry_row_this_build_cannot_read_is_named_and_its_agent_shown_as_never_spawned(spawned):
    db = sqlite3.connect(spawned.state / "ledger.sqlite")
    db.execute("UPDATE agent_registry SET state = 'zombie' WHERE name = 'Dana'")
    db.commit()
    db.close()
    r = spawned("agents", "--json")
    dana = next(a for a in json.loads(r.stdout) if a["agent"] == "Dana")
    assert {k: dana[k] for k in NEVER_SPAWNED} == NEVER_SPAWNED
    assert "agent_registry row 'Dana': column state holds 'zombie'" in r.stderr


# -- the Python API and MCP ----------------------------------------------------------------------

def test_the_api_says_which_agents_are_active_and_what_their_spawn_said(spawned):
    root = spawned.root
    assert relay.agents(root=root) == ["Ann", "Ben", "Cy", "Dana"]
    assert relay.agents(root=root, active=True) == ["Ann", "Ben", "Dana"]
    with relay.Agent("Ann", root=root) as ann:
        got = {a.name: a for a in ann.agents()}
        assert [a.name for a in ann.agents(active=True)] == ["Ann", "Ben", "Dana"]
        assert got["Ann"].as_dict() == {"name": "Ann", **NEVER_SPAWNED}
        assert got["Dana"].active and got["Dana"].metadata["task"] == "write the docs"
        assert not got["Cy"].active and got["Cy"].released_by == "Ben"
        assert ann.project.registered("Dana") == got["Dana"]
        with pytest.raises(relay.NotFound, match="no agent 'Dama'; did you mean Dana?"):
            ann.project.registered("Dama")


def test_mcp_agents_says_each_agents_state_and_metadata(spawned):
    pytest.importorskip("mcp")
    from relay.agent import mcp_server
    with relay.Agent("Ann", root=spawned.root) as ann:
        server = mcp_server.build(ann)

        async def call(**args):
            return (await server.call_tool("agents", args)).structured_content

        everyone = anyio.run(call)
        active = anyio.run(lambda: call(active=True))
    assert everyone["me"] == "Ann"
    got = {a["name"]: a for a in everyone["agents"]}
    assert got["Ann"] == {"name": "Ann", "me": True, **NEVER_SPAWNED}
    assert (got["Cy"]["state"], got["Cy"]["released_by"]) == ("inactive", "Ben")
    assert (got["Dana"]["state"], got["Dana"]["metadata"]["model"], got["Dana"]["me"]) == ("active", "opus", False)
    assert [a["name"] for a in active["agents"]] == ["Ann", "Ben", "Dana"]


# -- a send to a released agent -----------------------------------------------------------------

def test_a_send_to_a_released_agent_is_delivered_and_its_sender_is_told(spawned):
    r = spawned("send", "--from", "Ann", "--to", "Cy,Ben", "are you there?")
    mid = r.stdout.strip()
    assert r.stderr.startswith("relay: warning: Cy was released (inactive since ")
    assert "by Ben); the message is delivered to its inbox all the same" in r.stderr
    assert "Ben was" not in r.stderr
    quiet = spawned("send", "--from", "Ann", "--to", "Dana", "hello")
    assert "released" not in quiet.stderr
    with relay.Agent("Ann", root=spawned.root) as ann:
        again = ann.send("Cy", "still there?")
        assert [(a.name, a.released_by) for a in ann.released] == [("Cy", "Ben")]
        ann.send("Ben", "hi")
        assert ann.released == []
    spawned("run", "--once")
    with relay.Agent("Cy", root=spawned.root) as cy:
        assert {m.id for m in cy.inbox()} == {mid, again}      # its inbox keeps mail


def test_mcp_send_to_a_released_agent_says_so(spawned):
    pytest.importorskip("mcp")
    from relay.agent import mcp_server
    with relay.Agent("Ann", root=spawned.root) as ann:
        server = mcp_server.build(ann)

        async def send(to):
            return (await server.call_tool("send", {"to": to, "body": "hi"})).structured_content

        told = anyio.run(lambda: send("Cy"))
        quiet = anyio.run(lambda: send("Dana"))
    [released] = told["released"]
    assert (released["name"], released["released_by"]) == ("Cy", "Ben") and released["released_at"].endswith("Z")
    assert quiet["released"] == []


# -- the migration ----------------------------------------------------------------------------------

def test_a_ledger_from_before_the_registry_gets_it_when_opened(project, cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    with relay.Agent("Ann", root=project.root) as ann:
        mid = ann.send("Ben", "before the registry")
    cli("run", "--once")
    path = project.state / "ledger.sqlite"
    db = sqlite3.connect(path)          # the ledger as the previous version left it
    db.executescript("DROP TABLE agent_registry; DELETE FROM schema_migrations WHERE version = 50;")
    db.close()
    r = cli("agents", "--json", ok=False)    # a read-only verb does not migrate: it says what to do
    assert r.exit_code == 1 and "start `relay run` once" in r.stderr
    with Ledger(path) as led:          # a writer migrates it
        history = History(led)
        assert [(v, n, ok) for v, n, ok in history.checks.migrations() if v == 50] == [(50, "agent registry", True)]
        assert history.registry.rows() == [] and history.get(mid)["status"] == "archived"
    rows = {a["agent"]: a for a in json.loads(cli("agents", "--json").stdout)}
    assert {k: rows["Ben"][k] for k in NEVER_SPAWNED} == NEVER_SPAWNED and rows["Ann"]["sent"] == 1
    (project.state / "outbox" / "Ann" / "spawn").write_text("NAME: Ben\nCLI: claude\n\nnow registered")
    cli("run", "--once")
    ben = json.loads(cli("agents", "Ben", "--json").stdout)
    assert (ben["state"], ben["metadata"]["task"], ben["spawned_by"]) == ("active", "now registered", "Ann")


def test_a_spawns_action_is_kept_its_task_header_read_in_any_case_and_cut_at_4096_characters(project, clock):
    """ACTION goes into the metadata only when the spawn has one; a `Task` header in any case is
    the task rather than the body, its first 4096 characters kept; a spawn with no task and an
    empty body has none."""
    r = project.relay()
    task = "é" * 4096 + "cut"
    project.drop("Ann", "spawn", f"NAME: Dana\nCLI: claude\nACTION: resume\ntAsK: {task}\n\nthe body")
    assert r.drain().failed == 0
    [spawn] = by_kind(r, "spawn")
    dana = roster(r)["Dana"]
    assert dana.metadata == {"cli": "claude", "cwd": None, "model": None, "task": "é" * 4096, "action": "resume",
                             "spawned_by": "Ann", "spawned_at": dana.spawned_at, "spawn_id": spawn["id"]}
    project.drop("Ben", "spawn", "NAME: Eve\n\n  \n")
    assert r.drain(now_fn=lambda: clock.advance(5)).failed == 0
    eve = roster(r)["Eve"]
    assert "action" not in eve.metadata
    assert (eve.metadata["task"], eve.metadata["cli"], eve.spawned_by) == (None, None, "Ben")


def test_a_spawns_every_field_and_its_task_must_be_text_and_blank_fields_are_left_out(project, cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    with relay.Agent("Ann", root=project.root) as ann:
        for field in ("cli", "cwd", "model", "action"):
            with pytest.raises(relay.RelayError) as e:
                ann.spawn("Dana", "x", **{field: 5})
            assert str(e.value) == f"{field} must be text, not int"
        with pytest.raises(relay.RelayError) as e:
            ann.spawn(["Dana"], "x")
        assert str(e.value) == "name must be text, not list"
        with pytest.raises(relay.RelayError) as e:
            ann.spawn("Dana", b"the task")
        assert str(e.value) == "the body must be text, not bytes"
        with pytest.raises(relay.RelayError) as e:
            ann.release_agent("Ben", 3)
        assert str(e.value) == "the body must be text, not int"
        ann.spawn(" Dana ", "the task", cli=" claude ", model="  ", cwd="")
    cli("run", "--once")
    with relay.Agent("Ben", root=project.root) as ben:
        dana = ben.project.registered("Dana")
        assert (dana.metadata["cli"], dana.metadata["model"], dana.metadata["cwd"]) == ("claude", None, None)
        assert dana.metadata["task"] == "the task"


def test_a_spawn_waits_for_its_delivery_only_when_asked_and_zero_is_a_wait_of_no_time(project, cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    with relay.Agent("Ann", root=project.root) as ann:
        assert ann.spawn("Dana", "x", wait_delivered=False)
        assert ann.spawn("Erin", "x", wait_delivered=None)
        with pytest.raises(relay.errors.DeliveryTimeout) as e:
            ann.spawn("Finn", "x", wait_delivered=0)
        assert "was not delivered to every recipient in 0s" in str(e.value)
        with pytest.raises(relay.errors.DeliveryTimeout):
            ann.release_agent("Ben", wait_delivered=0.0)


def test_a_spawn_repeated_under_its_request_id_changes_nothing_in_the_registry(project, clock):
    r = project.relay()
    project.drop("Ann", "spawn", "NAME: Dana\nCLI: claude\nREQUEST-ID: s-1\n\nfirst")
    r.drain()
    project.drop("Ben", "release", "NAME: Dana\n\n")
    r.drain(now_fn=lambda: clock.advance(5))
    assert roster(r)["Dana"].state == "inactive"
    project.drop("Ann", "spawn-again", "KIND: spawn\nNAME: Dana\nCLI: codex\nREQUEST-ID: s-1\n\nagain")
    r.drain(now_fn=lambda: clock.advance(5))
    again = next(m for m in by_kind(r, "spawn") if m["name"] == "spawn-again")
    assert again["status"] == "archived" and again["duplicate_of"]
    dana = roster(r)["Dana"]
    assert (dana.state, dana.metadata["cli"], dana.released_by) == ("inactive", "claude", "Ben")
    assert events(r, again["id"]) == []


@pytest.mark.parametrize("name, text, reason", [
    ("spawn", "NAME: System\n\nme?", "(System: relay's own name), in any case: it is never spawned (NAME of a spawn message)"),
    ("release", "NAME: system\n\n", "(System: relay's own name), in any case: it is never released (NAME of a release message)"),
    ("release", "NAME: Broadcast\n\n", "(Broadcast: every agent (as '*')), in any case: it is never released (NAME of a "
                                       "release message)"),
])
def test_a_reserved_name_is_never_spawned_nor_released_said_by_the_kind_of_message(project, name, text, reason):
    r = project.relay(agents=("Ann", "Ben"))
    project.drop("Ann", name, text)
    assert r.drain().failed == 1
    [row] = [m for m in r.history.audit() if m["kind"] != "bounce"]
    assert row["error"].endswith(reason)


def test_a_spawns_task_is_its_task_header_only_else_its_body(project, clock):
    r = project.relay()
    project.drop("Ann", "spawn.json", json.dumps({"kind": "spawn", "name": "Dana", "Ticket": "T-1", "body": "the body"}))
    project.drop("Ben", "spawn", "NAME: Eve\nX-Note: a note\n\nEve's task\n")
    assert r.drain().failed == 0
    assert roster(r)["Dana"].metadata["task"] == "the body" and roster(r)["Eve"].metadata["task"] == "Eve's task"


def test_a_spawn_of_a_name_an_agent_has_in_another_case_is_refused(project):
    r = project.relay(agents=("Ann", "Ben"))
    project.drop("Ann", "spawn", "NAME: ben\n\nx")
    assert r.drain().failed == 1
    [row] = [m for m in r.history.audit() if m["kind"] != "bounce"]
    assert "'ben' would be the same as the agent 'Ben'" in row["error"]
    assert row["error"].endswith("(NAME of a spawn message)")
    assert not (project.state / "outbox" / "ben").exists() and roster(r) == {}
