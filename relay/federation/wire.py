"""Offers written to the server by the loop's own thread, their replies read by the publisher's.

A message for another node is published from the loop the moment it is in the spool: its XADD
is written on a connection of its own, without a hand-off to the publisher's thread (whose wake
and whose round trip, on a busy machine, cost more than the write). The publisher reads the
replies at its next turn, in order, and takes each entry id as it takes one it published itself.

The loop never waits on the server here: it writes only when the connection is idle enough
(no read under way, at most IN_FLIGHT bytes whose replies are unread, a batch that fits the
socket's buffer whatever the network does) and the link is well; otherwise the offer goes to
the publisher's queue as before. A write or a read that fails drops the connection: what it
carried is published from the ledger, and a repeat is recognised by the receiver.
"""
import collections
import threading

from relay.federation.client import Later, pooled, redis_module

IN_FLIGHT = 4 << 10         # command bytes written and not yet answered, at most: the smallest
                            # send buffer of a TCP socket (tcp_wmem's minimum, under memory
                            # pressure) takes them at once, even when the network holds them


class Wire:
    def __init__(self, client, keys, node):
        # A cluster's client routes each key itself: its offers go through the publisher.
        self.pool = None if isinstance(client, Later) or hasattr(client, "get_node_from_key") else \
            client.connection_pool
        self.keys = keys
        self.node = node
        self.lock = threading.Lock()    # held by whoever writes or reads the connection
        self.conn = None
        self.usable = False             # the publisher's say: the link is well (read by the loop)
        self.sent = collections.deque() # (message id, node) whose replies are unread, in order
        self.bytes = 0

    def send(self, offers):
        """Write the XADDs of `offers` (message id, node, recipients JSON, envelope) now, if the
        connection is free and idle enough. True when written (their replies are the
        publisher's to read); False leaves them to the publisher's queue."""
        if not self.usable or self.conn is None or not self.lock.acquire(blocking=False):
            return False
        try:
            conn = self.conn
            if conn is None:
                return False
            packed = conn.pack_commands([self.keys.xadd(self.node, node, mid, recipients, envelope)
                                         for mid, node, recipients, envelope in offers])
            size = sum(len(p) for p in packed)
            if self.bytes + size > IN_FLIGHT:
                return False
            try:
                conn.send_packed_command(packed, check_health=False)
            except Exception:   # noqa: BLE001 - whatever it was, the publisher takes these over
                self._drop()
                return False
            self.sent.extend((mid, node) for mid, node, _, _ in offers)
            self.bytes += size
            return True
        finally:
            self.lock.release()

    def replies(self):
        """([((message id, node), entry id or the error the server answered)], error): what was
        written, its replies read in order (the publisher's thread). A connection error (the
        second item) drops the connection: what it carried unanswered is published from the
        ledger."""
        if not self.sent:
            return [], None
        redis = redis_module()
        out = []
        with self.lock:
            try:
                while self.sent:
                    try:
                        reply = self.conn.read_response()
                    except redis.ResponseError as e:
                        reply = e
                    out.append((self.sent.popleft(), reply))
            except Exception as e:  # noqa: BLE001 - the caller's to report
                self._drop()
                return out, e
            self.bytes = 0
        return out, None

    def ready(self, well):
        """The publisher's turn: whether the loop may write (`well`: the link is), with a
        connection taken from the pool if it has none (a failure leaves it without)."""
        if self.pool is None:
            return
        if self.conn is not None and not self.sent:
            with self.lock:     # closed by the server since (idle timeout, a restart): given up now
                try:
                    closed = self.conn is not None and not self.sent and self.conn.can_read(timeout=0)
                except Exception:   # noqa: BLE001 - a connection that cannot be looked at is closed
                    closed = True
                if closed:
                    self._drop()
        if well and self.conn is None:
            with self.lock:
                try:
                    self.conn = pooled(self.pool, "XADD")
                except Exception:   # noqa: BLE001 - tried again at the next turn
                    self.conn = None
        self.usable = well and self.conn is not None

    def _drop(self):
        """Under the lock: the connection closed and given back; nothing in flight is trusted."""
        self.usable = False
        conn, self.conn = self.conn, None
        self.sent.clear()
        self.bytes = 0
        if conn is not None:
            try:
                conn.disconnect()
            finally:
                self.pool.release(conn)

    def close(self):
        with self.lock:
            if self.conn is not None:
                self._drop()
