"""What each page shows, read through the History (history.web and its other reads) into plain
dicts the templates print. Nothing here holds a statement; a stored value this build cannot read
is shown as it is stored (views.value), never fatal."""
import hashlib
import os
import time

from relay.agent.leases import Reservation
from relay.core import health, registry
from relay.core.archive import check_rel
from relay.errors import NotFound
from relay.files.layout import valid_id
from relay.files.lock import holder
from relay.ledger.rows import sift
from relay.ledger.schema import REASONS
from relay.operator import doctor, queues, views

HOURS = 48                  # the Overview's messages per hour: the last two days
MAX_ORIGINAL = 64 << 20     # bytes of an original read to check its hash and serve it


def recipients(row):
    return views.recipients(row)


def overview(history, layout, cfg, now):
    """The Overview: messages per state and per hour, queues per agent and per pair, failures
    and bounces with their reasons and subjects, overdue acknowledgements, the daemon's health
    and attested durability, the federation's nodes."""
    pid = holder(layout.lock)
    att = health.attestation(history, pid)
    since = (int(now // 3600) - HOURS + 1) * 3600
    doc = {"counts": history.counts(), "hours": [(r["h"], r["n"]) for r in history.web.per_hour(since)],
           "queues": queues.project(history, layout, layout.agent_names(cfg.agents), now),
           "failures": history.web.recent_failures(20), "bounces": history.web.recent_bounces(20),
           "shed_counts": history.web.shed_reasons(), "acks_overdue": overdue_acks(history, cfg, now),
           "daemon": {"pid": pid, "durability": health.describe(att, pid), "attested": att},
           "last_event": history.last_event(), "federation": federation(history, cfg, now)}
    doc["total"] = sum(doc["counts"].values())
    doc["headline"] = views.headline(doc["counts"])      # as relay report and relay status count
    doc["top_hour"] = max([n for _, n in doc["hours"]] or [1])
    doc["now"], doc["ack_overdue"] = now, cfg.ack_overdue
    return doc


def overdue_acks(history, cfg, now, limit=200):
    """The delivered copies whose acknowledgement, asked for, waits longer than ack_overdue
    (relay overdue's list), oldest first: dicts with id, sender, recipient, subject, thread,
    delivered_at, surfaced_at, read_at."""
    return history.receipts.overdue(now - cfg.ack_overdue, limit=limit)


def receipts(history, cfg, row, now):
    """(priority, ack_required, {recipient: receipt}) of a message: each delivered copy's
    surfaced, read and acknowledged times, its note and reply, and whether its acknowledgement,
    asked for, is overdue."""
    priority, ack = history.receipts.asks(row["id"])
    out = {}
    for r in history.receipts.of(row["id"]):
        late = ack and r["acked_at"] is None and r["delivered_at"] <= now - cfg.ack_overdue
        out[r["recipient"]] = {**r, "overdue": late}
    return priority, ack, out


def federation(history, cfg, now):
    """Each node this one sends to: its unacknowledged rows and the oldest's age; the link."""
    if not cfg.federation:
        return None
    link = history.remote.link()
    counts = history.remote.outbound_counts()
    nodes = [{"node": node, "waiting": w["waiting"], "published": w["published"],
              "oldest_s": (now - w["oldest_at"]) if w["oldest_at"] else None}
             for node, w in counts["by_node"].items()]
    return {"node": cfg.federation.node, "connected": bool(link["connected"]) if link is not None else None,
            "error": link["error"] if link is not None else None, "nodes": nodes, "counts": counts}


def message_list(rows, history):
    """The rows of a page of messages, for the table."""
    sheds = history.sheds_of([r["id"] for r in rows])
    priorities = history.receipts.priorities([r["id"] for r in rows])
    return [{"id": r["id"], "from": f"{r['sender']}@{r['node']}" if r["node"] else r["sender"],
             "to": ", ".join(recipients(r)), "kind": r["kind"], "thread": r["thread"], "subject": r["subject"],
             "status": "duplicate" if r["duplicate_of"] else r["status"], "at": r["discovered_at"],
             "error": r["error"], "shed": sorted(sheds.get(r["id"], {})),
             "priority": priorities.get(r["id"], "normal")} for r in rows]


def message(history, layout, mid, cfg, now):
    """One message: every field, its deliveries, sheds, other nodes, events (a timeline), its
    bounces, and its original checked against its hash and the chain. NotFound for an id the
    ledger does not hold (the id is looked up, never used as a path)."""
    row = history.get(mid.upper()) if valid_id(mid.upper()) else None
    if row is None:
        raise NotFound(f"no message {mid!r} in the ledger")
    bad = []
    rec = views.record(row)
    doc = {"record": rec, "body": views.value(row["body"]), "headers": views.headers(row),
           "deliveries": list(sift(history.deliveries(row["id"]), bad, "deliveries")),
           "events": list(sift(history.events(row["id"]), bad, "events")),
           "sheds": [views.shed(s) for s in history.sheds(row["id"])],
           "remote": [{"node": o["node"], "state": views.remote_state(o)} for o in history.remote.outbound(row["id"])],
           "bounces": history.web.bounces_of([row["id"]]).get(row["id"], []),
           "receipts": receipts(history, cfg, row, now),
           "original": original(history, layout, row), "unreadable": [str(b) for b in bad]}
    return doc


def stored_original(row):
    """The relative path of a message's original (its archive file, or its quarantined file),
    refused unless it lies under archive/ or failed/; None when it has none."""
    rel = row["archive_path"] if row["status"] == "archived" else row["failed_path"]
    if not isinstance(rel, str) or not rel:
        return None
    return check_rel(rel, "archive", "failed")


def read_original(layout, row):
    """The bytes of a message's original, read through the confined file system; OSError when
    it cannot be read, NotFound when it has none."""
    rel = stored_original(row)
    if rel is None:
        raise NotFound(f"message {row['id']} has no original kept (status {row['status']})")
    fd = layout.fs.open_read(rel)
    try:
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > MAX_ORIGINAL:
                raise OSError(f"larger than {MAX_ORIGINAL >> 20} MiB: not shown here (relay show has it)")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def original(history, layout, row):
    """What the message page says of the original: where it is kept, whether its bytes hash to
    the recorded sha256, and whether its record holds its link of the hash chain."""
    chained, chain_words = history.web.chained(row["id"])
    doc = {"kept": None, "hash_ok": None, "words": "", "chained": chained, "chain_words": chain_words}
    try:
        rel = stored_original(row)
    except OSError as e:
        doc["words"] = f"its recorded path cannot be followed: {e.strerror or e}"
        return doc
    if rel is None:
        doc["words"] = "no original kept (a message's file is archived once delivered, or quarantined when failed)"
        return doc
    doc["kept"] = rel
    try:
        data = read_original(layout, row)
    except FileNotFoundError:
        doc["words"] = "its file is missing"
        return doc
    except OSError as e:
        doc["words"] = f"its file cannot be read: {e.strerror or e}"
        return doc
    doc["hash_ok"] = hashlib.sha256(data).hexdigest() == row["sha256"]
    doc["words"] = ("its bytes hash to the recorded sha256" if doc["hash_ok"]
                    else "its bytes do NOT hash to the recorded sha256: the file was altered")
    return doc


def thread(history, tid, limit=1000):
    """A thread as a conversation, oldest first (from its first message), each message with its
    bounces and acknowledgements in place."""
    rows = list(sift(history.audit(thread=tid, oldest_first=True, limit=limit), []))
    if not rows:
        raise NotFound(f"no thread {tid!r} in the ledger")
    bounces = history.web.bounces_of([r["id"] for r in rows])
    acks = history.web.acks_of([r["id"] for r in rows])
    return [{"id": r["id"], "from": r["sender"], "to": ", ".join(recipients(r)), "subject": r["subject"],
             "body": views.value(r["body"]), "status": r["status"], "kind": r["kind"], "at": r["discovered_at"],
             "error": r["error"], "bounces": bounces.get(r["id"], []),
             "acks": acks.get(r["id"], [])} for r in rows]


def agents(history, layout, cfg, now=None):
    """The registry: each agent active, released or archived, last seen, reservations, traffic."""
    now = time.time() if now is None else now
    bad = []
    local = layout.agent_names(cfg.agents)
    roster = registry.roster(history, local, bad)
    rows = doctor.agents_report(history, layout, set(roster), bad, now=now)
    held = {}
    for r in history.reservations.held(now):
        held.setdefault(r["agent"], []).append(Reservation.of(r).as_dict(now))
    out = []
    for r in rows:
        reg = (roster.get(r["agent"]) or registry.Registered(r["agent"])).fields()
        state = "archived" if r["archived"] else ("released" if reg["state"] != registry.ACTIVE else "active")
        out.append({**r, **reg, "state": state, "reservations": held.get(r["agent"], []),
                    "shed": sum(r["shed_to"].values()), "meta": views.registered({**r, **reg})})
    state = [{"key": s["key"], "value": s["value"], "version": s["version"], "at": s["updated_at"],
              "by": s["updated_by"]} for s in history.state.entries()]
    return {"agents": out, "state": state, "reasons": REASONS}
