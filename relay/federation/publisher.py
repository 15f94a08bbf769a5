"""Publishing to other nodes, and knowing it arrived.

    loop: T2 records the outbound row (and offers the message at once, routes.Router.offer)
      -> publish: XADD to relay:{team}:from:<me>:to:<node>, the entry id recorded (published)
      -> the receiving node delivers it durably, then XADDs its acknowledgement to
         relay:{team}:from:<node>:ack:<me>
      -> read_acks: the row is acknowledged (or refused, with the node's reason), and its entry
         deleted from this node's stream (the stream holds only what waits for an acknowledgement)

A published row whose acknowledgement does not come is published again (its old entry deleted
first, if still there): at once when the server lost it (its stream shorter than what waits
for an acknowledgement, or a new server run id: a restart without its data, a failover), and
at its deadline (`ack_timeout`, doubled with each publish up to 10 minutes) when its node is
alive. The receiver knows a message it already delivered by its id and content, and
acknowledges it again without delivering it twice. A row whose recipients another node holds
now (a node renamed, or one gone whose names another took) is rerouted there.
"""
import logging
import re

import orjson

from relay.core.work import backoff
from relay.federation.ackread import ACK_BYTES, ACK_READ, AckReads, node_of  # noqa: F401 - the bounds, here too
from relay.federation.client import Skipping, reason, round_trip, server_errors
from relay.federation.keys import Keys
from relay.federation.late import Late
from relay.federation.losses import Losses
from relay.federation.ackgate import ACKS_PER_SECOND, AckGate  # noqa: F401 - the bound, here too
from relay.files.layout import valid_id
from relay.federation.speakers import Speakers
from relay.federation.wire import Wire

log = logging.getLogger(__name__)

BATCH = 256                 # outbound rows per XADD pipeline
RETRY_BASE = 0.5            # seconds before a failed publish is tried again, doubled each time ...
RETRY_CAP = 30.0            # ... at most this (and at once when the link comes back)
HELD = 4                    # bytes held in memory per byte of an envelope published (row, pipeline)
ACK_ROUNDS = 8              # reads of acknowledgements per call (ACK_READ entries a stream each, ackread.py) ...
ACKS_PER_CALL = 8192        # ... and acknowledgements settled per call and node: one writing made-up ones
                            # in bulk holds the ledger's write lock no longer than these take (~50 ms),
                            # and takes none of another node's
MOVED_WAIT = 10.0           # seconds a "none of ... is an agent of node" refusal waits for another node to hold them
EARLY_ACKS_KEPT = 60.0      # seconds an acknowledgement waits for its row to be recorded (milliseconds, as a rule) ...
EARLY_ACKS_HELD = 1024      # ... and how many of one node's wait at most (one acknowledging ids never sent fills its own)
UNDELETED_HELD = 100_000    # entries of one node whose deletion is not known done, kept to be deleted again, at most
XDEL_IDS = 1000             # entry ids per XDEL
SWEEP_WINDOW = 120.0        # a new run deletes again the entries of the rows settled this long before the last ...
SWEEP_HELD = 20_000         # ... at most this many a node (a deletion cut, then a stop, left them in the stream)


class Publisher:
    """The sending half of the link (the publisher thread's, with its own ledger connection)."""

    def __init__(self, config, client, acks_client, ledger, history, router, redis):
        self.config = config
        self.fed = config.federation
        self.node = self.fed.node
        self.keys = Keys(self.fed.team)
        self.client = client
        self.acks_client = acks_client      # a guarded client: no acknowledgement read past ACK_BYTES
        self.ledger = ledger
        self.history = history
        self.router = router
        self.redis = redis
        self.errors = server_errors()
        self.early = {}                     # (message id, node) -> (entry id, when) published from an offer
        self.early_acks = {}                # node -> {message id: (refusal, entry id, when)}: rows not recorded yet
        self.cursors = {}                   # node -> last acknowledgement entry read from it
        self.reads = AckReads(acks_client)  # the acknowledgement streams read, each within its share
        self.gate = AckGate(history)        # each node's share of acknowledgements, and the lookup of them
        self.run_id = None                  # the server's, to know a restart or failover
        self.new_server = False             # the last check found another run id
        self.refusing = False               # the server refused a publish for want of memory
        self.moved = {}                     # (message id, node) -> (refusal, when, entry): "not my agents" (NOT_HERE)
        self.undeleted = {}                 # node -> {entry id: None} to delete, not yet known deleted (deleted())
        self.swept = False                  # this run deleted again what the last one settled (check())
        self.silent = set()                 # the nodes said not to acknowledge (unanswered())
        self.skipping = Skipping("acknowledgement")
        self.wire = Wire(client, self.keys, self.node)     # offers the loop writes itself
        self.losses = Losses(client, self.keys, self.node, history)   # what the server lost, found
        self.late = Late(history)           # what is past its deadline, published again by node
        self.hushed = set()                 # (message id, node) published again past the events' bound
        self.speakers = Speakers(self.ledger)   # rows held until their sender's name is claimed and announced

    def _xadd(self, entries):
        """XADD each (message id, node, recipients JSON, envelope) in one pipeline; the entry id
        of each, or the error the server answered for that one."""
        replies = round_trip(self.client, [self.keys.xadd(self.node, node, mid, recipients, envelope)
                                           for mid, node, recipients, envelope in entries])
        return [eid if isinstance(eid, Exception) else eid.decode() for eid in replies]

    def publish_offered(self, now):
        """Publish at once what the loop offered (the replies to what it wrote itself read
        first); the entry ids are recorded with the rows."""
        written, error = self.wire.replies()
        self._early(now, written)
        if error is not None:   # the wire's own connection (closed idle, a restart): not the link's
            log.info("federation: the connection the loop writes on failed (%s); its messages not answered "
                     "are published from the ledger", reason(error))
        offered = [(mid, node, orjson.dumps(names), envelope)
                   for mid, node, names, envelope in (self.router.take(BATCH) if self.router is not None else [])]
        if not offered:
            return len(written)
        ids = self._xadd(offered)       # RedisError: the rows are published from the ledger
        self._early(now, [((mid, node), eid) for (mid, node, _, _), eid in zip(offered, ids, strict=True)])
        return len(written) + len(offered)

    def _early(self, now, replies):
        """((message id, node), entry id or error) published from offers: kept for their rows."""
        self.early.update({key: (eid.decode() if isinstance(eid, bytes) else eid, now) for key, eid in replies
                           if not isinstance(eid, Exception)})
        if len(self.early) > 100 * BATCH:      # offers whose rows never came (a batch that failed): forgotten
            self.early = {k: v for k, v in self.early.items() if now - v[1] < 600}

    def publish(self, now):
        """Publish the outbound rows due now, record their entry ids. Returns (recorded, error)."""
        error = None
        try:
            while self.publish_offered(now) >= BATCH:
                pass
        except self.errors as e:
            error = e
        rows = self.history.remote.outbound_due(now, BATCH, self.config.batch_bytes // HELD)
        if not rows:
            return 0, error
        early, rest = [], []
        for r in rows:
            hit = self.early.pop((r["message_id"], r["node"]), None)
            (rest.append(r) if hit is None else early.append((r, hit[0])))
        rest = self.speakers.only(now, rest)
        try:
            ids = self._xadd([(r["message_id"], r["node"], r["recipients"], r["envelope"]) for r in rest]) \
                if rest else []
        except self.errors as e:
            ids, error = [e] * len(rest), e
        refused = {}
        for r, eid in zip(rest, ids, strict=True):
            if isinstance(eid, Exception):
                refused.setdefault(reason(eid), []).append(r)
                if isinstance(eid, self.redis.exceptions.OutOfMemoryError):
                    self.refusing = True    # the link probes the server's writes and publishes all at once
        for why, failed in refused.items():
            if error is None and any(r["attempts"] == 0 for r in failed):
                log.error("federation: %s not published to node %s: %s; retrying", len(failed),
                          ", ".join(sorted({r["node"] for r in failed})), why)
            self.ledger.remote.publish_failed(now, [(r["message_id"], r["node"], r["attempts"],
                                              now + backoff(RETRY_BASE, r["attempts"], RETRY_CAP)) for r in failed], why)
        done = [(r["message_id"], r["node"], eid) for r, eid in early + list(zip(rest, ids, strict=True))
                if not isinstance(eid, Exception)]
        if done:
            self.ledger.remote.published(now, done, self.fed.ack_timeout, quiet=self.hushed)
            self.hushed.difference_update((mid, node) for mid, node, _ in done)
            for mid, node, eid in done:
                log.info("%s published to node %s as entry %s", mid, node, eid)
        return len(done), error

    # -- acknowledgements --------------------------------------------------------------------

    def read_acks(self, now, nodes):
        """Read what the other nodes acknowledged since the last read; record it and delete the
        acknowledged entries from this node's streams. Returns the number of rows settled."""
        nodes = sorted(n for n in nodes if n != self.node)
        if not nodes:
            return 0
        streams = {self.keys.acks(n, self.node): self.cursors.get(n, "0-0") for n in nodes}
        streams = self.skipping.usable(self.acks_client, streams, now)
        settled = self._early_acks(now)
        budget = {key: self.gate.share(key, now) for key in streams}
        for _ in range(ACK_ROUNDS):     # bounded: a node flooding its stream delays no other work
            streams = {key: cursor for key, cursor in streams.items() if budget[key] >= 1}
            if not streams:
                break
            try:
                reply = self.reads.read(streams, budget, now)       # each within its share (ackread.py)
            except self.redis.ResponseError as e:
                if not self.skipping.found(self.acks_client, streams, now, e):
                    raise
                streams = self.skipping.usable(self.acks_client, streams, now)
                continue
            if not reply:
                break
            deletions = {}
            for key, entries in reply:
                key = key.decode() if isinstance(key, bytes) else key
                node = node_of(key)
                acks, last = [], None
                for eid, fields in entries:
                    if budget[key] <= 0:
                        break           # the rest in the next call: the cursor stays before them
                    got = _acks(fields)
                    acks.extend(got)
                    budget[key] -= max(1, len(got))
                    last = eid.decode() if isinstance(eid, bytes) else eid
                acks, named_settled = self._known(node, acks)
                deletions.setdefault(node, []).extend(named_settled)
                if acks:
                    # A refusal because the recipients are not the node's (any more) is rerouted
                    # when another node holds them now (reroute), else recorded as refused.
                    here = [a for a in acks if not (a[2] and a[2].startswith(NOT_HERE))]
                    for mid, eid, refusal in acks:
                        if refusal and refusal.startswith(NOT_HERE):
                            self.moved.setdefault((mid, node), (refusal, now, eid))
                    # The entries acknowledged are deleted, the row's own and the one the receiver
                    # names (an earlier publish of it, or one left by a crash after the record).
                    missed, named = [], {mid: e for mid, e, _ in here if e}
                    gone = self.ledger.remote.acknowledged(now, node, [(mid, refusal) for mid, _, refusal in here],
                                                    bounce=self.config.bounces, missed=missed, entries=named)
                    held = self._hold(now, node, missed, named)
                    for mid, _, _ in acks:      # settled before the publisher marked it published
                        if mid not in held:
                            self.early.pop((mid, node), None)
                    if self.router is not None and any(refusal for _, _, refusal in here):
                        self.router.bounced()       # the sender's bounce, emitted by the loop now
                    settled += len(gone)
                    if gone:
                        self.late.answered(node)
                    deletions.setdefault(node, []).extend(set(gone) | {e for mid, e, _ in here if e and mid not in held})
                if last is not None:    # moved once what it passes is recorded
                    streams[key] = self.cursors[node] = last
            self._delete(deletions)
        self.gate.owe(budget, now)
        return settled

    def _known(self, node, acks):
        """acks.known() with what this node has in flight to `node` (written, not recorded yet)."""
        def flying():
            offered = list(self.router.offered) if self.router is not None else []
            return {m for m, n in list(self.early) + list(self.wire.sent) + [o[:2] for o in offered] if n == node}
        out, named, dropped = self.gate.known(node, acks, flying)
        for mid in dropped:
            self.early.pop((mid, node), None)
        return out, named

    def _hold(self, now, node, missed, entries):
        """Acknowledgements that settled no row (`missed`: (message id, refusal)): those whose
        rows are not recorded yet (the loop wrote the XADD, the receiver answered before the
        batch's record) are kept, with the entries they name, and settle the rows once they are
        there. Dropped, they would have the row published again and its entry, deleted early,
        taken for one the server lost. At most EARLY_ACKS_HELD a node, the newest (a node that
        acknowledges ids never sent crowds out only its own); an id kept keeps its first time.
        Returns the message ids kept (their entries are not deleted yet)."""
        if not missed:
            return set()
        recorded = self.history.remote.outbound_recorded([(mid, node) for mid, _ in missed[-EARLY_ACKS_HELD:]])
        kept = self.early_acks.setdefault(node, {})
        for mid, refusal in missed[-EARLY_ACKS_HELD:]:
            if (mid, node) not in recorded and mid not in kept:
                kept[mid] = (refusal, entries.get(mid), now)
        if len(kept) > EARLY_ACKS_HELD:
            items = list(kept.items())
            self.early_acks[node] = kept = dict(items[-EARLY_ACKS_HELD:])
            self._delete({node: {eid for _, (_, eid, _) in items[:-EARLY_ACKS_HELD] if eid}})
        return {mid for mid, _ in missed} & set(kept)

    def _early_acks(self, now):
        """Settle the acknowledgements kept for rows since recorded (found by one query per 500),
        then forget those older than EARLY_ACKS_KEPT, deleting the entries they name (their rows,
        if ever recorded, wait for the deadline and a repeat). Returns the number of rows settled."""
        settled = 0
        deletions = {}
        for node, kept in list(self.early_acks.items()):
            recorded = self.history.remote.outbound_recorded([(mid, node) for mid in kept])
            acks = [(mid, *kept[mid][:2]) for mid, _ in sorted(recorded)]
            if acks:
                gone = self.ledger.remote.acknowledged(now, node, [(mid, refusal) for mid, refusal, _ in acks],
                                                bounce=self.config.bounces,
                                                entries={mid: eid for mid, _, eid in acks if eid})
                for mid, _, _ in acks:
                    del kept[mid]
                    self.early.pop((mid, node), None)
                if self.router is not None and any(refusal for _, refusal, _ in acks):
                    self.router.bounced()
                settled += len(gone)
                if gone:
                    self.late.answered(node)
                deletions[node] = set(gone) | {eid for _, _, eid in acks if eid}
            for mid, (_, eid, at) in list(kept.items()):
                if now - at >= EARLY_ACKS_KEPT:
                    del kept[mid]
                    if eid:
                        deletions.setdefault(node, set()).add(eid)
            if not kept:
                del self.early_acks[node]
        self._delete(deletions)
        return settled

    def _delete(self, deletions):
        """XDEL entries no row waits for from this node's streams ({node: entry ids}), with
        those whose deletion is not known done yet (deleted())."""
        for node, gone in deletions.items():
            if gone:
                self.undeleted.setdefault(node, {}).update(dict.fromkeys(gone))
        self.deleted()

    def deleted(self):
        """XDEL every entry kept in `undeleted`: an id leaves it once the server answered its
        XDEL. A deletion lost with its connection (the cursor and the ledger moved before it) is
        sent again at the next step, so no entry acknowledged stays in a stream, and the
        stream-length check counts only what waits (check()). An error answered for a node's
        XDEL keeps its ids (at most UNDELETED_HELD, the newest); ConnectionError keeps them all."""
        nodes = sorted(n for n, ids in self.undeleted.items() if ids)
        if not nodes:
            return
        pipe, sent = self.client.pipeline(transaction=False), []
        for node in nodes:
            ids = list(self.undeleted[node])
            for i in range(0, len(ids), XDEL_IDS):
                pipe.xdel(self.keys.messages(self.node, node), *ids[i:i + XDEL_IDS])
                sent.append((node, ids[i:i + XDEL_IDS]))
        for (node, ids), reply in zip(sent, pipe.execute(raise_on_error=False), strict=True):
            kept = self.undeleted[node]
            if not isinstance(reply, Exception):
                for eid in ids:
                    kept.pop(eid, None)
            elif len(kept) > UNDELETED_HELD:
                log.error("federation: %d entries of the stream to node %s cannot be deleted (%s); the oldest are "
                          "forgotten", len(kept), node, reason(reply))
                self.undeleted[node] = dict.fromkeys(list(kept)[-UNDELETED_HELD:])
        self.undeleted = {n: ids for n, ids in self.undeleted.items() if ids}

    # -- what the server lost, and deadlines -------------------------------------------------

    def check(self, now, alive):
        """Publish again what the server no longer holds, and what is past its deadline while
        its node is alive (`alive`: node -> bool). Returns the number of rows published again."""
        if hasattr(self.client, "get_node_from_key"):      # a cluster: the master of the team's slot
            info = self.client.info("server", target_nodes=self.client.get_node_from_key(self.keys.node(self.node)))
        else:
            info = self.client.info("server")
        run_id = info.get("run_id")
        again = []
        if not self.swept:      # what a deletion cut before this run's start left
            for node, ids in self.history.remote.settled_entries(SWEEP_WINDOW, SWEEP_HELD).items():
                self.undeleted.setdefault(node, {}).update(dict.fromkeys(ids))
        self.deleted()          # ConnectionError: nothing is concluded from lengths this time
        self.swept = True
        self.new_server = self.run_id is not None and run_id != self.run_id
        if self.new_server:
            log.warning("federation: the server is another one now (run id %s, was %s: a restart or a failover); "
                        "every message not yet acknowledged is published again", run_id, self.run_id)
            again += [(r["message_id"], r["node"]) for n in self.history.remote.unacknowledged()
                      for r in self.history.remote.waiting_for(n, 100_000)]
        self.run_id = run_id
        waiting = self.history.remote.unacknowledged()
        if waiting and not again:
            pipe = self.client.pipeline(transaction=False)
            nodes = sorted(waiting)
            for n in nodes:
                pipe.xlen(self.keys.messages(self.node, n))
            for n, length in zip(nodes, pipe.execute(), strict=True):
                if length - len(self.undeleted.get(n, ())) >= waiting[n]:   # those the server refused to delete
                    self.losses.calm(n, now)
                elif self.losses.due(n, now):      # only what is missing goes again (losses.py)
                    lost = self.losses.missing(n, now, gone=length == 0)
                    if lost:
                        log.warning("federation: the stream to node %s holds %d entries where %d wait for its "
                                    "acknowledgement: %d are missing (the server lost them, or the node deleted "
                                    "them); they are published again", n, length, waiting[n], len(lost))
                    again += lost
        if again:
            self._again(now, again, "the server lost it")
        late = self.late.due(now, alive)    # by node, in rounds that thin out while a node is silent (late.py)
        if late:
            log.warning("federation: %d messages not acknowledged by their node in time; published again", len(late))
            self._again(now, late, "no acknowledgement by its deadline")
        return len(again) + len(late)

    def unanswered(self, now):
        """Say in the log, once, that a node is not acknowledging (the oldest message published
        to it waits longer than ack_timeout: stopped, frozen, cut off from the server), and once
        again when it acknowledges again."""
        from relay.core.health import unanswered
        waiting = self.history.remote.unacknowledged_since()
        for node, (count, since) in sorted(waiting.items()):
            said = unanswered(node, {"published": count, "unacked_since": since, "waiting": count}, now,
                              self.fed.ack_timeout)
            if said and node not in self.silent:
                self.silent.add(node)
                log.warning("federation: %s; it may be stopped, frozen or cut off from the server", said)
        for node in sorted(self.silent):
            since = waiting.get(node, (0, None))[1]
            if since is None or now - since <= self.fed.ack_timeout:
                self.silent.discard(node)
                log.info("federation: node %s acknowledges again", node)

    def _again(self, now, rows, why):
        grouped, quiet = {}, set()
        for mid, node in rows:
            grouped.setdefault(node, []).append((mid, node))
        for node, items in grouped.items():     # past the bound of events a minute: no event of their own
            hushed = self.losses.quiet(node, now, len(items))
            quiet.update(items[len(items) - hushed:])
        self.hushed |= quiet
        if len(self.hushed) > 1_000_000:
            self.hushed = quiet
        by_node = {}
        for node, eid in self.ledger.remote.republish(now, rows, why, quiet=quiet):
            if eid:
                by_node.setdefault(node, set()).add(eid)
        self._delete(by_node)

    def reroute(self, now, routes, alive):
        """Rows waiting for a node that no longer holds their recipients, while another does: the
        rows of a node that is gone, and those a live node refused as not its agents'."""
        moves = []
        for node in self.history.remote.waiting_nodes():
            if alive.get(node):
                continue
            for r in self.history.remote.waiting_for(node, BATCH, pending=True):
                names = orjson.loads(r["recipients"])
                new = {routes.get(n) for n in names}
                if len(new) == 1 and None not in new and node not in new:
                    moves.append((r["message_id"], node, new.pop(), r["recipients"]))
        refused, left = {}, {}
        for (mid, node), (refusal, since, eid) in list(self.moved.items()):
            rows = [r for r in self.history.remote.outbound(mid)
                    if r["node"] == node and r["status"] in ("pending", "published")]
            new = {routes.get(n) for n in orjson.loads(rows[0]["recipients"])} if rows else set()
            if rows and len(new) == 1 and None not in new and node not in new:
                moves.append((mid, node, new.pop(), rows[0]["recipients"]))
            elif rows and now - since < MOVED_WAIT:
                continue            # the directory may still say where they went
            elif rows:
                refused.setdefault(node, []).append((mid, refusal))
            elif eid:
                left.setdefault(node, set()).add(eid)       # settled since: the entry it named goes
            del self.moved[(mid, node)]
        for node, items in refused.items():     # no other node holds them: refused, as the node said
            left.setdefault(node, set()).update(self.ledger.remote.acknowledged(now, node, items, bounce=self.config.bounces))
        self._delete(left)
        if refused and self.router is not None:
            self.router.bounced()
        if moves:
            gone = self.ledger.remote.reroute(now, moves, bounce=self.config.bounces)
            if self.router is not None:
                self.router.bounced()
            log.warning("federation: %d messages for agents now on other nodes are sent there", len(moves))
            by_node = {}
            for node, eid in gone:
                if eid:
                    by_node.setdefault(node, set()).add(eid)
            self._delete(by_node)
        return len(moves)


ENTRY_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}\Z")
NOT_HERE = "none of "          # how a receiver's refusal for recipients that are not its agents begins


def _acks(fields):
    """(message id, entry id or None, refusal or None) of one acknowledgement entry
    (`[[id, entry id, refusal or null], ...]`); nothing for a malformed one, nor for an item
    whose id is no relay id (never held, never looked up), and at most ACKS_PER_CALL."""
    raw = fields.get(b"acks") if isinstance(fields, dict) else None
    try:
        items = orjson.loads(raw) if raw is not None else []
    except orjson.JSONDecodeError:
        return []
    out = []
    for item in items[:ACKS_PER_CALL] if isinstance(items, list) else []:
        if isinstance(item, list) and item and isinstance(item[0], str) and valid_id(item[0]):
            eid = item[1] if len(item) > 1 and isinstance(item[1], str) and ENTRY_ID.match(item[1]) else None
            refusal = item[2] if len(item) > 2 and isinstance(item[2], str) else None
            out.append((item[0], eid, refusal[:500] if refusal else None))
    return out


