"""Run the relay in this process and die hard (os._exit, as kill -9 would) at a named step
boundary. Used by test_crash.py as a subprocess: python crash_runner.py ROOT BOUNDARY [sweep]."""
import os
import sys

from relay import config as config_mod
from relay.core.daemon import Relay

CRASH = 137


def die(*_a, **_k):
    sys.stdout.flush()
    os._exit(CRASH)


def after(obj, name, nth=1, when=None):
    """Die right after the nth call of obj.name (that matches `when`)."""
    real = getattr(obj, name)
    seen = {"n": 0}

    def wrapper(*a, **k):
        out = real(*a, **k)
        if when is None or when(*a, **k):
            seen["n"] += 1
            if seen["n"] == nth:
                die()
        return out
    setattr(obj, name, wrapper)


def before(obj, name, when=None):
    real = getattr(obj, name)

    def wrapper(*a, **k):
        if when is None or when(*a, **k):
            die()
        return real(*a, **k)
    setattr(obj, name, wrapper)


def after_synced(syncer, what):
    """Die right after the wait for a flush_later() of `what` returns: the batch's last sync
    done, its record not yet written (group commit)."""
    real = syncer.flush_later

    def wrapper(w, *a, **k):
        wait = real(w, *a, **k)
        if w != what:
            return wait

        def waited():
            wait()
            die()
        return waited
    syncer.flush_later = wrapper


def main(root, boundary, phase="deliver"):
    cfg = config_mod.load(root, ".relay", env={}, overrides={"agents": ["Ann", "Ben", "Cy"]})
    relay = Relay(cfg, sync_mode=os.environ.get("CRASH_SYNC_MODE", "file"))
    flush = lambda what: (lambda w, **k: w == what)  # noqa: E731
    points = {
        "registered-claimed": lambda: after(relay.ledger.messages, "register_and_claim", when=lambda f, *a, **k: bool(f)),
        "custody": lambda: after(relay.fs, "rename", when=lambda src, dst, **k: src.startswith("outbox/")),
        "tmp-write-1": lambda: after(relay.fs, "create", when=lambda rel, *a, **k: rel.startswith("inbox/")),
        "tmp-write-2": lambda: after(relay.fs, "create", nth=2, when=lambda rel, *a, **k: rel.startswith("inbox/")),
        "tmp-synced": lambda: after(relay.syncer, "flush", when=flush("inbox tmp files")),
        "link-1": lambda: after(relay.fs, "link"),
        "link-3": lambda: after(relay.fs, "link", nth=3),
        "archive-move-1": lambda: after(relay.archive, "store"),
        "quarantine": lambda: after(relay.archive, "quarantine"),
        "batch-synced": lambda: after_synced(relay.syncer, "inbox new/, archive and outbox directories"),
        "before-commit": lambda: before(relay.ledger.messages, "record"),
        "after-commit": lambda: after(relay.ledger.messages, "record"),
        # the bad message's bounce to Cy: its file written into the spool, then registered
        "bounce-spooled": lambda: after(relay.fs, "put", when=lambda rel, *a, **k: rel.startswith("spool/System/")),
        "bounce-registered": lambda: after(relay.ledger.bounces, "bounced"),
        "sweep-files": lambda: before(relay.ledger.operations, "sweep"),
        "sweep-commit": lambda: after(relay.ledger.operations, "sweep"),
    }
    points[boundary]()
    if phase == "sweep":
        relay.sweep_all(now=relay.clock() + 30 * 86400)
    else:
        relay.drain(now_fn=lambda: relay.clock() + 10)
    relay.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
