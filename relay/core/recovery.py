"""Crash and power-loss recovery (contract §3), run at every start (relay run, run --once)
and after a failed step of the daemon's loop.

Rows left processing go back to pending with their file put back in the spool wherever it was
found (outbox, spool, archive, failed/); files in the spool, or in the latest days of the
archive, that no ledger row knows are registered again under their id (a recipient that holds
one already is recognised); orphaned inbox tmp/ files are removed.

The claim budget: being handled when relay stopped counts as an attempt. A message left
processing for the `budget`-th time (max_retries, at least 1) is one whose handling may be what
stops relay (a crash in a library, an out-of-memory kill, an operator's kill -9 again and
again): it is quarantined in failed/ with that reason instead of being claimed once more, and
`relay retry` brings it back. A stored row this build cannot read is failed with the reason
(history.BadRow); recovery never follows a path such a row holds.
"""
import logging

from relay.core.archive import check_rel, day_of
from relay.core.bounces import of_row
from relay.errors import DurabilityError
from relay.files.fs import shown
from relay.ledger.history import BadRow, sift
from relay.core.inbox import ORPHAN_AGE
from relay.files.layout import valid_agent, valid_id
from relay.core.work import MAX_BACKOFF, backoff, fields

log = logging.getLogger(__name__)

ADOPT_LOOKBACK = 86400.0    # the archive's days looked through for originals no row knows:
                            # the day of the latest archived message and the day before


class Recovery:
    def __init__(self, layout, ledger, history, archive, inbox, syncer):
        self.layout = layout
        self.fs = layout.fs
        self.ledger = ledger
        self.history = history
        self.archive = archive
        self.inbox = inbox
        self.syncer = syncer

    def retry_archive(self, now, limit, base):
        """Archive moves that failed after delivery (disk full, permissions) tried again.
        Returns how many were archived now."""
        done, retry, bad = [], [], []
        for row in sift(self.history.delivered_due(now, limit), bad):
            rel = row["archive_path"] or self.layout.archive_rel(day_of(now), row["sender"], row["id"], row["name"])
            spool = self.layout.spool_of(row)
            try:
                if self.fs.exists(spool):
                    self.archive.store(spool, rel)
                elif not self.fs.exists(check_rel(rel, "archive")):
                    raise FileNotFoundError(2, "the original is in neither the spool nor the archive")
                done.append((row["id"], rel))
            except OSError as e:
                retry.append((row["id"], f"archive: {e.strerror or e}", now + backoff(base, row["retries"] + 1),
                              row["retries"] + 1))
        if bad:
            self._fail_unreadable(bad, now)
        if done or retry:
            try:
                self.syncer.flush("archive directories")
            except DurabilityError as e:
                retry += [(mid, str(e), now + MAX_BACKOFF, 0) for mid, _ in done]
                done = []
            self.ledger.messages.archived_late(now, done, retry)
        return len(done)

    def readable(self, rows, now, need=(), fresh=frozenset()):
        """The rows (claimed) this build can read; each other one is named in the log with its
        id and column and failed with that reason (its file is not touched); the batch goes on
        without it. `need`: columns that must not be NULL either. `fresh`: ids of rows this
        relay registered and claims for the first time (every column of its own making): only
        `need` is checked."""
        good, bad = [], []
        for row in rows:
            trusted = row["id"] in fresh and all(row[c] is not None for c in need)
            problem = None if trusted else BadRow.of(row, need=need)
            if problem is None:
                good.append(row)
            else:
                bad.append(problem)
        if bad:
            self._fail_unreadable(bad, now)
        return good

    def _fail_unreadable(self, bad, now):
        """Rows this build cannot read: failed with the reason; their files are not touched."""
        problems = [(b.key, f"{b}; the row was failed") for b in bad]
        for mid, reason in problems:
            log.error("%s", reason, **fields("failed", mid))
        self.ledger.messages.fail_unreadable(now, problems)

    def recover(self, now, budget=3, stopped=True, bounce=True):
        """Put back in the flow what a stopped relay left; returns the number of messages
        recovered. A message left processing for the `budget`-th time is quarantined (with
        `bounce`, its sender is owed a bounce). With `stopped` False (a failed step of a running relay, which is no stop) nothing left
        processing counts as interrupted."""
        self.fs.forget()
        reset, stopped_rows, bad, rows = [], [], [], {}
        for row in sift(self.history.processing(), bad):
            rows[row["id"]] = row
            mid, sender = row["id"], row["sender"]
            spool = self.layout.spool_of(row)
            try:
                spooled = self._respool(row, spool)
            except OSError as e:
                log.error("%s: cannot recover its file (%s); it stays where it is", mid, e, **fields("error", mid, sender))
                spooled = False
            if stopped and row["interrupted"] + 1 >= budget:
                quarantined = self._stopped(row, spool if spooled else None, now)
                if quarantined is not None:
                    stopped_rows.append(quarantined)
                    continue
            reset.append((mid, spooled))
            log.warning("%s from %s was left processing by a stopped relay: back to pending", mid, sender,
                        **fields("recovered", mid, sender))
        if bad:
            self._fail_unreadable(bad, now)
        spooled = list(self.layout.spooled())
        unknown = self.history.unknown([mid for _, mid, _, _ in spooled])
        orphans = [(mid, sender, name) for sender, mid, name, _ in spooled if mid in unknown]
        for mid, sender, _ in orphans:
            log.warning("%s from %s was in the spool with no ledger record: registered again", mid, sender,
                        **fields("recovered", mid, sender))
        orphans += self._adopt_archived()
        if reset or orphans or stopped_rows:
            self.syncer.flush("recovery moves")
            owed = [of_row(rows[mid], set(self.history.delivered_to([mid]).get(mid, {})), reason)
                    for mid, reason, _ in stopped_rows] if bounce else []
            self.ledger.messages.reset(reset, now, stopped_rows, interrupted=stopped, bounces=owed)
            self.ledger.messages.readopt(orphans, now)
        for mid, reason, _ in stopped_rows:
            log.error("%s failed: %s", mid, reason, **fields("failed", mid))
        self.remove_orphans(now)
        return len(reset) + len(orphans) + len(stopped_rows)

    def _stopped(self, row, src, now):
        """Quarantine a message whose handling was interrupted once too often: (id, reason,
        failed path), or None when its file cannot be moved (it is then reset, and tried again
        at the next recovery). `src`: its file in the spool, or None (then the outbox, where a
        claim that had not taken custody left it)."""
        mid, sender, name = row["id"], row["sender"], row["name"]
        times = row["interrupted"] + 1
        reason = (f"relay stopped while handling it {f'{times} times' if times > 1 else 'once'} (a crash, an "
                  "out-of-memory kill or a kill -9 each time): it may be what stops relay, so it is quarantined "
                  "instead of being tried again; "
                  f"once the cause is found, `relay retry {mid}` puts it back")
        if src is None and not row["spooled"] and self.fs.exists(f"outbox/{sender}/{name}"):
            src = f"outbox/{sender}/{name}"
        delivered = sorted(self.history.delivered_to([mid]).get(mid, {}))
        report = self.archive.report(mid, sender, name, reason, now, row["retries"] + 1, delivered)
        try:
            rel = self.archive.quarantine(src, sender, mid, name, report)
        except (OSError, DurabilityError) as e:
            log.error("%s: cannot quarantine its file (%s); back to pending", mid, e, **fields("error", mid, sender))
            return None
        return mid, reason, rel

    def _respool(self, row, spool):
        """Put a processing row's file back in the spool when an archive or quarantine move
        ran ahead of the ledger. True when the file is in the spool."""
        if self.fs.exists(spool):
            return True
        failed = self.layout.failed_rel(row["sender"], row["id"], row["name"])
        for rel in (row["archive_path"], failed):
            try:
                if rel and self.fs.exists(check_rel(rel, "archive", "failed")):
                    self.archive.move(rel, spool)
                    if rel == failed:       # its report tells of a failure that was never recorded
                        self.fs.unlink_quietly(f"{failed}.error.json")
                    return True
            except OSError:
                continue
        return False

    def _adopt_archived(self):
        """Originals in the archive's latest days that no ledger row knows (the ledger lost
        them): moved back to the spool, to be delivered (idempotently) and archived again."""
        latest = self.history.latest_archived_at()
        found = []
        if latest is None:
            # No archived row at all: a new ledger. If the archive holds originals the ledger was
            # replaced or lost; delivering them all again would repeat what agents already read.
            try:
                archived = bool(self.fs.names("archive"))
            except OSError:
                archived = False
            if archived:
                log.warning("archive/ holds originals but the ledger records no archived message: was the "
                            "ledger replaced? They are not delivered again; `relay doctor` lists them")
            return found
        first_day = day_of(latest - ADOPT_LOOKBACK)
        try:
            days = sorted(e.name for e in self.fs.scandir("archive") if e.is_dir(follow_symlinks=False)
                          and e.name >= first_day)
        except OSError:
            return found
        for day in days:
            try:
                senders = [e.name for e in self.fs.scandir(f"archive/{day}")
                           if valid_agent(e.name) and e.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            for sender in senders:
                try:
                    files = [e.name for e in self.fs.scandir(f"archive/{day}/{sender}") if e.is_file(follow_symlinks=False)]
                except OSError:
                    continue
                parsed = [(n.partition("--")[0], n.partition("--")[2], n) for n in files]
                parsed = [p for p in parsed if valid_id(p[0]) and p[1]]
                unknown = self.history.unknown([p[0] for p in parsed])
                for mid, name, file in parsed:
                    if mid not in unknown:
                        continue
                    try:
                        self.archive.move(f"archive/{day}/{sender}/{file}", self.layout.spool_rel(sender, mid, name))
                    except OSError as e:
                        log.error("archive/%s/%s/%s has no ledger record and cannot be moved back: %s",
                                  day, sender, shown(file), e)
                        continue
                    log.warning("%s from %s was archived with no ledger record: registered again", mid, sender,
                                **fields("recovered", mid, sender))
                    found.append((mid, sender, name))
        return found

    def remove_orphans(self, now):
        """Inbox tmp/ files older than ORPHAN_AGE: left by a delivery that never finished."""
        removed = 0
        for rel in self.inbox.orphans(now - ORPHAN_AGE):
            if self.fs.unlink_quietly(rel):
                removed += 1
                log.info("removed orphaned inbox file %s", shown(rel))
        return removed
