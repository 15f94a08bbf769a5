"""How many of each node's entries this node refused: each recorded one by one (a failed row, a
log line) up to REFUSALS a minute per node, the rest counted and said once a minute. Past that a
node's stream is read at most once in HOLD seconds for the rest of the minute: a node writing
entries only to have them refused costs this node a bounded share. Every refusal is acknowledged
back to its node either way (receiver.py)."""
import logging

log = logging.getLogger(__name__)

REFUSALS = 100              # refused entries of one node recorded one by one in a minute, at most;
HOLD = 1.0                  # ... past that, its stream is read at most once in this many seconds


class Refusals:
    def __init__(self):
        self.counts = {}            # node -> (minute's start, refusals recorded, refusals not recorded)
        self.held = {}              # node -> when its stream is read again (its refusals passed REFUSALS)

    def until(self, node):
        """When `node`'s stream may be read again (0: now)."""
        return self.held.get(node, 0.0)

    def readable(self, node, now):
        return self.until(node) <= now

    def recorded(self, node, now):
        """Whether a refusal of this node's entry is recorded (a failed row, a log line): at most
        REFUSALS a minute per node; past that they are counted, said once a minute, and the node's
        stream is read at most once in HOLD seconds for the rest of the minute (a node writing
        entries only to have them refused costs this node a bounded share). The refusal is
        acknowledged back either way."""
        start, count, quiet = self.counts.get(node, (now, 0, 0))
        if now - start >= 60:
            if quiet:
                log.error("federation: node %s sent %d more entries refused in the last minute (not recorded one "
                          "by one)", node, quiet)
            start, count, quiet = now, 0, 0
        if count < REFUSALS:
            self.counts[node] = (start, count + 1, quiet)
            return True
        self.counts[node] = (start, count, quiet + 1)
        self.held[node] = now + HOLD
        return False
