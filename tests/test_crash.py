"""A hard crash (os._exit, like kill -9) at every step boundary, then a restart: every recipient
holds each message exactly once, the archive holds it once, the ledger agrees with the files;
the sender of the one that fails holds its bounce exactly once."""
import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relay import config as config_mod
from relay.core.daemon import Relay

RUNNER = Path(__file__).with_name("crash_runner.py")
BOUNDARIES = ["registered-claimed", "custody", "tmp-write-1", "tmp-write-2", "tmp-synced", "link-1",
              "link-3", "archive-move-1", "quarantine", "batch-synced", "before-commit",
              "after-commit", "bounce-spooled", "bounce-registered"]
MESSAGES = {  # (sender, name): (text, recipients)
    ("Ann", "msg"): ("TO: Ben, Cy\n\nann-1", ["Ben", "Cy"]),
    ("Ann", "two.json"): ('{"to": "Ben", "body": "ann-2"}', ["Ben"]),
    ("Ben", "msg"): ("TO: *\n\nben-1", ["Ann", "Cy"]),
    ("Cy", "note"): ("TO: Ann\n\ncy-1", ["Ann"]),
}
BAD = ("Cy", "bad")


def setup(root):
    for (sender, name), (text, _) in MESSAGES.items():
        box = root / ".relay/outbox" / sender
        box.mkdir(parents=True, exist_ok=True)
        (box / name).write_text(text)
    (root / ".relay/outbox/Cy/bad").write_text("TO: Nobody\n\nbad")
    old = 1_700_000_000
    for p in (root / ".relay/outbox").rglob("*"):
        if p.is_file():
            os.utime(p, (old, old))


def crash(root, boundary, phase="deliver", mode="file"):
    r = subprocess.run([sys.executable, str(RUNNER), str(root), boundary, phase], capture_output=True,
                       text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(RUNNER.parent.parent),
                                                        CRASH_SYNC_MODE=mode))
    assert r.returncode == 137, f"{boundary}: the runner did not reach its crash point: {r.stderr[-500:]}"


def restart(root, **kw):
    cfg = config_mod.load(root, ".relay", env={}, overrides={"agents": ["Ann", "Ben", "Cy"]})
    relay = Relay(cfg)
    relay.drain(now_fn=lambda: relay.clock() + 10)
    return relay


def check(root, relay):
    state = root / ".relay"
    held, bounced = collections.Counter(), []
    for agent in ("Ann", "Ben", "Cy"):
        for sub in ("new", "cur"):
            for p in (state / "inbox" / agent / sub).iterdir():
                env = json.loads(p.read_bytes())
                if env["kind"] == "bounce":
                    bounced.append((agent, env["headers"]["bounce_of"]))
                else:
                    held[(agent, env["body"])] += 1
    want = collections.Counter()
    for (_, _), (text, recipients) in MESSAGES.items():
        body = text.rsplit("\n", 1)[-1] if not text.startswith("{") else json.loads(text)["body"]
        for r in recipients:
            want[(r, body)] += 1
    assert held == want, "inboxes do not hold each message exactly once"
    archived = [p for p in (state / "archive").rglob("*") if p.is_file()]
    assert len(archived) == len(MESSAGES) + 1          # and the bounce
    assert not [p for p in (state / "outbox").rglob("*") if p.is_file()]
    assert not [p for p in (state / "spool").rglob("*") if p.is_file()]
    assert not [p for a in ("Ann", "Ben", "Cy") for p in (state / "inbox" / a / "tmp").iterdir()]
    counts = relay.history.counts()
    assert counts == {"pending": 0, "processing": 0, "delivered": 0, "archived": len(MESSAGES) + 1, "failed": 1}
    for row in relay.history.audit(status="archived"):
        assert (state / row["archive_path"]).is_file()
    [failed] = relay.history.audit(status="failed")
    assert "unknown recipient Nobody" in failed["error"] and (state / failed["failed_path"]).is_file()
    assert bounced == [("Cy", failed["id"])], "the sender does not hold its bounce exactly once"


@pytest.mark.parametrize("mode", ["file", "fs"])
@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_crash_at_each_boundary(tmp_path, boundary, mode):
    """mode: fsync file by file, or one syncfs per phase (the default on Linux)."""
    setup(tmp_path)
    crash(tmp_path, boundary, mode=mode)
    relay = restart(tmp_path)
    try:
        check(tmp_path, relay)
    finally:
        relay.close()


@pytest.mark.parametrize("boundary", ["sweep-files", "sweep-commit"])
def test_crash_during_sweep(tmp_path, boundary):
    setup(tmp_path)
    restart(tmp_path).close()
    crash(tmp_path, boundary, "sweep")
    relay = restart(tmp_path)
    try:
        relay.sweep_all(now=relay.clock() + 30 * 86400)
        assert relay.history.counts() == dict.fromkeys(("pending", "processing", "delivered", "archived", "failed"), 0)
        assert not [p for p in (tmp_path / ".relay/archive").rglob("*") if p.is_file()]
        assert not [p for p in (tmp_path / ".relay/failed").rglob("*") if p.is_file()]
    finally:
        relay.close()


def test_spooled_file_with_no_ledger_record_is_registered_again(tmp_path):
    """Power loss after the custody rename reached the disk but before the claim's commit did:
    the file is in the spool and the ledger does not know it. Recovery registers it again,
    with its id, and it is delivered once."""
    setup(tmp_path)
    relay = restart(tmp_path)
    relay.close()
    spool = tmp_path / ".relay/spool/Ann"
    spool.mkdir(parents=True, exist_ok=True)
    (spool / "01JAAAAAAAAAAAAAAAAAAAAAAA--late").write_text("TO: Ben\n\nfrom the spool")
    relay = restart(tmp_path)
    try:
        row = relay.history.get("01JAAAAAAAAAAAAAAAAAAAAAAA")
        assert row["status"] == "archived" and row["sender"] == "Ann" and row["name"] == "late"
        assert [e["event"] for e in relay.history.events(row["id"])][0] == "recovered"
        bodies = [json.loads(p.read_bytes())["body"] for p in (tmp_path / ".relay/inbox/Ben/new").iterdir()]
        assert bodies.count("from the spool") == 1
    finally:
        relay.close()


def test_originals_no_row_knows_are_taken_back_from_the_latest_archived_day_and_the_day_before_only(project, clock):
    """A ledger that lost its last commits (a power cut) does not know originals it archived: the
    first look takes back those of the day of its latest archived message and of the day before
    (delivered again, idempotently); older days are left alone."""
    from relay.core.archive import day_of
    relay = project.relay()
    project.drop("Ann", "known", "TO: Ben\n\nrecorded")
    relay.drain(now_fn=lambda: clock.now + 10)
    latest = relay.history.latest_archived_at()
    relay.close()
    lost = {}
    for days in (0, 1, 2):
        mid = f"01JAAAAAAAAAAAAAAAAAAAAAA{days}"
        box = project.state / "archive" / day_of(latest - days * 86400) / "Ann"
        box.mkdir(parents=True, exist_ok=True)
        (box / f"{mid}--lost{days}").write_text(f"TO: Ben\n\nlost, {days} day(s) before")
        lost[days] = mid
    relay = project.relay()
    relay.drain(now_fn=lambda: clock.now + 10)
    bodies = sorted(m["body"] for m in project.inbox("Ben"))
    assert bodies == ["lost, 0 day(s) before", "lost, 1 day(s) before", "recorded"]
    assert [relay.history.get(lost[d]) is not None for d in (0, 1, 2)] == [True, True, False]
