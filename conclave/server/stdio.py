"""Newline-delimited JSON-RPC on injectable byte streams; stdin/stdout in production.

stdout is the wire: only protocol messages are written to it. Requests are handled
concurrently, so `ping` and cancellation work during a long call. At stdin EOF the server
stops reading, lets requests already received finish, and exits. No input, however
malformed or large, stops it.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
import orjson

from conclave.config import Config
from conclave.server.core import Server
from conclave.server.jsonrpc import (
    PARSE_ERROR,
    RequestId,
    RpcError,
    decode,
    error_response,
    to_rpc_error,
)
from conclave.server.lifecycle import serving

MAX_LINE_BYTES = 32 * 1024 * 1024
ReadLine = Callable[[int], Awaitable[bytes]]
Write = Callable[[bytes], Awaitable[None]]


async def run_stdio(config: Config) -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer

    async def read_line(limit: int) -> bytes:
        # A blocked read cannot be interrupted; abandoning it lets shutdown proceed.
        return await anyio.to_thread.run_sync(stdin.readline, limit, abandon_on_cancel=True)

    def write_all(data: bytes) -> None:
        stdout.write(data)
        stdout.flush()

    async def write(data: bytes) -> None:
        await anyio.to_thread.run_sync(write_all, data)

    async with serving(config) as server:
        await serve_lines(server, read_line, write)


async def serve_lines(server: Server, read_line: ReadLine, write: Write) -> None:
    """Serve one connection until EOF on `read_line`."""
    lock = anyio.Lock()

    async def send(message: Any) -> None:
        data = orjson.dumps(message) + b"\n"
        async with lock:
            await write(data)

    async def handle(line: bytes) -> None:
        try:
            message = decode(line)
        except RpcError as error:
            await send(error_response(None, error))
            return
        try:
            reply = await server.handle_message(message, send)
            data = None if reply is None else orjson.dumps(reply) + b"\n"
        except Exception as exc:
            # A bug costs this message its reply (a -32603 whose error_id finds the traceback in
            # the event log), never the server: an exception here would end the task group.
            internal = to_rpc_error(exc, method=_method_of(message), telemetry=server.telemetry)
            data = orjson.dumps(error_response(_id_of(message), internal)) + b"\n"
        if data is not None:
            async with lock:
                await write(data)

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


def _method_of(message: Any) -> str:
    method = message.get("method") if isinstance(message, dict) else None
    return method if isinstance(method, str) else "(batch)" if isinstance(message, list) else "(unknown)"


def _id_of(message: Any) -> RequestId:
    found = message.get("id") if isinstance(message, dict) else None
    valid = isinstance(found, str) or (isinstance(found, int) and not isinstance(found, bool))
    return found if valid else None


async def _discard_rest(read_line: ReadLine) -> None:
    while True:
        chunk = await read_line(1 << 20)
        if not chunk or chunk.endswith(b"\n"):
            return
