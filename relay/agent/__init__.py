"""What agents use: the Python API (api.py: Agent: send, inbox, wait, read, mark_read, search;
project.py: Project, Received, agents' names), file reservations (leases.py: reserve, release,
reservations; guard.py: the git pre-commit guard), the team state (state.py: state_get, state_set,
state_delete, state_list), waiting for mail (mail.py), the MCP server,
its hand-off and its stdio transport (mcp_server.py, mcp_handover.py, mcp_wire.py; the `mcp`
extra), `relay adopt`'s instructions for the agents' files (adopt.py; their text:
instructions.py) and Claude Code's hooks (claude_hooks.py: what `relay hook claude` answers;
claude_settings.py: installing them)."""
