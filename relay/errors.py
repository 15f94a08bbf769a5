"""Errors relay raises. The CLI turns a RelayError into one line on stderr and exit 1."""


class RelayError(Exception):
    """Base of every error relay foresees."""


class ConfigError(RelayError):
    """A configuration key or value is wrong; the message names the key."""


class LedgerError(RelayError):
    """The ledger cannot be opened or used as it is."""


class SchemaError(LedgerError):
    """The ledger's schema is newer than this relay, or its migrations do not match."""


class DaemonRunning(RelayError):
    """Another daemon holds the state directory's lock."""

    def __init__(self, pid, lock_path):
        self.pid = pid
        super().__init__(f"another relay (pid {pid}) is running on this state directory ({lock_path})")


class MessageRefused(RelayError):
    """A message can never be delivered as it is (bad format, unknown recipient, too large).

    The reason is written for the human who reads failed/<agent>/<id>--<name>.error.json.
    """


class TransientError(RelayError):
    """Delivery failed for a reason that may go away (disk full, permission denied)."""


class DurabilityError(RelayError):
    """An fsync failed: the data may not be on disk. Never retried into success."""


class InvalidName(RelayError):
    """An agent name given on the command line is not a valid agent name, or not allowed there."""


class NotFound(RelayError):
    """A message id or agent the user named does not exist."""
