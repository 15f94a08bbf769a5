"""The pages: each handler reads through its thread's History (app.Readers), renders a template,
and answers 400 with one line for a filter it cannot read, 404 for what the ledger does not hold.
Handlers are plain functions (Starlette runs them on its worker threads, beside the event loop
that serves the live streams)."""
import time
from urllib.parse import urlencode

import click
from starlette.responses import HTMLResponse, PlainTextResponse, Response

from relay.errors import NotFound, RelayError
from relay.arguments import agent_name, moment
from relay.ledger.ledger import STATUSES
from relay.ledger.receipts import PRIORITIES
from relay.ledger.web import PAGE
from relay.web import reads

FILTERS = ("agent", "from", "to", "status", "kind", "thread", "priority", "since", "until", "q")
MAX_FILTER = 1000           # characters of one filter's value


class BadFilter(RelayError):
    pass


def page(site, request, template, status_code=200, **values):
    body = site.env.get_template(template).render(site=site.info, path=request.url.path, linked=True, **values)
    return HTMLResponse(body, status_code=status_code)


def refusal(site, request, status_code, words):
    return page(site, request, "refused.html", status_code=status_code, words=words)


def overview(site, request):
    doc = reads.overview(site.history(), site.layout, site.cfg, site.clock())
    return page(site, request, "overview.html", doc=doc)


def filters(params):
    """The Messages page's filters as the History's arguments; BadFilter for a value it cannot read."""
    given = {k: params.get(k, "").strip() for k in FILTERS}
    for k, v in given.items():
        if len(v) > MAX_FILTER:
            raise BadFilter(f"the filter {k} is at most {MAX_FILTER} characters")
    for k in ("agent", "from", "to"):
        if given[k]:
            agent_name(given[k], k)
    if given["status"] and given["status"] not in (*STATUSES, "shed"):
        raise BadFilter(f"no status {given['status']!r}: one of {', '.join((*STATUSES, 'shed'))}")
    if given["priority"] and given["priority"] not in PRIORITIES:
        raise BadFilter(f"no priority {given['priority']!r}: one of {', '.join(PRIORITIES)}")
    times = {}
    for k in ("since", "until"):
        try:
            times[k] = moment(given[k] or None, k)
        except click.BadParameter as e:
            raise BadFilter(f"{k}: {e.message}") from None
    args = {"agent": given["agent"] or None, "sender": given["from"] or None, "recipient": given["to"] or None,
            "status": given["status"] or None, "kind": given["kind"] or None, "thread": given["thread"] or None,
            "since": times["since"], "until": times["until"], "query": given["q"] or None,
            "priority": given["priority"] or None}
    return given, args


def messages(site, request):
    params = request.query_params
    before = params.get("before", "").upper() or None
    if before is not None and (len(before) != 26 or not before.isalnum() or not before.isascii()):
        return refusal(site, request, 400, "before: not a message id")
    try:
        given, args = filters(params)
        history = site.history()
        rows = history.web.messages(**args, before=before, limit=PAGE + 1)
    except RelayError as e:         # a bad filter, a search query the index refuses
        return refusal(site, request, 400, str(e))
    more = len(rows) > PAGE
    rows = rows[:PAGE]
    kept = [(k, v) for k, v in given.items() if v]
    older = f"/messages?{urlencode([*kept, ('before', rows[-1]['id'])])}" if more else None
    return page(site, request, "messages.html", rows=reads.message_list(rows, history), given=given,
                statuses=(*STATUSES, "shed"), priorities=PRIORITIES, older=older,
                first=f"/messages?{urlencode(kept)}" if before else None,
                last_event=history.last_event())


def message(site, request):
    try:
        doc = reads.message(site.history(), site.layout, request.path_params["mid"], site.cfg, site.clock())
    except NotFound as e:
        return refusal(site, request, 404, str(e))
    return page(site, request, "message.html", doc=doc)


def original(site, request):
    """The original of a message, to download: found through the ledger by the message's id (the
    address names an id, never a path)."""
    mid = request.path_params["mid"].upper()
    history = site.history()
    row = history.get(mid) if len(mid) == 26 and mid.isalnum() and mid.isascii() else None
    if row is None:
        return PlainTextResponse(f"relay web: no message {mid!r} in the ledger\n", status_code=404)
    try:
        data = reads.read_original(site.layout, row)
    except NotFound as e:
        return PlainTextResponse(f"relay web: {e}\n", status_code=404)
    except OSError as e:
        return PlainTextResponse(f"relay web: the original of {mid} cannot be read: {e.strerror or e}\n",
                                 status_code=404)
    return Response(data, media_type="application/octet-stream",
                    headers={"content-disposition": f'attachment; filename="{mid}.msg"'})


def thread(site, request):
    tid = request.path_params["tid"]
    if len(tid) > MAX_FILTER:
        return refusal(site, request, 400, f"a thread id is at most {MAX_FILTER} characters")
    try:
        rows = reads.thread(site.history(), tid)
    except NotFound as e:
        return refusal(site, request, 404, str(e))
    return page(site, request, "thread.html", thread=tid, rows=rows)


def agents(site, request):
    doc = reads.agents(site.history(), site.layout, site.cfg, site.clock())
    return page(site, request, "agents.html", doc=doc, now=time.time())


def metrics(site, request):
    from relay.web.metrics import exposition
    body, kind = exposition(site.metrics)
    return Response(body, media_type=kind)
