"""One entry of a stream addressed to this node, read as input: every field checked, the sender
and recipients validated, the envelope the inboxes get made again from the checked fields. Nothing
in an entry is trusted; what is wrong is a MessageRefused naming it."""
import collections
import datetime
import hashlib
import re
import orjson
from relay import names as reserved_names
from relay.config import SYSTEM
from relay.errors import MessageRefused
from relay.files.fs import shown
from relay.files.layout import fit, is_inside, valid_agent, valid_id
from relay.core.message import CONTROL_KEYS, MAX_HEADER_BYTES, MAX_RECIPIENTS, content_type
from relay.core.work import Work

HEX64 = re.compile(r"[0-9a-f]{64}\Z")
# What flow control and hooks read of a received message (a local one has its parsed Message).
Remote = collections.namedtuple("Remote", "to kind thread subject")
TEXT_FIELDS = ("kind", "thread", "subject", "sent_at", "relayed_at", "source", "content_type")


def entry_limit(config):
    """The largest entry this node reads: its body at most max_body_bytes, JSON-escaped (6x),
    plus the rest of the envelope."""
    return 6 * config.max_body_bytes + (2 << 20)


def _text(value):
    if value is None:
        return None
    try:
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)
    except UnicodeDecodeError:
        return None


def _when(text):
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except (AttributeError, ValueError, OverflowError):
        return None


def source_name(source):
    """The name a received message is recorded under: the sender's file name as a plain name
    (no path, no control character), or "remote"."""
    name = shown(str(source or "")).replace("/", "_").replace("\0", "_")
    name = fit(name)
    return name if name not in ("", ".", "..") else "remote"


def _sender_of(fields):
    """The sender an entry names, for the record of its refusal (never trusted)."""
    try:
        sender = orjson.loads(fields.get(b"env") or b"{}").get("from")
    except (orjson.JSONDecodeError, AttributeError, TypeError):
        return None
    return sender if isinstance(sender, str) and valid_agent(sender) else None


def read_entry(node, eid, fields, local, config):
    """(Work, item) of a well-formed entry for this node's agents, sent by `node` (the stream's);
    MessageRefused saying what is wrong otherwise. Nothing in the entry is trusted: every field
    is checked, and the envelope the inboxes get is made again from the checked fields."""
    mid, doc, to_here = _parsed(fields, config)
    sender, body, sha = _checked(doc, to_here, config)
    mine = [r for r in dict.fromkeys(to_here) if r in local and r != SYSTEM]
    if not mine:
        raise MessageRefused(f"none of {', '.join(to_here[:10])} is an agent of node {config.federation.node}")
    others = [r for r in to_here if r not in mine]
    try:
        kind_of_content = content_type(doc.get("content_type"))
    except MessageRefused as e:
        raise MessageRefused(f"the envelope's {e}") from None
    envelope, data = _envelope(doc, node, kind_of_content)
    w = Work(id=mid, sender=sender, name=source_name(doc.get("source")), archive_rel=None, retries=0,
             earlier_attempt=True, sha256=sha, recipients=mine, envelope=data, sent_at=_when(doc.get("sent_at")),
             envelope_sha256=hashlib.sha256(data).hexdigest(),
             message=Remote(envelope["to"], doc.get("kind"),
                            doc.get("thread"), doc.get("subject")))
    item = {"id": mid, "sender": sender, "name": w.name, "node": node, "entry_id": eid, "recipients": mine,
            "kind": doc.get("kind"), "thread": doc.get("thread"), "subject": doc.get("subject"), "body": body,
            "headers": orjson.dumps(doc.get("headers") or {}).decode(), "sha256": sha, "content_type": kind_of_content,
            "sent_at": _when(doc.get("sent_at")),
            "note": f"not agents of this node: {', '.join(others[:10])}" if others else None}
    return w, item


def _parsed(fields, config):
    """(message id, envelope, recipients here) of an entry's fields, each as its reader needs it."""
    if not isinstance(fields, dict):
        raise MessageRefused("the entry has no fields")
    fields = {(k.decode("utf-8", "replace") if isinstance(k, bytes) else k): v for k, v in fields.items()}
    limit = entry_limit(config)
    if "oversize" in fields:
        if fields.get("what") == "fields":
            raise MessageRefused(f"the entry is not read: {fields['why']}")
        raise MessageRefused(f"the entry is {fields['oversize']} bytes, over what this node reads ({limit} bytes)")
    if _text(fields.get("v")) != "2":
        raise MessageRefused(f"not a relay entry of version 2 (v={shown(str(_text(fields.get('v'))))[:20]})")
    mid = _text(fields.get("id"))
    if not mid or not valid_id(mid):
        raise MessageRefused(f"{shown(str(mid))[:40]!r} is not a relay message id")
    raw = fields.get("env")
    if not isinstance(raw, bytes) or len(raw) > limit:
        raise MessageRefused(f"the envelope is missing or larger than this node accepts ({limit} bytes)")
    try:
        doc = orjson.loads(raw)
        to_here = orjson.loads(fields.get("to") or b"null")
    except orjson.JSONDecodeError as e:
        raise MessageRefused(f"the envelope or its recipients are not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("id") != mid:
        raise MessageRefused("the envelope is not an object with the entry's message id")
    return mid, doc, to_here


def _checked(doc, to_here, config):
    """(sender, body, sha256 of the original) of an envelope whose every field is as a relay
    writes it; MessageRefused saying which is not."""
    sender = doc.get("from")
    if not isinstance(sender, str) or not valid_agent(sender):
        raise MessageRefused(f"the sender {shown(str(sender))[:70]!r} is not an agent name")
    if reserved_names.reserved(sender):
        raise MessageRefused(f"the sender: {reserved_names.why_reserved(sender)}; no node speaks as it")
    problem = reserved_names.kind_problem(doc.get("kind"), sender)
    if problem is not None:
        raise MessageRefused(problem)
    if not isinstance(to_here, list) or not to_here or len(to_here) > MAX_RECIPIENTS or \
            not all(isinstance(r, str) and valid_agent(r) for r in to_here):
        raise MessageRefused("the recipients are not a list of agent names")
    body = doc.get("body")
    if not isinstance(body, str):
        raise MessageRefused("the body is not text")
    size = len(body.encode("utf-8", "surrogatepass"))
    if size > config.max_body_bytes:
        raise MessageRefused(f"the body is {size} bytes, over this node's max_body_bytes ({config.max_body_bytes})")
    sha = doc.get("sha256")
    if not isinstance(sha, str) or not HEX64.match(sha):
        raise MessageRefused("the envelope has no sha256 of the original")
    for key in TEXT_FIELDS + CONTROL_KEYS:
        if doc.get(key) is not None and not isinstance(doc[key], str):
            raise MessageRefused(f"'{key}' is not text")
    if not isinstance(doc.get("headers", {}), dict) or not isinstance(doc.get("to", []), list):
        raise MessageRefused("'headers' or 'to' has the wrong type")
    rest = len(orjson.dumps({k: v for k, v in doc.items() if k != "body"}))
    if rest > MAX_HEADER_BYTES:
        raise MessageRefused(f"the envelope holds {rest} bytes besides its body, over the {MAX_HEADER_BYTES} "
                             "a message's headers may take")
    if doc.get("cwd") is not None and not is_inside(config.root / doc["cwd"], config.root):
        raise MessageRefused(f"CWD {doc['cwd'][:100]!r} is outside this node's project root")
    return sender, body, sha


def _envelope(doc, node, kind_of_content):
    """The envelope the inboxes get, made again from the checked fields, and its bytes."""
    envelope = {k: doc.get(k) for k in ("id", "from", "to", "kind", "thread", "subject", "body", "headers",
                                         "sent_at", "relayed_at", "source", "sha256")}
    envelope["content_type"] = kind_of_content
    # The message's recipients as its sender wrote them (beside this node's, which `to` says):
    # names alone, at most MAX_RECIPIENTS, whatever else a node put there.
    envelope["to"] = [t for t in envelope["to"] or [] if isinstance(t, str) and (valid_agent(t) or t == "*")][
        :MAX_RECIPIENTS]
    envelope.update({k: doc[k] for k in CONTROL_KEYS if doc.get(k) is not None})
    envelope["node"] = node
    try:
        return envelope, orjson.dumps(envelope)
    except TypeError as e:
        raise MessageRefused(f"the envelope cannot be written again: {e}") from None


def renamed(w, item, mid):
    """The same message under this node's id `mid` (its sender's id, taken here by another
    message, kept as `remote_id` in the ledger and the envelope)."""
    doc = orjson.loads(w.envelope)
    doc["remote_id"], doc["id"] = doc["id"], mid
    w.envelope = orjson.dumps(doc)
    w.envelope_sha256 = hashlib.sha256(w.envelope).hexdigest()
    item["remote_id"], item["id"] = item["id"], mid
    w.id = mid
