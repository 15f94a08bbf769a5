"""What agents use: the Python API (api.py: Agent: send, inbox, wait, read, mark_read; project.py:
Project, Received, agents' names), waiting for mail (mail.py), the MCP server, its hand-off and its
stdio transport (mcp_server.py, mcp_handover.py, mcp_wire.py; the `mcp` extra) and `relay adopt`'s
instructions for an agent's file (adopt.py)."""
