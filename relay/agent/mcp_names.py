"""The names of `relay mcp`'s tools, in the order it lists them: the server's tool table
(mcp_server.Tools serves exactly these) and the adopt text (instructions.py) both read it here,
without importing the MCP SDK, so the text cannot name fewer tools than the server has."""

TOOLS = ("send", "reply", "inbox", "wait", "read", "mark_read", "agents", "spawn", "release_agent", "thread",
         "search", "reserve", "release", "reservations", "receipts", "acknowledge")
