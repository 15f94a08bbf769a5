"""What the server lost of this node's streams, found at a cost of what was lost, not of the backlog.

Each stream `from:<me>:to:<node>` holds only what waits for `node`'s acknowledgement, so a stream
shorter than the rows waiting lost entries. Which ones is read from the stream itself, a window
of at most WINDOW waiting rows a look: the stream's entry ids between the window's first and last
(pages of at most PAGE_BYTES of this node's own envelopes, as the ledger knows their sizes),
compared with the entry ids the rows have; only those missing are published again. The next
look takes the next window, round the rows by entry id, so a look costs the same whatever the
backlog (a node that never acknowledges 8,000 messages and deletes one entry a second costs a
window a second, not 8,000 entries). A stream gone whole (a FLUSHALL, a deleted key) has every
waiting row published again, unread: that is what was lost.

The receiving node may delete entries of its stream (XDEL, its relief when the server is out of
memory), so a node can make its stream short at will. Loss is therefore looked for at a pace per
node: at once the first time, then, each time a sweep has gone round, after 1, 2, 4 ...
seconds while losses go on (at most SCAN_CAP apart), back to at once after a quiet SCAN_CAP. And
the events a row published again leaves in the ledger (`republished`, `published`) are at most
EVENTS per node and minute; past them, one summary event per batch.
"""
import logging

log = logging.getLogger(__name__)

SCAN_BASE = 1.0             # seconds before a node's stream is swept again, after a loss ...
SCAN_CAP = 60.0             # ... doubled while losses go on, at most this
PAGE_BYTES = 4 << 20        # envelope bytes read per XRANGE of a stream looked through
PAGE_COUNT = 1024           # ... and entries
WINDOW = 512                # waiting rows whose entries are looked for at one look, at most
EVENTS = 64                 # per-row events of publishing again, per node and minute


def _eid(text):
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


class Losses:
    """The publisher's finder of lost entries (its thread, its client)."""

    def __init__(self, client, keys, node, history):
        self.client = client
        self.keys = keys
        self.node = node
        self.history = history
        self.pace = {}              # node -> (next look allowed, interval, last look)
        self.quota = {}             # node -> (minute's start, per-row events left)
        self.sweep = {}             # node -> the entry id (ms, seq) the last look stopped after
        self.scans = 0              # looks through a stream (counted, for tests and benchmarks)

    def due(self, node, now):
        """Whether `node`'s short stream may be looked through now."""
        return now >= self.pace.get(node, (0.0, 0.0, None))[0]

    def missing(self, node, now, gone=False):
        """(message id, node) of `node`'s waiting rows whose entries its stream no longer holds.
        One look reads at most WINDOW of them, from where the last look stopped (the sweep goes
        round the rows by entry id): a look costs the same whatever the backlog. The pace moves
        on once a sweep has gone round; until then the next window is due at the next look.
        `gone`: the stream is gone whole (a FLUSHALL, a deleted key): every waiting row, unread."""
        rows = self.history.remote.published_entries(node)        # (message id, entry id, envelope bytes)
        rows = [r for r in rows if r[1]]
        if gone:
            self.sweep.pop(node, None)
            self._paced(node, now)
            return [(mid, node) for mid, _, _ in rows]
        if not rows:
            self.sweep.pop(node, None)
            return []
        rows.sort(key=lambda r: _eid(r[1]))
        after = self.sweep.get(node)
        first = 0 if after is None else next((k for k, r in enumerate(rows) if _eid(r[1]) > after), len(rows))
        if first >= len(rows):
            first = 0
        window = rows[first:first + WINDOW]
        if first + WINDOW >= len(rows):     # round: the pace moves on
            self.sweep.pop(node, None)
            self._paced(node, now)
        else:
            self.sweep[node] = _eid(window[-1][1])
        self.scans += 1
        present = self._present(node, window)
        return [(mid, node) for mid, eid, _ in window if eid not in present]

    def _paced(self, node, now):
        _, interval, last = self.pace.get(node, (0.0, 0.0, None))
        interval = SCAN_BASE if last is None or now - last > SCAN_CAP + interval else min(SCAN_CAP, 2 * interval)
        self.pace[node] = (now + interval, interval, now)

    def _present(self, node, rows):
        """The entry ids of `rows` (sorted by entry id) that `node`'s stream holds, read in pages."""
        stream = self.keys.messages(self.node, node)
        present, i = set(), 0
        while i < len(rows):
            held, j = 0, i
            while j < len(rows) and j - i < PAGE_COUNT and (held == 0 or held + rows[j][2] <= PAGE_BYTES):
                held += rows[j][2]
                j += 1
            start = rows[i][1]
            while True:         # entries that wait for no row (published from an offer) may lie between
                got = self.client.xrange(stream, start, rows[j - 1][1], count=PAGE_COUNT)
                present.update(e.decode() if isinstance(e, bytes) else e for e, _ in got)
                if len(got) < PAGE_COUNT:
                    break
                last = got[-1][0]
                start = "(" + (last.decode() if isinstance(last, bytes) else last)
            i = j
        return present

    def calm(self, node, now):
        """`node`'s stream holds what waits: a later loss is looked for at once, after a quiet SCAN_CAP."""
        nxt, interval, last = self.pace.get(node, (0.0, 0.0, None))
        if last is not None and now - last > SCAN_CAP + interval:
            self.pace.pop(node, None)

    def quiet(self, node, now, count):
        """How many of `count` rows published again to `node` now leave no per-row event (past
        EVENTS in the minute)."""
        start, left = self.quota.get(node, (now, EVENTS))
        if now - start >= 60:
            start, left = now, EVENTS
        loud = min(left, count)
        self.quota[node] = (start, left - loud)
        return count - loud
