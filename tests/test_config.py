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
