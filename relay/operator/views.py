"""How ledger rows look to people (tables, one message's story) and to tools (JSON records). A
value this build cannot read (history.BadRow) is shown as it is stored, marked, never fatal."""
import datetime
import shutil

import orjson

from relay.ledger.ledger import Status
from relay.core.message import TEXT_PLAIN, iso
from relay.terminal import spaced


def unreadable(value):
    return f"(unreadable: {value!r:.60})"


def when(ts):
    if ts is None:
        return None
    return iso(ts) if isinstance(ts, (int, float)) else unreadable(ts)


def recipients(row):
    """The recipient list of a row; a value this build cannot read is shown as it is."""
    raw = row["recipients"]
    if not raw:
        return []
    try:
        value = orjson.loads(raw)
        return [str(v) for v in value] if isinstance(value, list) else [str(value)]
    except (orjson.JSONDecodeError, TypeError):
        return [unreadable(raw)]


def headers(row):
    """The headers relay did not know, as stored; a value this build cannot read is shown as it is."""
    raw = row["headers"]
    try:
        value = orjson.loads(raw or "{}")
    except (orjson.JSONDecodeError, TypeError):
        return {"(unreadable)": str(raw)}
    return value if isinstance(value, dict) else {"(unreadable)": str(raw)}


def value(v):
    """A stored value as JSON holds it; one no JSON holds (a blob) shown as unreadable."""
    return v if v is None or isinstance(v, (str, int, float)) else unreadable(v)


def record(row):
    """A message row as the JSON record of `relay audit --json` (contract §5)."""
    to = recipients(row)
    row = {k: value(row[k]) for k in row.keys()}
    return {
        "id": row["id"], "from": row["sender"], "to": to, "kind": row["kind"], "thread": row["thread"],
        "subject": row["subject"], "content_type": row.get("content_type") or TEXT_PLAIN,
        "status": row["status"], "retries": row["retries"], "max_retries": row.get("max_retries"), "error": row["error"],
        "discovered_at": when(row["discovered_at"]), "delivered_at": when(row["delivered_at"]),
        "archived_at": when(row["archived_at"]), "failed_at": when(row["failed_at"]),
        "sent_at": when(row["sent_at"]),
        "source_path": f"{row['node'] + ':' if row['node'] else ''}outbox/{row['sender']}/{row['name']}",
        "archive_path": row["archive_path"]
        if row["status"] == Status.ARCHIVED else None, "failed_path": row["failed_path"],
        "sha256": row["sha256"], "size": row["size"],
        "request_id": row["request_id"], "duplicate_of": row["duplicate_of"],
        "node": row["node"], "entry_id": row["entry_id"],      # received from another node: which, as which entry
    }


def excerpt(row, width):
    body = row["body"] if isinstance(row["body"], str) else ""
    text = row["subject"] or body.strip().replace("\n", " ") or (row["error"] or "")
    return clip(text, width)


def plain(value):
    """Any stored value as one line of plain text (a table's cell, a header of a message): each
    character terminal.UNSAFE names a space, ESC shown as `\\e`. (terminal.echo, which prints
    every line, would show them as escapes anyway.)"""
    return spaced(("" if value is None else str(value)).replace("\x1b", "\\e"))


def clip(text, width):
    text = plain(text)
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def short_time(ts):
    if ts is None:
        return ""
    if not isinstance(ts, (int, float)):
        return unreadable(ts)
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%m-%d %H:%M:%S")


def route(row, remote=None):
    """'Ann → Bob,Cy@n2': a sender on another node and recipients on other nodes with their node."""
    sender = f"{row['sender']}@{row['node']}" if row["node"] else row["sender"]
    remote = remote or {}
    to = [f"{r}@{remote[r]}" if r in remote else r for r in recipients(row)]
    return f"{sender} → {','.join(to) if to else '?'}"


def table(rows, width=None, remote=None):
    """The audit table: id, time, from → to, kind, thread, subject or excerpt, status (a message
    that repeats a request id: `duplicate`). `remote`:
    {id: {recipient: node}} of recipients on other nodes."""
    width = width or shutil.get_terminal_size((120, 24)).columns
    lines = []
    head = ("ID", "TIME (UTC)", "FROM → TO", "KIND", "THREAD", "STATUS", "SUBJECT / BODY")
    data = []
    for row in rows:
        path = route(row, (remote or {}).get(row["id"]))
        data.append([row["id"], short_time(row["discovered_at"]), clip(path, 28), clip(row["kind"] or "", 10),
                     clip(row["thread"] or "", 14), "duplicate" if row["duplicate_of"] else row["status"], row])
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


def headline(counts):
    """Messages as people count them, from the ledger's states (`counts`): delivered, whether its
    file was archived since (`archived`) or its archive move is still to come (`delivered`); on
    the way (`pending`, `processing`); failed."""
    n = lambda *states: sum(counts.get(s, 0) for s in states)      # noqa: E731
    return {"delivered": n(Status.DELIVERED, Status.ARCHIVED), "on_the_way": n(Status.PENDING, Status.PROCESSING),
            "failed": n(Status.FAILED)}


def ledger_states(counts):
    """The ledger's states named, each with its count."""
    n = lambda s: counts.get(s, 0)      # noqa: E731
    return (f"archived {n(Status.ARCHIVED)}, delivered {n(Status.DELIVERED)} (its file not archived yet), "
            f"pending {n(Status.PENDING)}, processing {n(Status.PROCESSING)}, failed {n(Status.FAILED)}")


def registered(row):
    """The lines `relay agents` shows under an agent with a registry row: what its spawn said of
    it (by whom, when, cli, model, cwd, task), or where it was imported from, and its release."""
    out = []
    meta = row.get("metadata") or {}
    if row.get("spawned_at"):
        said = "  ".join(f"{k}={clip(meta[k], 40)}" for k in ("cli", "model", "cwd") if meta.get(k))
        if row.get("spawned_by"):
            head = f"spawned by {plain(row['spawned_by'])} at {row['spawned_at']}"
        else:               # no spawn made it: brought over by an import (or written by hand)
            source = meta.get("imported_from")
            head = (f"imported from {plain(source)}, known there since" if source else "registered at") + \
                f" {row['spawned_at']}"
        out.append(head + (f": {said}" if said else ""))
        if meta.get("task"):
            out.append(f"task: {clip(' '.join(str(meta['task']).split()), 100)}")
    if row.get("released_at"):
        out.append(f"released by {plain(row['released_by'])} at {row['released_at']}")
    return out


def when_or_raw(ts):
    """A stored time as ISO 8601, or as it is when it is not a number."""
    return when(ts) if ts is None or isinstance(ts, (int, float)) else plain(ts)


def shed(row):
    """A shed record as JSON (a value this build cannot read shown as stored, marked)."""
    return {"recipient": value(row["recipient"]), "reason": value(row["reason"]), "limit": num(row["limit_value"]),
            "observed": num(row["observed"]), "at": when_or_raw(row["at"]),
            "released_at": when_or_raw(row["released_at"])}


def show(row, deliveries, events, paths, body, remote=(), sheds=()):
    """Everything about one message, for a person. `remote`: its outbound rows (other nodes)."""
    rec = record(row)
    out = [f"message {row['id']}"]
    if row["node"]:
        out.append(f"  received from node {row['node']} as stream entry {row['entry_id']}")
    for key in ("from", "to", "kind", "thread", "subject", "content_type", "status", "retries", "max_retries",
                "error", "sent_at",
                "discovered_at", "delivered_at", "archived_at", "failed_at", "source_path", "archive_path",
                "failed_path", "sha256", "size", "request_id", "duplicate_of"):
        value = rec[key]
        if isinstance(value, list):
            value = ", ".join(value)
        if key == "status" and rec["duplicate_of"]:
            value = (f"{value}: a duplicate of {rec['duplicate_of']} (request id {rec['request_id']!r}), "
                     "not delivered again")
        if value not in (None, "", []):
            out.append(f"  {key:<14} {value}")
    if deliveries:
        out.append("deliveries:")
        for d in deliveries:
            out.append(f"  {d['recipient']:<20} {iso(d['delivered_at'])}  {paths.get(d['recipient']) or '(taken from the inbox)'}")
    if remote:
        out.append("other nodes:")
        for o in remote:
            names = ", ".join(orjson.loads(o["recipients"]))
            out.append(f"  {plain(names)} @ {plain(o['node']):<14} {remote_state(o)}")
    if sheds:
        out.append("shed (not delivered to):")
        for s in sheds:
            limit = f", limit {num(s['limit'])}, observed {num(s['observed'])}" if s["limit"] is not None else ""
            released = f"; released by relay retry at {s['released_at']}" if s["released_at"] else ""
            out.append(f"  {plain(s['recipient']):<20} {plain(s['reason'])}{limit}  at {plain(s['at'])}{released}")
    out.append("events:")
    for e in events:
        detail = f"  {e['detail']}" if e["detail"] else ""
        actor = f" [{e['actor']}]" if e["actor"] != "relay" else ""
        out.append(f"  {iso(e['at'])}  {e['event']:<10}{actor}{detail}")
    out.append("body:")
    out.append(body if body is not None else "  (not recorded)")
    return "\n".join(out)


def remote_state(o):
    """Where one outbound row stands: acknowledged by its node, refused by it, waiting for its
    acknowledgement since when, or waiting to be published."""
    if o["status"] == "acknowledged":
        entry = f" (published as entry {plain(o['entry_id'])})" if o["entry_id"] else ""
        return f"acknowledged by node {plain(o['node'])} {iso(o['acked_at'])}{entry}"
    if o["status"] == "refused":
        return f"refused by node {plain(o['node'])} {iso(o['acked_at'])}: {plain(o['error'] or '')}"
    if o["status"] == "published":
        return (f"published {iso(o['published_at'])} as entry {o['entry_id']}, waiting for node "
                f"{plain(o['node'])} to acknowledge it (published again after {iso(o['ack_deadline'])})")
    return f"waiting for the server (attempt {o['attempts']}): {plain(o['error'] or 'not tried yet')}"


READ_STATES = {"new": "unread", "cur": "read"}      # an inbox's Maildir states, as people say them


def message_text(m, number=1, total=1, state=None):
    """One message whole, as `relay inbox` and `relay read` print it (a Received): its state
    `unread` or `read` (`state` when given: what it is once printed, as --ack makes it), or the
    ledger's status when no inbox holds it."""
    state = state or m.state
    head = f"--- message {number} of {total}: {plain(m.id)} ({READ_STATES.get(state) or plain(state)}) ---"
    lines = [head]
    if m.error:
        lines.append(f"error:   {plain(m.error)}")
        return "\n".join(lines)
    fields = [("from", m.sender), ("to", ", ".join(m.to)), ("thread", m.thread), ("subject", m.subject),
              ("kind", m.kind if m.kind != "message" else None), ("type", m.content_type if m.content_type != TEXT_PLAIN else None), ("sent", m.sent_at),
              ("id", m.id)]
    lines += [f"{k + ':':<9}{plain(v)}" for k, v in fields if v]
    lines.append("")
    lines.append(body_text(m.body))
    return "\n".join(lines)


def body_text(body):
    """A body as text for a terminal: its lines kept, terminal escapes and other controls removed."""
    return "\n".join(plain(line) for line in (body or "").replace("\r\n", "\n").split("\n")).rstrip("\n")


def federation(doc, running, now):
    """The federation lines of `relay status` (federation.probe's document)."""
    link, server, out, directory = doc["link"], doc["server"], doc["outbound"], doc["directory"]
    if not running:
        state = "daemon not running"
    elif link["connected"] is None:
        state = "not connected yet"
    else:
        state = f"{'connected' if link['connected'] else 'DISCONNECTED'} since {when(link['since'])}" + (
            f" ({plain(link['error'])})" if link["error"] else "")
    lines = [f"federation node {plain(doc['node'])} of team {plain(doc['team'])} at {plain(doc['url'])}",
             f"  link       {state}"]
    if directory["error"]:
        lines.append(f"  directory  CANNOT BE READ: {plain(directory['error'])}; names this node does not know wait")
    elif directory["read_at"]:
        lines.append(f"  directory  read {max(0.0, now - directory['read_at']):.1f}s ago")
    if server.get("asked") is False:
        lines.append("  server     not asked from here: no URL in this environment (the daemon's holds it)")
    elif server["reachable"] and server["error"]:
        lines.append(f"  server     reachable, but: {plain(server['error'])}")
    elif server["reachable"]:
        lines.append(f"  server     reachable; {server['incoming'] or 0} entries wait to be read by this node")
    else:
        lines.append(f"  server     unreachable: {plain(server['error'])}")
    waiting = f", oldest {now - out['oldest_pending_at']:.1f}s" if out["oldest_pending_at"] else ""
    lines.append(f"  outbound   {out['pending']} waiting to be published{waiting}, {out['published']} waiting for "
                 f"their node's acknowledgement, {out['acknowledged']} acknowledged, {out['refused']} refused")
    for node, w in out["by_node"].items():
        age = now - w["oldest_at"] if w["oldest_at"] else 0.0
        late = w.get("unacked_since") is not None and now - w["unacked_since"] > doc.get("ack_warn", 30.0)
        warn = f"  NOT ACKNOWLEDGING for {now - w['unacked_since']:.0f}s (ack_timeout {doc['ack_warn']:g}s)" \
            if late else ""
        lines.append(f"    {plain(node):<20} {w['waiting']} unacknowledged, oldest {age:.1f}s{warn}")
    lines.append(f"  received   {doc['received']['delivered']} delivered, {doc['received']['refused']} refused")
    for name, other in doc["conflicts"]:
        lines.append(f"  CONFLICT   agent {plain(name)} is also listed by node {plain(other)}: rename one of them")
    for name, other in doc.get("others_conflicts", []):
        lines.append(f"  conflict   agent {plain(name)} (another node's) is also listed by node {plain(other)}")
    return "\n".join(lines)


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
