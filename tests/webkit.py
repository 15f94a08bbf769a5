"""Helpers of the relay web tests: the server in-process on a free port (a thread), and requests
through urllib (answers 4xx/5xx returned, not raised)."""
import urllib.error
import urllib.request

from relay import config as config_mod


def server(root, **kw):
    from relay.web.server import Server
    return Server(config_mod.load(root, ".relay", env={}), **kw)


def get(srv, path, token=True, headers=None, data=None, method=None):
    """(status, headers, text) of a request; `token`: True for the run's Bearer token, a string
    for that one, None for none."""
    h = dict(headers or {})
    if token is True:
        h["Authorization"] = f"Bearer {srv.token}"
    elif token:
        h["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(srv.base + path, headers=h, data=data, method=method)
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(req, timeout=10) as r:
            return r.status, r.headers, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode("utf-8", "replace")


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **k):
        return None
