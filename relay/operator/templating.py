"""The Jinja2 environment `relay report --html` and `relay web` render with: autoescape on for
every template, every value printed made inert first (each control, bidi and other unsafe
character shown as a visible escape, terminal.escaped, so an agent's subject cannot reorder or
hide what a person reads), and the filters both use. The templates both pages share are in
relay/operator/templates/ (figures.html: the headline, failures, bounces, sheds, threads);
relay web adds its own (relay/web/templates/) in front of them.

Jinja2 is imported here only: `relay report` and `relay web` import this module when they
render, so no other verb pays for it."""
import datetime
import re
from urllib.parse import quote

import jinja2
from markupsafe import Markup, escape

from relay.terminal import escaped

SHARED = jinja2.PackageLoader("relay.operator", "templates")


def inert(value):
    """What `{{ value }}` prints: text with its unsafe characters shown as escapes (newlines and
    tabs kept); markup a template made itself (Markup) as it is."""
    if value is None:
        return ""
    if isinstance(value, Markup):
        return value
    if isinstance(value, str):
        return escaped(value, keep="\n\t")
    return value


def utc(ts, fmt="%Y-%m-%d %H:%M:%S"):
    """An epoch time as UTC text; a value that is no number shown as it is."""
    if ts is None or ts == "":
        return ""
    if not isinstance(ts, (int, float)):
        return f"(unreadable: {ts!r:.60})"
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime(fmt)


def age(seconds):
    """90 -> '1m30s'."""
    if seconds is None:
        return ""
    s = int(seconds)
    for unit, size, sub, subsize in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if s >= size:
            return f"{s // size}{unit}{s % size // subsize:02d}{sub}"
    return f"{s}s"


def thread_href(tid):
    """The address of a thread: /threads/ID with every character of the id quoted (a `/` too);
    an id a browser would take for a dot segment (`.`, `..`) goes as a filter of /messages."""
    tid = str(tid)
    if tid.strip(".") == "":
        return "/messages?thread=" + quote(tid, safe="")
    return "/threads/" + quote(tid, safe="")


def css_word(value):
    return re.sub(r"[^a-z]", "", str(value).lower())[:20]


def sheds(by_reason):
    return ", ".join(f"{k} {v}" for k, v in (by_reason or {}).items() if v) or "-"


def number(value):
    """A limit or an observed figure: an integer without its .0; anything else as it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def hour_bars(hours, top, width=720, height=120):
    """Messages per hour ([(hour since the epoch, n)]) as an SVG bar chart (attributes only: no
    inline style, for the web view's CSP)."""
    if not hours:
        return Markup('<p class="quiet" id="hours">No messages in this period.</p>')
    first, last = hours[0][0], hours[-1][0]
    counts = dict(hours)
    span = list(range(first, last + 1))[-72:]
    bar = max(4, min(40, width // max(1, len(span))))
    parts = [f'<svg id="hours" xmlns="http://www.w3.org/2000/svg" width="{width + 40}" height="{height + 24}" '
             'role="img" aria-label="messages per hour">',
             f'<line x1="30" y1="{height}" x2="{width + 30}" y2="{height}" stroke="#718096"/>',
             f'<text x="0" y="12" font-size="11">{int(top)}</text>']
    for i, hour in enumerate(span):
        n = counts.get(hour, 0)
        h = round(n / (top or 1) * (height - 10))
        x = 30 + i * bar
        label = utc(hour * 3600, "%Y-%m-%d %H:00")
        parts.append(f'<rect x="{x + 1}" y="{height - h}" width="{bar - 2}" height="{h}" fill="#2b6cb0">'
                     f'<title>{escape(label)}: {n}</title></rect>')
        if i % max(1, len(span) // 8) == 0:
            parts.append(f'<text x="{x}" y="{height + 14}" font-size="10">{escape(label[11:16])}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


def environment(*loaders):
    """An environment over `loaders` (searched first) and the shared templates."""
    env = jinja2.Environment(loader=jinja2.ChoiceLoader([*loaders, SHARED]), autoescape=True, finalize=inert,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(utc=utc, age=age, thread_href=thread_href, css_word=css_word, sheds=sheds,
                       hour_bars=hour_bars, number=number)
    return env
