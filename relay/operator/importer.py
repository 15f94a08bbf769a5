"""`relay import agent-relay PATH`: a team's history brought over from agent-relay 2.0, the
product relay replaces, into this project's ledger and archive.

PATH is agent-relay's ledger file, agent-relay's directory (`.agent-relay`, holding
`meta/file-ledger.sqlite` or `meta/ledger.sqlite`) or the project that holds that directory;
without it, the ledger is looked for where agent-relay keeps it (operator/agent_relay_places.py).
Nothing there is written: the ledger is read from a copy (ledger/agent_relay.py), the files
through a descriptor of agent-relay's directory that never follows a link. Each record of
`relay_files` becomes one message here, with an id made from agent-relay's file id (and its
time), so that every run gives it the same one:

- archived there: archived here, its archive file copied into `archive/<day>/<agent>/<id>--<name>`
  after its bytes were checked against what agent-relay recorded (the first 16 hex digits of their
  sha256, and their size); it enters the hash chain as relay's own archived messages do. The copy
  keeps a hidden name until its record is durable: recovery delivers again an archive file no
  record knows.
- delivered there (its archive move never happened): archived here the same way, from the
  original still in agent-relay's outbox; never delivered again.
- failed there: failed here, its file (still in agent-relay's outbox) quarantined in `failed/`
  with its `.error.json`, so that `relay retry` can deliver it.
- pending or processing there: pending here, its bytes in relay's spool, so relay delivers it
  once, as it delivers a message in its custody (`relay run`). A file in agent-relay's outbox is
  delivered once because relay never reads that outbox: it delivers the copy in its spool. One
  outbox file is one message: a later record of the same file (a crash of agent-relay leaves one
  processing, one pending) is recorded as a duplicate of the first (its `imports` row and its
  `imported` event name the message the first became), never delivered again; so is a record
  on the way of a file a delivered record holds (the same path and hash), whatever their order.

An archived or delivered record whose original is missing or does not match is not imported (a
problem, named, each run), unless `accept_missing` brings it over as archived with no archive
file, its error saying why. A file in agent-relay's outbox no record knows is a problem too.
Each record imported is in `imports` (migration 52) with its `imported` event, and skipped by
any later run: a second run changes nothing. Agents come over into the agents table, and with
their status and metadata into the agent registry; agent-relay's orchestrator state into
`team_state` (relay state)."""
import contextlib
import hashlib
import os
import stat

import orjson

from relay.core import registry
from relay.names import agent_problem, fold, namesake_problem
from relay.core.archive import Archive, day_of
from relay.errors import RelayError
from relay.files.fs import StateDir, bad_name, default_fsync, shown
from relay.files.layout import is_in_progress_name
from relay.files.lock import exclusive
from relay.ledger.agent_relay import AgentRelayLedger
from relay.ledger.history import History
from relay.ledger.imports import NO_STATE
from relay.operator.agent_relay_places import locate
from relay.operator.agent_relay_records import (MAX_FILE, fields, file_key, message_id,  # noqa: F401
                                                mismatch, on_the_way, own, seconds, tail, what)
from relay.operator.doctor import actor
from relay.operator.import_summary import BECOMES, SOURCE, Summary

ON_THE_WAY = ("pending", "processing")     # statuses whose file agent-relay still had to deliver
BATCH = 500                 # records written (files, then one transaction) at a time
MAX_SHOWN = 20              # unknown outbox files named one by one
STAGED = ".import"          # an archive copy's hidden name ends so until its record is durable
WAIT_S = 600                # how long an import waits for another one (or an operator command) to end
BUSY = (f"another relay import or operator command has held this project for {WAIT_S} s; run the import "
        "again once it is done")


class Importer:
    def __init__(self, ledger, layout, path, now, durability="full", dry_run=False, accept_missing=False, env=None):
        self.ledger, self.layout, self.now = ledger, layout, now
        self.history = History(ledger)
        found = locate(path, layout.root, env)
        self.file, self.root = found.ledger, found.root
        if os.path.realpath(self.root) == os.path.realpath(layout.state):
            raise RelayError(f"{self.root} is relay's own state directory: the files in its outbox are relay's to "
                             "deliver already; import into a state directory of relay's own (the default .relay)")
        self.summary = Summary(str(self.file), str(self.root), dry_run, found=found.said)
        self.dry_run, self.accept_missing = dry_run, accept_missing
        self.fsync = default_fsync if durability == "full" else False
        self.actor = actor()
        self.origin = str(self.file)
        self.written = set()        # directories written into by this batch

    def run(self):
        with AgentRelayLedger(self.file) as src:
            rows, agents, state = src.files(), src.agents(), src.state()
        try:
            self.src = StateDir(self.root)
        except OSError as e:
            raise RelayError(f"cannot open agent-relay's directory {self.root}: {e.strerror or e}") from None
        seen = self._seen(agents, rows)
        # one import (or operator command) at a time: two at once would write the same files
        with contextlib.nullcontext() if self.dry_run else exclusive(self.layout.command_lock, WAIT_S, BUSY):
            if not self.dry_run:
                # each agent's outbox and inbox first: what relay delivers of the import is to them
                self.summary.notices += self.layout.init(sorted(seen))
                self._finish_staged()
            try:
                self._messages(rows)
                self._unknown_files(rows)
            finally:
                self.src.close()
            self._agents(seen)
            self._registry(agents)
            self._state(state)
        return self.summary

    # -- messages ---------------------------------------------------------------------------

    def _messages(self, rows):
        done = self.history.imports.imported(SOURCE, [r["file_id"] for r in rows])
        # (outbox/<agent>/<name>, hash, size) -> file id of the first record delivered of that file
        self.delivered = {}
        for r in rows:
            if r["status"] == "delivered" and (key := file_key(r)):
                self.delivered.setdefault(key, r["file_id"])
        self.became = dict(done)        # file id -> the message id it became (imported, or now)
        owner = {}          # source path -> the newest record there: a file at that path is its
        for r in rows:      # (a record on the way of a delivered file is that file still)
            if not (r["status"] in ON_THE_WAY and file_key(r) in self.delivered):
                owner[r["source_path"]] = r["file_id"]
        # outbox/<agent>/<name> -> (file id, message id) of the first record still on its way of
        # that file: one outbox file is one message, whatever else agent-relay recorded of it
        self.holder = {}
        for r in rows:
            if r["file_id"] in done and r["status"] in ON_THE_WAY and (rel := on_the_way(r)):
                self.holder.setdefault(rel, (r["file_id"], done[r["file_id"]]))
        # records on the way last: a delivered record they may be duplicates of is planned first
        todo = sorted((r for r in rows if r["file_id"] not in done), key=lambda r: r["status"] in ON_THE_WAY)
        self.summary.skipped = len(rows) - len(todo)
        for i in range(0, len(todo), BATCH):
            items = []
            for r in todo[i:i + BATCH]:
                item = self._plan(r, owner)
                if item is not None:
                    items.append(item)
                    self.became.setdefault(r["file_id"], item["id"])
            self._write(items)

    def _problem(self, r, what):
        self.summary.problems.append(f"{shown(str(r['file_id']))} ({r['status']}, "
                                     f"{shown(str(r['agent_name']))}/{shown(str(r['message_type']))}): {what}")

    def _plan(self, r, owner):
        """The message row a record becomes (with the files to write), or None (a problem)."""
        sender, name, status = r["agent_name"], r["message_type"], r["status"]
        if agent_problem(sender) is not None:     # no name relay keeps for itself (names.py), in any case
            return self._problem(r, f"its agent name is not one relay takes ({agent_problem(sender)}); not imported")
        if sender in self.namesakes:        # another agent's name in another case
            return self._problem(r, f"{self.namesakes[sender]}; not imported")
        if (not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name
                or bad_name(name) is not None):
            return self._problem(r, "its file name is not one relay takes; not imported")
        if status not in BECOMES or seconds(r["discovered_at"]) is None or not isinstance(r["file_id"], str):
            return self._problem(r, "a record agent-relay 2.0 does not write (status, time or id); not imported")
        mid = message_id(r["file_id"], r["discovered_at"])
        claims = r["retries"] if isinstance(r["retries"], int) and r["retries"] > 0 else 0
        item = {"id": mid, "sender": sender, "name": name, "source_id": r["file_id"], "source_status": status,
                "discovered_at": seconds(r["discovered_at"]), "retries": 0, "attempts": claims,
                "next_attempt_at": 0, "spooled": 0, "files": []}
        if status in ("archived", "delivered"):
            return self._archived(r, item, owner)
        if status == "failed":
            return self._failed(r, item, owner)
        if (twin := self.delivered.get(file_key(r))) is not None:       # a file delivered there already
            if twin not in self.became:
                return self._problem(r, f"the outbox file agent-relay's {shown(twin)} delivered, which is not "
                                        "imported (its own problem says why); not imported, never delivered twice")
            return {"id": self.became[twin], "duplicate_of": twin, "source_id": r["file_id"], "source_status": status,
                    "status": None, "files": []}
        rel = on_the_way(r)
        first = self.holder.setdefault(rel, (r["file_id"], mid)) if rel else (r["file_id"], mid)
        if first[0] != r["file_id"]:        # a second record of a file already imported: its duplicate
            return {"id": first[1], "duplicate_of": first[0], "source_id": r["file_id"], "source_status": status,
                    "status": None, "files": []}
        return self._pending(r, item)

    def _original(self, r, owner):
        """(bytes, mtime, None) of the record's original in agent-relay's directory (its archive
        file, or the file still in its outbox), or (None, None, why not)."""
        if r["status"] == "archived":
            rel = tail(r["archive_path"], "archive", 3)
            where = f"archive file {shown(str(r['archive_path']))}"
        else:
            rel = tail(r["source_path"], "outbox", 2)
            where = f"file {shown(str(r['source_path']))}"
            if owner.get(r["source_path"]) != r["file_id"]:
                return None, None, f"{where} holds a later message now (agent-relay's {owner[r['source_path']]})"
        if rel is None or not own(rel, r):
            return None, None, f"{where} is not where agent-relay keeps its files"
        try:
            fd = self.src.open_read(rel)
        except FileNotFoundError:
            return None, None, f"{where} is missing"
        except OSError as e:
            return None, None, f"{where} cannot be read: {e.strerror or e}"
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE:
                return None, None, f"{where} is not a regular file of at most {MAX_FILE} bytes"
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
        except OSError as e:
            return None, None, f"{where} cannot be read: {e.strerror or e}"
        finally:
            os.close(fd)
        data = b"".join(chunks)
        wrong = mismatch(data, r) if r["status"] != "pending" and r["status"] != "processing" else None
        if wrong:
            return None, None, f"{where} {wrong}"
        return data, st.st_mtime, None

    def _archived(self, r, item, owner):
        data, mtime, why = self._original(r, owner)
        if data is None and not self.accept_missing:
            return self._problem(r, f"{why}; not imported (restore it and run the import again, or import it "
                                    "without its archive file: --accept-missing)")
        delivered = seconds(r["processed_at"]) or item["discovered_at"]
        archived = seconds(r["archived_at"]) if r["status"] == "archived" else self.now
        archived = archived or delivered
        item.update(status="archived", delivered_at=delivered, archived_at=archived,
                    retries=max(item["attempts"] - 1, 0))
        if data is None:
            self.summary.without_file += 1
            size = r["file_size"] if isinstance(r["file_size"], int) and r["file_size"] > 0 else None
            item.update(size=size, error=f"imported without its original: {why}")
        else:
            rel = self.layout.archive_rel(day_of(archived), item["sender"], item["id"], item["name"])
            item.update(fields(data, item["name"]), size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                        sent_at=mtime, archive_path=rel)
            d, _, base = rel.rpartition("/")
            item["files"].append((f"{d}/.{base}{STAGED}", data, rel))
        return item

    def _failed(self, r, item, owner):
        failed = seconds(r["processed_at"]) or item["discovered_at"]
        error = r["error"] if isinstance(r["error"], str) and r["error"] else "failed in agent-relay"
        item.update(status="failed", failed_at=failed, error=error, retries=item["attempts"])
        data, mtime, why = self._original(r, owner)
        if data is None:
            self.summary.notices.append(f"{item['id']} (agent-relay's {r['file_id']}, failed): {why}; imported as "
                                        "failed with no file to retry")
            return item
        rel = self.layout.failed_rel(item["sender"], item["id"], item["name"])
        report = Archive.report(item["id"], item["sender"], item["name"], error, failed, item["attempts"])
        report["imported"] = what(self.origin, r["file_id"])
        item.update(fields(data, item["name"]), size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                    sent_at=mtime, failed_path=rel)
        item["files"] += [(rel, data, None),
                          (f"{rel}.error.json", orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n", None)]
        return item

    def _pending(self, r, item):
        data, mtime, why = self._original(r, {r["source_path"]: r["file_id"]})
        if data is None:
            error = f"its file was not in agent-relay's outbox when it was imported ({why}); nothing to deliver"
            item.update(status="failed", failed_at=self.now, error=error)
            self.summary.notices.append(f"{item['id']} (agent-relay's {r['file_id']}, {r['status']}): {why}; "
                                        "imported as failed")
            return item
        rel = self.layout.spool_rel(item["sender"], item["id"], item["name"])
        # what audit shows of it (sender, recipients, subject) before relay delivers it
        item.update(fields(data, item["name"]), status="pending", spooled=1, sent_at=mtime, attempts=0)
        item["files"].append((rel, data, None))
        return item

    def _write(self, items):
        """The files of these records, durable before any record refers to them, then the
        records in one transaction. An archive copy is written under a hidden name first and
        takes its own once its record is durable: an archive file no record knows is one relay's
        recovery delivers again. A record whose id the ledger holds already (registered by
        recovery from a spool file an interrupted run wrote) gets no file written again."""
        if not items:
            return
        held = {i["id"] for i in items} - self.history.unknown([i["id"] for i in items])
        for it in items:
            self.summary.imported[it["source_status"]] += 1
            if it.get("duplicate_of"):
                self.summary.duplicates += 1
            else:
                self.summary.became[it["status"]] += 1
        if self.dry_run:
            return
        staged = []
        for it in items:
            if it["id"] in held:
                continue
            for rel, data, final in it["files"]:
                self.layout.fs.put(rel, data, fsync=self.fsync)
                self._changed(rel)
                if final is not None:
                    staged.append((rel, final))
        self._sync_dirs()
        self.ledger.imports.record(items, SOURCE, self.origin, self.now, self.actor)
        for rel, final in staged:
            self.layout.fs.rename(rel, final)
            self._changed(final)
        self._sync_dirs()

    def _changed(self, rel):
        parent = rel.rpartition("/")[0]
        while parent:
            self.written.add(parent)
            parent = parent.rpartition("/")[0]

    def _sync_dirs(self):
        """Make the entries written (and the new directories holding them) durable."""
        if self.fsync:
            for d in sorted(self.written, key=len, reverse=True):
                self.fsync(self.layout.fs.dir(d))
        self.written.clear()

    def _finish_staged(self):
        """Archive copies an interrupted run left under their hidden names: each whose record
        is there takes its name; the others are written again by this run."""
        for rel in list(self.layout.fs.walk_files("archive")):
            d, _, name = rel.rpartition("/")
            if not (name.startswith(".") and name.endswith(STAGED)):
                continue
            final = f"{d}/{name[1:-len(STAGED)]}"
            row = self.history.get(final.rpartition("/")[2].partition("--")[0])
            if (row is not None and row["status"] == "archived" and row["archive_path"] == final
                    and not self.layout.fs.exists(final)):
                self.layout.fs.rename(rel, final)
                self._changed(final)
        self._sync_dirs()

    def _unknown_files(self, rows):
        """Files in agent-relay's outbox that no record it has still on its way holds: never read
        by agent-relay, and not imported."""
        held = {tail(r["source_path"], "outbox", 2) for r in rows if r["status"] != "archived"}
        found = []
        for rel in self.src.walk_files("outbox"):
            parts = rel.split("/")
            if len(parts) == 3 and not is_in_progress_name(parts[2]) and rel not in held:
                found.append(rel)
        for rel in found[:MAX_SHOWN]:
            self.summary.problems.append(f"{shown(os.path.join(self.summary.root, rel))}: a file agent-relay never "
                                         "recorded; not imported: move it into relay's outbox to send it")
        if len(found) > MAX_SHOWN:
            self.summary.problems.append(f"... and {len(found) - MAX_SHOWN} more such file(s) in "
                                         f"{shown(self.summary.root)}/outbox")

    # -- agents and orchestrator state ------------------------------------------------------

    def _seen(self, agents, rows):
        """{name: (first seen, last seen)} of agent-relay's agents and of the senders of its records
        (names relay takes only)."""
        seen = {}
        self.namesakes = {}         # name -> why: another agent's name in another case ('ann' beside 'Ann')
        listed = {a["agent_name"] for a in agents}
        existing = registry.everyone(self.layout, (), self.history)
        spelt = {}          # case-folded -> the first agent of that name
        for name in sorted(existing):
            spelt.setdefault(fold(name), name)
        for name in sorted(listed | {r["agent_name"] for r in rows}, key=str):
            if agent_problem(name) is not None:     # System, Broadcast in any case: named here (and each record)
                if name in listed:
                    self.summary.problems.append(f"agent {shown(str(name))}: {agent_problem(name)}; not imported")
                continue
            other = None if name in existing else spelt.setdefault(fold(name), name)
            if other is not None and other != name:
                self.namesakes[name] = namesake_problem(name, {other})
                self.summary.problems.append(f"agent {shown(name)}: {self.namesakes[name]}; neither it nor its "
                                             "messages are imported")

        def widen(name, first, last):
            if agent_problem(name) is not None or first is None or name in self.namesakes:
                return
            f, la = seen.get(name, (first, last or first))
            seen[name] = (min(f, first), max(la, last or first))
        for a in agents:
            widen(a["agent_name"], seconds(a["created_at"]), seconds(a["last_seen_at"]))
        for r in rows:
            widen(r["agent_name"], seconds(r["discovered_at"]), seconds(r["processed_at"]))
        return seen

    def _agents(self, seen):
        if self.dry_run:
            self.summary.agents = sorted(seen)
            return
        self.summary.agents = self.ledger.imports.agents(sorted((n, f, la) for n, (f, la) in seen.items()),
                                                        SOURCE, self.origin, self.now, self.actor)

    def _registry(self, agents):
        """agent-relay's agents, their status (active or inactive) and metadata (a JSON object,
        kept as it is; another value kept under "metadata"), into relay's agent registry."""
        entries = []
        for a in agents:
            name, status = a["agent_name"], a["status"]
            if agent_problem(name) is not None or name in self.namesakes:
                continue
            try:
                metadata = orjson.loads(a["metadata"]) if isinstance(a["metadata"], (str, bytes)) else None
            except orjson.JSONDecodeError:
                metadata = a["metadata"]
            if metadata is not None and not isinstance(metadata, dict):
                metadata = {"metadata": metadata}
            metadata = {**(metadata or {}), "imported_from": SOURCE}
            entries.append((name, "inactive" if status == "inactive" else "active", metadata,
                            seconds(a["created_at"]) or self.now, seconds(a["last_seen_at"])))
        if self.dry_run:
            self.summary.registry = [e[0] for e in entries]
            return
        self.summary.registry = self.ledger.imports.registry(entries, SOURCE, self.origin, self.now, self.actor)

    def _state(self, entries):
        entries = [(e["key"], e["value"], seconds(e["updated_at"]) or self.now) for e in entries]
        if self.dry_run:
            if self.history.imports.has_table("team_state"):
                self.summary.state = [e[0] for e in entries]
            else:
                self.summary.state_note = NO_STATE
            return
        done, left, why = self.ledger.imports.state(entries, SOURCE, self.origin, self.now, self.actor)
        self.summary.state, self.summary.state_note = done, why
        if why is None:
            self.summary.state_skipped = len(entries) - len(done) - len(left)
            self.summary.notices += [f"orchestrator state key {shown(str(k))}: {reason}; not imported"
                                     for k, reason in left]


def import_agent_relay(ledger, layout, path, now, durability="full", dry_run=False, accept_missing=False, env=None):
    """Import the agent-relay ledger at `path` (None: where agent-relay keeps it, looked for in
    the project and in `env`'s places: operator/agent_relay_places.py); its Summary (see the
    module's docstring)."""
    return Importer(ledger, layout, path, now, durability, dry_run, accept_missing, env).run()
