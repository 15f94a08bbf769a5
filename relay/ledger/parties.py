"""Who may see a message: the one rule every read an agent makes goes through.

An agent sees the messages it sent and those it received (a delivery to it is recorded): the
shell's read, search and show run as an agent, Agent's read, find, search and thread, and the
MCP tools built on them all ask the ledger through `party()`. A read without an agent (the
operator's: audit, show, Project's reads) sees every message.
"""

# true for a row `{m}` of messages that the agent (the two ? ) sent or received
PARTY = "({m}.sender = ? OR EXISTS (SELECT 1 FROM deliveries p WHERE p.message_id = {m}.id AND p.recipient = ?))"


def party(agent, alias="m"):
    """(an SQL condition on the messages row named `alias`, its arguments): the messages `agent`
    sent or received; ("1", []) when `agent` is None (an operator's read: every message)."""
    if agent is None:
        return "1", []
    return PARTY.format(m=alias), [agent, agent]


def hidden(mid, agent):
    """The words of a refusal of a message `agent` was not party to: the same as for a message
    that is not there, so that a refusal does not say it exists."""
    return f"no message {mid!r} that {agent} sent or received"
