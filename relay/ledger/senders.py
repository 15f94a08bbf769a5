"""The ledger's writes about senders (`ledger.senders`, a part on the Ledger's transactions): the agents
declared as senders (`senders = "declared"`: relay init --agent, send --create, the API, adopt
--create); the id `relay send` gave a sender, recorded before its file is written; the ids and
request ids the messages of a batch name, settled before anything is delivered; their records
forgotten with the messages at the retention sweep. The reads are in history.py
(`declared_agents`, `id_owner`, `find`).

The rule: an id `relay send` printed to a sender is that sender's. A file of another sender that
names it keeps the id relay gave it when found (event `id_refused`) and goes on like any other;
so does a file naming an id another sender's message has already. Only a sender's own reuse of an
id is refused, as its own mistake. A request id repeats only the same sender's messages."""

from relay.ledger.part import Part

REFUSED = "this message keeps the id relay gave it"


class Senders(Part):
    """The senders and their ids: see the module's docstring."""

    def declare(self, names, now, how):
        """These agents are senders (`how`: what declared them); one declared already stays as
        it was."""
        with self.transaction():
            self.db.executemany("INSERT INTO declared_agents (name, at, how) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                                [(n, now, how) for n in names])

    def reserve_id(self, mid, sender, now, request_id=None):
        """`relay send` gives `mid` to `sender`: committed before the file naming it is written,
        so no copy of the file in another outbox can be first to have it. With a request id
        the sender used before on a message that did not fail (one relay has read, or one
        `relay send` gave and whose file may still wait in the outbox), nothing is reserved and
        that message's id is returned; None otherwise. One transaction: of two sends with one
        request id at once, one writes and the other repeats it."""
        with self.transaction():
            first = self.first_request(sender, request_id) if request_id is not None else None
            if first is None:
                self.db.execute("INSERT INTO sent_ids (id, sender, at, request_id) VALUES (?, ?, ?, ?)",
                                (mid, sender, now, request_id))
        return first

    def first_request(self, sender, request_id):
        """The id of the sender's first message with this request id that did not fail: one
        relay read (messages), or one `relay send` gave (sent_ids) whose file relay has not
        failed, under its id or, not read yet, under the name `msg-<id>`."""
        row = self.db.execute(
            "SELECT id, discovered_at AS at FROM messages WHERE sender = :s AND request_id = :r AND duplicate_of IS NULL "
            "AND status != 'failed' UNION ALL SELECT g.id, g.at FROM sent_ids g WHERE g.sender = :s AND g.request_id = :r "
            "AND NOT EXISTS (SELECT 1 FROM messages m WHERE (m.id = g.id OR m.sender = g.sender AND m.name = "
            "'msg-' || lower(g.id)) AND (m.status = 'failed' OR m.duplicate_of IS NOT NULL)) ORDER BY at, id LIMIT 1",
            {"s": sender, "r": request_id}).fetchone()
        return row[0] if row else None

    def forget_sent_ids(self, cutoff, limit):
        """Records of ids given before `cutoff` whose message never reached the ledger (the
        file was deleted before relay saw it): at most `limit`. Returns how many."""
        with self.transaction():
            return self.db.execute(
                "DELETE FROM sent_ids WHERE id IN (SELECT s.id FROM sent_ids s INDEXED BY sent_ids_at WHERE s.at < ? "
                "AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.id = s.id) LIMIT ?)", (cutoff, limit)).rowcount

    def identify(self, now, items, plan):
        """One transaction for the messages of a batch that name their own id or a request id,
        in order. items: (id, sender, name, chosen id or None, request id or None, recipient
        holding the chosen id under another message or None). A chosen id that is the sender's
        to have and not used by any row becomes the row's id (its events follow; `spool_id`
        keeps the id its spool file is named by; the archive path is planned again by
        `plan(sender, id, name)`; the event `identified` says so when the sender chose it by hand,
        not when `relay send` gave it). A request id already held by an earlier message of the same
        sender that did not fail makes this one its duplicate. Returns {id: (new id, archive
        path or None, duplicate_of or None, refusal or None, why the chosen id was not taken or
        None)}."""
        out = {}
        db = self.db
        with self.transaction():
            db.execute("PRAGMA defer_foreign_keys = ON")    # a row, its sheds and bounces change id together
            for mid, sender, name, chosen, request, held in items:
                new, path, first, refusal, note = mid, None, None, None, None
                if chosen and chosen != mid and db.execute(
                        "SELECT 1 FROM deliveries WHERE message_id = ? UNION ALL SELECT 1 FROM outbound "
                        "WHERE message_id = ? LIMIT 1", (mid, mid)).fetchone():
                    # Recipients hold it under its id already, here or queued for another node
                    # (its file gained an ID since): it keeps that id, or they would get it twice.
                    self.events([(mid, now, "identified", f"keeps its id: delivered under it already; the id "
                                                          f"in its file ({chosen}) is not taken")])
                elif chosen and chosen != mid:
                    owner = db.execute("SELECT sender FROM sent_ids WHERE id = ?", (chosen,)).fetchone()
                    row = db.execute("SELECT sender FROM messages WHERE id = ? OR spool_id = ? LIMIT 1",
                                     (chosen, chosen)).fetchone()
                    if owner is not None and owner[0] != sender:
                        note = f"the id {chosen} in its file was given to {owner[0]} by relay send; {REFUSED}"
                    elif row is not None and row[0] != sender:
                        note = f"the id {chosen} in its file is another message's (from {row[0]}); {REFUSED}"
                    elif held is not None:
                        note = f"the id {chosen} in its file is another message's (in the inbox of {held}); {REFUSED}"
                    elif row is not None:
                        refusal = (f"the id {chosen} is already used by another message; choose another, "
                                   "or leave ID out and relay gives one")
                    else:
                        path = plan(sender, chosen, name)
                        db.execute("UPDATE messages SET id = ?, spool_id = coalesce(spool_id, id), archive_path = ? "
                                   "WHERE id = ?", (chosen, path, mid))
                        db.execute("UPDATE events SET message_id = ? WHERE message_id = ?", (chosen, mid))
                        db.execute("UPDATE sheds SET message_id = ? WHERE message_id = ?", (chosen, mid))
                        db.execute("UPDATE bounces SET message_id = ? WHERE message_id = ?", (chosen, mid))
                        if owner is None:   # chosen by hand: relay send's own id is no news
                            self.events([(chosen, now, "identified", f"the id its sender chose (found as {mid})")])
                        new = chosen
                    if note:
                        self.events([(mid, now, "id_refused", note)])
                if request and refusal is None:
                    row = db.execute("SELECT id FROM messages WHERE sender = ? AND request_id = ? AND id != ? "
                                     "AND duplicate_of IS NULL AND status != 'failed' ORDER BY discovered_at, id "
                                     "LIMIT 1", (sender, request, new)).fetchone()
                    first = row[0] if row else None
                    db.execute("UPDATE messages SET request_id = ?, duplicate_of = ? WHERE id = ?", (request, first, new))
                    if first:
                        self.events([(new, now, "duplicate", f"request id {request!r} was sent before as {first}")])
                out[mid] = (new, path, first, refusal, note)
        return out
