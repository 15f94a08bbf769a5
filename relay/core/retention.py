"""Retention (contract §3): archived and failed entries older than `retention` are deleted
from disk and ledger in bounded batches, so a sweep never holds the write lock for long. A
sweep leaves a checkpoint of the hash chain so that `relay verify` stays clean."""
import dataclasses
import logging

from relay.ledger.history import History

log = logging.getLogger(__name__)

BATCH = 500          # rows deleted per transaction


@dataclasses.dataclass
class SweepResult:
    archived: int = 0
    failed: int = 0
    ids: list = dataclasses.field(default_factory=list)
    more: bool = False


def sweep(ledger, archive, now, keep, dry_run=False, limit=BATCH):
    """One batch under the `retention` setting `keep` (seconds; 0 keeps forever)."""
    if not keep:
        return SweepResult()
    return sweep_before(ledger, archive, now, now - keep, dry_run, limit)


def sweep_all(ledger, archive, now, keep, dry_run=False):
    """The whole sweep under the `retention` setting `keep` (seconds; 0 keeps forever)."""
    if not keep:
        return SweepResult()
    return sweep_all_before(ledger, archive, now, now - keep, dry_run)


def sweep_before(ledger, archive, now, cutoff, dry_run=False, limit=BATCH):
    """One batch of entries archived or failed before `cutoff`: files first, then rows (a crash
    between them is finished by the next sweep)."""
    result = SweepResult()
    archived, failed = History(ledger).sweepable(cutoff, limit)
    result.archived, result.failed = len(archived), len(failed)
    result.ids = [r["id"] for r in archived] + [r["id"] for r in failed]
    result.more = len(archived) == limit or len(failed) == limit
    if not dry_run and ledger.senders.forget_sent_ids(cutoff, limit) == limit:
        result.more = True      # ids relay send gave whose file never came (ledger/senders.py)
    if dry_run or not result.ids:
        return result
    # A row goes only with its file: one that cannot be removed (a link planted in its path)
    # keeps its row, so that the file is never taken for a message the ledger lost. Archived
    # rows stop at the first such one, to stay a prefix of the hash chain.
    kept = 0
    for i, row in enumerate(archived):
        if not _removed(archive, row["archive_path"]):
            kept += len(archived) - i
            archived = archived[:i]
            break
    kept_failed = [r for r in failed if not _removed(archive, r["failed_path"])]
    failed = [r for r in failed if r not in kept_failed]
    kept += len(kept_failed)
    result.archived, result.failed = len(archived), len(failed)
    result.ids = [r["id"] for r in archived] + [r["id"] for r in failed]
    result.more = result.more and not kept
    ledger.operations.sweep(now, archived, failed)
    log.info("retention sweep removed %d archived and %d failed messages older than %ss",
             len(archived), len(failed), int(now - cutoff))
    return result


def _removed(archive, rel):
    if not rel:
        return True
    try:
        archive.remove(rel)
        return True
    except OSError as e:
        log.error("retention sweep: cannot remove %r (%s); its ledger row stays until it can", rel, e.strerror or e)
        return False


def sweep_all_before(ledger, archive, now, cutoff, dry_run=False):
    """Batch after batch until nothing before `cutoff` is left; a dry run counts everything it
    would delete. `relay sweep --older-than D` is this with cutoff now - D (0s: everything)."""
    total = SweepResult()
    if dry_run:
        total.archived, total.failed = History(ledger).count_sweepable(cutoff)
        total.ids = sweep_before(ledger, archive, now, cutoff, dry_run=True, limit=1000).ids
        return total
    while True:
        r = sweep_before(ledger, archive, now, cutoff)
        total.archived += r.archived
        total.failed += r.failed
        total.ids += r.ids
        if not r.more:
            return total
