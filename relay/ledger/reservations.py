"""File reservations in the ledger: the writes (Reservations, `ledger.reservations`) and the reads
(ReservationReads, `history.reservations`).

A request is decided without holding the write lock: the leases held now are read and the
overlap is decided (files/patterns.py, bounded by its Work); then in one `BEGIN IMMEDIATE`
transaction the leases that ended are removed (each an event dated when it ended), the leases
held are read again and, when they changed meanwhile, the decision is made again for what is
new (at most ATTEMPTS times); then either every path asked for is written (reserved, or renewed
by its holder) or none is and the refusal is recorded, with a notice for each holder that was
not told of this requester during its lease yet. An agent holds at most MAX_HELD patterns. Two
agents asking at once are served one after the other: of two overlapping exclusive requests
exactly one is granted. A row exists while its lease is held; every change is an event
(message_id NULL, actor the agent) that `relay tail` shows. A notice is kept until it is
written into the holder's inbox (notice_delivered), and a week after."""
import datetime

from relay.errors import RelayError
from relay.files.patterns import Work, overlap
from relay.ledger.part import Part

NOTICES_KEPT = 7 * 86400.0      # a delivered notice is kept this long: one per lease and requester
MAX_HELD = 256                  # patterns one agent may hold at once
ATTEMPTS = 20                   # decisions made again when the leases changed while one was made


def utc(ts):
    """An instant as people read it in an event (UTC, to the second)."""
    try:
        return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError, TypeError):
        return str(ts)


def mode(exclusive):
    return "exclusive" if exclusive else "shared"


def _conflicts(agent, patterns, held, exclusive, decided, meet):
    """The leases of other agents in the way of `patterns`; `decided` keeps each pair's answer
    (`meet(pattern, scope, row)`) for the next attempt."""
    conflicts = []
    for p, scope in patterns:
        for r in held:
            if r["agent"] == agent or not (exclusive or r["exclusive"]):
                continue
            key = (p, scope, r["pattern"], r["scope"])
            if key not in decided:
                decided[key] = meet(p, scope, r)
            if decided[key]:
                conflicts.append({"path": p, "holder": r["agent"], "held": r["pattern"],
                                  "exclusive": bool(r["exclusive"]), "reason": r["reason"], "since": r["since"],
                                  "expires_at": r["expires_at"]})
    return conflicts


class Reservations(Part):
    """The reservations' writes."""

    def reserve(self, agent, patterns, now, expires_at, exclusive, reason, new_id, notice, work=None,
                overlaps=overlap):
        """Reserve every one of `patterns` ((pattern, scope) pairs: files/patterns.py) for
        `agent` until `expires_at`, or none.
        A pattern the agent holds already is renewed (its `since` kept; its reason kept unless a
        new one is given). `new_id()` gives a fresh id; `notice(holder, conflicts)` the
        (subject, body, headers) of a notice to a holder. The overlaps are decided by
        `overlaps(a, b, a_scope, b_scope, work)` outside the write lock, their steps counted in
        `work` (a Work; past its limit TooMuchWork, nothing written). Returns (granted rows,
        conflicts, ids of the notices recorded); a conflict is a dict: path, holder, held (its
        pattern), exclusive, reason, since, expires_at. RelayError when the agent would hold
        more than MAX_HELD patterns."""
        work = Work() if work is None else work
        decided = {}
        for _ in range(ATTEMPTS):
            held = self._live(now)
            conflicts = _conflicts(agent, patterns, held, exclusive, decided,
                                   lambda p, s, r: overlaps(p, r["pattern"], s, r["scope"], work))
            with self.transaction():
                self._lapse(now)
                if self._live(now) != held:
                    continue                    # changed meanwhile: decide what is new, again
                if conflicts:
                    return [], conflicts, self._refused(agent, exclusive, conflicts, now, new_id, notice)
                return self._granted(agent, patterns, held, now, expires_at, exclusive, reason, new_id), [], []
        raise RelayError(f"the reservations changed {ATTEMPTS} times while this request was decided; try again")

    def _live(self, now):
        """The leases held at `now` (the rows _lapse leaves), oldest first."""
        return [dict(r) for r in self.db.execute("SELECT * FROM reservations WHERE expires_at IS NULL "
                                                 "OR expires_at > ? ORDER BY since, id", (now,))]

    def _granted(self, agent, patterns, held, now, expires_at, exclusive, reason, new_id):
        """Every path of the request written (inside the transaction); the rows."""
        mine = {r["pattern"]: r for r in held if r["agent"] == agent}
        count = len(mine) + sum(1 for p, _ in patterns if p not in mine)
        if count > MAX_HELD:
            raise RelayError(f"{agent} would hold {count} reservations; an agent holds at most {MAX_HELD}: release "
                             "some, or reserve a directory or a glob that covers them")
        granted, events = [], []
        for p, scope in patterns:
            old = mine.get(p)
            row = {"id": old["id"] if old else new_id(), "agent": agent, "pattern": p, "scope": scope,
                   "exclusive": int(exclusive),
                   "reason": reason if reason is not None or old is None else old["reason"],
                   "since": old["since"] if old else now, "renewed_at": now, "expires_at": expires_at}
            self.db.execute("INSERT INTO reservations (id, agent, pattern, scope, exclusive, reason, since, "
                            "renewed_at, expires_at) VALUES (:id, :agent, :pattern, :scope, :exclusive, :reason, "
                            ":since, :renewed_at, :expires_at) ON CONFLICT (agent, pattern) DO UPDATE SET "
                            "scope = excluded.scope, exclusive = excluded.exclusive, reason = excluded.reason, "
                            "renewed_at = excluded.renewed_at, expires_at = excluded.expires_at", row)
            why = f": {row['reason']}" if row["reason"] else ""
            events.append((None, now, "renewed" if old else "reserved",
                           f"{p} ({mode(exclusive)}) until {utc(expires_at)}{why}", agent))
            granted.append(row)
        self.events(events)
        return granted

    def _refused(self, agent, exclusive, conflicts, now, new_id, notice):
        self.events([(None, now, "reservation-refused",
                      f"{c['path']} ({mode(exclusive)}): held by {c['holder']} as {c['held']} "
                      f"({mode(c['exclusive'])}) until {utc(c['expires_at'])}", agent) for c in conflicts])
        told = []
        by_holder = {}
        for c in conflicts:
            by_holder.setdefault(c["holder"], []).append(c)
        for holder, theirs in by_holder.items():
            # once per lease and requester: a lease whose holder heard of this requester since it began is not told again
            if all(self.db.execute("SELECT 1 FROM reservation_notices WHERE holder = ? AND requester = ? AND at >= ? "
                                   "LIMIT 1", (holder, agent, c["since"])).fetchone() for c in theirs):
                continue
            nid = new_id()
            subject, body, headers = notice(holder, theirs)
            self.db.execute("INSERT INTO reservation_notices (id, holder, requester, at, subject, body, headers) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?)", (nid, holder, agent, now, subject, body, headers))
            told.append(nid)
        return told

    def release(self, agent, patterns, now, everything=False):
        """Release the agent's reservations of `patterns` (normalised), or with `everything` all
        of them. Returns the patterns released; one the agent did not hold is left out."""
        with self.transaction():
            self._lapse(now)
            if everything:
                gone = [r[0] for r in self.db.execute("DELETE FROM reservations WHERE agent = ? RETURNING pattern",
                                                      (agent,)).fetchall()]
                gone.sort()
            else:
                gone = [p for p in patterns if self.db.execute(
                    "DELETE FROM reservations WHERE agent = ? AND pattern = ? RETURNING pattern", (agent, p)).fetchone()]
            self.events([(None, now, "released", p, agent) for p in gone])
        return gone

    def _lapse(self, now):
        ended = self.db.execute("DELETE FROM reservations WHERE expires_at <= ? RETURNING agent, pattern, exclusive, "
                                "expires_at", (now,)).fetchall()
        self.events([(None, r["expires_at"], "reservation-expired",
                      f"{r['pattern']} ({mode(r['exclusive'])}) ended at {utc(r['expires_at'])}", r["agent"])
                     for r in sorted(ended, key=lambda r: r["expires_at"])])
        self.db.execute("DELETE FROM reservation_notices WHERE delivered_at IS NOT NULL AND at < ?",
                        (now - NOTICES_KEPT,))

    def notice_delivered(self, nid, holder, now, where):
        """The notice `nid` is in the holder's inbox (`where`), or will not be (`where` says why)."""
        with self.transaction():
            if self.db.execute("UPDATE reservation_notices SET delivered_at = ? WHERE id = ? AND delivered_at IS NULL "
                               "RETURNING id", (now, nid)).fetchone():
                self.events([(None, now, "reservation-notice", f"to {holder}: {where}", "relay")])


class ReservationReads(Part):
    """The reservations' reads."""

    def held(self, now, agent=None):
        """The leases held at `now` (of `agent`, or everyone's), by agent and pattern. A row
        whose end is no number is left out."""
        where = " AND agent = :agent" if agent is not None else ""
        return [dict(r) for r in self.db.execute(
            "SELECT * FROM reservations WHERE typeof(expires_at) IN ('integer', 'real') AND expires_at > :now"
            f"{where} ORDER BY agent, pattern", {"now": now, "agent": agent})]

    def notices_due(self, limit=50):
        """Notices not yet written into their holder's inbox, oldest first."""
        return [dict(r) for r in self.db.execute(
            "SELECT * FROM reservation_notices WHERE delivered_at IS NULL ORDER BY at, id LIMIT ?", (limit,))]
