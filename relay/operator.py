"""What operators do beside the daemon: retry, expire, verify the archive, doctor."""
import getpass
import hashlib
import os
import time

from .archive import Archive
from .errors import LedgerCorrupt, NotFound, RelayError
from .layout import is_in_progress_name, move
from .ledger import GENESIS, chain_hash
from .sync import Syncer


def actor():
    try:
        return f"operator:{getpass.getuser()}"
    except Exception:
        return "operator"


def _row(ledger, mid):
    row = ledger.find(mid.upper())
    if row == "ambiguous":
        raise RelayError(f"{mid!r} matches more than one message; give more of the id")
    if row is None:
        raise NotFound(f"no message with id {mid!r} in the ledger")
    return row


def retry(ledger, layout, ids, now=None):
    """Put failed messages back to pending, their files back into the spool. Returns
    (done ids, problems)."""
    now = time.time() if now is None else now
    done, problems = [], []
    for mid in ids:
        row = _row(ledger, mid)
        if row["status"] != "failed":
            problems.append(f"{row['id']}: is {row['status']}, not failed; nothing to retry")
            continue
        src = layout.state / row["failed_path"] if row["failed_path"] else None
        if src is None or not os.path.lexists(src):
            problems.append(f"{row['id']}: its file is gone ({row['error']}); write the message again")
            continue
        spool = layout.spool_path(row["sender"], row["id"], row["name"])
        os.makedirs(os.path.dirname(spool), exist_ok=True)
        move(src, spool)
        try:
            os.unlink(f"{src}.error.json")
        except FileNotFoundError:
            pass
        done += ledger.requeue([row["id"]], now, actor())
    return done, problems


def expire(ledger, layout, mid, now=None):
    """A pending or failed message will not be delivered: it is failed, its file in failed/."""
    now = time.time() if now is None else now
    row = _row(ledger, mid)
    if row["status"] not in ("pending", "failed"):
        raise RelayError(f"{row['id']} is {row['status']}: only pending or failed messages can be expired")
    reason = f"expired by {actor()}: will not be delivered"
    with ledger.transaction() as db:
        changed = db.execute("UPDATE messages SET status = 'failed', failed_at = ?, error = ? "
                             "WHERE id = ? AND status IN ('pending', 'failed') RETURNING spooled",
                             (now, reason, row["id"])).fetchone()
        if changed is None:
            raise RelayError(f"{row['id']} was claimed for delivery meanwhile; try again")
        ledger._events([(row["id"], now, "expired", reason, actor())])
    archive = Archive(layout, Syncer("full", layout.state, mode="file"))
    if row["status"] == "pending":
        src = layout.spool_path(row["sender"], row["id"], row["name"]) if changed["spooled"] \
            else layout.outbox / row["sender"] / row["name"]
        src = src if os.path.lexists(src) else None
    else:
        src = None  # already in failed/
    report = archive.report(row["id"], row["sender"], row["name"], reason, now)
    rel = archive.quarantine(src, row["sender"], row["id"], row["name"], report) if src or not row["failed_path"] \
        else row["failed_path"]
    if row["status"] == "failed":
        with open(layout.state / f"{rel}.error.json", "wb") as f:
            import orjson
            f.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    archive.syncer.flush("expired message")
    with ledger.transaction() as db:
        db.execute("UPDATE messages SET failed_path = ?, spooled = 0 WHERE id = ?", (rel, row["id"]))
    return row["id"]


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def verify(ledger, layout):
    """Recompute the hash chain and re-hash every archive file. Returns (checked, problems)."""
    db = ledger.db
    problems = []
    cp = db.execute("SELECT upto, head FROM checkpoints ORDER BY seq DESC LIMIT 1").fetchone()
    seq, prev = (cp["upto"], cp["head"]) if cp else (0, GENESIS)
    chained = set()
    checked = 0
    for link in db.execute("SELECT seq, message_id, hash FROM chain WHERE seq > ? ORDER BY seq", (seq,)):
        if link["seq"] != seq + 1:
            problems.append(f"chain records {seq + 1}..{link['seq'] - 1} are missing: archived records "
                            f"were removed from the ledger (before {link['message_id']})")
        seq = link["seq"]
        chained.add(link["message_id"])
        row = ledger.get(link["message_id"])
        if row is None:
            problems.append(f"{link['message_id']}: its ledger record was deleted")
        elif row["status"] != "archived" or chain_hash(prev, row) != link["hash"]:
            problems.append(f"{link['message_id']}: its ledger record was altered (hash chain mismatch)")
        prev = link["hash"]
        if row is not None and row["archive_path"]:
            checked += 1
            path = layout.state / row["archive_path"]
            if not path.is_file():
                problems.append(f"{row['id']}: archive file {row['archive_path']} is missing")
            elif _sha256(path) != row["sha256"]:
                problems.append(f"{row['id']}: archive file {row['archive_path']} does not match its sha256")
    for row in db.execute("SELECT id FROM messages WHERE status = 'archived' AND id NOT IN "
                          "(SELECT message_id FROM chain)"):
        problems.append(f"{row['id']}: archived record is not in the hash chain (inserted?)")
    return checked, problems


def doctor(ledger, layout, daemon_pid, now=None):
    """Problems, each one line with what to do about it."""
    now = time.time() if now is None else now
    db = ledger.db
    out = []
    result = [r[0] for r in db.execute("PRAGMA integrity_check")]
    if result != ["ok"]:
        found = [r for r in result if not r.startswith("***")] or result
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        out.append(str(LedgerCorrupt(layout.ledger, f"integrity check: {found[0]}{more}")))
    for version, name, ok in ledger.migrations():
        if not ok:
            out.append(f"migration {version} ({name}) has a different checksum than this relay's; "
                       "the ledger was made by another build")
    if db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        out.append("the ledger is not in WAL mode; start `relay run` once to set it")
    if daemon_pid is None:
        n = db.execute("SELECT count(*) FROM messages WHERE status = 'processing'").fetchone()[0]
        if n:
            out.append(f"{n} message(s) left processing by a stopped relay; `relay run` recovers them")
    for row in db.execute("SELECT id, archive_path FROM messages WHERE status = 'archived'"):
        if row["archive_path"] and not os.path.lexists(layout.state / row["archive_path"]):
            out.append(f"{row['id']}: archived file {row['archive_path']} is missing; `relay verify` for detail")
    for row in db.execute("SELECT id, failed_path FROM messages WHERE status = 'failed' AND failed_path IS NOT NULL"):
        if not os.path.lexists(layout.state / row["failed_path"]):
            out.append(f"{row['id']}: quarantined file {row['failed_path']} is missing; `relay expire` or ignore")
    known = {r[0] for r in db.execute("SELECT archive_path FROM messages WHERE archive_path IS NOT NULL")}
    known |= {r[0] for r in db.execute("SELECT failed_path FROM messages WHERE failed_path IS NOT NULL")}
    for base in (layout.archive, layout.failed):
        for dirpath, _, files in os.walk(base):
            for f in files:
                rel = os.path.relpath(os.path.join(dirpath, f), layout.state)
                if rel.endswith(".error.json"):
                    rel = rel[: -len(".error.json")]
                if rel not in known:
                    out.append(f"{rel}: a file no ledger record knows; move it away or delete it")
    active = {r[0] for r in db.execute("SELECT id FROM messages WHERE status IN ('pending', 'processing', 'delivered')")}
    for _, mid, _, path in layout.spooled():
        if mid not in active:
            out.append(f"{os.path.relpath(path, layout.state)}: a spooled file with no pending message; "
                       "`relay run` registers it again, or move it into an outbox to send it")
    for agent in os.listdir(layout.inbox) if layout.inbox.is_dir() else []:
        tmp = layout.inbox / agent / "tmp"
        for f in os.listdir(tmp) if tmp.is_dir() else []:
            if os.lstat(tmp / f).st_mtime < now - 86400:
                out.append(f"inbox/{agent}/tmp/{f}: orphaned temporary file; `relay run` removes it")
    for name, _, problem in layout.outbox_dirs():
        if problem:
            out.append(f"outbox/{name}: {problem}; rename or remove it")
    return out


def agents_report(ledger, layout, known):
    rows = []
    seen = {r["name"]: r for r in ledger.agents()}
    for name in sorted(set(known) | set(seen) | {"System"}):
        box = layout.outbox / name
        waiting = sum(1 for e in os.scandir(box) if e.is_file(follow_symlinks=False)
                      and not is_in_progress_name(e.name)) if box.is_dir() else 0
        counts = {}
        for sub in ("new", "cur"):
            d = layout.inbox / name / sub
            counts[sub] = len(os.listdir(d)) if d.is_dir() else 0
        sent = ledger.db.execute("SELECT count(*) FROM messages WHERE sender = ?", (name,)).fetchone()[0]
        received = ledger.db.execute("SELECT count(*) FROM deliveries WHERE recipient = ?", (name,)).fetchone()[0]
        err = ledger.db.execute("SELECT id, error FROM messages WHERE sender = ? AND status = 'failed' "
                                "ORDER BY id DESC LIMIT 1", (name,)).fetchone()
        rows.append({"agent": name, "outbox_waiting": waiting, "inbox_new": counts["new"], "inbox_cur": counts["cur"],
                     "last_seen": seen[name]["last_seen"] if name in seen else None, "sent": sent,
                     "received": received, "last_error": f"{err['id']}: {err['error']}" if err else None})
    return rows
