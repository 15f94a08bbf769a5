"""relay: a filesystem outbox relay for teams of agents."""
__version__ = "0.1.0"

from .config import Config, load  # noqa: E402
from .daemon import Counts, Relay  # noqa: E402
from .errors import RelayError  # noqa: E402
from .ledger import Ledger, Status  # noqa: E402
from .message import Message, parse  # noqa: E402

__all__ = ["Config", "Counts", "Ledger", "Message", "Relay", "RelayError", "Status", "load", "parse", "__version__"]
