"""Reading the other nodes' acknowledgement streams, each no further than its node's share.

One XREAD takes every node's acknowledgement stream at once (ACK_READ entries each). A reply over
the read's budget (a node writing large entries in bulk) is read again stream by stream, and a
stream whose entries are too large together is then *bulky*: read entry by entry, no further
than its node's share of the second (ackgate.py), each entry over ACK_BYTES passed by its size
alone (said once a minute per node). A bulky stream is left out of the XREAD of the others until
a read of it reaches its end, so its backlog is never read again at every call only to be cut
at the budget: a node writing 8,192 made-up acknowledgements an entry, 10 entries a second,
costs one entry read a share, not megabytes a call.
"""
import logging

from relay.federation.ackgate import node_of
from relay.federation.client import ReplyTooLarge, sized

log = logging.getLogger(__name__)

ACK_BYTES = 1 << 20         # the largest acknowledgement entry read (a node's are a few KB)
ACK_READ = 64               # acknowledgement entries per read and stream
OVERSIZE_SAID = 60.0        # seconds between two log lines of one node's entries too large to read




class AckReads:
    """The publisher's reads of acknowledgement streams (its thread, its guarded client)."""

    def __init__(self, client):
        self.client = client
        self.bulky = set()          # streams read entry by entry until a read reaches their end
        self.oversize_said = {}     # node -> when its entries too large to read may be said again

    def read(self, streams, budget, now):
        """[(key, [(entry id, fields)])] of `streams` ({key: cursor}) with a share left in
        `budget` ({key: acknowledgements}). A ResponseError of the XREAD is the caller's."""
        plain = {key: cursor for key, cursor in streams.items() if key not in self.bulky}
        reply = []
        if plain:
            try:
                reply = list(self.client.xread(plain, count=ACK_READ) or [])
            except ReplyTooLarge:       # the reply over its budget, or one entry over ACK_BYTES
                reply = self._apart(plain, budget, now)
        reply += [(key, self._one_by_one(key, cursor, budget[key], now))
                  for key, cursor in streams.items() if key in self.bulky and key not in plain]
        return [(key, entries) for key, entries in reply if entries]

    def _apart(self, streams, budget, now):
        """Each stream read on its own; one whose entries are too large together becomes bulky.
        Every stream moves on: no node's entries keep the others' from being read."""
        reply = []
        for key, cursor in streams.items():
            try:
                reply += self.client.xread({key: cursor}, count=ACK_READ) or []
            except ReplyTooLarge:       # one by one, then, from now on
                self.bulky.add(key)
                reply.append((key, self._one_by_one(key, cursor, budget[key], now)))
        return reply

    def _one_by_one(self, key, cursor, share, now):
        """Entries of a bulky stream after `cursor`, one at a time, until about `share`
        acknowledgements are read (one entry at least) or ACK_READ entries; its end read makes
        it plain again."""
        entries, left = [], share
        while left >= 1 and len(entries) < ACK_READ:
            got = sized(self.client, key, cursor, 1)
            if not got:
                self.bulky.discard(key)
                break
            eid, fields = got[0]
            entries.append((eid, fields))
            cursor = eid
            raw = fields.get(b"acks") if isinstance(fields, dict) else None
            left -= max(1, raw.count(b"[") - 1) if isinstance(raw, bytes) else 1
        big = [eid for eid, fields in entries if "oversize" in fields]
        node = node_of(key)
        if big and now >= self.oversize_said.get(node, 0.0):
            self.oversize_said[node] = now + OVERSIZE_SAID
            log.error("federation: node %s wrote acknowledgement entries too large to be any (%s and others over "
                      "%d bytes); passed unread", node, big[0], ACK_BYTES)
        return entries
