"""agent-relay's records as the importer (operator/importer.py) reads them: the id each gets
here, the file of its own it names (never another agent's), its times in seconds, whether the
bytes found are the file it recorded, and what relay's ledger keeps of a message's bytes."""
import hashlib
from pathlib import PurePosixPath

import orjson

from relay.core.message import parse
from relay.errors import RelayError
from relay.ids import id_text
from relay.operator.import_summary import SOURCE
from relay.times import END

MAX_FILE = 64 << 20         # the largest file read from agent-relay's directory
LAST_MS = END * 1000        # 10000-01-01 (relay/times.py): agent-relay's times are Date.now()


def message_id(file_id, discovered_ms):
    """The id a record of agent-relay gets here: its time, and 80 bits of its file id's hash."""
    ms = min(max(int(discovered_ms), 0), (1 << 48) - 1)
    return id_text(ms, int.from_bytes(hashlib.sha256(f"{SOURCE}:{file_id}".encode()).digest()[:10], "big"))


def tail(recorded, top, depth):
    """The path agent-relay recorded (absolute, where its directory was then) relative to its
    directory: `top` and the `depth` names after it; None when it is not of that shape."""
    if not isinstance(recorded, str):
        return None
    parts = PurePosixPath(recorded).parts
    if len(parts) <= depth or parts[-depth - 1] != top or any(p in (".", "..") for p in parts[-depth:]):
        return None
    return "/".join((top, *parts[-depth:]))


def own(rel, r):
    """Whether `rel` (from tail()) is the record's own file: agent-relay keeps it at
    `outbox/<agent>/<name>` and archives it as `archive/<agent>/<day>/<file_id>-<name>`. A
    record naming another agent's file would deliver that agent's words as its own."""
    parts = rel.split("/")
    if parts[1] != r["agent_name"]:
        return False
    return parts[-1] == (r["message_type"] if parts[0] == "outbox" else f"{r['file_id']}-{r['message_type']}")


def on_the_way(r):
    """`outbox/<agent>/<name>` of a record's own file (see own()), or None."""
    rel = tail(r["source_path"], "outbox", 2)
    return rel if rel is not None and own(rel, r) else None


def file_key(r):
    """(outbox/<agent>/<name>, short sha256, size) of the file a record names, or None."""
    rel, short = on_the_way(r), r["content_hash"]
    return (rel, short.lower(), r["file_size"]) if rel and isinstance(short, str) and short else None


def seconds(ms):
    """A time of agent-relay's (milliseconds since 1970) in seconds; None when it is none a
    clock gives (not a number, before 1970, after the year 9999, infinity, NaN)."""
    if not isinstance(ms, (int, float)) or isinstance(ms, bool) or not 0 <= ms < LAST_MS:
        return None
    return ms / 1000.0


def mismatch(data, row):
    """Why `data` is not the file agent-relay recorded (its short sha256, its size), or None."""
    short = row["content_hash"]
    if isinstance(short, str) and short and hashlib.sha256(data).hexdigest()[:len(short)] != short.lower():
        return "does not match the sha256 agent-relay recorded"
    size = row["file_size"]
    if isinstance(size, int) and size > 0 and size != len(data):
        return f"is {len(data)} bytes, agent-relay recorded {size}"
    return None


def fields(data, name):
    """What relay's ledger keeps of a message (recipients, kind, thread, subject, body, headers),
    read from its bytes; nothing when relay cannot read them as a message."""
    try:
        m = parse(data, name, MAX_FILE)
    except RelayError:
        return {}
    return {"recipients": orjson.dumps(list(m.to)).decode(), "kind": m.kind, "thread": m.thread,
            "subject": m.subject, "body": m.body, "headers": orjson.dumps(m.headers).decode()}


def what(origin, file_id):
    """How an imported record names where it came from."""
    return f"from agent-relay {origin}, its id {file_id}"
