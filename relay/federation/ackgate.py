"""What a node's acknowledgements may cost this one: a share per node and second, and one lookup
per batch that tells the acknowledgements of rows this node has for it from made-up ones.

A node may write acknowledgements in bulk into its own stream, of ids this node never sent it.
Each is parsed (a few microseconds) and looked up with the others of its batch in the ledger
(one indexed query per 500): an id with no row for that node, and none in flight to it (written
by the loop, not recorded yet), touches no row, is never held for later, and only the entry it
names is deleted (from this node's own stream to that node) with the batch's one XDEL. At most
ACKS_PER_SECOND of one node's are taken a second (a second's worth saved at most; an entry
taken whole past the share is owed by the next calls), at most ACKS_PER_CALL a call: the rest
wait in its stream, read later, and no other node's wait behind them.

A node whose batch was made up almost whole (at least MADE_UP of it, of MADE_UP_BATCH or more)
has its share halved, down to FLOOR a second, until a batch of its own is mostly genuine again:
a node flooding made-up acknowledgements then costs an entry read now and then, and an honest
node (whose acknowledgements name rows waiting for it) keeps the whole share.
"""
ACKS_PER_SECOND = 8192      # acknowledgements of one node taken per second (an honest node's come by batch)
FLOOR = 256                 # ... the least, a second, of a node whose acknowledgements are made up
MADE_UP = 0.9               # the part of a batch made up that halves its node's share ...
MADE_UP_BATCH = 64          # ... in a batch of at least this many
WAITING = ("pending", "published")


def node_of(key):
    """The node whose acknowledgement stream `key` is (relay:{team}:from:<node>:ack:<me>)."""
    return key.split(":from:", 1)[1].split(":ack:", 1)[0]


class AckGate:
    def __init__(self, history, per_call=8192):
        self.history = history
        self.per_call = per_call
        self.shares = {}            # acknowledgement stream -> (acknowledgements it may take, when)
        self.rates = {}             # node -> its share a second, when less than ACKS_PER_SECOND

    def share(self, key, now):
        """The acknowledgements of one stream this call may take (< 1: none)."""
        rate = self.rates.get(node_of(key), ACKS_PER_SECOND)
        left, at = self.shares.get(key, (rate, now))
        left = min(rate, left + rate * max(0.0, now - at))
        return min(self.per_call, left)

    def owe(self, budget, now):
        """What each stream's share is after a call ({key: what is left of it, below 0 when owed})."""
        for key, left in budget.items():
            self.shares[key] = (min(left, self.rates.get(node_of(key), ACKS_PER_SECOND)), now)

    def _judge(self, node, total, made_up):
        if total >= MADE_UP_BATCH and made_up >= MADE_UP * total:
            self.rates[node] = max(FLOOR, self.rates.get(node, ACKS_PER_SECOND) // 2)
        elif 2 * made_up < total:
            self.rates.pop(node, None)

    def known(self, node, acks, flying):
        """Of a batch of `node`'s acknowledgements ((message id, entry id, refusal)): (those of
        rows waiting for it, or in flight to it (`flying()`, asked only when needed); the entry
        ids the others name, to delete; the message ids of the others)."""
        if not acks:
            return [], [], []
        states = self.history.remote.outbound_states(node, [mid for mid, _, _ in acks])
        inflight, out, named, dropped = None, [], [], []
        for a in acks:
            status = states.get(a[0])
            if status in WAITING:
                out.append(a)
                continue
            if status is None:
                if inflight is None:
                    inflight = flying()
                if a[0] in inflight:
                    out.append(a)
                    continue
            if a[1]:
                named.append(a[1])
            dropped.append(a[0])
        self._judge(node, len(acks), len(dropped))
        return out, named, dropped
