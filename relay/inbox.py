"""Maildir delivery (SPEC section 3): tmp/<id>.json, sync, link into new/, sync the directory.

Delivery is idempotent: a recipient whose new/<id>.json or cur/<id>.json* exists already has
the message. Readers take messages by moving them from new/ to cur/.
"""
import errno
import glob
import logging
import os

import orjson

from .errors import DurabilityError, TransientError

log = logging.getLogger(__name__)

FILE_MODE = 0o644


def _transient(e, what):
    """EIO means the data may be lost: never retried. Anything else may pass: retried."""
    reason = f"{what}: {e.strerror or e}"
    if e.errno == errno.EIO:
        return DurabilityError(reason)
    return TransientError(reason)


def _unlink_quietly(path):
    try:
        os.unlink(path)
    except OSError:
        pass


class Inbox:
    def __init__(self, layout, syncer):
        self.layout = layout
        self.syncer = syncer

    def holder(self, recipient, mid, thorough):
        """The path of the envelope the recipient already holds, or None."""
        base = self.layout.inbox / recipient
        new = base / "new" / f"{mid}.json"
        if os.path.exists(new):
            return new
        if thorough:
            hits = glob.glob(glob.escape(str(base / "cur" / f"{mid}.json")) + "*")
            if hits:
                return hits[0]
        return None

    def deliver(self, items):
        """Deliver a batch. items: objects with .id, .recipients, .envelope, .thorough, .error.

        Sets item.error to a TransientError or DurabilityError where delivery failed and
        returns the items delivered to every recipient (their envelopes durable in new/).
        """
        staged = []   # (item, tmp path, new/ directory, new path)
        inbox = str(self.layout.inbox)
        for item in items:
            mine = []
            name = f"{item.id}.json"
            try:
                for r in item.recipients:
                    base = f"{inbox}/{r}"
                    # A message claimed for the first time has a new id: no inbox can hold it yet.
                    if item.thorough and self.holder(r, item.id, True):
                        _unlink_quietly(f"{base}/tmp/{name}")   # a crash between link and unlink
                        continue
                    tmp = f"{base}/tmp/{name}"
                    mine.append((item, tmp, f"{base}/new", f"{base}/new/{name}"))
                    self._write(tmp, item.envelope, r)
            except OSError as e:
                item.error = _transient(e, f"writing the envelope for {r}")
            except DurabilityError as e:
                item.error = e
            if item.error:
                self._discard(mine)
            else:
                staged.extend(mine)
        live = [i for i in items if not i.error]
        try:
            self.syncer.flush("inbox tmp files")
        except DurabilityError as e:
            self._fail_all(live, staged, e)
            return []
        for item, tmp, new_dir, new in staged:
            if item.error:
                continue
            try:
                try:
                    os.link(tmp, new)
                except FileExistsError:
                    pass
                os.unlink(tmp)
                self.syncer.dir_changed(new_dir)
            except OSError as e:
                item.error = _transient(e, f"linking {os.path.basename(new)} into {new_dir}")
        live = [i for i in items if not i.error]
        try:
            self.syncer.flush("inbox new/ directories")
        except DurabilityError as e:
            for item in live:
                item.error = e
            return []
        return live

    def _write(self, path, data, recipient):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
        except FileNotFoundError:
            self.layout.make_inbox(recipient)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            self.syncer.file_written(fd)
        finally:
            os.close(fd)

    def _discard(self, staged):
        for entry in staged:
            _unlink_quietly(entry[1])

    def _fail_all(self, live, staged, error):
        for item in live:
            item.error = error
        self._discard(staged)

    # -- readers ----------------------------------------------------------------------------

    def list(self, agent, include_cur=False):
        base = self.layout.inbox / agent
        if not base.is_dir():
            return []
        out = []
        for sub in ("new", "cur") if include_cur else ("new",):
            d = base / sub
            for entry in sorted(os.scandir(d), key=lambda e: e.name) if d.is_dir() else []:
                if entry.name.startswith(".") or not entry.is_file(follow_symlinks=False):
                    continue
                try:
                    doc = orjson.loads(open(entry.path, "rb").read())
                except (OSError, orjson.JSONDecodeError) as e:
                    doc = {"id": entry.name.split(".")[0], "error": f"unreadable envelope: {e}"}
                out.append((sub, entry.path, doc))
        return out

    def ack(self, path):
        """Move one envelope from new/ to cur/ (Maildir 'seen')."""
        path = str(path)
        dest = os.path.join(os.path.dirname(os.path.dirname(path)), "cur", os.path.basename(path) + ":2,S")
        os.rename(path, dest)
        return dest

    def orphans(self, older_than):
        """tmp/ files older than `older_than` (epoch seconds)."""
        try:
            agents = list(os.scandir(self.layout.inbox))
        except FileNotFoundError:
            return
        for agent in agents:
            tmp = os.path.join(agent.path, "tmp")
            try:
                entries = list(os.scandir(tmp))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for e in entries:
                try:
                    if e.is_file(follow_symlinks=False) and e.stat(follow_symlinks=False).st_mtime < older_than:
                        yield e.path
                except FileNotFoundError:
                    continue
