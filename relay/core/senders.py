"""Whose outboxes relay reads: with `senders = "declared"`, only the declared agents'; what
`relay doctor` and `relay status` say of the outboxes of agents nobody declared."""
from relay.files.layout import is_in_progress_name


class Declared:
    """With `senders = "declared"`: whether an agent is a declared sender, listed in `agents` or
    declared in the ledger (relay init --agent, send --create, the API, adopt --create)."""

    def __init__(self, listed, history):
        self.listed, self.history, self.names = set(listed), history, None

    def __call__(self, name):
        if name in self.listed:
            return True
        if self.names is None:
            self.names = self.history.declared_agents()
        return name in self.names


def undeclared(name, waiting=None):
    """Why the outbox of an agent nobody declared is not read (senders = "declared")."""
    files = "its files wait" if waiting is None else f"{waiting} file(s) wait"
    return (f'not a declared agent (senders = "declared"): {files} until `relay init --agent {name}` '
            "declares it (or it is listed in `agents`)")


def declared(config, history):
    """The Declared of a configuration with `senders = "declared"` (None: every agent sends)."""
    return Declared(config.agents, history) if config.senders == "declared" else None


def undeclared_outboxes(layout, declared):
    """(name, files waiting) of each valid outbox relay does not read because its agent is not
    declared (`declared`: a Declared, or None when every agent's outbox is read)."""
    if declared is None:
        return []
    return [(name, layout.fs.count(rel, lambda e: e.is_file(follow_symlinks=False) and not is_in_progress_name(e.name)))
            for name, rel, problem in layout.outbox_dirs() if problem is None and not declared(name)]
