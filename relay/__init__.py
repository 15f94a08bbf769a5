"""relay: a filesystem outbox relay for teams of agents.

For agents: `Agent(name)` sends, reads, waits and replies (api.py), reserves files (leases.py)
and keeps the team's state (state.py).
For running relay: `load()` a Config, open a Relay on it and `step()`, `drain()` or `run()` it.
What a step did comes back as Counts, a message's state is a Status, and every failure relay
foresees is a RelayError or one of its children. Everything else is inside.
"""
from relay.version import __version__  # noqa: E402,F401

from relay.agent.api import Agent, Project, Received, agents  # noqa: E402
from relay.agent.leases import Reservation  # noqa: E402
from relay.agent.state import StateEntry
from relay.config import Config, load  # noqa: E402
from relay.core.daemon import Relay  # noqa: E402
from relay.errors import (BenchError, ConfigError, DaemonRunning, DeliveryTimeout, DurabilityError, FederationError,  # noqa: E402
                     InvalidName, LedgerCorrupt, LedgerError, LogSyncError, MessageRefused, NotDelivered, NotFound,
                     NotInProject, RelayError, ReservationConflict, SchemaError, StateConflict, StateLost, TooLarge, TransientError,
                     UnknownAgent, UnknownRecipient)
from relay.ledger.ledger import Status  # noqa: E402
from relay.core.work import Counts  # noqa: E402

__all__ = ["__version__", "Agent", "Project", "Received", "agents", "Config", "load", "Relay", "Counts", "Status",
           "RelayError", "ConfigError", "LedgerError", "LedgerCorrupt", "SchemaError", "DaemonRunning",
           "StateLost", "MessageRefused", "TooLarge", "UnknownRecipient", "TransientError", "DurabilityError", "LogSyncError", "InvalidName", "NotFound",
           "NotInProject", "UnknownAgent", "FederationError", "ReservationConflict", "Reservation", "NotDelivered",
           "DeliveryTimeout", "StateConflict", "StateEntry", "BenchError"]
