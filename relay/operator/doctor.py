"""What operators do beside the daemon: retry and expire (through the Ledger's writes), verify
the archive and the hash chain, doctor, the agents table (through the History's reads). Ping and
archive-agent are in roster.py, the record of each command in commands.py. A stored row this
build cannot read is named (history.BadRow) and left out, never fatal."""
import getpass
import hashlib
import os
import time

from relay.core.archive import Archive, check_rel
from relay.operator.commands import Result
from relay.core.flow import REASONS, SHED_REPORT
from relay.errors import LedgerCorrupt, RelayError
from relay.files.fs import shown
from relay.core import health
from relay.ledger.history import BadRow, History, sift
from relay.core.inbox import ORPHAN_AGE, Inbox
from relay.files.layout import is_in_progress_name
from relay.ledger.ledger import Status
from relay.core.senders import undeclared, undeclared_outboxes
from relay.operator.roster import ping_state
from relay.files.sync import Syncer
from relay.operator.views import when_or_raw


def actor():
    try:
        return f"operator:{getpass.getuser()}"
    except Exception:
        return "operator"


def retry(ledger, layout, ids, now=None):
    """Put failed messages back to pending, their files back into the spool. A message already
    pending says so and is left as it is. Returns a commands.Result."""
    now = time.time() if now is None else now
    result = Result()
    history = History(ledger)
    for mid in ids:
        try:
            row = history.find(mid)
        except RelayError as e:
            result.errors.append(str(e))
            continue
        bad = BadRow.of(row)
        if bad is not None:
            result.errors.append(f"{bad}: not retried")
            continue
        if row["status"] in (Status.PENDING, Status.PROCESSING):
            result.lines.append(f"{row['id']}: is {row['status']} already; nothing to retry")
            continue
        if row["status"] != Status.FAILED:
            result.errors.append(f"{row['id']}: is {row['status']}, not failed; nothing to retry")
            continue
        src, spool = row["failed_path"], layout.spool_of(row)
        try:
            present = bool(src) and layout.fs.exists(check_rel(src, "failed"))
        except OSError:
            present = False
        # Not in failed/ but in the spool: a retry that stopped before its record (or a file
        # quarantine could not move) is put back to pending as it lies.
        if not present and not layout.fs.exists(spool):
            result.errors.append(f"{row['id']}: its file is gone ({row['error']}); write the message again")
            continue
        archive = Archive(layout, Syncer("full", layout.fs))
        if present:
            archive.move(src, spool)
        if src:
            layout.fs.unlink_quietly(f"{src}.error.json")
        archive.syncer.flush("the retried message's move back to the spool")
        for done in ledger.operations.requeue([row["id"]], now, actor()):
            was = " (an operator had expired it)" if row["expired_at"] is not None else ""
            result.lines.append(f"{done}: back to pending{was}")
    result.code = 1 if result.errors else 0
    return result


def retry_failed(ledger, layout, now=None):
    """relay retry --failed: every failed message back to pending, except those an operator
    expired (`relay retry ID` revives one of those by name)."""
    rows = list(History(ledger).audit(status=Status.FAILED, oldest_first=True))
    result = retry(ledger, layout, [r["id"] for r in rows if r["expired_at"] is None], now)
    expired = sum(1 for r in rows if r["expired_at"] is not None)
    if expired:
        result.lines.append(f"{expired} message(s) an operator expired stay failed (`relay retry ID` revives one)")
    if not rows:
        result.lines.append("no failed messages")
    return result


def expire(ledger, layout, mid, now=None):
    """A pending or failed message will not be delivered: it is failed, its file in failed/.
    One expired already is left as it is. Returns a commands.Result."""
    now = time.time() if now is None else now
    history = History(ledger)
    row = history.find(mid)
    bad = BadRow.of(row)
    if bad is not None:
        raise RelayError(f"{bad}: not expired")
    if row["expired_at"] is not None and row["status"] == Status.FAILED:
        if row["failed_path"] is None and row["spooled"] == 1 and layout.fs.exists(layout.spool_of(row)):
            # An expire that stopped between its record and the move: its file is moved now.
            _quarantine(ledger, layout, row, row["error"], now, layout.spool_of(row))
            return Result([f"{row['id']}: expired already; its file, left where it was by an expire that did "
                           "not finish, is now in failed/"])
        return Result([f"{row['id']}: expired already; nothing changed"])
    if row["status"] not in (Status.PENDING, Status.FAILED):
        raise RelayError(f"{row['id']} is {row['status']}: only pending or failed messages can be expired")
    who = actor()
    reason = f"expired by {who}: will not be delivered"
    if not ledger.operations.expire(row["id"], now, reason, who):
        if history.get(row["id"])["expired_at"] is not None:
            return Result([f"{row['id']}: expired already; nothing changed"])
        raise RelayError(f"{row['id']} was claimed for delivery meanwhile; try again")
    src = None      # a failed message is in failed/ already
    if row["status"] == Status.PENDING:
        spool = layout.spool_of(row)
        src = spool if layout.fs.exists(spool) else f"outbox/{row['sender']}/{row['name']}"
        src = src if layout.fs.exists(src) else None
    _quarantine(ledger, layout, row, reason, now, src)
    return Result([f"{row['id']}: expired; will not be delivered"])


def _quarantine(ledger, layout, row, reason, now, src):
    """An expired message's file (at `src`, or None: none to move) into failed/ with its
    report, and its place recorded."""
    archive = Archive(layout, Syncer("full", layout.fs))
    report = archive.report(row["id"], row["sender"], row["name"], reason, now)
    if src or not row["failed_path"]:
        rel = archive.quarantine(src, row["sender"], row["id"], row["name"], report)
    else:
        rel = row["failed_path"]
        archive.write_report(rel, report)
    archive.syncer.flush("expired message")
    ledger.operations.quarantined(row["id"], rel)


def _sha256(fs, rel):
    """sha256 of a file under the state directory, read through the confined file system."""
    h = hashlib.sha256()
    fd = fs.open_read(rel)
    try:
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
    finally:
        os.close(fd)
    return h.hexdigest()


def envelopes(history, layout):
    """Problems with the envelopes relay recorded as delivered: one that is still in the inbox
    (new/ or cur/) but is not the complete envelope relay wrote (size and sha256) is named.
    One the agent has deleted is no problem."""
    fs = layout.fs
    problems, index = [], {}
    for d in sift(history.checks.recorded_envelopes(), [], "deliveries"):      # bad rows: named by bad_rows()
        r, mid = d["recipient"], d["message_id"]
        if r not in index:
            index[r] = {}
            try:
                for n in fs.names(f"inbox/{r}/cur"):
                    index[r].setdefault(n.split(".", 1)[0], f"inbox/{r}/cur/{n}")
            except OSError:
                pass
        rel = f"inbox/{r}/new/{mid}.json"
        if not fs.exists(rel):
            rel = index[r].get(mid)
        if rel is None:
            continue
        try:
            size = fs.lstat(rel).st_size
            digest = _sha256(fs, rel)
        except OSError as e:
            problems.append(f"{mid}: cannot read {rel}: {e.strerror or e}")
            continue
        if (size, digest) != (d["size"], d["sha256"]):
            problems.append(f"{mid}: {rel} is not the envelope relay delivered ({size} bytes, expected "
                            f"{d['size']}); `relay retry` cannot help, restore it from the archive")
    return problems


def unreadable(history, limit=None):
    """(count, lines) of every stored row this build cannot read, at most `limit` lines (the
    rest counted in a last line)."""
    lines = [str(b) for b in history.bad_rows()]
    count = len(lines)
    if limit is not None and count > limit:
        lines = lines[:limit] + [f"... and {count - limit} more ledger row(s) this relay cannot read "
                                 "(`relay verify` lists them all)"]
    return count, lines


def checkpoint(history):
    """What is wrong with the chain's last checkpoint, which says where verify starts: one with
    chain records at or before it (a sweep leaves none) hides them from verify. (One this build
    cannot read is a row like the others: the chain is then walked from its start.)"""
    cp = history.checks.checkpoint()
    if cp is None or BadRow.of(cp, "checkpoints") is not None:      # one unreadable is named with the others
        return []
    hidden = history.checks.links_upto(cp["upto"])
    if hidden:
        return [f"{hidden} hash chain record(s) lie at or before the last checkpoint (position {cp['upto']}), "
                "which a retention sweep leaves none of: the checkpoint hides them from verify (it was not "
                "written by a sweep of relay's)"]
    return []


def verify(history, layout, rows=True):
    """Recompute the hash chain and re-hash every archive file and every delivered envelope
    still in an inbox. Returns (checked, problems); with `rows`, the rows this build cannot read
    are problems too (doctor counts them itself)."""
    problems = unreadable(history)[1] if rows else []
    problems += checkpoint(history)
    checked = 0
    for link, row, gap, intact in history.checks.chain():
        if gap:
            problems.append(f"chain records {gap[0]}..{gap[1]} are missing: archived records "
                            f"were removed from the ledger (before {link['message_id']})")
        if row is None:
            problems.append(f"{link['message_id']}: its ledger record was deleted")
        elif not intact:
            problems.append(f"{link['message_id']}: its ledger record was altered (hash chain mismatch)")
        if row is not None and BadRow.of(row) is not None:
            continue                # named above; its path is not followed
        if row is not None and row["archive_path"]:
            checked += 1
            try:
                digest = _sha256(layout.fs, check_rel(row["archive_path"], "archive"))
            except FileNotFoundError:
                problems.append(f"{row['id']}: archive file {row['archive_path']} is missing")
                continue
            except OSError as e:
                problems.append(f"{row['id']}: archive file {row['archive_path']} cannot be read: {e.strerror or e}")
                continue
            if digest != row["sha256"]:
                problems.append(f"{row['id']}: archive file {row['archive_path']} does not match its sha256")
    for mid in history.checks.unchained():
        problems.append(f"{mid}: archived record is not in the hash chain (inserted?)")
    problems += envelopes(history, layout)
    return checked, problems


def doctor(history, layout, daemon_pid, now=None, configured="full", quick=False, declared=None):
    """Problems, each one line with what to do about it; and the facts found on the way:
    `unreadable` (rows this build cannot read), `durability` (the attested settings),
    `verified` (archived messages re-hashed, None with `quick`: verify's checks not run).
    `declared` (a senders.Declared, with senders = "declared"): outboxes of agents not declared
    are problems too."""
    now = time.time() if now is None else now
    facts = {}
    unread, out = unreadable(history, limit=20)
    facts["unreadable"] = unread
    att = health.attestation(history, daemon_pid)
    facts["durability"] = att
    out += health.problems(att, configured, daemon_pid)
    result = history.checks.integrity_check()
    if result != ["ok"]:
        found = [r for r in result if not r.startswith("***")] or result
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        out.append(str(LedgerCorrupt(layout.ledger, f"integrity check: {found[0]}{more}")))
    if history.checks.journal_mode().lower() != "wal":
        out.append("the ledger is not in WAL mode; start `relay run` once to set it")
    if daemon_pid is None:
        n = history.counts()[Status.PROCESSING]
        if n:
            out.append(f"{n} message(s) left processing by a stopped relay; `relay run` recovers them")
    if quick:       # only that each archived file is there: verify's checks (hashes, chain) are not run
        facts["verified"] = None
        for row in sift(history.checks.archived(), []):
            if row["archive_path"] and not layout.fs.exists(row["archive_path"]):
                out.append(f"{row['id']}: archived file {row['archive_path']} is missing; `relay verify` for detail")
    else:           # verify's checks: the chain, every archived file re-hashed, the envelopes
        facts["verified"], found = verify(history, layout, rows=False)
        out += found
    for row in sift(history.checks.quarantined(), []):
        if not layout.fs.exists(row["failed_path"]):
            out.append(f"{row['id']}: quarantined file {row['failed_path']} is missing; `relay expire` or ignore")
    known = history.checks.recorded_paths()
    reports = {}            # flow control's reports: known while their message's sheds are recorded
    for base in ("archive", "failed"):
        for rel in layout.fs.walk_files(base):
            if base == "failed" and rel.endswith(SHED_REPORT):
                reports[rel] = rel.rpartition("/")[2].partition("--")[0]
                continue
            if base == "failed" and rel.endswith(".error.json"):
                rel = rel[: -len(".error.json")]
            if rel not in known:
                out.append(f"{shown(rel)}: a file no ledger record knows; move it away or delete it")
    shed = history.sheds_of(sorted(set(reports.values())))
    out += [f"{shown(rel)}: a file no ledger record knows; move it away or delete it"
            for rel, mid in sorted(reports.items()) if mid not in shed]
    active = history.checks.active_ids()
    for _, mid, _, rel in layout.spooled():
        if mid not in active:
            out.append(f"{rel}: a spooled file with no pending message; "
                       "`relay run` registers it again, or move it into an outbox to send it")
    for rel in Inbox(layout, None).orphans(now - ORPHAN_AGE):
        out.append(f"{shown(rel)}: orphaned temporary file; `relay run` removes it")
    for name, _, problem in layout.outbox_dirs():
        if problem:
            out.append(f"outbox/{shown(name)}: {problem}; rename or remove it")
    for name, waiting in undeclared_outboxes(layout, declared):
        out.append(f"outbox/{name}: {undeclared(name, waiting)}; or remove it")
    return out, facts


def agents_report(history, layout, known, bad=None, now=None):
    """Each agent: outbox waiting, inbox new/cur, last seen, sent/received, last error, whether
    it is archived, what flow control shed on the way to it and from it, its last ping. Agents
    rows this build cannot read are appended to `bad` and left out."""
    now = time.time() if now is None else now
    rows = []
    seen = {r["name"]: r for r in sift(history.agents(), [] if bad is None else bad, "agents")}
    archived = history.archived_agents()
    pings = history.last_pings()
    shed_to, shed_from = {}, {}
    for (sender, recipient), by_reason in history.shed_pairs().items():
        for reason, n in by_reason.items():
            into = shed_to.setdefault(recipient, dict.fromkeys(REASONS, 0))
            into[reason] = into.get(reason, 0) + n
            out = shed_from.setdefault(sender, dict.fromkeys(REASONS, 0))
            out[reason] = out.get(reason, 0) + n
    for name in sorted(set(known) | set(seen) | set(archived) | {"System"}):
        waiting = layout.fs.count(f"outbox/{name}", lambda e: e.is_file(follow_symlinks=False)
                                  and not is_in_progress_name(e.name))
        counts = {sub: layout.fs.count(f"inbox/{name}/{sub}") for sub in ("new", "cur")}
        sent, received, err = history.agent_figures(name)
        problem = BadRow.of(err) if err is not None else None
        if problem is not None:
            if bad is not None:
                bad.append(problem)
            err = None
        rows.append({"agent": name, "outbox_waiting": waiting, "inbox_new": counts["new"], "inbox_cur": counts["cur"],
                     "last_seen": seen[name]["last_seen"] if name in seen else None, "sent": sent,
                     "received": received, "last_error": f"{err['id']}: {err['error']}" if err else None,
                     "archived": when_or_raw(archived[name][0]) if name in archived else None,
                     "shed_to": shed_to.get(name, dict.fromkeys(REASONS, 0)),
                     "shed_from": shed_from.get(name, dict.fromkeys(REASONS, 0)),
                     "ping": ping_state(layout.fs, name, pings.get(name), now)})
    return rows


def remote_agents_report(history, local):
    """The agents the team's directory puts on other nodes (a name also local stays local):
    their node, when that node was last seen, the messages received here from them."""
    rows = []
    for name, (node, seen) in sorted(history.remote.agents().items()):
        if name in local:
            continue
        sent, _, err = history.agent_figures(name)
        rows.append({"agent": name, "node": node, "outbox_waiting": None, "inbox_new": None, "inbox_cur": None,
                     "last_seen": seen, "sent": sent, "received": None,
                     "last_error": f"{err['id']}: {err['error']}" if err else None})
    return rows
