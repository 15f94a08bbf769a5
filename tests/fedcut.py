"""A TCP proxy between a node and redis-server that cuts one connection at a command the test
names: the seam for a reply lost with its connection. Armed with `cut(word)`, the next request
holding `word` (b"XDEL") is either never forwarded (`executed=False`: the command is lost with the
connection) or forwarded and its reply read from the server and dropped (`executed=True`: done
on the server, unknown to the client); the client's connection is closed then, once. The client
waits for its reply, so where the cut falls is deterministic."""
import socket
import threading


class CutProxy:
    def __init__(self, upstream):
        self.upstream = upstream
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.armed = None           # (word, executed) until the next request holding word
        self.cuts = 0
        self.socks = []
        self.threads = []
        self.stopping = False

    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"

    def cut(self, word, executed=False):
        with self.lock:
            self.armed = (word, executed)

    def start(self):
        self._spawn(self._accept)
        return self

    def stop(self):
        self.stopping = True
        for s in [self.listener, *self.socks]:
            _close(s)
        for t in self.threads:
            t.join(timeout=5)

    def _spawn(self, target, *args):
        t = threading.Thread(target=target, args=args, name=f"cut-proxy-{self.port}", daemon=True)
        self.threads.append(t)
        t.start()

    def _accept(self):
        while not self.stopping:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            self.socks += [client, server]
            state = {"drop_reply": False}
            self._spawn(self._requests, client, server, state)
            self._spawn(self._replies, server, client, state)

    def _requests(self, client, server, state):
        while True:
            try:
                data = client.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            with self.lock:
                hit = self.armed if self.armed is not None and self.armed[0] in data else None
                if hit is not None:
                    self.armed = None
                    self.cuts += 1
            if hit is not None and not hit[1]:
                break                               # never forwarded: lost with the connection
            if hit is not None:
                state["drop_reply"] = True          # forwarded; its reply is read and dropped
            try:
                server.sendall(data)
            except OSError:
                break
        _close(client)
        if not state["drop_reply"]:
            _close(server)

    def _replies(self, server, client, state):
        while True:
            try:
                data = server.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            if state["drop_reply"]:
                break                               # done on the server; the client never hears of it
            try:
                client.sendall(data)
            except OSError:
                break
        _close(client)
        _close(server)


def _close(sock):
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
