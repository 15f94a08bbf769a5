"""Bytes a scan reads ahead: a plain outbox file found by a scan (not by an event) is read by
the same open that checks it for a writer (Outbox._busy), and its claim takes those bytes instead
of opening the file again (Outbox.peek). Custody checks, as for any read before it, that the
file is still the one read, or delivers the bytes read.

Each read belongs to the message registered for its file (bind), and only that message's claim
takes it; a read for a file that registered nothing (its path has a message already), or one its
claim did not take (claimed again from the outbox, deferred before reading), is dropped, so old
bytes never become a later message at the same name. Bounded: at most LIMIT bytes held at once,
each file counted with COST for its objects; the room is given back as each claim takes its own,
and everything is dropped when the next full scan begins and at recovery."""

FILE = 64 * 1024            # a file is read ahead up to this size
LIMIT = 1024 * 1024         # held at once at most
COST = 400                  # bytes of the objects that hold one file's bytes and identity


class ReadAhead(dict):
    """(sender, name) -> (bytes, identity as Work.peeked, mtime, message id or None)."""

    def __init__(self):
        super().__init__()
        self.held = 0               # bytes held, each file counted with COST
        self.limit = LIMIT
        self.unbound = []           # keys read since the last bind()

    def wants(self, key, size):
        """Whether a file of `size` bytes at `key` is to be read ahead now: small, room left,
        and not already read for a message registered and not yet claimed."""
        old = self.get(key)
        return (old is None or old[3] is None) and size <= FILE and self.held < self.limit

    def put(self, key, data, peeked, mtime):
        old = self.get(key)
        if old is not None:
            self.held -= len(old[0]) + COST
        else:
            self.unbound.append(key)
        self[key] = (data, peeked, mtime, None)
        self.held += len(data) + COST

    def bind(self, registered):
        """Give what this step's checks read to the messages registered for those files
        (`registered`: (id, sender, name)); what was read for a file that registered nothing is
        dropped: those bytes are no message's."""
        ids = {(sender, name): mid for mid, sender, name in registered}
        for key in self.unbound:
            entry = self.get(key)
            if entry is None or entry[3] is not None:
                continue
            mid = ids.get(key)
            if mid is None:
                self.take(key)
            else:
                self[key] = (*entry[:3], mid)
        self.unbound.clear()

    def release(self, works):
        """What was read ahead for claimed messages that did not take it: their room given back."""
        for w in works:
            entry = self.get((w.sender, w.name))
            if entry is not None and entry[3] == w.id:
                self.take((w.sender, w.name))

    def take(self, key):
        """The entry at `key` (or None), removed and its room given back."""
        entry = self.pop(key, None)
        if entry is not None:
            self.held -= len(entry[0]) + COST
        return entry

    def drop(self):
        self.clear()
        self.unbound.clear()
        self.held = 0
