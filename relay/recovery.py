"""Crash and power-loss recovery (SPEC section 3), run at every start (relay run, run --once)
and after a failed step of the daemon's loop.

Rows left processing go back to pending with their file put back in the spool wherever it was
found (outbox, spool, archive, failed/); files in the spool, or in the latest days of the
archive, that no ledger row knows are registered again under their id (a recipient that holds
one already is recognised); orphaned inbox tmp/ files are removed.
"""
import logging

from .archive import check_rel, day_of
from .errors import DurabilityError
from .fs import shown
from .inbox import ORPHAN_AGE
from .layout import valid_agent, valid_id
from .work import MAX_BACKOFF, backoff

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
        done, retry = [], []
        for row in self.history.delivered_due(now, limit):
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
        if done or retry:
            try:
                self.syncer.flush("archive directories")
            except DurabilityError as e:
                retry += [(mid, str(e), now + MAX_BACKOFF, 0) for mid, _ in done]
                done = []
            self.ledger.archived_late(now, done, retry)
        return len(done)

    def recover(self, now):
        """Put back in the flow what a stopped relay left; returns the number of messages
        recovered."""
        self.fs.forget()
        reset = []
        for row in self.history.processing():
            mid, sender = row["id"], row["sender"]
            try:
                reset.append((mid, self._respool(row, self.layout.spool_of(row))))
            except OSError as e:
                log.error("%s: cannot recover its file (%s); it stays where it is", mid, e)
                reset.append((mid, False))
            log.warning("%s from %s was left processing by a stopped relay: back to pending", mid, sender)
        spooled = list(self.layout.spooled())
        unknown = self.history.unknown([mid for _, mid, _, _ in spooled])
        orphans = [(mid, sender, name) for sender, mid, name, _ in spooled if mid in unknown]
        for mid, sender, _ in orphans:
            log.warning("%s from %s was in the spool with no ledger record: registered again", mid, sender)
        orphans += self._adopt_archived()
        if reset or orphans:
            self.syncer.flush("recovery moves")
            self.ledger.reset(reset, now)
            self.ledger.readopt(orphans, now)
        self.remove_orphans(now)
        return len(reset) + len(orphans)

    def _respool(self, row, spool):
        """Put a processing row's file back in the spool when an archive or quarantine move
        ran ahead of the ledger. True when the file is in the spool."""
        if self.fs.exists(spool):
            return True
        for rel in (row["archive_path"], self.layout.failed_rel(row["sender"], row["id"], row["name"])):
            try:
                if rel and self.fs.exists(check_rel(rel, "archive", "failed")):
                    self.archive.move(rel, spool)
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
                    log.warning("%s from %s was archived with no ledger record: registered again", mid, sender)
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
