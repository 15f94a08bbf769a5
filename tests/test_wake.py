"""The [wake] of relay.toml (relay/core/wake.py): one notice line typed into each agent's tmux pane
per batch, off the delivery path on the on_deliver runner's workers, a missing tmux or pane said
once; its configuration."""
import logging
import shutil
import subprocess

import pytest

from relay import config as config_mod
from relay.errors import ConfigError
from relay.core.wake import WAKE_TIMEOUT, Wake, notice

needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")


class Runner:
    """A seam for the runner: records each line it is asked to run and runs none."""

    def __init__(self):
        self.fired = []

    def fire(self, delivery, command=None, timeout=None, report=None):
        self.fired.append((delivery.recipient, command, timeout))
        return True


def msg(to, body="hi"):
    return f"TO: {to}\nSUBJECT: s\n\n{body}"


@pytest.fixture
def project(project):
    yield project
    for relay in project.relays:
        relay.hooks.stop(0)


def test_one_line_per_agent_and_batch_however_many_messages(project):
    relay = project.relay()
    runner = Runner()
    config = project.config(wake={"tmux": "agents:{agent}", "socket": "/run/t.sock"})
    relay.wakes = Wake(config, runner, which=lambda name: "/usr/bin/tmux")
    for i in range(3):
        project.drop("Ann", f"m{i}", msg("Ben"))
    project.drop("Ann", "c", msg("Cy, Ben"))
    assert relay.step().archived == 4
    assert sorted(r for r, _, _ in runner.fired) == ["Ben", "Cy"]
    ben = next(c for r, c, _ in runner.fired if r == "Ben")
    newest = max(p["id"] for p in project.inbox("Ben"))
    assert ben == ("/usr/bin/tmux", "-S", "/run/t.sock", "send-keys", "-t", "agents:Ben", "-l",
                   notice("Ben", 4, newest, "Ann"), ";", "send-keys", "-t", "agents:Ben", "Enter")
    assert all(t == WAKE_TIMEOUT for _, _, t in runner.fired)
    project.drop("Cy", "n", msg("Ben"))
    relay.hint("file", "Cy", "n")
    assert relay.step().archived == 1
    assert [r for r, _, _ in runner.fired[2:]] == ["Ben"]          # the next batch: its own line


def test_no_tmux_is_said_once_and_nothing_is_queued(project, caplog):
    runner = Runner()
    relay = project.relay()
    with caplog.at_level(logging.WARNING, logger="relay.core.wake"):
        relay.wakes = Wake(project.config(wake={"tmux": "agents:{agent}"}), runner, which=lambda name: None)
        for i in range(3):
            project.drop("Ann", f"m{i}", msg("Ben"))
            relay.hint("file", "Ann", f"m{i}")
            assert relay.step().archived == 1
    assert runner.fired == []
    assert len([r for r in caplog.records if "tmux is not installed" in r.getMessage()]) == 1


def tmux(sock, *args, **kw):
    return subprocess.run(["tmux", "-S", str(sock), "-f", "/dev/null", *args], **kw)


@needs_tmux
def test_the_line_is_typed_into_the_agent_s_pane_by_a_real_tmux(project):
    sock, typed = project.root / "tmux.sock", project.root / "typed"
    pane = f"read line; printf '%s\\n' \"$line\" > {typed}; tmux -S {sock} wait-for -S typed; sleep 600"
    tmux(sock, "new-session", "-d", "-s", "agents", "-n", "Ben", "-x", "250", "-y", "10", pane, check=True)
    try:
        relay = project.relay(wake={"tmux": "agents:{agent}", "socket": str(sock)})
        project.drop("Ann", "a", msg("Ben"))
        project.drop("Cy", "b", msg("Ben"))
        assert relay.step().archived == 2 and relay.hooks.join(30)
        tmux(sock, "wait-for", "typed", check=True, timeout=30)
        newest = max(p["id"] for p in project.inbox("Ben"))
        sender = next(p["from"] for p in project.inbox("Ben") if p["id"] == newest)
        assert typed.read_text() == notice("Ben", 2, newest, sender) + "\n"
        assert relay.wakes.woken == 1 and relay.hooks.ran == 0      # the wake is not an on_deliver hook
    finally:
        tmux(sock, "kill-server", capture_output=True)


@needs_tmux
def test_a_missing_pane_is_logged_once_and_delivery_goes_on(project, caplog):
    sock = project.root / "tmux.sock"
    tmux(sock, "new-session", "-d", "-s", "other", "sleep 600", check=True)
    try:
        relay = project.relay(wake={"tmux": "agents:{agent}", "socket": str(sock)})
        with caplog.at_level(logging.WARNING, logger="relay.core.wake"):
            for i in range(3):
                project.drop("Ann", f"m{i}", msg("Ben"))
                relay.hint("file", "Ann", f"m{i}")
                assert relay.step().archived == 1 and relay.hooks.join(30)
        assert relay.wakes.failed == 3 and len(project.inbox("Ben")) == 3
        lines = [r.getMessage() for r in caplog.records if r.name == "relay.core.wake"]
        assert len(lines) == 1 and "agents:Ben" in lines[0]
    finally:
        tmux(sock, "kill-server", capture_output=True)


def test_wake_from_toml_and_env(tmp_path):
    state = tmp_path / ".relay"
    state.mkdir()
    (state / "relay.toml").write_text('[wake]\ntmux = "agents:{agent}"\nsocket = "/tmp/s"\n')
    cfg = config_mod.load(tmp_path, None, env={})
    assert (cfg.wake.tmux, cfg.wake.socket) == ("agents:{agent}", "/tmp/s")
    assert config_mod.load(tmp_path, None, env={"RELAY_WAKE": "w:{agent}"}).wake.tmux == "w:{agent}"
    assert dict((k, v) for k, v, _, _ in config_mod.describe(cfg))["wake"] == {"tmux": "agents:{agent}",
                                                                               "socket": "/tmp/s"}


@pytest.mark.parametrize("toml, match", [('[wake]\npane = "x"\n', "unknown key 'pane' in \\[wake\\]"),
                                         ('wake = 3\n', "not a table"),
                                         ('[wake]\ntmux = "a\\u001bb"\n', "not plain text")])
def test_a_bad_wake_is_refused_naming_it(tmp_path, toml, match):
    state = tmp_path / ".relay"
    state.mkdir()
    (state / "relay.toml").write_text(toml)
    with pytest.raises(ConfigError, match=match):
        config_mod.load(tmp_path, None, env={})


def test_system_is_never_woken_and_a_batch_only_for_it_wakes_no_one(project):
    relay = project.relay()
    runner = Runner()
    config = project.config(wake={"tmux": "agents:{agent}"})
    relay.wakes = Wake(config, runner, which=lambda name: "/usr/bin/tmux")
    project.drop("Ann", "spawn", "NAME: Dana\n\nstart")
    assert relay.step().archived == 1
    assert runner.fired == []
    project.drop("Ann", "spawn-eve", "KIND: spawn\nNAME: Eve\n\nstart")
    project.drop("Cy", "m", msg("Ben"))
    relay.hint("rescan")
    assert relay.step().archived == 2
    assert [(r, c[c.index("-l") + 1]) for r, c, _ in runner.fired] == [
        ("Ben", notice("Ben", 1, project.inbox("Ben")[0]["id"], "Cy"))]


def test_a_failing_target_is_warned_of_once_with_why_and_again_after_it_worked(project, caplog):
    from types import SimpleNamespace
    wake = Wake(project.config(wake={"tmux": "agents:{agent}"}), Runner(), which=lambda name: "/usr/bin/tmux")

    def run(agent, code):
        return SimpleNamespace(delivery=SimpleNamespace(recipient=agent), proc=SimpleNamespace(returncode=code))

    def warned():
        return [r.getMessage() for r in caplog.records if r.name == "relay.core.wake" and r.levelname == "WARNING"]

    with caplog.at_level(logging.INFO, logger="relay.core.wake"):
        wake.report(run("Ben", 1), bytearray(b"can't find pane: Ben\n"), True, 5.0, 0.1)
        wake.report(run("Ben", 1), bytearray(b"can't find pane: Ben\n"), True, 5.0, 0.1)
        wake.report(run("Cy", None), bytearray(), False, 5.0, 5.0)
        assert warned() == [
            "[wake]: could not type into tmux target agents:Ben for Ben (tmux exited with status 1): can't find pane: "
            "Ben; logged once until it works",
            "[wake]: could not type into tmux target agents:Cy for Cy (took longer than 5s): (none); logged once "
            "until it works"]
        assert (wake.failed, wake.woken) == (3, 0)
        wake.report(run("Ben", 0), bytearray(), True, 5.0, 0.1)
        assert (wake.failed, wake.woken) == (3, 1) and "agents:Ben" not in wake.failing and "agents:Cy" in wake.failing
        assert "[wake]: tmux target agents:Ben is woken again" in caplog.text
        wake.report(run("Ben", 0), bytearray(), True, 5.0, 0.1)
        assert caplog.text.count("is woken again") == 1
        wake.report(run("Ben", 2), bytearray(b"no server"), True, 5.0, 0.1)
        assert len(warned()) == 3 and warned()[-1].startswith(
            "[wake]: could not type into tmux target agents:Ben for Ben (tmux exited with status 2): no server")


@pytest.mark.parametrize("toml, match", [('[wake]\ntmux = 5\n', r"\[wake\] tmux = 5 is not plain text"),
                                         ('[wake]\nsocket = "/tmp/s\\u0007"\n', r"\[wake\] socket = '/tmp/s\\x07' is"),
                                         ('[wake]\ntmux = ["a"]\n', r"\[wake\] tmux = \['a'\] is not plain text")])
def test_a_wake_value_that_is_no_plain_text_is_refused_naming_its_key(tmp_path, toml, match):
    state = tmp_path / ".relay"
    state.mkdir()
    (state / "relay.toml").write_text(toml)
    with pytest.raises(ConfigError, match=match):
        config_mod.load(tmp_path, None, env={})


def test_an_empty_wake_target_or_socket_is_none(tmp_path):
    state = tmp_path / ".relay"
    state.mkdir()
    (state / "relay.toml").write_text('[wake]\ntmux = ""\nsocket = ""\n')
    wake = config_mod.load(tmp_path, None, env={}).wake
    assert (wake.tmux, wake.socket) == (None, None)


def test_a_wake_with_a_socket_but_no_target_types_nothing(project):
    relay = project.relay()
    runner = Runner()
    looked = []
    relay.wakes = Wake(project.config(wake={"socket": "/run/t.sock"}), runner,
                       which=lambda name: looked.append(name) or "/usr/bin/tmux")
    project.drop("Ann", "m", msg("Ben"))
    assert relay.step().archived == 1
    assert runner.fired == [] and looked == [] and relay.wakes.tmux is None
