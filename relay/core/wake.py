"""The [wake] of relay.toml: relay wakes an agent itself by typing one notice line into its tmux
pane, for a client that has no hook of its own to learn of its mail (docs/agents.md, "Waking
agents").

    [wake]
    tmux = "agents:{agent}"        # the pane's tmux target, {agent} the recipient's name
    socket = "/tmp/tmux-1000/default"   # optional: the tmux server's socket (tmux -S)

- Once per batch and agent: a batch that delivers five messages to Bob types one line into Bob's
  pane, naming how many there are and the newest's id and sender (ids and names only: a subject
  is the sender's text and is never typed into a terminal).
- Off the delivery path: each line is a job of the on_deliver runner's workers (hooks.py), queued
  once the batch's record is durable, within WAKE_TIMEOUT; it neither delays nor fails a delivery.
- A tmux that is not installed is logged once (at start or reload) and nothing is queued; a pane
  or server that is not there is logged once per target, and again only after a wake of that
  target worked in between. Never for System's inbox.
"""
import logging
import shutil

from relay.config import SYSTEM
from relay.core.hooks import Delivery, plain
from relay.files.fs import shown

log = logging.getLogger(__name__)

WAKE_TIMEOUT = 5.0      # seconds one tmux command may take


def notice(agent, count, newest, sender):
    """The line typed into the agent's pane."""
    what = "a new message" if count == 1 else f"{count} new messages"
    return f"relay: {what} for {agent} (newest {newest} from {sender}); read them with: relay inbox {agent}"


def tmux_argv(tmux, socket, target, text):
    """One tmux call that types `text` literally into `target`, then Enter."""
    base = [tmux, *(["-S", socket] if socket else [])]
    return (*base, "send-keys", "-t", target, "-l", text, ";", "send-keys", "-t", target, "Enter")


class Wake:
    """The [wake] of one relay: `delivered(works)` on the loop's thread, after hooks.delivered.
    `runner`: what runs the lines off the delivery path (the relay's Hooks, or a seam: anything
    with fire(delivery, command=, timeout=, report=)); `which` finds the tmux program."""

    def __init__(self, config, runner, which=shutil.which):
        self.runner = runner
        self.which = which
        self.failing = set()        # targets whose failure was logged, until one works again
        self.woken = self.failed = 0
        self.configure(config)

    def configure(self, config):
        """Take `config.wake` (start, SIGHUP); a tmux not installed is said once here."""
        self.config = config.wake
        self.tmux = None
        if self.config is not None and self.config.tmux:
            self.tmux = self.which("tmux")
            if self.tmux is None:
                log.warning("[wake] names a tmux target, but tmux is not installed (not on PATH): no agent is "
                            "woken through tmux")

    def delivered(self, works):
        """Queue one line for each agent this batch delivered to; returns how many were queued."""
        if self.tmux is None:
            return 0
        newest = {}
        try:
            for w in works:
                for r in w.delivered_now:
                    if r != SYSTEM:
                        count = newest[r][0] + 1 if r in newest else 1
                        newest[r] = (count, w)
            queued = 0
            for agent, (count, w) in newest.items():
                target = self.config.tmux.replace("{agent}", agent)
                text = notice(agent, count, w.id, plain(w.sender))
                d = Delivery(w.id, w.sender, agent, "", plain(getattr(w.message, "subject", None)),
                             plain(getattr(w.message, "thread", None)), plain(getattr(w.message, "kind", None)))
                queued += bool(self.runner.fire(d, command=tmux_argv(self.tmux, self.config.socket, target, text),
                                                timeout=WAKE_TIMEOUT, report=self.report))
            return queued
        except Exception:  # noqa: BLE001 - the deliveries are recorded: nothing here may fail the step
            log.exception("[wake]: the lines of this batch not queued")
            return 0

    def report(self, run, tail, ended, timeout, took):
        """How one line went (on a worker's thread): a failure logged once per target."""
        d, code = run.delivery, run.proc.returncode
        target = self.config.tmux.replace("{agent}", d.recipient) if self.config and self.config.tmux else "?"
        if ended and code == 0:
            self.woken += 1
            if target in self.failing:
                self.failing.discard(target)
                log.info("[wake]: tmux target %s is woken again", target)
            return
        self.failed += 1
        if target in self.failing:
            log.debug("[wake]: %s not woken (again)", target)
            return
        self.failing.add(target)
        output = shown(bytes(tail).decode("utf-8", "replace").strip()) or "(none)"
        why = f"took longer than {timeout:g}s" if not ended else f"tmux exited with status {code}"
        log.warning("[wake]: could not type into tmux target %s for %s (%s): %s; logged once until it works",
                    target, d.recipient, why, output)
