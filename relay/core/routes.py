"""Which recipients live on other nodes of the team: the relay's loop asks the Router, which
reads the directory the federation link last recorded in the ledger (no network, no wait). A
name that is also a local agent stays local.

The Router is also the loop's only contact with the link: `offer()` hands the link a batch's
messages for other nodes as soon as they are parsed (the link may publish them at once, while
the loop delivers and records locally; the outbound rows recorded by the batch's transaction
stay the record, and a publish repeated after a crash is recognised by the receiver), and the
`queued` event says a batch has recorded outbound rows."""
import collections
import threading

import orjson

from relay.config import SYSTEM

MAX_OFFERED = 16 << 20      # envelope bytes offered and not yet taken by the link, at most


class Router:
    def __init__(self, federation, history):
        self.node = federation.node
        self.history = history
        self.queued = threading.Event()     # set after a batch recorded outbound rows, or offered some
        self.offered = collections.deque()  # (message id, node, recipients, envelope), for the link
        # A link beside the loop takes the offers (federation.Link sets it); run --once has none
        # while it drains, and its rows are published after.
        self.linked = False
        self.wire = None                    # the link's federation.wire.Wire: offers written from the loop
        self.written = False                # offers written since the publisher was last woken for their replies
        self._held = 0                      # envelope bytes in `offered`
        self._lock = threading.Lock()
        self._remote = None
        self.asked = threading.Event()      # the loop met a name it does not know: read the directory now
        self.on_bounce = None               # the loop's: a bounce was recorded (a node refused a message)

    def bounced(self):
        """The link recorded a bounce owed (core/bounces.py): the loop emits it at once."""
        if self.on_bounce is not None:
            self.on_bounce()

    def ask(self):
        """Ask the link to read the team's directory now."""
        self.asked.set()
        self.queued.set()

    def directory_state(self):
        """(when the team's directory was last read whole, why it cannot be read now or None)."""
        link = self.history.link()
        if link is None:
            return None, "not read yet"
        return link["directory_at"], link["directory_error"]

    def remote(self, local, refresh=False):
        """{name: node} of the agents on other nodes (not local ones)."""
        if self._remote is None or refresh:
            self._remote = {name: node for name, (node, _) in self.history.remote_agents().items()
                            if node != self.node}
        return {n: node for n, node in self._remote.items() if n not in local and n != SYSTEM}

    def route(self, recipients, local):
        """{recipient: node} of those of `recipients` who live on another node."""
        remote = self.remote(local)
        return {r: remote[r] for r in recipients if r in remote}

    def offer(self, works):
        """Messages of this batch for other nodes, parsed and about to be delivered here: the
        link may publish them now. Never blocks; offers nothing with no link to take it, and
        nothing past MAX_OFFERED bytes not yet taken (a link that cannot reach the server):
        their outbound rows are the record, published from the ledger."""
        if not self.linked or not works:
            return
        # Written by the loop only behind nothing queued: one sender's messages keep their order.
        if self.wire is not None and not self.offered and self._write(works):
            self.written = True             # their replies are read once the batch is recorded (replied)
            return
        with self._lock:
            for w in works:
                for node, names in sorted(_by_node(w).items()):
                    if self._held + len(w.envelope) > MAX_OFFERED:
                        break
                    self._held += len(w.envelope)
                    self.offered.append((w.id, node, sorted(names), w.envelope))
                else:
                    w.offered = True
        self.queued.set()

    def _write(self, works):
        """The offers written to the server from here (federation/wire.py), if it may."""
        offers = [(w.id, node, orjson.dumps(sorted(names)), w.envelope)
                  for w in works for node, names in sorted(_by_node(w).items())]
        if not self.wire.send(offers):
            return False
        for w in works:
            w.offered = True
        return True

    def replied(self):
        """The batch that wrote offers is recorded: the publisher reads their replies now. Not
        at the write: its thread would wake, read and record the entry ids while the server and
        the receiver act on the message, on the CPUs they need; a reply waits in the socket."""
        if self.written:
            self.written = False
            self.queued.set()

    def take(self, limit):
        """Up to `limit` offers, oldest first (the link)."""
        out = []
        with self._lock:
            while self.offered and len(out) < limit:
                out.append(self.offered.popleft())
                self._held -= len(out[-1][3])
        return out


def _by_node(w):
    """{node: [recipients]} of a work's remote recipients."""
    by_node = {}
    for r, node in w.remote.items():
        by_node.setdefault(node, []).append(r)
    return by_node
