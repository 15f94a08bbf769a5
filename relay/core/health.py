"""What relay says about its own health: the durability settings a relay attests for its
writer connection (recorded in the ledger at start and at each reload, so that readers show
what the running relay has, not what they would configure themselves), whether the process that
attested them still runs, what doctor flags about them, and the health check of `relay status`
(its exit codes)."""
import logging
import os
import socket

from relay.version import __version__
from relay.config import show_duration
from relay.core.message import iso
from relay.ledger.opening import unwritable
from relay.ledger.rows import BadRow

log = logging.getLogger(__name__)

SYNC_LEVELS = {"OFF": 0, "NORMAL": 1, "FULL": 2, "EXTRA": 3}
NEEDED = {"full": "FULL", "normal": "NORMAL"}     # the synchronous level each durability needs

EXIT_OK = 0
EXIT_DOWN = 3           # relay status: no daemon holds relay.lock
EXIT_STALE = 4          # relay status: the oldest pending message is older than --max-pending-age
EXIT_FEDERATION = 5     # relay status: the daemon runs, and its link to the team's server is down, its
                        # directory cannot be read, or a name is claimed by two nodes
MAX_PENDING_AGE = 600.0  # --max-pending-age by default (10 minutes)


def attest(ledger, history, config, mode, event, now):
    """Record what the writer connection `ledger` reports (journal mode, synchronous, busy
    timeout, foreign keys, read through `history` on that connection), with this process's pid,
    host and relay version, `mode` ("daemon" or "once"), `event` ("start" or "reload") and the
    configured durability. Returns what was recorded."""
    facts = {"pid": os.getpid(), "host": socket.gethostname(), "version": __version__, "mode": mode,
             "event": event, "durability": config.durability, **history.checks.pragmas()}
    ledger.attest(now, facts)
    log.info("attested the ledger's settings at %s: journal_mode=%s synchronous=%s busy_timeout=%sms "
             "foreign_keys=%s", event, facts["journal_mode"], facts["synchronous"], facts["busy_timeout_ms"],
             facts["foreign_keys"])
    return facts


def attestation(history, daemon_pid):
    """The newest attestation as a document (status --json, doctor --json): `attested` False
    when no relay recorded one; `running` whether the process that attested it is the daemon
    holding relay.lock now."""
    row = history.attestation()
    if row is None:
        return {"attested": False, "running": False}
    problem = BadRow.of(row, "attestations")
    if problem is not None:     # named by bad_rows(); what it says is not shown as what the daemon has
        return {"attested": False, "running": False, "unreadable": str(problem)}
    return {"attested": True, "journal_mode": row["journal_mode"], "synchronous": row["synchronous"],
            "busy_timeout_ms": row["busy_timeout_ms"], "foreign_keys": bool(row["foreign_keys"]),
            "configured": row["durability"], "pid": row["pid"], "host": row["host"], "version": row["version"],
            "mode": row["mode"], "event": row["event"], "at": _when(row["at"]),
            "running": daemon_pid is not None and daemon_pid == row["pid"] and row["host"] == socket.gethostname()}


def _when(ts):
    return iso(ts) if isinstance(ts, (int, float)) else repr(ts)


def describe(att, daemon_pid):
    """One line for a person: what was attested, by whom, and whether that process runs."""
    if not att["attested"]:
        if att.get("unreadable"):
            return "not attested: the newest attestation is a row this relay cannot read (relay doctor names it)"
        who = f"the running daemon (pid {daemon_pid}) has" if daemon_pid else "no relay has"
        return f"not attested: {who} recorded its ledger settings (a relay older than this one, or none ran yet)"
    settings = (f"journal_mode={att['journal_mode']} synchronous={att['synchronous']} "
                f"busy_timeout={att['busy_timeout_ms']}ms foreign_keys={'on' if att['foreign_keys'] else 'off'} "
                f"(durability {att['configured']})")
    what = "the daemon" if att["mode"] == "daemon" else "relay run --once"
    by = f"attested by {what}, pid {att['pid']} on {att['host']}, relay {att['version']}, at {att['event']} {att['at']}"
    if att["running"]:
        return f"{settings}; {by}, running"
    now = f"; the daemon running now (pid {daemon_pid}) has not attested" if daemon_pid else ""
    return f"{settings}; {by}, which is not running{now}"


def problems(att, configured, daemon_pid):
    """What doctor flags: a running daemon whose ledger settings are less than the configured
    durability (or that recorded none), a journal that is not WAL, foreign keys off."""
    if daemon_pid is None:
        return []
    if not att["running"]:
        return [f"the running daemon (pid {daemon_pid}) has not attested its ledger settings, so what it runs "
                "with is unknown; restart it with this relay to have it recorded"]
    out = []
    need = NEEDED.get(configured, "FULL")
    if SYNC_LEVELS.get(att["synchronous"], -1) < SYNC_LEVELS[need] or (configured == "full" and att["configured"] != "full"):
        out.append(f"the running daemon (pid {daemon_pid}) runs with durability {att['configured']} "
                   f"(synchronous={att['synchronous']}), less than the configured {configured}: what it "
                   "acknowledges may not survive a power cut; restart it (without --durability "
                   f"{att['configured']} or RELAY_DURABILITY)")
    if str(att["journal_mode"]).lower() != "wal":
        out.append(f"the running daemon (pid {daemon_pid}) has its ledger in journal mode {att['journal_mode']}, "
                   "not WAL; readers may block it; restart it")
    if not att["foreign_keys"]:
        out.append(f"the running daemon (pid {daemon_pid}) runs with foreign keys off; restart it")
    return out


def check(daemon_pid, oldest_age, max_age):
    """(exit code, problems) of `relay status` as a health check: EXIT_DOWN when no daemon
    runs, else EXIT_STALE when the oldest pending message is older than `max_age` (0: no
    limit), else EXIT_OK."""
    out, code = [], EXIT_OK
    if daemon_pid is None:
        out.append("no daemon is running (relay.lock is not held)")
        code = EXIT_DOWN
    if max_age and oldest_age is not None and oldest_age > max_age:
        out.append(f"the oldest pending message waits for {oldest_age:.0f}s, more than --max-pending-age "
                   f"{show_duration(max_age)}")
        code = code or EXIT_STALE
    return code, out


def federation(doc, running, now, max_age):
    """(exit code, problems) of the federation part of `relay status` (federation.probe's
    document): EXIT_STALE when a message for another node waits for its acknowledgement (or to
    be published) longer than `max_age`, EXIT_FEDERATION when the running daemon's link is down,
    the team's directory cannot be read or one of this node's names is claimed by another node
    too (other nodes' names claimed twice are said, not counted); while no daemon runs, only
    the ages count (its link's last state is no longer news)."""
    out, code = [], EXIT_OK
    if running:
        link, directory = doc["link"], doc["directory"]
        if link["connected"] is False:
            out.append(f"federation: the link to the team's server is down ({link['error'] or 'no reason recorded'})")
        if directory["error"]:
            out.append(f"federation: the team's directory cannot be read ({directory['error']})")
        out += [f"federation: agent {name} is claimed by node {other} too" for name, other in doc["conflicts"]]
        code = EXIT_FEDERATION if out else code
        # Other nodes' names listed twice are theirs to mend: said, never this node's failure.
        if doc.get("others_conflicts"):
            out.append(f"federation: {len(doc['others_conflicts'])} name(s) of other nodes are listed by more than "
                       "one node (relay status shows them); not this node's to mend")
    for node, w in doc["outbound"]["by_node"].items():
        said = unanswered(node, w, now, doc.get("ack_warn")) if running else None
        if said:        # (while no daemon runs, nothing reads the acknowledgements that came)
            out.append(f"federation: {said}")
            code = code or EXIT_STALE
        age = now - w["oldest_at"] if w["oldest_at"] else 0.0
        if max_age and age > max_age:
            out.append(f"federation: {w['waiting']} message(s) for node {node} not acknowledged, the oldest for "
                       f"{age:.0f}s, more than --max-pending-age {show_duration(max_age)}")
            code = code or EXIT_STALE
    return code, out


def unanswered(node, waiting, now, ack_timeout):
    """What to say of `node` when the oldest message published to it waits for its
    acknowledgement longer than `ack_timeout` (an acknowledgement takes milliseconds; the message
    is published again at that deadline), else None. `waiting`: outbound_counts()'s of the node."""
    since = waiting.get("unacked_since")
    if not ack_timeout or since is None or now - since <= ack_timeout:
        return None
    return (f"node {node} is not acknowledging: {waiting.get('published') or waiting['waiting']} message(s) wait "
            f"for it, the oldest for {now - since:.0f}s, more than ack_timeout ({show_duration(ack_timeout)})")


def ledger_access(layout, opened):
    """What `relay status` says of the ledger: its path, whether this process may write it (the
    state directory, the ledger and its -wal and -shm when there), the first of them it may not
    (`unwritable`, None when it may write all) and how a reader opened it (ledger/opening.py:
    read-only, or immutable where not even a -shm could be made; None with no ledger)."""
    blocked = unwritable(layout.ledger)
    return {"path": str(layout.ledger), "writable": blocked is None, "unwritable": blocked, "opened": opened}


def describe_access(access):
    """The line of `relay status` for a ledger this process may not write (None when it may)."""
    if access["writable"]:
        return None
    how = " as it stands (immutable: no -shm could be made)" if access["opened"] == "immutable" else ""
    return (f"read-only: {access['unwritable']} cannot be written; the read-only verbs read the ledger{how}, "
            "a relay cannot run here")
