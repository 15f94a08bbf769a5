"""What the ledger keeps of a message shed for every recipient (flow control: core/flow.py, here
and on a node receiving from another): enough for audit, bounded whatever was sent.

Such a message was delivered to no one and its file lies in failed/<sender>/ (from where `relay
retry` sends it again, read afresh), so its record keeps what audit needs: the sender, the
recipients, the subject (its first KEEP_SUBJECT_CHARS characters), the headers (each value's
first KEEP_VALUE_CHARS characters, as many as fit in KEEP_HEADER_BYTES), the size and the hash
of the file, and the first KEEP_BODY_BYTES of the body (cut between characters). A sender whose
messages are shed again and again (a loop) costs the ledger a bounded amount: past SHED_BODIES
messages of one sender shed in SHED_WINDOW (those the ledger's shed records count, whole or for
some recipients), its next ones keep no body at all, until the window has passed them.

A message delivered to some of its recipients and shed for the others keeps its whole body, as
every delivered message does.
"""
import orjson

from relay.ledger.part import Part

KEEP_BODY_BYTES = 1024
KEEP_SUBJECT_CHARS = 1024
KEEP_HEADER_BYTES = 4096
KEEP_VALUE_CHARS = 256
SHED_BODIES = 16            # messages of one sender shed in a window that keep the first KiB of their body
SHED_WINDOW = 3600.0        # seconds


def head(text, limit):
    """The first `limit` bytes of `text` in UTF-8, cut between characters."""
    if text is None or len(text) <= limit // 4:
        return text
    return text.encode("utf-8", "surrogatepass")[:limit].decode("utf-8", "ignore")


def headers_kept(headers):
    """A headers' JSON text as a shed record keeps it (see the module's docstring)."""
    if headers is None or len(headers) <= KEEP_HEADER_BYTES:
        return headers
    try:
        given = orjson.loads(headers)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(given, dict):
        return None
    kept, room = {}, KEEP_HEADER_BYTES - 2
    for name, value in given.items():
        value = value[:KEEP_VALUE_CHARS] if isinstance(value, str) else value
        cost = len(orjson.dumps({name: value}))
        if cost > room:
            break
        kept[name], room = value, room - cost
    return orjson.dumps(kept).decode()


class ShedKeep(Part):
    """`ledger.sheds`: inside the transaction that records a batch, before its shed records."""

    def kept(self, now, shed):
        """For messages shed for every recipient, `shed`: (id, sender, body, subject, headers
        JSON) in order, {id: (body, subject, headers)} as their records keep them."""
        counted, out = {}, {}
        for mid, sender, body, subject, headers in shed:
            if sender not in counted:
                counted[sender] = self.db.execute(
                    "SELECT count(*) FROM (SELECT DISTINCT message_id FROM sheds WHERE sender = ? AND at > ? LIMIT ?)",
                    (sender, now - SHED_WINDOW, SHED_BODIES)).fetchone()[0]
            kept = head(body, KEEP_BODY_BYTES) if counted[sender] < SHED_BODIES else None
            counted[sender] += 1
            out[mid] = (kept, subject[:KEEP_SUBJECT_CHARS] if subject else subject, headers_kept(headers))
        return out
