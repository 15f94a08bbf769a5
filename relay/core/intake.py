"""What a step looks at: the watcher's hints (events are hints: a file may be complete, a
directory may hold new files), the full rescan under way (started when the schedule says, or
asked for), and the files of the outbox whose wait ended. `gather(now)` returns the files found,
at most SCAN_BUDGET a step.

Intake uses the outbox (scans and checks), writes the schedule's rescan time, tells the known
agents to `forget()` when directories may have changed and sets `bounces.due` at a scheduled
rescan (a bounce another connection recorded: the federation's link). `watch`, while the loop
runs, is the watcher it reads itself (its hints come back through `hint_many`)."""
import collections
import itertools

from relay.names import reserved
from relay.files.layout import valid_agent

SCAN_BUDGET = 2048       # files registered per step


class Intake:
    def __init__(self, outbox, schedule, known, bounces, wake):
        self.outbox, self.schedule, self.known, self.bounces, self.wake = outbox, schedule, known, bounces, wake
        self.hints = collections.deque()        # (kind, sender, name) from the watcher
        self.scan = None                        # the full rescan in progress (a generator)
        self.watch = None                       # the watcher the loop reads itself, while it runs

    def hint(self, kind, sender=None, name=None):
        """kind: 'file' (may be complete), 'closed' (complete), 'dir' (scan it), 'rescan'."""
        self.hints.append((kind, sender, name))
        self.wake.set()

    def hint_many(self, hints):
        """Several hints at once (one read of the watcher): one wake for them all."""
        self.hints.extend(hints)
        self.wake.set()

    def busy(self):
        """Hints wait, or a rescan is under way: the next step has files to look at."""
        return bool(self.hints) or self.scan is not None

    def more_ready(self, claimed, batch):
        """Whether another batch is likely ready at once (hints waiting, a rescan under way, or
        a full claim): then the last sync of this one overlaps the next step's reading. The
        watcher the loop reads itself is read first: what came during this step."""
        if self.watch is not None:
            self.watch.pump(0)
        return self.busy() or len(claimed) >= batch

    def rescan(self, now):
        self.known.forget()
        self.scan = self.outbox.scan_all(now)

    def gather(self, now):
        found = []
        if now >= self.schedule.rescan_at and self.scan is None:
            self.bounces.due = True         # one another connection recorded (the federation's link)
            self.rescan(now)
            self.schedule.rescanned(now)
        while self.hints and len(found) < SCAN_BUDGET:
            kind, sender, name = self.hints.popleft()
            if kind == "rescan":
                self.rescan(now)
            elif kind == "dir":
                self.known.forget()
                if sender in set(self.outbox.agent_dirs()):
                    found.extend(self.outbox.scan_dir(sender, now))
            elif valid_agent(sender) and not reserved(sender) and self.outbox.serves(sender):
                hit = self.outbox.check(sender, name, now, hinted=(kind == "closed"))
                if hit:
                    found.append(hit)
        found.extend(self.outbox.due_waiting(now))
        if self.scan is not None:
            more = list(itertools.islice(self.scan, max(0, SCAN_BUDGET - len(found))))
            found.extend(more)
            if len(found) < SCAN_BUDGET:
                self.scan = None
        return found
