"""Guards at relay's edges: agent names that are paths, System as a sender, `sweep --older-than
0s`, a full disk, a damaged ledger, a lock or ledger removed under a running daemon, and the
operator verbs that wake a running daemon."""
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from relay import config as config_mod
from relay.core.daemon import Relay
from relay.errors import StateLost
from relay.ledger.history import History
from relay.ledger.ledger import Ledger
from relay.files.lock import DaemonLock
from relay.service import Daemon
from test_daemon_e2e import daemon, rename_in, wait_for  # noqa: F401  (daemon: the fixture)




def tree(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# -- agent names are names, never paths --------------------------------------------------------

def test_inbox_ack_refuses_a_path_for_a_name(cli):
    cli("init", "--agent", "Ann")
    victim = cli.root / "victim"
    for sub in ("tmp", "new", "cur"):
        (victim / sub).mkdir(parents=True)
    (victim / "new" / "m.json").write_text(json.dumps({"id": "m", "body": "not relay's"}))
    r = cli("inbox", "../../victim", "--ack", ok=False)
    assert r.exit_code == 1
    assert r.output.count("\n") == 1 and "invalid agent name '../../victim'" in r.output
    assert tree(victim) == ["cur", "new", "new/m.json", "tmp"]


def test_inbox_refuses_an_inbox_that_leads_outside_the_state_directory(cli):
    cli("init", "--agent", "Ann")
    victim = cli.root / "victim"
    for sub in ("tmp", "new", "cur"):
        (victim / sub).mkdir(parents=True)
    (victim / "new" / "m.json").write_text(json.dumps({"id": "m", "body": "not relay's"}))
    (cli.state / "inbox" / "Evil").symlink_to(victim)
    r = cli("inbox", "Evil", "--ack", ok=False)      # a link is no agent directory
    assert r.exit_code == 1 and "unknown agent 'Evil'" in r.output
    (cli.state / "outbox" / "Evil").mkdir()           # known by its outbox now
    for args in (["inbox", "Evil", "--ack"], ["inbox", "Evil", "--wait", "1"], ["read", "01KC3000000000000000000000", "--agent", "Evil"]):
        r = cli(*args, ok=False)
        assert r.exit_code == 1 and "inbox/Evil is a symbolic link" in r.output and "outside the state directory" in r.output
    assert tree(victim) == ["cur", "new", "new/m.json", "tmp"]


@pytest.mark.parametrize("args, bad", [
    (["inbox", "../x"], "../x"),
    (["inbox", "--all", ".hidden"], ".hidden"),
    (["send", "--from", "../x", "--to", "Ann", "hi"], "../x"),
    (["send", "--from", "Ann", "--to", "Ben,../../x", "hi"], "../../x"),
    (["send", "--from", "Ann", "--to", "a/b", "hi"], "a/b"),
    (["audit", "--from", "../x"], "../x"),
    (["audit", "--to", "x/../../y"], "x/../../y"),
    (["init", "--agent", "Ann", "--agent", "../x"], "../x"),
    (["ping", "../x"], "../x"),
    (["archive-agent", "x/../../y"], "x/../../y"),
])
def test_every_verb_that_takes_an_agent_name_refuses_a_bad_one_before_touching_anything(cli, args, bad):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    before = tree(cli.root)
    r = cli(*args, ok=False)
    assert r.exit_code == 1, r.output
    assert r.output.count("\n") == 1 and f"invalid agent name {bad!r}" in r.output
    assert tree(cli.root) == before


# -- System is never a sender ------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["send", "--from", "System", "--to", "Ann", "spoofed"],
    ["init", "--agent", "System"],
])
def test_system_is_never_a_sender(cli, args):
    cli("init", "--agent", "Ann")
    r = cli(*args, ok=False)
    assert r.exit_code == 1
    assert r.output.count("\n") == 1 and "'System' is a name relay keeps for itself" in r.output
    assert not (cli.state / "outbox" / "System").exists()
    cli("send", "--from", "Ann", "--to", "System", "--kind", "spawn", "to relay")     # as a recipient: fine


# -- sweep --older-than 0s sweeps everything; only the key retention = 0 keeps forever ---------

def relayed_two(cli):
    """One archived and one failed message, relayed just now."""
    cli("init", "--agent", "Ann", "--agent", "Ben")
    cli("send", "--from", "Ann", "--to", "Ben", "kept?")
    (cli.state / "outbox/Ann/to-zed").write_text("TO: Zed\n\nnobody by that name")
    assert "relayed 1 message(s), 1 failed" in cli("run", "--once", "-q").output
    cli("run", "--once", "-q")                                          # the bounce the first pass owes Ann
    status = json.loads(cli("status", "--json", ok=False).stdout)["counts"]
    assert (status["archived"], status["failed"]) == (1 + 1, 1)        # + the failure's bounce to Ann


def test_sweep_older_than_0s_sweeps_everything_even_with_retention_0(cli):
    relayed_two(cli)
    (cli.state / "relay.toml").write_text("retention = 0\n")
    assert "keep forever" in cli("sweep").output
    dry = cli("sweep", "--older-than", "0s", "--dry-run").output
    assert "would delete 2 archived and 1 failed" in dry
    assert "deleted 2 archived and 1 failed" in cli("sweep", "--older-than", "0s").output
    counts = json.loads(cli("status", "--json", ok=False).stdout)["counts"]
    assert counts["archived"] == counts["failed"] == 0
    assert not [p for p in (cli.state / "archive").rglob("*") if p.is_file()]
    assert not [p for p in (cli.state / "failed").rglob("*") if p.is_file()]
    assert "ok" in cli("verify").output                 # the sweep left a checkpoint


def test_retention_0_in_the_configuration_still_keeps_forever(cli):
    relayed_two(cli)
    (cli.state / "relay.toml").write_text("retention = 0\n")
    assert "keep forever" in cli("sweep").output
    cli("run", "--once", "-q")                          # the daemon's sweep too
    counts = json.loads(cli("status", "--json", ok=False).stdout)["counts"]
    assert (counts["archived"], counts["failed"]) == (1 + 1, 1)


# -- a full disk is reported as a full disk ----------------------------------------------------

@pytest.fixture
def ledger_cannot_grow(monkeypatch):
    """Call it, and every ledger connection opened from then on may not grow the database by a
    page: SQLite itself answers SQLITE_FULL, "database or disk is full", as on a full disk."""
    real = sqlite3.connect

    def connect(*args, **kwargs):
        db = real(*args, **kwargs)
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        db.execute(f"PRAGMA max_page_count = {max(pages, 1)}")
        return db
    return lambda: monkeypatch.setattr(sqlite3, "connect", connect)


def test_a_full_disk_under_a_file_is_reported_as_a_full_disk(cli):
    cli("init", "--agent", "Ann")
    r = cli("report", "--html", "/dev/full", ok=False)      # the kernel answers ENOSPC
    assert r.exit_code == 1 and r.output.count("\n") == 1
    assert "the disk is full: No space left on device; free some space" in r.output


def test_a_full_disk_under_the_ledger_is_reported_as_a_full_disk(cli, ledger_cannot_grow):
    ledger_cannot_grow()
    r = cli("init", "--agent", "Ann", ok=False)
    assert r.exit_code == 1 and r.output.count("\n") == 1
    assert f"cannot open the ledger {cli.state / 'ledger.sqlite'}: the disk holding it" in r.output
    assert "is full (database or disk is full); free some space" in r.output and "locked" not in r.output


def test_a_full_disk_while_a_verb_writes_the_ledger_is_reported_as_a_full_disk(cli, ledger_cannot_grow):
    cli("init", "--agent", "Ann", "--agent", "Ben")
    for i in range(100):
        cli("send", "--from", "Ann", "--to", "Ben", f"message {i} " + "x" * 2000)
    ledger_cannot_grow()
    r = cli("run", "--once", "-q", ok=False)
    assert r.exit_code == 1 and r.output.count("\n") == 1
    assert f"the disk holding {cli.state / 'ledger.sqlite'} (or the temporary directory) is full" in r.output
    assert "locked" not in r.output


# -- a corrupt ledger is refused with what happened and what to do -----------------------------

def not_a_database(path):
    path.write_bytes(b"this is not a ledger\n" * 500)


def malformed(path):
    data = bytearray(path.read_bytes())
    data[100:4096] = b"\xa5" * 3996                 # page 1's b-tree (the schema) destroyed
    path.write_bytes(data)


VERBS = [["status"], ["audit"], ["show", "01"], ["retry", "--failed"], ["expire", "01"], ["verify"],
         ["doctor"], ["agents"], ["tail"], ["report", "--html", "r.html"], ["sweep"], ["run", "--once"],
         ["init"]]


@pytest.fixture(scope="module")
def relayed_state(tmp_path_factory):
    """A state directory after 20 messages from Ann to Ben were relayed (built once)."""
    root = tmp_path_factory.mktemp("relayed")
    with Relay(config_mod.load(root, ".relay", env={}, overrides={"agents": ["Ann", "Ben"]})) as relay:
        for i in range(20):
            rename_in(relay.layout.outbox / "Ann", f"m{i}", f"TO: Ben\n\nmessage {i} " + "x" * 1000)
        assert relay.drain(now_fn=lambda: time.time() + 1.0).archived == 20
    return root / ".relay"


@pytest.fixture
def relayed(cli, relayed_state):
    """The relayed state directory in this test's project; returns its ledger's path."""
    shutil.copytree(relayed_state, cli.state)
    assert not (cli.state / "ledger.sqlite-wal").exists()
    return cli.state / "ledger.sqlite"


@pytest.mark.parametrize("damage", [not_a_database, malformed])
@pytest.mark.parametrize("verb", VERBS, ids=lambda v: v[0])
def test_a_corrupt_ledger_is_refused_by_every_verb_with_what_to_do(cli, relayed, damage, verb):
    ledger = relayed
    damage(ledger)
    r = cli(*verb, ok=False)
    assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
    line = r.output
    assert f"the ledger {ledger} is damaged" in line
    assert "the archive and inboxes are intact" in line
    assert f'sqlite3 {ledger} ".recover" | sqlite3 recovered.sqlite' in line and "restore a backup" in line
    assert len(json.loads(cli("inbox", "Ben", "--json").output)) == 20    # the inbox is still there to read


@pytest.mark.parametrize("verb", [["status"], ["audit"], ["doctor"], ["retry", "--failed"]], ids=lambda v: v[0])
def test_a_ledger_damaged_past_its_first_page_is_refused_with_what_to_do(cli, relayed, verb):
    """The ledger opens; the damage shows when a verb reads the table (or doctor checks it)."""
    ledger = relayed
    with sqlite3.connect(ledger) as db:
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        roots = [r[0] for r in db.execute("SELECT rootpage FROM sqlite_master WHERE tbl_name = 'messages'")]
    db.close()
    data = bytearray(ledger.read_bytes())
    for root in roots:                              # the table and its indexes
        start = (root - 1) * page_size
        data[start:start + 8] = b"\xa5" * 8          # the b-tree page header: no such page type
    ledger.write_bytes(data)
    r = cli(*verb, ok=False)
    assert r.exit_code == 1, r.output
    assert f"the ledger {ledger} is damaged" in r.output and "the archive and inboxes are intact" in r.output
    assert ".recover" in r.output


# -- a daemon whose lock or ledger is removed or replaced stops --------------------------------

def test_the_lock_knows_when_it_is_removed_or_replaced(tmp_path):
    path = tmp_path / "relay.lock"
    with DaemonLock(path) as lock:
        assert lock.held()
        os.link(path, tmp_path / "again")
        os.replace(tmp_path / "again", path)        # the same file, moved back: still held
        assert lock.held()
        path.unlink()
        assert not lock.held()
    with DaemonLock(path) as lock:
        (tmp_path / "other").write_text("1\n")
        os.replace(tmp_path / "other", path)
        assert not lock.held()
    assert not lock.held()                          # released


def remove(path):
    path.unlink()


def replace_with_a_copy(path):
    shutil.copyfile(path, f"{path}.copy")
    os.replace(f"{path}.copy", path)


@pytest.mark.parametrize("name", ["relay.lock", "ledger.sqlite"])
@pytest.mark.parametrize("change", [remove, replace_with_a_copy])
def test_the_daemon_knows_when_its_lock_or_ledger_is_lost(project, name, change):
    project.relay().close()
    with DaemonLock(project.state / "relay.lock") as lock:
        d = Daemon(project.config(agents=["Ann"]), clock=project.clock, lock=lock)
        try:
            assert d.lost() is None
            d.hold()
            change(project.state / name)
            reason = d.lost()
            assert reason.startswith(f"{project.state / name} was removed or replaced while this daemon ran; stopping")
            with pytest.raises(StateLost, match="was removed or replaced"):
                d.hold()
        finally:
            d.relay.close()


def test_the_daemon_tells_systemd_its_status_after_steps_that_moved_messages_and_pings_its_watchdog(project, monkeypatch, tmp_path):
    """systemd's STATUS line follows a step that archived or failed messages, at most once per
    STATUS_EVERY; a step that moved nothing says nothing. With WATCHDOG_USEC set, the watchdog is
    pinged after a step, then not again before half its interval."""
    import socket
    from relay.core.work import Counts
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify.sock"))
    monkeypatch.setenv("WATCHDOG_USEC", "600000000")       # ten minutes: pinged every five
    project.relay().close()
    d = Daemon(project.config(agents=["Ann"]), clock=project.clock)

    def said():
        lines = []
        while True:
            try:
                lines.append(sock.recv(4096).decode())
            except BlockingIOError:
                return lines
    try:
        assert d.ping_every == 300.0
        d.stepped(Counts())
        assert said() == ["WATCHDOG=1"]                     # nothing moved: no status line
        d.stepped(Counts(failed=2))
        assert said() == ["STATUS=relayed 0, failed 2 since start"]     # a failure alone is news
        d.stepped(Counts(archived=3))
        assert said() == []                                 # within STATUS_EVERY of the last line
        d.next_status = 0.0
        d.stepped(Counts(archived=1))
        assert said() == ["STATUS=relayed 4, failed 2 since start"]
    finally:
        d.relay.close()
        sock.close()


def test_metrics_listen_without_the_web_extra_says_how_to_install_it(project):
    """[metrics] listen where prometheus-client is missing: a ConfigError naming the extra, from
    the index and from a checkout; an import that fails for another reason is not hidden."""
    import relay.web
    from relay import service
    from relay.errors import ConfigError
    cfg = project.config(agents=["Ann"])

    def unimported(mp, missing):
        for name in ("scrape", "metrics"):      # imported afresh, as a process without `missing` would
            mp.delitem(sys.modules, f"relay.web.{name}", raising=False)
            mp.delattr(relay.web, name, raising=False)
        mp.setitem(sys.modules, missing, None)
    with pytest.MonkeyPatch.context() as mp:
        unimported(mp, "prometheus_client")
        with pytest.raises(ConfigError) as e:
            service.listener(cfg, project.clock)
    assert str(e.value) == ("[metrics] listen needs the web extra (prometheus-client): pip install "
                            "'agent-outbox-relay[web]' (from a checkout: pip install '.[web]')")
    with pytest.MonkeyPatch.context() as mp:
        unimported(mp, "relay.web.metrics")     # relay's own module missing: not the extra
        with pytest.raises(ImportError) as e:
            service.listener(cfg, project.clock)
    assert not isinstance(e.value, ConfigError) and e.value.name == "relay.web.metrics"


def test_a_running_daemon_whose_lock_is_removed_exits_1_saying_so(daemon):  # noqa: F811
    d = daemon()
    d.ready()
    (d.state / "relay.lock").unlink()
    d.proc.wait(timeout=15)
    d.sock.close()
    err = d.log()
    assert d.proc.returncode == 1, err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (f"relay: {d.state / 'relay.lock'} was removed or replaced while this daemon "
                                    "ran; stopping so that two daemons never run on one state directory")


# -- operator verbs wake a running daemon at once ----------------------------------------------

def failed_count(state):
    with History(Ledger(state / "ledger.sqlite", readonly=True)) as history:
        return history.counts()["failed"]


def test_retry_wakes_a_running_daemon_long_before_its_rescan(daemon, tmp_path):  # noqa: F811
    state = tmp_path / ".relay"
    state.mkdir()
    (state / "relay.toml").write_text('rescan_interval = "1h"\nsweep_interval = "1h"\n')
    d = daemon()
    d.ready()
    rename_in(state / "outbox" / "Ann", "m", "TO: Zed\n\nfor Zed, who has no inbox yet")
    wait_for(lambda: failed_count(state) == 1, what="the message to an unknown agent failed")
    for sub in ("tmp", "new", "cur"):
        (state / "inbox" / "Zed" / sub).mkdir(parents=True)    # not watched: nothing wakes the daemon
    r = subprocess.run([sys.executable, "-m", "relay", "--root", str(tmp_path), "retry", "--failed"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "back to pending" in r.stdout, r.stderr
    [env] = wait_for(lambda: d.inbox("Zed"), timeout=20, what="the retried message (rescan is 1h away)")
    assert env["from"] == "Ann" and env["body"] == "for Zed, who has no inbox yet"
    code, err = d.stop()
    assert code == 0 and "SIGUSR1: looking at the ledger now" in err


def test_wake_signals_no_one_when_no_daemon_holds_the_lock(tmp_path):
    from relay.files.lock import wake
    assert wake(tmp_path / "relay.lock") is None                # no lock file
    (tmp_path / "relay.lock").write_text(f"{os.getppid()}\n")   # a pid, but no flock
    assert wake(tmp_path / "relay.lock") is None


HOLDER = """
import fcntl, os, signal, sys
catches = sys.argv[2] == "catches"
if catches:
    signal.signal(signal.SIGUSR1, lambda *_: None)              # caught, as `relay run` does
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # and kept pending for sigwait
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, f"{os.getpid()}\\n".encode())
print("held", flush=True)
if catches:
    signal.sigwait({signal.SIGUSR1})
    print("woken", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("catches", [True, False])
def test_wake_signals_only_a_lock_holder_that_catches_sigusr1(tmp_path, catches):
    """A process holding relay.lock that does not catch SIGUSR1 (a relay from before it was
    used) would be ended by it: it is left alone, and finds the work at its next rescan."""
    if not os.path.isdir("/proc/self"):
        pytest.skip("without /proc, wake() cannot tell which signals a process catches")
    from relay.files.lock import holder, wake
    lock = tmp_path / "relay.lock"
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock), "catches" if catches else "-"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "held\n"
        assert holder(lock) == child.pid
        assert wake(lock) == (child.pid if catches else None)
        if catches:
            assert child.stdout.readline() == "woken\n"
        child.stdin.close()
        assert child.wait(timeout=15) == 0          # alive until told to finish, not ended by a signal
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()


def test_wake_leaves_another_users_daemon_alone_without_failing(tmp_path):
    """`relay retry` by a user who may not signal the daemon: the retry stands, the daemon
    finds it at its next rescan, and wake() neither fails nor signals."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run the caller as another user (nobody); as an ordinary user every "
                    "process this test can start is the user's own and may be signalled")
    import pwd
    import tempfile
    from relay.files.lock import wake
    nobody = pwd.getpwnam("nobody")
    shared = tempfile.mkdtemp(prefix="relay-wake-")          # tmp_path is not reachable by nobody
    try:
        os.chmod(shared, 0o755)
        lock = os.path.join(shared, "relay.lock")
        child = subprocess.Popen([sys.executable, "-c", HOLDER, lock, "catches"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline() == "held\n"
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:                                    # the caller, as nobody
                try:
                    os.setgid(nobody.pw_gid)
                    os.setuid(nobody.pw_uid)
                    os.write(w, repr(wake(lock)).encode())
                finally:
                    os._exit(0)
            os.close(w)
            _, status = os.waitpid(pid, 0)
            with os.fdopen(r) as f:
                assert f.read() == "None" and status == 0
            os.kill(child.pid, signal.SIGUSR1)             # alive, still waiting: release it
            assert child.stdout.readline() == "woken\n"
            child.stdin.close()
            assert child.wait(timeout=15) == 0
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            child.stdout.close()
    finally:
        shutil.rmtree(shared)


def test_a_ledger_damaged_under_a_running_daemon_stops_it_with_what_to_do(project):
    """No wait mends a damaged ledger: the loop's step raises LedgerCorrupt (one line, exit 1
    from `relay run`) instead of retrying forever with a traceback."""
    import sqlite3

    from relay.errors import LedgerCorrupt
    relay = project.relay()
    project.drop("Ann", "m", "TO: Ben\n\nx")

    def damaged(*a, **k):
        raise sqlite3.DatabaseError("database disk image is malformed")

    relay.ledger.messages.record = damaged
    with pytest.raises(LedgerCorrupt, match="is damaged .* the archive and inboxes are intact"):
        relay.guarded_step()


def test_each_signal_asks_the_daemon_for_its_own_thing_only_and_a_poke_is_taken_once(project, caplog):
    """SIGHUP asks for a reload, SIGUSR1 for a look at the ledger, SIGTERM or SIGINT (the first)
    for a stop; none asks for another's. The next turn takes a poke once and says so."""
    project.relay().close()
    d = Daemon(project.config(agents=["Ann"]), clock=project.clock)
    try:
        asked = lambda: (d.signals.reload, d.signals.poke, d.signals.stop)     # noqa: E731
        assert asked() == (False, False, False) and not d.signals.is_set()
        d.on_signal(signal.SIGHUP, None)
        assert asked() == (True, False, False)
        d.signals.reload = False
        d.on_signal(signal.SIGUSR1, None)
        assert asked() == (False, True, False) and not d.signals.is_set()
        with caplog.at_level("INFO", logger="relay"):
            d.turn()
            d.turn()
        assert asked() == (False, False, False) and caplog.text.count("SIGUSR1: looking at the ledger now") == 1
        for sig in (signal.SIGTERM, signal.SIGINT):
            d.signals.stop = False
            d.on_signal(sig, None)
            assert asked() == (False, False, True) and d.signals.is_set(), sig
    finally:
        d.relay.close()
