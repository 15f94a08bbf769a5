"""How ledger rows look to people (tables, one message's story) and to tools (JSON records)."""
import datetime
import shutil

import orjson

from .ledger import Status
from .message import iso


def when(ts):
    return iso(ts) if ts is not None else None


def recipients(row):
    """The recipient list of a row; a value this build cannot read is shown as it is."""
    raw = row["recipients"]
    if not raw:
        return []
    try:
        value = orjson.loads(raw)
        return value if isinstance(value, list) else [str(value)]
    except orjson.JSONDecodeError:
        return [f"(unreadable: {raw[:40]!r})"]


def record(row):
    """A message row as the JSON record of `relay audit --json` (SPEC section 5)."""
    to = recipients(row)
    return {
        "id": row["id"], "from": row["sender"], "to": to, "kind": row["kind"], "thread": row["thread"],
        "subject": row["subject"], "status": row["status"], "retries": row["retries"], "error": row["error"],
        "discovered_at": when(row["discovered_at"]), "delivered_at": when(row["delivered_at"]),
        "archived_at": when(row["archived_at"]), "failed_at": when(row["failed_at"]),
        "sent_at": when(row["sent_at"]),
        "source_path": f"outbox/{row['sender']}/{row['name']}", "archive_path": row["archive_path"]
        if row["status"] == Status.ARCHIVED else None, "failed_path": row["failed_path"],
        "sha256": row["sha256"], "size": row["size"],
    }


def excerpt(row, width):
    text = row["subject"] or (row["body"] or "").strip().replace("\n", " ") or (row["error"] or "")
    return clip(text, width)


_CONTROLS = {c: " " for c in range(32)} | {0x7F: " ", 0x1B: "\\e"} | {c: " " for c in range(0x80, 0xA0)} | {
    c: " " for c in (0x200E, 0x200F, 0x202A, 0x202B, 0x202C, 0x202D, 0x202E, 0x2066, 0x2067, 0x2068, 0x2069)}


def plain(value):
    """Any stored value as one line of plain text: no terminal escape or bidi control from a
    message reaches the terminal."""
    return ("" if value is None else str(value)).translate(_CONTROLS)


def clip(text, width):
    text = plain(text)
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def short_time(ts):
    if ts is None:
        return ""
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%m-%d %H:%M:%S")


def table(rows, width=None):
    """The audit table: id, time, from → to, kind, thread, subject or excerpt, status."""
    width = width or shutil.get_terminal_size((120, 24)).columns
    lines = []
    head = ("ID", "TIME (UTC)", "FROM → TO", "KIND", "THREAD", "STATUS", "SUBJECT / BODY")
    data = []
    for row in rows:
        to = recipients(row)
        route = f"{row['sender']} → {','.join(to) if to else '?'}"
        data.append([row["id"], short_time(row["discovered_at"]), clip(route, 28), clip(row["kind"] or "", 10),
                     clip(row["thread"] or "", 14), row["status"], row])
    fixed = [26, 14, 28, 10, 14, 10]
    used = [max([len(head[i])] + [len(d[i]) for d in data]) for i in range(6)]
    used = [min(u, f) for u, f in zip(used, fixed, strict=True)]
    rest = max(16, width - sum(used) - 2 * 6)
    fmt = "  ".join(f"{{:<{u}}}" for u in used) + "  {}"
    lines.append(fmt.format(*head[:6], head[6]))
    for d in data:
        lines.append(fmt.format(*d[:6], excerpt(d[6], rest)))
    return "\n".join(lines)


def num(value):
    """A stored number as people read it: 600.0 -> 600; text as it is; anything else (bytes a
    damaged row holds) as its repr."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if value is None or isinstance(value, (int, float, str)) else repr(value)[:80]


def when_or_raw(ts):
    """A stored time as ISO 8601, or as it is when it is not a number."""
    return when(ts) if ts is None or isinstance(ts, (int, float)) else plain(ts)


def shed(row):
    """A shed record as JSON."""
    return {"recipient": row["recipient"], "reason": row["reason"], "limit": num(row["limit_value"]),
            "observed": num(row["observed"]), "at": when_or_raw(row["at"]),
            "released_at": when_or_raw(row["released_at"])}


def show(row, deliveries, events, paths, body, sheds=()):
    """Everything about one message, for a person."""
    rec = record(row)
    out = [f"message {row['id']}"]
    for key in ("from", "to", "kind", "thread", "subject", "status", "retries", "error", "sent_at",
                "discovered_at", "delivered_at", "archived_at", "failed_at", "source_path", "archive_path",
                "failed_path", "sha256", "size"):
        value = rec[key]
        if isinstance(value, list):
            value = ", ".join(value)
        if value not in (None, "", []):
            out.append(f"  {key:<14} {value}")
    if deliveries:
        out.append("deliveries:")
        for d in deliveries:
            out.append(f"  {d['recipient']:<20} {iso(d['delivered_at'])}  {paths.get(d['recipient']) or '(taken from the inbox)'}")
    if sheds:
        out.append("shed (not delivered to):")
        for s in sheds:
            limit = f", limit {num(s['limit'])}, observed {num(s['observed'])}" if s["limit"] is not None else ""
            released = f"; released by relay retry at {s['released_at']}" if s["released_at"] else ""
            out.append(f"  {plain(s['recipient']):<20} {s['reason']}{limit}  at {s['at']}{released}")
    out.append("events:")
    for e in events:
        detail = f"  {e['detail']}" if e["detail"] else ""
        actor = f" [{e['actor']}]" if e["actor"] != "relay" else ""
        out.append(f"  {iso(e['at'])}  {e['event']:<10}{actor}{detail}")
    out.append("body:")
    out.append(body if body is not None else "  (not recorded)")
    return "\n".join(out)


def age(seconds):
    """90 -> '1m30s', for a table."""
    if seconds is None:
        return ""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def ping(state):
    """An agent's last ping, for a table: read after 4s, waiting 2m, gone, or nothing."""
    if not state:
        return ""
    if state["state"] == "read":
        return f"read in {age(state['read_after_s'])}"
    if state["state"] == "waiting":
        return f"unread {age(state['age_s'])}"
    return state["state"]


def _sheds(by_reason):
    return ", ".join(f"{k} {v}" for k, v in by_reason.items() if v) or "-"


def queues(doc):
    """relay queues as two tables: agents, then pairs (worst first)."""
    out = [f"{'AGENT':<20} {'DEPTH':>6} {'PENDING':>7} {'UNREAD':>6} {'OLDEST':>7}  {'LAST DELIVERY':<19} "
           f"{'PING':<14} SHED"]
    for r in doc["agents"]:
        name = f"{r['agent']} (archived)" if r["archived"] else r["agent"]
        out.append(f"{plain(name):<20} {r['depth']:>6} {r['pending']:>7} {r['unread']:>6} "
                   f"{age(r['oldest_unread_age_s']):>7}  {plain(r['last_delivery'] or '')[:19]:<19} "
                   f"{ping(r.get('ping')):<14} {_sheds(r['shed'])}")
    out.append("")
    out.append(f"{'FROM -> TO':<34} {'DEPTH':>6} {'PENDING':>7} {'UNREAD':>6} {'OLDEST':>7}  {'LAST DELIVERY':<19} SHED")
    for r in doc["pairs"]:
        out.append(f"{clip(r['from'] + ' -> ' + r['to'], 34):<34} {r['depth']:>6} {r['pending']:>7} {r['unread']:>6} "
                   f"{age(r['oldest_unread_age_s']):>7}  {plain(r['last_delivery'] or '')[:19]:<19} {_sheds(r['shed'])}")
    if not doc["pairs"]:
        out.append("(no traffic yet)")
    return "\n".join(out)
