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


def test_init_does_not_write_into_a_gitignore_that_is_a_fifo_and_says_so(cli):
    """A .gitignore that is no plain file (a FIFO, which opening would otherwise block on) is
    left alone; init says relay did not add the state directory to it, and still succeeds."""
    import os
    (cli.root / ".git").mkdir()
    os.mkfifo(cli.root / ".gitignore")
    r = cli("init", "--agent", "Ann")
    assert f"{cli.root / '.gitignore'} is not a plain file; relay did not add .relay/ to it" in r.stderr
    assert (cli.state / "relay.toml").exists()


def test_init_adds_the_state_directory_to_a_gitignore_that_only_mentions_it_in_a_longer_line(cli):
    (cli.root / ".git").mkdir()
    (cli.root / ".gitignore").write_text(".relay/old\n# .relay\n.relayx\n")
    cli("init", "--agent", "Ann")
    assert (cli.root / ".gitignore").read_text() == ".relay/old\n# .relay\n.relayx\n.relay/\n"


def test_init_over_a_file_where_an_agents_box_goes_names_each_and_makes_no_ledger(cli):
    (cli.state / "outbox").mkdir(parents=True)
    (cli.state / "inbox").mkdir()
    (cli.state / "outbox" / "Ann").write_text("x")
    (cli.state / "inbox" / "Ben").write_text("x")
    r = cli("init", "--agent", "Ann", "--agent", "Ben", "--agent", "Cy", ok=False)
    assert r.exit_code == 1 and len(r.output.splitlines()) == 1 and r.output.startswith("relay: ")
    assert "outbox/Ann is a symbolic link or not a directory; relay never follows links under its state directory" \
        in r.output
    assert "inbox/Ben is a symbolic link or not a directory" in r.output and "Cy" not in r.output
    assert r.output.count("inbox/Ben") == 1 and "Errno" not in r.output     # said once, in words
    assert not (cli.state / "ledger.sqlite").exists()
    assert (cli.state / "outbox" / "Ann").read_text() == "x" and (cli.state / "inbox" / "Ben").read_text() == "x"
