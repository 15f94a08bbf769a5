"""Flow control: which recipients of a batch's messages relay sheds, and why.

A shed message is not delivered to that recipient; its other recipients still get it; the
sender learns it (the ledger's shed record, and a report in failed/<sender>/), and a message
shed for every recipient is failed with the reason. The reasons, each with the limit in force
and the value observed:

- `body_size`: the body is over `max_body_bytes` (decided where the file is read and parsed);
- `per_pair_rate`: the sender has had `pair_rate` messages delivered to this recipient that
  were written in the `pair_window` before this one (an echo loop between two agents is stopped
  here). A message counts as written at its file's mtime, or now when that is in relay's future:
  the backlog written while relay was stopped is not a loop;
- `queue_limit`: the recipient already holds `queue_limit` unread envelopes in its new/ (regular
  files named <id>.json: whatever else was put there is no envelope and is not counted), and
  the sender its share of them: queue_limit over the senders with envelopes there, so no sender,
  made up or not, takes the room another needs;
- `recipient_archived`: an operator archived the recipient (relay archive-agent).

The hot path stays cheap: the per-pair windows live in memory (seeded from the ledger's
deliveries at start, or when the limits change), and a recipient's new/ is counted at most once
per batch, only when the count kept since its last listing (relay's own deliveries added, an
upper bound since readers only take envelopes away) could reach the limit, or when that count
is older than `rescan_interval`.
"""
import bisect
import collections
import logging

from relay.config import SYSTEM
from relay.ledger.schema import REASONS  # noqa: F401  (offered here, where the sheds are decided)
from relay.errors import DurabilityError, TooLarge
from relay.core.inbox import is_envelope
from relay.core.message import BROADCAST
from relay.core.work import Shed, fields

log = logging.getLogger(__name__)



def seconds(value):
    """A duration as people write it: 600 -> '10m'."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if value >= size and value % size == 0:
            return f"{int(value // size)}{unit}"
    return f"{value:g}s"


def body_size(limit, observed, names=("*",), text=None):
    """The sheds of a message whose body is over max_body_bytes: one per recipient as written
    (`*` when the file was too large to read who it is for)."""
    text = text or f"the body is {observed} bytes, over max_body_bytes ({limit})"
    names = ["*" if n in BROADCAST else n for n in names] or ["*"]
    return {n: Shed("body_size", limit, observed, text) for n in dict.fromkeys(names)}


def summary(sheds, everyone=True):
    """One line for a message's sheds: its failure reason when it was shed for `everyone`."""
    names = sorted(sheds)
    whom = "every recipient" if everyone and (len(names) > 1 or names == ["*"]) else ", ".join(names)
    reasons = {str(s) for s in sheds.values()}
    if len(reasons) == 1:
        return f"shed for {whom} ({reasons.pop()})"
    return f"shed for {whom}: " + "; ".join(f"{r} ({s})" for r, s in sorted(sheds.items()))


def refused(w, e, known=()):
    """A message relay will not deliver as it is (MessageRefused `e`): its reason, and when it
    is too large, its body_size sheds: one for each recipient it names that is a `known` agent
    (or System); the names are as the sender wrote them, unchecked, so any other (a path, a
    made-up name, thousands of them) is left to `*`."""
    w.message, w.refused = e.parsed, str(e)
    if isinstance(e, TooLarge):
        w.shed = body_size(e.limit, e.observed, [n for n in e.names if n in BROADCAST or n == SYSTEM or n in known])
        w.refused = summary(w.shed)


def logged(w):
    """Log a work's sheds of this batch (with its id and sender); returns how many."""
    if w.shed:
        log.warning("%s from %s shed for %s", w.id, w.sender, "; ".join(f"{r} ({s})" for r, s in w.shed.items()),
                    **fields("shed", w.id, w.sender, sorted(w.shed)))
    return len(w.shed)


def entries(w):
    """The sheds of a work as the sender's report lists them."""
    out = [{"recipient": r, "reason": s.reason, "limit": s.limit, "observed": s.observed, "detail": s.text}
           for r, s in sorted(w.shed.items())]
    return out + [{"recipient": r, "reason": reason, "detail": "shed by an earlier attempt"}
                  for r, reason in sorted(w.shed_before.items())]


def report(archive, w, now):
    """failed/<sender>/<id>--<name>.shed.json: a message delivered to some recipients and shed for
    others says so where the sender's failures land. A report left by an attempt that a crash
    cut short, on a message now shed for nobody, is removed. A report that cannot be written (a
    link planted in failed/) is logged; the ledger's records stand."""
    if not w.shed:
        if w.earlier_attempt and w.complete and not w.shed_before:
            archive.fs.unlink_quietly(archive.layout.failed_rel(w.sender, w.id, w.name) + SHED_REPORT)
        return
    rel = archive.layout.failed_rel(w.sender, w.id, w.name)
    doc = archive.report(w.id, w.sender, w.name, summary(w.shed, everyone=False), now, w.retries + 1,
                         sorted(set(w.delivered_now) | set(w.delivered_before)), entries(w))
    doc["what_to_do"] = WHAT_TO_DO
    try:
        archive.write_report(rel, doc, SHED_REPORT)
    except (OSError, DurabilityError) as e:
        log.error("%s from %s: cannot write %s%s: %s", w.id, w.sender, rel, SHED_REPORT, e,
                  **fields("error", w.id, w.sender, sorted(w.shed)))


SHED_REPORT = ".shed.json"
NO_SHEDS = {}       # of a message shed for nobody before (read only)
WHAT_TO_DO = ("the recipients listed under `shed` did not get this message (the others did): per_pair_rate, wait "
              "for the window to pass; queue_limit, the recipient must read its inbox; then send it to them again")


class Unread:
    """What flow control keeps of a recipient's new/: how many envelopes (an upper bound between
    listings: relay adds, readers take away), how many of them each sender's, when listed."""
    __slots__ = ("count", "at", "by")

    def __init__(self, count, at):
        self.count, self.at, self.by = count, at, collections.Counter()


class FlowControl:
    def __init__(self, layout, history, inbox):
        self.fs = layout.fs
        self.history = history
        self.inbox = inbox          # a message tried before may be held already: never shed then
        self.pairs = {}             # (sender, recipient) -> sorted times its delivered messages were written
        self.low = float("inf")     # the oldest time written counted since the windows were last pruned
        self.admitted = {}          # (sender, recipient) -> sorted times written of those admitted in this batch
        self.unread = {}            # recipient -> Unread: its envelopes in new/ (at most), whose, when listed
        self.owners = {}            # recipient near its queue_limit -> {id of an envelope in its new/: sender}
        self.seeded_for = None      # (pair_rate, pair_window) the windows were seeded with
        self.next_prune = 0.0

    def seed(self, now, config):
        """The per-pair windows from the deliveries the ledger recorded in the last pair_window,
        each at the time its message was written (no later than its delivery)."""
        self.pairs = {}
        self.unread = {}
        self.owners = {}
        self.seeded_for = (config.pair_rate, config.pair_window)
        self.low = float("inf")
        if not (config.pair_rate and config.pair_window):
            return
        times = collections.defaultdict(list)
        for sender, recipient, at, sent in self.history.deliveries_since(now - config.pair_window):
            # A row this build cannot read is left out, and so is a delivery in the clock's
            # future (recorded before the clock was set back): nothing says how long ago it was,
            # and counted as now at every start it would hold the pair until the clock caught up.
            if isinstance(at, (int, float)) and at <= now:
                times[(sender, recipient)].append(min(sent, at) if isinstance(sent, (int, float)) else at)
        for pair, ts in times.items():
            self.pairs[pair] = sorted(ts)
        self.next_prune = now + config.pair_window

    def admit(self, works, now, config, archived, prior, senders=True):
        """Decide who is shed among the recipients of works ready for delivery: sets each
        work's `shed` (decided now) and `shed_before` (recorded by an earlier attempt);
        refuses a work shed for every recipient. `archived`: names of archived agents (left out
        of a broadcast, shed when named, and, with `senders`, refused as senders: an agent of
        another node may bear the name of one archived here); `prior`: {id: {recipient:
        (reason, released)}} of earlier sheds, where a released one (relay retry) is delivered
        past the limits."""
        if self.seeded_for != (config.pair_rate, config.pair_window):
            self.seed(now, config)
        adds = collections.Counter()        # admitted in this batch, not yet delivered
        self.admitted = {}                  # (sender, recipient) -> sorted times written, of those
        listed = set()                      # new/ directories listed in this batch
        for w in works:
            w.written = written(w.sent_at, now)
            if senders and w.sender in archived:
                w.refused = (f"agent {w.sender} is archived (relay archive-agent): relay accepts nothing from it; "
                             f"`relay archive-agent --undo {w.sender}` restores it")
                continue
            before = prior.get(w.id, NO_SHEDS)
            if archived and w.message is not None and any(n in BROADCAST for n in w.message.to):
                named = set(w.message.to)
                w.recipients = [r for r in w.recipients if r not in archived or r in named]
                if not w.recipients:
                    w.refused = "broadcast with no other agent to receive it (the others are archived)"
                    continue
            for r in w.recipients:
                if r in w.delivered_before:
                    continue
                reason, released = before.get(r, (None, False))
                if reason and not released:
                    w.shed_before[r] = reason
                    continue
                # A bounce (relay's own, from System) is not subject to the limits, as a ping is not.
                shed = self._check(w.sender, r, now, config, archived, adds, listed, w.written,
                                   limits=not released and w.sender != SYSTEM, queue=r not in w.remote)
                if shed is not None and w.earlier_attempt and self.inbox.held(r, w):
                    shed = None         # delivered by an attempt a crash cut short: it has it
                if shed is None:
                    adds[r] += 1
                    adds[(w.sender, r)] += 1
                    bisect.insort(self.admitted.setdefault((w.sender, r), []), w.written)
                else:
                    w.shed[r] = shed
            if (w.shed or w.shed_before) and w.recipients and all(r in w.shed or r in w.shed_before
                                                                  for r in w.recipients):
                w.refused = summary({**w.shed_before, **w.shed})

    def _check(self, sender, r, now, config, archived, adds, listed, at, limits=True, queue=True):
        """The Shed of recipient `r`, or None. `queue`: r's inbox is here (an agent of another
        node has its queue there, checked by its own node)."""
        if r in archived:
            return Shed("recipient_archived", None, None,
                        f"{r} is archived (relay archive-agent); relay delivers nothing to it")
        if not limits:              # released by an operator's retry
            return None
        if config.queue_limit and queue:
            held = self._held(r, now, config, adds[r], listed) + adds[r]
            if held >= config.queue_limit:
                # The queue is full, but each of its senders has a share of it: one under its
                # share (made-up senders filled the rest) is not shed.
                mine, senders = self._share(r, sender, adds)
                share = config.queue_limit / senders
                if mine >= share:
                    return Shed("queue_limit", config.queue_limit, held,
                                f"{r} already holds {held} unread messages in its new/ (queue_limit = "
                                f"{config.queue_limit}), {mine} of them from {sender}, its share ({share:g}) "
                                f"among {senders} sender(s); {r} is not reading its inbox")
        if config.pair_rate and config.pair_window:
            # The pair's messages written in the window before this one was (`at`), delivered
            # or admitted in this batch; one written later but delivered already counts too.
            q = self.pairs.get((sender, r))
            if q and q[-1] > now:
                # The clock was set back: deliveries in its future happened just before it, not
                # later, so they count from now, or the pair would wait for the clock to catch up.
                q = self.pairs[(sender, r)] = [min(t, now) for t in q]
            self.low = min(self.low, at)
            since = at - config.pair_window
            sent = sum(len(ts) - bisect.bisect_right(ts, since) for ts in (q or (), self.admitted.get((sender, r), ())))
            if sent >= config.pair_rate:
                return Shed("per_pair_rate", config.pair_rate, sent + 1,
                            f"{sender} sent {r} {sent} messages in the last {seconds(config.pair_window)} "
                            f"(counted by when they were written); this one is over pair_rate = {config.pair_rate} per pair_window = "
                            f"{seconds(config.pair_window)}")
        return None

    def _held(self, r, now, config, adding, listed):
        """Unread envelopes in r's new/: the count kept, or a listing (at most once a batch).
        A listing that finds the queue near its limit also counts whose they are (the ledger
        says who sent each id it knows; an envelope it does not know, a ping or one put there
        by hand, is nobody's)."""
        kept = self.unread.get(r)
        if r not in listed and (kept is None or kept.count + adding + 1 >= config.queue_limit
                                or now - kept.at >= config.rescan_interval):
            listed.add(r)
            ids = []
            count = self.fs.count(f"inbox/{r}/new", lambda e: is_envelope(e) and not ids.append(e.name[:-5]))
            kept = self.unread[r] = Unread(count, now)
            if count + adding + 1 >= config.queue_limit:
                known = self.owners.get(r, {})
                missing = [i for i in ids if i not in known]
                if missing:
                    known.update(self.history.senders_of(missing))
                self.owners[r] = {i: known[i] for i in ids if i in known}
                kept.by = collections.Counter(self.owners[r].values())
            else:
                self.owners.pop(r, None)
                kept.by = collections.Counter()     # far from full: what this relay adds is what counts
        return kept.count

    def _share(self, r, sender, adds):
        """(unread envelopes of `sender` in r's new/, senders sharing r's queue): those with
        envelopes there, counted or admitted in this batch, and `sender` itself."""
        by = self.unread[r].by
        batch = {k[0]: n for k, n in adds.items() if isinstance(k, tuple) and k[1] == r and n}
        senders = {s for s, n in by.items() if n} | set(batch) | {sender}
        return by[sender] + batch.get(sender, 0), len(senders)

    def commit(self, works, now, config):
        """After the batch is recorded: its deliveries enter the windows (at the times their
        messages were written) and the counts kept."""
        window = config.pair_rate and config.pair_window
        for w in works:
            for r in w.delivered_now:
                kept = self.unread.get(r)
                if kept is not None:
                    kept.count += 1
                    kept.by[w.sender] += 1
                    if r in self.owners:
                        self.owners[r][w.id] = w.sender
                if window:
                    at = written(w.sent_at, now) if w.written is None else w.written
                    bisect.insort(self.pairs.setdefault((w.sender, r), []), at)
        if window and now >= self.next_prune:
            # What no message written since the oldest one counted lately can count any more
            # (a backlog's old messages are counted among their own time's).
            cutoff = min(now, self.low) - config.pair_window
            self.pairs = {pair: ts[bisect.bisect_right(ts, cutoff):] for pair, ts in self.pairs.items()
                          if ts and ts[-1] > cutoff}
            self.next_prune = now + config.pair_window
            self.low = float("inf")


def written(sent_at, now):
    """When flow control counts a message as written: its file's time, or now when that is in
    relay's future (or unknown)."""
    return min(sent_at, now) if isinstance(sent_at, (int, float)) and sent_at == sent_at else now
