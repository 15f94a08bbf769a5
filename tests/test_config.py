import pytest

from relay import config as config_mod
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
    ("retention = ", "cannot read"),
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
    cfg = config_mod.load(tmp_path, env={"RELAY_AGENTS_DIR": "x", "RELAY_AGENT": "Ann", "RELAY_ROOT": str(tmp_path),
                                         "RELAY_SETTLE": "1s"})
    assert cfg.settle == 1.0
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
        assert r.exit_code == 1 and r.output == f"Error: the project root {tmp_path / 'afile'} is not a directory\n"
    assert CliRunner().invoke(main, ["--root", str(tmp_path / "afile"), "status"]).exit_code == 2     # click's usage
