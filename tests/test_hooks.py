"""The on_deliver hook (relay/hooks.py): its environment, once per new delivery and only once
durable, off the delivery path (a hook that fails, hangs or floods the queue delays nothing),
killed with its process group past its limit or at stop, and the configuration keys."""
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from relay import config as config_mod
from relay.errors import ConfigError
from relay.core.hooks import OUTPUT_TAIL, VALUE_MAX, Hooks

from conftest import failing_create
from test_daemon_e2e import daemon, rename_in, wait_for  # noqa: F401 - daemon is a fixture

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# Writes the hook's environment, working directory, stdin and open descriptors as JSON, one
# file per envelope: out/<id>.<recipient>.json
DUMP = ("import json, os, sys; d = sys.argv[1]; "
        "fds = {f: os.path.realpath(f'/proc/self/fd/{f}') for f in os.listdir('/proc/self/fd')}; "
        "doc = {'env': dict(os.environ), 'cwd': os.getcwd(), 'stdin': os.path.realpath('/proc/self/fd/0'), "
        "'fds': fds}; "
        "open(os.path.join(d, os.environ['RELAY_MESSAGE_ID'] + '.' + os.environ['RELAY_RECIPIENT'] + '.json'), "
        "'w').write(json.dumps(doc))")


@pytest.fixture
def project(project):
    """The project, whose relays' hooks are killed at the end, whatever the test left running."""
    yield project
    for relay in project.relays:
        relay.hooks.stop(0)


@pytest.fixture
def leftovers():
    """Pids of hook processes a daemon test started: killed at the end should the test fail
    before relay killed them (a daemon killed by the fixture leaves its hooks behind)."""
    pids = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def drop(relay, project, sender, name, text):
    """A message into an outbox, with the watcher's hint that the step looks at it."""
    project.drop(sender, name, text)
    relay.hint("file", sender, name)


def started(fifo):
    """The line a hook wrote into the FIFO: blocks until a hook has started (the test's time
    limit bounds it), so nothing sleeps to wait for it."""
    with open(fifo) as f:
        return f.readline().split()


def gone(pid, timeout=5.0):
    """Whether a process has died (absent or a zombie): waits, at most `timeout`, for the kernel
    to finish a SIGKILL already sent."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X") or time.monotonic() > deadline:
            return state in ("Z", "X")
        time.sleep(0.01)


def lines(path):
    return sorted(path.read_text().splitlines()) if path.exists() else []


@linux
def test_a_hook_gets_the_delivery_in_its_environment(project, monkeypatch):
    out = project.root / "out"
    out.mkdir()
    monkeypatch.setenv("HOOK_TEST_INHERITED", "yes")
    relay = project.relay(on_deliver=[sys.executable, "-c", DUMP, str(out)])
    project.drop("Ann", "m", "TO: Ben, Cy\nTHREAD: t-1\nSUBJECT: tests are green\nPRIORITY: urgent\n\nbody")
    assert relay.step().archived == 1
    assert relay.hooks.join(30)
    mid = project.inbox("Ben")[0]["id"]
    for who in ("Ben", "Cy"):
        doc = json.loads((out / f"{mid}.{who}.json").read_text())
        env = doc["env"]
        assert {k: env[k] for k in env if k.startswith("RELAY_")} == {
            "RELAY_MESSAGE_ID": mid, "RELAY_SENDER": "Ann", "RELAY_RECIPIENT": who,
            "RELAY_ENVELOPE": str(project.state / "inbox" / who / "new" / f"{mid}.json"),
            "RELAY_SUBJECT": "tests are green", "RELAY_THREAD": "t-1", "RELAY_KIND": "message",
            "RELAY_PRIORITY": "urgent", "RELAY_ROOT": str(project.root), "RELAY_STATE_DIR": str(project.state)}
        assert json.loads(open(env["RELAY_ENVELOPE"]).read())["id"] == mid
        assert env["HOOK_TEST_INHERITED"] == "yes"
        assert doc["cwd"] == str(project.root) and doc["stdin"] == "/dev/null"
        # Nothing of relay's is inherited: not the ledger, not the lock, not a directory of the state.
        assert not [p for p in doc["fds"].values() if str(project.state) in p], doc["fds"]
    assert (relay.hooks.ran, relay.hooks.failed, relay.hooks.killed, relay.hooks.dropped) == (2, 0, 0, 0)


def test_a_string_runs_under_the_shell_and_agent_text_is_made_plain(project):
    log = project.root / "hooks.log"
    relay = project.relay(on_deliver=f'printf "%s|%s|%s\\n" "$RELAY_RECIPIENT" "$RELAY_SUBJECT" "$RELAY_THREAD" >> {log}')
    subject = "line one\nrm -rf ~\r\x00\x1b[2J" + "x" * 5000
    project.drop("Ann", "m.json", json.dumps({"to": "Ben", "subject": subject, "thread": "a\tb", "body": "x"}))
    assert relay.step().archived == 1 and relay.hooks.join(30)
    [line] = lines(log)
    recipient, shown_subject, thread = line.split("|")
    assert recipient == "Ben" and thread == "a b"
    assert shown_subject.startswith("line one rm -rf ~   [2Jx") and len(shown_subject) == VALUE_MAX
    assert project.inbox("Ben")[0]["subject"] == subject        # the envelope keeps what was sent


@linux
def test_c1_controls_and_bidi_overrides_arrive_as_spaces_in_every_variable(project):
    out = project.root / "out"
    out.mkdir()
    relay = project.relay(on_deliver=[sys.executable, "-c", DUMP, str(out)])
    nasty = "\x9b\x9d\x9c\x85\x80\x9f\u202e\u202a\u202b\u202c\u202d\u2066\u2067\u2068\u2069\u200e\u200f\u061c\u2028\u2029\x7f\x1b"
    project.drop("Ann", "m.json", json.dumps({"to": "Ben", "subject": "a" + nasty + "b", "thread": "t" + nasty,
                                              "kind": "k.v-1_x", "body": "x"}))
    # a kind is a plain token: the same characters in a kind fail that message, and no hook runs for it
    project.drop("Ann", "k.json", json.dumps({"to": "Ben", "subject": "s", "kind": "k" + nasty, "body": "x"}))
    counts = relay.step()
    assert (counts.archived, counts.failed) == (1, 1) and relay.hooks.join(30)
    [refused] = relay.history.audit(status="failed")
    assert refused["name"] == "k.json" and "is not a plain token: it holds U+009B" in refused["error"]
    [doc] = [json.loads(p.read_text()) for p in out.iterdir()]
    env = {k: v for k, v in doc["env"].items() if k.startswith("RELAY_")}
    blank = " " * len(nasty)
    assert (env["RELAY_SUBJECT"], env["RELAY_THREAD"], env["RELAY_KIND"]) == ("a" + blank + "b", "t" + blank,
                                                                              "k.v-1_x")
    for name, value in env.items():
        assert not [c for c in value if c < " " or "\x7f" <= c <= "\x9f" or c in nasty], name


@linux
def test_a_hook_gets_none_of_the_service_manager_s_variables(project, monkeypatch):
    """relay's own line to systemd (NOTIFY_SOCKET, the watchdog's) is not handed to a command
    relay.toml names: a hook cannot say READY, STOPPING or ping the watchdog in relay's name."""
    out = project.root / "out"
    out.mkdir()
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"):
        monkeypatch.setenv(name, "@relay-test")
    relay = project.relay(on_deliver=[sys.executable, "-c", DUMP, str(out)])
    project.drop("Ann", "m", "TO: Ben\n\nhello")
    assert relay.step().archived == 1 and relay.hooks.join(30)
    [doc] = [json.loads(p.read_text()) for p in out.iterdir()]
    assert not {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID",
                "LISTEN_FDNAMES"} & set(doc["env"])
    assert doc["env"]["RELAY_RECIPIENT"] == "Ben"


def test_a_failing_hook_is_logged_and_the_delivery_stands(project, caplog):
    relay = project.relay(on_deliver="echo 'no such pane' >&2; exit 3")
    project.drop("Ann", "m", "TO: Ben\n\nhello")
    with caplog.at_level("DEBUG", logger="relay"):
        assert relay.step().archived == 1
        assert relay.hooks.join(30)
    mid = project.inbox("Ben")[0]["id"]
    assert relay.history.get(mid)["status"] == "archived"
    [line] = [r.getMessage() for r in caplog.records if "on_deliver" in r.getMessage()]
    assert line == f"{mid}: on_deliver for Ben (from Ann) failed with exit status 3; output: no such pane"
    assert (relay.hooks.ran, relay.hooks.failed) == (0, 1)


def test_a_hook_that_cannot_start_is_logged(project, caplog):
    relay = project.relay(on_deliver=[str(project.root / "no-such-hook")])
    project.drop("Ann", "m", "TO: Ben\n\nhello")
    with caplog.at_level("WARNING", logger="relay"):
        assert relay.step().archived == 1
        assert relay.hooks.join(30)
    assert any("on_deliver for Ben (from Ann) could not start" in r.getMessage() and "no-such-hook" in r.getMessage()
               for r in caplog.records)
    assert relay.hooks.failed == 1 and len(project.inbox("Ben")) == 1


def test_output_is_kept_bounded_and_on_one_line(project, caplog):
    relay = project.relay(on_deliver="head -c 3000000 /dev/zero | tr '\\0' x; printf '\\nforged line\\nEND'; exit 1")
    project.drop("Ann", "m", "TO: Ben\n\nhello")
    with caplog.at_level("WARNING", logger="relay"):
        relay.step()
        assert relay.hooks.join(30)
    [line] = [r.getMessage() for r in caplog.records if "on_deliver" in r.getMessage()]
    assert line.endswith("xx\\x0aforged line\\x0aEND") and "\n" not in line
    assert len(line) < OUTPUT_TAIL + 200


@linux
def test_a_hook_that_hangs_delays_no_delivery_and_is_killed_at_stop(project, caplog):
    """Each hook starts a child, tells the test both pids through a FIFO, and waits forever."""
    fifo = project.root / "started"
    os.mkfifo(fifo)
    relay = project.relay(on_deliver=f'sleep 600 & echo $$ $! > {fifo}; wait', on_deliver_timeout="10m")
    project.drop("Ann", "m1", "TO: Ben\n\none")
    assert relay.step().archived == 1
    first = [int(p) for p in started(fifo)]
    drop(relay, project, "Ann", "m2", "TO: Cy\n\ntwo")
    assert relay.step().archived == 1           # while the first hook still runs
    assert not gone(first[0], timeout=0) and relay.hooks.pending == 2
    second = [int(p) for p in started(fifo)]
    assert relay.history.counts()["archived"] == 2 and len(project.inbox("Ben")) == len(project.inbox("Cy")) == 1
    deadline = time.monotonic() + 10     # the shell may write the FIFO before Popen returns to the worker
    while len(relay.hooks.running()) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert sorted(d.recipient for d in relay.hooks.running()) == ["Ben", "Cy"]
    with caplog.at_level("INFO", logger="relay"):
        relay.hooks.stop(0)
    assert all(gone(pid) for pid in first + second)     # the whole process group of each
    assert relay.hooks.killed == 2 and relay.hooks.pending == 0
    assert sum("killed at relay's stop" in r.getMessage() for r in caplog.records) == 2
    drop(relay, project, "Ann", "m3", "TO: Ben\n\nafter the stop")
    assert relay.step().archived == 1 and relay.hooks.pending == 0      # delivered; no hook after stop


@linux
def test_a_hook_past_its_time_limit_is_killed_with_its_group(project, caplog):
    fifo = project.root / "started"
    os.mkfifo(fifo)
    relay = project.relay(on_deliver=f'sleep 600 & echo $$ $! > {fifo}; echo waiting; wait',
                          on_deliver_timeout="300ms")
    project.drop("Ann", "m", "TO: Ben\n\nhello")
    with caplog.at_level("WARNING", logger="relay"):
        assert relay.step().archived == 1
        pids = [int(p) for p in started(fifo)]
        assert relay.hooks.join(30)
    assert all(gone(pid) for pid in pids)
    mid = project.inbox("Ben")[0]["id"]
    [line] = [r.getMessage() for r in caplog.records if "on_deliver" in r.getMessage()]
    assert line == (f"{mid}: on_deliver for Ben (from Ann) ran past its time limit of 0.3s: killed with its "
                    "process group; output: waiting")
    assert relay.hooks.killed == 1 and relay.history.get(mid)["status"] == "archived"


@linux
def test_a_hook_ends_when_its_process_does_not_when_a_child_lets_go_of_its_output(project):
    fifo = project.root / "started"
    os.mkfifo(fifo)
    relay = project.relay(on_deliver=f'sleep 600 & echo $! > {fifo}; exit 0', on_deliver_timeout="10m")
    project.drop("Ann", "m", "TO: Ben\n\nhello")
    relay.step()
    [child] = [int(p) for p in started(fifo)]
    try:
        assert relay.hooks.join(30)                 # not the child's 600 s, nor the 10 min limit
        assert relay.hooks.ran == 1 and relay.hooks.killed == 0
        assert not gone(child, timeout=0)           # a hook's own child is left alone after success
    finally:
        os.kill(child, 9)


@linux
def test_a_flood_past_the_bound_is_dropped_counted_and_logged_once(project, caplog):
    fifo = project.root / "started"
    os.mkfifo(fifo)
    agents = [f"A{i}" for i in range(8)]
    relay = project.relay(agents=["Ann", *agents], on_deliver=f"echo $$ > {fifo}; exec sleep 600",
                          on_deliver_timeout="10m")
    relay.hooks = Hooks(relay.config, workers=1, limit=3)
    project.drop("Ann", "m", f"TO: {', '.join(agents)}\n\nto everyone")
    with caplog.at_level("INFO", logger="relay"):
        assert relay.step().archived == 1
        assert all(len(project.inbox(a)) == 1 for a in agents)
        [pid] = started(fifo)                               # the first runs, two wait
        assert relay.hooks.pending == 3 and relay.hooks.dropped == 5
        relay.hooks.stop(0)
    assert gone(int(pid))
    messages = [r.getMessage() for r in caplog.records if "on_deliver" in r.getMessage()]
    drops = [m for m in messages if "dropped" in m]
    assert len(drops) == 3, drops       # the first drop, the queued ones at stop, the rest in one line
    assert drops[0].endswith("on_deliver for A3 dropped: 3 hooks are waiting or running (the limit); "
                             "1 dropped since the last such line, 1 in all")
    assert drops[1].startswith("on_deliver: 2 queued hook(s) dropped at stop: ")
    assert drops[2] == "on_deliver: 4 more hook(s) dropped while the queue was full (7 in all)"
    assert (relay.hooks.killed, relay.hooks.dropped, relay.hooks.pending) == (1, 7, 0)


def test_a_retry_fires_only_for_the_recipients_it_adds(project, clock):
    log = project.root / "hooks.log"
    relay = project.relay(on_deliver=f'echo "$RELAY_MESSAGE_ID $RELAY_RECIPIENT" >> {log}')
    switch = failing_create(relay, PermissionError(13, "Permission denied"), lambda rel: rel.startswith("inbox/Cy/"))
    project.drop("Ann", "m", "TO: Ben, Cy\n\nhello")
    assert relay.step().retried == 1 and relay.hooks.join(30)
    mid = project.inbox("Ben")[0]["id"]
    assert lines(log) == [f"{mid} Ben"]
    switch["on"] = False
    clock.advance(60)
    assert relay.step().archived == 1 and relay.hooks.join(30)
    assert lines(log) == [f"{mid} Ben", f"{mid} Cy"]


def test_a_hook_fires_only_once_the_delivery_is_recorded(project):
    """The batch's record fails after the links into new/: no hook. The next start finds the
    envelopes, records them, and fires each recipient's hook once."""
    log = project.root / "hooks.log"
    hook = f'echo "$RELAY_MESSAGE_ID $RELAY_RECIPIENT" >> {log}'
    relay = project.relay(on_deliver=hook)
    project.drop("Ann", "m", "TO: Ben, Cy\n\nhello")

    def crashed(*a, **k):
        raise sqlite3.OperationalError("disk I/O error")

    relay.ledger.messages.record = crashed
    with pytest.raises(sqlite3.OperationalError):
        relay.step()
    assert relay.hooks.pending == 0 and len(project.inbox("Ben")) == 1
    relay.close()
    again = project.relay(on_deliver=hook)
    again.recover()
    again.step()
    again.step()
    assert again.hooks.join(30)
    mid = project.inbox("Ben")[0]["id"]
    assert again.history.get(mid)["status"] == "archived"
    assert lines(log) == [f"{mid} Ben", f"{mid} Cy"]


def test_a_fault_while_queueing_hooks_does_not_fail_the_step(project, caplog):
    relay = project.relay(on_deliver="true")

    def broken(delivery):
        raise RuntimeError("can't start new thread")

    relay.hooks.fire = broken
    project.drop("Ann", "m", "TO: Ben\n\nhello")
    with caplog.at_level("ERROR", logger="relay"):
        counts = relay.step()
    assert counts.archived == 1 and relay.failures == 0
    assert [r.getMessage() for r in caplog.records] == ["on_deliver: hooks of this batch not queued"]


def test_system_gets_a_hook_only_when_asked(project):
    log = project.root / "hooks.log"
    hook = f'echo "$RELAY_RECIPIENT $RELAY_KIND" >> {log}'
    relay = project.relay(on_deliver=hook)
    project.drop("Ann", "spawn", "NAME: Dee\nCLI: claude\n\nstart")
    assert relay.step().archived == 1 and relay.hooks.join(30)
    assert len(project.inbox("System")) == 1 and lines(log) == []
    relay.reconfigure(project.config(agents=["Ann", "Ben", "Cy"], on_deliver=hook, on_deliver_system=True))
    drop(relay, project, "Ann", "spawn", "NAME: Eve\nCLI: claude\n\nstart")
    assert relay.step().archived == 1 and relay.hooks.join(30)
    assert lines(log) == ["System spawn"]


def test_a_reload_takes_the_new_command(project):
    relay = project.relay()
    project.drop("Ann", "m1", "TO: Ben\n\nbefore")
    relay.step()
    assert relay.hooks.pending == 0 and relay.hooks.ran == 0     # no command: nothing queued
    log = project.root / "hooks.log"
    relay.reconfigure(project.config(agents=["Ann", "Ben", "Cy"], on_deliver=f'echo "$RELAY_SENDER" >> {log}'))
    drop(relay, project, "Cy", "m2", "TO: Ben\n\nafter")
    relay.step()
    assert relay.hooks.join(30) and lines(log) == ["Cy"]
    relay.reconfigure(project.config(agents=["Ann", "Ben", "Cy"]))
    drop(relay, project, "Ann", "m3", "TO: Ben\n\noff again")
    relay.step()
    assert relay.hooks.join(30) and lines(log) == ["Cy"]


def test_run_once_waits_for_its_hooks(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    log = cli.root / "hooks.log"
    (cli.state / "relay.toml").write_text(f"on_deliver = 'sleep 0.2; echo \"$RELAY_RECIPIENT\" >> {log}'\n")
    cli("send", "--from", "Ann", "--to", "Ben", "hello")
    cli("run", "--once", "-q")
    assert lines(log) == ["Ben"]        # the hook ended before run --once did


def test_run_once_kills_a_hook_past_its_limit(cli):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    (cli.state / "relay.toml").write_text("on_deliver = 'exec sleep 600'\non_deliver_timeout = '200ms'\n")
    cli("send", "--from", "Ann", "--to", "Ben", "hello")
    result = cli("run", "--once", "-q")
    assert "relayed 1 message(s)" in result.output
    assert "ran past its time limit of 0.2s: killed with its process group" in result.output


def readme_hook():
    """The on_deliver example of docs/agents.md's "Waking agents" section."""
    readme = (Path(__file__).parent.parent / "docs" / "agents.md").read_text()
    section = readme.split("## Waking agents", 1)[1].split("\n## ", 1)[0]
    toml = section.split("```toml\n", 1)[1].split("```", 1)[0]
    return tomllib.loads(toml)["on_deliver"]


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_the_readme_tmux_hook_types_into_the_agent_s_window(project):
    """A tmux server of the test's own, its socket in the test's directory; Ben's window reads
    one line, writes it to a file and signals the test through tmux's wait-for."""
    sock, typed = project.root / "tmux.sock", project.root / "typed"
    tmux = ["tmux", "-S", str(sock), "-f", "/dev/null"]
    pane = f"read line; printf '%s\\n' \"$line\" > {typed}; tmux -S {sock} wait-for -S typed; sleep 600"
    subprocess.run(tmux + ["new-session", "-d", "-s", "agents", "-n", "Ben", "-x", "250", "-y", "10", pane], check=True)
    try:
        relay = project.relay(on_deliver=readme_hook().replace("tmux ", f"tmux -S {sock} "))
        project.drop("Ann", "m", "TO: Ben\nSUBJECT: review\n\nplease look")
        assert relay.step().archived == 1 and relay.hooks.join(30)
        assert relay.hooks.ran == 1
        subprocess.run(tmux + ["wait-for", "typed"], check=True, timeout=30)
        mid = project.inbox("Ben")[0]["id"]
        assert typed.read_text() == f"New message {mid} from Ann; read it with: relay inbox Ben --ack\n"
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True)


# -- the daemon --------------------------------------------------------------------------


HANG = "on_deliver = 'sleep 600 & echo $$ $! > {fifo}; wait'\non_deliver_timeout = '10m'\n"


@linux
def test_the_daemon_reloads_the_command_and_kills_hooks_at_a_graceful_stop(daemon, tmp_path, leftovers):
    fifo, log = tmp_path / "started", tmp_path / "hooks.log"
    os.mkfifo(fifo)
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay/relay.toml").write_text(HANG.format(fifo=fifo))
    d = daemon()
    d.ready()
    rename_in(d.state / "outbox" / "Ann", "m1", "TO: Ben\n\nwake up")
    pids = [int(p) for p in started(fifo)]
    leftovers.extend(pids)
    (d.state / "relay.toml").write_text(f"on_deliver = 'echo \"$RELAY_RECIPIENT\" >> {log}'\n"
                                        "on_deliver_timeout = '1s'\n")
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "configuration reloaded" in d.log(), what="the new command loaded")
    rename_in(d.state / "outbox" / "Ann", "m2", "TO: Cy\n\nand you")
    wait_for(lambda: lines(log) == ["Cy"], what="the new command's hook")
    code, err = d.stop()        # waits a second past the new 1s limit for the first hook, then kills it
    assert code == 0, err
    assert all(gone(pid) for pid in pids)
    assert "waiting up to 2s for 1 on_deliver hook(s)" in err and "killed at relay's stop" in err
    assert len(d.inbox("Ben")) == len(d.inbox("Cy")) == 1


@linux
def test_a_second_signal_kills_the_running_hooks(daemon, tmp_path, leftovers):
    fifo = tmp_path / "started"
    os.mkfifo(fifo)
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay/relay.toml").write_text(HANG.format(fifo=fifo))
    d = daemon()
    d.ready()
    rename_in(d.state / "outbox" / "Ann", "m1", "TO: Ben\n\nwake up")
    pids = [int(p) for p in started(fifo)]
    leftovers.extend(pids)
    d.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "waiting up to 30s for 1 on_deliver hook(s)" in d.log(), what="the graceful stop")
    code, err = d.stop()
    assert code == 1, err
    assert all(gone(pid) for pid in pids)


# -- configuration ------------------------------------------------------------------------


def test_hook_keys_from_toml_env_and_flags(tmp_path):
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay/relay.toml").write_text("on_deliver = ['tmux', 'send-keys', '-t', 'x']\n"
                                                "on_deliver_timeout = '5s'\n")
    cfg = config_mod.load(tmp_path, env={})
    assert (cfg.on_deliver, cfg.on_deliver_timeout, cfg.on_deliver_system) == (("tmux", "send-keys", "-t", "x"), 5, False)
    cfg = config_mod.load(tmp_path, env={"RELAY_ON_DELIVER": "wake.sh", "RELAY_ON_DELIVER_SYSTEM": "yes"})
    assert (cfg.on_deliver, cfg.on_deliver_system) == ("wake.sh", True)
    assert config_mod.load(tmp_path, env={"RELAY_ON_DELIVER": ""}).on_deliver is None      # turned off
    assert config_mod.load(tmp_path, env={}, overrides={"on_deliver_timeout": "1m"}).on_deliver_timeout == 60
    assert config_mod.load(tmp_path, env={}).on_deliver is not None
    assert config_mod.load(tmp_path / "elsewhere", env={}).on_deliver is None   # the default: none


def test_a_hook_s_variables_are_not_configuration(tmp_path):
    """A hook that runs relay inherits RELAY_MESSAGE_ID and the rest: they are not keys."""
    env = {"RELAY_MESSAGE_ID": "01J", "RELAY_SENDER": "Ann", "RELAY_RECIPIENT": "Ben", "RELAY_ENVELOPE": "/x",
           "RELAY_SUBJECT": "s", "RELAY_THREAD": "", "RELAY_KIND": "message", "RELAY_ROOT": str(tmp_path),
           "RELAY_STATE_DIR": str(tmp_path / ".relay")}
    assert config_mod.load(env=env).state_dir == tmp_path / ".relay"


@pytest.mark.parametrize("toml,match", [
    ("on_deliver = 5", "bad value for 'on_deliver'.*not a command"),
    ("on_deliver = []", "bad value for 'on_deliver'"),
    ("on_deliver = ['tmux', '']", "bad value for 'on_deliver'"),
    ("on_deliver = ['tmux', 3]", "bad value for 'on_deliver'"),
    ("on_deliver = \"a\\u0000b\"", "bad value for 'on_deliver'.*NUL"),
    ("on_deliver_timeout = '0s'", "bad value for 'on_deliver_timeout'.*longer than 0s"),
    ("on_deliver_timeout = 'soon'", "bad value for 'on_deliver_timeout'"),
    ("on_deliver_system = 'maybe'", "bad value for 'on_deliver_system'.*not true or false"),
    ("on_delivery = 'x'", "unknown configuration key 'on_delivery'"),
])
def test_bad_hook_values_name_the_key(tmp_path, toml, match):
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay/relay.toml").write_text(toml)
    with pytest.raises(ConfigError, match=match):
        config_mod.load(tmp_path, env={})
