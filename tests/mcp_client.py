"""For the tests of `relay mcp`: the MCP SDK's own stdio client on the server as a subprocess,
and what a process watches with inotify (so a test knows a waiter is waiting without sleeping)."""
import contextlib
import os
import re
import sys
import time
from pathlib import Path

import anyio
import pytest

import relay


class ToolFailed(Exception):
    """A tool call that came back as a tool error; its text is the message."""


class Client:
    def __init__(self, session):
        self.session = session

    async def call(self, tool, **arguments):
        """The tool's structured result, or ToolFailed with the error's text."""
        result = await self.session.call_tool(tool, arguments)
        if result.is_error:
            raise ToolFailed(" ".join(c.text for c in result.content))
        return result.structured_content

    async def tools(self):
        return {t.name: t for t in (await self.session.list_tools()).tools}


@contextlib.asynccontextmanager
async def serve(root, agent, errlog, **session):
    """`relay mcp --agent AGENT --root ROOT` through the SDK's stdio client; its stderr goes to
    the open file `errlog`. `session`: the ClientSession's keywords (message_handler, client_info,
    notification_bindings, ...)."""
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, get_default_environment, stdio_client
    # The SDK hands the server a few safe variables only: the relay under test (the package this
    # process imported, wherever it lies) is named to it by PYTHONPATH.
    env = {**get_default_environment(), "PYTHONPATH": str(Path(relay.__file__).parent.parent)}
    params = StdioServerParameters(command=sys.executable, cwd=str(root), env=env,
                                   args=["-m", "relay", "mcp", "--agent", agent, "--root", str(root)])
    async with stdio_client(params, errlog=errlog) as (read, write):
        async with ClientSession(read, write, **session) as client:
            await client.initialize()
            yield Client(client)


def children():
    """The pids of this process's children."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            after = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(after[1]) == os.getpid():
            out.append(int(stat.parent.name))
    return out


def server_pid():
    """The pid of the one `relay mcp` this process started."""
    found = [p for p in children() if b"\0mcp\0" in _cmdline(p)]
    assert len(found) == 1, found
    return found[0]


def _cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def watches(pid, directory):
    """How many inotify watches process `pid` holds on `directory` (its fdinfo names the inode)."""
    ino = format(os.stat(directory).st_ino, "x")
    try:
        infos = list(Path(f"/proc/{pid}/fdinfo").iterdir())
    except OSError:
        return 0
    count = 0
    for info in infos:
        try:
            text = info.read_text()
        except OSError:
            continue
        count += len(re.findall(rf"^inotify wd:\S+ ino:{ino} ", text, re.M))
    return count


def watching(pid, directory):
    return watches(pid, directory) > 0


def until(check, what, seconds=20):
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.005)


def deliver(project, agents=("Alice", "Bob")):
    """One relay pass over the project (files just written are past their settle time)."""
    project.clock.now = max(project.clock.now, time.time() + 10)
    r = project.relay(agents=agents)
    total = r.drain()
    r.close()
    project.relays.remove(r)
    return total


async def until_async(check, what, seconds=20):
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        await anyio.sleep(0.005)


@pytest.fixture
def team(cli, project):
    """Alice and Bob; `team.agent(name)` is a relay.Agent closed after the test."""
    cli("init", "--agent", "Alice", "--agent", "Bob")
    made = []

    def agent(name):
        made.append(relay.Agent(name, root=project.root))
        return made[-1]
    project.agent = agent
    yield project
    for a in made:
        a.layout.close()
