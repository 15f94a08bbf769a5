"""Which recipients live on other nodes of the team: the relay's loop asks the Router, which
reads the directory the federation link last recorded in the ledger (no network, no wait). A
name that is also a local agent stays local.

The Router is also the loop's only contact with the link: `offer()` hands the link a batch's
messages for other nodes as soon as they are parsed (the link may publish them at once, while
the loop delivers and records locally; the outbound rows recorded by the batch's transaction
stay the record, and a publish repeated after a crash is recognised by the receiver), and the
`queued` event says a batch has recorded outbound rows.

The pipeline (pipeline.py) meets the federation at one seam, the relay's `router`: a Router on a
node of a team, Alone on a single machine (every recipient local, nothing handed over, an unknown
name refused at once). Both answer `remote`, `route`, `wait_for`, `hand_over`, `recorded` and
`abandoned`; KnownAgents asks `remote` for the names on other nodes."""
import collections
import threading

import orjson

from relay.config import SYSTEM
from relay.errors import TransientError

MAX_OFFERED = 16 << 20      # envelope bytes offered and not yet taken by the link, at most
CONVERGE = 2.0              # seconds after a message was found that the directory is read before its unknown name fails


class KnownAgents:
    """The names a message may be addressed to: this node's agents (the layout's, and relay.toml's
    `agents`) and those the router knows on other nodes, read once and kept until `forget()` (a
    directory made or gone, a rescan, a reload). Called as `known(refresh=False)` (message.accept).
    Uses layout.agent_names and router.remote; `local` is this node's agents as last read."""

    def __init__(self, layout, config, router):
        self.layout, self.config, self.router = layout, config, router
        self.local = set()
        self._known = None

    def __call__(self, refresh=False):
        if self._known is None or refresh:
            self._known = self.local = self.layout.agent_names(self.config.agents)
            remote = self.router.remote(self.local, refresh=True)
            if remote:
                self._known = self.local | set(remote)
        return self._known

    def forget(self):
        """Read the names again when next asked."""
        self._known = None


class Alone:
    """The router of a relay that is its team's only node: every recipient is local, nothing is
    handed to a link, a name nobody knows is refused at once."""
    linked = False
    on_bounce = None

    def remote(self, local, refresh=False):
        return {}

    def route(self, recipients, local):
        return {}

    def wait_for(self, error, since, now):
        return None

    def hand_over(self, works, ready, custody):
        return ready

    def recorded(self, works):
        pass

    def abandoned(self):
        pass


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
        # The case-folded senders whose messages may be offered (the link's: announced, their
        # names claimed, none of their rows held); None: every sender. The others' are
        # published from their rows once announced (federation/speakers.py).
        self.announced = None

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
        link = self.history.remote.link()
        if link is None:
            return None, "not read yet"
        return link["directory_at"], link["directory_error"]

    def remote(self, local, refresh=False):
        """{name: node} of the agents on other nodes (not local ones)."""
        if self._remote is None or refresh:
            self._remote = {name: node for name, (node, _) in self.history.remote.agents().items()
                            if node != self.node}
        return {n: node for n, node in self._remote.items() if n not in local and n != SYSTEM}

    def route(self, recipients, local):
        """{recipient: node} of those of `recipients` who live on another node."""
        remote = self.remote(local)
        return {r: remote[r] for r in recipients if r in remote}

    def wait_for(self, error, since, now):
        """A recipient this node does not know (UnknownRecipient `error`) may be one the team is
        still announcing: the message waits (a transient error, tried again within retry_period)
        until the directory has been read whole CONVERGE seconds after the message was found
        (`since`); only then does it fail ("did you mean"). Returns the TransientError it waits
        with, or None: it fails now."""
        read_at, why_not = self.directory_state()
        if why_not is None and read_at is not None and read_at >= since + CONVERGE:
            return None
        self.ask()
        why = f"the team's directory cannot be read: {why_not}" if why_not else "the team's directory is being read"
        return TransientError(f"{error} ({why}; the message waits for the name)"[:800])

    def hand_over(self, works, ready, custody):
        """A batch's first tries, admitted and about to be delivered here: what they carry for
        other nodes is taken into the spool first (`custody(works)`), then offered to the link.
        A retry is published from its recorded row. Returns the works still ready."""
        custody(works)
        ready = [w for w in ready if not (w.refused or w.error)]
        for w in ready:
            named = set(w.recipients)
            w.remote = {r: n for r, n in w.remote.items()
                        if r in named and r not in w.shed and r not in w.shed_before}
        self.offer([w for w in ready if w.remote and not w.earlier_attempt])
        return ready

    def recorded(self, works):
        """A batch is recorded: the link publishes what it queued and was not offered, and the
        publisher reads the replies to what the loop wrote to the server (an acknowledgement read
        before this record waits for it: federation/publisher.py)."""
        if any(w.remote and not w.offered for w in works):
            self.queued.set()
        self.replied()

    def abandoned(self):
        """A batch dropped unrecorded: what it wrote to the server was written all the same."""
        self.replied()

    def offer(self, works):
        """Messages of this batch for other nodes, parsed and about to be delivered here: the
        link may publish them now. Never blocks; offers nothing with no link to take it, and
        nothing past MAX_OFFERED bytes not yet taken (a link that cannot reach the server):
        their outbound rows are the record, published from the ledger."""
        if self.announced is not None:
            works = [w for w in works if w.sender.casefold() in self.announced]
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
