"""Live updates: server-sent events. One Hub a server polls the ledger's event log (the seq of
its newest event, a cheap read) every POLL seconds on a worker thread, and on news fans the new
events, with the counts per state, out to every open stream: N clients cost one read, not N.
Each stream has a bounded queue; a client that does not read is dropped, never waited for, and
past MAX_CLIENTS a new stream is refused (503), so the daemon's ledger sees the same reads
however many pages are open. What is sent is JSON (orjson escapes nothing a page could run; the
page's script sets it as text, never as markup), each string made inert first (render.inert)."""
import asyncio
import logging

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.responses import PlainTextResponse, StreamingResponse

from relay.operator.views import headline
from relay.web.render import inert

POLL = 0.2              # seconds between two looks at the ledger's event log
MAX_CLIENTS = 2000      # open streams at once
QUEUE = 64              # updates a stream may hold unread before it is dropped
KEEPALIVE = 15.0        # seconds of quiet before a comment line keeps the stream open
BATCH = 200             # events sent in one update at most (the page reloads its figures past it)
CLOSE = object()
log = logging.getLogger(__name__)


class Hub:
    def __init__(self, reader, poll=POLL):
        self.reader = reader        # () -> History of this thread (app.py)
        self.poll = poll
        self.clients = set()
        self.task = None
        self.closed = False
        self.seq = None
        self.loop = None
        self.failing = None         # the last read's error, said once

    def _news(self):
        history = self.reader()
        last = history.last_event()
        if self.seq is None or last <= self.seq:
            self.seq = last if self.seq is None else self.seq
            return None
        events = history.events_after(self.seq)[:BATCH]
        self.seq = last if len(events) < BATCH else events[-1]["seq"]
        return self._doc(history, self.seq, events)

    def _since(self, after, upto):
        history = self.reader()
        events = [e for e in history.events_after(after)[:BATCH] if e["seq"] <= upto]
        return self._doc(history, upto, events) if events else None

    def _doc(self, history, seq, events):
        counts = history.counts()
        return clean({"seq": seq, "counts": counts, "headline": headline(counts),
                      "events": [{"seq": e["seq"], "at": e["at"], "id": e["message_id"], "event": e["event"],
                                  "detail": e["detail"], "actor": e["actor"], "from": e["sender"]}
                                 for e in events]})

    async def _run(self):
        while not self.closed and self.clients:
            try:
                doc = await run_in_threadpool(self._news)
            except Exception as e:      # a read that fails (the ledger busy, moved): said once, tried again
                if str(e) != self.failing:
                    log.warning("relay web: the live view cannot read the ledger: %s", e)
                self.failing, doc = str(e), None
            else:
                self.failing = None
            if doc is not None:
                data = b"event: update\ndata: " + orjson.dumps(doc) + b"\n\n"
                for q in list(self.clients):
                    try:
                        q.put_nowait(data)
                    except asyncio.QueueFull:       # a client that does not read: dropped
                        self.drop(q)
            await asyncio.sleep(self.poll)
        self.task = None

    def drop(self, q):
        self.clients.discard(q)
        try:
            q.put_nowait(CLOSE)
        except asyncio.QueueFull:
            q.get_nowait()
            q.put_nowait(CLOSE)

    def close(self):
        """Every stream ends (the server is stopping); from any thread."""
        self.closed = True
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._end()
        else:
            try:
                loop.call_soon_threadsafe(self._end)
            except RuntimeError:        # the loop closed meanwhile
                pass

    def _end(self):
        for q in list(self.clients):
            self.drop(q)

    async def stream(self, request):
        if len(self.clients) >= MAX_CLIENTS or self.closed:
            return PlainTextResponse(f"relay web: {MAX_CLIENTS} live pages are open; try again later\n",
                                     status_code=503)
        self.loop = asyncio.get_running_loop()
        q = asyncio.Queue(QUEUE)
        after = seq_of(request.query_params.get("after"))
        if after is not None and self.seq is None:
            self.seq = after            # the first page open: from the event it was drawn at
        elif after is not None and after < self.seq:    # drawn before the hub's last look: caught up
            doc = await run_in_threadpool(self._since, after, self.seq)
            if doc is not None:
                q.put_nowait(b"event: update\ndata: " + orjson.dumps(doc) + b"\n\n")
        self.clients.add(q)
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._run())

        async def events():
            try:
                yield b"retry: 2000\n\n"
                while True:
                    try:
                        data = await asyncio.wait_for(q.get(), KEEPALIVE)
                    except asyncio.TimeoutError:
                        data = b": keepalive\n\n"
                    if data is CLOSE:
                        return
                    yield data
            finally:
                self.clients.discard(q)
        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"cache-control": "no-store", "x-accel-buffering": "no"})


def seq_of(text):
    """The `after` of a stream's address: an event's seq, or None (anything else is ignored)."""
    return int(text) if text is not None and text.isascii() and text.isdigit() and len(text) < 19 else None


def clean(value):
    """A document with each string in it made inert (its unsafe characters shown as escapes)."""
    if isinstance(value, str):
        return inert(value)
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value
