"""What agents use: the Python API (api.py: Project, Agent, send, inbox, wait), file
reservations (leases.py: reserve, release, reservations; guard.py: the git pre-commit guard),
waiting for mail (mail.py), the MCP server and its stdio transport (mcp_server.py, mcp_wire.py;
the `mcp` extra) and `relay adopt`'s instructions for an agent's file (adopt.py)."""
