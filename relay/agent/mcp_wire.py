"""The stdio transport of `relay mcp`: JSON-RPC messages one per line on stdin and stdout, as
the SDK's own stdio transport carries them, with what that one cannot say: whether a reply
reached the client.

- A response is written whole to stdout before `replies.written(id)` is called: the server
  marks read the messages that reply holds only then. A request that ends with no response,
  with an error response or with a tool's error result calls `replies.unanswered(id)`.
- A client that is gone ends the server at once, whatever stdin still does: a write that fails
  (EPIPE: the client closed its end), or stdout reported broken while idle (poll: POLLERR on a
  pipe with no reader, POLLHUP on a closed socket or a hung-up terminal). Then `replies.gone()`
  and ClientGone (a BrokenPipeError: the CLI ends quietly, as any verb whose reader went away).
- stdin is read, and stdout watched, by daemon threads of their own: a read() blocked on a pipe
  the client keeps open does not hold the process once it is done.
- While serving, fd 0 reads /dev/null and fd 1 writes to stderr (as the SDK's transport does),
  so that nothing else the process writes lands on the wire.
"""
import contextlib
import errno
import fcntl
import functools
import os
import select
import threading

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from mcp import types
from mcp.shared.message import ServerMessageMetadata, SessionMessage

from relay.files.fs import write_all


class ClientGone(BrokenPipeError):
    """The client no longer reads what the server writes."""


async def serve(run, replies):
    """Serve over stdin and stdout until stdin ends (return) or the client is gone
    (ClientGone). `run(read_stream, write_stream)` is the server's loop (the SDK's
    `Server.run` without its options); `replies` has `written(id)`, `unanswered(id)` and
    `gone()`, called with the request id as a string."""
    with claimed() as (wire_in, wire_out):
        incoming, read_stream = anyio.create_memory_object_stream(0)
        write_stream, outgoing = anyio.create_memory_object_stream(0)
        failed = []
        token = anyio.lowlevel.current_token()
        async with anyio.create_task_group() as tg:
            def gone(error):
                if not failed:
                    failed.append(error)
                    replies.gone()
                    tg.cancel_scope.cancel()
            tg.start_soon(_write, outgoing, wire_out, replies, gone)
            for target, args in ((_read, (wire_in, incoming, replies, token)), (_watch, (wire_out, gone, token))):
                threading.Thread(target=target, args=args, name=f"relay mcp {target.__name__[1:]}", daemon=True).start()
            async with write_stream:
                await run(read_stream, write_stream)
    if failed:
        raise ClientGone(*failed[0].args)


@contextlib.contextmanager
def claimed():
    """(wire_in, wire_out): private descriptors of the process's stdin and stdout, which point
    at /dev/null and stderr meanwhile. They are never closed: the reading and watching threads
    may still be blocked on them when serving ends."""
    wire_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    wire_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
    finally:
        os.close(null)
    try:
        yield wire_in, wire_out
    finally:
        os.dup2(wire_out, 1)
        os.dup2(wire_in, 0)


def _read(fd, incoming, replies, token):
    """The stdin thread: each line parsed (a line that is no JSON-RPC message goes as the
    error, as the SDK's transport sends it) and handed to the event loop; the end of input (or
    a read that fails) closes the stream. Ends quietly once serving has ended."""
    try:
        try:
            with open(fd, "rb", closefd=False) as lines:
                for line in lines:
                    anyio.from_thread.run(incoming.send, _parsed(line, replies), token=token)
        except OSError:
            pass            # stdin unreadable: taken as its end
        anyio.from_thread.run(incoming.aclose, token=token)
    except (RuntimeError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass                # serving has ended (RunFinishedError is a RuntimeError): nobody reads on


def _parsed(line, replies):
    try:
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError as e:         # pydantic's ValidationError
        return e
    metadata = None
    if isinstance(message, types.JSONRPCRequest):
        metadata = ServerMessageMetadata(on_request_unanswered=functools.partial(_unanswered, replies, str(message.id)))
    return SessionMessage(message, metadata=metadata)


async def _unanswered(replies, key):
    replies.unanswered(key)


def _watch(fd, gone, token):
    """The stdout thread: waits for the client's end to go away (with no event asked for, poll
    reports only POLLERR, POLLHUP and POLLNVAL) and says so to the event loop."""
    poller = select.poll()
    poller.register(fd, 0)
    try:
        while not poller.poll():
            pass
        anyio.from_thread.run_sync(gone, BrokenPipeError(errno.EPIPE, "the client closed its end of stdout"),
                                   token=token)
    except (RuntimeError, OSError):
        pass                # serving has ended (RunFinishedError is a RuntimeError), or no poll here


async def _write(outgoing, fd, replies, gone):
    """Each message whole onto the wire, in order; then, for a response, what the server left
    until its reply was out. A failed write: the client is gone."""
    async with outgoing:
        async for item in outgoing:
            message = item.message
            try:
                await anyio.to_thread.run_sync(_put, fd, message)
            except OSError as e:
                gone(e)
                return
            if isinstance(message, types.JSONRPCResponse) and not _failed_call(message.result):
                await anyio.to_thread.run_sync(replies.written, str(message.id))
            elif isinstance(message, (types.JSONRPCResponse, types.JSONRPCError)):
                replies.unanswered(str(message.id))


def _put(fd, message):
    write_all(fd, message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n")


def _failed_call(result):
    """A tools/call result that is an error (it holds no messages handed over)."""
    return isinstance(result, dict) and result.get("isError") is True
