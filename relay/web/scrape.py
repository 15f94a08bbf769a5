"""`[metrics] listen` (config/metrics.py): the daemon serves /metrics alone, for a scraper, off
the delivery path. One thread answers one request at a time with a small http.server; each
scrape reads the ledger through a read-only connection of that thread (web/metrics.py's
collector), so a scrape takes no lock the loop waits for and a slow scraper delays only other
scrapes. Only GET and HEAD of /metrics are answered (another path: 404; another method: 405,
with Allow); no token is
asked for: where it listens is the operator's word (docs/operating.md, "Metrics")."""
import http.server
import logging
import socket
import threading
import time

from relay.errors import ConfigError
from relay.files.layout import Layout
from relay.ledger.history import History
from relay.ledger.ledger import Ledger
from relay.web import metrics

log = logging.getLogger(__name__)
TIMEOUT = 10.0          # seconds a scraper has to send its request and read the answer


class Handler(http.server.BaseHTTPRequestHandler):
    server_version = "relay"
    sys_version = ""
    timeout = TIMEOUT

    def do_GET(self):
        self.answer(body=True)

    def do_HEAD(self):
        self.answer(body=False)

    def answer(self, body):
        if self.path.split("?", 1)[0] != "/metrics":
            return self.send(404, b"relay: only /metrics is served here\n", "text/plain; charset=utf-8", body)
        try:
            data, kind = metrics.exposition(self.server.listener.registry)
        except Exception as e:      # the ledger busy or moved: this scrape fails, the next tries again
            log.warning("/metrics: the ledger could not be read: %s", e)
            return self.send(503, f"relay: the ledger could not be read: {e}\n".encode(), "text/plain", body)
        self.send(200, data, kind, body)

    def send(self, status, data, kind, body, headers=()):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if body:
            self.wfile.write(data)

    def send_error(self, code, message=None, explain=None):      # a bad request line: one short line
        self.close_connection = True
        data = f"relay: {message or code}\n".encode("utf-8", "replace")
        if code == 501:             # http.server's answer to a method it has no do_ for
            return self.send(405, data, "text/plain", True, headers=(("Allow", "GET, HEAD"),))
        self.send(code if code in (400, 404, 405, 408, 414, 431) else 400, data, "text/plain", self.command != "HEAD")

    def log_message(self, format, *args):
        pass


class Server(http.server.HTTPServer):
    allow_reuse_address = True

    def __init__(self, address, family, listener):
        self.address_family = family
        self.listener = listener
        super().__init__(address, Handler)


class Listener:
    """/metrics on cfg.metrics's address: bound when made (a refusal is a ConfigError naming
    the address), served on a thread from start() until stop()."""

    def __init__(self, cfg, clock=time.time):
        m = cfg.metrics
        family = socket.AF_INET6 if ":" in m.host else socket.AF_INET
        try:
            self.server = Server((m.host, m.port), family, self)
        except OSError as e:
            raise ConfigError(f"[metrics] listen = {m.listen!r}: cannot listen there: {e.strerror or e}") from None
        self.host, self.port = m.host, self.server.server_address[1]
        self.layout = Layout(cfg.root, cfg.state_dir)
        self.history = None
        self.registry = metrics.registry(self.reader, self.layout, cfg, clock)
        self.thread = None
        if not m.loopback:
            log.warning("/metrics is served without a token on %s: whoever reaches that address reads the "
                        "figures", self.url)

    @property
    def url(self):
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def reader(self):
        """The History of the serving thread (one read-only connection, opened at the first scrape)."""
        if self.history is None:
            self.history = History(Ledger(self.layout.ledger, readonly=True))
        return self.history

    def start(self):
        self.thread = threading.Thread(target=self._serve, name="relay-metrics", daemon=True)
        self.thread.start()
        log.info("serving /metrics on %s", self.url)
        return self

    def _serve(self):
        try:
            self.server.serve_forever(poll_interval=0.5)
        finally:
            if self.history is not None:
                self.history.close()
                self.history = None

    def stop(self):
        if self.thread is not None:
            self.server.shutdown()
            self.thread.join(TIMEOUT + 5)
            self.thread = None
        self.server.server_close()
        self.layout.close()
