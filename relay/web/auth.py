"""Who may look: the token a run of `relay web` prints once, in its URL. A request carries it as
`?token=` (the first visit: answered with a cookie, HttpOnly and SameSite=Strict, and a redirect
to the same address without it), as that cookie, or as `Authorization: Bearer TOKEN`; every
other request is refused (401) before any page is read. Each comparison is hmac.compare_digest.

Every answer carries the headers that keep a page inert whatever an agent wrote: a
Content-Security-Policy with no inline script and nothing from another origin, nosniff, no
framing, no referrer. A query string past MAX_QUERY is refused (414) before it is parsed. A POST
must come from the page itself: its Origin (or Sec-Fetch-Site) says same origin, and it carries
the form's CSRF token (compose.py)."""
import hashlib
import hmac
import secrets
from urllib.parse import parse_qsl, urlencode

from starlette.responses import PlainTextResponse, RedirectResponse

MAX_QUERY = 4096        # bytes of a query string
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
           (b"x-frame-options", b"DENY"), (b"referrer-policy", b"no-referrer"),
           (b"cache-control", b"no-store")]
REFUSED = ("relay web: this address needs the token relay web printed when it started "
           "(open the URL it printed, or send Authorization: Bearer TOKEN)\n")


def new_token():
    return secrets.token_urlsafe(32)


def same(given, token):
    return isinstance(given, str) and hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode())


def csrf(token):
    """The compose form's CSRF token: derived from the run's token, never the token itself."""
    return hmac.new(token.encode(), b"relay web compose", hashlib.sha256).hexdigest()


class Guard:
    """ASGI middleware: the token checked on every HTTP request, the headers added to every answer."""

    def __init__(self, app, token, cookie):
        self.app = app
        self.token = token
        self.cookie = cookie

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def headed(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *HEADERS]}
            await send(message)
        query = scope.get("query_string", b"")
        if len(query) > MAX_QUERY:
            return await PlainTextResponse(f"relay web: a query string is at most {MAX_QUERY} bytes\n",
                                           status_code=414)(scope, receive, headed)
        pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
        given = dict(pairs).get("token")
        if given is not None and same(given, self.token):
            rest = urlencode([(k, v) for k, v in pairs if k != "token"])
            answer = RedirectResponse(scope["path"] + (f"?{rest}" if rest else ""), status_code=303)
            answer.set_cookie(self.cookie, self.token, httponly=True, samesite="strict", path="/")
            return await answer(scope, receive, headed)
        if not self.allowed(scope):
            return await PlainTextResponse(REFUSED, status_code=401,
                                           headers={"www-authenticate": "Bearer"})(scope, receive, headed)
        if scope["method"] not in ("GET", "HEAD") and not same_origin(scope):
            return await PlainTextResponse("relay web: a form is sent from relay web's own pages only\n",
                                           status_code=403)(scope, receive, headed)
        await self.app(scope, receive, headed)

    def allowed(self, scope):
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth[:7].lower() == "bearer " and same(auth[7:].strip(), self.token):
            return True
        for part in headers.get(b"cookie", b"").decode("latin-1").split(";"):
            name, _, value = part.strip().partition("=")
            if name == self.cookie and same(value, self.token):
                return True
        return False


def same_origin(scope):
    """Whether a request that changes something comes from this server's own page: its Origin is
    this host (or Sec-Fetch-Site says same-origin); a request with neither (a script with the
    Bearer token) is let through, the CSRF token still checked by the form."""
    headers = dict(scope.get("headers") or [])
    site = headers.get(b"sec-fetch-site")
    if site is not None and site != b"same-origin":
        return False
    origin = headers.get(b"origin")
    if origin is None or origin == b"null" and site == b"same-origin":
        return True
    host = headers.get(b"host", b"")
    return origin in (b"http://" + host, b"https://" + host)
