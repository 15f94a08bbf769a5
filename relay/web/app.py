"""The Starlette application of `relay web`: its routes (addresses a person can type and share:
/, /messages with its filters as query parameters, /messages/ID, /threads/ID, /agents, /metrics,
/events), the token guard in front of all of them (auth.py), the static files (loaded from the
package once: no address reaches the file system), and the Site every handler reads through.

A Site opens one read-only History per worker thread (SQLite: one connection a thread) and
closes them all when the server stops."""
import functools
import threading
import time
from importlib import resources

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from relay.files.layout import Layout
from relay.ledger.history import History
from relay.ledger.ledger import Ledger
from relay.version import __version__
from relay.web import pages
from relay.web.auth import Guard
from relay.web.live import Hub
from relay.web.render import environment

STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".svg": "image/svg+xml"}


def static_files():
    """{name: (bytes, content type)} of relay/web/static, read once."""
    out = {}
    for f in resources.files("relay.web").joinpath("static").iterdir():
        suffix = "." + f.name.rsplit(".", 1)[-1]
        if f.is_file() and suffix in STATIC_TYPES:
            out[f.name] = (f.read_bytes(), STATIC_TYPES[suffix])
    return out


class Readers:
    """One read-only History per thread, each closed by close()."""

    def __init__(self, path):
        self.path = path
        self.local = threading.local()
        self.opened = []
        self.lock = threading.Lock()

    def __call__(self):
        history = getattr(self.local, "history", None)
        if history is None:
            history = self.local.history = History(Ledger(self.path, readonly=True))
            with self.lock:
                self.opened.append(history)
        return history

    def close(self):
        with self.lock:
            opened, self.opened = self.opened, []
        for h in opened:
            h.close()


class Site:
    """What the handlers share: the configuration, the layout, the readers, the templates, the
    live hub, the metrics registry, and the compose form's settings (None when read-only)."""

    def __init__(self, cfg, token, compose=None, clock=time.time, cookie="relay_web"):
        from relay.web import metrics
        self.cfg, self.token, self.compose, self.clock, self.cookie = cfg, token, compose, clock, cookie
        self.layout = Layout(cfg.root, cfg.state_dir)
        self.history = Readers(self.layout.ledger)
        self.env = environment()
        self.hub = Hub(self.history)
        self.metrics = metrics.registry(self.history, self.layout, cfg, clock)
        self.static = static_files()
        self.info = {"project": cfg.root.name, "version": __version__, "compose": compose is not None}

    def close(self):
        self.hub.close()
        self.history.close()
        self.layout.close()


def handler(site, fn):
    @functools.wraps(fn)
    async def endpoint(request):
        return await run_in_threadpool(fn, site, request)
    return endpoint


def build(site):
    """The ASGI application of a Site: the routes behind the token guard."""
    def static(request):
        found = site.static.get(request.path_params["name"])
        if found is None:
            return PlainTextResponse("relay web: no such file\n", status_code=404)
        return Response(found[0], media_type=found[1], headers={"cache-control": "max-age=3600"})

    async def events(request):
        return await site.hub.stream(request)
    routes = [Route("/", handler(site, pages.overview)), Route("/messages", handler(site, pages.messages)),
              Route("/messages/{mid}", handler(site, pages.message)),
              Route("/messages/{mid}/original", handler(site, pages.original)),
              Route("/threads/{tid:path}", handler(site, pages.thread)), Route("/agents", handler(site, pages.agents)),
              Route("/metrics", handler(site, pages.metrics)), Route("/events", events),
              Route("/static/{name}", static)]
    if site.compose is not None:
        from relay.web import compose

        async def composing(request):
            body = await compose.read(request) if request.method == "POST" else None
            return await run_in_threadpool(compose.form, site, request, body)
        routes.append(Route("/compose", composing, methods=["GET", "POST"]))
    app = Starlette(routes=routes)
    return Guard(app, site.token, site.cookie)
