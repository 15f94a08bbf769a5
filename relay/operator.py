"""What operators do beside the daemon: retry, expire, verify the archive, doctor."""
import getpass
import hashlib
import os
import time

from .archive import Archive, check_rel
from .errors import LedgerCorrupt, NotFound, RelayError
from .fs import shown
from .inbox import Inbox
from .layout import is_in_progress_name
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
        src = row["failed_path"]
        try:
            present = bool(src) and layout.fs.exists(check_rel(src, "failed"))
        except OSError:
            present = False
        if not present:
            problems.append(f"{row['id']}: its file is gone ({row['error']}); write the message again")
            continue
        archive = Archive(layout, Syncer("full", layout.fs))
        archive.move(src, layout.spool_rel(row["sender"], row["id"], row["name"]))
        layout.fs.unlink_quietly(f"{src}.error.json")
        archive.syncer.flush("the retried message's move back to the spool")
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
    archive = Archive(layout, Syncer("full", layout.fs))
    src = None      # a failed message is in failed/ already
    if row["status"] == "pending":
        spool = layout.spool_rel(row["sender"], row["id"], row["name"])
        src = spool if layout.fs.exists(spool) else f"outbox/{row['sender']}/{row['name']}"
        src = src if layout.fs.exists(src) else None
    report = archive.report(row["id"], row["sender"], row["name"], reason, now)
    if src or not row["failed_path"]:
        rel = archive.quarantine(src, row["sender"], row["id"], row["name"], report)
    else:
        rel = row["failed_path"]
        archive.write_report(rel, report)
    archive.syncer.flush("expired message")
    with ledger.transaction() as db:
        db.execute("UPDATE messages SET failed_path = ?, spooled = 0 WHERE id = ?", (rel, row["id"]))
    return row["id"]


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


def envelopes(ledger, layout):
    """Problems with the envelopes relay recorded as delivered: one that is still in the inbox
    (new/ or cur/) but is not the complete envelope relay wrote (size and sha256) is named.
    One the agent has deleted is no problem."""
    fs = layout.fs
    problems, index = [], {}
    for d in ledger.db.execute("SELECT message_id, recipient, size, sha256 FROM deliveries "
                               "WHERE sha256 IS NOT NULL ORDER BY recipient, message_id"):
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
    for row in db.execute("SELECT id FROM messages WHERE status = 'archived' AND id NOT IN "
                          "(SELECT message_id FROM chain)"):
        problems.append(f"{row['id']}: archived record is not in the hash chain (inserted?)")
    problems += envelopes(ledger, layout)
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
        if row["archive_path"] and not layout.fs.exists(row["archive_path"]):
            out.append(f"{row['id']}: archived file {row['archive_path']} is missing; `relay verify` for detail")
    for row in db.execute("SELECT id, failed_path FROM messages WHERE status = 'failed' AND failed_path IS NOT NULL"):
        if not layout.fs.exists(row["failed_path"]):
            out.append(f"{row['id']}: quarantined file {row['failed_path']} is missing; `relay expire` or ignore")
    known = {r[0] for r in db.execute("SELECT archive_path FROM messages WHERE archive_path IS NOT NULL")}
    known |= {r[0] for r in db.execute("SELECT failed_path FROM messages WHERE failed_path IS NOT NULL")}
    for base in ("archive", "failed"):
        for rel in layout.fs.walk_files(base):
            if base == "failed" and rel.endswith(".error.json"):
                rel = rel[: -len(".error.json")]
            if rel not in known:
                out.append(f"{shown(rel)}: a file no ledger record knows; move it away or delete it")
    active = {r[0] for r in db.execute("SELECT id FROM messages WHERE status IN ('pending', 'processing', 'delivered')")}
    for _, mid, _, rel in layout.spooled():
        if mid not in active:
            out.append(f"{rel}: a spooled file with no pending message; "
                       "`relay run` registers it again, or move it into an outbox to send it")
    for rel in Inbox(layout, None).orphans(now - 86400):
        out.append(f"{shown(rel)}: orphaned temporary file; `relay run` removes it")
    for name, _, problem in layout.outbox_dirs():
        if problem:
            out.append(f"outbox/{shown(name)}: {problem}; rename or remove it")
    out += envelopes(ledger, layout)
    return out


def agents_report(ledger, layout, known):
    rows = []
    seen = {r["name"]: r for r in ledger.agents()}
    for name in sorted(set(known) | set(seen) | {"System"}):
        waiting = layout.fs.count(f"outbox/{name}", lambda e: e.is_file(follow_symlinks=False)
                                  and not is_in_progress_name(e.name))
        counts = {sub: layout.fs.count(f"inbox/{name}/{sub}") for sub in ("new", "cur")}
        sent = ledger.db.execute("SELECT count(*) FROM messages WHERE sender = ?", (name,)).fetchone()[0]
        received = ledger.db.execute("SELECT count(*) FROM deliveries WHERE recipient = ?", (name,)).fetchone()[0]
        err = ledger.db.execute("SELECT id, error FROM messages WHERE sender = ? AND status = 'failed' "
                                "ORDER BY id DESC LIMIT 1", (name,)).fetchone()
        rows.append({"agent": name, "outbox_waiting": waiting, "inbox_new": counts["new"], "inbox_cur": counts["cur"],
                     "last_seen": seen[name]["last_seen"] if name in seen else None, "sent": sent,
                     "received": received, "last_error": f"{err['id']}: {err['error']}" if err else None})
    return rows
