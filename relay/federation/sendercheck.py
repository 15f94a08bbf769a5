"""Who may send through a node's stream: a sender the team's directory gives to that node (or,
not resolved yet, that node's entry alone lists), never one of this node's own agents nor a
case variant of one. receiver.py asks, for each entry of a batch, why its sender may not."""

UNANNOUNCED = "(its node has not announced it)"


class SenderCheck:
    """`routes()` gives the directory as last resolved ({agent: node}, and the set of names in
    conflict); `listed` what a node's entry lists now (listed.py); `team` every node's entry,
    read at most once a second (teamlists.py)."""

    def __init__(self, node, routes, listed, team):
        self.node = node
        self.routes = routes
        self.listed = listed
        self.team = team
        self.team_folded = None     # the names routed or ambiguous, case folded (this batch's)
        self.local_folded = {}      # folded name -> this node's agent (this batch's)

    def batch(self, entries, local):
        """A new batch of entries, to be checked against this node's agents `local`."""
        self.team_folded = None
        self.listed.batch(entries)
        self.team.batch()
        self.local_folded = {name.casefold(): name for name in local}

    def why_not(self, sender, node, local):
        """Why `sender` cannot speak through `node`'s stream, or None when it can."""
        if sender in local:
            return f"the sender {sender} is an agent of this node ({self.node}); node {node} cannot speak for it"
        mine = self.local_folded.get(sender.casefold())
        if mine is not None:
            return f"the sender {sender} differs only by case from {mine}, an agent of this node ({self.node})"
        holds = self.holds(sender, node)
        if holds is False:
            return (f"the sender {sender} is not an agent of node {node} in the team's directory (another node's, "
                    "claimed by more than one, or a case variant of a name the team has)")
        if holds is None:
            return f"the sender {sender} is not in the team's directory {UNANNOUNCED}"
        return None

    def holds(self, agent, node):
        """Whether the directory gives `agent` to `node`: True, False, or None (not known). A
        name this node has not resolved yet (announced since its last read) is looked up in every
        node's entry, now: it is `node`'s only when no other node lists it and it differs only by
        case from no name the team has (a name claimed twice, or a case variant, is no one's)."""
        routes, ambiguous = self.routes()
        if routes.get(agent) != node and (claimed := self.listed.claimed(agent, node)) is not None:
            return claimed          # a name's claim outranks every list (claims.py)
        if agent in routes and routes[agent] != node:
            return self.moved(agent, node, routes[agent])
        if agent in routes:
            return True
        if agent in ambiguous:
            return False
        folded = agent.casefold()
        if self.team_folded is None:
            self.team_folded = {name.casefold() for name in (*routes, *ambiguous)}
        if folded in self.team_folded:
            return False
        lists = self.team.lists(node)
        holders = {n for n, names in lists.items() if folded in names}
        if not holders:
            return None
        return holders == {node} and agent in lists[node][folded]

    def moved(self, agent, node, holder):
        """A sender the directory, as last read, gives to another node (`holder`): `node`'s all
        the same when `holder` lists it no more (it dropped the name, or an operator retired its
        entry since that read) and `node` alone lists it now, as the next look will decide. So
        the new holder's first messages after a retire are not refused for the moment before
        this node's next look. A name its holder still lists is never another node's."""
        folded = agent.casefold()
        if self.listed.lists(holder, folded):
            return False
        lists = self.team.lists(node, force=True)
        holders = {n for n, names in lists.items() if folded in names}
        return holders == {node} and agent in lists[node][folded]
