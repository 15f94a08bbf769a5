"""The shapes of what the MCP server's tools (mcp_server.py) return, as the SDK publishes them
in each tool's output schema."""
from typing import Optional

from typing_extensions import TypedDict     # pydantic reads typing's only from Python 3.12


# A message as the inbox and wait tools return it (`from` is a Python keyword: functional form).
Message = TypedDict("Message", {
    "id": str, "from": Optional[str], "to": list[str], "kind": Optional[str], "thread": Optional[str],
    "subject": Optional[str], "body": str, "sent_at": Optional[str], "relayed_at": Optional[str],
    "headers": dict[str, str], "read": bool,        # read: it was marked read before this call
    "priority": str, "ack_required": bool})         # urgent first; acknowledge(id) when ack_required


class Unreadable(TypedDict):
    id: str
    error: str


class Messages(TypedDict):
    messages: list[Message]
    more: int                   # new messages left in the inbox past those returned (not read yet)
    unreadable: list[Unreadable]    # envelopes relay cannot read met on the way: never marked read
    timed_out: bool             # wait only: the time ran out with no new message
    recent: list[Message]       # inbox(recent=N): the newest messages read already, oldest first


class MarkedRead(TypedDict):
    marked: list[str]           # the ids marked read now
    already: list[str]          # the ids that were read already


class Inactive(TypedDict):
    name: str
    released_at: str | None
    released_by: str | None


class Sent(TypedDict):
    id: str
    repeated: bool              # the request id was used before: nothing was sent, `id` is the first's
    released: list[Inactive]    # recipients named that a release made inactive: delivered all the same
    relay_running: bool         # false: the message waits in the outbox until `relay run`
    delivered: Optional[bool]   # with wait_delivered_s: every recipient has it (false: it failed, see error)
    error: Optional[str]        # why it was not delivered (failed, shed, refused by a node)
    timed_out: bool             # with wait_delivered_s: the time ran out first


Found = TypedDict("Found", {
    "id": str, "from": Optional[str], "to": list[str], "kind": Optional[str], "thread": Optional[str],
    "subject": Optional[str], "snippet": Optional[str], "sent_at": Optional[str], "status": Optional[str]})


class Results(TypedDict):
    results: list[Found]


class Known(TypedDict):
    name: str
    me: bool                    # this is the caller
    state: str                  # "active", or "inactive" once a release named it (a spawn makes it active again)
    metadata: dict              # what its last spawn said (cli, cwd, model, task, spawned_by, ...); {} when never spawned
    spawned_at: str | None
    spawned_by: str | None
    released_at: str | None
    released_by: str | None


class Agents(TypedDict):
    me: str
    agents: list[Known]


ThreadMessage = TypedDict("ThreadMessage", {
    "id": str, "from": Optional[str], "to": list[str], "kind": Optional[str], "thread": Optional[str],
    "subject": Optional[str], "body": Optional[str], "sent_at": Optional[str], "status": str,
    "delivered_at": Optional[str], "error": Optional[str]})


class Thread(TypedDict):
    thread: str
    messages: list[ThreadMessage]
    more: int                   # earlier messages of the thread left out by the limit


class Lease(TypedDict):
    agent: str
    path: str                   # normalised, relative to the project root
    scope: str                  # "file", "tree" (it and all under it) or "glob" (what it matches)
    exclusive: bool
    reason: Optional[str]
    since: str
    expires_at: str
    expires_in_s: float


class Leases(TypedDict):
    reservations: list[Lease]


class Released(TypedDict):
    released: list[str]
    not_held: list[str]
