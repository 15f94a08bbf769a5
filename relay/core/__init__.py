"""The delivery pipeline: the Relay (daemon.py: step, drain, run), which holds its parts: the
intake (intake.py: hints and rescans), the batch's claim, reading, delivery, settling and record
(pipeline.py, reading.py, settle.py; what is recorded: work.py's frozen Claim and Message, and the
ledger's outcome records), the retry policy (retries.py), the schedule (schedule.py),
the outbox's scan and custody (outbox.py, readahead.py), message parsing
(message.py), the Maildir inboxes (inbox.py), notices from System written into one inbox
(notices.py), the archive and quarantine (archive.py), crash recovery (recovery.py), retention
(retention.py), flow control (flow.py), ids chosen by senders (identity.py), on_deliver hooks
(hooks.py) and the [wake]'s tmux line on their workers (wake.py), the attestation of durability (health.py), the watcher and the loop that drives the
steps (watcher.py, loop.py, waker.py), and the federation's one seam (routes.py: the Router, or Alone on one machine)."""
