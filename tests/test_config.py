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
