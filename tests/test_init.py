"""relay init in a git repository (or a subdirectory of one): the state directory kept out of git
by a line in .gitignore, written once, never through a link; outside git no .gitignore."""
import pytest


def test_init_in_a_git_repository_keeps_the_state_directory_out_of_it(cli):
    (cli.root / ".git").mkdir()
    (cli.root / ".gitignore").write_text("*.pyc")           # no newline at its end
    r = cli("init", "--agent", "Ann")
    assert ".gitignore" in r.stdout
    assert (cli.root / ".gitignore").read_text() == "*.pyc\n.relay/\n"
    cli("init")                                             # once only
    assert (cli.root / ".gitignore").read_text() == "*.pyc\n.relay/\n"


@pytest.mark.parametrize("line", [".relay", ".relay/", "/.relay", "/.relay/"])
def test_init_finds_the_state_directory_ignored_already_in_any_of_its_spellings(cli, line):
    (cli.root / ".git").mkdir()
    (cli.root / ".gitignore").write_text(f"*.pyc\n{line}\n")
    cli("init", "--agent", "Ann")
    assert (cli.root / ".gitignore").read_text() == f"*.pyc\n{line}\n"


def test_init_in_a_subdirectory_of_a_git_repository(cli):
    (cli.root.parent / f"{cli.root.name}-repo").mkdir()
    repo = cli.root.parent / f"{cli.root.name}-repo"
    (repo / ".git").mkdir()
    (repo / "sub").mkdir()
    from click.testing import CliRunner
    from relay.cli import main
    r = CliRunner().invoke(main, ["--root", str(repo / "sub"), "init"])
    assert r.exit_code == 0, r.output
    assert (repo / "sub" / ".gitignore").read_text() == ".relay/\n"


def test_init_outside_git_writes_no_gitignore(cli):
    cli("init")
    assert not (cli.root / ".gitignore").exists()


def test_init_leaves_a_gitignore_that_ignores_the_state_directory_already(cli):
    (cli.root / ".git").mkdir()
    (cli.root / ".gitignore").write_text("build/\n/.relay\n")
    cli("init")
    assert (cli.root / ".gitignore").read_text() == "build/\n/.relay\n"


def test_init_does_not_write_through_a_linked_gitignore(cli, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "ignored"
    elsewhere.write_text("x\n")
    (cli.root / ".git").mkdir()
    (cli.root / ".gitignore").symlink_to(elsewhere)
    r = cli("init")
    assert elsewhere.read_text() == "x\n" and ".gitignore" in r.stderr
