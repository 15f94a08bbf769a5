"""Retry as a policy: what becomes of a claimed message after its batch's delivery, decided from
its facts alone (no file, no ledger, no clock of its own: `now` comes in). The pipeline acts on
the decision (settle.py: the archive move, the quarantine and its report).

    refused, or a durability error      -> REFUSE   quarantined at once, whatever its attempts
    deferred (held open, or left over)  -> DEFER    looked at again: the settle time doubled per
                                                    claim up to `held_wait`, or at once
    delivered to every recipient        -> ARCHIVE  the original archived
    anything else                       -> RETRY    after compute_backoff(backoff, retries), or
                                        -> FAIL     past the sender's MAX-RETRIES (at most the
                                                    configured), or past max_retries once
                                                    retry_period has passed since it began failing
"""
import dataclasses
import enum

from relay.errors import DurabilityError, TransientError

MAX_BACKOFF = 300.0      # the longest wait between two attempts
MAX_HELD_WAIT = 10.0     # the longest wait before a file found held open for writing is looked at again
HELD_MIN = 0.05          # the shortest


def compute_backoff(base, retries, cap=MAX_BACKOFF):
    """Seconds before the next attempt after `retries` failed ones: doubling, capped."""
    return min(base * 2 ** min(retries, 30), cap)


class Action(str, enum.Enum):
    ARCHIVE = "archive"     # delivered to every recipient (or a repeat not delivered again)
    RETRY = "retry"         # tried again at next_attempt_at
    DEFER = "defer"         # looked at again at next_attempt_at: held open, or left for the next batch
    FAIL = "fail"           # gave up after its attempts: quarantined
    REFUSE = "refuse"       # refused for what it is, or a durability error: quarantined at once

    def __str__(self):
        return self.value


@dataclasses.dataclass(frozen=True)
class Facts:
    """What the policy decides from: one claimed message after its batch's delivery."""
    retries: int = 0                # failed attempts before this one
    attempts: int = 1               # claims of the message, this one included
    failing_since: float = None     # when its first failed attempt was (None: this one)
    max_retries: int = None         # the sender's MAX-RETRIES
    refused: str = None             # why it will not be delivered as it is
    error: Exception = None         # the transient or durability error of the message as a whole
    failed_for: tuple = ()          # (recipient, error) of each recipient not delivered to
    delivered: tuple = ()           # the recipients delivered to in this batch
    defer: bool = False             # not handled in this batch
    held: bool = False              # deferred because its file is held open for writing
    complete: bool = False          # every recipient holds it (or its node has it queued)


@dataclasses.dataclass(frozen=True)
class Decision:
    action: Action
    next_attempt_at: float = None   # RETRY and DEFER: when it is claimed again
    reason: str = None              # FAIL and REFUSE: why it is quarantined
    error: Exception = None         # the error the message carries after this decision


@dataclasses.dataclass(frozen=True)
class Retries:
    max_retries: int = 3            # attempts after the first before it may fail
    retry_period: float = 3600.0    # and at least this long since it began failing
    backoff: float = 1.0            # the first wait, doubled at each failed attempt
    settle: float = 0.25            # the first wait for a file held open for writing

    @classmethod
    def of(cls, config):
        return cls(config.max_retries, config.retry_period, config.retry_backoff, config.settle)

    def decide(self, facts, now, held_wait=MAX_HELD_WAIT):
        """The Decision for `facts` at `now`; a file held open waits at most `held_wait`."""
        durability = next((e for _, e in facts.failed_for if isinstance(e, DurabilityError)), None)
        if facts.refused or durability or isinstance(facts.error, DurabilityError):
            reason = facts.refused or (f"{durability}; delivered to {', '.join(sorted(facts.delivered)) or 'nobody'}"
                                       if durability else self._gave_up(facts, facts.error))
            return Decision(Action.REFUSE, reason=reason, error=facts.error)
        if facts.defer:
            if not facts.held:      # left for the next batch: due at once
                return Decision(Action.DEFER, now)
            # Doubled at each claim that finds it still held, so that a writer that never lets
            # go does not cost a claim and a commit every settle time.
            wait = compute_backoff(max(self.settle, HELD_MIN), facts.attempts - 1, held_wait)
            return Decision(Action.DEFER, now + wait, error=TransientError("still open for writing"))
        if facts.error is None and facts.complete:
            return Decision(Action.ARCHIVE)
        error = facts.error or TransientError("; ".join(f"not delivered to {r}: {e}" for r, e in sorted(facts.failed_for)))
        attempt = facts.retries + 1
        own = facts.max_retries             # the sender's MAX-RETRIES, at most the configured
        if own is not None:
            if attempt > min(own, self.max_retries):
                return Decision(Action.FAIL, reason=f"gave up after {attempt} attempts (MAX-RETRIES: {own}): {error}",
                                error=error)
        elif attempt > self.max_retries and now - _since(facts, now) >= self.retry_period:
            return Decision(Action.FAIL, reason=self._gave_up(facts, error), error=error)
        return Decision(Action.RETRY, now + compute_backoff(self.backoff, facts.retries), error=error)

    def archive_again(self, now):
        """When an archive move that failed is tried again."""
        return now + self.backoff

    @staticmethod
    def _gave_up(facts, error):
        return f"gave up after {facts.retries + 1} attempts: {error}" if isinstance(error, TransientError) else str(error)


def _since(facts, now):
    return facts.failing_since if facts.failing_since is not None else now
