"""Issue 27, item 9: the smaller things. Every duration flag takes the same forms (a bare number
is seconds, as `--wait 600` always took it) and durations print with their unit; `relay inbox
--wait AGENT` waits for AGENT; Ctrl-C ends a wait with 130 and no "Aborted!"; what --ack printed
is labelled read, and `read` says read/unread; `relay init` in a git repository keeps `.relay/`
out of it; `relay report` has a default file; `identified` only for an id relay would not have
chosen; the daemon's unknown recipient has a "did you mean"."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest


# -- durations --------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["status", "--max-pending-age", "600"], ["audit", "--since", "3600"], ["audit", "--until", "60.5"],
    ["sweep", "--older-than", "3600"], ["report", "--since", "3600", "--html", "-"],
    ["tail", "--follow", "--timeout", "0"], ["run", "--once", "--settle", "1", "--retention", "3600"],
])
def test_every_duration_flag_takes_a_bare_number_of_seconds(team, args):
    r = team(*args, ok=False)
    assert r.exit_code in (0, 3), r.output          # (status: no daemon runs)


def test_a_bare_number_is_seconds_everywhere(team):
    team("send", "--from", "Alice", "--to", "Bob", "hello")
    team("run", "--once")
    assert json.loads(team("audit", "--json", "--since", "3600").stdout)    # within the hour
    assert not json.loads(team("audit", "--json", "--until", "3600").stdout)
    r = team("sweep", "--older-than", "3600", "--dry-run")
    assert "would delete 0 archived" in r.stdout and "older than 1h" in r.stdout


def test_durations_print_with_their_unit(team):
    r = team("sweep", "--dry-run")
    assert "older than 7d " in r.stdout and "604800" not in r.stdout
    r = team("sweep", "--older-than", "90m", "--dry-run")
    assert "older than 1h30m " in r.stdout or "older than 90m " in r.stdout
    r = team("inbox", "Bob", "--wait", "0.01", ok=False)
    assert r.exit_code == 124 and "in 10ms" in r.stderr
    r = team("inbox", "Bob", "--wait", "2ms", ok=False)
    assert r.exit_code == 124 and "in 2ms" in r.stderr


# -- relay inbox --wait -----------------------------------------------------------------------

def test_inbox_wait_followed_by_a_name_waits_for_that_agent(team):
    team("send", "--from", "Alice", "--to", "Bob", "--subject", "s", "for Bob")
    team("run", "--once")
    r = team("inbox", "--wait", "Bob")
    assert "for Bob" in r.stdout
    r = team("inbox", "--wait", "5s", "Bob")
    assert "for Bob" in r.stdout


def test_inbox_wait_without_an_agent_is_a_usage_error(team):
    for args in (["--wait"], ["--wait", "5m"], []):
        r = team("inbox", *args, ok=False)
        # (RELAY_AGENT, unset here, would name it: the error says both ways)
        assert r.exit_code == 2 and "name the agent: AGENT, or set RELAY_AGENT=NAME" in r.output


def test_inbox_help_says_a_bare_wait_waits_for_ever(team):
    text = " ".join(team("inbox", "--help").stdout.split())
    assert "for ever" in text and "--wait" in text


def wait_until_watching(proc, deadline=20.0):
    """The process holds an inotify watch (its wait has begun), by its descriptors' fdinfo."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        assert proc.poll() is None, proc.communicate()
        try:
            for fd in os.listdir(f"/proc/{proc.pid}/fdinfo"):
                with open(f"/proc/{proc.pid}/fdinfo/{fd}") as f:
                    if "inotify wd:" in f.read():
                        return
        except (FileNotFoundError, ProcessLookupError):
            pass
        time.sleep(0.01)
    raise AssertionError("the wait never began")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fdinfo"), reason="needs Linux's /proc fdinfo")
def test_ctrl_c_ends_a_wait_with_130_and_no_aborted(team):
    # SIGINT as a terminal's foreground job has it: a runner started in the background by a
    # shell without job control ignores it, and a child would inherit that (and never see Ctrl-C).
    proc = subprocess.Popen([sys.executable, "-m", "relay", "--root", str(team.root), "inbox", "Bob", "--wait"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_until_watching(proc)
        for _ in range(20):             # Ctrl-C, again if the first came before the wait could see it
            proc.send_signal(signal.SIGINT)
            try:
                out, err = proc.communicate(timeout=1)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            raise AssertionError("relay inbox --wait did not end on Ctrl-C")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, (out, err)
    assert "Aborted" not in out + err and "Traceback" not in err


# -- read and unread ----------------------------------------------------------------------------

def test_ack_labels_what_it_printed_as_read(team):
    team("send", "--from", "Alice", "--to", "Bob", "--subject", "s", "hello")
    team("run", "--once")
    r = team("inbox", "Bob", "--ack")
    assert "(read)" in r.stdout and "(unread)" not in r.stdout
    r = team("inbox", "Bob", "--all")
    assert "(read)" in r.stdout and "cur" not in r.stdout


def test_read_says_read_or_unread(team):
    mid = team("send", "--from", "Alice", "--to", "Bob", "--subject", "s", "hello").stdout.strip()
    team("run", "--once")
    assert "(unread)" in team("read", mid).stdout
    assert "(read)" in team("read", mid, "--agent", "Bob").stdout
    r = team("read", mid)
    assert "(read)" in r.stdout and "cur" not in r.stdout


# -- relay init in a git repository --------------------------------------------------------------

def test_init_in_a_git_repository_keeps_the_state_directory_out_of_it(cli):
    (cli.root / ".git").mkdir()
    (cli.root / ".gitignore").write_text("*.pyc")           # no newline at its end
    r = cli("init", "--agent", "Ann")
    assert ".gitignore" in r.stdout
    assert (cli.root / ".gitignore").read_text() == "*.pyc\n.relay/\n"
    cli("init")                                             # once only
    assert (cli.root / ".gitignore").read_text() == "*.pyc\n.relay/\n"


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


# -- relay report's default file ------------------------------------------------------------------

def test_report_writes_a_default_file_without_html(team):
    r = team("report")
    assert "wrote" in r.stdout
    path = r.stdout.split("wrote", 1)[1].strip()
    assert os.path.isfile(path) and "<html" in open(path).read().lower()


# -- identified -------------------------------------------------------------------------------------

def test_identified_only_for_an_id_relay_would_not_have_chosen(team):
    mid = team("send", "--from", "Alice", "--to", "Bob", "hello").stdout.strip()
    chosen = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
    (team.state / "outbox/Alice/mine").write_text(f"ID: {chosen}\nTO: Bob\n\nmy own id")
    team("run", "--once")
    events = {e["event"] for e in json.loads(team("show", mid, "--json").stdout)["events"]}
    assert "identified" not in events and {"discovered", "delivered", "archived"} <= events
    events = json.loads(team("show", chosen, "--json").stdout)["events"]
    assert [e["event"] for e in events].count("identified") == 1


# -- the daemon's unknown recipient ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["bob", "BOB", "Bobb"])
def test_the_daemons_unknown_recipient_error_has_the_clis_did_you_mean(team, name):
    cli_says = team("send", "--from", "Alice", "--to", name, "hello", ok=False).stderr
    assert "did you mean Bob?" in cli_says
    (team.state / "outbox/Alice/m").write_text(f"TO: {name}\n\nhello")
    team("run", "--once")
    failed = json.loads(team("audit", "--json", "--status", "failed").stdout)[0]
    assert f"unknown recipient {name}; did you mean Bob?" in failed["error"]

