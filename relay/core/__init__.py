"""The delivery pipeline: the Relay (daemon.py: step, drain, the batch's claim, custody, delivery
and record), the outbox's scan and custody (outbox.py, readahead.py), message parsing
(message.py), the Maildir inboxes (inbox.py), notices from System written into one inbox
(notices.py), the archive and quarantine (archive.py), crash recovery (recovery.py), retention
(retention.py), flow control (flow.py), ids chosen by senders (identity.py), on_deliver hooks
(hooks.py) and the [wake]'s tmux line on their workers (wake.py), the attestation of durability (health.py), the watcher and the loop that drives the
steps (watcher.py, loop.py, waker.py), and the routes the federation's directory gives the loop
(routes.py)."""
