"""Streamed answers: server-sent events in, the plain answer out, deltas on the way.

Each wire kind has an `Assembler` (in its own module, next to its adapter) that reads the
wire's events one by one and rebuilds the body the same answer would have had as a plain,
non-streamed call. The client then parses that body with the adapter's ordinary `parse()`: a
streamed answer is the plain answer by construction (status, text, model, usage, tool calls and
what is echoed back), and the only code that differs between the two paths is the rebuilding.
Along the way an assembler reports `Delta`s (new text, thinking, tool-call arguments), which the
client hands to the call's listener: the terminal, MCP progress, an HTTP stream; never the event
log.

The events themselves are parsed by httpx-sse (`EventSource`), from the transport's chunks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

import httpx
from httpx_sse import EventSource, ServerSentEvent

from conclave.core.messages import Delta, DeltaListener
from conclave.net.http import Streamed

__all__ = ["Assembler", "Delta", "DeltaListener", "StreamFailed", "events"]


class StreamFailed(Exception):
    """The provider reported an error inside a stream that had started with HTTP 200: `body` is
    the error as the wire gives it (mapped like an error response of HTTP `status`)."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"in-stream error (as HTTP {status})")
        self.status = status
        self.body = body


class Assembler(Protocol):
    """One streamed answer being rebuilt. `feed` takes each event in order and returns the deltas
    it carries (raising `StreamFailed` for an in-stream error); `complete` says whether the
    stream has said all it will (a stream that ends before is cut, and retried); `body` is the
    plain body, for the adapter's `parse()`."""

    def feed(self, event: str, data: str) -> list[Delta]: ...

    @property
    def complete(self) -> bool: ...

    def body(self) -> dict[str, Any]: ...


async def events(streamed: Streamed) -> AsyncIterator[ServerSentEvent]:
    """The server-sent events of a streamed answer, as they arrive (comments and keep-alives
    skipped by the parser)."""
    response = httpx.Response(streamed.status, headers=dict(streamed.headers), content=streamed.chunks())
    async for event in EventSource(response).aiter_sse():
        yield event
