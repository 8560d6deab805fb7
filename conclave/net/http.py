"""HTTP plumbing: Conclave's one transport seam, its two implementations, and the shared client.

Every request Conclave sends (provider calls and fetches) goes through a `Transport`:

- `AiohttpTransport`, the production one: one aiohttp session per process. httpx's own
  connection pool collapses under hundreds of concurrent requests on a small machine; aiohttp's
  does not. It is the only code that sees aiohttp's exceptions: every failure to get an HTTP
  answer leaves it as a `TransportError` naming what happened, and nothing above maps a
  foreign exception again.
- `MemoryTransport`, the test double: answers from a function in this process, so tests and
  benchmarks drive the same provider client, retry loop and fetch tool as production, down to
  this seam.

A plain provider call reads a whole JSON body, so it uses `exchange()`: plain values in, plain
values out, no request or response objects. A streamed provider call reads server-sent events as
they arrive through `stream()` (conclave/providers/streaming.py), and so does the fetch tool (its
byte caps hold while reading), through the shared `httpx.AsyncClient` that `make_http_client`
builds over the same transport.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, Protocol

import aiohttp
import anyio
import httpx

if TYPE_CHECKING:
    from aiohttp.client import _RequestContextManager

TransportFailure = Literal["timeout", "connection_error", "connection_dropped"]
# Response headers, looked up without regard to case. aiohttp decodes them as UTF-8 with
# `surrogateescape` (so no byte is lost): read a value that leaves the process through
# `providers.base.header_text`, since JSON cannot carry a lone surrogate.
ResponseHeaders = Mapping[str, str]
RequestHeaders = Mapping[str, str] | Sequence[tuple[str, str]]


class TransportError(Exception):
    """No HTTP answer: the connection could not be made (`connection_error`), broke before the
    answer was whole (`connection_dropped`), or a socket timer ran out (`timeout`)."""

    def __init__(self, message: str, *, failure: TransportFailure) -> None:
        super().__init__(message)
        self.failure = failure


class Streamed(Protocol):
    """An answer whose body is read as it arrives."""

    status: int
    headers: ResponseHeaders

    def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they come, as sent (no content decoding)."""


class Transport(Protocol):
    """Sends requests. Besides `TransportError`, `exchange` raises the builtin `TimeoutError`
    when its `total` runs out; `connect` and `read` are socket timers (a `TransportError` with
    failure `timeout`). `server_hostname` is the TLS name when `url` names an address."""

    async def exchange(
        self,
        method: str,
        url: str,
        headers: RequestHeaders,
        body: bytes,
        *,
        total: float | None = None,
        connect: float | None = None,
        read: float | None = None,
        server_hostname: str | None = None,
    ) -> tuple[int, ResponseHeaders, bytes]:
        """Send one request and read the whole answer: (status, headers, body)."""

    def stream(
        self,
        method: str,
        url: str,
        headers: RequestHeaders,
        body: bytes,
        *,
        connect: float | None = None,
        read: float | None = None,
        server_hostname: str | None = None,
    ) -> contextlib.AbstractAsyncContextManager[Streamed]:
        """Send one request; the answer's body is read inside the block, and what is left
        unread when the block ends is dropped with its connection."""

    async def aclose(self) -> None: ...


class AiohttpTransport:
    """The production transport: one aiohttp session, opened on the first request."""

    def __init__(self, *, max_connections: int = 1000, keepalive_seconds: float = 30.0) -> None:
        self._max_connections = max_connections
        self._keepalive = keepalive_seconds
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        # Made on first use, inside the running event loop aiohttp binds it to.
        connector = aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=self._keepalive)
        # No skip_auto_headers: the adapters name the client themselves (base.JSON_HEADERS), and
        # skipping a header costs a header set and a larger request object per call. No
        # decompression: a fetch decodes gzip itself, within its byte cap.
        self._session = aiohttp.ClientSession(connector=connector, trust_env=False, auto_decompress=False)
        return self._session

    async def exchange(
        self,
        method: str,
        url: str,
        headers: RequestHeaders,
        body: bytes,
        *,
        total: float | None = None,
        connect: float | None = None,
        read: float | None = None,
        server_hostname: str | None = None,
    ) -> tuple[int, ResponseHeaders, bytes]:
        timeout = _timeout(total, connect, read)
        try:
            async with self._request(method, url, headers, body, timeout, server_hostname) as response:
                return response.status, response.headers, await response.read()
        except aiohttp.ClientError as exc:
            raise _transport_error(exc) from exc

    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: str,
        url: str,
        headers: RequestHeaders,
        body: bytes,
        *,
        connect: float | None = None,
        read: float | None = None,
        server_hostname: str | None = None,
    ) -> AsyncIterator[Streamed]:
        timeout = _timeout(None, connect, read)
        try:
            response = await self._request(method, url, headers, body, timeout, server_hostname)
        except aiohttp.ClientError as exc:
            raise _transport_error(exc) from exc
        try:
            yield _AiohttpStreamed(response)
        finally:
            response.release()  # back to the pool when read to the end, otherwise closed

    def _request(
        self,
        method: str,
        url: str,
        headers: RequestHeaders,
        body: bytes,
        timeout: aiohttp.ClientTimeout,
        server_hostname: str | None,
    ) -> _RequestContextManager:
        """The request as aiohttp makes it (awaited, or entered as a context): never a redirect
        followed, never a body compressed."""
        session = self._session or self._open()
        return session.request(
            method,
            url,
            data=body,
            headers=headers,
            allow_redirects=False,
            compress=None,
            timeout=timeout,
            server_hostname=server_hostname,
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class _AiohttpStreamed:
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.status = response.status
        self.headers: ResponseHeaders = response.headers
        self._response = response

    async def chunks(self) -> AsyncIterator[bytes]:
        while True:
            try:
                chunk = await self._response.content.readany()
            except aiohttp.ClientError as exc:
                raise _transport_error(exc) from exc
            if not chunk:
                return
            yield chunk


def _timeout(total: float | None, connect: float | None, read: float | None) -> aiohttp.ClientTimeout:
    # no rounding up of the caller's deadline (aiohttp's default for timers past 5 s)
    ceiling = 5.0 if total is None else total + 1.0
    return aiohttp.ClientTimeout(total=total, sock_connect=connect, sock_read=read, ceil_threshold=ceiling)


def _transport_error(exc: aiohttp.ClientError) -> TransportError:
    """The one place aiohttp's exceptions are read."""
    if isinstance(exc, aiohttp.ServerTimeoutError):  # a socket timer (connect or read)
        return TransportError(str(exc) or "read timed out", failure="timeout")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return TransportError(_connect_failure(exc), failure="connection_error")
    if isinstance(exc, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError):
        return TransportError(str(exc) or type(exc).__name__, failure="connection_dropped")
    return TransportError(str(exc) or type(exc).__name__, failure="connection_error")


def _connect_failure(exc: aiohttp.ClientConnectorError) -> str:
    """`127.0.0.1:11434: connection refused`, without aiohttp's `ssl:default [Connect call
    failed (...)]` around it."""
    error = exc.os_error
    reason = (os.strerror(error.errno) if error.errno else str(error)) or type(exc).__name__
    return f"{exc.host}:{exc.port}: {reason[:1].lower()}{reason[1:]}"


# ---------------------------------------------------------------- the in-memory transport

Handler = Callable[[httpx.Request], httpx.Response | Awaitable[httpx.Response]]


class MemoryTransport:
    """Answers every request with `handler(request)` (a function or a coroutine function), in
    httpx's vocabulary: the handler reads an `httpx.Request` (its `sni_hostname` extension
    carries `server_hostname`) and returns an `httpx.Response`, or raises `TransportError` for
    a request that gets no answer. `total` is kept as aiohttp keeps it."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler

    async def _reply_to(
        self, method: str, url: str, headers: RequestHeaders, body: bytes, server_hostname: str | None
    ) -> httpx.Response:
        extensions = {"sni_hostname": server_hostname} if server_hostname else {}
        request = httpx.Request(method, url, headers=headers, content=body, extensions=extensions)
        response = self._handler(request)
        if inspect.isawaitable(response):
            response = await response
        return response

    async def exchange(
        self,
        method: str,
        url: str,
        headers: RequestHeaders,
        body: bytes,
        *,
        total: float | None = None,
        connect: float | None = None,
        read: float | None = None,
        server_hostname: str | None = None,
    ) -> tuple[int, ResponseHeaders, bytes]:
        with anyio.fail_after(total):
            response = await self._reply_to(method, url, headers, body, server_hostname)
            return response.status_code, response.headers, b"".join([c async for c in _raw(response)])

    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: str,
        url: str,
        headers: RequestHeaders,
        body: bytes,
        *,
        connect: float | None = None,
        read: float | None = None,
        server_hostname: str | None = None,
    ) -> AsyncIterator[Streamed]:
        response = await self._reply_to(method, url, headers, body, server_hostname)
        try:
            yield _MemoryStreamed(response)
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        pass


class _MemoryStreamed:
    def __init__(self, response: httpx.Response) -> None:
        self.status = response.status_code
        self.headers: ResponseHeaders = response.headers
        self._response = response

    def chunks(self) -> AsyncIterator[bytes]:
        return _raw(self._response)


async def _raw(response: httpx.Response) -> AsyncIterator[bytes]:
    """The body as the handler gave it, never decoded (a real transport does not decode it)."""
    stream = response.stream
    if isinstance(stream, httpx.AsyncByteStream):
        async for chunk in stream:
            yield chunk
    else:
        for chunk in stream:
            yield chunk


# ---------------------------------------------------------------- the shared httpx client


def make_http_client(transport: Transport, *, timeout_seconds: float = 120.0) -> httpx.AsyncClient:
    """The shared client over `transport`. Proxy variables from the environment are never
    honoured; redirects are the caller's to follow (the fetch tool vets each hop)."""
    return httpx.AsyncClient(
        transport=_HttpxSeam(transport),
        timeout=httpx.Timeout(timeout_seconds, connect=10.0),
        trust_env=False,
        follow_redirects=False,
    )


class _HttpxSeam(httpx.AsyncBaseTransport):
    """httpx's transport interface over a Conclave transport, streaming. `TransportError`
    passes through httpx unchanged. Whoever made the transport closes it: closing the client
    does not."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        stack = contextlib.AsyncExitStack()
        streamed = await stack.enter_async_context(
            self._transport.stream(
                request.method,
                str(request.url),
                [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw],
                await request.aread(),
                connect=timeouts.get("connect"),
                read=timeouts.get("read"),
                server_hostname=request.extensions.get("sni_hostname"),
            )
        )
        return httpx.Response(
            streamed.status,
            headers=_as_bytes(streamed.headers),
            stream=_Body(streamed, stack),
            request=request,
        )


class _Body(httpx.AsyncByteStream):
    def __init__(self, streamed: Streamed, stack: contextlib.AsyncExitStack) -> None:
        self._streamed = streamed
        self._stack = stack

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._streamed.chunks():
            yield chunk

    async def aclose(self) -> None:
        await self._stack.aclose()


def _as_bytes(headers: ResponseHeaders) -> list[tuple[bytes, bytes]]:
    """The headers' bytes as received (aiohttp's `surrogateescape` decoding undone): httpx would
    refuse a non-ASCII `str` value."""
    return [
        (k.encode("utf-8", "surrogateescape"), v.encode("utf-8", "surrogateescape"))
        for k, v in headers.items()
    ]
