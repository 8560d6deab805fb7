"""Newline-delimited JSON-RPC on injectable byte streams; stdin/stdout in production.

stdout is the wire: only protocol messages are written to it. Requests are handled
concurrently, so `ping` and cancellation work during a long call. At stdin EOF the server
stops reading, lets requests already received finish, and exits. No input, however
malformed or large, stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
import orjson

from conclave.app.server.core import Server
from conclave.app.server.jsonrpc import (
    PARSE_ERROR,
    RpcError,
    decode,
    error_response,
    request_id_of,
    to_rpc_error,
)
from conclave.app.server.lifecycle import serving
from conclave.schema.config import Config

MAX_LINE_BYTES = 32 * 1024 * 1024
ReadLine = Callable[[int], Awaitable[bytes]]
Write = Callable[[bytes], Awaitable[None]]


async def run_stdio(config: Config) -> None:
    async with _standard_streams() as (read_line, write), serving(config) as server:
        with anyio.CancelScope() as serving_scope:

            async def write_or_stop(data: bytes) -> None:
                try:
                    await write(data)
                except (BrokenPipeError, ConnectionResetError):
                    # The client closed its end of stdout: nobody is left to answer. Stop serving
                    # (the runtime closes as usual) instead of ending in a traceback.
                    if not serving_scope.cancel_called:
                        print("conclave serve: the client stopped reading replies; stopping", file=sys.stderr)
                        serving_scope.cancel()

            await serve_lines(server, read_line, write_or_stop)


@contextlib.asynccontextmanager
async def _standard_streams() -> AsyncIterator[tuple[ReadLine, Write]]:
    """stdin and stdout as `read_line` / `write`. Pipes (how MCP clients run a server) are read
    and written on the event loop; anything else (a terminal, a file) through worker threads,
    since a pipe transport would switch a shared terminal to non-blocking mode. The event loop
    is the usual path because the thread path hands every request over between threads twice."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    if _is_pipe(stdin) and _is_pipe(stdout):
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=MAX_LINE_BYTES + 1, loop=loop)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), stdin)
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, stdout)
        writer = asyncio.StreamWriter(transport, protocol, None, loop)
        try:
            yield _pipe_reader(reader), _pipe_writer(writer)
        finally:
            writer.close()
        return

    async def read_line(limit: int) -> bytes:
        # A blocked read cannot be interrupted; abandoning it lets shutdown proceed.
        return await anyio.to_thread.run_sync(stdin.readline, limit, abandon_on_cancel=True)

    def write_all(data: bytes) -> None:
        stdout.write(data)
        stdout.flush()

    async def write(data: bytes) -> None:
        await anyio.to_thread.run_sync(write_all, data)

    yield read_line, write


def _is_pipe(stream: Any) -> bool:
    try:
        mode = os.fstat(stream.fileno()).st_mode
    except (OSError, ValueError, AttributeError):
        return False  # no descriptor (a test's replacement stream): the thread path handles it
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _pipe_reader(reader: asyncio.StreamReader) -> ReadLine:
    async def read_line(limit: int) -> bytes:
        """A line with its newline, whole up to MAX_LINE_BYTES (the reader's own cap); of a line
        longer than that, a chunk of at most `limit` bytes without a newline, the rest coming
        on the next calls; b"" at end of input. `serve_lines` relies on no more than that."""
        try:
            return await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as end:
            return end.partial  # the last line had no newline; b"" once nothing is left
        except asyncio.LimitOverrunError as over:
            return await reader.read(max(min(over.consumed, limit), 1))

    return read_line


def _pipe_writer(writer: asyncio.StreamWriter) -> Write:
    async def write(data: bytes) -> None:
        writer.write(data)
        await writer.drain()  # a client that stops reading slows us down instead of growing a buffer

    return write


async def serve_lines(server: Server, read_line: ReadLine, write: Write) -> None:
    """Serve one connection until EOF on `read_line`."""
    # Uncontended (the usual case), the lock is taken without a trip round the event loop:
    # `drain()` already yields to a slow reader.
    lock = anyio.Lock(fast_acquire=True)

    async def write_line(data: bytes) -> None:
        async with lock:
            await write(data)

    async def send(message: Any) -> None:
        await write_line(_line(message))

    async def handle(line: bytes) -> None:
        try:
            message = decode(line)
        except RpcError as error:
            await send(error_response(None, error))
            return
        try:
            reply = await server.handle_message(message, send)
            data = None if reply is None else _line(reply)
        except Exception as exc:
            # A bug costs this message its reply (a -32603 whose error_id finds the traceback in
            # the event log), never the server: an exception here would end the task group.
            internal = to_rpc_error(exc, method=_method_of(message), telemetry=server.telemetry)
            data = _line(error_response(request_id_of(message), internal))
        if data is not None:
            await write_line(data)

    async with anyio.create_task_group() as group:
        while True:
            line = await read_line(MAX_LINE_BYTES + 1)
            if not line:
                break
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                await _discard_rest(read_line)
                await send(
                    error_response(
                        None, RpcError(PARSE_ERROR, f"Parse error: message over {MAX_LINE_BYTES} bytes")
                    )
                )
                continue
            if line.strip():
                group.start_soon(handle, line)


def _line(message: Any) -> bytes:
    """One reply line; orjson appends the newline itself, so a long reply is not copied again."""
    return orjson.dumps(message, option=orjson.OPT_APPEND_NEWLINE)


def _method_of(message: Any) -> str:
    method = message.get("method") if isinstance(message, dict) else None
    return method if isinstance(method, str) else "(batch)" if isinstance(message, list) else "(unknown)"


async def _discard_rest(read_line: ReadLine) -> None:
    while True:
        chunk = await read_line(1 << 20)
        if not chunk or chunk.endswith(b"\n"):
            return
