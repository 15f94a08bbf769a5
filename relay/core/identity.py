"""Ids chosen by senders and request ids, settled for a batch after its files are read and
before anything is delivered (the rule is ledger/senders.py's): a sender-chosen id becomes the
message id when it is the sender's to have and unused; one given to another sender by relay
send, or held by another message, is not taken (the message keeps relay's id, event
`id_refused`); a sender's reuse of its own id is refused with the reason. A message whose
request id its sender used before (on a message that did not fail) is a duplicate of that one:
archived, never delivered again. One ledger transaction per batch, only when a message of the
batch names either."""
import hashlib
import logging

import orjson

from relay.core.archive import day_of
from relay.ledger.history import History
from relay.core.inbox import Inbox
from relay.core.work import fields

log = logging.getLogger(__name__)


def identify(ledger, layout, works, now):
    """Apply the ledger's verdict on each work whose file names an id or a request id."""
    todo = [w for w in works if w.message is not None and (w.message.id or w.message.request_id)
            and w.error is None and not w.defer]
    if not todo:
        return
    # In the order they were written, as far as ids tell (relay send's ids are time-sorted):
    # of two files with one request id in a batch, the earlier is the one delivered.
    todo.sort(key=lambda w: w.message.id or w.id)
    day = day_of(now)
    box = Inbox(layout, None)
    held = {}           # work id -> a recipient holding its chosen id under another message
    chosen = [w for w in todo if w.message.id and w.message.id != w.id and not w.refused]
    forgotten = History(ledger).unknown([w.message.id for w in chosen]) if chosen else set()
    for w in chosen:
        # The ledger forgets an id at the retention sweep; a recipient may still hold that
        # message (unread even): delivering another under its id would replace it.
        if w.message.id in forgotten:
            holder = next((r for r in w.recipients if box.taken(r, w.message.id, w.sha256)), None)
            if holder is not None:
                held[w.id] = holder
    items = [(w.id, w.sender, w.name, w.message.id, None if w.refused else w.message.request_id, held.get(w.id))
             for w in todo]
    verdicts = ledger.senders.identify(now, items, lambda sender, mid, name: layout.archive_rel(day, sender, mid, name))
    for w in todo:
        new, path, first, refusal, note = verdicts[w.id]
        if refusal:
            w.refused = refusal
            continue
        if note:
            log.warning("%s from %s: %s", w.id, w.sender, note, **fields("id_refused", w.id, w.sender))
        if new != w.id:
            log.info("%s is %s: the id its sender chose", w.id, new, **fields("identified", new, w.sender))
            w.spool_id = w.spool_id or w.id
            w.id, w.archive_rel = new, path
            if w.envelope:
                w.envelope = renamed(w.envelope, new)
                w.envelope_sha256 = hashlib.sha256(w.envelope).hexdigest()
        w.request_id, w.duplicate_of = w.message.request_id, first


def renamed(envelope, mid):
    """An envelope with its id replaced."""
    doc = orjson.loads(envelope)
    doc["id"] = mid
    return orjson.dumps(doc)
