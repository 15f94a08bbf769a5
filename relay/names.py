"""The names relay gives a meaning of its own, and the one rule about them, used wherever a name
enters (init, send, spawn, adopt, an outbox directory, the import, a federation node's list):

- `System` is relay's own name: its inbox (control messages) and the sender of what relay
  writes itself (SYSTEM_KINDS: bounces, pings, reservation notices). `Broadcast` and `*` mean
  every agent. No agent bears one of them in any case (`system`, `SYSTEM`, `bROADCAST`): a file
  system that folds case would give two of them one directory, and a reader cannot tell them
  apart.
- As a recipient each is meaningful only as its special address, spelt as relay spells it
  (`System`, `Broadcast`, `*`); another case of one is refused, never taken for a new agent.
- A message of a kind relay writes itself is accepted only from System.

agent-relay's `Lead` is no reserved name: relay gives it no meaning (to agent-relay it is only
the name its lead agent is usually given, an agent like any other that sends and receives mail),
and reserving it would refuse the lead of every team the import brings in."""
import re

from relay.errors import InvalidName

AGENT_NAME_RULE = "[A-Za-z0-9][A-Za-z0-9._-]{0,63}"     # agent names (SPEC section 1), as people read it
AGENT_NAME = re.compile(AGENT_NAME_RULE + r"\Z")
SYSTEM = "System"
BROADCAST = ("*", "Broadcast")          # every known agent but the sender, as a recipient
RESERVED = (SYSTEM, "Broadcast", "*")
_FOLDED = {n.casefold(): n for n in RESERVED}
SYSTEM_KINDS = ("bounce", "ping", "reservation-refused")    # the kinds of what relay writes itself


def reserved(name):
    """The reserved name `name` is in some case ('sYsTeM' -> 'System'), or None."""
    return _FOLDED.get(name.casefold()) if isinstance(name, str) else None


def meaning(reserved_name):
    return "relay's own name" if reserved_name == SYSTEM else "every agent (as '*')"


def why_reserved(name):
    """Why `name` cannot be an agent's name because it is reserved, or None."""
    canon = reserved(name)
    if canon is None:
        return None
    return f"{name[:70]!r} is a name relay keeps for itself ({canon}: {meaning(canon)}), in any case"


def agent_problem(name):
    """Why `name` cannot be an agent's name (not one at all, or a reserved one), or None."""
    if reserved(name):
        return why_reserved(name)
    if not isinstance(name, str) or not AGENT_NAME.match(name):
        return f"invalid agent name {str(name)[:70]!r}: agent names match {AGENT_NAME_RULE}"
    return None


def agent(name, where=None):
    """`name` when it can be an agent's; InvalidName saying why not (`where`: how it was given)."""
    problem = agent_problem(name)
    if problem is not None:
        raise InvalidName(problem + (f" ({where})" if where else ""))
    return name


def address_problem(name):
    """Why `name` cannot stand as a recipient: a reserved name in a case relay does not spell it
    (a reserved name means only its special address), or None."""
    canon = reserved(name)
    if canon is None or name == canon:
        return None
    return (f"{name[:70]!r} is a name relay keeps for itself, in any case: write {canon} "
            f"for {meaning(canon)}{' (its inbox)' if canon == SYSTEM else ''}; no agent is named so")


def system_kind(kind):
    """The kind relay writes itself that `kind` is in some case ('Bounce' -> 'bounce'), or None."""
    if not isinstance(kind, str):
        return None
    folded = kind.strip().casefold()
    return folded if folded in SYSTEM_KINDS else None


def kind_problem(kind, sender):
    """Why `sender` may not send a message of `kind` (one relay writes itself), or None."""
    own = system_kind(kind)
    if own is None or sender == SYSTEM:
        return None
    return (f"kind {own!r} is relay's own: only {SYSTEM} sends it (a {own} from an agent would read as "
            f"relay's); choose another kind")
