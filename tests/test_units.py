"""`relay service systemd|launchd`: a unit for this project with this installation's absolute
path (systemd does not search PATH; the README installs into a venv), one instance or label per
project; checked by `systemd-analyze verify` where it is installed. contrib/ holds what the verb
writes for an example project."""
import os
import plistlib
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from relay.operator import units

CONTRIB = Path(__file__).parent.parent / "contrib"
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed here (Debian: "
                                   "apt-get install systemd); the unit's syntax and paths are not verified")


def analyze(path):
    """`systemd-analyze verify` of one unit file (system mode: a user manager needs a session)."""
    return subprocess.run([ANALYZE, "verify", str(path)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, SYSTEMD_LOG_LEVEL="warning"))


@pytest.fixture
def odd_root(tmp_path):
    """A project whose path needs quoting and escaping: a space, a %, a $, a dash."""
    root = tmp_path / "my project-%i $HOME"
    root.mkdir()
    return root


def test_the_systemd_unit_runs_this_installation_for_this_project(cli, odd_root):
    r = cli("--root", str(odd_root), "service", "systemd", "--user")
    unit = r.stdout
    [start] = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    exe = units.command()[0]
    assert os.path.isabs(exe) and start.startswith(f"ExecStart={exe} ")
    assert "%%i $$HOME" in start and f"WorkingDirectory={str(odd_root).replace('%', '%%')}" in unit
    assert "WantedBy=default.target" in unit and "User=" not in unit
    name = units.systemd_name(odd_root)
    assert f"~/.config/systemd/user/{name}" in r.stderr and "systemctl --user daemon-reload && " in r.stderr
    system = cli("--root", str(odd_root), "service", "systemd").stdout
    assert "WantedBy=multi-user.target" in system and "\nUser=" in system


def test_the_instance_name_is_systemd_escape_of_the_path(odd_root):
    name = units.systemd_name(odd_root)
    assert name.startswith("relay@") and "/" not in name and " " not in name
    escape = shutil.which("systemd-escape")
    if escape is None:
        pytest.skip("systemd-escape is not installed here; the escaping was checked by hand only")
    want = subprocess.run([escape, "--path", str(odd_root)], capture_output=True, text=True).stdout.strip()
    assert name == f"relay@{want}.service"
    assert units.escape_path("/tmp/a b/-x.y/.z") == "tmp-a\\x20b-\\x2dx.y-.z"


@needs_analyze
def test_systemd_analyze_verifies_the_units_and_refuses_the_old_one(cli, odd_root, tmp_path):
    for flags in (["--user"], []):
        unit = tmp_path / ("user" if flags else "system") / units.systemd_name(odd_root)
        unit.parent.mkdir()
        unit.write_text(cli("--root", str(odd_root), "service", "systemd", *flags).stdout)
        r = analyze(unit)
        assert r.returncode == 0, r.stderr
    # What the README installed before: a bare `relay`, which systemd does not find in a venv.
    old = tmp_path / "old" / units.systemd_name(odd_root)
    old.parent.mkdir()
    old.write_text(unit.read_text().replace(f"ExecStart={units.command()[0]} ", "ExecStart=relay "))
    assert analyze(old).returncode != 0


def test_the_launchd_agent_has_a_label_per_project(cli, odd_root, tmp_path):
    r = cli("--root", str(odd_root), "service", "launchd", "--user")
    doc = plistlib.loads(r.stdout.encode())
    assert doc["ProgramArguments"] == [*units.command(), "--root", str(odd_root), "run"]
    assert os.path.isabs(doc["ProgramArguments"][0]) and doc["WorkingDirectory"] == str(odd_root)
    assert doc["Label"] == units.launchd_label(odd_root) and doc["Label"].startswith("com.relay.my-project-i-home.")
    assert "UserName" not in doc and f"~/Library/LaunchAgents/{doc['Label']}.plist" in r.stderr
    other = tmp_path / "other" / "my project-%i $HOME"
    other.mkdir(parents=True)
    assert units.launchd_label(other) != doc["Label"]             # same name, another project
    system = plistlib.loads(cli("--root", str(odd_root), "service", "launchd").stdout.encode())
    assert "UserName" in system and system["StandardErrorPath"].startswith("/Library/Logs/")


def test_a_root_with_a_control_character_is_refused(cli, tmp_path):
    root = tmp_path / "a\nb"
    root.mkdir()
    r = cli("--root", str(root), "service", "systemd", ok=False)
    assert r.exit_code == 1 and "control character" in r.output and len(r.output.strip().splitlines()) == 1


def test_contrib_holds_what_the_verb_writes_for_an_example_project():
    root, argv = "/home/me/project", ["/home/me/project/.venv/bin/relay"]
    assert (CONTRIB / units.systemd_name(root)).read_text() == units.systemd(argv, root, user=True)
    mac, mac_argv = "/Users/me/project", ["/Users/me/project/.venv/bin/relay"]
    plist = CONTRIB / f"{units.launchd_label(mac)}.plist"
    assert plist.read_text() == units.launchd(mac_argv, mac, user=True, home="/Users/me")
    assert sorted(p.name for p in CONTRIB.iterdir()) == sorted(["AGENT_SNIPPET.md", plist.name, units.systemd_name(root)])


def effective(unit):
    """What systemd makes of a unit file: `systemd-analyze verify` at debug level dumps the unit
    as loaded ({setting: value}, the ExecStart command line as "Command Line"), and its log."""
    r = subprocess.run([ANALYZE, "verify", str(unit)], capture_output=True, text=True, timeout=60,
                       errors="surrogateescape", env=dict(os.environ, SYSTEMD_LOG_LEVEL="debug"))
    settings, inside = {}, False
    for line in (r.stdout + r.stderr).splitlines():
        if line.startswith("\t-> Unit "):
            inside = line == f"\t-> Unit {unit.name}:"
        elif inside and line.startswith("\t\t") and ": " in line:
            key, _, value = line.strip().partition(": ")
            settings.setdefault(key, value)
    return r, settings


HOSTILE_ROOTS = ["ends in a backslash\\", "two\\\\", "mid\\dle", "x\\\nnot", "spec %h %i %%", "$HOME ${X} $$",
                 "quo\"tes' and ;#", "été 😀 ünïcode", " lead", "-dash", "~tilde", "tab\there"]


@needs_analyze
@pytest.mark.parametrize("name", [n for n in HOSTILE_ROOTS if "\n" not in n and "\t" not in n])
def test_systemd_loads_the_unit_of_a_hostile_path_as_written(cli, tmp_path, name):
    root = tmp_path / name
    root.mkdir()
    unit = tmp_path / "units" / units.systemd_name(root)
    unit.parent.mkdir()
    unit.write_text(cli("--root", str(root), "service", "systemd").stdout)
    r, loaded = effective(unit)
    assert r.returncode == 0, r.stderr[-3000:]
    for complaint in ("Unknown key", "not UTF-8", "Invalid", "Ignoring", "ignoring", "Failed to"):
        assert complaint not in "\n".join(ln for ln in r.stderr.splitlines() if unit.name in ln), r.stderr[-3000:]
    assert loaded["WorkingDirectory"] in (str(root), f"{root}/")
    assert loaded["Restart"] == "on-failure" and loaded["WatchdogSec"] == "30s"
    assert loaded["Description"] in (f"relay outbox daemon for {root}", f"relay outbox daemon for {root}/")
    # systemd shows the command line quoted for a shell, `$` unexpanded (`$$` is one `$` when it runs)
    words = subprocess.run(["sh", "-c", "printf '%s\\0' " + loaded["Command Line"]], capture_output=True,
                           text=True, check=True).stdout.split("\0")[:-1]
    assert [w.replace("$$", "$") for w in words] == [*units.command(), "--root", str(root), "run"]


@pytest.mark.parametrize("manager", ["systemd", "launchd"])
@pytest.mark.parametrize("name, why", [(os.fsdecode(b"latin1-\xe9"), "is not valid UTF-8"),
                                       ("c1-\x9b2J", "a control character or bidi control"),
                                       ("bidi-\u202egnp.exe", "a control character or bidi control"),
                                       ("line\u2028sep", "a control character or bidi control"),
                                       ("nul-less\x7fdel", "a control character or bidi control")])
def test_a_path_a_unit_cannot_hold_is_refused_with_one_line(cli, tmp_path, manager, name, why):
    root = os.path.join(os.fsencode(tmp_path), os.fsencode(name))
    os.mkdir(root)
    r = cli("--root", os.fsdecode(root), "service", manager, ok=False)
    assert r.exit_code == 1 and r.stdout == "", r.output
    [line] = r.stderr.splitlines()
    assert why in line and "a service unit cannot name it" in line, line


@pytest.mark.parametrize("name", HOSTILE_ROOTS[:-1] + ["<xml> & <\\plist>", "]]>"])
def test_the_launchd_plist_of_a_hostile_path_is_xml_that_reads_back_the_same(cli, tmp_path, name):
    import xml.dom.minidom
    root = tmp_path / name.replace("\n", "_")
    root.mkdir()
    text = cli("--root", str(root), "service", "launchd", "--user").stdout
    xml.dom.minidom.parseString(text.encode())          # well-formed
    doc = plistlib.loads(text.encode())
    assert doc["WorkingDirectory"] == str(root) and doc["ProgramArguments"][-2:] == [str(root), "run"]


def test_a_systemd_unit_for_a_path_ending_in_a_space_names_that_path(tmp_path):
    """systemd strips the white space that ends a value: `WorkingDirectory=/p/my project ` named
    /p/my project, another directory (or none: the unit failed to start). No line of the unit
    may rely on white space at its end; ExecStart quotes the path and carries it whole."""
    from relay.operator import units
    root = tmp_path / "my project "
    root.mkdir()
    unit = units.systemd(["/usr/bin/relay"], root, user=True)
    assert all(line == line.rstrip() for line in unit.splitlines()), unit
    [start] = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert f'--root "{root}" run' in start


# -- which relay a unit runs, on a file system laid out by hand (pyfakefs): a venv and a system
#    install side by side, without touching the machine's own ---------------------------------------

def test_a_unit_runs_the_relay_script_beside_the_interpreter_only_when_it_can_be_run(fs, monkeypatch):
    fs.create_file("/opt/venv/bin/python3")
    monkeypatch.setattr(sys, "executable", "/opt/venv/bin/python3")
    assert units.command() == ["/opt/venv/bin/python3", "-P", "-m", "relay"]       # no script there
    fs.create_file("/opt/venv/bin/relay", st_mode=stat.S_IFREG | 0o644)
    assert units.command() == ["/opt/venv/bin/python3", "-P", "-m", "relay"]       # not executable
    os.chmod("/opt/venv/bin/relay", 0o755)
    assert units.command() == ["/opt/venv/bin/relay"]
    [start] = [line for line in units.systemd(units.command(), "/srv/proj").splitlines()
               if line.startswith("ExecStart=")]
    assert start == "ExecStart=/opt/venv/bin/relay --root /srv/proj run"


def test_a_venv_is_known_by_its_interpreters_path_not_where_its_link_leads(fs, monkeypatch):
    """A venv's python is a link to the system's; the relay installed beside the system's python
    is another installation, and a unit naming it would run that one."""
    fs.create_file("/usr/bin/python3.11", st_mode=stat.S_IFREG | 0o755)
    fs.create_file("/usr/bin/relay", st_mode=stat.S_IFREG | 0o755)
    fs.create_symlink("/opt/venv/bin/python3", "/usr/bin/python3.11")
    monkeypatch.setattr(sys, "executable", "/opt/venv/bin/python3")
    assert units.command() == ["/opt/venv/bin/python3", "-P", "-m", "relay"]
    unit = units.systemd(units.command(), "/srv/proj")
    assert "ExecStart=/opt/venv/bin/python3 -P -m relay --root /srv/proj run" in unit.splitlines()


def test_the_root_directory_escapes_to_a_dash_and_a_leading_dot_is_escaped():
    assert units.escape_path("/") == "-"
    assert units.escape_path("//") == "-"
    assert units.escape_path("/.hidden/x") == "\\x2ehidden-x"
    assert units.escape_path("/a/./b/../c/") == "a-c"


def test_a_systemd_unit_name_of_255_characters_is_made_and_one_of_256_is_refused_naming_the_path():
    from relay.errors import RelayError
    longest = "/" + "a" * (255 - len("relay@") - len(".service"))
    assert len(units.systemd_name(longest)) == 255
    with pytest.raises(RelayError, match=r"^the project path '/a{242}' is too long for a systemd unit name \(255 "
                                         r"bytes at most\)$"):
        units.systemd_name(longest + "a")
    # each byte escaped counts four characters: an 'é' (two bytes) eight
    assert len(units.systemd_name("/" + "\u00e9" * 30)) == 6 + 30 * 8 + 8 == 254
    with pytest.raises(RelayError, match="too long for a systemd unit name"):
        units.systemd_name("/" + "\u00e9" * 31)


def test_an_instance_name_keeps_colons_underscores_and_inner_dots_and_escapes_non_ascii_letters():
    assert units.escape_path("/srv/a_b:c.d/é1") == "srv-a_b:c.d-\\xc3\\xa91"
    assert units.escape_path("/srv/Ab9") == "srv-Ab9"
    assert units.escape_path("/srv/a+b") == "srv-a\\x2bb"


def test_a_launchd_label_slugs_the_directorys_name_and_falls_back_to_project():
    import hashlib

    def tail(root):
        return hashlib.sha256(root.encode()).hexdigest()[:8]
    assert units.launchd_label("/tmp/My Proj!") == f"com.relay.my-proj.{tail('/tmp/My Proj!')}"
    assert units.launchd_label("/tmp/___") == f"com.relay.project.{tail('/tmp/___')}"
    assert units.launchd_label("/") == f"com.relay.project.{tail('/')}"
