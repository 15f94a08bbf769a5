"""The text `relay adopt` writes, followed word for word as an agent would: every command of it run
as written, in a shell whose PATH lacks relay's virtual environment, against a real daemon; once
in a file adopted for one agent (its name in the commands), once in a file three agents share
(the name from RELAY_AGENT, or before each command)."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import anyio
import pytest

import relay
from relay.agent import adopt

BARE_PATH = "/usr/bin:/bin"


def code_blocks(text):
    """The indented blocks of the relay block of `text`, each a list of lines (indent removed)."""
    body = text[text.index("<!-- relay:begin"):text.index("<!-- relay:end")]
    found, current = [], []
    for line in body.splitlines():
        if line.startswith("    "):
            current.append(line[4:])
        elif current:
            found.append(current)
            current = []
    return found


def shell(line, cwd, env):
    done = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{line}\n{done.stdout}{done.stderr}"
    return done.stdout


def until(check, what, seconds=30):
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.02)


@pytest.fixture
def daemon(cli):
    cli("init", "--agent", "alice", "--agent", "bob", "--agent", "carol")
    proc = subprocess.Popen([sys.executable, "-m", "relay", "--root", str(cli.root), "run"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    yield cli
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def new_for(root, agent):
    return sorted(p.name for p in (root / ".relay" / "inbox" / agent / "new").iterdir())


@pytest.mark.timeout_s(120)
@pytest.mark.parametrize("shared", [False, True], ids=["one-agent-file", "three-agent-file"])
def test_every_command_of_the_adopt_text_works_as_written(daemon, shared, tmp_path):
    cli, root = daemon, daemon.root
    assert shutil.which("relay", path=BARE_PATH) is None        # relay is not on this PATH
    for agent in ("bob", "alice", "carol") if shared else ("bob",):
        cli("adopt", agent)
    text = (root / "AGENTS.md").read_text()
    env = {"PATH": BARE_PATH, "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8"}
    if shared:
        env["RELAY_AGENT"] = "bob"          # how whoever started bob told it its name
    with relay.Agent("alice", root=root) as alice:
        mid = alice.send("bob", "please look at the parser", subject="review")
    until(lambda: f"{mid}.json" in new_for(root, "bob"), "the daemon delivers alice's message")
    commands, by_hand, python, mcp = code_blocks(text)
    sub = root / "src" / "deep"                                  # "anywhere in the project"
    sub.mkdir(parents=True)
    for line in commands:
        out = shell(re.sub(r"\bID\b", mid, line), sub, env)
        if " inbox " in line and "--recent" not in line:
            assert "please look at the parser" in out, line
    shell("\n".join(by_hand), root, env)                        # from the project's top directory
    until(lambda: len(new_for(root, "alice")) == 5, "bob's three sends, his ack's note and the file by hand "
                                                     "reach alice")
    with relay.Agent("carol", root=root) as carol:
        carol.send("bob", "the tests are green")
    until(lambda: len(new_for(root, "bob")) == 1, "carol's message reaches bob")
    [py] = re.findall(r"with the interpreter that has relay \((.+?)\)", text)
    done = subprocess.run(["bash", "-c", f"{py} -"], input="\n".join(python), cwd=sub, env=env, text=True,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    until(lambda: len(new_for(root, "carol")) == 1, "the Python block's reply reaches carol")
    assert new_for(root, "bob") == []                            # it marked read what it handled
    with relay.Agent("alice", root=root) as alice:
        got = [(m.sender, m.subject, m.body) for m in alice.inbox()]
    assert ("bob", "tests are green", "the body") in got and ("bob", "hi", "the body\n") in got
    assert ("bob", "Re: review", "the answer") in got and ("bob", "Re: review", "done") in got   # the ack's note
    assert ("bob", None, "merge it?") in got
    with relay.Agent("alice", root=root) as alice:
        [urgent] = [m for m in alice.inbox() if m.body == "merge it?"]
        assert (urgent.priority, urgent.ack_required) == ("urgent", True)
        assert alice.receipts(mid)["recipients"][0]["acked_at"]   # bob's `ack ID`
    if shared:          # without RELAY_AGENT, the name put before each command, as the text says
        [search] = [line for line in commands if " search " in line]
        out = shell(f"RELAY_AGENT=bob {search.split('#')[0]}", sub, {k: v for k, v in env.items()
                                                                    if k != "RELAY_AGENT"})
        assert "tests are green" in out
    # the MCP line: what `claude mcp add` would start, started the same way, answers as bob
    [server] = mcp
    assert server.startswith("claude mcp add relay-")
    started = server.split(" -- ", 1)[1]

    async def ask():
        from mcp import ClientSession
        from mcp.client.stdio import StdioServerParameters, stdio_client
        params = StdioServerParameters(command="bash", args=["-c", started], env=env, cwd=str(tmp_path))
        with open(tmp_path / "mcp.err", "w") as err:
            async with stdio_client(params, errlog=err) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    return (await session.call_tool("agents", {})).structured_content["me"]
    assert anyio.run(ask) == "bob"


def git(line, cwd, env, ok=True):
    done = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert (done.returncode == 0) == ok, f"{line}\n{done.stdout}{done.stderr}"
    return done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_an_agent_following_the_text_commits_its_reserved_files_through_the_guard(cli):
    root = cli.root
    env = {"PATH": BARE_PATH, "HOME": str(root), "LANG": "C.UTF-8", "GIT_CONFIG_NOSYSTEM": "1"}
    git("git init -q -b main && git config user.email a@example.com && git config user.name A", root, env)
    cli("init", "--agent", "alice", "--agent", "bob")
    cli("guard", "install")
    cli("adopt", "bob")
    text = (root / "AGENTS.md").read_text()
    [reserve] = [line for line in code_blocks(text)[0] if " reserve " in line]
    git(reserve, root, env)                                     # src/parser, exclusively, as the text does
    (root / "src" / "parser").mkdir(parents=True)
    (root / "src" / "parser" / "lexer.py").write_text("tokens = []\n")
    git("git add src", root, env)
    # a commit that does not say who commits: the guard takes bob's own lease for another's
    assert "who commits" in git("git commit -qm lexer", root, env, ok=False)
    flat = " ".join(text.split())
    [commit] = re.findall(r"commit as `(RELAY_AGENT=bob git commit) \.\.\.`", flat)
    git(f"{commit} -qm lexer", root, env)                     # as the text says: committed
    # the other way it names, once for a clone only bob commits in
    [config] = re.findall(r"`(git config relay\.agent bob)`", flat)
    (root / "src" / "parser" / "lexer.py").write_text("tokens = [1]\n")
    git(f"{config} && git commit -qam 'lexer, again'", root, env)
    assert git("git rev-list --count HEAD", root, env).strip() == "2"
    # and alice, named, is refused bob's files
    (root / "src" / "parser" / "lexer.py").write_text("tokens = [2]\n")
    out = git("RELAY_AGENT=alice git commit -qam 'not hers'", root, env, ok=False)
    assert "src/parser/lexer.py" in out and "bob" in out

