"""Repeated errors logged once per change of condition, then a count at most once a minute, so
that a server refusing every write does not fill the log."""
import time

EVERY = 60.0


class Condition:
    def __init__(self, log, what, clock=time.monotonic):
        self.log = log
        self.what = what
        self.clock = clock
        self.current = None
        self.count = 0
        self.since = None
        self.next = 0.0

    def report(self, why):
        """The condition holds now, for `why`."""
        now = self.clock()
        if why != self.current:
            self.log.error("%s: %s", self.what, why)
            self.current, self.count, self.since, self.next = why, 0, now, now + EVERY
            return
        self.count += 1
        if now >= self.next:
            self.log.error("%s: %s (again %d times in the last %.0fs)", self.what, why, self.count, now - self.since)
            self.count, self.since, self.next = 0, now, now + EVERY

    def clear(self):
        """The condition ended (said once, if it held)."""
        if self.current is not None:
            self.log.info("%s: no longer (%s)", self.what, self.current)
        self.current, self.count = None, 0
