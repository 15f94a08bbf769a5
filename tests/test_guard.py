"""`relay guard install`: a git pre-commit hook that refuses a commit touching another agent's
exclusive reservation, naming its holder. Tested with a real repository and real `git commit`s
(the hook runs this installation's relay as a subprocess of git)."""
import os
import shlex
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(where, *args, agent=None, guard=None, check=True):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "RELAY_"))}
    env.update(GIT_CONFIG_NOSYSTEM="1", HOME=str(where))
    if agent is not None:
        env["RELAY_AGENT"] = agent
    if guard is not None:
        env["RELAY_GUARD"] = guard
    done = subprocess.run(["git", *args], cwd=where, env=env, capture_output=True, text=True, timeout=60)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def make_repo(where):
    git(where, "init", "-q", "-b", "main")
    git(where, "config", "user.email", "agents@example.com")
    git(where, "config", "user.name", "Agents")


def stage(where, *files):
    for f in files:
        p = where / f
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"{f}\n")
    git(where, "add", "--", *files)


def commits(where):
    done = git(where, "rev-list", "--count", "HEAD", check=False)
    return int(done.stdout) if done.returncode == 0 else 0


@pytest.fixture
def repo(team):
    make_repo(team.root)
    team("reserve", "--agent", "Alice", "src", "--exclusive", "--reason", "parser refactor")
    return team


def test_a_commit_touching_another_agents_exclusive_reservation_is_refused(repo):
    root = repo.root
    out = repo("guard", "install").output
    hook = root / ".git" / "hooks" / "pre-commit"
    assert str(hook) in out and os.access(hook, os.X_OK)
    stage(root, "src/app.py", "README.md")
    refused = git(root, "commit", "-qm", "work", agent="Bob", check=False)
    assert refused.returncode != 0 and commits(root) == 0
    assert "src/app.py" in refused.stderr and "Alice" in refused.stderr and "parser refactor" in refused.stderr
    assert "RELAY_GUARD=off" in refused.stderr
    git(root, "commit", "-qm", "the holder's own", agent="Alice")
    assert commits(root) == 1


def test_what_is_not_reserved_exclusively_by_another_commits(repo):
    root = repo.root
    repo("reserve", "--agent", "Carol", "docs")            # shared: advisory, never blocks a commit
    repo("guard", "install")
    stage(root, "docs/guide.md", "tests/test_x.py")
    git(root, "commit", "-qm", "docs", agent="Bob")
    repo("release", "--agent", "Alice", "src")
    stage(root, "src/app.py")
    git(root, "commit", "-qm", "released", agent="Bob")
    assert commits(root) == 2


def test_the_agent_from_git_config_and_the_override(repo):
    root = repo.root
    repo("guard", "install")
    stage(root, "src/app.py")
    git(root, "config", "relay.agent", "Bob")
    assert git(root, "commit", "-qm", "x", check=False).returncode != 0
    passed = git(root, "commit", "-qm", "x", guard="off")           # a person overrides it
    assert "RELAY_GUARD=off" in passed.stderr
    stage(root, "src/again.py")
    passed = git(root, "commit", "-qm", "x2", guard=" OFF ")        # in any case, spaces around it
    assert "RELAY_GUARD=off" in passed.stderr
    stage(root, "src/more.py")
    git(root, "config", "relay.agent", "Alice")
    git(root, "commit", "-qm", "y")
    assert commits(root) == 3


def test_an_unknown_committer_is_refused_and_told_how_to_say_who_it_is(repo):
    root = repo.root
    repo("guard", "install")
    stage(root, "src/app.py")
    refused = git(root, "commit", "-qm", "x", check=False)
    assert refused.returncode != 0 and "RELAY_AGENT" in refused.stderr and "Alice" in refused.stderr


def test_a_foreign_hook_is_never_overwritten_without_saying_so(repo):
    root = repo.root
    hook = root / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\necho ran >> \"$(git rev-parse --git-dir)/../foreign-ran\"\n")
    hook.chmod(0o755)
    before = hook.read_text()
    refused = repo("guard", "install", ok=False)
    assert refused.exit_code == 1 and "pre-commit" in refused.output and "--chain" in refused.output
    assert hook.read_text() == before
    out = repo("guard", "install", "--chain").output
    assert out.startswith(f"installed {hook}:")                 # relay's hook is new there: not "updated"
    assert f"the hook that was there is kept as {hook.parent / 'pre-commit.before-relay'} and runs first" in out
    assert (hook.parent / "pre-commit.before-relay").read_text() == before
    stage(root, "README.md")
    git(root, "commit", "-qm", "x", agent="Bob")
    assert (root / "foreign-ran").read_text() == "ran\n"        # the kept hook runs first
    stage(root, "src/app.py")
    assert git(root, "commit", "-qm", "y", agent="Bob", check=False).returncode != 0
    assert "updated" in repo("guard", "install").output         # ours again: updated in place
    repo("guard", "uninstall")
    assert hook.read_text() == before and not (hook.parent / "pre-commit.before-relay").exists()


def test_the_hook_is_never_written_through_a_link(repo, tmp_path_factory):
    root = repo.root
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    target = elsewhere / "target"
    target.write_text("theirs\n")
    hook = root / ".git" / "hooks" / "pre-commit"
    hook.symlink_to(target)
    refused = repo("guard", "install", ok=False)
    assert refused.exit_code == 1 and "link" in refused.output
    refused = repo("guard", "install", "--chain", ok=False)
    assert refused.exit_code == 1 and "link" in refused.output
    assert target.read_text() == "theirs\n" and hook.is_symlink()
    hook.unlink()
    hooks = root / ".git" / "hooks"
    shutil.rmtree(hooks)
    hooks.symlink_to(elsewhere, target_is_directory=True)
    refused = repo("guard", "install", ok=False)
    assert refused.exit_code == 1 and "link" in refused.output
    assert sorted(p.name for p in elsewhere.iterdir()) == ["target"]


def test_core_hooks_path_is_honoured(repo):
    root = repo.root
    git(root, "config", "core.hooksPath", "githooks")
    out = repo("guard", "install").output
    assert (root / "githooks" / "pre-commit").is_file() and "githooks" in out
    stage(root, "src/app.py")
    assert git(root, "commit", "-qm", "x", agent="Bob", check=False).returncode != 0


def test_a_project_in_a_sub_directory_of_the_repository(tmp_path):
    """The sub-directory's name has a space and a quote: the hook names it quoted for the shell."""
    from click.testing import CliRunner

    from relay.cli import main
    make_repo(tmp_path)
    project = tmp_path / "my app's"
    project.mkdir()

    def relay_(*args):
        result = CliRunner().invoke(main, ["--root", str(project), *args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    relay_("init", "--agent", "Alice", "--agent", "Bob")
    relay_("reserve", "--agent", "Alice", "src", "--exclusive")
    relay_("guard", "install")
    stage(tmp_path, "src/outside.py")                       # the repository's, not the project's
    git(tmp_path, "commit", "-qm", "x", agent="Bob")
    stage(tmp_path, "my app's/src/inside.py")
    refused = git(tmp_path, "commit", "-qm", "y", agent="Bob", check=False)
    assert refused.returncode != 0 and "src/inside.py" in refused.stderr


def test_guard_check_on_named_paths(repo, monkeypatch):
    monkeypatch.chdir(repo.root)
    assert repo("guard", "check", "--agent", "Alice", "src/a.py").exit_code == 0
    refused = repo("guard", "check", "--agent", "Bob", "src/a.py", "docs/b.md", ok=False)
    assert refused.exit_code == 1 and "Alice" in refused.output and "docs/b.md" not in refused.output
    assert repo("guard", "check", "--agent", "Bob", "docs/b.md").exit_code == 0


def test_guard_check_json(repo, monkeypatch):
    import json
    monkeypatch.chdir(repo.root)
    doc = json.loads(repo("guard", "check", "--agent", "Bob", "src/a.py", "--json").output)
    assert doc["ok"] is False and doc["paths"] == ["src/a.py"]
    assert [(c["path"], c["held"], c["agent"]) for c in doc["conflicts"]] == [("src/a.py", "src", "Alice")]


def test_a_hooks_path_outside_the_repository_is_refused_unless_the_operator_names_it(repo, tmp_path_factory):
    """core.hooksPath lies in .git/config, which an agent can write: pointed outside the project
    (/tmp/elsewhere), `relay guard install` wrote a hook there. Refused, in one line naming where
    it points; `--hooks-path` naming that directory is the operator saying they mean it."""
    root = repo.root
    elsewhere = tmp_path_factory.mktemp("tmp") / "else where"
    git(root, "config", "core.hooksPath", str(elsewhere))
    for verb in (["install"], ["install", "--chain"], ["uninstall"]):
        refused = repo("guard", *verb, ok=False)
        assert refused.exit_code == 1 and len(refused.output.splitlines()) == 1, refused.output
        assert str(elsewhere) in refused.output and f"--hooks-path '{elsewhere}'" in refused.output
        assert not elsewhere.exists()
    other = tmp_path_factory.mktemp("other")
    refused = repo("guard", "install", "--hooks-path", str(other), ok=False)
    assert refused.exit_code == 1 and str(elsewhere) in refused.output and list(other.iterdir()) == []
    out = repo("guard", "install", "--hooks-path", str(elsewhere)).output
    assert str(elsewhere / "pre-commit") in out and os.access(elsewhere / "pre-commit", os.X_OK)
    stage(root, "src/app.py")
    assert git(root, "commit", "-qm", "x", agent="Bob", check=False).returncode != 0
    repo("guard", "uninstall", "--hooks-path", str(elsewhere))
    assert not (elsewhere / "pre-commit").exists()
    git(root, "config", "core.hooksPath", "../escape")             # relative, and out of the tree
    refused = repo("guard", "install", ok=False)
    assert refused.exit_code == 1 and str(root.parent / "escape") in refused.output
    assert not (root.parent / "escape").exists()


@pytest.mark.parametrize("char, refused", [("\ud7ff", False), ("\ud800", True), ("\udfff", True), ("\ue000", False)])
def test_a_hook_refuses_only_a_project_path_holding_bytes_that_are_not_utf8(tmp_path, char, refused):
    """A path's undecodable bytes come as lone surrogates (U+D800 to U+DFFF): the hook cannot
    name it and says so; the characters just outside that range are text like any other."""
    from relay.agent.guard import script
    from relay.errors import RelayError
    root = tmp_path / f"a{char}b"
    if refused:
        with pytest.raises(RelayError, match="holds a control character or bytes that are not UTF-8"):
            script(root, root / ".relay")
    else:
        assert f"--root {shlex.quote(str(root))} " in script(root, root / ".relay")


def test_uninstall_with_no_hook_says_so_and_refuses_a_hook_relay_did_not_write(repo):
    from conftest import error_line
    root = repo.root
    hook = root / ".git" / "hooks" / "pre-commit"
    assert repo("guard", "uninstall").output.strip() == f"no hook at {hook}; nothing to do"
    hook.write_text("#!/bin/sh\nexit 0\n")
    refused = repo("guard", "uninstall", ok=False)
    assert refused.exit_code == 1 and error_line(refused) == f"{hook} is not relay's hook; it was left as it is"
    assert hook.read_text() == "#!/bin/sh\nexit 0\n"


def test_uninstall_of_relays_hook_alone_removes_it_and_says_which(repo):
    hook = repo.root / ".git" / "hooks" / "pre-commit"
    out = repo("guard", "install").output
    assert out.splitlines()[0].startswith(f"installed {hook}: a commit touching another agent's exclusive")
    assert "runs first" not in out
    assert repo("guard", "uninstall").output.strip() == f"removed {hook}"
    assert not hook.exists() and not (hook.parent / "pre-commit.before-relay").exists()


def test_a_chain_is_refused_when_a_chained_hook_is_there_already_and_a_kept_one_is_said_on_update(repo):
    from conftest import error_line
    hooks = repo.root / ".git" / "hooks"
    (hooks / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    (hooks / "pre-commit.before-relay").write_text("#!/bin/sh\nexit 0\n# older\n")
    refused = repo("guard", "install", "--chain", ok=False)
    assert refused.exit_code == 1
    assert error_line(refused) == (f"{hooks / 'pre-commit.before-relay'} is there already; nothing was changed: "
                                   "merge the two hooks by hand, or remove pre-commit.before-relay")
    assert (hooks / "pre-commit").read_text() == "#!/bin/sh\nexit 0\n"
    (hooks / "pre-commit").unlink()
    out = repo("guard", "install").output.splitlines()       # relay's hook, with the chained one kept
    assert out[0].startswith(f"installed {hooks / 'pre-commit'}") and out[1] == f"{hooks / 'pre-commit.before-relay'} runs first"
    out = repo("guard", "install").output.splitlines()
    assert out[0].startswith(f"updated {hooks / 'pre-commit'}") and out[1] == f"{hooks / 'pre-commit.before-relay'} runs first"
    assert repo("guard", "uninstall").output.strip() == (f"removed relay's hook; {hooks / 'pre-commit'} is the one it "
                                                         "ran first again")
    assert (hooks / "pre-commit").read_text() == "#!/bin/sh\nexit 0\n# older\n"


def test_a_hook_that_is_a_directory_is_refused_and_left_as_it_is(repo):
    from conftest import error_line
    hook = repo.root / ".git" / "hooks" / "pre-commit"
    hook.mkdir()
    for verb in ("install", "uninstall"):
        refused = repo("guard", verb, ok=False)
        assert refused.exit_code == 1
        assert error_line(refused) == f"{hook} is not a regular file; remove it, then install again"
    assert hook.is_dir()


def test_guard_outside_a_git_repository_says_so(team):
    from conftest import error_line
    refused = team("guard", "install", ok=False)
    assert refused.exit_code == 1
    said = error_line(refused)
    assert said.startswith(f"{team.root} is not in a git repository (git rev-parse --show-toplevel: ")
    assert said.endswith("); the guard is a git hook")


def test_a_guard_check_in_a_project_with_no_ledger_finds_no_conflict(tmp_path):
    from relay.agent import guard as guard_mod
    assert guard_mod.conflicts(tmp_path / "ledger.sqlite", "Bob", ["src/app.py"], 0) == []
    assert not (tmp_path / "ledger.sqlite").exists()


def test_inside_keeps_the_paths_below_the_root_relative_to_it(tmp_path):
    from relay.agent import guard as guard_mod
    root = tmp_path / "p"
    (root / "src").mkdir(parents=True)
    (tmp_path / "link").symlink_to(root, target_is_directory=True)
    paths = [str(root / "src/a.py"), str(tmp_path / "p2/x"), str(tmp_path / "x"), str(root), str(root / "..pkg/y"),
             str(tmp_path / "link" / "src/b.py")]
    assert guard_mod.inside(root, paths) == ["src/a.py", ".", "..pkg/y"]
    assert guard_mod.inside(tmp_path / "link", paths) == ["src/a.py", ".", "..pkg/y", "src/b.py"]


def test_inside_leaves_out_the_directory_just_above_the_root(tmp_path):
    from relay.agent import guard as guard_mod
    root = tmp_path / "p"
    root.mkdir()
    assert guard_mod.inside(root, [str(tmp_path), str(tmp_path / "p")]) == ["."]


def test_the_committer_is_relay_agent_then_git_config_and_an_empty_one_is_nobody(tmp_path):
    from relay.agent import guard as guard_mod
    make_repo(tmp_path)
    assert guard_mod.committer(tmp_path, {}) is None                 # no relay.agent at all
    git(tmp_path, "config", "relay.agent", "")
    assert guard_mod.committer(tmp_path, {"RELAY_AGENT": ""}) is None   # set, but to nothing
    git(tmp_path, "config", "relay.agent", "Bob")
    assert guard_mod.committer(tmp_path, {"RELAY_AGENT": ""}) == "Bob"
    assert guard_mod.committer(tmp_path, {"RELAY_AGENT": "Carol"}) == "Carol"


@pytest.mark.parametrize("char", ["\n", "\x1b", "\x7f"])
def test_a_hook_refuses_a_project_path_or_state_dir_holding_a_control_character(tmp_path, char):
    from relay.agent.guard import script
    from relay.errors import RelayError
    bad = tmp_path / f"a{char}b"
    with pytest.raises(RelayError, match="holds a control character or bytes that are not UTF-8"):
        script(bad, bad / ".relay")
    with pytest.raises(RelayError, match="holds a control character"):
        script(tmp_path, bad)                   # the state directory alone


def test_core_hooks_path_naming_the_git_directory_itself_is_inside_the_repository(repo):
    root = repo.root
    git(root, "config", "core.hooksPath", ".git")
    out = repo("guard", "install").output
    assert (root / ".git" / "pre-commit").is_file() and f"installed {root / '.git' / 'pre-commit'}" in out
    stage(root, "src/app.py")
    assert git(root, "commit", "-qm", "x", agent="Bob", check=False).returncode != 0


@pytest.mark.parametrize("value, off", [("off", True), ("OFF", True), (" Off ", True), ("0", True), ("false", True),
                                        ("No", True), ("on", False), ("yes", False), ("", False), ("offf", False)])
def test_guard_check_is_off_for_each_word_of_relay_guard_saying_so_in_any_case_and_only_those(repo, monkeypatch,
                                                                                              value, off):
    import json
    monkeypatch.chdir(repo.root)
    monkeypatch.setenv("RELAY_GUARD", value)
    r = repo("guard", "check", "--agent", "Bob", "src/a.py", ok=False)
    if off:
        assert r.exit_code == 0 and r.stdout == "" and r.stderr == (
            "relay guard: RELAY_GUARD=off: this commit is not checked against file reservations\n")
    else:
        assert r.exit_code == 1 and "relay guard: refused" in r.stderr
    doc = json.loads(repo("guard", "check", "--agent", "Bob", "src/a.py", "--json").stdout)
    assert (doc["ok"], doc["off"]) == (off, off) and [c["agent"] for c in doc["conflicts"]] == ["Alice"]


def test_guard_checks_refusal_names_each_path_its_holder_the_pattern_and_the_reason_and_who_to_ask(repo, monkeypatch):
    import re
    monkeypatch.chdir(repo.root)
    monkeypatch.delenv("RELAY_GUARD", raising=False)
    repo("reserve", "--agent", "Carol", "docs/b.md", "--exclusive")
    r = repo("guard", "check", "--agent", "Bob", "src/a.py", "docs/b.md", "notes.txt", ok=False)
    assert r.exit_code == 1 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert lines[0] == "relay guard: refused: another agent holds these files by an exclusive reservation:"
    until = r"until \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(in \S+"
    assert re.fullmatch(r"  src/a\.py: Alice \(as src\) " + until + r"; reason: parser refactor\)", lines[1])
    assert re.fullmatch(r"  docs/b\.md: Carol " + until + r"\)", lines[2])     # held as named, no reason
    assert lines[3] == ("relay guard: ask Alice, Carol (relay send --from Bob --to Alice), wait for the lease to end, "
                        "or commit with RELAY_GUARD=off to override") and len(lines) == 4


def test_guard_check_with_a_ledger_it_cannot_read_says_so_and_lets_the_commit_through(repo, monkeypatch):
    import json
    monkeypatch.chdir(repo.root)
    monkeypatch.delenv("RELAY_GUARD", raising=False)
    ledger = repo.state / "ledger.sqlite"
    for extra in ("-wal", "-shm"):
        (repo.state / f"ledger.sqlite{extra}").unlink(missing_ok=True)
    ledger.write_bytes(b"not a database at all" * 100)
    r = repo("guard", "check", "--agent", "Bob", "src/a.py")
    assert r.exit_code == 0 and r.stdout == ""
    assert r.stderr.startswith("relay guard: the reservations cannot be read (") and \
        r.stderr.endswith("); not checked\n")
    doc = json.loads(repo("guard", "check", "--agent", "Bob", "src/a.py", "--json").stdout)
    assert doc["ok"] is True and doc["conflicts"] == []
