"""Reads a Maildir client makes (contract §3, receipts): an envelope moved from new/ to cur/ by
any program, not only relay's readers, is recorded as read.

The daemon keeps, per recipient, the ids of the envelopes it believes are in new/: those each
batch delivered (`delivered(works)`, beside the hooks) and those new/ held at start (`seed`).
Every READ_SCAN seconds of the loop it lists the new/ of each recipient it keeps ids for (one
directory listing each, nothing opened) and records as read those no longer there: found in
cur/ under a usual Maildir name (the time of the move: the file's ctime, which a rename sets),
or else at the time it was noticed (a client that renamed it otherwise, deleted or took it). Relay's own readers record their
reads themselves; the ledger keeps a step's first time, so a read noticed twice counts once.
The cost is bounded by the unread envelopes (the inboxes' new/, held to queue_limit); a
recipient whose new/ is empty costs nothing. At start, the copies delivered in the last
READ_LOOKBACK with no read recorded are looked at once: what a client read while no daemon ran.
"""
import logging

from relay.ids import id_text

log = logging.getLogger(__name__)

READ_SCAN = 1.0             # seconds between two looks at the new/ of the recipients with unread mail
READ_LOOKBACK = 86400.0     # at start: deliveries this recent with no read recorded are looked at


class Reads:
    def __init__(self, layout, ledger, every=READ_SCAN):
        self.layout = layout
        self.fs = layout.fs
        self.ledger = ledger
        self.every = every
        self.unread = {}            # recipient -> ids believed in its new/
        self.next_at = 0.0
        self._seeded = False

    def delivered(self, works):
        """A batch's recorded deliveries: their envelopes are in new/ now."""
        for w in works:
            for r in w.got:
                self.unread.setdefault(r, set()).add(w.id)

    def seed(self, now):
        """What new/ holds now, and the recent copies whose read may have been missed."""
        self._seeded = True
        try:
            for mid, recipient in self.ledger.receipts.unread_since(id_text(int(max(0.0, now - READ_LOOKBACK) * 1000), 0)):
                self.unread.setdefault(recipient, set()).add(mid)
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
        for recipient in list(self.unread):
            ids = self.unread[recipient]
            there = {n[:-5] for n in self._names(f"inbox/{recipient}/new") if n.endswith(".json")}
            left = ids - there
            if not left:
                continue
            for mid in sorted(left):
                pairs.append((mid, recipient, self._moved(recipient, mid, now)))
            ids -= left
            if not ids:
                del self.unread[recipient]
        if not pairs:
            return 0
        try:
            return len(self.ledger.receipts.step("read", [(m, r, min(w, now)) for m, r, w in pairs], now,
                                                 detail="left new/"))
        except Exception:  # noqa: BLE001 - a receipt is never worth a failed step
            log.exception("could not record %d read(s) noticed in the inboxes", len(pairs))
            return 0

    def _names(self, rel):
        try:
            return [e.name for e in self.fs.scandir(rel)]
        except OSError:
            return []

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

