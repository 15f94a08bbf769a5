"""Starting and stopping `relay web`: a socket bound first (port 0: a free one, so the URL is
known before the server runs), a fresh token a run, uvicorn serving the application. `serve()`
runs in the foreground (the CLI: Ctrl-C stops it); `Server.start()` in a thread (the tests)."""
import socket
import threading
import time

import uvicorn

from relay.web.app import Site, build
from relay.web.auth import new_token


def bind(host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class Server:
    """One run of relay web over a project's configuration."""

    def __init__(self, cfg, host="127.0.0.1", port=0, compose=None, clock=time.time, token=None):
        self.token = token or new_token()
        self.sock = bind(host, port)
        self.host, self.port = host, self.sock.getsockname()[1]
        self.site = Site(cfg, self.token, compose=compose, clock=clock, cookie=f"relay_web_{self.port}")
        config = uvicorn.Config(build(self.site), log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=2, limit_concurrency=4096, ws="none")
        self.uvicorn = uvicorn.Server(config)
        self.thread = None

    @property
    def base(self):
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def url(self):
        """The address to open: the token in it, once."""
        return f"{self.base}/?token={self.token}"

    def run(self):
        """Serve in this thread until stopped (SIGINT, SIGTERM, or stop())."""
        try:
            self.uvicorn.run(sockets=[self.sock])
        finally:
            self.close()

    def start(self):
        """Serve on a thread; returns once the server answers."""
        self.thread = threading.Thread(target=self._serve_quietly, name="relay-web", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.uvicorn.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("relay web did not start")
            time.sleep(0.01)
        return self

    def _serve_quietly(self):
        import asyncio
        try:
            asyncio.run(self.uvicorn.serve(sockets=[self.sock]))
        finally:
            self.close()

    def stop(self):
        self.site.hub.close()
        self.uvicorn.should_exit = True
        if self.thread is not None:
            self.thread.join(15)

    def close(self):
        self.site.close()
        self.sock.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
