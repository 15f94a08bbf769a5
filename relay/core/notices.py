"""Notices from System: an envelope written into one agent's inbox the way relay delivers (tmp/,
synced, linked into new/, the directory synced), outside the daemon's batches, by the process
that has something to say (a reservation refused on the agent's paths). Written again under the
same id it is not duplicated: a complete copy in new/ or cur/ is recognised (its id and the
hash it carries) and left as it is."""
import hashlib

from relay.config import SYSTEM
from relay.core.inbox import Inbox
from relay.core.message import Message, envelope
from relay.core.work import Work
from relay.errors import DurabilityError, RelayError
from relay.files.sync import Syncer


def deliver(layout, nid, recipient, kind, subject, body, headers, at, now, durability="full"):
    """Write the notice `nid` from System into `recipient`'s inbox (`at`: when it was decided,
    the envelope's sent_at); returns its path in the state directory. RelayError when it could
    not be made durable there (nothing is left in new/ then)."""
    message = Message(to=(recipient,), kind=kind, thread=None, subject=subject, body=body, headers=dict(headers),
                      control={}, format="json")
    sha = hashlib.sha256("\0".join((nid, subject, body)).encode("utf-8")).hexdigest()    # the same notice, the same hash
    data = envelope(nid, SYSTEM, [recipient], message, at, now, kind, sha)
    work = Work(id=nid, sender=SYSTEM, name=kind, archive_rel=None, retries=0, earlier_attempt=True, recipients=[recipient],
                envelope=data, envelope_sha256=hashlib.sha256(data).hexdigest(), sha256=sha)
    put(layout, work, "notice", durability)
    return f"inbox/{recipient}/new/{nid}.json"


def put(layout, work, what, durability="full"):
    """One message of relay's own (a notice, a ping) into its one recipient's inbox, by the same
    idempotent Maildir write as any delivery, synced; RelayError when it could not be put."""
    syncer = Syncer(durability, layout.fs)
    inbox = Inbox(layout, syncer)
    try:
        linked = inbox.deliver([work])
        try:
            syncer.flush(f"the {what}'s link into new/")
        except DurabilityError as e:
            inbox.unlink(linked, e)
    finally:
        syncer.close()
    [recipient] = work.recipients
    if recipient not in work.delivered_now:
        raise RelayError(f"could not put a {what} in inbox/{recipient}: {work.failed_for.get(recipient)}")
