"""relay adopt: the agents' instructions in one marked block per file, written and updated in
place, and the contributed snippet rendered from the same template."""
import os
import stat
import sys
from pathlib import Path

import pytest
from conftest import fill_disk
from pyfakefs.fake_filesystem import set_uid

from relay.agent import adopt
from relay.agent.instructions import command
from relay.errors import RelayError

R = command()           # relay's command as the block writes it: here, the virtual environment's, by path
TEAM = {"alice", "bob", "carol"}

SNIPPET = Path(__file__).parent.parent / "contrib" / "AGENT_SNIPPET.md"


@pytest.fixture
def team(cli):
    cli("init", "--agent", "alice", "--agent", "bob", "--agent", "carol")
    return cli


def error(result):
    """The one line a refusal prints (relay's 'relay: ' prefix taken off)."""
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith("relay: ")
    return lines[0][len("relay: "):]


def test_adopt_writes_the_block_after_the_text_there(team):
    agents_md = team.root / "AGENTS.md"
    agents_md.write_text("# Project\n\nRun the tests before you push.\n")
    out = team("adopt", "bob").output
    assert out.splitlines()[0] == f"added the relay block for bob to {agents_md}"
    text = agents_md.read_text()
    block = adopt.block(["bob"], TEAM, root=team.root)
    assert text == "# Project\n\nRun the tests before you push.\n\n" + block
    assert block.startswith("<!-- relay:begin agents=bob -->\n") and block.endswith("<!-- relay:end -->\n")
    assert R.endswith("/.venv/bin/relay") and R.startswith("/")
    for told in ("You are the agent `bob`", "`alice`, `carol` (when this was written",
                 f"{R} inbox bob --wait 600 --ack", f"{R} send --from bob --to alice",
                 f"{R} send --from bob --reply-to ID", f"{R} audit --from bob --status failed",
                 f"{R} mark-read --agent bob ID", f"{R} search \"tests green\" --agent bob",
                 "d=.relay/outbox/bob; n=msg-$(date +%s%N)-$$", 'relay.Agent("bob")', "me.reply(m,",
                 f"claude mcp add relay-bob -- {R} mcp --agent bob --root {team.root}"):
        assert told in text, told
    assert "{{" not in text and "YOUR_NAME" not in text


def test_a_missing_file_is_created_with_the_block_alone(team):
    team("adopt", "alice")
    assert (team.root / "AGENTS.md").read_text() == adopt.block(["alice"], TEAM, root=team.root)


def test_a_second_run_changes_nothing_and_a_new_agent_updates_the_block_in_place(team):
    path = team.root / "AGENTS.md"
    before, after = "# Rules\n\nBe brief.\n\n", "\n## Later notes\n\nKeep this.\n"
    path.write_text(before + adopt.block(["bob"], {"alice", "bob"}) + after)     # an old block, mid-file
    assert "updated" in team("adopt", "bob").output
    assert path.read_text() == before + adopt.block(["bob"], TEAM, root=team.root) + after
    inode, mtime = path.stat().st_ino, path.stat().st_mtime_ns
    assert team("adopt", "bob").output.splitlines()[0] == f"the relay block for bob in {path} is up to date"
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (inode, mtime)     # not even rewritten
    team("init", "--agent", "dave")
    team("adopt", "bob")
    assert path.read_text() == before + adopt.block(["bob"], TEAM | {"dave"}, root=team.root) + after


def test_agents_of_one_file_share_one_block_with_a_line_each(team):
    path = team.root / "CLAUDE.md"
    path.write_text("intro\n")
    team("adopt", "bob", "--file", "CLAUDE.md")
    assert "added" in team("adopt", "alice", "--file", "CLAUDE.md").output
    assert path.read_text() == "intro\n\n" + adopt.block(["alice", "bob"], TEAM, root=team.root)
    team("init", "--agent", "dave")
    assert "updated" in team("adopt", "bob", "--file", "CLAUDE.md").output
    assert path.read_text() == "intro\n\n" + adopt.block(["alice", "bob"], TEAM | {"dave"}, root=team.root)
    assert not (team.root / "AGENTS.md").exists()


def test_three_agents_read_one_short_block_that_says_how_each_knows_its_name(team):
    for agent in ("alice", "bob", "carol"):
        team("adopt", agent)
    text = (team.root / "AGENTS.md").read_text()
    assert text.count("<!-- relay:begin") == 1 and len(text.splitlines()) <= 66, len(text.splitlines())
    for agent in ("alice", "bob", "carol"):
        assert f"- `{agent}`: `RELAY_AGENT={agent}`" in text
    assert 'You are the one `echo "$RELAY_AGENT"` names' in text
    assert f'{R} inbox "$RELAY_AGENT" --wait 600 --ack' in text and "relay.Agent()" in text
    assert "follow the one with your name" not in text


def test_the_text_tells_the_agents_whole_day_in_about_60_lines():
    one = adopt.block(["bob"], TEAM, root="/abs/project")
    shared = adopt.block(["alice", "bob", "carol"], TEAM, root="/abs/project")
    assert len(one.splitlines()) <= 60 and len(shared.splitlines()) <= 66, (len(one.splitlines()),
                                                                          len(shared.splitlines()))
    for text in (" ".join(one.split()), " ".join(shared.split())):
        for told in (" reserve --agent ", " reservations ", "--exclusive", " guard install", "RELAY_AGENT=",
                     "bounce", " ack ID ", "--ack-required", "--priority urgent", "--wait-read", "--wait-acked",
                     " overdue ", " show ID ", " state list", "--if-absent", " hook install claude --agent ",
                     "relay://inbox/"):
            assert told in text, told
    # who commits, said so that the guard knows it: by name in a file of one agent
    assert "`RELAY_AGENT=bob git commit ...`" in one and "`git config relay.agent bob`" in one
    assert "`RELAY_AGENT=<your name> git commit ...`" in shared


def test_the_text_names_every_tool_the_mcp_server_serves(team):
    pytest.importorskip("mcp")
    import anyio

    import relay
    from relay.agent.mcp_server import build
    with relay.Agent("bob", root=team.root) as bob:
        served = {t.name for t in anyio.run(build(bob).list_tools)}
    text = " ".join(adopt.block(["bob"], TEAM).split())
    assert len(served) >= 16
    for name in served:
        assert f" {name}," in text or f" {name};" in text, name


def test_blocks_an_earlier_version_wrote_are_taken_into_the_shared_one(team):
    path = team.root / "AGENTS.md"
    old = "<!-- relay:begin agent={0} -->\nthe old text for {0}\n<!-- relay:end agent={0} -->\n"
    path.write_text("top\n\n" + old.format("alice") + "\nmiddle\n\n" + old.format("bob") + "\nbottom\n")
    assert "added" in team("adopt", "carol").output
    shared = adopt.block(["alice", "bob", "carol"], TEAM, root=team.root)
    assert path.read_text() == "top\n\n" + shared + "\nmiddle\n\nbottom\n"


def test_crlf_files_and_a_last_line_without_newline_keep_their_form(team):
    path = team.root / "AGENTS.md"
    block = adopt.block(["bob"], {"alice", "bob"}).replace("\n", "\r\n")
    path.write_bytes(("top\r\n\r\n" + block[:-2]).encode())        # the end marker ends the file
    team("adopt", "bob")
    new = adopt.block(["bob"], TEAM, root=team.root).replace("\n", "\r\n")[:-2]
    assert path.read_bytes() == ("top\r\n\r\n" + new).encode()


BEGIN, END = "<!-- relay:begin agent={} -->", "<!-- relay:end agent={} -->"     # an earlier version's
SHARED, SHARED_END = "<!-- relay:begin agents={} -->", "<!-- relay:end -->"


@pytest.mark.parametrize("lines, message", [
    ([BEGIN.format("bob"), "half a block"],
     "AGENTS.md:2: the begin marker for bob has no end marker"),
    (["text", END.format("bob")],
     "AGENTS.md:3: an end marker for bob with no begin marker for bob before it"),
    ([BEGIN.format("bob"), BEGIN.format("alice"), END.format("alice"), END.format("bob")],
     "AGENTS.md:3: a begin marker for alice inside the block of bob, whose end marker is missing"),
    ([BEGIN.format("bob"), END.format("alice")],
     "AGENTS.md:3: an end marker for alice with no begin marker for alice before it"),
    ([BEGIN.format("bob"), END.format("bob"), BEGIN.format("bob"), END.format("bob")],
     "AGENTS.md:4: a second block for agent bob"),
    (["<!--relay:begin bob-->"],
     "AGENTS.md:2: '<!--relay:begin bob-->' is not a relay marker adopt can read (expected "
     "'<!-- relay:begin agents=NAME,... -->' or '<!-- relay:end -->')"),
    ([SHARED.format("bob,carol"), "half a block"], "AGENTS.md:2: the begin marker for bob, carol has no end marker"),
    (["text", SHARED_END], "AGENTS.md:3: an end marker with no begin marker before it"),
    ([BEGIN.format("bob"), SHARED_END], "AGENTS.md:3: an end marker with no begin marker before it"),
    ([SHARED.format("alice,bob"), SHARED_END, BEGIN.format("bob"), END.format("bob")],
     "AGENTS.md:4: a second block for agent bob"),
])
def test_broken_markers_are_refused_and_the_file_is_left_as_it_is(team, lines, message):
    path = team.root / "AGENTS.md"
    data = ("# top\n" + "\n".join(lines) + "\n").encode()
    path.write_bytes(data)
    for agent in ("bob", "carol"):          # whichever agent: a broken file is nobody's to rewrite
        line = error(team("adopt", agent, ok=False))
        assert line == f"{team.root}/{message}; mend the markers by hand (the file is left as it is)"
        assert path.read_bytes() == data
    assert sorted(os.listdir(team.root)) == [".relay", "AGENTS.md"]           # no temporary left


def test_a_marker_mentioned_inside_a_line_is_text(team):
    path = team.root / "AGENTS.md"
    path.write_text("Blocks start with `<!-- relay:begin agent=NAME -->`.\n")
    team("adopt", "bob")
    assert path.read_text().startswith("Blocks start with `<!-- relay:begin agent=NAME -->`.\n\n<!-- relay:begin")


def test_a_symlinked_file_is_refused_and_nothing_is_written_through_it(team, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside") / "bashrc"
    outside.write_text("export SECRET=1\n")
    link = team.root / "AGENTS.md"
    link.symlink_to(outside)
    assert error(team("adopt", "bob", ok=False)) == (
        f"{link} is a symbolic link; relay adopt never writes through one (agents can plant them): "
        "give --file the real path, or remove the link")
    assert outside.read_text() == "export SECRET=1\n" and link.is_symlink()
    dangling = team.root / "CLAUDE.md"
    dangling.symlink_to(outside.parent / "not-yet")
    assert "is a symbolic link" in error(team("adopt", "bob", "--file", "CLAUDE.md", ok=False))
    assert not (outside.parent / "not-yet").exists()


def test_a_hard_linked_file_is_replaced_not_written_into(team, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside") / "notes.md"
    outside.write_text("mine\n")
    os.link(outside, team.root / "AGENTS.md")
    team("adopt", "bob")
    assert outside.read_text() == "mine\n"
    assert (team.root / "AGENTS.md").read_text().startswith("mine\n\n<!-- relay:begin agents=bob -->")


def test_what_is_not_a_text_file_is_refused(team):
    (team.root / "dir.md").mkdir()
    assert error(team("adopt", "bob", "--file", "dir.md", ok=False)) == (
        f"{team.root / 'dir.md'} is not a regular file; relay adopt writes only a plain text file")
    os.mkfifo(team.root / "fifo.md")
    assert "is not a regular file" in error(team("adopt", "bob", "--file", "fifo.md", ok=False))
    (team.root / "latin1.md").write_bytes(b"caf\xe9\n")
    assert error(team("adopt", "bob", "--file", "latin1.md", ok=False)) == (
        f"{team.root / 'latin1.md'} is not UTF-8 text (byte 0xe9 at offset 3); relay adopt changes only a text file")
    assert (team.root / "latin1.md").read_bytes() == b"caf\xe9\n"
    assert error(team("adopt", "bob", "--file", "no/such/dir/AGENTS.md", ok=False)) == (
        f"no directory {team.root / 'no/such/dir'} to write AGENTS.md in")


def test_a_file_inside_the_state_directory_is_refused(team):
    line = error(team("adopt", "bob", "--file", ".relay/outbox/bob/AGENTS.md", ok=False))
    assert line == (f"{team.state / 'outbox/bob/AGENTS.md'} is inside the state directory {team.state}; relay "
                    "adopt writes an instructions file of the project (e.g. AGENTS.md or CLAUDE.md)")
    assert "inside the state directory" in error(team("adopt", "bob", "--file", "./.relay//x.md", ok=False))
    assert os.listdir(team.state / "outbox" / "bob") == []


def test_an_absolute_file_in_the_project_and_the_mode_of_an_existing_one(team):
    (team.root / "docs").mkdir()
    path = team.root / "docs" / "CLAUDE.md"
    path.write_text("x\n")
    path.chmod(0o600)
    team("adopt", "carol", "--file", str(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == "x\n\n" + adopt.block(["carol"], TEAM, root=team.root)


@pytest.fixture
def outside(tmp_path_factory):
    """A directory outside the project, with a file in it."""
    place = tmp_path_factory.mktemp("outside")
    (place / "notes.md").write_text("mine\n")
    return place


def test_a_file_outside_the_project_root_is_refused_and_nothing_is_written(team, outside):
    before = sorted(os.listdir(team.root.parent))
    for given, why in [("../escaped.md", "holds '..'"), ("docs/../../escaped.md", "holds '..'"),
                       (str(outside / "AGENTS.md"), f"is not inside the project root {team.root}"),
                       (str(outside / "notes.md"), f"is not inside the project root {team.root}")]:
        line = error(team("adopt", "bob", "--file", given, ok=False))
        assert line.startswith(f"--file {given!r} ") and why in line, line
        assert "relative to the project root" in line
    assert sorted(os.listdir(team.root.parent)) == before
    assert sorted(os.listdir(outside)) == ["notes.md"] and (outside / "notes.md").read_text() == "mine\n"


@pytest.mark.parametrize("planted, given", [("docs", "docs/AGENTS.md"), ("a/b", "a/b/c/AGENTS.md"),
                                            ("a/b", "a/b/notes.md")])
def test_a_symlinked_directory_on_the_way_is_refused_and_nothing_is_written_through_it(team, outside, planted,
                                                                                       given):
    link = team.root / planted
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside, target_is_directory=True)
    (outside / "c").mkdir()
    line = error(team("adopt", "bob", "--file", given, ok=False))
    assert line == (f"{link} is a symbolic link; relay adopt never writes through one (agents can plant them): "
                    "give --file the real path, or remove the link")
    assert sorted(os.listdir(outside)) == ["c", "notes.md"] and os.listdir(outside / "c") == []
    assert (outside / "notes.md").read_text() == "mine\n"
    line = error(team("adopt", "dave", "--create", "--file", given, ok=False))      # no agent made either
    assert "is a symbolic link" in line and not (team.state / "outbox" / "dave").exists()


def test_a_directory_swapped_for_a_link_while_adopt_writes_is_not_written_through(team, outside):
    """The walk holds each directory by its descriptor: a swap after it changes nothing."""
    docs = team.root / "docs"
    docs.mkdir()

    def fsync_while_someone_swaps(fd):      # the seam runs between writing the new text and the rename
        if not docs.is_symlink():
            docs.rename(team.root / "docs.old")
            docs.symlink_to(outside, target_is_directory=True)

    assert adopt.update(docs / "AGENTS.md", "bob", adopt.block(["bob"]), fsync=fsync_while_someone_swaps,
                        root=team.root) == "added"
    assert os.listdir(outside) == ["notes.md"]
    assert (team.root / "docs.old" / "AGENTS.md").read_text() == adopt.block(["bob"])
    with pytest.raises(RelayError, match="docs is a symbolic link; relay adopt never writes through one"):
        adopt.update(docs / "AGENTS.md", "bob", adopt.block(["bob"]), root=team.root)


def test_unknown_and_invalid_agents(team):
    assert error(team("adopt", "Bob", ok=False)) == (
        "unknown agent 'Bob'; did you mean bob? known agents: alice, bob, carol (--create adds a new agent on purpose)")
    assert error(team("adopt", "dave", ok=False)) == (
        "unknown agent 'dave'; known agents: alice, bob, carol (--create adds a new agent on purpose)")
    assert error(team("adopt", "System", ok=False)) == (
        "'System' is a name relay keeps for itself (System: relay's own name), in any case (AGENT)")
    assert "invalid agent name '../x'" in error(team("adopt", "../x", ok=False))
    assert not (team.root / "AGENTS.md").exists()


def test_create_adds_the_agent_unless_the_file_would_be_refused(team):
    path = team.root / "AGENTS.md"
    path.write_text(BEGIN.format("alice") + "\n")
    assert "has no end marker" in error(team("adopt", "dave", "--create", ok=False))
    assert not (team.state / "outbox" / "dave").exists()
    path.unlink()
    team("adopt", "dave", "--create")
    assert (team.state / "outbox" / "dave").is_dir() and (team.state / "inbox" / "dave" / "new").is_dir()
    assert path.read_text() == adopt.block(["dave"], TEAM | {"dave"}, root=team.root)


def test_outside_a_project(cli):
    assert error(cli("adopt", "bob", ok=False)) == (
        f"no relay state directory at {cli.state}: run `relay init` in the project first")
    assert not (cli.root / "AGENTS.md").exists()


def test_a_file_changed_while_adopt_writes_is_not_overwritten(tmp_path):
    path = tmp_path / "AGENTS.md"
    path.write_text("before\n")

    def fsync_while_someone_writes(fd):     # the seam runs between writing the new text and the rename
        path.write_text("an agent's edit\n")

    with pytest.raises(RelayError, match="changed while relay adopt ran; nothing was written: run it again"):
        adopt.update(path, "bob", adopt.block(["bob"], {"alice", "bob"}), fsync=fsync_while_someone_writes)
    assert path.read_text() == "an agent's edit\n"
    assert os.listdir(tmp_path) == ["AGENTS.md"]


def test_a_failed_sync_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "AGENTS.md"
    path.write_text("before\n")

    def broken_fsync(fd):
        raise OSError(5, "Input/output error")

    with pytest.raises(OSError):
        adopt.update(path, "bob", adopt.block(["bob"]), fsync=broken_fsync)
    assert path.read_text() == "before\n" and os.listdir(tmp_path) == ["AGENTS.md"]


def test_an_agent_with_no_others_and_a_long_team():
    alone = adopt.render(["solo"], {"solo"})
    assert f"You are the agent `solo`; no other agent yet (`{R} agents` lists who is there now)." in alone
    assert "--to OTHER_NAME" in alone
    many = adopt.render(["a0"], {f"a{i}" for i in range(100)})
    assert "`a1`, `a10`" in many and "and 59 more (when this was written" in many


def test_the_mcp_line_names_a_root_with_a_space_and_a_quote_quoted_for_the_shell():
    text = adopt.render(["bob"], TEAM, root="/abs/my project's")
    [line] = [ln for ln in text.splitlines() if "claude mcp add relay-bob" in ln]
    assert line.endswith(" --root '/abs/my project'\"'\"'s'")


def test_the_snippet_is_the_template_rendered_for_a_placeholder_agent():
    assert SNIPPET.read_text(encoding="utf-8") == adopt.snippet(), (
        "contrib/AGENT_SNIPPET.md differs from the template: python -m relay.agent.adopt > contrib/AGENT_SNIPPET.md")
    assert adopt.render(["YOUR_NAME"], None, relay="relay", python="python3") in adopt.snippet()
    for told in ("relay inbox YOUR_NAME --wait", "--reply-to ID", "msg-$(date +%s%N)-$$",
                 "--status failed", "claude mcp add", "`python3 -m relay`"):
        assert told in adopt.snippet(), told


def test_a_marker_after_a_byte_order_mark_is_found(tmp_path):
    path = tmp_path / "AGENTS.md"
    path.write_text("\ufeff" + adopt.block(["bob"]) + "tail\n", encoding="utf-8")
    assert adopt.update(path, "bob", adopt.block(["bob"], {"alice", "bob"})) == "updated"
    assert path.read_text(encoding="utf-8") == "\ufeff" + adopt.block(["bob"], {"alice", "bob"}) + "tail\n"


def test_adopt_runs_at_once_on_one_file_take_turns(tmp_path):
    import threading
    path = tmp_path / "AGENTS.md"
    path.write_text("top\n")
    names = [f"agent{i}" for i in range(8)]
    errors = []

    def one(name):
        try:
            adopt.update(path, name, lambda agents: adopt.block(agents, set(names)))
        except Exception as e:              # noqa: BLE001  (kept for the assertion below)
            errors.append(e)

    threads = [threading.Thread(target=one, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert adopt.adopted(path.read_text(), path) == set(names)
    assert path.read_text() == "top\n\n" + adopt.block(names, set(names))


KILLER = """
import os, signal, sys
from relay.agent import adopt
calls = []
def fsync(fd):
    calls.append(fd)
    if len(calls) == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)
    os.fsync(fd)
adopt.update(sys.argv[1], "bob", adopt.block(["bob"], {"alice", "bob"}), fsync=fsync)
"""


@pytest.mark.parametrize("at, whole", [(1, "old"), (2, "new")])
def test_kill_9_at_each_sync_leaves_the_old_file_or_the_new_one_whole(tmp_path, at, whole):
    import subprocess
    import sys
    path = tmp_path / "AGENTS.md"
    old = "keep\n\n" + adopt.block(["bob"])
    path.write_text(old)
    done = subprocess.run([sys.executable, "-c", KILLER, str(path), str(at)], capture_output=True, timeout=30)
    assert done.returncode == -9, done.stderr
    new = "keep\n\n" + adopt.block(["bob"], {"alice", "bob"})
    assert path.read_text() == {"old": old, "new": new}[whole]
    adopt.update(path, "bob", adopt.block(["bob"], {"alice", "bob"}))        # a later run finishes the job
    assert path.read_text() == new


# -- faults on a file system laid out by hand (pyfakefs): a disk that fills, a directory relay may
#    not write in (root may write anywhere: the real file system cannot show it to a test run as
#    root). adopt needs no ledger, so the whole verb runs there. -------------------------------------

def laid_out(fs, text="# our notes\n"):
    """/proj with the agents alice and bob (their directories; adopt reads no ledger) and AGENTS.md."""
    for d in ("outbox/alice", "outbox/bob", "inbox/alice/new", "inbox/bob/new"):
        fs.create_dir(f"/proj/.relay/{d}")
    fs.create_file("/proj/AGENTS.md", contents=text)
    return Path("/proj/AGENTS.md")


def adopt_verb(*args):
    from click.testing import CliRunner

    from relay.cli import main
    return CliRunner().invoke(main, ["--root", "/proj", "adopt", *args])


def test_a_disk_that_fills_while_adopt_writes_is_one_error_and_the_file_is_as_it_was(fs):
    path = laid_out(fs)
    assert adopt_verb("alice").exit_code == 0
    before = path.read_bytes()
    fill_disk(fs, 100)                  # room for the temporary file, not for the new text
    line = error(adopt_verb("bob"))
    assert line.startswith("the disk is full: No space left on device (") and \
        line.endswith("free some space, then run the command again")
    assert path.read_bytes() == before and sorted(os.listdir("/proj")) == [".relay", "AGENTS.md"]
    fs.set_disk_usage(1 << 40)
    assert adopt_verb("bob").exit_code == 0
    assert [agents for agents, _, _ in adopt.blocks(path.read_text(), path)] == [("alice", "bob")]   # one block


def test_a_directory_adopt_may_not_write_in_is_one_error_and_the_file_is_as_it_was(fs):
    path = laid_out(fs)
    os.chmod("/proj", 0o555)
    set_uid(4242)
    line = error(adopt_verb("alice"))
    assert "Permission denied" in line
    assert path.read_text() == "# our notes\n" and sorted(os.listdir("/proj")) == [".relay", "AGENTS.md"]


def test_a_directory_made_read_only_while_adopt_writes_leaves_the_file_as_it_was(fs):
    """Made read-only after the new text is written and synced beside the file, before it is
    renamed over it: the rename is refused, and the file holds its old text whole."""
    path = laid_out(fs)
    synced = []

    def fsync(fd):
        if not synced:
            os.chmod("/proj", 0o555)
            set_uid(4242)
        synced.append(fd)
    with pytest.raises(PermissionError):
        adopt.update(path, "alice", adopt.block("alice", {"bob"}), fsync=fsync, root=Path("/proj"))
    assert len(synced) == 1 and path.read_text() == "# our notes\n"


@pytest.mark.parametrize("text", ["", "\n", "\n\n", "  \n"])
def test_a_file_of_blank_lines_gets_the_block_after_them_with_no_blank_line_added(team, text):
    path = team.root / "AGENTS.md"
    path.write_text(text)
    team("adopt", "bob")
    assert path.read_text() == text + adopt.block(["bob"], TEAM, root=team.root)


def test_a_last_line_without_its_newline_gets_one_and_a_blank_line_before_the_block(team):
    path = team.root / "AGENTS.md"
    path.write_text("# Project")
    team("adopt", "bob")
    assert path.read_text() == "# Project\n\n" + adopt.block(["bob"], TEAM, root=team.root)


@pytest.mark.parametrize("given", [".", "./", "{root}", "{root}/"])
def test_a_file_naming_the_root_itself_names_no_file(tmp_path, given):
    given = given.format(root=tmp_path)
    with pytest.raises(RelayError) as e:
        adopt.target(tmp_path, tmp_path / ".relay", given)
    assert str(e.value) == f"--file {given!r} names no file; relay adopt writes a file relative to the project root"
    assert adopt.target(tmp_path, tmp_path / ".relay", None) == tmp_path / "AGENTS.md"
    assert adopt.target(tmp_path, tmp_path / ".relay", "./docs/x.md") == tmp_path / "docs/x.md"


def test_a_file_flag_below_a_file_is_refused_as_no_directory_to_write_in(team):
    (team.root / "README.md").write_text("x\n")
    assert error(team("adopt", "bob", "--file", "README.md/AGENTS.md", ok=False)) == (
        f"{team.root / 'README.md'} is not a directory to write AGENTS.md in")
    assert (team.root / "README.md").read_text() == "x\n"


def test_an_instructions_file_of_4_mib_is_taken_and_one_byte_more_is_refused(team):
    path = team.root / "AGENTS.md"
    path.write_bytes(b"x" * (adopt.MAX_FILE_BYTES - 1) + b"\n")
    team("adopt", "bob")
    assert path.read_bytes().startswith(b"x" * (adopt.MAX_FILE_BYTES - 1) + b"\n\n<!-- relay:begin agents=bob")
    path.write_bytes(b"x" * adopt.MAX_FILE_BYTES + b"\n")
    assert error(team("adopt", "bob", ok=False)) == (
        f"{path} is {adopt.MAX_FILE_BYTES + 1} bytes, more than an instructions file of 4 MiB; give --file another file")
    assert path.stat().st_size == adopt.MAX_FILE_BYTES + 1


def test_relays_command_in_the_block_is_relay_when_the_default_path_finds_this_script_else_its_path(
        tmp_path, monkeypatch):
    from relay.agent import instructions
    venv = tmp_path / "my venv" / "bin"
    venv.mkdir(parents=True)
    monkeypatch.setattr(sys, "executable", str(venv / "python3"))
    assert instructions.command() == f"'{venv}/python3' -m relay"            # no script beside it
    (venv / "relay").write_text("#!/bin/sh\n")
    assert instructions.command() == f"'{venv}/python3' -m relay"            # there, but not runnable
    (venv / "relay").chmod(0o755)
    monkeypatch.setattr(os, "defpath", str(tmp_path / "nowhere"))
    assert instructions.command() == f"'{venv}/relay'"
    monkeypatch.setattr(os, "defpath", str(venv))
    assert instructions.command() == "relay"
    other = tmp_path / "other"
    other.mkdir()
    (other / "relay").write_text("#!/bin/sh\n")
    (other / "relay").chmod(0o755)
    monkeypatch.setattr(os, "defpath", str(other))                           # another relay on the PATH
    assert instructions.command() == f"'{venv}/relay'"


def test_forty_other_agents_are_all_named_and_a_forty_first_is_counted_as_one_more():
    forty = adopt.render(["a00"], {f"a{i:02d}" for i in range(41)})
    assert "`a01`" in forty and "`a40`" in forty and " more (when this was written" not in forty
    assert "the other agents: `a01`, `a02`" in forty and "`a40` (when this was written;" in forty
    more = adopt.render(["a00"], {f"a{i:02d}" for i in range(42)})
    assert "`a40` and 1 more (when this was written;" in more and "`a41`" not in more
