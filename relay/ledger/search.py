"""Full-text search over the messages' subjects and bodies: SQLite FTS5 in the ledger.

`search_docs` holds, per message, its subject and the first BODY_CHARS characters of its body
(the index's external content, with the message's id); `search` is the FTS5 index over them
(tokenizer unicode61, diacritics folded). What is indexed is bounded: the body capped, one row a
message, each row removed with its message by the retention sweep.

Writes (SearchIndex, `ledger.search`) happen in the transactions that record messages: a batch's
record (`ledger.messages.record`), a batch received from another node (`ledger.remote.received`),
an import, the sweep. Reads (SearchReads, `history.search`): what an agent may see is its own inbox
(the deliveries to it) and what it sent, newest first, with a snippet of the body.

A query is words, each of which must be there (any case, any order), `"a phrase"`, and `word*`
for a prefix; nothing in it is FTS5 syntax (every term is quoted), so any text is a query. A
query is bounded (MAX_QUERY_BYTES, MAX_TERMS) and a term said twice is looked for once: FTS5's
work for an AND of terms that match grows with the square of their number.
"""
import re

from relay.errors import RelayError
from relay.ledger.part import Part
from relay.ledger.parties import party
from relay.ledger.sql import insert_rows

BODY_CHARS = 4096          # of a body, what is indexed (migration 30 backfills with the same cap)
SNIPPET_TOKENS = 16        # words in a snippet
MARK = "**"                # around each word found, in a snippet
TERMS = re.compile(r'"([^"]*)"?|(\S+)')
MAX_QUERY_BYTES = 1000     # of a query, in UTF-8: past it the query is refused before it is read
MAX_TERMS = 64             # words and phrases in a query


def match(query):
    """The FTS5 expression for a query (see the module's docstring): each term once, so what FTS5
    is given grows with the query's distinct terms and no further. RelayError when the query is
    past MAX_QUERY_BYTES or MAX_TERMS (checked before it is split: a long query costs no more than
    reading its length), or holds no word to look for."""
    query = query or ""
    size = len(query.encode("utf-8", "surrogatepass"))
    if size > MAX_QUERY_BYTES:
        raise RelayError(f"a search query is at most {MAX_QUERY_BYTES:,} bytes; this one is {size:,}")
    found = TERMS.findall(query)
    if len(found) > MAX_TERMS:
        raise RelayError(f"a search query holds at most {MAX_TERMS} words; this one has {len(found)}")
    terms = {}
    for phrase, word in found:
        text = phrase if phrase else word
        prefix = not phrase and text.endswith("*")
        text = text.rstrip("*") if prefix else text
        if not re.search(r"\w", text):
            continue
        terms.setdefault((text.lower(), prefix), '"' + text.replace('"', '""') + '"' + ("*" if prefix else ""))
    if not terms:
        raise RelayError(f"nothing to search for in {query!r}: give a word")
    return " AND ".join(terms.values())


class SearchIndex(Part):
    """The index's writes, inside the caller's transaction."""

    def index(self, docs):
        """Index these messages, each once: docs are (id, subject, body)."""
        docs = [d for d in docs if d[1] or d[2]]
        if not docs:
            return
        before = self.db.execute("SELECT coalesce(max(seq), 0) FROM search_docs").fetchone()[0]
        insert_rows(self.db, "INSERT INTO search_docs (message_id, subject, body)", docs,
                    "ON CONFLICT (message_id) DO NOTHING", row=f"(?, ?, substr(?, 1, {BODY_CHARS}))")
        self.db.execute("INSERT INTO search (rowid, subject, body) SELECT seq, subject, body FROM search_docs "
                        "WHERE seq > ?", (before,))

    def unindex(self, ids):
        """Take these messages out of the index (the sweep)."""
        rows = [(i,) for i in ids]
        self.db.executemany("INSERT INTO search (search, rowid, subject, body) SELECT 'delete', seq, subject, body "
                            "FROM search_docs WHERE message_id = ?", rows)
        self.db.executemany("DELETE FROM search_docs WHERE message_id = ?", rows)


class SearchReads(Part):
    """The search."""

    def messages(self, query, agent=None, sender=None, thread=None, since=None, limit=20):
        """The messages matching `query`, newest first, at most `limit`: those `agent` may see
        (delivered to it, or sent by it; every message when None), sent by `sender`, of `thread`
        (a thread named by a message's id holds it), discovered at or after `since` (epoch
        seconds). Each a dict: id, from, to (JSON text), kind, thread, subject, status, sent_at,
        discovered_at, snippet."""
        where, args = ["search MATCH ?"], [match(query)]
        if agent is not None:
            seen, seen_args = party(agent)
            where.append(seen); args += seen_args
        if sender is not None:
            where.append("m.sender = ?"); args.append(sender)
        if thread is not None:
            where.append("(m.thread = ? OR m.id = ?)"); args += [thread, thread]
        if since is not None:
            where.append("m.discovered_at >= ?"); args.append(since)
        sql = ("SELECT m.id, m.sender, m.recipients, m.kind, m.thread, m.subject, m.status, m.sent_at, "
               f"m.discovered_at, snippet(search, 1, '{MARK}', '{MARK}', '…', {SNIPPET_TOKENS}) AS snippet "
               "FROM search JOIN search_docs d ON d.seq = search.rowid JOIN messages m ON m.id = d.message_id "
               f"WHERE {' AND '.join(where)} ORDER BY m.id DESC LIMIT ?")
        return [dict(r) for r in self.db.execute(sql, [*args, int(limit)])]

    def size(self):
        """How many messages the index holds."""
        return self.db.execute("SELECT count(*) FROM search_docs").fetchone()[0]
