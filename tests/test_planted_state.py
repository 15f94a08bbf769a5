"""The files relay keeps at the top of .relay/ (relay.lock, relay.toml, the ledger) lie where
agents can write: a link, a hard link or a FIFO planted there never makes relay write outside
the state directory, hang, or print a traceback."""
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from relay.cli import main


def relay(root, *args, timeout=30):
    return subprocess.run([sys.executable, "-m", "relay", *args], cwd=root, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, RELAY_ROOT=str(root)))


@pytest.fixture
def proj(tmp_path):
    root = tmp_path / "p"
    root.mkdir()
    assert relay(root, "init", "--agent", "A", "--agent", "B").returncode == 0
    return root


@pytest.fixture
def secret(tmp_path):
    s = tmp_path / "secret.txt"
    s.write_text("do not touch")
    return s


@pytest.mark.parametrize("plant", ["symlink", "hardlink", "dangling"])
def test_a_planted_lock_is_never_written_through(proj, secret, plant):
    lock = proj / ".relay/relay.lock"
    lock.unlink(missing_ok=True)
    if plant == "symlink":
        lock.symlink_to(secret)
    elif plant == "hardlink":
        os.link(secret, lock)
    else:
        lock.symlink_to(secret.parent / "created-outside")
    r = relay(proj, "run", "--once")
    assert r.returncode == 1 and "relay.lock" in r.stderr and "Traceback" not in r.stderr
    assert secret.read_text() == "do not touch" and not (secret.parent / "created-outside").exists()


def test_a_fifo_for_a_lock_hangs_nothing(proj):
    lock = proj / ".relay/relay.lock"
    lock.unlink(missing_ok=True)
    os.mkfifo(lock)
    for verb in (["status"], ["doctor"], ["run", "--once"]):
        r = relay(proj, *verb, timeout=20)
        assert "Traceback" not in r.stderr, verb
    assert "relay.lock is not a plain file" in relay(proj, "run", "--once").stderr


@pytest.mark.parametrize("what", ["ledger.sqlite", "ledger.sqlite-wal"])
def test_a_ledger_link_is_refused(proj, tmp_path, what):
    target = tmp_path / "other.sqlite"
    target.write_bytes(b"")
    path = proj / ".relay" / what
    path.unlink(missing_ok=True)
    path.symlink_to(target)
    r = relay(proj, "run", "--once")
    assert r.returncode == 1 and f"{what} is a symbolic link" in r.stderr and "Traceback" not in r.stderr
    assert target.read_bytes() == b"" and not list(tmp_path.glob("other.sqlite-*"))


def test_a_relay_toml_cannot_move_the_state_directory_outside(proj, tmp_path):
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (proj / ".relay/relay.toml").write_text(f'state_dir = "{decoy}"\n')
    r = relay(proj, "run", "--once")
    assert r.returncode == 1 and "must be a relative path inside the project root" in r.stderr
    (proj / ".relay/relay.toml").write_text('state_dir = "../decoy"\n')
    assert relay(proj, "status").returncode == 1
    assert list(decoy.iterdir()) == []


def test_a_relay_toml_link_is_not_read(proj, tmp_path):
    outside = tmp_path / "outside.toml"
    outside.write_text("secret_key_name = 1\n")
    (proj / ".relay/relay.toml").unlink()              # the one relay init wrote
    (proj / ".relay/relay.toml").symlink_to(outside)
    r = relay(proj, "status")
    assert r.returncode == 1 and "relay.toml is a symbolic link" in r.stderr and "secret_key_name" not in r.stderr


def test_a_project_path_with_uri_characters(tmp_path):
    root = tmp_path / "q?x#y%20"
    root.mkdir()
    assert relay(root, "init", "--agent", "A").returncode == 0
    r = relay(root, "status", "--json")
    assert r.returncode == 0, r.stderr          # --json: the verdict (no daemon runs) is in the document
    assert json.loads(r.stdout)["health"]["exit"] == 3
    assert json.loads(r.stdout)["counts"]["archived"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q?x#y%20"]


def test_inbox_over_planted_envelopes_prints_no_traceback_and_takes_only_what_it_showed(proj):
    new = proj / ".relay/inbox/B/new"
    (new / "01AAAAAAAAAAAAAAAAAAAAAAAA.json").write_text("[1, 2]")
    (new / "01AAAAAAAAAAAAAAAAAAAAAAAB.json").write_text(json.dumps({"id": "x", "sent_at": 5, "body": {},
                                                                     "subject": "\x1b[31mred\x1b]0;title\x07"}))
    r = CliRunner().invoke(main, ["--root", str(proj), "inbox", "B", "--ack"])
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.output and "unreadable envelope" in r.output
    assert (new / "01AAAAAAAAAAAAAAAAAAAAAAAA.json").exists()          # not taken: never shown whole


def test_arguments_that_are_not_utf8_are_one_line(proj):
    r = subprocess.run([sys.executable, "-m", "relay", "show", os.fsdecode(b"\xff\xfe")], cwd=proj,
                       capture_output=True, text=True, env=dict(os.environ, RELAY_ROOT=str(proj)))
    assert r.returncode == 1 and "not valid UTF-8" in r.stderr and "Traceback" not in r.stderr
    r = relay(proj, "audit", "--limit", "99999999999999999999999")
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_inspect_verbs_do_not_read_through_links(proj, tmp_path):
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    for i in range(4):
        (decoy / f"f{i}").write_text("x")
    os.rename(proj / ".relay/outbox/A", proj / ".relay/A-aside")
    (proj / ".relay/outbox/A").symlink_to(decoy)
    (proj / ".relay/archive/2026-01-01").symlink_to(decoy)
    r = CliRunner().invoke(main, ["--root", str(proj), "agents", "--json"])
    assert r.exit_code == 0 and all(a["outbox_waiting"] == 0 for a in json.loads(r.output))
    r = CliRunner().invoke(main, ["--root", str(proj), "doctor"])
    assert "f0" not in r.output and "outbox/A: a symbolic link" in r.output


LINKED = "is reached through the symbolic link"


@pytest.fixture
def outside(tmp_path):
    place = tmp_path / "outside"
    place.mkdir()
    return place


def in_process(root, *args, env=None):
    return CliRunner().invoke(main, ["--root", str(root), *args] if root else list(args), env=env)


def one_line(result):
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.mark.parametrize("planted, named", [("st", "st"), ("a", "a/b/st"), ("a/b", "a/b/st")])
def test_a_relay_toml_state_dir_through_a_link_is_refused(proj, outside, planted, named):
    link = proj / planted
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside, target_is_directory=True)
    (proj / ".relay/relay.toml").write_text(f'state_dir = "{named}"\n')
    for verb in (["run", "--once"], ["init", "--agent", "C"], ["status"], ["send", "--from", "A", "--to", "B", "x"],
                 ["inbox", "B"]):
        line = one_line(in_process(proj, *verb))
        assert f"{LINKED} {link}" in line and "relay.toml" in line, (verb, line)
    assert list(outside.iterdir()) == []


def test_a_relay_toml_state_dir_with_control_or_bidi_characters_is_refused(proj):
    (proj / ".relay/relay.toml").write_text('state_dir = "st\\u202eate"\n')
    assert "control or bidi character" in one_line(in_process(proj, "status"))
    assert sorted(os.listdir(proj)) == [".relay"]


@pytest.mark.parametrize("how", ["flag", "env"])
def test_an_operator_state_dir_inside_the_project_through_a_link_is_refused(proj, outside, how):
    (proj / "st").symlink_to(outside, target_is_directory=True)
    for named in ("st", "st/deeper", str(proj / "st")):
        args, env = (["--state-dir", named], None) if how == "flag" else ([], {"RELAY_STATE_DIR": named})
        line = one_line(in_process(proj, *args, "init", "--agent", "C", env=env))
        assert f"{LINKED} {proj / 'st'}" in line and ("--state-dir" if how == "flag" else "RELAY_STATE_DIR") in line
    assert list(outside.iterdir()) == []
    # A place outside the project is the operator's to name, links and all.
    r = in_process(proj, "--state-dir", str(outside), "init", "--agent", "C")
    assert r.exit_code == 0, r.output
    assert (outside / "outbox" / "C").is_dir()


def test_a_planted_default_state_dir_link_is_refused_from_relay_root_and_the_current_directory(tmp_path, outside,
                                                                                               monkeypatch):
    root = tmp_path / "p"
    root.mkdir()
    (root / ".relay").symlink_to(outside, target_is_directory=True)
    (outside / "relay.toml").write_text("retention = '1d'\n")
    line = one_line(in_process(None, "init", "--agent", "A", env={"RELAY_ROOT": str(root)}))
    assert f"{LINKED} {root / '.relay'}" in line and "default" in line
    monkeypatch.chdir(root)
    assert LINKED in one_line(in_process(None, "status"))
    assert sorted(os.listdir(outside)) == ["relay.toml"]


def test_the_state_dir_is_made_without_following_a_link_planted_on_the_way(tmp_path, outside):
    """A link planted after the configuration was read, before the directories are made."""
    from relay import config as config_mod
    from relay.errors import RelayError
    from relay.files.layout import Layout
    root = tmp_path / "p"
    root.mkdir()
    cfg = config_mod.load(root, "a/b/.relay", env={})
    (root / "a").symlink_to(outside, target_is_directory=True)
    with pytest.raises(RelayError, match=LINKED):
        Layout(cfg.root, cfg.state_dir).create()
    assert list(outside.iterdir()) == []


def test_a_state_dir_that_is_the_root_or_inside_the_default_state_dir_is_refused(tmp_path):
    from relay import config as config_mod
    from relay.errors import ConfigError
    (tmp_path / ".relay").mkdir()
    for value in (".", ".relay/outbox/Mal", "./.relay/inbox"):
        (tmp_path / ".relay/relay.toml").write_text(f'state_dir = "{value}"\n')
        with pytest.raises(ConfigError, match="the project root itself, or lies inside the default state directory"):
            config_mod.load(tmp_path, None, env={})
    (tmp_path / ".relay/relay.toml").write_text('state_dir = "state"\n')
    assert config_mod.load(tmp_path, None, env={}).state_dir == tmp_path / "state"
