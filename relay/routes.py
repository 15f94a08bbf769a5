"""Which recipients live on other nodes of the team: the relay's loop asks the Router, which
reads the directory the federation link last recorded in the ledger (no network, no wait). A
name that is also a local agent stays local. The Router's `queued` event tells the link a
batch has queued messages for other nodes."""
import threading

from .config import SYSTEM


class Router:
    def __init__(self, federation, history):
        self.node = federation.node
        self.history = history
        self.queued = threading.Event()     # set after a batch recorded outbound rows
        self._remote = None

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
