"""`relay web --compose`: a person sends a message as the overseer agent (default Human, an agent
declared like any other: `relay init --agent Human`), to one agent, several, or all. The form
carries a CSRF token derived from the run's token (auth.csrf), compared with hmac.compare_digest;
the guard has already refused a POST whose Origin is another site, and the cookie is SameSite
Strict. What is sent is written into the overseer's outbox through the agents' API, as any
agent's send: the daemon delivers it."""
from urllib.parse import parse_qsl

from relay.agent.api import Agent
from relay.agent.project import Project
from relay.errors import RelayError
from relay.web.auth import csrf, same
from relay.web.pages import page

MAX_FORM = 1 << 20      # bytes of a form


async def read(request):
    """The body of a POST, or None past MAX_FORM (not read further)."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            return None
    return body


def form(site, request, body=None):
    if request.method == "GET":
        return _form(site, request)
    if body is None:
        return _form(site, request, status_code=413, words=f"a message sent here is at most {MAX_FORM >> 10} KiB")
    fields = {}
    for k, v in parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True):
        fields.setdefault(k, []).append(v)
    one = {k: v[-1] for k, v in fields.items()}
    if not same(one.get("csrf", ""), csrf(site.token)):
        return _form(site, request, status_code=403, words="this form is stale or was not sent from relay web: "
                     "open Compose again", fields=one)
    to = fields.get("to", [])
    if "*" in to:
        to = "*"
    if not to:
        return _form(site, request, status_code=400, words="choose at least one recipient", fields=one)
    project = Project(config=site.cfg)
    try:
        me = Agent(site.compose, project=project, role="the overseer (relay web --as)")
        mid = me.send(to, one.get("body", ""), subject=one.get("subject") or None, thread=one.get("thread") or None)
    except RelayError as e:
        return _form(site, request, status_code=400, words=str(e), fields=one)
    finally:
        project.close()
    return _form(site, request, sent=mid)


def _form(site, request, status_code=200, words=None, fields=None, sent=None):
    with Project(config=site.cfg) as project:
        names = [n for n in project.agents() if n != site.compose]
    return page(site, request, "compose.html", status_code=status_code, names=names, me=site.compose,
                csrf=csrf(site.token), words=words, fields=fields or {}, sent=sent)
