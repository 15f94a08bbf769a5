"""The archive and quarantine (SPEC section 3): moves of originals, error reports, retention sweep."""
import datetime
import logging
import os
from pathlib import Path

import orjson

from .layout import move
from .message import iso

log = logging.getLogger(__name__)


def day_of(ts):
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%d")


class Archive:
    def __init__(self, layout, syncer):
        self.layout = layout
        self.syncer = syncer
        self._made = set()

    def _dir(self, path):
        """Make the directory (and note new ones' parents as changed)."""
        key = str(path)
        if key in self._made:
            return
        if not os.path.isdir(path):
            missing = []
            p = path
            while not os.path.isdir(p):
                missing.append(p)
                p = p.parent
            os.makedirs(path, exist_ok=True)
            for m in missing:
                self.syncer.dir_changed(m.parent)
        self._made.add(key)

    def store(self, src, rel):
        """Move the original at `src` to state_dir/`rel` (the archive path)."""
        dst = f"{self.layout.state}/{rel}"
        parent = os.path.dirname(dst)
        if parent not in self._made:
            self._dir(Path(parent))
        move(src, dst)
        self.syncer.dir_changed(parent)
        self.syncer.dir_changed(os.path.dirname(src))
        return dst

    def quarantine(self, src, sender, mid, name, report):
        """Move the original (when there is one) to failed/ and write the .error.json beside it."""
        rel = self.layout.failed_rel(sender, mid, name)
        dst = self.layout.state / rel
        self._dir(dst.parent)
        if src is not None:
            try:
                move(src, dst)
                self.syncer.dir_changed(os.path.dirname(src))
            except FileNotFoundError:
                report["file"] = None
        fd = os.open(f"{dst}.error.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
            self.syncer.file_written(fd)
        finally:
            os.close(fd)
        self.syncer.dir_changed(dst.parent)
        return rel

    @staticmethod
    def report(mid, sender, name, reason, now, attempts=None):
        return {
            "id": mid, "from": sender, "file": name, "reason": reason, "failed_at": iso(now),
            "attempts": attempts,
            "what_to_do": (f"fix the cause, then run `relay retry {mid}` to deliver it again, or write a "
                           f"corrected file into outbox/{sender}/"),
        }

    def remove(self, rel):
        """Delete an archived or quarantined file and empty parents up to archive/ or failed/."""
        path = self.layout.state / rel
        removed = False
        for p in (path, path.with_name(path.name + ".error.json")):
            try:
                os.unlink(p)
                removed = True
            except FileNotFoundError:
                pass
        parent = path.parent
        for _ in range(2):
            if parent in (self.layout.archive, self.layout.failed):
                break
            try:
                os.rmdir(parent)
            except OSError:
                break
            parent = parent.parent
        return removed
