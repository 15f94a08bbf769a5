"""Whatever an agent plants under .relay/ (links at every level, hard links, odd names, future
times, files held open), relay touches nothing outside the state directory, one bad file delays
only itself, and no recipient ever gets a message twice."""
import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest
from conftest import failing_create
from test_custody import _tree

from relay.core.loop import DRAIN_PATIENCE


def tree(path):
    """A checksum of everything under `path`: names, contents, modes, mtimes, link counts."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            data = b""
            if os.path.isfile(p) and not os.path.islink(p):
                data = open(p, "rb").read()
            out[os.path.relpath(p, path)] = (st.st_mode, int(st.st_mtime), st.st_nlink,
                                             hashlib.sha256(data).hexdigest())
    return out


@pytest.fixture
def decoy(tmp_path_factory):
    d = tmp_path_factory.mktemp("decoy")
    (d / "sub").mkdir()
    for i in range(3):
        (d / f"old{i}").write_text(f"day-old {i}")
        os.utime(d / f"old{i}", (1_600_000_000, 1_600_000_000))
    (d / "sub" / "keep").write_text("keep me")
    return d


def bodies(project, agent, sub="new"):
    return sorted(e["body"] for e in project.inbox(agent, sub))


def test_orphan_removal_never_follows_a_link_under_inbox(project, decoy, clock):
    relay = project.relay()
    before = tree(decoy)
    os.symlink(decoy, project.state / "inbox" / "x")
    os.symlink(decoy, project.state / "inbox" / "Ben" / "tmp" / "inner")
    shutil.rmtree(project.state / "inbox" / "Cy" / "tmp")
    os.symlink(decoy, project.state / "inbox" / "Cy" / "tmp")
    relay.recover(clock.advance(3 * 86400))
    relay.remove_orphans(clock.now)
    assert tree(decoy) == before


@pytest.mark.parametrize("where", ["inbox/Ben", "inbox/Ben/new", "inbox/Ben/tmp"])
def test_an_inbox_swapped_for_a_link_receives_nothing_and_waits(project, decoy, where):
    relay = project.relay()
    before = tree(decoy)
    target = project.state / where
    os.rename(target, project.state / "aside")
    os.symlink(decoy, target)
    project.drop("Ann", "m", "TO: Ben, Cy\n\nhello")
    relay.drain()
    assert tree(decoy) == before
    assert bodies(project, "Cy") == ["hello"]               # the other recipient is not held up
    [row] = relay.history.audit()
    assert row["status"] == "pending" and "symbolic link" in row["error"] and "Ben" in row["error"]
    os.unlink(target)
    os.rename(project.state / "aside", target)
    relay.hint("rescan")
    relay.step(project.clock.advance(60))
    assert bodies(project, "Ben") == ["hello"] and bodies(project, "Cy") == ["hello"]
    assert relay.history.get(row["id"])["status"] == "archived"


@pytest.mark.parametrize("where", ["archive", "failed", "spool/Ann", "spool"])
def test_relay_directories_swapped_for_links_receive_nothing(project, decoy, where):
    relay = project.relay()
    relay.drain()
    before = tree(decoy)
    target = project.state / where
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(decoy, target)
    project.drop("Ann", "m", "TO: Ben\n\nfine")
    project.drop("Ann", "bad", "TO: Nobody\n\nrefused")
    relay.drain()
    assert tree(decoy) == before


@pytest.mark.parametrize("target", ["root", "state", "inbox/Ben/new", "archive-day", "outbox/Ben"])
def test_agent_directory_linked_inside_the_root_is_never_followed(project, target):
    relay = project.relay(agents=("Ann", "Ben"))
    project.drop("Ben", "first", "TO: Ann\n\nonce")
    relay.drain()
    (project.state / "relay.toml").write_text("max_retries = 3\n")
    (project.root / "README").write_text("project file")
    day = next((project.state / "archive").iterdir())
    where = {"root": project.root, "state": project.state, "inbox/Ben/new": project.state / "inbox/Ben/new",
             "archive-day": day / "Ben", "outbox/Ben": project.state / "outbox/Ben"}[target]
    project.drop("Ben", "later", "TO: Ann\n\nlater")
    before = tree(where)
    os.symlink(where, project.state / "outbox" / "Evil")
    relay.hint("rescan")
    relay.drain()
    assert (project.state / "relay.toml").read_text() == "max_retries = 3\n"
    assert (project.root / "README").read_text() == "project file"
    if target in ("inbox/Ben/new", "archive-day"):
        after = tree(where)
        assert {k: after.get(k) for k in before} == before
    assert not [r for r in relay.history.audit() if r["sender"] == "Evil"]
    assert not (project.state / "failed" / "Evil").exists()
    assert bodies(project, "Ann") == ["later", "once"]      # nothing replayed, nothing twice
    assert "Evil" not in relay.known_agents(refresh=True)


def test_hard_link_to_a_file_outside_is_delivered_from_a_private_copy(project, decoy):
    relay = project.relay()
    outside = decoy / "shared"
    outside.write_text("TO: Ben\n\nfrom a hard link")
    os.chmod(outside, 0o666)
    os.link(outside, project.state / "outbox/Ann/m")
    os.utime(project.state / "outbox/Ann/m", (1_700_000_000, 1_700_000_000))
    relay.drain()
    assert bodies(project, "Ben") == ["from a hard link"]
    assert os.stat(outside).st_mode & 0o777 == 0o666        # its mode untouched
    [archived] = project.files("archive")
    assert os.stat(archived).st_ino != os.stat(outside).st_ino and os.stat(outside).st_nlink == 1
    outside.write_text("changed by someone else")
    assert archived.read_text() == "TO: Ben\n\nfrom a hard link"
    assert relay.history.get(json.loads(next((project.state / "inbox/Ben/new").iterdir()).read_bytes())["id"])[
        "sha256"] == hashlib.sha256(archived.read_bytes()).hexdigest()


def test_a_file_being_hard_linked_waits_out_the_link_then_unlink_moment(project, clock):
    relay = project.relay(settle="1s")
    tmp = project.state / "outbox/Ann/.w"
    tmp.write_text("TO: Ben\n\nlinked in")
    os.utime(tmp, (clock.now, clock.now))
    os.link(tmp, project.state / "outbox/Ann/m")        # a writer's link(2), its unlink not yet done
    assert relay.step(clock.now).registered == 0
    tmp.unlink()
    relay.drain(wait=clock.advance, now_fn=clock)
    assert bodies(project, "Ben") == ["linked in"]


def test_names_that_are_not_utf8_are_quarantined_and_stop_nothing(project):
    relay = project.relay()
    box = os.fsencode(project.state / "outbox/Ann")
    with open(box + b"/bad\xff\xfename", "wb") as f:
        f.write(b"TO: Ben\n\nodd name")
    project.drop("Ann", "good", "TO: Ben\n\nfine")
    total = relay.drain()
    assert total.archived == 1 and total.failed == 1
    assert bodies(project, "Ben") == ["fine"]
    [row] = relay.history.audit(status="failed")
    assert row["name"] == "bad\\xff\\xfename" and "not valid UTF-8" in row["error"]
    assert (project.state / row["failed_path"]).read_bytes() == b"TO: Ben\n\nodd name"
    assert not os.listdir(box)


def test_any_name_in_the_spool_is_survived_at_start(project):
    project.relay().close()
    spool = os.fsencode(project.state / "spool")
    os.makedirs(spool + b"/Ann", exist_ok=True)
    for name in (b"\xff\xfe", b"01JAAAAAAAAAAAAAAAAAAAAAAA--\xff", b"short--x", b"01JAAAAAAAAAAAAAAAAAAAAAAA--"):
        open(spool + b"/Ann/" + name, "wb").write(b"TO: Ben\n\nplanted")
    os.makedirs(spool + b"/\xff", exist_ok=True)
    os.symlink("/", spool + b"/Root")
    relay = project.relay()
    relay.drain()
    assert bodies(project, "Ben") == []
    assert len(os.listdir(spool + b"/Ann")) == 4                 # left alone, reported


def test_system_is_never_a_sender(project):
    relay = project.relay()
    (project.state / "outbox/System").mkdir()
    (project.state / "outbox/System/m").write_text("TO: Ben\n\nforged")
    relay.drain()
    assert bodies(project, "Ben") == []


def test_a_future_mtime_is_handled_now(project, clock):
    relay = project.relay(settle="250ms")
    path = project.drop("Ann", "m", "TO: Ben\n\nfrom the future", in_place=True)
    os.utime(path, (4_102_444_800, 4_102_444_800))           # 2100-01-01
    relay.drain(wait=clock.advance, now_fn=clock)
    assert bodies(project, "Ben") == ["from the future"] and not relay.left
    [env] = project.inbox("Ben")
    assert env["sent_at"].startswith("2100-01-01")
    assert relay.history.get(env["id"])["sent_at"] == 4_102_444_800


def test_times_beyond_the_calendar_are_shown_at_its_ends():
    from relay.core.message import iso
    assert iso(1e18) == "9999-12-31T23:59:59.000000Z" and iso(-1e18).startswith("0001-01-01")


def test_a_file_held_open_forever_delays_only_itself(project, clock):
    relay = project.relay()
    path = project.state / "outbox/Ann/slow"
    held = open(path, "w")
    held.write("TO: Ben\n\nhalf")
    held.flush()
    os.utime(path, (clock.now - 100, clock.now - 100))
    project.drop("Ann", "m", "TO: Ben\n\nfine")
    try:
        relay.drain(wait=clock.advance, now_fn=clock)
        assert bodies(project, "Ben") == ["fine"]
        assert relay.left == [("outbox/Ann/slow", "held open for writing")]
    finally:
        held.close()
    relay.drain(wait=clock.advance, now_fn=clock)
    assert bodies(project, "Ben") == ["fine", "half"] and relay.left == []


def test_drain_with_a_frozen_clock_returns(project):
    relay = project.relay()
    path = project.state / "outbox/Ann/slow"
    held = open(path, "w")
    try:
        held.write("TO: Ben\n\nhalf")
        held.flush()
        frozen = project.clock.now
        relay.drain(wait=lambda s: None, now_fn=lambda: frozen)
        assert relay.left and relay.left[0][0] == "outbox/Ann/slow"
    finally:
        held.close()


def test_run_once_names_what_it_left_and_exits_3(tmp_path):
    state = tmp_path / ".relay"
    env = dict(os.environ, RELAY_ROOT=str(tmp_path))
    subprocess.run([sys.executable, "-m", "relay", "init", "--agent", "Ann", "--agent", "Ben"], env=env, check=True)
    path = state / "outbox/Ann/slow"
    with open(path, "w") as held:
        held.write("TO: Ben\n\nhalf")
        held.flush()
        os.utime(path, (1_700_000_000, 1_700_000_000))
        r = subprocess.run([sys.executable, "-m", "relay", "run", "--once", "-q", "--patience", "1s"], env=env,
                           capture_output=True, text=True, timeout=DRAIN_PATIENCE + 30)
    assert r.returncode == 3, r.stderr
    assert "left 1 file(s)" in r.stderr and "outbox/Ann/slow (held open for writing)" in r.stderr
    assert "no progress in 1s" in r.stderr
    assert "Traceback" not in r.stderr


def test_one_recipient_failing_never_makes_the_other_receive_twice(project, clock):
    relay = project.relay(retry_backoff="1s", max_retries=1, retry_period="10m")
    project.drop("Ann", "m", "TO: Ben, Cy\n\nonce each")
    switch = failing_create(relay, OSError(errno.EACCES, "Permission denied"),
                            when=lambda rel: rel.startswith("inbox/Cy/"))
    relay.step()
    [row] = relay.history.audit()
    assert row["status"] == "pending" and bodies(project, "Ben") == ["once each"]
    assert [d["recipient"] for d in relay.history.deliveries(row["id"])] == ["Ben"]
    [ben] = (project.state / "inbox/Ben/new").iterdir()
    ben.unlink()                                     # Ben read it and deleted it
    for _ in range(12):
        relay.step(clock.advance(60))
    row = relay.history.get(row["id"])
    assert row["status"] == "failed" and "not delivered to Cy" in row["error"]
    report = json.loads((project.state / f"{row['failed_path']}.error.json").read_text())
    assert report["delivered_to"] == ["Ben"]
    switch["on"] = False
    from relay.operator import doctor as operator
    assert operator.retry(relay.ledger, relay.layout, [row["id"]]).lines == [f"{row['id']}: back to pending"]
    relay.step(clock.advance(1))
    assert bodies(project, "Cy") == ["once each"] and bodies(project, "Ben") == []
    assert relay.history.get(row["id"])["status"] == "archived"


def test_a_passing_fault_on_one_inbox_is_retried_for_an_hour(project, clock):
    relay = project.relay()                       # defaults: max_retries 3, retry_period 1h
    switch = failing_create(relay, OSError(errno.EACCES, "Permission denied"),
                            when=lambda rel: rel.startswith("inbox/Cy/"))
    for i in range(5):
        project.drop("Ann", f"m{i}", f"TO: Ben, Cy\n\nm{i}")
    relay.step()
    for _ in range(10):                           # ten minutes of an operator's mistake
        relay.step(clock.advance(60))
    assert bodies(project, "Ben") == [f"m{i}" for i in range(5)]
    assert relay.history.counts()["failed"] == 0
    switch["on"] = False
    relay.step(clock.advance(300))
    assert bodies(project, "Cy") == [f"m{i}" for i in range(5)]
    assert relay.history.counts()["archived"] == 5 and bodies(project, "Ben") == [f"m{i}" for i in range(5)]


ORDINARY = textwrap.dedent("""
    import os, sys
    from relay import config
    from relay.core.daemon import Relay
    root = sys.argv[1]
    relay = Relay(config.load(root, ".relay", env={}, overrides={"agents": ["Ann", "Ben", "Cy"]}))
    os.chmod(root + "/.relay/inbox/Cy/tmp", 0o500)
    open(root + "/.relay/outbox/Ann/m", "w").write("TO: Ben, Cy\\n\\nhello")
    os.utime(root + "/.relay/outbox/Ann/m", (1_700_000_000, 1_700_000_000))
    relay.drain()
    row = next(iter(relay.history.audit()))
    print(row["status"], sorted(os.listdir(root + "/.relay/inbox/Ben/new")) != [], os.listdir(root + "/.relay/inbox/Cy/new"))
    os.chmod(root + "/.relay/inbox/Cy/tmp", 0o755)
    relay.step(relay.clock() + 60)
    print(relay.history.get(row["id"])["status"], len(os.listdir(root + "/.relay/inbox/Cy/new")))
    relay.close()
""")


def test_a_real_permission_problem_as_an_ordinary_user():
    """Root ignores permissions: this runs as the user nobody."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become the ordinary user nobody")
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable]
    probe = subprocess.run([*nobody, "-c", "import dataclasses, sqlite3, orjson, watchdog"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"the user nobody cannot run {sys.executable} here")
    root = tempfile.mkdtemp(prefix="relay-nobody-")      # pytest's own temp dirs are private to root
    try:
        os.chown(root, 65534, 65534)
        r = subprocess.run([*nobody, "-c", ORDINARY, root], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["pending True []", "archived 1"]


def test_a_batch_holds_bounded_bytes(project):
    relay = project.relay(batch_bytes="4MiB")
    body = "\x01" * (1024 * 1024 - 100)             # escaped to six bytes each in the envelope
    for i in range(4):
        project.drop("Ann", f"m{i}", f"TO: Ben\n\n{body}")
    counts = relay.step()
    assert counts.claimed == 4 and counts.archived == 1 and counts.deferred == 3
    relay.drain()
    assert len(project.inbox("Ben")) == 4


def test_a_broadcast_envelope_does_not_grow_with_the_team(project):
    team = [f"a{i:03d}" for i in range(300)]
    relay = project.relay(agents=team)
    project.drop("a000", "all", "TO: *\n\nhi")
    relay.drain()
    sizes = {p.stat().st_size for a in team[1:] for p in (project.state / "inbox" / a / "new").iterdir()}
    assert len(sizes) == 1 and sizes.pop() < 600


def test_a_newline_in_a_name_cannot_forge_a_log_line(project, caplog):
    relay = project.relay()
    project.drop("Ann", "x\n2026-01-01 INFO forged line", "TO: Ben\n\nx")
    with caplog.at_level("INFO", logger="relay"):
        relay.drain()
    assert not any("\n" in r.getMessage() for r in caplog.records)
    assert any("x\\x0a2026" in r.getMessage() for r in caplog.records)


def test_a_place_swapped_for_a_link_at_start_does_not_stop_relay(project, decoy):
    project.relay().close()
    before = tree(decoy)
    shutil.rmtree(project.state / "failed")
    os.symlink(decoy, project.state / "failed")
    relay = project.relay()                         # starts, with a warning
    project.drop("Ann", "m", "TO: Ben\n\nfine")
    project.drop("Ann", "bad", "TO: Nobody\n\nrefused")
    relay.drain()
    assert bodies(project, "Ben") == ["fine"] and tree(decoy) == before


def test_a_spooled_file_moved_aside_for_a_moment_is_looked_for_again(project, clock):
    relay = project.relay(retry_backoff="1s")
    project.drop("Ann", "m", "TO: Ben, Cy\n\nback again")
    switch = failing_create(relay, OSError(errno.EACCES, "Permission denied"),
                            when=lambda rel: rel.startswith("inbox/Cy/"))
    relay.step()
    os.rename(project.state / "spool/Ann", project.state / "aside")
    switch["on"] = False
    relay.step(clock.advance(5))
    [row] = relay.history.audit()
    assert row["status"] == "pending" and "not there" in row["error"]
    os.rename(project.state / "aside", project.state / "spool/Ann")
    relay.step(clock.advance(60))
    assert bodies(project, "Ben") == ["back again"] and bodies(project, "Cy") == ["back again"]
    assert relay.history.get(row["id"])["status"] == "archived"


SWAPPED = ["outbox", "outbox/Ann", "spool", "spool/Ann", "inbox", "inbox/Ben", "inbox/Ben/new",
           "inbox/Ben/tmp", "archive", "archive/DAY", "archive/DAY/Ann", "failed", "failed/Ann"]


@pytest.mark.parametrize("how", ["a link outside", "another directory", "removed and made again"])
@pytest.mark.parametrize("which", SWAPPED)
def test_a_directory_swapped_between_two_steps_is_never_acted_in_outside(project, tmp_path, which, how):
    """Every directory relay held open in a step is swapped before the next: relay reads,
    writes, moves and removes nothing in the directory outside it now names."""
    relay = project.relay(sync_mode="file")
    project.drop("Ann", "m1", "TO: Ben\n\none")
    project.drop("Ann", "bad", b"\xff not a message")
    relay.drain()
    [day] = os.listdir(project.state / "archive")
    target = project.state / which.replace("DAY", day)
    out = tmp_path / "outside"
    out.mkdir()
    for sub in ("new", "tmp", "Ann", "Ben"):
        (out / sub).mkdir()
    (out / "m2").write_bytes(b"TO: Ben\n\noutside")
    before = _tree(out)
    if how == "removed and made again":
        shutil.rmtree(target)
    else:
        os.rename(target, tmp_path / "aside")
    if how == "a link outside":
        os.symlink(out, target)
    else:
        target.mkdir()
    if not (project.state / "outbox/Ann").is_symlink() and not (project.state / "outbox").is_symlink():
        project.drop("Ann", "m2", "TO: Ben\n\ntwo")
    for _ in range(3):
        relay.step(project.clock.advance(5))
    assert _tree(out) == before


def test_a_close_hint_on_a_fifo_a_link_or_a_hard_link_opens_and_changes_nothing_outside(project, tmp_path):
    """A hint skips the settle time and the look for writers: it must not skip the checks on
    what the entry is. A FIFO is quarantined unopened (opening it would block on a writer),
    a symbolic link is quarantined as one (its target untouched), and a hard link to a file
    outside is delivered from a private copy, the outside file left as it was."""
    relay = project.relay()
    box = project.state / "outbox/Ann"
    box.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "secret"
    outside.write_text("TO: Ben\n\nsecret")
    outside.chmod(0o666)
    before = outside.stat()
    os.mkfifo(box / "fifo")
    os.symlink(outside, box / "link")
    os.link(outside, box / "hard")
    for name in ("fifo", "link", "hard"):
        relay.hint("closed", "Ann", name)
    relay.step()
    rows = {r["name"]: r for r in relay.history.audit()}
    assert rows["fifo"]["status"] == "failed" and "FIFO" in rows["fifo"]["error"]
    assert rows["link"]["status"] == "failed" and "symbolic link" in rows["link"]["error"]
    assert rows["hard"]["status"] == "archived"
    assert [e["body"] for e in project.inbox("Ben")] == ["secret"]
    after = outside.stat()
    assert (after.st_mode, after.st_nlink, after.st_mtime_ns) == (before.st_mode, before.st_nlink, before.st_mtime_ns)
    assert outside.read_text() == "TO: Ben\n\nsecret"
    assert sorted(os.listdir(box)) == []


def test_patience_is_for_run_once(cli):
    cli("init", "--agent", "Ann")
    r = cli("run", "--patience", "1s", ok=False)
    assert r.exit_code == 2 and "--patience is for --once" in r.output
    r = cli("run", "--once", "--patience", "soon", ok=False)
    assert r.exit_code == 2 and "--patience" in r.output


@pytest.mark.parametrize("rel, ok", [("archive/2026-01-01/Ann/x", True), ("failed/Ann", True), ("archive", False),
                                     ("spool/Ann/x", False), ("archive/../x", False)])
def test_a_stored_path_is_taken_only_under_the_directories_named(rel, ok):
    from relay.core.archive import check_rel
    from relay.files.fs import Unsafe
    if ok:
        assert check_rel(rel, "archive", "failed") == rel
    else:
        with pytest.raises(Unsafe):
            check_rel(rel, "archive", "failed")
