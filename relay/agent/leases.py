"""File reservations for agents: advisory leases on paths and globs of the project, the Agent's
`reserve`, `release` and `reservations` (mixed into api.Agent; the CLI's verbs and the MCP tools
are built on them).

    me.reserve(["src/parser/"], ttl="30m", exclusive=True, reason="lexer rewrite")
    me.release(["src/parser"])           # me.release(): every reservation of mine
    for r in me.reservations(): print(r.agent, r.path, r.exclusive, r.expires_at)

Paths are normalised relative to the project root and must stay inside it; what overlaps what
is files/patterns.py's rule. An exclusive reservation excludes every overlapping one of another
agent, a shared one only exclusive ones; a request is granted whole or refused whole
(ReservationConflict naming each holder, its pattern and until when). Reserving again what one
holds renews it. Leases end by themselves at their time (the Project's clock). The decision and
its record are one ledger transaction (ledger/reservations.py; the overlaps are decided
before it, outside the write lock, and bounded: files/patterns.py Work); a holder is told of a
refusal on its paths by a notice from System in its inbox (core/notices.py), once per lease and
requester, written by the refused agent's process right after the decision (a notice that
could not be written then is written by the next reserve or release of any agent).
"""
import dataclasses
import functools
import logging

import orjson

from relay.config import SYSTEM, parse_duration
from relay.core import notices
from relay.core.message import iso
from relay.errors import InvalidName, RelayError, ReservationConflict
from relay.files.patterns import normalise, scope
from relay.ids import IdGenerator
from relay.ledger.history import History
from relay.ledger.reservations import mode, utc
from relay.terminal import unsafe

log = logging.getLogger(__name__)

DEFAULT_TTL = 3600.0            # a lease's length when none is given
MAX_TTL = 7 * 86400.0           # longer is refused: a lease is renewed, not taken for ever
MAX_PATHS = 200                 # paths one request names at most
MAX_REASON = 500                # characters of a reason
KIND = "reservation-refused"    # the kind of the notice a holder gets

_ids = IdGenerator()


@dataclasses.dataclass(frozen=True)
class Reservation:
    """One lease: `path` (a normalised path or glob) held by `agent` since `since` until
    `expires_at` (epoch seconds), exclusive or shared, with the holder's `reason`; its `scope`
    says what it holds (files/patterns.py)."""
    agent: str
    path: str
    scope: str              # "file", "tree" (it and all under it) or "glob" (what it matches)
    exclusive: bool
    reason: str
    since: float
    expires_at: float

    @classmethod
    def of(cls, row):
        return cls(agent=row["agent"], path=row["pattern"], scope=row["scope"], exclusive=bool(row["exclusive"]),
                   reason=row["reason"],
                   since=row["since"], expires_at=row["expires_at"])

    def as_dict(self, now):
        return {"agent": self.agent, "path": self.path, "scope": self.scope, "exclusive": self.exclusive,
                "reason": self.reason,
                "since": iso(self.since), "expires_at": iso(self.expires_at),
                "expires_in_s": round(max(0.0, self.expires_at - now), 3)}


def ttl_seconds(ttl):
    """A lease's length in seconds, from a number of seconds or a duration ("30m", "2h")."""
    try:
        seconds = float(ttl) if isinstance(ttl, (int, float)) and not isinstance(ttl, bool) else parse_duration(ttl)
    except (TypeError, ValueError) as e:
        raise RelayError(f"a lease's length: {e}") from None
    if not 0 < seconds <= MAX_TTL:
        raise RelayError(f"a lease lasts more than 0s and at most 7d, not {ttl!r}; renew it by reserving again")
    return seconds


def left(seconds):
    """How long until an instant, for people: 45s, 29m, 3h05m, 2d04h."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def conflict_text(c, now):
    """One lease in the way, as a refusal names it."""
    why = f"; reason: {c['reason']}" if c["reason"] else ""
    held = "" if c["held"] == c["path"] else f" (as {c['held']})"
    return (f"{c['path']} is held {'exclusively' if c['exclusive'] else 'shared'} by {c['holder']}{held} until "
            f"{utc(c['expires_at'])} (in {left(c['expires_at'] - now)}{why})")


def refusal(agent, exclusive, conflicts, now, archived=()):
    """The ReservationConflict naming each lease in the way, and which holders were told (an
    archived holder is not: its inbox is not written)."""
    holders = list(dict.fromkeys(c["holder"] for c in conflicts))
    told = [h for h in holders if h not in archived]
    gone = [h for h in holders if h in archived]
    said = [f"{', '.join(told)} {'was' if len(told) == 1 else 'were'} told"] if told else []
    if gone:
        said.append(f"{', '.join(gone)} {'is' if len(gone) == 1 else 'are'} archived and "
                    f"{'was' if len(gone) == 1 else 'were'} not told")
    return ReservationConflict(
        f"nothing reserved for {agent}: " + "; ".join(conflict_text(c, now) for c in conflicts)
        + f". {'; '.join(said)}; ask, wait for the lease to end, or reserve other paths", conflicts)


def notice(requester, exclusive, now, holder, conflicts):
    """The (subject, body, headers) of the notice telling `holder` that `requester` was refused."""
    asked = ", ".join(dict.fromkeys(c["path"] for c in conflicts))
    held = ", ".join(dict.fromkeys(c["held"] for c in conflicts))
    lines = [f"{requester} asked to reserve {asked} ({mode(exclusive)}) at {utc(now)} and was refused: "
             f"you hold {held}."]
    lines += [f"  {c['held']} ({mode(c['exclusive'])}) until {utc(c['expires_at'])}"
              + (f"; reason: {c['reason']}" if c["reason"] else "") for c in dict((c["held"], c) for c in conflicts).values()]
    lines += ["", f"Nothing to do if you still need them. When you are done: `relay release --agent {holder} {held.split(', ')[0]}` "
                  f"(or release() / the release tool), and tell {requester} (`relay send --from {holder} --to {requester}`)."]
    headers = {"requester": requester, "requested": asked, "held": held}
    return f"reservation: {requester} was refused on {held}", "\n".join(lines), orjson.dumps(headers).decode()


class Leases:
    """Agent's part for file reservations (uses self.name, self.project, self.layout)."""

    def reserve(self, paths, ttl=DEFAULT_TTL, *, exclusive=False, reason=None, base=None):
        """Reserve `paths` (a path or glob, or a list of them) for this agent for `ttl` (seconds
        or a duration, at most 7d): every one or, when another agent holds an overlapping lease
        that is exclusive (or this request is), none: ReservationConflict names each. A relative
        path is taken from `base` (a directory; default the project root). Returns the
        Reservations made or renewed."""
        if self.name == SYSTEM:
            raise InvalidName(f"{SYSTEM!r} is relay's own name; only agents reserve files")
        patterns = self._patterns(paths, base)
        seconds = ttl_seconds(ttl)
        if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON
                                   or any(unsafe(c) or 0xD800 <= ord(c) < 0xE000 for c in reason)):
            raise RelayError(f"a reason is one line of at most {MAX_REASON} characters, without control characters")
        now = self.project.clock()
        with self.project.writing() as ledger:
            granted, conflicts, _ = ledger.reservations.reserve(
                self.name, patterns, now, now + seconds, bool(exclusive), reason or None, functools.partial(_ids.new, now),
                functools.partial(notice, self.name, bool(exclusive), now))
            self._tell(ledger, now)
            archived = History(ledger).archived_agents() if conflicts else ()
        if conflicts:
            raise refusal(self.name, exclusive, conflicts, now, archived)
        return [Reservation.of(r) for r in granted]

    def release(self, paths=None, *, base=None):
        """Release this agent's reservations of `paths` (as reserved; None: all of them).
        Returns the paths released: one not held is left out."""
        patterns = None if paths is None else self.normalised(paths, base)
        now = self.project.clock()
        with self.project.writing() as ledger:
            gone = ledger.reservations.release(self.name, patterns or (), now, everything=patterns is None)
            self._tell(ledger, now)
        return gone

    def reservations(self, mine=False):
        """The leases held now, everyone's (or with `mine`, this agent's), by agent and path."""
        history = self.project.history()
        if history is None:
            return []
        with history:
            rows = history.reservations.held(self.project.clock(), agent=self.name if mine else None)
        return [Reservation.of(r) for r in rows]

    def normalised(self, paths, base=None):
        """`paths` as reservations name them: relative to the project root, normalised."""
        return [p for p, _ in self._patterns(paths, base)]

    def _patterns(self, paths, base):
        paths = [paths] if isinstance(paths, str) else list(paths)
        if not paths:
            raise RelayError("name at least one path or glob")
        if len(paths) > MAX_PATHS:
            raise RelayError(f"{len(paths)} paths in one request; at most {MAX_PATHS}")
        root = self.project.config.root
        return [(p, scope(p, root)) for p in dict.fromkeys(normalise(p, root, base) for p in paths)]

    def _tell(self, ledger, now):
        """Write the notices not yet in their holders' inboxes (this request's, and any an
        earlier process could not write). One that cannot be written now stays due."""
        reader = History(ledger)        # the writer's own connection: not closed here
        due = reader.reservations.notices_due()
        if not due:
            return
        archived = reader.archived_agents()
        for n in due:
            if n["holder"] in archived:
                where = f"not written: {n['holder']} is archived"
            else:
                try:
                    headers = orjson.loads(n["headers"])
                    where = notices.deliver(self.layout, n["id"], n["holder"], KIND, n["subject"], n["body"], headers,
                                            n["at"], now, self.project.config.durability)
                except (RelayError, OSError, ValueError) as e:
                    log.warning("notice %s to %s not written yet: %s", n["id"], n["holder"], e)
                    continue
            ledger.reservations.notice_delivered(n["id"], n["holder"], now, where)
