"""Configuration: durations and sizes, relay.toml, the environment and flags, where each value came
from (`relay config`), and how a verb finds its project (discovery), some of it on a file system laid
out by hand with pyfakefs, where the machine's own would get in the way. Every duration flag takes the
same forms (a bare number is seconds) and durations print with their unit; a misspelt key in
relay.toml or an unknown RELAY_ variable is a warning to the verbs that only look (and an agent's),
and stops the daemon and the sweep with its "did you mean"."""
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import error_line
from pyfakefs.fake_filesystem import set_uid

import relay
from relay import config as config_mod
from relay.cli import main
from relay.errors import ConfigError


def test_durations_and_sizes():
    assert config_mod.parse_duration("90s") == 90
    assert config_mod.parse_duration("15m") == 900
    assert config_mod.parse_duration("12h") == 43200
    assert config_mod.parse_duration("7d") == 604800
    assert config_mod.parse_duration("250ms") == 0.25
    assert config_mod.parse_size("1MiB") == 1048576
    with pytest.raises(ValueError):
        config_mod.parse_duration("soon")


@pytest.mark.parametrize("value, size", [("1", 1), ("1B", 1), (1, 1), ("2KiB", 2048), ("1k", 1000)])
def test_the_smallest_size_is_one_byte(value, size):
    assert config_mod.parse_size(value) == size


@pytest.mark.parametrize("value", ["0", "0KiB", 0, -1, "1.5MiB", "1 parsec"])
def test_a_size_that_is_no_positive_whole_number_of_bytes_is_refused(value):
    with pytest.raises(ValueError):
        config_mod.parse_size(value)


@pytest.mark.parametrize("value, seconds", [(0, 0), (0.0, 0), ("0", 0), ("250ms", 0.25)])
def test_a_duration_from_zero_up_is_taken(value, seconds):
    assert config_mod.parse_duration(value) == seconds


@pytest.mark.parametrize("value, why", [(-0.5, "is negative"), (-1, "is negative"), (0.5, "has no unit"),
                                        ("3", "has no unit"), ("soon", "not a duration")])
def test_a_negative_duration_or_a_bare_number_is_refused(value, why):
    with pytest.raises(ValueError, match=why):
        config_mod.parse_duration(value)


@pytest.mark.parametrize("word, on", [(" Yes ", True), ("ON", True), ("1", True), (" No", False), ("FALSE", False)])
def test_a_switch_from_the_environment_is_read_in_any_case_and_trimmed(tmp_path, word, on):
    cfg = config_mod.load(tmp_path, env={"RELAY_BOUNCES": word})
    assert cfg.bounces is on


def test_an_on_deliver_of_blanks_is_none(tmp_path):
    assert config_mod.load(tmp_path, env={}, overrides={"on_deliver": "  "}).on_deliver is None
    assert config_mod.load(tmp_path, env={}, overrides={"on_deliver": " true "}).on_deliver == " true "


def test_defaults(tmp_path):
    cfg = config_mod.load(tmp_path, env={})
    assert cfg.state_dir == tmp_path / ".relay"
    assert (cfg.retention, cfg.max_retries, cfg.settle, cfg.durability) == (7 * 86400, 3, 0.25, "full")
    assert cfg.max_body_bytes == 1024 * 1024 and cfg.rescan_interval == 30 and cfg.sweep_interval == 3600


def test_toml_then_env_then_flags(tmp_path):
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay/relay.toml").write_text('retention = "1d"\nmax_retries = 5\nagents = ["Ann"]\n')
    cfg = config_mod.load(tmp_path, env={"RELAY_MAX_RETRIES": "7"}, overrides={"retention": "2h"})
    assert cfg.retention == 7200 and cfg.max_retries == 7 and cfg.agents == ("Ann",)
    assert "relay.toml" in cfg.source and "environment" in cfg.source


def test_state_dir_from_env_and_flag(tmp_path):
    assert config_mod.load(tmp_path, env={"RELAY_STATE_DIR": ".agent-relay"}).state_dir == tmp_path / ".agent-relay"
    assert config_mod.load(tmp_path, ".x", env={"RELAY_STATE_DIR": ".y"}).state_dir == tmp_path / ".x"
    assert config_mod.load(env={"RELAY_ROOT": str(tmp_path)}).root == tmp_path


@pytest.mark.parametrize("toml,match", [
    ("retension = '7d'", "unknown configuration key 'retension'"),
    ("retention = 'a week'", "bad value for 'retention'"),
    ("durability = 'max'", "bad value for 'durability'"),
    ("max_retries = -1", "bad value for 'max_retries'"),
    ("agents = ['../x']", "bad value for 'agents'"),
    ("retention = ", "relay.toml line 1: retention = is not TOML"),
])
def test_bad_config_names_the_key(tmp_path, toml, match):
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay/relay.toml").write_text(toml)
    with pytest.raises(ConfigError, match=match):
        config_mod.load(tmp_path, env={})


def test_bad_env_value_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match="'settle' in environment"):
        config_mod.load(tmp_path, env={"RELAY_SETTLE": "later"})


@pytest.mark.parametrize("where", ["toml", "env"])
@pytest.mark.parametrize("value", ["3", 3, 2.5])
def test_a_duration_without_a_unit_is_an_error_naming_the_key(tmp_path, where, value):
    (tmp_path / ".relay").mkdir()
    if where == "toml":
        (tmp_path / ".relay/relay.toml").write_text(f"retention = {value!r}\n" if isinstance(value, str)
                                                    else f"retention = {value}\n")
        env = {}
    else:
        env = {"RELAY_RETENTION": str(value)}
    with pytest.raises(ConfigError, match=r"bad value for 'retention'.*has no unit: write .*s, .*m, .*h or .*d"):
        config_mod.load(tmp_path, env=env)


def test_only_zero_needs_no_unit(tmp_path):
    for value in ("0", 0, "0.0", "3s", "250ms"):
        config_mod.load(tmp_path, env={"RELAY_RETENTION": str(value)})
    assert config_mod.load(tmp_path, env={"RELAY_RETENTION": "0"}).retention == 0
    assert config_mod.parse_duration("15m") == 900 and config_mod.show_duration(900) == "15m"
    assert config_mod.show_duration(7 * 86400) == "7d" and config_mod.show_duration(0.25) == "250ms"


def test_an_environment_variable_that_is_no_key_is_a_warning(tmp_path):
    cfg = config_mod.load(tmp_path, env={"RELAY_AGNET": "Ann", "RELAY_ROOT": str(tmp_path), "RELAY_SETTLE": "1s",
                                         "RELAY_AGENT": "Ann", "RELAY_GUARD": "off"})
    assert cfg.settle == 1.0
    [warning] = cfg.warnings            # RELAY_AGENT (who an agent is) and RELAY_GUARD (the git guard) are no keys
    assert warning.startswith("RELAY_AGNET is set in the environment but names no relay configuration key")
    cfg = config_mod.load(tmp_path, env={"RELAY_AGENTS_DIR": "x", "RELAY_AGENT": "Ann", "RELAY_ROOT": str(tmp_path),
                                         "RELAY_SETTLE": "1s"})
    [warning] = cfg.warnings            # RELAY_AGENT is the agent an agent's verbs act as: no key, no warning
    assert warning.startswith("RELAY_AGENTS_DIR is set in the environment but names no relay configuration key")


def test_not_strict_a_misspelt_key_or_bad_value_in_relay_toml_is_a_warning(tmp_path):
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay/relay.toml").write_text("retension = '7d'\nsettle = 'soon'\nmax_retries = 5\n")
    with pytest.raises(ConfigError, match="unknown configuration key 'retension'"):
        config_mod.load(tmp_path, env={})
    cfg = config_mod.load(tmp_path, env={}, strict=False)
    assert cfg.max_retries == 5 and cfg.settle == 0.25
    assert len(cfg.warnings) == 2 and "'retension'" in cfg.warnings[0] and "'settle'" in cfg.warnings[1]
    (tmp_path / ".relay/relay.toml").write_text("state_dir = '../elsewhere'\n")
    with pytest.raises(ConfigError, match="state_dir"):         # where relay is must be right, always
        config_mod.load(tmp_path, env={}, strict=False)


def test_origins_say_where_each_value_came_from(tmp_path):
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay/relay.toml").write_text("retention = '1d'\nsettle = '1s'\n")
    cfg = config_mod.load(tmp_path, env={"RELAY_SETTLE": "2s"}, overrides={"durability": "normal"})
    assert cfg.origin("retention").startswith("relay.toml (") and cfg.origin("settle") == "env RELAY_SETTLE"
    assert cfg.origin("durability") == "flag" and cfg.origin("max_retries") == "default"
    assert cfg.origin("root") == "flag" and cfg.origin("state_dir") == "default"
    shown = {key: (text, origin) for key, _, text, origin in config_mod.describe(cfg)}
    assert shown["retention"][0] == "1d" and shown["max_body_bytes"] == ("1MiB", "default")
    assert set(shown) == {"root", "state_dir", *config_mod.KEYS}


def test_a_root_with_dot_dot_after_a_link_is_the_kernel_s_directory_not_the_lexical_one(tmp_path, monkeypatch):
    """`--root lnk/..` names the parent of where the link points (as `cd -P` and every system call
    take it), not the directory holding the link: a unit, a hook's RELAY_ROOT and every path relay
    shows name that one."""
    from click.testing import CliRunner
    from relay.cli import main
    here, there = tmp_path / "here", tmp_path / "far" / "away"
    there.mkdir(parents=True)
    here.mkdir()
    (here / "lnk").symlink_to(there, target_is_directory=True)
    monkeypatch.chdir(here)
    for given in ("lnk/..", str(here / "lnk" / "..")):
        assert config_mod.load(given, env={}).root == tmp_path / "far"
        assert config_mod.load(env={"RELAY_ROOT": given}).root == tmp_path / "far"
        assert config_mod.discover(given, env={}) == tmp_path / "far"
    assert config_mod.load("sub/../x", env={}).root == here / "x"          # no link: as written, made plain
    r = CliRunner().invoke(main, ["--root", "lnk/..", "service", "systemd"])
    assert f"--root {tmp_path / 'far'} run" in r.stdout, r.output


def test_a_root_that_is_not_a_directory_is_one_clear_line(tmp_path):
    from click.testing import CliRunner
    from relay.cli import main
    (tmp_path / "afile").write_text("")
    for verb in (["init"], ["status"], ["run", "--once"]):
        r = CliRunner().invoke(main, verb, env={"RELAY_ROOT": str(tmp_path / "afile")})
        assert r.exit_code == 1 and r.output == f"relay: the project root {tmp_path / 'afile'} is not a directory\n"
    assert CliRunner().invoke(main, ["--root", str(tmp_path / "afile"), "status"]).exit_code == 2     # click's usage


def test_a_federation_variable_or_value_relay_cannot_use_stops_no_agent(cli, monkeypatch):
    """RELAY_FEDERATION_<anything> was taken as a key of [federation]: one that names none
    (RELAY_FEDERATION_PASSWORD set for another tool) stopped every verb, an agent's relay send
    too, as did a bad [federation] value, which stops only the daemon anywhere else."""
    cli("init", "--agent", "Ann", "--agent", "Ben")
    monkeypatch.setenv("RELAY_FEDERATION_PASSWORD", "x")
    r = cli("status", ok=False)
    assert r.exit_code == 3 and "RELAY_FEDERATION_PASSWORD" in r.stderr and "names no relay configuration" in r.stderr
    monkeypatch.delenv("RELAY_FEDERATION_PASSWORD")
    (cli.state / "relay.toml").write_text('[federation]\nurl = "http://nowhere"\nteam = "t"\n')
    r = cli("send", "--from", "Ann", "--to", "Ben", "still sent")
    assert "bad value for 'federation'" in r.stderr and "ignored" in r.stderr
    assert len(list((cli.state / "outbox/Ann").iterdir())) == 1
    r = cli("run", "--once", ok=False)
    assert r.exit_code == 1 and "bad value for 'federation'" in r.stderr


# -- discovery takes no state directory of another user ---------------------------------------------

def test_a_state_directory_of_another_user_is_not_taken_for_the_project(tmp_path):
    """Like git's `.git` ownership check: discovery took any `.relay/` above, so one another
    user put in a shared parent (/tmp) received this user's messages and set its relay.toml."""
    from relay import config as config_mod
    (tmp_path / ".relay").mkdir()
    sub = tmp_path / "mine" / "src"
    sub.mkdir(parents=True)
    me = os.geteuid()
    assert config_mod.discover(cwd=sub, env={}, uid=me) == tmp_path
    with pytest.raises(relay.NotInProject) as e:
        config_mod.discover(cwd=sub, env={}, uid=me + 1)
    assert str(e.value) == (f"{tmp_path}/.relay belongs to another user (uid {me}), so relay does not take it for "
                            f"your project; run relay init here for one of your own, or give --root {tmp_path} to "
                            "use it on purpose")
    assert config_mod.discover(root=str(tmp_path), cwd=sub, env={}, uid=me + 1) == tmp_path    # on purpose


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory of another user takes root")
def test_relay_init_under_another_users_state_directory_makes_a_project_of_ones_own(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from relay.cli import main
    shared = tmp_path / "shared"
    (shared / "newproj").mkdir(parents=True)
    runner = CliRunner()
    assert runner.invoke(main, ["--root", str(shared), "init", "--agent", "mallory"]).exit_code == 0
    (shared / ".relay" / "relay.toml").write_text('unknown_recipient = "create"\n')
    for p in [shared / ".relay", *(shared / ".relay").rglob("*")]:
        os.lchown(p, 65534, 65534)
    monkeypatch.chdir(shared / "newproj")
    r = runner.invoke(main, ["init", "--agent", "alice", "--agent", "bob"])
    assert r.exit_code == 0 and r.output.splitlines()[0] == f"initialised {shared}/newproj/.relay with agents alice, bob"
    assert runner.invoke(main, ["send", "--from", "alice", "--to", "bob", "secret"]).exit_code == 0
    assert sorted(p.name for p in (shared / ".relay" / "outbox").iterdir()) == ["mallory"]
    assert len(list((shared / "newproj" / ".relay" / "outbox" / "alice").iterdir())) == 1
    monkeypatch.chdir(shared)
    r = runner.invoke(main, ["init", "--agent", "alice"])
    assert r.exit_code == 1 and error_line(r) == (
        f"{shared}/.relay belongs to another user (uid 65534), so relay does not take it for your project; run "
        f"relay init here for one of your own, or give --root {shared} to use it on purpose")
    assert sorted(p.name for p in (shared / ".relay" / "outbox").iterdir()) == ["mallory"]


# -- discovery and loading on a file system laid out by hand (pyfakefs): no .relay/ the machine
#    happens to hold above the test, the root of the disk to write in, owners and permissions
#    that only root could set, and no permission that root could be refused ------------------------

def test_discovery_takes_the_nearest_state_directory_on_the_way_up(fs):
    fs.create_dir("/home/ann/outer/.relay")
    fs.create_dir("/home/ann/outer/inner/.relay")
    fs.create_dir("/home/ann/outer/inner/src/deep")
    fs.create_file("/home/ann/outer/inner/src/.relay")          # a file of that name is no state directory
    fs.create_dir("/home/ann/outer/docs")
    fs.create_dir("/home/ann/outer/.team-relay")
    assert config_mod.discover(cwd="/home/ann/outer/inner/src/deep", env={}) == Path("/home/ann/outer/inner")
    assert config_mod.discover(cwd="/home/ann/outer/inner", env={}) == Path("/home/ann/outer/inner")
    assert config_mod.discover(cwd="/home/ann/outer/docs", env={}) == Path("/home/ann/outer")
    assert config_mod.discover(cwd="/home/ann/outer/inner/src/deep", env={"RELAY_STATE_DIR": ".team-relay"}) \
        == Path("/home/ann/outer")
    assert config_mod.discover(cwd="/home/ann/outer/inner/src/deep", state_dir=".team-relay", env={}) \
        == Path("/home/ann/outer")


def test_discovery_looks_up_to_the_root_of_the_disk_and_says_what_it_looked_for(fs):
    fs.create_dir("/home/ann/notes/2024")
    with pytest.raises(relay.NotInProject) as e:
        config_mod.discover(cwd="/home/ann/notes/2024", env={})
    assert str(e.value) == "not in a relay project (no .relay/ here or above); run relay init"
    with pytest.raises(relay.NotInProject, match=r"^not in a relay project \(no \.team-relay/ here or above\)"):
        config_mod.discover(cwd="/home/ann/notes/2024", env={"RELAY_STATE_DIR": ".team-relay/"})
    fs.create_dir("/.relay")
    assert config_mod.discover(cwd="/home/ann/notes/2024", env={}) == Path("/")


def test_a_link_to_another_users_state_directory_is_not_taken_for_the_project(fs):
    """The link is this user's, the directory it leads to another's: discovery looks at both."""
    me = os.geteuid()
    fs.create_dir("/srv/shared/.relay")
    os.chown("/srv/shared/.relay", me + 1, me + 1)
    fs.create_dir("/home/ann/proj/src")
    fs.create_symlink("/home/ann/proj/.relay", "/srv/shared/.relay")
    with pytest.raises(relay.NotInProject) as e:
        config_mod.discover(cwd="/home/ann/proj/src", env={})
    assert str(e.value).startswith(f"/home/ann/proj/.relay belongs to another user (uid {me + 1}), so relay does "
                                   "not take it for your project")
    os.chown("/srv/shared/.relay", me, me)
    assert config_mod.discover(cwd="/home/ann/proj/src", env={}) == Path("/home/ann/proj")


def test_relay_toml_is_read_in_the_state_directory_named_and_moves_only_the_default_one(fs):
    fs.create_file("/p/.relay/relay.toml", contents="state_dir = '.team'\nretention = '1d'\n")
    fs.create_file("/p/.team/relay.toml", contents="retention = '3d'\n")         # not read: the move is the default's
    fs.create_file("/p/.other/relay.toml", contents="state_dir = '.elsewhere'\nretention = '2d'\n")
    cfg = config_mod.load("/p", env={})
    assert (cfg.state_dir, cfg.retention, cfg.source) == (Path("/p/.team"), 86400, "/p/.relay/relay.toml")
    assert cfg.origin("state_dir") == "relay.toml (/p/.relay/relay.toml)"
    for cfg in (config_mod.load("/p", ".other", env={}), config_mod.load("/p", env={"RELAY_STATE_DIR": ".other"})):
        assert (cfg.state_dir, cfg.retention, cfg.source) == (Path("/p/.other"), 2 * 86400, "/p/.other/relay.toml")
        assert cfg.origin("state_dir") in ("flag", "env RELAY_STATE_DIR")


def test_a_relay_toml_relay_may_not_read_is_one_error_naming_it(fs):
    """As a user who may not read it (root may read any file: the real file system cannot show
    this to a test run as root)."""
    fs.create_file("/p/.relay/relay.toml", contents="retention = '1d'\n")
    os.chmod("/p/.relay/relay.toml", 0o200)
    set_uid(4242)
    with pytest.raises(ConfigError) as e:
        config_mod.load("/p", env={})
    assert str(e.value) == "cannot read /p/.relay/relay.toml: Permission denied"


def test_a_toml_slip_names_its_line_and_what_to_write(tmp_path):
    """`retention = 7d` (as the README's table wrote it) gave the parser's words only."""
    (tmp_path / ".relay").mkdir()
    toml = tmp_path / ".relay/relay.toml"
    toml.write_text("max_retries = 5\n\n# the week\nretention = 7d\n")
    with pytest.raises(ConfigError) as e:
        config_mod.load(tmp_path, env={})
    assert str(e.value).startswith(f"{toml} line 4: retention = 7d is not TOML")
    assert 'write retention = "7d"' in str(e.value)
    toml.write_text("[federation\nurl = 'redis://x'\n")       # no value to quote: the line and the parser's words
    with pytest.raises(ConfigError) as e:
        config_mod.load(tmp_path, env={})
    assert str(e.value).startswith(f"{toml} line 1: [federation is not TOML (") and "write" not in str(e.value)


def test_agents_verbs_carry_on_past_a_toml_slip_with_its_line_the_daemon_stops(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    (cli.state / "relay.toml").write_text("retention = 7d\n")
    sent = cli("send", "--from", "Ann", "--to", "Ben", "hello")
    assert sent.stdout.strip() and 'line 1: retention = 7d is not TOML' in sent.stderr
    assert "read as if it were not there" in sent.stderr
    assert "no new messages for Ben" in cli("inbox", "Ben").stdout     # (the warning is said once a process)
    stopped = cli("run", "--once", ok=False)
    assert stopped.exit_code == 1 and 'write retention = "7d"' in stopped.stderr
    (cli.state / "relay.toml").write_text("retention = 7d\nstate_dir = 'elsewhere'\n")
    refused = cli("send", "--from", "Ann", "--to", "Ben", "hello", ok=False)     # where relay is must be right
    assert refused.exit_code == 1 and "state_dir" in refused.stderr and not refused.stdout


def test_the_configuration_tables_write_each_default_as_relay_toml_takes_it(tmp_path):
    """The README's table wrote `7d`, which as `retention = 7d` is no TOML: each default cell,
    written after `key = `, is TOML that gives the default."""
    import re
    import tomllib
    root = Path(__file__).resolve().parent.parent
    defaults = config_mod.load(tmp_path, env={})
    seen = 0
    for doc in (root / "README.md", root / "docs" / "operating.md"):
        for line in doc.read_text().splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 3 or not cells[0].startswith("`") or cells[0] == "`state_dir`":
                continue
            keys = re.findall(r"`([a-z_]+)`", cells[0])
            values = re.findall(r"`([^`]+)`", cells[1])
            if not keys or not all(k in config_mod.KEYS for k in keys) or len(values) != len(keys):
                continue
            for key, value in zip(keys, values):
                tomllib.loads(f"{key} = {value}")          # TOMLDecodeError: the table writes no TOML
                (tmp_path / ".relay").mkdir(exist_ok=True)
                (tmp_path / ".relay/relay.toml").write_text(f"{key} = {value}\n")
                assert getattr(config_mod.load(tmp_path, env={}), key) == getattr(defaults, key), (doc.name, key)
                seen += 1
    assert seen >= 20


def test_init_writes_a_relay_toml_of_every_key_commented_out_at_its_default(cli):
    """The README says .relay/ holds relay.toml; `relay init` wrote none. Each key is there,
    commented out, with a line of help; uncommented, the file gives the defaults."""
    import re
    import tomllib
    cli("init", "--agent", "Ann")
    text = (cli.state / "relay.toml").read_text()
    assert tomllib.loads(text) == {}
    keys = [k for k in config_mod.KEYS if k not in ("federation", "wake", "metrics")]     # the tables, at the end
    assigned = re.findall(r"(?m)^# ([a-z_]+) = ", text)
    assert assigned == keys
    for key in keys:        # a line of help just above each
        help_line = text.split(f"\n# {key} = ")[0].rsplit("\n", 1)[-1]
        assert help_line.startswith("## ") and len(help_line) > 12, key
    assert "[federation]" in text and '## [wake]\n## tmux = "agents:{agent}"' in text
    uncommented = re.sub(r"(?m)^# (?=[a-z_]+ = )", "", text)
    data = tomllib.loads(uncommented)
    assert sorted(data) == sorted(keys)
    (cli.state / "relay.toml").write_text(uncommented)
    loaded = config_mod.load(cli.root, env={})
    defaults = config_mod.Config(root=loaded.root, state_dir=loaded.state_dir)
    assert all(getattr(loaded, k) == getattr(defaults, k) for k in config_mod.KEYS if k != "state_dir")
    assert loaded.state_dir == cli.state and not loaded.warnings


def test_init_never_overwrites_a_relay_toml(cli):
    cli.state.mkdir()
    (cli.state / "relay.toml").write_text("retention = '1d'\n")
    cli("init", "--agent", "Ann")
    assert (cli.state / "relay.toml").read_text() == "retention = '1d'\n"
    assert [p.name for p in cli.state.iterdir() if p.name.startswith(".relay.toml")] == []


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


HINT = "did you mean retention?"


@pytest.fixture
def typo(team):
    team("send", "--from", "Alice", "--to", "Bob", "--subject", "s", "hello")
    team("run", "--once")
    (team.state / "relay.toml").write_text('retension = "3d"\n')
    return team


@pytest.mark.parametrize("verb", [
    ["config"], ["status", "--json"], ["audit"], ["agents"], ["queues"], ["verify"], ["doctor", "--quick"],
    ["report", "--html", "-"], ["adopt", "Bob"], ["tail"], ["inbox", "Bob"], ["read", "--agent", "Bob", "X"],
])
def test_a_read_only_verb_warns_and_carries_on(typo, verb):
    r = typo(*verb, ok=False)
    assert "unknown configuration key 'retension'" in r.stderr and HINT in r.stderr, r.output
    if verb[0] == "read":           # (the id is made up: the verb itself ran, and said so)
        assert r.exit_code == 1 and "no message 'X'" in r.stderr
    else:
        assert r.exit_code == 0, r.output


def test_show_warns_and_carries_on(typo):
    r = typo("audit", "--json")
    mid = json.loads(r.stdout)[0]["id"]
    assert HINT in r.stderr         # (a process prints each warning once)
    assert mid in typo("show", mid).stdout


def test_relay_config_shows_the_bad_key_with_its_hint(typo):
    r = typo("config")
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("retension"))
    assert HINT in line and "ignored" in line
    doc = json.loads(typo("config", "--json").stdout)
    assert doc["values"]["retention"]["text"] == "7d"
    assert [p["key"] for p in doc["problems"]] == ["retension"] and HINT in doc["problems"][0]["problem"]


@pytest.mark.parametrize("verb", [["run", "--once"], ["sweep"]])
def test_the_daemon_and_the_sweep_refuse_to_start_with_the_same_hint(typo, verb):
    r = typo(*verb, ok=False)
    assert r.exit_code == 1 and "unknown configuration key 'retension'" in r.stderr and HINT in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_relay_config_says_where_each_value_came_from(cli):
    cli("init")
    (cli.state / "relay.toml").write_text("retention = '2d'\n")
    r = CliRunner().invoke(main, ["--root", str(cli.root), "config", "--json"], env={"RELAY_SETTLE": "1s"})
    assert r.exit_code == 0, r.output
    values = json.loads(r.stdout)["values"]
    assert values["retention"]["text"] == "2d" and values["retention"]["from"].startswith("relay.toml (")
    assert values["settle"] == {"value": 1.0, "text": "1s", "from": "env RELAY_SETTLE"}
    assert values["root"]["from"] == "flag" and values["durability"] == {"value": "full", "text": "full",
                                                                          "from": "default"}
    text = cli("config").stdout
    assert "retention" in text and "2d" in text and "(relay.toml (" in text and "(default)" in text


def test_an_unknown_relay_variable_warns_once_and_stops_no_verb(cli):
    runner = CliRunner()
    env = {"RELAY_NOT_A_KEY_OF_RELAYS": "x"}
    first = runner.invoke(main, ["--root", str(cli.root), "init", "--agent", "Ann"], env=env)
    assert first.exit_code == 0 and "RELAY_NOT_A_KEY_OF_RELAYS is set in the environment" in first.stderr
    again = runner.invoke(main, ["--root", str(cli.root), "config"], env=env)
    assert again.exit_code == 0 and "RELAY_NOT_A_KEY_OF_RELAYS" not in again.stderr     # once per process


def test_a_misspelt_key_stops_the_daemon_not_an_agents_send_or_inbox(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    (cli.state / "relay.toml").write_text("retension_typo = '7d'\n")
    r = cli("run", "--once", ok=False)
    assert r.exit_code == 1 and "unknown configuration key 'retension_typo'" in r.output
    r = cli("send", "--from", "Ann", "--to", "Ben", "still goes")
    assert (cli.state / f"outbox/Ann/msg-{r.stdout.strip().lower()}").is_file()
    (cli.state / "relay.toml").write_text("retension_typo2 = '7d'\n")        # a new warning: printed
    r = cli("inbox", "Ben")
    assert "no new messages" in r.stdout and "unknown configuration key 'retension_typo2'" in r.stderr
    assert cli("status", ok=False).exit_code == 3       # a read-only verb warns and carries on


# -- each key's reading, each case of it ---------------------------------------------------------

@pytest.mark.parametrize("seconds, shown", [(0, "0"), (0.0, "0"), (1, "1s"), (59, "59s"), (60, "1m"), (61, "61s"),
                                            (3599, "3599s"), (3600, "1h"), (5400, "90m"), (86400, "1d"),
                                            (90000, "25h"), (7 * 86400, "7d"), (1.5, "1500ms"), (0.001, "1ms"),
                                            (0.0005, "0.5ms")])
def test_a_duration_is_shown_in_the_largest_unit_that_divides_it(seconds, shown):
    assert config_mod.show_duration(seconds) == shown


@pytest.mark.parametrize("size, shown", [(1, "1"), (1023, "1023"), (1024, "1KiB"), (1025, "1025"), (1536, "1536"),
                                         (1024**2, "1MiB"), (3 * 1024**2, "3MiB"), (1024**2 + 1024, "1025KiB"),
                                         (1024**3, "1GiB"), (1000, "1000")])
def test_a_size_is_shown_in_the_largest_binary_unit_that_divides_it(size, shown):
    assert config_mod.show_size(size) == shown


@pytest.mark.parametrize("value, seconds", [("2w", 14 * 86400), ("1.5h", 5400), (" 90 s ", 90), ("1m", 60),
                                            ("1d", 86400), ("1ms", 0.001), ("1s", 1), ("1h", 3600)])
def test_every_unit_of_a_duration_is_read(value, seconds):
    assert config_mod.parse_duration(value) == seconds


@pytest.mark.parametrize("value", [True, False])
def test_a_true_or_false_is_neither_a_duration_nor_a_size(value):
    with pytest.raises(ValueError, match="is not a duration"):
        config_mod.parse_duration(value)
    with pytest.raises(ValueError, match="is not a size"):
        config_mod.parse_size(value)


@pytest.mark.parametrize("value, size", [("1KB", 1000), ("1kb", 1000), ("1KiB", 1024), ("1kib", 1024), ("2M", 2 * 10**6),
                                         ("2MB", 2 * 10**6), ("1MIB", 1024**2), ("1g", 10**9), ("1GB", 10**9),
                                         ("1GiB", 1024**3), (" 7 b ", 7), (4096, 4096)])
def test_every_unit_of_a_size_is_read_in_any_case(value, size):
    assert config_mod.parse_size(value) == size


@pytest.mark.parametrize("key, value, why", [
    ("RELAY_MAX_RETRIES", "-1", "'-1' is below 0"), ("RELAY_MAX_RETRIES", "three", "'three' is not a whole number"),
    ("RELAY_QUEUE_LIMIT", "1.5", "'1.5' is not a whole number"), ("RELAY_PAIR_RATE", "-2", "'-2' is below 0"),
    ("RELAY_LOG_LEVEL", "trace", "'TRACE' is not a log level (debug, info, warning, error)"),
    ("RELAY_ON_DELIVER_TIMEOUT", "0s", "'0s' must be longer than 0s"),
    ("RELAY_ON_DELIVER_TIMEOUT", "0", "'0' must be longer than 0s"),
    ("RELAY_ACK_OVERDUE", "0ms", "'0ms' must be longer than 0s"),
    ("RELAY_BOUNCES", "maybe", "'maybe' is not true or false"),
    ("RELAY_ON_DELIVER_SYSTEM", "2", "'2' is not true or false"),
    ("RELAY_DURABILITY", "FULL", "'FULL' is not one of full, normal"),
    ("RELAY_SENDERS", "some", "'some' is not one of any, declared"),
    ("RELAY_LOG_FORMAT", "xml", "'xml' is not one of text, json"),
    ("RELAY_UNKNOWN_RECIPIENT", "drop", "'drop' is not one of fail, create"),
    ("RELAY_AGENTS", "Ann,../x", "'../x' is not a valid agent name"),
    ("RELAY_AGENTS", "Ann,Ben,ann", "'Ann' and 'ann' would be the same agent on a case-insensitive file system"),
    ("RELAY_AGENTS", "Ann,system", "'system' is a name relay keeps for itself (System: relay's own name), in any case"),
    ("RELAY_ON_DELIVER", "echo \0", "a command cannot hold a NUL byte"),
])
def test_each_bad_value_of_a_key_is_refused_saying_why_and_naming_the_key(tmp_path, key, value, why):
    name = key[len("RELAY_"):].lower()
    with pytest.raises(ConfigError) as e:
        config_mod.load(tmp_path, env={key: value})
    assert str(e.value).startswith(f"bad value for {name!r} in environment")
    assert why in str(e.value)


@pytest.mark.parametrize("key, value, taken", [
    ("RELAY_MAX_RETRIES", "0", 0), ("RELAY_QUEUE_LIMIT", "0", 0), ("RELAY_LOG_LEVEL", "warning", "WARNING"),
    ("RELAY_LOG_LEVEL", "Debug", "DEBUG"), ("RELAY_LOG_LEVEL", "critical", "CRITICAL"),
    ("RELAY_ON_DELIVER_TIMEOUT", "1ms", 0.001), ("RELAY_AGENTS", " Ann , Ben ,", ("Ann", "Ben")),
    ("RELAY_AGENTS", "", ()), ("RELAY_ON_DELIVER_SYSTEM", "yes", True), ("RELAY_BOUNCES", "off", False),
    ("RELAY_DURABILITY", "normal", "normal"), ("RELAY_SENDERS", "declared", "declared"),
])
def test_each_good_value_of_a_key_is_taken(tmp_path, key, value, taken):
    cfg = config_mod.load(tmp_path, env={key: value})
    assert getattr(cfg, key[len("RELAY_"):].lower()) == taken


@pytest.mark.parametrize("toml, why", [
    ("agents = 5", "5 is not a list of agent names"),
    ("agents = [1]", "1 is not a valid agent name"),
    ("max_retries = true", "True is not a whole number"),
    ("federation = 'x'", "'x' is not a table ([federation] with url, team and node)"),
    ("on_deliver = []", "[] is not a command"),
    ("on_deliver = ['echo', '']", "is not a command"),
    ("on_deliver = ['echo', 3]", "is not a command"),
    ("on_deliver = 3", "3 is not a command"),
    ("max_body_bytes = 0", "0 must be positive"),
    ("max_body_bytes = -5", "-5 must be positive"),
    ("batch_bytes = '0MiB'", "'0MiB' must be positive"),
    ("batch_bytes = '1 parsec'", "'1 parsec' is not a size (use e.g. 1048576, 512KiB, 1MiB)"),
])
def test_each_bad_value_in_relay_toml_is_refused_saying_why(tmp_path, toml, why):
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay/relay.toml").write_text(toml + "\n")
    with pytest.raises(ConfigError) as e:
        config_mod.load(tmp_path, env={})
    where = tmp_path / ".relay/relay.toml"
    assert f"bad value for {toml.split(' ')[0]!r} in {where}: " in str(e.value) and why in str(e.value)


def test_an_on_deliver_list_is_taken_as_its_arguments(tmp_path):
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay/relay.toml").write_text("on_deliver = ['notify', '--to', 'me']\n")
    assert config_mod.load(tmp_path, env={}).on_deliver == ("notify", "--to", "me")


@pytest.mark.parametrize("value", ["", "dir\x07", "dir\u202e", "\x1b[31m"])
def test_a_state_dir_that_is_empty_or_holds_a_control_or_bidi_character_is_refused_even_when_not_strict(tmp_path, value):
    with pytest.raises(ConfigError) as e:
        config_mod.load(tmp_path, env={}, overrides={"state_dir": value}, strict=False)
    assert "bad value for 'state_dir'" in str(e.value)
    assert ("is not a directory path" if value == "" else "holds a control or bidi character") in str(e.value)


def test_an_absolute_state_dir_makes_the_current_directory_the_root_whatever_is_above(tmp_path):
    (tmp_path / ".relay").mkdir()
    sub = tmp_path / "src"
    sub.mkdir()
    elsewhere = tmp_path / "elsewhere-state"
    assert config_mod.discover(cwd=sub, env={"RELAY_STATE_DIR": str(elsewhere)}) == sub
    assert config_mod.discover(cwd=sub, state_dir=str(elsewhere), env={}) == sub
    assert config_mod.discover(cwd=sub, env={}) == tmp_path


def test_the_parts_of_a_state_dir_below_the_root_and_none_for_one_elsewhere_or_climbing_out(tmp_path):
    root = tmp_path / "p"
    assert config_mod.state_parts(root, root / ".relay") == (".relay",)
    assert config_mod.state_parts(root, root / "a" / "b") == ("a", "b")
    assert config_mod.state_parts(root, tmp_path / "q" / ".relay") is None
    assert config_mod.state_parts(root, root / "a" / ".." / ".." / "x") is None
    assert config_mod.state_parts(root, root) == ()


@pytest.mark.parametrize("value", [".relay", "state/.relay", ".relay2/x", "team/state"])
def test_a_state_dir_of_its_own_below_the_root_is_taken(tmp_path, value):
    config_mod.check_state(tmp_path, tmp_path / value, "flag")
    assert config_mod.load(tmp_path, value, env={}).state_dir == tmp_path / value


def test_a_state_dir_below_a_file_has_no_link_on_its_way(tmp_path):
    (tmp_path / "afile").write_text("x")
    assert config_mod.state_link(tmp_path, tmp_path / "afile" / "state") is None
    assert config_mod.state_link(tmp_path, tmp_path / "not-yet" / "state") is None
    (tmp_path / "real").mkdir()
    (tmp_path / "via").symlink_to(tmp_path / "real", target_is_directory=True)
    assert config_mod.state_link(tmp_path, tmp_path / "via" / "state") == tmp_path / "via"
    (tmp_path / "real" / "inner").symlink_to(tmp_path / "real", target_is_directory=True)
    assert config_mod.state_link(tmp_path, tmp_path / "real" / "inner") == tmp_path / "real" / "inner"
    with pytest.raises(ConfigError) as e:
        config_mod.check_state(tmp_path, tmp_path / "via" / "state", "env RELAY_STATE_DIR")
    assert str(e.value).startswith(f"the state directory {tmp_path}/via/state (env RELAY_STATE_DIR) is reached "
                                   f"through the symbolic link {tmp_path}/via; ")


@pytest.mark.parametrize("toml, host, port", [
    ('listen = 9108', "127.0.0.1", 9108), ('listen = "localhost:9108"', "127.0.0.1", 9108),
    ('listen = ":9108"', "127.0.0.1", 9108), ('listen = " 10.0.0.1:0 "', "10.0.0.1", 0),
    ('listen = "127.0.0.1:65535"', "127.0.0.1", 65535), ('listen = "[::]:9108"', "::", 9108),
])
def test_metrics_listen_reads_each_way_of_writing_an_address(tmp_path, toml, host, port):
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay/relay.toml").write_text(f"[metrics]\n{toml}\n")
    m = config_mod.load(tmp_path, env={}).metrics
    assert (m.host, m.port) == (host, port)


@pytest.mark.parametrize("toml", ["[metrics]\n", '[metrics]\nlisten = ""\n', ""])
def test_metrics_without_a_listen_address_serves_nothing(tmp_path, toml):
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay/relay.toml").write_text(toml)
    assert config_mod.load(tmp_path, env={}).metrics is None
    assert config_mod.load(tmp_path, env={"RELAY_METRICS": ""}).metrics is None


@pytest.mark.parametrize("toml, why", [
    ('metrics = 5', "5 is not a table ([metrics] with listen = \"127.0.0.1:9108\")"),
    ('[metrics]\nlisten = "127.0.0.1:9108"\nport = 1', "unknown key 'port' in [metrics] (its key: listen)"),
    ('[metrics]\nlisten = true', "[metrics] listen = True is not an address (HOST:PORT)"),
    ('[metrics]\nlisten = "127.0.0.1:9108\\u001b"', "is not an address (HOST:PORT)"),
    ('[metrics]\nlisten = "127.0.0.1:65536"', "'127.0.0.1:65536' names no port (HOST:PORT, as 127.0.0.1:9108)"),
    ('[metrics]\nlisten = "127.0.0.1:\u0669\u0661"', "names no port"),
    ('[metrics]\nlisten = "127.0.0.1:-1"', "names no port"),
])
def test_a_bad_metrics_section_is_refused_saying_why(tmp_path, toml, why):
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay/relay.toml").write_text(toml + "\n")
    with pytest.raises(ConfigError) as e:
        config_mod.load(tmp_path, env={})
    assert "bad value for 'metrics'" in str(e.value) and why in str(e.value)


def test_a_relay_toml_that_is_a_directory_or_a_fifo_is_refused_as_no_regular_file(tmp_path):
    toml = tmp_path / ".relay/relay.toml"
    toml.mkdir(parents=True)
    for strict in (True, False):
        with pytest.raises(ConfigError) as e:
            config_mod.load(tmp_path, env={}, strict=strict)
        assert str(e.value) == (f"{toml} is not a regular file; relay reads its configuration only from a plain "
                                "file there")
    toml.rmdir()
    os.mkfifo(toml)
    with pytest.raises(ConfigError, match="is not a regular file"):
        config_mod.load(tmp_path, env={})


def test_a_relay_toml_that_is_not_utf8_is_refused_or_when_not_strict_read_as_absent(tmp_path):
    toml = tmp_path / ".relay/relay.toml"
    toml.parent.mkdir()
    toml.write_bytes(b"retention = '1d'\n# caf\xe9\n")
    with pytest.raises(ConfigError) as e:
        config_mod.load(tmp_path, env={})
    assert str(e.value) == f"{toml} is not UTF-8 text (byte 22); a TOML file is"
    loaded = config_mod.load(tmp_path, env={}, strict=False)
    assert loaded.retention == 7 * 86400 and loaded.warnings == (
        f"{toml} is not UTF-8 text (byte 22); a TOML file is; relay.toml is read as if it were not there (every key "
        "at what else gives it)",)


def test_a_toml_error_on_an_empty_line_names_the_line_alone(tmp_path):
    toml = tmp_path / ".relay/relay.toml"
    toml.parent.mkdir()
    toml.write_text('retention = "1d"\n\n[wake\n')
    with pytest.raises(ConfigError) as e:
        config_mod.load(tmp_path, env={})
    assert str(e.value).startswith(f"{toml} line 3: [wake is not TOML (")
    toml.write_text('retention = """1d\n\n')
    with pytest.raises(ConfigError) as e:
        config_mod.load(tmp_path, env={})
    assert str(e.value) == f"{toml} line 2 is not TOML (unterminated string)"


def test_the_root_and_state_dir_origins_say_flag_env_or_default_exactly(tmp_path):
    cfg = config_mod.load(env={"RELAY_ROOT": str(tmp_path)})
    assert (cfg.origin("root"), cfg.origin("state_dir")) == ("env RELAY_ROOT", "default")
    cfg = config_mod.load(tmp_path, env={"RELAY_ROOT": "/elsewhere", "RELAY_STATE_DIR": ".s"})
    assert (cfg.root, cfg.origin("root"), cfg.origin("state_dir")) == (tmp_path, "flag", "env RELAY_STATE_DIR")
    cfg = config_mod.load(tmp_path, ".t", env={"RELAY_STATE_DIR": ".s"})
    assert (cfg.state_dir, cfg.origin("state_dir")) == (tmp_path / ".t", "flag")


def test_a_root_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError) as e:
        config_mod.load(tmp_path / "afile", env={})
    assert str(e.value) == f"the project root {tmp_path / 'afile'} is not a directory"


def test_the_source_names_what_was_read_in_order_and_defaults_when_nothing_was(tmp_path):
    assert config_mod.load(tmp_path, env={}).source == "defaults"
    assert config_mod.load(tmp_path, env={}, overrides={"settle": None}).source == "defaults"
    assert config_mod.load(tmp_path, env={}, overrides={"settle": "1s"}).source == "flags"
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay/relay.toml").write_text("retention = '1d'\n")
    cfg = config_mod.load(tmp_path, env={"RELAY_SETTLE": "2s"}, overrides={"settle": "3s"})
    assert cfg.source == f"{tmp_path / '.relay/relay.toml'} + environment + flags" and cfg.settle == 3
    assert config_mod.load(tmp_path, env={"RELAY_FEDERATION_TEAM": "acme"}).source == (
        f"{tmp_path / '.relay/relay.toml'} + environment")


def test_the_variables_relay_sets_for_a_hook_and_the_ones_naming_places_warn_of_nothing(tmp_path):
    env = {name: "x" for name in config_mod.HOOK_VARIABLES}
    env.update(RELAY_ROOT=str(tmp_path), RELAY_STATE_DIR=".relay", RELAY_AGENT="Ann", RELAY_GUARD="off")
    assert config_mod.load(env=env).warnings == ()
    for name in ("RELAY_FEDERATION", "RELAY_STATE_DIRS", "RELAY_FEDERATION_PORT", "RELAY_"):
        [warning] = config_mod.load(tmp_path, env={name: "x"}).warnings
        assert warning == (f"{name} is set in the environment but names no relay configuration key; it is ignored "
                           "(`relay config` lists the keys, each as RELAY_<KEY>)")


def test_the_federation_from_the_environment_alone_and_a_bad_one_not_strict_is_a_warning(tmp_path):
    fed = config_mod.load(tmp_path, env={"RELAY_FEDERATION_TEAM": "acme", "RELAY_FEDERATION_NODE": "n1"}).federation
    assert (fed.team, fed.node, fed.url) == ("acme", "n1", None)
    env = {"RELAY_FEDERATION_TEAM": "ac me"}
    with pytest.raises(ConfigError) as e:
        config_mod.load(tmp_path, env=env)
    assert str(e.value).startswith("bad value for 'federation' in environment: team 'ac me' is not a valid name")
    cfg = config_mod.load(tmp_path, env=env, strict=False)
    assert cfg.federation is None and cfg.warnings == (f"{e.value}; ignored",)
    assert cfg.rejected == (("federation", str(e.value)),)


def test_relay_toml_that_is_no_toml_not_strict_is_read_as_absent_unless_it_names_the_state_dir(tmp_path):
    toml = tmp_path / ".relay/relay.toml"
    toml.parent.mkdir()
    toml.write_text("retention = '1d'\nsettle = \n")
    cfg = config_mod.load(tmp_path, env={}, strict=False)
    assert cfg.retention == 7 * 86400 and len(cfg.warnings) == 1 and cfg.warnings[0].endswith(
        "; relay.toml is read as if it were not there (every key at what else gives it)")
    assert [key for key, _ in cfg.rejected] == ["relay.toml"]
    for text in ("state_dir = '.x'\nsettle = \n", "  'state_dir' = \n", '"state_dir" = 1 2\n'):
        toml.write_text(text)
        with pytest.raises(ConfigError) as e:
            config_mod.load(tmp_path, env={}, strict=False)
        assert str(e.value).endswith("; the file names state_dir, which no verb guesses: correct it first")
    toml.write_text("# state_dir = '.x'\nsettle = \n")
    assert config_mod.load(tmp_path, env={}, strict=False).state_dir == tmp_path / ".relay"


@pytest.mark.parametrize("value", ["/abs/state", "../up", "a/../../up"])
def test_a_state_dir_in_relay_toml_must_stay_inside_the_project(tmp_path, value):
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay/relay.toml").write_text(f"state_dir = '{value}'\n")
    for strict in (True, False):
        with pytest.raises(ConfigError) as e:
            config_mod.load(tmp_path, env={}, strict=strict)
        assert str(e.value) == (f"bad value for 'state_dir' in {tmp_path / '.relay/relay.toml'}: {value!r} must be a "
                                "relative path inside the project root (use --state-dir or RELAY_STATE_DIR for any "
                                "other place)")


def test_relay_config_writes_each_kind_of_value_as_it_would_be_written(tmp_path):
    shown = {key: (value, text) for key, value, text, _ in config_mod.describe(config_mod.load(tmp_path, env={}))}
    assert shown["agents"] == ([], "(none)") and shown["federation"] == (None, "(none: this machine only)")
    assert shown["wake"] == (None, "(none)") and shown["metrics"] == (None, "(none)")
    assert shown["log_level"] == ("INFO", "info") and shown["retention"] == (604800.0, "7d")
    assert shown["batch_bytes"] == (64 * 1024 * 1024, "64MiB") and shown["max_retries"] == (3, "3")
    assert shown["bounces"] == (True, "True") and shown["on_deliver"] == (None, "None")
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay/relay.toml").write_text(
        'agents = ["Ann", "Ben"]\nlog_level = "debug"\nmax_body_bytes = 1000\n'
        '[metrics]\nlisten = "127.0.0.1:9108"\n[federation]\nurl = "redis://u:pw@h:6379/0"\nteam = "acme"\nnode = "n1"\n')
    shown = {key: (value, text) for key, value, text, _ in config_mod.describe(config_mod.load(tmp_path, env={}))}
    assert shown["agents"] == (["Ann", "Ben"], "Ann, Ben") and shown["log_level"] == ("DEBUG", "debug")
    assert shown["max_body_bytes"] == (1000, "1000")
    assert shown["federation"] == ({"url": "redis://u:***@h:6379/0", "team": "acme", "node": "n1"},
                                   "url redis://u:***@h:6379/0, team acme, node n1")
    assert shown["metrics"][1] == "listen 127.0.0.1:9108, host 127.0.0.1, port 9108"


def test_a_root_is_made_absolute_as_named_and_a_dotdot_after_a_link_as_the_kernel_takes_it(tmp_path, monkeypatch):
    from relay.statedir import absolute
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real" / "sub", target_is_directory=True)
    assert absolute(tmp_path / "link") == tmp_path / "link"                    # the link kept as named
    assert absolute(tmp_path / "link" / "..") == tmp_path / "real"             # not tmp_path
    monkeypatch.chdir(tmp_path)
    assert absolute("link") == tmp_path / "link" and absolute("link/..") == tmp_path / "real"
    root, state = config_mod.resolve_dirs(str(tmp_path / "link" / ".."), None, env={})
    assert (root, state) == (tmp_path / "real", None)
    root, state = config_mod.resolve_dirs(None, None, env={"RELAY_ROOT": "link", "RELAY_STATE_DIR": ".s"})
    assert (root, state) == (tmp_path / "link", tmp_path / "link" / ".s")
    assert config_mod.resolve_dirs(None, ".t", env={"RELAY_STATE_DIR": ".s"})[1] == tmp_path / ".t"


def test_a_new_relay_toml_is_written_once_and_never_where_a_relay_toml_named_the_state_dir(tmp_path):
    from relay.config import template
    (tmp_path / ".relay").mkdir()
    cfg = config_mod.load(tmp_path, env={})
    assert template.write(cfg) == tmp_path / ".relay/relay.toml"
    assert (tmp_path / ".relay/relay.toml").read_text() == template.template()
    (tmp_path / ".relay/relay.toml").write_text("state_dir = '.team'\n")
    assert template.write(config_mod.load(tmp_path, env={})) is None            # there is one already
    (tmp_path / ".team").mkdir()
    moved = config_mod.load(tmp_path, env={})
    assert moved.state_dir == tmp_path / ".team" and template.write(moved) is None
    assert not (tmp_path / ".team/relay.toml").exists()


def test_the_default_agent_is_relay_agent_and_an_empty_one_is_none(monkeypatch):
    assert config_mod.default_agent({"RELAY_AGENT": "Ann"}) == "Ann"
    assert config_mod.default_agent({"RELAY_AGENT": ""}) is None
    assert config_mod.default_agent({"RELAY_AGENTS": "Ann"}) is None
    monkeypatch.setenv("RELAY_AGENT", "Ben")
    assert config_mod.default_agent() == "Ben"
    assert config_mod.default_agent({}) is None         # the environment given, not the process's


@pytest.mark.parametrize("value, taken", [("debug", "DEBUG"), ("Info", "INFO"), ("WARNING", "WARNING"),
                                          ("error", "ERROR"), ("critical", "CRITICAL")])
def test_each_of_the_five_log_levels_is_taken_in_any_case(tmp_path, value, taken):
    assert config_mod.load(tmp_path, env={"RELAY_LOG_LEVEL": value}).log_level == taken


@pytest.mark.parametrize("word", ["true", "YES", " on ", "1", "True"])
def test_each_word_for_true_turns_a_switch_on(tmp_path, word):
    assert config_mod.load(tmp_path, env={"RELAY_ON_DELIVER_SYSTEM": word}).on_deliver_system is True


@pytest.mark.parametrize("word", ["false", "No", " OFF ", "0", "FALSE"])
def test_each_word_for_false_turns_a_switch_off(tmp_path, word):
    assert config_mod.load(tmp_path, env={"RELAY_BOUNCES": word}).bounces is False


def test_a_word_that_is_neither_true_nor_false_is_refused_for_a_switch(tmp_path):
    with pytest.raises(ConfigError, match="'maybe' is not true or false"):
        config_mod.load(tmp_path, env={"RELAY_BOUNCES": "maybe"})


def test_the_root_and_state_dir_come_from_the_flags_then_the_environment_then_the_defaults(tmp_path, monkeypatch):
    env = {"RELAY_ROOT": str(tmp_path / "env-root"), "RELAY_STATE_DIR": "env-state"}
    assert config_mod.resolve_dirs(str(tmp_path / "flag-root"), "flag-state", env=env) == (
        tmp_path / "flag-root", tmp_path / "flag-root" / "flag-state")
    assert config_mod.resolve_dirs(env=env) == (tmp_path / "env-root", tmp_path / "env-root" / "env-state")
    monkeypatch.chdir(tmp_path)
    assert config_mod.resolve_dirs(env={}) == (tmp_path, None)
    assert config_mod.resolve_dirs(env={"RELAY_STATE_DIR": ""}) == (tmp_path, None)
    assert config_mod.resolve_dirs(state_dir="s", env={"RELAY_ROOT": ""}) == (tmp_path, tmp_path / "s")


@pytest.mark.parametrize("toml, shown", [("state_dir = 5", "5"), ("state_dir = ['a']", "['a']"),
                                         ("state_dir = true", "True")])
def test_a_state_dir_in_relay_toml_that_is_no_text_is_refused_as_no_directory_path(tmp_path, toml, shown):
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay/relay.toml").write_text(toml + "\n")
    with pytest.raises(ConfigError) as e:
        config_mod.load(tmp_path, None, env={})
    assert "bad value for 'state_dir'" in str(e.value) and f"{shown} is not a directory path" in str(e.value)


def test_only_variables_named_relay_something_are_read_or_warned_of(tmp_path):
    default = config_mod.load(tmp_path, env={}).settle
    cfg = config_mod.load(tmp_path, env={"XRELAYSETTLE": "7s", "MY_APPSETTLE": "9s", "PATH": "/usr/bin",
                                         "HOME": "/home/ann", "relay_settle": "3s"})
    assert cfg.settle == default and cfg.warnings == () and cfg.source == "defaults"


def test_a_variable_ending_in_a_federation_key_but_not_named_relay_federation_is_no_federation_key(tmp_path):
    cfg = config_mod.load(tmp_path, env={"RELAY_FEDERATIONXTEAM": "t", "RELAY_ABCDEFGHIJKNODE": "n"})
    assert cfg.federation is None
    assert sorted(w.split(" ")[0] for w in cfg.warnings) == ["RELAY_ABCDEFGHIJKNODE", "RELAY_FEDERATIONXTEAM"]
    assert all("names no relay configuration key" in w for w in cfg.warnings)


def test_a_federation_variable_overrides_its_key_of_relay_toml_and_keeps_the_others(tmp_path):
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay/relay.toml").write_text('[federation]\nteam = "acme"\nnode = "n1"\nheartbeat = "7s"\n')
    fed = config_mod.load(tmp_path, env={"RELAY_FEDERATION_NODE": "n2"}).federation
    assert (fed.team, fed.node, fed.heartbeat) == ("acme", "n2", 7.0)
    fed = config_mod.load(tmp_path, env={}).federation
    assert (fed.team, fed.node, fed.heartbeat) == ("acme", "n1", 7.0)


@pytest.mark.parametrize("value", [[], ["notify", ""], ["notify", "a\0b"], ["notify", 5], "x\0"])
def test_an_on_deliver_list_that_is_empty_or_holds_an_empty_a_nul_or_a_non_string_argument_is_refused(
        tmp_path, value):
    with pytest.raises(ConfigError) as e:
        config_mod.load(tmp_path, env={}, overrides={"on_deliver": value})
    why = "a command cannot hold a NUL byte" if isinstance(value, str) else "is not a command (a string run by /bin/sh"
    assert "bad value for 'on_deliver'" in str(e.value) and why in str(e.value)


def test_with_the_state_dir_given_relay_toml_is_still_the_origin_of_its_other_keys(tmp_path):
    (tmp_path / ".relay").mkdir()
    toml = tmp_path / ".relay/relay.toml"
    toml.write_text('state_dir = "elsewhere"\nsettle = "2s"\n')
    origins = dict(config_mod.load(tmp_path, ".relay", env={}).origins)
    assert origins["settle"] == f"relay.toml ({toml})" and origins["state_dir"] == "flag"
    origins = dict(config_mod.load(tmp_path, None, env={}).origins)
    assert origins["settle"] == origins["state_dir"] == f"relay.toml ({toml})"


@pytest.mark.parametrize("value", ['""', "5", '"dir\\u0007"'])
def test_a_bad_state_dir_in_relay_toml_stops_even_a_verb_that_only_looks(tmp_path, value):
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay/relay.toml").write_text(f'state_dir = {value}\nsettle = "oops"\n')
    with pytest.raises(ConfigError, match="bad value for 'state_dir' in "):
        config_mod.load(tmp_path, None, env={}, strict=False)
    (tmp_path / ".relay/relay.toml").write_text('settle = "oops"\n')
    cfg = config_mod.load(tmp_path, None, env={}, strict=False)         # another bad key: a warning only
    assert any("bad value for 'settle'" in w for w in cfg.warnings)


@pytest.mark.parametrize("text, line", [("retention = \n", "retention ="), ("settle = 5\nsettle = 6\n", "settle = 6")])
def test_a_toml_slip_with_no_value_or_a_valid_one_suggests_no_quoting(tmp_path, text, line):
    (tmp_path / ".relay").mkdir()
    toml = tmp_path / ".relay/relay.toml"
    toml.write_text(text)
    with pytest.raises(ConfigError) as e:
        config_mod.load(tmp_path, env={})
    assert f"line {text.count(chr(10))}: {line} is not TOML (" in str(e.value) and ": write " not in str(e.value)
