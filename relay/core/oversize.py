"""What a message too large to deliver says (flow control sheds it for body_size): its
recipients, kind, subject and headers, and the first bytes of its body, so that its record
shows `Ann -> Bob` and the bounce names its subject, as for any other shed.

A file in header format is read from its first MAX_HEADER_BYTES (the headers' own limit), even
when the file is too large to be read whole; a JSON file only when it was read whole (its
fields may follow its body). Its body is cut to its first BODY_KEPT bytes (fewer when
max_body_bytes is smaller) before it is parsed as any message is. Nothing is said (None) of a
file whose first bytes are no message relay reads.
"""
import codecs

import orjson

from relay.core.message import BOM, MAX_HEADER_BYTES, parse
from relay.errors import MessageRefused

BODY_KEPT = 4096        # bytes of a too large body parsed and kept (the ledger keeps its first KiB)


def said(data, name, max_body_bytes, whole=True):
    """The Message the bytes `data` of the file `name` say, its body cut short; `whole` False
    when `data` are only the file's first bytes. None when that cannot be read."""
    if data.startswith(BOM):
        data = data[len(BOM):]
    keep = max(0, min(BODY_KEPT, max_body_bytes))
    if data.lstrip()[:1] == b"{":
        rebuilt = _json(data, keep) if whole else None
    else:
        rebuilt = _header(data[:MAX_HEADER_BYTES + keep], keep)
    if rebuilt is None:
        return None
    try:
        return parse(rebuilt, name, max_body_bytes)
    except MessageRefused:
        return None


def _cut(text, limit):
    """The first `limit` bytes of `text` in UTF-8, cut between characters."""
    return text.encode("utf-8", "surrogatepass")[:limit].decode("utf-8", "ignore")


def _header(head, keep):
    try:       # the first bytes, a character cut at their end left out
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return None
    pos = 0
    while (end := text.find("\n", pos)) >= 0:
        if not text[pos:end].strip():          # the blank line after the headers
            return (text[:pos] + "\n" + _cut(text[end + 1:], keep)).encode()
        pos = end + 1
    return None


def _json(data, keep):
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    if isinstance(doc.get("body"), str):
        doc["body"] = _cut(doc["body"], keep)
    return orjson.dumps(doc)
