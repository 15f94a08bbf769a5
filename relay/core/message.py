"""Message files (contract §2): header and JSON formats, validation, recipient resolution,
the CWD policy, the inbox envelope.

accept() turns a file's bytes into what relay delivers (the Message, its recipients, the
envelope) or raises MessageRefused with a reason a human can act on; parse() and resolve() are
its two halves. Nothing here opens a file; the CWD policy resolves the path a control message
names to see that it lies inside the project root.
"""
import dataclasses
import difflib
import datetime
import math
import re

import orjson

from relay import names as reserved_names
from relay.config import AGENT_NAME, AGENT_NAME_RULE, SYSTEM
from relay.names import BROADCAST  # noqa: F401 - '*' and its alias Broadcast, where the pipeline takes them
from relay.errors import MessageRefused, TooLarge, UnknownRecipient
from relay.ids import ALPHABET
from relay.times import END, FIRST
from relay.files.layout import is_inside, valid_id

CONTROL_KINDS = ("spawn", "release", "continuity")
KNOWN_KINDS = ("message",) + CONTROL_KINDS
CONTROL_KEYS = ("name", "cli", "cwd", "model", "action")
KNOWN_KEYS = ("to", "kind", "thread", "subject", "body", "id", "request_id", "content_type",
              "max_retries", "priority", "ack_required") + CONTROL_KEYS
ALIASES = {"request-id": "request_id", "content-type": "content_type", "max-retries": "max_retries",
           "ack": "ack_required", "ack-required": "ack_required"}  # header -> key
PRIORITIES = ("urgent", "high", "normal", "low")    # most urgent first (PRIORITY:)
ACK_YES, ACK_NO = ("required", "yes", "true", "1"), ("", "no", "none", "false", "0")   # ACK: values
MAX_REQUEST_ID = 200
TEXT_PLAIN = "text/plain"   # the content type of a message that names none
MAX_CONTENT_TYPE = 255
# type/subtype (RFC 6838's restricted names), then parameters: printable ASCII, one line.
CONTENT_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"
                          r"(\s*;[ -~]*)?\Z")
MAX_HEADER_LINE = 64 * 1024
MAX_HEADER_BYTES = 256 * 1024
MAX_RECIPIENTS = 10_000
MAX_DEPTH = 64
BOM = b"\xef\xbb\xbf"


@dataclasses.dataclass(frozen=True)
class Message:
    to: tuple            # names as written: agents, "*"/"Broadcast", "System"
    kind: str
    thread: str | None
    subject: str | None
    body: str
    headers: dict        # keys relay does not know, passed through
    control: dict        # name/cli/cwd/model/action for control kinds
    format: str          # "header" or "json"
    id: str = None       # the id the sender chose (checked by the relay against the ledger)
    request_id: str = None
    content_type: str = TEXT_PLAIN
    max_retries: int = None     # the sender's retry budget (at most the configured one), or None
    priority: str = "normal"    # PRIORITY: one of PRIORITIES
    ack_required: bool = False  # ACK: required: each recipient is asked to acknowledge it


_iso_seconds = {}        # epoch second -> "YYYY-MM-DDTHH:MM:SS", the last few formatted
MAX_ISO_SECONDS = 64


MIN_TS, MAX_TS = float(FIRST), float(END - 1)     # 0001-01-01 .. 9999-12-31T23:59:59 (relay/times.py)


def iso(ts):
    """UTC ISO 8601 with microseconds and a Z (the formatted second is reused: an envelope's
    sent_at and relayed_at are two seconds that recur batch after batch). A time beyond what the
    calendar can show (a file dated year 30000) is shown at the calendar's end."""
    if not MIN_TS <= ts <= MAX_TS:
        ts = MIN_TS if ts < MIN_TS else MAX_TS
    second = math.floor(ts)
    micro = round((ts - second) * 1e6)
    if micro >= 1_000_000:
        second, micro = second + 1, micro - 1_000_000
    text = _iso_seconds.get(second)
    if text is None:
        if len(_iso_seconds) >= MAX_ISO_SECONDS:
            _iso_seconds.clear()
        d = datetime.datetime.fromtimestamp(second, datetime.timezone.utc)
        text = _iso_seconds[second] = (f"{d.year:04d}-{d.month:02d}-{d.day:02d}T"
                                       f"{d.hour:02d}:{d.minute:02d}:{d.second:02d}")
    return f"{text}.{micro:06d}Z"


def _kind_from_name(filename):
    stem = filename.split(".", 1)[0].lower()
    return stem if stem in KNOWN_KINDS else None


def _split_names(value):
    if "," not in value:                # one name, the common case
        value = value.strip()
        return [value] if value else []
    return [n.strip() for n in value.split(",") if n.strip()]


def _text(key, value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise MessageRefused(f"'{key}' must be text, not {type(value).__name__}")
    return str(value)


def _parse_json(text):
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise MessageRefused(f"invalid JSON: {e}") from None
    if not isinstance(data, dict):
        raise MessageRefused(f"a JSON message must be an object, not {type(data).__name__}")
    if _depth(data) > MAX_DEPTH:
        raise MessageRefused(f"invalid JSON: nested deeper than {MAX_DEPTH} levels")
    fields, headers = {}, {}
    for key, value in data.items():
        low = ALIASES.get(key.lower(), key.lower())
        if low in KNOWN_KEYS:
            fields[low] = value
        else:
            headers[key] = value
    to = fields.get("to")
    if to is None:
        names = []
    elif isinstance(to, str):
        names = _split_names(to)
    elif isinstance(to, list):
        if not all(isinstance(n, str) for n in to):
            raise MessageRefused("'to' must be a name or a list of names; the list holds something else")
        names = [n.strip() for n in to if n.strip()]
    else:
        raise MessageRefused(f"'to' must be a name or a list of names, not {type(to).__name__}")
    body = fields.get("body", "")
    if body is None:
        body = ""
    return names, {k: v if k == "ack_required" and isinstance(v, bool) else _text(k, v)
                   for k, v in fields.items() if k not in ("to", "body")}, \
        _text("body", body), headers, ("to" in fields)


def _depth(value):
    """Nesting depth of a JSON value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            return depth
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


_HEADER_FIELDS = frozenset(KNOWN_KEYS) - {"to", "body"}   # a header of another name is passed through


def _parse_header(text):
    fields, headers = {}, {}
    names = []
    has_to = False
    pos = 0
    total = len(text)
    lineno = 0
    body = ""
    while pos < total:
        end = text.find("\n", pos)
        if end < 0:
            end = total
        lineno += 1
        if end - pos > MAX_HEADER_LINE:
            raise MessageRefused(f"header line {lineno} is {end - pos} characters long "
                                 f"(at most {MAX_HEADER_LINE}); is the blank line after the headers missing?")
        if pos > MAX_HEADER_BYTES:
            raise MessageRefused(f"the headers are longer than {MAX_HEADER_BYTES} bytes; "
                                 "is the blank line after the headers missing?")
        line = text[pos:end]
        if line[-1:] == "\r":
            line = line[:-1]
        key, sep, value = line.partition(":")
        if not sep and not line.strip():
            body = text[end + 1:]
            break
        key = key.strip()
        if not sep or not key or " " in key:
            raise MessageRefused(f"line {lineno} is not a 'Key: value' header ({line[:60]!r}); "
                                 "headers come first, then one blank line, then the body")
        low = key.lower()
        low = ALIASES.get(low, low)
        if low == "to":
            has_to = True
            names.extend(_split_names(value))
        elif low in _HEADER_FIELDS:
            fields[low] = value.strip()
        else:
            headers[key] = value.strip()
        pos = end + 1
    return names, fields, body, headers, has_to


def parse(data, filename, max_body_bytes):
    """A Message from a file's bytes; MessageRefused with a human reason otherwise."""
    if not data or data.isspace():
        raise MessageRefused("the file is empty")
    if data.startswith(BOM):
        data = data[len(BOM):]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MessageRefused(f"not UTF-8 text (invalid byte 0x{data[e.start]:02x} at offset {e.start})") from None
    if text[:1] == "{" or text[:1].isspace() and text.lstrip().startswith("{"):
        names, fields, body, headers, has_to = _parse_json(text)
        fmt = "json"
    else:
        names, fields, body, headers, has_to = _parse_header(text)
        fmt = "header"
        if "\r" in body:                # one character: found by memchr, where a pair is searched slowly
            body = body.replace("\r\n", "\n")
    size = len(body) if body.isascii() else len(body.encode("utf-8"))
    if size > max_body_bytes:
        raise TooLarge(f"the body is {size} bytes, over max_body_bytes ({max_body_bytes})", max_body_bytes, size,
                       names)
    kind = (fields.get("kind") or "").strip(" ") or None
    problem = reserved_names.kind_token_problem(kind)      # a plain token, nothing hidden in it
    if problem is not None:
        raise MessageRefused(problem)
    if kind is None:
        kind = "message" if has_to and names else _kind_from_name(filename)
    if kind is None:
        raise MessageRefused("no recipient: add a 'TO: <agent>' header (or \"to\" in JSON)")
    if not names:
        if kind in CONTROL_KINDS:
            names = [SYSTEM]
        else:
            raise MessageRefused(f"no recipient for this {kind!r} message: add a 'TO: <agent>' header")
    if len(names) > MAX_RECIPIENTS:
        raise MessageRefused(f"{len(names)} recipients, more than {MAX_RECIPIENTS}; use '*' to reach everyone")
    bad = [n for n in names if n not in BROADCAST and not AGENT_NAME.match(n)]
    if bad:
        shown = ", ".join(repr(n[:70]) for n in bad[:5]) + (" ..." if len(bad) > 5 else "")
        raise MessageRefused(f"invalid recipient name {shown}: agent names match {AGENT_NAME_RULE}")
    for n in names:
        problem = reserved_names.address_problem(n)
        if problem is not None:
            raise MessageRefused(f"invalid recipient: {problem}")
    control = {} if fields.keys().isdisjoint(CONTROL_KEYS) else \
        {k: fields[k] for k in CONTROL_KEYS if fields.get(k) is not None}
    return Message(to=(names[0],) if len(names) == 1 else tuple(dict.fromkeys(names)), kind=kind, thread=fields.get("thread") or None,
                   subject=fields.get("subject") or None, body=body, headers=headers,
                   control=control, format=fmt, id=chosen_id(fields.get("id")),
                   request_id=request_id(fields.get("request_id")),
                   content_type=content_type(fields.get("content_type")),
                   max_retries=retry_budget(fields.get("max_retries")),
                   priority=priority(fields.get("priority")), ack_required=ack_required(fields.get("ack_required")))


def priority(value):
    """A message's priority (PRIORITY:), `normal` when none; MessageRefused when it is not one."""
    if value is None or value.strip() == "":
        return "normal"
    low = value.strip().lower()
    if low not in PRIORITIES:
        raise MessageRefused(f"PRIORITY {value[:30]!r} is not one of {', '.join(PRIORITIES)}")
    return low


def ack_required(value):
    """Whether a message asks for acknowledgements (ACK: required; JSON true); MessageRefused
    for a value that says neither yes nor no."""
    if value is None or isinstance(value, bool):
        return bool(value)
    low = value.strip().lower()
    if low in ACK_YES or low in ACK_NO:
        return low in ACK_YES
    raise MessageRefused(f"ACK {value[:30]!r} is not 'required' (or JSON true); leave it out when no "
                         "acknowledgement is asked for")


def content_type(value):
    """A content type as given (`type/subtype`, parameters allowed), text/plain when none;
    MessageRefused when it is not one."""
    if value is None or value.strip() == "":
        return TEXT_PLAIN
    value = value.strip()
    if len(value) > MAX_CONTENT_TYPE or not CONTENT_TYPE.match(value):
        raise MessageRefused(f"the content type {value[:60]!r} is not a media type: write it as type/subtype "
                             f"(text/markdown, application/json), at most {MAX_CONTENT_TYPE} characters")
    return value


MAX_BUDGET = 999_999_999       # a larger MAX-RETRIES is kept as this (used as the configured max_retries)


def retry_budget(value):
    """The retries a sender allows its message (MAX-RETRIES), or None for the configured number;
    MessageRefused when it is not a whole number from 0 up."""
    if value is None or value.strip() == "":
        return None
    digits = value.strip()
    if not digits.isascii() or not digits.isdigit():        # int() would take '1_0', ' 3' and other scripts' digits
        raise MessageRefused(f"MAX-RETRIES {value[:30]!r} is not a whole number from 0 up")
    digits = digits.lstrip("0") or "0"                      # 0005 is 5, however many zeros lead
    return min(int(digits[:12]) if len(digits) <= 12 else MAX_BUDGET, MAX_BUDGET)   # more counts as the configured


def chosen_id(value):
    """The id a sender chose, in relay's form (upper case), or None; MessageRefused when it is
    not an id relay could give."""
    if value is None or value == "":
        return None
    mid = value.strip().upper()
    if not valid_id(mid):
        raise MessageRefused(f"the id {value[:60]!r} is not a relay id (26 characters of "
                             f"{ALPHABET}); leave ID out and relay gives one")
    return mid


def request_id(value):
    """A request id as given (one line of text), or None; MessageRefused when it is unfit."""
    if value is None or value.strip() == "":
        return None
    value = value.strip()
    if len(value) > MAX_REQUEST_ID or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise MessageRefused(f"the request id {value[:60]!r} is unfit: at most {MAX_REQUEST_ID} characters "
                             "of text on one line")
    return value


def closest(name, known):
    """The known name closest to `name`: the same but for case, else the nearest spelling (the
    "did you mean" of the CLI, the API and the daemon alike)."""
    by_case = [k for k in known if k.lower() == name.lower()]
    if by_case:
        return by_case[0]
    lowered = {k.lower(): k for k in known}
    near = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[near[0]] if near else None


def resolve(message, sender, known, create_unknown=False):
    """The recipient list: broadcast expanded, duplicates removed, unknown names refused.

    Returns (recipients, created) where `created` are unknown names to create an inbox for.
    """
    out, unknown, broadcast = [], [], False
    for name in message.to:
        if name in BROADCAST:
            out.extend(sorted(a for a in known if a != sender))
            broadcast = True
        elif name == SYSTEM or name in known:
            out.append(name)
        else:
            unknown.append(name)
    if unknown and not create_unknown:
        shown = ", ".join(unknown[:10]) + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
        agents = sorted(known)
        listed = ", ".join(agents[:30]) + (f" ... ({len(agents)} in all)" if len(agents) > 30 else "")
        near = closest(unknown[0], agents) if len(agents) <= 10_000 else None
        hint = f"; did you mean {near}?" if near else ""
        raise UnknownRecipient(f"unknown recipient {shown}{hint}; known agents: {listed or '(none)'}", unknown)
    for i, name in enumerate(unknown):      # an inbox made for `ann` beside `Ann` would be Ann's on some file systems
        problem = reserved_names.namesake_problem(name, set(known) | set(unknown[:i]))
        if problem is not None:
            raise MessageRefused(f"invalid recipient: {problem}")
    recipients = out + unknown if len(message.to) == 1 and not broadcast else list(dict.fromkeys(out + unknown))
    if not recipients:
        raise MessageRefused("broadcast with no other agent to receive it")
    return recipients, unknown


@dataclasses.dataclass(frozen=True)
class Accepted:
    """A message relay will deliver."""
    message: Message
    recipients: list     # every recipient, broadcast expanded
    created: list        # unknown names whose inbox is to be made (unknown_recipient = "create")
    envelope: bytes      # what each recipient's inbox gets


def accept(data, name, sender, known, config, *, mid, sent_at, relayed_at, sha256):
    """Parse the bytes of the file `name` from `sender`, resolve its recipients and apply the
    CWD policy (a control message's CWD lies inside the project root); returns Accepted.

    `known(refresh=False)` gives the known agents' names; it is asked again, refreshed, when a
    recipient is not among them. `config` gives max_body_bytes, unknown_recipient and root.
    MessageRefused otherwise, its `parsed` the Message when the file itself was readable."""
    message = parse(data, name, config.max_body_bytes)
    try:
        problem = reserved_names.kind_problem(message.kind, sender)
        if problem is not None:
            raise MessageRefused(problem)
        create = config.unknown_recipient == "create"
        names = known()
        for n in message.to:
            if n not in names and n not in BROADCAST and n != SYSTEM:
                names = known(refresh=True)
                break
        cwd = message.control.get("cwd")
        if cwd is not None and not is_inside(config.root / cwd, config.root):
            raise MessageRefused(f"CWD {cwd!r} is outside the project root {config.root}")
        recipients, created = resolve(message, sender, names, create)
    except MessageRefused as e:
        e.parsed = message
        raise
    addressed = ["*" if n in BROADCAST else n for n in message.to]
    to = list(dict.fromkeys(addressed)) if "*" in addressed else recipients
    return Accepted(message, recipients, created,
                    envelope(mid, sender, to, message, sent_at, relayed_at, name, sha256))


def envelope(message_id, sender, recipients, message, sent_at, relayed_at, source, sha256):
    doc = {"id": message_id, "from": sender, "to": recipients, "kind": message.kind,
           "thread": message.thread, "subject": message.subject, "body": message.body,
           "headers": message.headers, "sent_at": iso(sent_at), "relayed_at": iso(relayed_at),
           "source": source, "sha256": sha256, "content_type": message.content_type,
           "priority": message.priority, "ack_required": message.ack_required}
    if message.control:
        doc.update(message.control)
    return orjson.dumps(doc)
