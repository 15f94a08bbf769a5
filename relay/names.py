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

- A name too like a reserved one is one too: the same once `.`, `_` and `-` (the punctuation an
  agent name may hold) are trimmed from both its ends and it is case-folded (`System.`,
  `Broadcast_`, `SYSTEM..`): a reader would take it for relay's own.
- A new agent's name may not be another known agent's in another case (`ann` beside `Ann`): a
  file system that folds case gives both one directory. namesake() names the agent it would be.
- A kind is a plain token (KIND_RULE, after trimming ASCII spaces): no control, format, bidi or
  other non-ASCII character hides in it. Relay's own kinds are compared after NFKC and
  case-folding, with the same ends trimmed, so no lookalike of one passes from an agent.

agent-relay's `Lead` is no reserved name: relay gives it no meaning (to agent-relay it is only
the name its lead agent is usually given, an agent like any other that sends and receives mail),
and reserving it would refuse the lead of every team the import brings in."""
import re
import unicodedata

from relay.errors import InvalidName

AGENT_NAME_RULE = "[A-Za-z0-9][A-Za-z0-9._-]{0,63}"     # agent names (contract §1), as people read it
AGENT_NAME = re.compile(AGENT_NAME_RULE + r"\Z")
SYSTEM = "System"
BROADCAST = ("*", "Broadcast")          # every known agent but the sender, as a recipient
RESERVED = (SYSTEM, "Broadcast", "*")
_FOLDED = {n.casefold(): n for n in RESERVED}
SYSTEM_KINDS = ("bounce", "ping", "reservation-refused")    # the kinds of what relay writes itself
ENDS = "._-"            # the punctuation an agent name may hold: trimmed from both ends to compare
KIND_RULE = "[A-Za-z0-9][A-Za-z0-9._-]{0,63}"   # a message's kind, after trimming ASCII spaces (contract §2)
KIND = re.compile(KIND_RULE + r"\Z")


def fold(text):
    """`text` as relay compares names and kinds: NFKC, case-folded ('ＡＮＮ', 'ann' -> 'ann')."""
    if text.isascii():          # every agent name: the same, and many times faster
        return text.lower()
    return unicodedata.normalize("NFKC", text).casefold()


def reserved(name):
    """The reserved name `name` is, or is too like: the same once [._-] are trimmed from both ends
    and it is case-folded ('sYsTeM', 'System.', 'broadcast_' -> 'System', 'Broadcast'), or None."""
    return _FOLDED.get(fold(name).strip(ENDS)) if isinstance(name, str) else None


def namesake(name, existing):
    """The agent of `existing` whose directories `name` would share on a file system that folds
    case (the same name case-folded, spelt otherwise), or None: always None when `name` itself
    is one of `existing` (an agent already there, whatever else is)."""
    if not isinstance(name, str) or name in existing:
        return None
    key = fold(name)
    return next((other for other in sorted(existing) if fold(other) == key), None)


def namesake_problem(name, existing):
    """Why `name` cannot be a new agent's, being another's in another case, or None."""
    other = namesake(name, existing)
    if other is None:
        return None
    return f"{name[:70]!r} would be the same as the agent {other!r} on a case-insensitive file system; use {other!r}"


def twins(names):
    """Why a list of agent names cannot stand together (two the same once case-folded), or None."""
    first = {}
    for name in names:
        other = first.setdefault(fold(name), name)
        if other != name:
            return (f"{other!r} and {name!r} would be the same agent on a case-insensitive file system; "
                    "list one of them")
    return None


def meaning(reserved_name):
    return "relay's own name" if reserved_name == SYSTEM else "every agent (as '*')"


def why_reserved(name):
    """Why `name` cannot be an agent's name because it is reserved, or None."""
    canon = reserved(name)
    if canon is None:
        return None
    if fold(name) == canon.casefold():
        return f"{name[:70]!r} is a name relay keeps for itself ({canon}: {meaning(canon)}), in any case"
    return (f"{name[:70]!r} is too like a name relay keeps for itself ({canon}: {meaning(canon)}): no agent "
            "bears it in any case, nor with '.', '_' or '-' at its ends")


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
    """The kind relay writes itself that `kind` is, or is a lookalike of: the same after NFKC and
    case-folding, with format and control characters dropped and white space and [._-] trimmed
    from both ends ('Bounce', 'ｂｏｕｎｃｅ', 'bounce' + U+200B -> 'bounce'), or None."""
    if not isinstance(kind, str):
        return None
    folded = "".join(c for c in fold(kind) if unicodedata.category(c) not in ("Cf", "Cc"))
    folded = folded.strip().strip(ENDS).strip()
    return folded if folded in SYSTEM_KINDS else None


def kind_token_problem(kind):
    """Why `kind` (trimmed of ASCII spaces) is no plain token (KIND_RULE), or None; the first
    character that does not belong is named (U+200B ZERO WIDTH SPACE, ...)."""
    if kind is None:
        return None
    if not isinstance(kind, str):
        return f"the kind must be text, not {type(kind).__name__}"
    token = kind.strip(" ")
    if KIND.match(token):
        return None
    odd = next((c for c in token if not (c.isascii() and (c.isalnum() or c in ENDS))), None)
    what = "" if odd is None else f": it holds U+{ord(odd):04X} {unicodedata.name(odd, 'a control character')}"
    return f"kind {token[:70]!r} is not a plain token{what}; kinds match {KIND_RULE}"


def kind_problem(kind, sender):
    """Why `sender` may not send a message of `kind` (no plain token, or one relay writes itself,
    or too like one), or None."""
    problem = kind_token_problem(kind)
    if problem is not None:
        return problem
    own = system_kind(kind)
    if own is None or sender == SYSTEM:
        return None
    return (f"kind {own!r} is relay's own: only {SYSTEM} sends it (a {own} from an agent would read as "
            f"relay's); choose another kind")
