"""Errors relay raises. The CLI turns a RelayError into one line on stderr and exit 1."""


class RelayError(Exception):
    """Base of every error relay foresees."""


class ConfigError(RelayError):
    """A configuration key or value is wrong; the message names the key."""


FREE_SPACE = "free some space, then run the command again"


def sqlite_cause(error):
    """'full', 'corrupt', 'locked' or None: what a sqlite3 error means, by its primary result
    code (SQLITE_FULL 13, SQLITE_CORRUPT 11, SQLITE_NOTADB 26, SQLITE_BUSY 5, SQLITE_LOCKED 6),
    else by its text."""
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return {13: "full", 11: "corrupt", 26: "corrupt", 5: "locked", 6: "locked"}.get(code & 0xFF)
    text = str(error).lower()
    if "disk is full" in text:
        return "full"
    if "not a database" in text or "malformed" in text:
        return "corrupt"
    if "locked" in text or "busy" in text:
        return "locked"
    return None


class LedgerError(RelayError):
    """The ledger cannot be opened or used as it is."""

    @staticmethod
    def opening(path, error):
        """The error to raise when SQLite fails while the ledger at `path` is opened."""
        cause = sqlite_cause(error)
        if cause == "corrupt":
            return LedgerCorrupt(path, error)
        if cause == "full":
            return LedgerError(f"cannot open the ledger {path}: the disk holding it (or the temporary "
                               f"directory) is full ({error}); {FREE_SPACE}")
        return LedgerError(f"cannot open the ledger {path}: {error}")


class LedgerCorrupt(LedgerError):
    """The ledger file is not a SQLite database any more, or its pages are damaged."""

    def __init__(self, path, detail):
        super().__init__(
            f"the ledger {path} is damaged ({detail}); the archive and inboxes are intact. To recover, "
            f"with no daemon running: sqlite3 {path} \".recover\" | sqlite3 recovered.sqlite, then move "
            f"recovered.sqlite to {path} and delete {path}-wal and {path}-shm; or restore a backup of it")


class SchemaError(LedgerError):
    """The ledger's schema is newer than this relay, or its migrations do not match."""


class DaemonRunning(RelayError):
    """Another daemon holds the state directory's lock."""

    def __init__(self, pid, lock_path):
        self.pid = pid
        super().__init__(f"another relay (pid {pid}) is running on this state directory ({lock_path})")


class StateLost(RelayError):
    """The daemon's relay.lock or ledger was removed or replaced while it ran."""


class MessageRefused(RelayError):
    """A message can never be delivered as it is (bad format, unknown recipient, too large).

    The reason is written for the human who reads failed/<agent>/<id>--<name>.error.json.
    `parsed` is the Message when the file was readable but its recipients or CWD are refused.
    """

    parsed = None


class TooLarge(MessageRefused):
    """A message whose body is over max_body_bytes: shed for its recipients (`names`, as
    written) with the reason body_size."""

    def __init__(self, reason, limit, observed, names=()):
        super().__init__(reason)
        self.limit, self.observed, self.names = limit, observed, tuple(names)


class UnknownRecipient(MessageRefused):
    """A message naming recipients no known agent has (`names`). With a federation, a name the
    team may still announce waits instead (routes.py: Router.wait_for)."""

    def __init__(self, reason, names=()):
        super().__init__(reason)
        self.names = tuple(names)


class TransientError(RelayError):
    """Delivery failed for a reason that may go away (disk full, permission denied)."""


class BenchError(RelayError, RuntimeError):
    """A benchmark could not measure what it set out to (the daemon under test died, nothing
    arrived); the message says which run and why."""


class DurabilityError(RelayError):
    """An fsync failed: the data may not be on disk. Never retried into success."""


class LogSyncError(DurabilityError):
    """The sync of the ledger's log failed: a commit made without a sync (the claim) may not be
    on disk, and nothing may depend on it. The step fails; recovery decides, as for a synced
    commit that failed."""


class InvalidName(RelayError):
    """An agent name given on the command line is not a valid agent name, or not allowed there."""


class FederationError(RelayError):
    """The federation cannot work as configured (the redis package missing, the server refusing)."""


class NotFound(RelayError):
    """A message id or agent the user named does not exist."""


class NotInProject(RelayError):
    """No state directory in the current directory or any parent (and no --root), or the
    nearest one belongs to another user (`foreign`: the directory holding it)."""
    foreign = None


class UnknownAgent(RelayError):
    """A name that is no known agent, where relay can say so before writing anything."""


class ReservationConflict(RelayError):
    """A file reservation refused, nothing reserved: paths another agent holds. `conflicts`:
    one dict per path and lease in the way (path, holder, held: its pattern, exclusive, reason,
    since, expires_at)."""

    def __init__(self, message, conflicts=()):
        super().__init__(message)
        self.conflicts = list(conflicts)


class NotDelivered(RelayError):
    """A message sent with `wait_delivered` did not reach every recipient: it failed (or was
    shed, or refused by another node) with `reason`; `timed_out` when the time ran out first."""
    timed_out = False

    def __init__(self, message_id, reason):
        super().__init__(f"{message_id} was not delivered: {reason}")
        self.message_id, self.reason = message_id, reason


class DeliveryTimeout(NotDelivered):
    """The wait for a message's delivery ran out of time (`reason` says where it stands)."""
    timed_out = True

    def __init__(self, message_id, reason, waited):
        RelayError.__init__(self, f"{message_id} was not delivered to every recipient in {waited}: {reason}")
        self.message_id, self.reason = message_id, reason


class StateConflict(RelayError):
    """A change of the team state refused, nothing changed: the key's value is not what the
    compare-and-set expected. `key`; `expected`: the version asked for, or None for "absent";
    `current`: the key's StateEntry now (value, version, updated_at, updated_by), None when it
    has no value."""

    def __init__(self, message, key, expected=None, current=None):
        super().__init__(message)
        self.key, self.expected, self.current = key, expected, current
