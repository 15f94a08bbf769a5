"""Reads a Maildir client makes (contract §3, receipts): an envelope moved from new/ to cur/ by
any program, not only relay's readers, is recorded as read.

The daemon keeps, per recipient, the ids of the envelopes it believes are in new/: those each
batch delivered (`delivered(works)`, beside the hooks) and those new/ held at start (`seed`).
Every READ_SCAN seconds of the loop it looks, for each id it keeps, at that one name in the
recipient's new/ (a stat, nothing opened, new/ never listed): what else lies in new/ costs
nothing. A look examines at most `budget` names in all (READ_BUDGET), shared among the
recipients in turn (each at least one name a look, taken round-robin, the recipients too), so
one recipient with many unread envelopes neither slows the loop nor keeps another's reads
waiting. The cost is bounded by the ids kept (the inboxes' new/, held to queue_limit) and per
look by the budget; a recipient whose new/ is empty costs nothing.

The rule for recording a read: new/ is reached from the state directory without following a
link and is a directory, looked at afresh each time; an id is recorded read only when the stat
of its name inside that directory says there is no such file (ENOENT). It is read at the time
of its move to cur/ when found there under a usual Maildir name (the file's ctime, which a
rename sets), else at the time it was noticed (a client that renamed it otherwise, deleted or
took it). A new/ that cannot be looked at (a link, not a directory, missing, any error), or a
stat that fails otherwise, records nothing: the ids stay watched and the next look tries again.
Relay's own readers record their reads themselves; the ledger keeps a step's first time, so a
read noticed twice counts once. At start, the copies delivered in the last READ_LOOKBACK with
no read recorded are looked at once: what a client read while no daemon ran.
"""
import collections
import itertools
import errno
import logging
import os

from relay.ids import id_text

log = logging.getLogger(__name__)

READ_SCAN = 1.0             # seconds between two looks at the new/ of the recipients with unread mail
READ_LOOKBACK = 86400.0     # at start: deliveries this recent with no read recorded are looked at
READ_BUDGET = 2000          # names in new/ looked at in one look, all recipients together


class Reads:
    def __init__(self, layout, ledger, every=READ_SCAN, budget=READ_BUDGET):
        self.layout = layout
        self.fs = layout.fs
        self.ledger = ledger
        self.every = every
        self.budget = budget        # names looked at in one look, at most
        self.unread = {}            # recipient -> {id believed in its new/: None}, the next to look at first
        self.turn = collections.deque()     # the recipients kept, the next to look at first
        self.looked = 0             # names looked up in a new/ (counted, for tests and benchmarks)
        self.next_at = 0.0
        self._seeded = False

    def watch(self, recipient, mid):
        ids = self.unread.get(recipient)
        if ids is None:
            ids = self.unread[recipient] = {}
            self.turn.append(recipient)
        ids[mid] = None

    def delivered(self, works):
        """A batch's recorded deliveries: their envelopes are in new/ now."""
        for w in works:
            for r in w.delivered_now:
                self.watch(r, w.id)

    def seed(self, now):
        """What new/ holds now, and the recent copies whose read may have been missed."""
        self._seeded = True
        try:
            for mid, recipient in self.ledger.receipts.unread_since(id_text(int(max(0.0, now - READ_LOOKBACK) * 1000), 0)):
                self.watch(recipient, mid)
        except Exception:  # noqa: BLE001 - a receipt is never worth a failed step
            log.exception("could not look for reads missed while no relay ran")

    def due(self):
        return self.next_at if self.unread or not self._seeded else None

    def step(self, now):
        """Record the reads noticed since the last look (when READ_SCAN has passed). Returns
        how many were recorded."""
        if now < self.next_at:
            return 0
        self.next_at = now + self.every
        if not self._seeded:
            self.seed(now)
        pairs = []          # (mid, recipient, when)
        left_budget = self.budget
        quota = -(-self.budget // max(1, len(self.turn)))      # each recipient's share of a look
        for _ in range(len(self.turn)):
            if left_budget <= 0:
                break
            recipient = self.turn[0]
            self.turn.rotate(-1)
            ids = self.unread[recipient]
            share = min(len(ids), left_budget, quota)
            gone = self._gone(recipient, ids, share)
            left_budget -= share
            for mid in gone:
                del ids[mid]
                pairs.append((mid, recipient, self._moved(recipient, mid, now)))
            if not ids:
                del self.unread[recipient]
                self.turn.remove(recipient)
        if not pairs:
            return 0
        try:
            return len(self.ledger.receipts.step("read", [(m, r, min(w, now)) for m, r, w in pairs], now,
                                                 detail="left new/"))
        except Exception:  # noqa: BLE001 - a receipt is never worth a failed step
            log.exception("could not record %d read(s) noticed in the inboxes", len(pairs))
            return 0

    def _gone(self, recipient, ids, n):
        """The first `n` of `ids` whose name the recipient's new/ no longer holds (those still
        there go to the back of the turn). Nothing when new/ cannot be looked at."""
        rel = f"inbox/{recipient}/new"
        try:
            self.fs.recheck(rel)            # looked up by name again: a directory swapped meanwhile is seen
            fd = self.fs.open_dir(rel)      # never through a link, a directory (fs.StateDir)
        except OSError as e:
            log.debug("reads: %s cannot be looked at (%s); nothing recorded", rel, e)
            return []
        gone = []
        try:
            for mid in list(itertools.islice(ids, n)):
                self.looked += 1
                try:
                    os.stat(f"{mid}.json", dir_fd=fd, follow_symlinks=False)
                except OSError as e:
                    if e.errno == errno.ENOENT:
                        gone.append(mid)
                        continue
                del ids[mid]                # still there (or not known): looked at again after the others
                ids[mid] = None
        finally:
            os.close(fd)
        return gone

    def _moved(self, recipient, mid, now):
        """When the envelope reached cur/ (its ctime, which a rename sets; a Maildir name is
        <id>.json:2,<flags>), or `now` when it is not found there under a usual name."""
        for flags in ("S", "", "RS", "FS"):
            try:
                return self.fs.lstat(f"inbox/{recipient}/cur/{mid}.json:2,{flags}").st_ctime
            except OSError:
                continue
        return now

    def close(self):
        self.unread.clear()
        self.turn.clear()

