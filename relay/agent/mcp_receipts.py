"""The MCP tools of receipts and acknowledgements (mixed into mcp_server.Tools):

    receipts(id, wait_for?, wait_s?)  each recipient's steps of a message the agent sent
                        (delivered, surfaced, read, acknowledged, with their times); with
                        wait_for "read" or "acked", once every recipient has reached it
    acknowledge(id, note?)  acknowledge a message of the inbox (marks it read); the note goes
                        back to its sender as a reply in the thread

Only the sender sees a message's receipts (docs/agents.md "What an agent sees")."""
from typing import Annotated, Literal, Optional

from pydantic import Field
from typing_extensions import TypedDict

from relay.agent.mcp_handover import bounded, tool_errors
from relay.agent.receipts import wait_step

MAX_WAIT = 600.0
Step = Literal["read", "acked"]


class Receipt(TypedDict):
    recipient: str
    delivered_at: Optional[str]
    surfaced_at: Optional[str]      # given to the agent (a hook, MCP, the API, relay inbox)
    read_at: Optional[str]          # moved to cur/ (by relay or any Maildir client)
    acked_at: Optional[str]
    note: Optional[str]
    reply_id: Optional[str]         # the reply that carried the note


class Receipts(TypedDict):
    id: str
    status: str                     # the ledger's (outbox while relay has not taken it)
    priority: Optional[str]
    ack_required: Optional[bool]
    recipients: list[Receipt]
    done: Optional[bool]            # with wait_for: every recipient reached it (false: it failed, see error)
    error: Optional[str]
    timed_out: bool


class Acknowledged(TypedDict):
    id: str
    acked: bool                     # false: acknowledged before (nothing sent again)
    reply_id: Optional[str]


class ReceiptTools:
    """receipts and acknowledge, on the Tools' `me()` (a fresh Agent per call)."""

    def receipts(self, id: Annotated[str, Field(description="The id of a message you sent (or a unique start of it).")],
                 wait_for: Annotated[Optional[Step], Field(description="Wait until every recipient has `read` it "
                                                           "or `acked` (acknowledged) it.")] = None,
                 wait_s: Annotated[Optional[float], Field(description=(
                     f"With wait_for: wait up to this many seconds (0 to {MAX_WAIT:g}; more is taken as the most); "
                     "`timed_out` when the time ran out first."))] = None) -> Receipts:
        """What became of a message you sent, per recipient: delivered, surfaced (given to the
        agent), read and acknowledged, each with its time (null: not yet). With wait_for, returns
        once every recipient has reached that step (`done` true), it failed (`done` false,
        `error`), or wait_s ran out (`timed_out`). Marks nothing read."""
        wait = None if wait_s is None else bounded(wait_s, "wait_s", 0, MAX_WAIT)
        with self.me() as agent, tool_errors():
            agent.receipts(id)                  # yours, or refused before any wait
            out = {"done": None, "error": None, "timed_out": False}
            if wait_for is not None:
                done, reason = wait_step(agent.project, id, wait_for, wait if wait is not None else 0)
                out.update(done=done, timed_out=done is None, error=reason if done is False else None)
            return agent.receipts(id) | out

    def acknowledge(self, id: Annotated[str, Field(description="The id of a message of your inbox (or a unique "
                                                   "start of it).")],
                    note: Annotated[Optional[str], Field(description="A note for the sender: it goes back as a "
                                                         "reply in the message's thread.")] = None) -> Acknowledged:
        """Acknowledge a message you received (its sender asked with ACK: required, or not): its
        sender sees it in the receipts; `note` goes back to the sender as a reply in the thread.
        Marks the message read."""
        with self.me() as agent, tool_errors():
            return agent.ack_message(id, note=note)
