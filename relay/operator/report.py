"""`relay report --html FILE`: one self-contained page (inline CSS and SVG, no script, no network)
for a person: the headline as people count messages, who told whom how much, traffic per hour,
failures and bounces with their subjects and reasons, what flow control shed and why, threads,
and the stored rows this relay cannot read. The figures come from History.figures() (and the
newest bounces from history.web); the page is rendered from the templates relay web shares
(relay/operator/templates: figures.html holds the parts both show), with Jinja2, imported here
only when a page is rendered."""
from relay.core.message import iso
from relay.errors import RelayError
from relay.ledger.schema import REASONS
from relay.operator.views import headline

INSTALL = ("relay report needs Jinja2 (a dependency of relay), which is not installed: "
           "pip install 'jinja2>=3.1', or install relay again with its dependencies")


def gather(history, since=None):
    """The figures of a page: History.figures() and the newest bounces (with their subjects)."""
    data = history.figures(since)
    data["bounces"] = history.web.recent_bounces(200)
    return data


class Matrix:
    """Who told whom: deliveries per (sender, recipient), for the page's table."""

    def __init__(self, rows):
        self.counts = {(r["sender"], r["recipient"]): r["n"] for r in rows}
        self.senders = sorted({s for s, _ in self.counts})
        self.recipients = sorted({r for _, r in self.counts})
        self.top = max(self.counts.values(), default=1)

    def shade(self, n):
        level = int(235 - 150 * n / self.top)
        return f"rgb({level},{level + 10 if level < 245 else 255},255)"

    def total(self, sender):
        return sum(self.counts.get((sender, r), 0) for r in self.recipients)


class Unreadable:
    """A stored row this relay cannot read, as the page lists it."""

    def __init__(self, bad):
        self.table, self.key, self.columns = bad.table, bad.key, bad.columns
        self.shown = "; ".join(repr(v)[:80] for _, v in bad.columns)


def environment():
    try:
        from relay.operator import templating
    except ImportError as e:
        if (e.name or "").split(".")[0] not in ("jinja2", "markupsafe"):
            raise
        raise RelayError(INSTALL) from None
    return templating.environment()


def render(data, title="relay report", now=None):
    counts = data["counts"]
    hours = [(r["h"], r["n"]) for r in data["hours"]]
    page = environment().get_template("report.html")
    return page.render(
        title=title, now=now, data={"bounces": [], **data}, counts=counts, cards=headline(counts),
        total=sum(counts.values()), since=f"since {iso(data['since'])}" if data["since"] else "all time",
        matrix=Matrix(data["matrix"]), hours=hours, top_hour=max([n for _, n in hours] or [1]),
        shed_counts_all={k: data.get("shed_counts", {}).get(k, 0) for k in REASONS},
        unreadable=[Unreadable(b) for b in data.get("unreadable") or []], linked=False) + "\n"
