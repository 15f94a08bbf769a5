"""Maildir delivery (contract §3): tmp/<id>.json, sync, link into new/, sync the directory.

Each recipient's delivery stands on its own: a recipient whose inbox fails is retried while the
others are delivered. A recipient the ledger already records is never written again. On a
message tried before (after a crash or a retry) a recipient that holds a complete envelope
of this message (it parses, its id and the original's sha256 match) already has it; an empty
or truncated one (left by a power cut) is written again. Existence alone proves nothing.
Readers take messages by moving them from new/ to cur/.
"""
import errno
import hashlib
import logging
import os
import stat

import orjson

from relay.errors import DurabilityError, LogSyncError, TransientError
from relay.files.fs import Unsafe, bad_name, shown, write_all
from relay.files.layout import valid_id

log = logging.getLogger(__name__)

FILE_MODE = 0o644
MAX_ENVELOPE_READ = 64 << 20
ORPHAN_AGE = 86400.0        # a tmp/ file older than this was left by a delivery that never finished


def is_envelope(entry):
    """Whether a directory entry of new/ is an unread envelope as relay writes one: a regular
    file (not a link, a directory or a FIFO someone put there) named <id>.json."""
    name = entry.name
    return name.endswith(".json") and valid_id(name[:-5]) and entry.is_file(follow_symlinks=False)


def transient(e, what):
    """EIO means the data may be lost: never retried. Anything else may pass: retried."""
    reason = f"{what}: {e.strerror or e}"
    if e.errno == errno.EIO:
        return DurabilityError(reason)
    return TransientError(reason)


def digest(data):
    return len(data), hashlib.sha256(data).hexdigest()


class Inbox:
    def __init__(self, layout, syncer):
        self.layout = layout
        self.fs = layout.fs
        self.syncer = syncer

    # -- delivery ---------------------------------------------------------------------------

    def deliver(self, works, custody=None):
        """Deliver a batch up to the links into new/. Fills each work's `got` (recipient ->
        (size, sha256) of its envelope) and `missed` (recipient -> error), and returns the
        (work, recipient) pairs linked now: their new/ directories are noted with the syncer,
        and they count only once the caller's next flush succeeds (`unlink` otherwise).
        `custody()` is called between the envelopes' sync and the links: a work it refuses,
        fails or defers (its file gone, swapped or held by a writer) is not linked."""
        fs = self.fs
        staged = []     # (work, recipient, tmp, new)
        for w in works:
            name = f"{w.id}.json"
            for r in w.recipients:
                if r in w.delivered_before or r in w.remote or r in w.shed or r in w.shed_before:   # remote: queued for another node
                    continue
                try:
                    tmp, new = f"inbox/{r}/tmp/{name}", f"inbox/{r}/new/{name}"
                    if w.earlier_attempt:
                        held = self.held(r, w)
                        if held is not None:
                            w.delivered_now[r] = held
                            fs.unlink_quietly(tmp)      # a crash between link and unlink
                            continue
                    self._write(tmp, w.envelope, r)
                    staged.append((w, r, tmp, new))
                except OSError as e:
                    w.failed_for[r] = transient(e, f"writing the envelope for {r}")
                except DurabilityError as e:
                    w.failed_for[r] = e
        try:       # the envelopes' content; in "fs" mode the directories wait for the links' flush
            self.syncer.flush("inbox tmp files", dirs=False)
        except DurabilityError as e:
            if isinstance(e, LogSyncError):     # the claim's: the step fails (nothing linked)
                for _, _, tmp, _ in staged:
                    fs.unlink_quietly(tmp)
                raise
            for w, r, tmp, _ in staged:
                w.failed_for[r] = e
                fs.unlink_quietly(tmp)
            return []
        if custody is not None:
            custody()
        linked = []
        for w, r, tmp, new in staged:
            if w.refused or w.error or w.defer:
                fs.unlink_quietly(tmp)
                continue
            try:
                try:
                    fs.link(tmp, new)
                    fs.unlink_quietly(tmp)
                except FileExistsError:
                    fs.rename(tmp, new)     # not a complete envelope of this message: replace it
                self.syncer.dir_changed(f"inbox/{r}/new")
                linked.append((w, r))
            except OSError as e:
                w.failed_for[r] = transient(e, f"linking {w.id}.json into inbox/{r}/new")
                fs.unlink_quietly(tmp)
        for w, r in linked:
            w.delivered_now[r] = (len(w.envelope), w.envelope_sha256)
        return linked

    @staticmethod
    def unlink(linked, error):
        """The flush after the links failed: those deliveries are not durable."""
        for w, r in linked:
            w.delivered_now.pop(r, None)
            w.failed_for[r] = error

    def _write(self, rel, data, recipient):
        try:
            fd = self.fs.create(rel, FILE_MODE)
        except FileNotFoundError:
            self.layout.make_inbox(recipient)
            fd = self.fs.create(rel, FILE_MODE)
        try:
            write_all(fd, data)
        except BaseException:
            os.close(fd)
            self.fs.unlink_quietly(rel)
            raise
        self.syncer.file_written(fd)

    def held(self, recipient, w):
        """(size, sha256) of a complete envelope of this message the recipient holds, or None."""
        for rel in self._copies(recipient, w.id):
            try:
                data = self.fs.read(rel, MAX_ENVELOPE_READ)
                doc = orjson.loads(data)
            except (OSError, orjson.JSONDecodeError):
                continue
            if isinstance(doc, dict) and doc.get("id") == w.id and doc.get("sha256") == w.sha256:
                return digest(data)
        return None

    # -- readers ----------------------------------------------------------------------------

    def _copies(self, recipient, mid):
        """Relative paths where the recipient may hold this message: new/, then cur/ (listed
        only when asked for)."""
        name = f"{mid}.json"
        yield f"inbox/{recipient}/new/{name}"
        try:
            names = self.fs.names(f"inbox/{recipient}/cur")
        except OSError:
            return
        # A name relay's readers never make (bytes that are not UTF-8, controls) is not a copy.
        yield from (f"inbox/{recipient}/cur/{n}" for n in names if n.startswith(name) and not bad_name(n))

    def envelope(self, recipient, mid):
        """(state, path, envelope) of the recipient's copy of a message, or None."""
        for rel in self._copies(recipient, mid):
            try:
                doc = orjson.loads(self.fs.read(rel, MAX_ENVELOPE_READ))
            except (OSError, orjson.JSONDecodeError):
                continue
            if isinstance(doc, dict):
                return rel.split("/")[2], self.fs.abspath(rel), doc
        return None

    def taken(self, recipient, mid, sha256, partial_is_ours=False):
        """True when the recipient holds an envelope under `mid` (unread in new/, or read in
        cur/ as relay's readers name it) that is not one of the file hashing to `sha256`: an
        id the ledger has forgotten (swept) is still another message's there. With
        `partial_is_ours` (a delivery of this message that a crash cut short) an envelope that
        does not parse is not another message's: `deliver` writes it again."""
        for rel in (f"inbox/{recipient}/new/{mid}.json", f"inbox/{recipient}/cur/{mid}.json:2,S"):
            try:
                st = self.fs.lstat(rel)
            except OSError:         # not there, or no inbox to look in (delivery says why)
                continue
            try:
                doc = orjson.loads(self.fs.read(rel, MAX_ENVELOPE_READ)) if stat.S_ISREG(st.st_mode) else None
            except (OSError, orjson.JSONDecodeError):
                doc = None
            if doc is None and partial_is_ours and stat.S_ISREG(st.st_mode):
                continue
            if not (isinstance(doc, dict) and doc.get("id") == mid and doc.get("sha256") == sha256):
                return True
        return False

    def holder(self, recipient, mid):
        """The path of an envelope of this id the recipient holds, or None. For people (relay
        show): it does not check the content."""
        rel = next((r for r in self._copies(recipient, mid) if self.fs.exists(r)), None)
        return None if rel is None else self.fs.abspath(rel)

    def list(self, agent, include_cur=False, limit=None, skip=(), order=None):
        """(sub, path, envelope) of an agent's messages, oldest first (by name: ids sort by time).
        With `limit`, at most that many readable envelopes, and no file past the last of them is
        opened (an unreadable one met before it is listed too and not counted). An entry of
        new/ named in `skip` is left out unopened; one that left its directory since the
        listing (another reader took it) is left out. `order(names)` gives new/'s names in the
        order to read them (the agent's priority order) instead."""
        out, readable = [], 0
        for sub in ("new", "cur") if include_cur else ("new",):
            names = self.names(agent, sub)
            for name in order(names) if order is not None and sub == "new" and names else names:
                if limit is not None and readable >= limit:
                    return out
                if sub == "new" and name in skip:
                    continue
                item = self.entry(agent, sub, name)
                if item is not None:
                    out.append(item)
                    readable += "error" not in item[2]
        return out

    def recent(self, agent, n):
        """(sub, path, envelope) of the `n` newest envelopes of cur/ (by name: ids sort by
        time), oldest first; only those are opened."""
        names = self.names(agent, "cur")[-n:] if n else []
        return [item for item in (self.entry(agent, "cur", name) for name in names) if item is not None]

    def names(self, agent, sub="new"):
        """The names of the files list() shows in inbox/<agent>/<sub>, sorted: a directory
        listing, nothing opened."""
        try:
            entries = self.fs.scandir(f"inbox/{agent}/{sub}")
        except OSError:
            return []
        return sorted(e.name for e in entries if not e.name.startswith(".") and e.is_file(follow_symlinks=False))

    def entry(self, agent, sub, name):
        """(sub, path, envelope) of one file of inbox/<agent>/<sub>; an envelope that cannot be
        read is {"id", "error"}; None when the file is no longer there."""
        rel = f"inbox/{agent}/{sub}/{name}"
        odd = bad_name(name)
        if odd:     # relay never writes such a name: something planted, shown escaped
            doc = {"id": shown(name.split(".")[0]), "error": f"not an envelope relay wrote: {odd} ('{shown(name)}')"}
            return sub, shown(self.fs.abspath(rel)), doc
        try:
            doc = orjson.loads(self.fs.read(rel, MAX_ENVELOPE_READ))
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            doc = {"id": name.split(".")[0], "error": f"unreadable envelope: {e}"}
        return sub, self.fs.abspath(rel), doc

    def ack(self, path):
        """Move one envelope from new/ to cur/ (Maildir 'seen')."""
        rel = os.path.relpath(str(path), self.fs.path)
        parts = rel.split("/")
        if len(parts) != 4 or parts[0] != "inbox" or parts[2] != "new":
            raise Unsafe(errno.EINVAL, f"{rel} is not an envelope in an inbox's new/")
        dest = f"inbox/{parts[1]}/cur/{parts[3]}:2,S"
        self.fs.rename(rel, dest)
        return self.fs.abspath(dest)

    def read_path(self, path):
        """Where ack() moves the envelope at `path`."""
        head, name = os.path.split(str(path))
        return os.path.join(os.path.dirname(head), "cur", f"{name}:2,S")

    def orphans(self, older_than):
        """Relative paths of tmp/ files older than `older_than` (epoch seconds). A link or an
        odd entry under inbox/ is never followed."""
        try:
            agents = self.fs.scandir("inbox")
        except OSError:
            return
        for agent in agents:
            if not agent.is_dir(follow_symlinks=False):
                continue
            tmp = f"inbox/{agent.name}/tmp"
            try:
                entries = self.fs.scandir(tmp)
            except OSError:
                continue
            for e in entries:
                try:
                    if e.is_file(follow_symlinks=False) and e.stat(follow_symlinks=False).st_mtime < older_than:
                        yield f"{tmp}/{e.name}"
                except OSError:
                    continue
