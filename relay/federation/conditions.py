"""Repeated errors logged once per condition, then a count at most once a minute, so that a
server refusing every write does not fill the log. A condition whose reason alternates (a TLS
handshake refused one way, then another) is one condition: each reason is said once while it
lasts, at most SAID of them, and the rest counted."""
import time

EVERY = 60.0
SAID = 8


class Condition:
    def __init__(self, log, what, over=None, clock=time.monotonic):
        self.log = log
        self.what = what
        self.over = over or f"{what}: no longer"      # what is said when it ends
        self.clock = clock
        self.current = None
        self.said = set()           # the reasons said since the condition began
        self.count = 0
        self.since = None
        self.next = 0.0

    def report(self, why):
        """The condition holds now, for `why`."""
        now = self.clock()
        if self.current is None:
            self.count, self.since, self.next = 0, now, now + EVERY
        self.current = why
        if why not in self.said and len(self.said) < SAID:
            self.said.add(why)
            self.log.error("%s: %s", self.what, why)
            return
        self.count += 1
        if now >= self.next:
            self.log.error("%s: %s (again %d times in the last %.0fs)", self.what, why, self.count, now - self.since)
            self.count, self.since, self.next = 0, now, now + EVERY

    def clear(self):
        """The condition ended (said once, if it held)."""
        if self.current is not None:
            self.log.info("%s (it was: %s)", self.over, self.current)
        self.current, self.count = None, 0
        self.said.clear()
