"""`relay report --html FILE`: one self-contained page (inline CSS and SVG, no network) for a
person: who told whom how much, traffic per hour, failures with reasons, what flow control shed
and why, threads, and the stored rows this relay cannot read. The figures come from
History.figures()."""
import datetime
import html

from relay.ledger.schema import REASONS
from relay.core.message import iso
from relay.terminal import escaped
from relay.operator.views import headline, ledger_states, num


def _time(ts):
    return iso(ts) if isinstance(ts, (int, float)) else ts

CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#1a202c;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #e2e8f0}
.meta{color:#4a5568} table{border-collapse:collapse;margin:4px 0}
td,th{border:1px solid #e2e8f0;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f7fafc} td.n{text-align:right;font-variant-numeric:tabular-nums}
.cards{display:flex;gap:12px;flex-wrap:wrap} .card{border:1px solid #e2e8f0;border-radius:6px;padding:8px 14px}
.card b{display:block;font-size:22px} .err{color:#9b2c2c} code{font-size:12px}
"""


def _e(value):
    """A value for the page: HTML-escaped, each control and bidi character shown as an escape
    (terminal.escaped), as a terminal would show it."""
    return html.escape(escaped("" if value is None else str(value), keep=""))


def _matrix(rows):
    senders = sorted({r["sender"] for r in rows})
    recipients = sorted({r["recipient"] for r in rows})
    if not rows:
        return "<p>No deliveries in this period.</p>"
    counts = {(r["sender"], r["recipient"]): r["n"] for r in rows}
    top = max(counts.values())
    out = ["<table id='matrix'><tr><th>from \\ to</th>"]
    out += [f"<th>{_e(r)}</th>" for r in recipients] + ["<th>total</th></tr>"]
    for s in senders:
        out.append(f"<tr><th>{_e(s)}</th>")
        for r in recipients:
            n = counts.get((s, r), 0)
            shade = int(235 - 150 * n / top) if n else 255
            style = f" style='background:rgb({shade},{shade + 10 if shade < 245 else 255},255)'" if n else ""
            out.append(f"<td class='n'{style}>{n or ''}</td>")
        out.append(f"<td class='n'><b>{sum(counts.get((s, r), 0) for r in recipients)}</b></td></tr>")
    out.append("</table>")
    return "".join(out)


def _hours(rows):
    if not rows:
        return "<p>No messages in this period.</p>"
    first, last = rows[0]["h"], rows[-1]["h"]
    span = list(range(first, last + 1))[-72:]
    counts = {r["h"]: r["n"] for r in rows}
    top = max(counts.get(h, 0) for h in span) or 1
    w, h_px, bar = 720, 160, max(4, min(48, 720 // max(1, len(span))))
    parts = [f"<svg id='hours' xmlns='http://www.w3.org/2000/svg' width='{w + 60}' height='{h_px + 40}' "
             f"role='img' aria-label='messages per hour'>",
             f"<line x1='40' y1='{h_px}' x2='{w + 40}' y2='{h_px}' stroke='#718096'/>",
             f"<text x='0' y='12' font-size='11'>{top}</text><text x='0' y='{h_px}' font-size='11'>0</text>"]
    for i, hour in enumerate(span):
        n = counts.get(hour, 0)
        height = round(n / top * (h_px - 10))
        x = 40 + i * bar
        parts.append(f"<rect x='{x + 1}' y='{h_px - height}' width='{bar - 2}' height='{height}' fill='#2b6cb0'>"
                     f"<title>{_e(_hour_label(hour))}: {n}</title></rect>")
        if len(span) <= 24 or i % max(1, len(span) // 12) == 0:
            parts.append(f"<text x='{x}' y='{h_px + 14}' font-size='10'>{_e(_hour_label(hour)[11:16])}</text>")
    parts.append("</svg>")
    return "".join(parts)


def _hour_label(hour):
    return datetime.datetime.fromtimestamp(hour * 3600, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")


def _unreadable(bad):
    """The stored rows this relay could not read (counted in no figure above), if any."""
    if not bad:
        return ""
    rows = "".join(f"<tr><td>{_e(b.table)}</td><td><code>{_e(b.key)}</code></td><td>{_e(', '.join(c for c, _ in b.columns))}</td>"
                   f"<td><code>{_e('; '.join(repr(v)[:80] for _, v in b.columns))}</code></td></tr>" for b in bad[:500])
    more = f"<p>... and {len(bad) - 500} more.</p>" if len(bad) > 500 else ""
    return (f"<h2>Rows this relay cannot read ({len(bad)})</h2>\n<table id='unreadable'><tr><th>table</th>"
            f"<th>row</th><th>column</th><th>value</th></tr>{rows}</table>{more}")


def render(data, title="relay report", now=None):
    counts = data["counts"]
    total = sum(counts.values())
    since = f"since {iso(data['since'])}" if data["since"] else "all time"
    cards = "".join(f"<div class='card'><b>{n}</b>{k.replace('_', ' ')}</div>" for k, n in headline(counts).items())
    failures = "".join(
        f"<tr><td><code>{_e(r['id'])}</code></td><td>{_e(r['sender'])}</td><td>{_e(r['name'])}</td>"
        f"<td class='err'>{_e(r['error'])}</td><td>{_e(iso(r['failed_at']) if r['failed_at'] else '')}</td></tr>"
        for r in data["failures"]) or "<tr><td colspan='5'>No failures.</td></tr>"
    shed_counts = data.get("shed_counts", {})
    shed_cards = "".join(f"<div class='card'><b>{shed_counts.get(k, 0)}</b>{k}</div>" for k in REASONS)
    sheds = "".join(
        f"<tr><td>{_e(_time(r['at']))}</td><td><code>{_e(r['message_id'])}</code></td><td>{_e(r['sender'])}</td>"
        f"<td>{_e(r['recipient'])}</td><td class='err'>{_e(r['reason'])}</td><td class='n'>{_e(num(r['limit_value']))}"
        f"</td><td class='n'>{_e(num(r['observed']))}</td></tr>"
        for r in data.get("sheds", [])) or "<tr><td colspan='7'>Nothing shed.</td></tr>"
    threads = "".join(
        f"<tr><td>{_e(r['thread'])}</td><td class='n'>{r['n']}</td><td>{_e(r['senders'])}</td>"
        f"<td>{_e(iso(r['first']))}</td><td>{_e(iso(r['last']))}</td></tr>"
        for r in data["threads"]) or "<tr><td colspan='5'>No threads.</td></tr>"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title><style>{CSS}</style></head>
<body>
<h1>{_e(title)}</h1>
<p class="meta">{total} messages, {since}; generated {_e(iso(now)) if now else ''}</p>
<div class="cards" id="messages">{cards}</div>
<p class="meta" id="states">ledger states: {_e(ledger_states(counts))}</p>
<h2>Who told whom (deliveries)</h2>
{_matrix(data["matrix"])}
<h2>Messages per hour (UTC)</h2>
{_hours(data["hours"])}
<h2>Failures</h2>
<table id="failures"><tr><th>id</th><th>from</th><th>file</th><th>reason</th><th>failed at</th></tr>{failures}</table>
<h2>Shed by flow control</h2>
<div class="cards" id="shed-counts">{shed_cards}</div>
<table id="sheds"><tr><th>at</th><th>id</th><th>from</th><th>to</th><th>reason</th><th>limit</th><th>observed</th></tr>{sheds}</table>
<h2>Threads</h2>
<table id="threads"><tr><th>thread</th><th>messages</th><th>senders</th><th>first</th><th>last</th></tr>{threads}</table>
{_unreadable(data.get("unreadable") or [])}
</body></html>
"""
