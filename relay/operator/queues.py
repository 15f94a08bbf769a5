"""`relay queues`: the operator's projection of who is waiting on whom, per agent and per
sender -> recipient pair: the queue depth (messages relay holds for the recipient, plus unread
envelopes in its new/), the oldest unread message's age, the last delivery, what flow control
shed (by reason), and the agent's last ping. Worst queue first.

The ledger is read through the History; each recipient's new/ is listed once through the
confined file system. An unread envelope's sender and delivery time come from the ledger (a
ping's from its record); one no record knows (written there by someone else) counts for the
agent, under the sender `?`, with its file's time.
"""
import collections

from relay.config import SYSTEM
from relay.core.flow import REASONS
from relay.core.inbox import is_envelope
from relay.operator.roster import ping_state
from relay.operator.views import when_or_raw


def _row(**fields):
    return {"pending": 0, "unread": 0, "depth": 0, "oldest_unread_age_s": None, "last_delivery": None,
            "shed": dict.fromkeys(REASONS, 0), **fields}


def _unread(fs, agent):
    """(id, file time) of each envelope in the agent's new/."""
    try:
        entries = fs.scandir(f"inbox/{agent}/new")
    except OSError:
        return []
    out = []
    for e in entries:
        if not is_envelope(e):      # a link, a directory, a note put there: no message waits in it
            continue
        try:
            mtime = e.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        out.append((e.name.split(".", 1)[0], mtime))
    return out


def _older(row, age):
    if row["oldest_unread_age_s"] is None or age > row["oldest_unread_age_s"]:
        row["oldest_unread_age_s"] = age


def _latest(row, at):
    if isinstance(at, (int, float)) and (row["last_delivery"] is None or at > row["last_delivery"]):
        row["last_delivery"] = at


def project(history, layout, known, now):
    """{"agents": [...], "pairs": [...]}, each sorted worst queue first (deepest, then oldest)."""
    fs = layout.fs
    archived = history.archived_agents()
    pending = history.pending_pairs()
    last = history.last_deliveries()
    sheds = history.shed_pairs()
    pings = history.last_pings()
    names = set(known) | set(archived) | set(pings) | {SYSTEM} | {r for _, r in pending} | {r for _, r in last}
    names |= {r for _, r in sheds if r != "*"}
    agents = {n: _row(agent=n, archived=when_or_raw(archived[n][0]) if n in archived else None) for n in names}
    pairs = collections.defaultdict(dict)

    def pair(sender, recipient):
        if recipient not in pairs[sender]:
            pairs[sender][recipient] = _row(**{"from": sender, "to": recipient})
        return pairs[sender][recipient]

    for (s, r), n in pending.items():
        pair(s, r)["pending"] += n
        if r in agents:
            agents[r]["pending"] += n
    for (s, r), at in last.items():
        _latest(pair(s, r), at)
        if r in agents:
            _latest(agents[r], at)
    for (s, r), by_reason in sheds.items():
        for reason, n in by_reason.items():
            p = pair(s, r)
            p["shed"][reason] = p["shed"].get(reason, 0) + n
            if r in agents:
                agents[r]["shed"][reason] = agents[r]["shed"].get(reason, 0) + n
    for name in sorted(names):
        files = _unread(fs, name)
        senders = history.unread_senders(name, [mid for mid, _ in files]) if files else {}
        for mid, mtime in files:
            sender, at = senders.get(mid, ("?", mtime))
            at = at if isinstance(at, (int, float)) else mtime
            age = round(max(0.0, now - at), 3)
            agents[name]["unread"] += 1
            _older(agents[name], age)
            if sender != "?":
                p = pair(sender, name)
                p["unread"] += 1
                _older(p, age)
        agents[name]["ping"] = ping_state(fs, name, pings.get(name), now)
    rows = list(agents.values())
    pair_rows = [p for by in pairs.values() for p in by.values()]
    for row in rows + pair_rows:
        row["depth"] = row["pending"] + row["unread"]
        row["last_delivery"] = when_or_raw(row["last_delivery"])

    def worst(row):
        return (-row["depth"], -(row["oldest_unread_age_s"] or 0), row.get("agent") or (row["from"], row["to"]))
    return {"agents": sorted(rows, key=worst), "pairs": sorted(pair_rows, key=worst)}
