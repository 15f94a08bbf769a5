"""What agents use: the Python API (api.py: Project, Agent, send, inbox, wait), waiting for mail
(mail.py), the MCP server and its stdio transport (mcp_server.py, mcp_wire.py; the `mcp` extra)
and `relay adopt`'s instructions for an agent's file (adopt.py)."""
