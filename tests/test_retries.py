"""Retry as a policy (relay/core/retries.py): what becomes of a claimed message after its batch's
delivery, decided from facts alone, without files, a ledger or a clock; and the backoff."""
import pytest

from relay.core.retries import MAX_BACKOFF, Action, Facts, Retries, compute_backoff
from relay.errors import DurabilityError, TransientError

NOW = 1_000_000.0
POLICY = Retries(max_retries=3, retry_period=3600.0, backoff=2.0, settle=0.5)


def test_the_backoff_doubles_from_its_base_and_stops_at_its_cap():
    assert [compute_backoff(2.0, n) for n in range(4)] == [2.0, 4.0, 8.0, 16.0]
    assert compute_backoff(2.0, 20) == MAX_BACKOFF and compute_backoff(1.0, 10**6, cap=7.0) == 7.0


def test_delivered_everywhere_is_archived():
    d = POLICY.decide(Facts(complete=True), NOW)
    assert (d.action, d.error, d.reason) == (Action.ARCHIVE, None, None)
    assert POLICY.archive_again(NOW) == NOW + 2.0       # a failed archive move: tried again then


def test_a_recipient_missed_is_retried_after_a_doubling_backoff_with_who_missed_it():
    missed = (("Ben", TransientError("disk full")), ("Ann", TransientError("busy")))
    first = POLICY.decide(Facts(failed_for=missed), NOW)
    third = POLICY.decide(Facts(failed_for=missed, retries=2), NOW)
    assert (first.action, first.next_attempt_at, third.next_attempt_at) == (Action.RETRY, NOW + 2.0, NOW + 8.0)
    assert str(first.error) == "not delivered to Ann: busy; not delivered to Ben: disk full"


def test_retries_past_max_retries_fail_only_once_retry_period_has_passed():
    error = TransientError("disk full")
    within = POLICY.decide(Facts(error=error, retries=5, failing_since=NOW - 3599), NOW)
    past = POLICY.decide(Facts(error=error, retries=5, failing_since=NOW - 3600), NOW)
    assert within.action is Action.RETRY
    assert (past.action, past.reason) == (Action.FAIL, "gave up after 6 attempts: disk full")
    assert POLICY.decide(Facts(error=error, retries=5), NOW).action is Action.RETRY   # failing since now


def test_the_senders_max_retries_counts_attempts_alone_and_never_exceeds_the_configured():
    error = TransientError("busy")
    assert POLICY.decide(Facts(error=error, retries=0, max_retries=1), NOW).action is Action.RETRY
    d = POLICY.decide(Facts(error=error, retries=1, max_retries=1), NOW)
    assert (d.action, d.reason) == (Action.FAIL, "gave up after 2 attempts (MAX-RETRIES: 1): busy")
    assert POLICY.decide(Facts(error=error, retries=3, max_retries=9), NOW).action is Action.FAIL


@pytest.mark.parametrize("facts, reason", [
    (Facts(refused="not a message", complete=True), "not a message"),
    (Facts(error=DurabilityError("fsync failed")), "fsync failed"),
    (Facts(failed_for=(("Ben", DurabilityError("fsync failed")),), delivered=("Cy", "Ann")),
     "fsync failed; delivered to Ann, Cy"),
    (Facts(failed_for=(("Ben", DurabilityError("fsync failed")),)), "fsync failed; delivered to nobody"),
])
def test_a_refusal_or_a_durability_error_is_refused_at_once_whatever_its_attempts(facts, reason):
    d = POLICY.decide(facts, NOW)
    assert (d.action, d.reason) == (Action.REFUSE, reason)


def test_a_file_held_open_waits_its_settle_time_doubled_per_claim_up_to_the_held_wait():
    waits = [POLICY.decide(Facts(defer=True, held=True, attempts=n), NOW, held_wait=3.0).next_attempt_at - NOW
             for n in (1, 2, 3, 4, 5)]
    assert waits == [0.5, 1.0, 2.0, 3.0, 3.0]
    d = POLICY.decide(Facts(defer=True, held=True), NOW)
    assert (d.action, str(d.error)) == (Action.DEFER, "still open for writing")


def test_a_message_left_for_the_next_batch_is_due_at_once_with_no_error():
    d = POLICY.decide(Facts(defer=True, held=False, attempts=7), NOW)
    assert (d.action, d.next_attempt_at, d.error) == (Action.DEFER, NOW, None)


def test_the_policy_is_read_from_the_configuration(project):
    policy = Retries.of(project.config(max_retries=5, retry_period="1m", retry_backoff="3s", settle="2s"))
    assert (policy.max_retries, policy.retry_period, policy.backoff, policy.settle) == (5, 60.0, 3.0, 2.0)


@pytest.mark.parametrize("retries, action", [(2, Action.RETRY), (3, Action.FAIL)])
def test_max_retries_attempts_after_the_first_are_made_before_a_message_may_fail(retries, action):
    """max_retries 3: the fourth attempt failing (retries 3 before it) is the first that may
    give up, the retry period long passed."""
    error = TransientError("disk full")
    assert POLICY.decide(Facts(error=error, retries=retries, failing_since=NOW - 7200), NOW).action is action
    own = POLICY.decide(Facts(error=error, retries=retries - 1, max_retries=retries), NOW)
    assert own.action is Action.RETRY
    assert POLICY.decide(Facts(error=error, retries=retries, max_retries=retries), NOW).action is Action.FAIL


def test_a_sender_asking_for_no_retry_fails_at_its_first_failed_attempt_and_a_retry_waits_the_backoff():
    error = TransientError("busy")
    d = POLICY.decide(Facts(error=error, retries=0, max_retries=0), NOW)
    assert (d.action, d.reason) == (Action.FAIL, "gave up after 1 attempts (MAX-RETRIES: 0): busy")
    assert [POLICY.decide(Facts(error=error, retries=n), NOW).next_attempt_at - NOW for n in range(3)] == [2.0, 4.0, 8.0]


def test_a_message_every_recipient_holds_whose_batch_met_an_error_is_retried_not_archived():
    error = TransientError("cannot take it into the spool")
    d = POLICY.decide(Facts(complete=True, error=error), NOW)
    assert (d.action, d.next_attempt_at, d.error) == (Action.RETRY, NOW + 2.0, error)
    d = POLICY.decide(Facts(complete=True, error=DurabilityError("EIO")), NOW)
    assert d.action is Action.REFUSE
