"""The archive and the quarantine (contract §3): originals moved into archive/ and failed/
(and back into the spool by recovery and relay retry), the error report beside a quarantined
file, and removal of swept files. Every path goes through the confined file system; each
directory a move changes is noted with the syncer, whose next flush makes it durable."""
import datetime
import errno
import logging
import os

import orjson

from relay.files.fs import Unsafe, split, write_all
from relay.core.message import iso

log = logging.getLogger(__name__)


_day = (0.0, 0.0, "1970-01-01")      # (start, end, name) of the UTC day named last
EPOCH_ORDINAL = datetime.date(1970, 1, 1).toordinal()


def day_of(ts):
    """The UTC day (YYYY-MM-DD) of the epoch time `ts`, the name of its archive directory. The
    last day named is kept: each step names it twice (a formatted date costs tens of us)."""
    global _day
    start, end, name = _day
    if start <= ts < end:
        return name
    try:
        d = datetime.datetime.fromtimestamp(ts, datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return "0001-01-01"
    name = d.strftime("%Y-%m-%d")
    # The day datetime named (it rounds to the microsecond: half a microsecond before midnight
    # is the next day), kept a microsecond inside each end. POSIX days are 86,400 s long.
    start = (d.toordinal() - EPOCH_ORDINAL) * 86400
    _day = (start + 1e-6, start + 86400 - 1e-6, name)
    return name


def parent(rel):
    return rel.rpartition("/")[0]


def check_rel(rel, *tops):
    """A stored relative path, refused unless it lies under one of `tops` (no '..', no '/')."""
    parts = split(rel)
    if parts[0] not in tops or len(parts) < 2:
        raise Unsafe(errno.EINVAL, f"{rel!r} is not a path under {' or '.join(tops)}/")
    return rel


class Archive:
    def __init__(self, layout, syncer):
        self.layout = layout
        self.fs = layout.fs
        self.syncer = syncer

    def move(self, src, dst):
        """Rename `src` to `dst` (both relative), making missing parents of `dst`."""
        self.fs.rename(src, dst, make_parents=True)
        self.syncer.dir_changed(parent(dst))
        self.syncer.dir_changed(parent(src))

    def store(self, src, rel):
        """Move the original at `src` (relative) to `rel` (its archive path)."""
        self.move(src, check_rel(rel, "archive"))
        return rel

    def quarantine(self, src, sender, mid, name, report):
        """Move the original (when there is one) to failed/ and write the .error.json beside it."""
        rel = self.layout.failed_rel(sender, mid, name)
        if src is not None:
            try:
                self.move(src, rel)
            except FileNotFoundError:
                report["file"] = None
        self.write_report(rel, report)
        return rel

    def write_report(self, rel, report, suffix=".error.json"):
        fd = self.fs.create(f"{rel}{suffix}", 0o644, make_parents=True)
        try:
            write_all(fd, orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
        except BaseException:
            os.close(fd)
            raise
        self.syncer.file_written(fd)
        self.syncer.dir_changed(parent(rel))

    @staticmethod
    def report(mid, sender, name, reason, now, attempts=None, delivered_to=None, shed=None):
        doc = {
            "id": mid, "from": sender, "file": name, "reason": reason, "failed_at": iso(now),
            "attempts": attempts,
            "what_to_do": (f"fix the cause, then run `relay retry {mid}` to deliver it again, or write a "
                           f"corrected file into outbox/{sender}/"),
        }
        if delivered_to:
            doc["delivered_to"] = delivered_to
            doc["what_to_do"] += "; recipients that already have it do not get it again"
        if shed:
            doc["shed"] = shed
            doc["what_to_do"] += ("; a message shed by flow control (per_pair_rate, queue_limit) is delivered past "
                                  "the limits by `relay retry`")
        return doc

    def remove(self, rel):
        """Delete an archived or quarantined file and empty parents up to archive/ or failed/."""
        parts = check_rel(rel, "archive", "failed").split("/")
        removed = False
        for p in (rel, f"{rel}.error.json"):
            try:
                self.fs.unlink(p)
                removed = True
            except FileNotFoundError:
                pass
        # A flow-control report beside it, or in failed/ for an archived message (flow.report).
        self.fs.unlink_quietly(f"{rel}.shed.json" if parts[0] == "failed" or len(parts) != 4
                               else f"failed/{parts[2]}/{parts[3]}.shed.json")
        d = parent(rel)
        for _ in range(2):
            if d in ("archive", "failed"):
                break
            try:
                self.fs.rmdir(d)
            except OSError:
                break
            d = parent(d)
        return removed
