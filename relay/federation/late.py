"""Publishing again what waited past its deadline, at a cost per node bounded whatever the node
leaves unacknowledged.

A published row whose acknowledgement does not come by its deadline (`ack_timeout`, doubled
with each publish of the row) is published again while its node is alive: an acknowledgement
lost, or a receiver whose reading was cut. A node that reads nothing and answers nothing (frozen,
or hostile: it announces itself and never acknowledges) would otherwise have its whole backlog
published again as each deadline passed, 256 rows a second, for as long as it stays silent.

So late rows go again by node, in rounds: at most ROUND rows of one node a round and PER_MINUTE
a minute; a node that settled none of this node's rows (acknowledged or refused) since its last
round has its next one after 1, 2, 4 ... seconds, at most QUIET_CAP apart; one that answered
has its next round at the next look. The rows of one node never wait for another's.
"""

ROUND = 128                 # rows of one node published again for their deadline per round, at most ...
PER_MINUTE = 512            # ... and per minute
QUIET_BASE = 1.0            # seconds to a silent node's next round, doubled while it stays silent ...
QUIET_CAP = 600.0           # ... at most this


class Late:
    """The publisher's rounds of late rows (its thread)."""

    def __init__(self, history):
        self.history = history
        self.pace = {}              # node -> (next round allowed, interval)
        self.quota = {}             # node -> (minute's start, rows left)
        self.heard = set()          # nodes that settled a row since their last round

    def answered(self, node):
        """`node` settled a row of this node's (acknowledged or refused it): it reads."""
        self.heard.add(node)

    def due(self, now, alive):
        """(message id, node) of the rows to publish again now for their deadline, of the nodes
        alive (`alive`: node -> bool) whose round it is."""
        out = []
        for node in self.history.remote.waiting_nodes():
            if not alive.get(node) or now < self.pace.get(node, (0.0, 0.0))[0]:
                continue
            start, left = self.quota.get(node, (now, PER_MINUTE))
            if now - start >= 60:
                start, left = now, PER_MINUTE
            if left <= 0:
                self.pace[node] = (start + 60, self.pace.get(node, (0.0, QUIET_BASE))[1])
                continue
            rows = self.history.remote.overdue(now, min(ROUND, left), node=node)
            if not rows:
                continue
            self.quota[node] = (start, left - len(rows))
            _, interval = self.pace.get(node, (0.0, 0.0))
            interval = QUIET_BASE if node in self.heard or not interval else min(QUIET_CAP, 2 * interval)
            self.heard.discard(node)
            self.pace[node] = (now + interval, interval)
            out += [(r["message_id"], node) for r in rows]
        return out
