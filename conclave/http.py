"""HTTP plumbing: the one place an `httpx.AsyncClient` is built, and the transports under it.

Everything speaks httpx's API (`httpx.Request` / `httpx.Response`, `MockTransport` in tests),
over aiohttp underneath: httpx's own connection pool collapses under hundreds of concurrent
requests on a small machine, aiohttp does not.

- `make_http_client` builds the shared client (fetch uses it: it streams bodies so its byte
  caps hold, via the `httpx-aiohttp` transport, opened on the first request).
- `ProviderTransport` carries provider calls, which always read whole JSON bodies: it hands
  headers to aiohttp as plain tuples and returns a read response, skipping the per-request
  conversions and stream wrappers a general transport needs. The
  response headers it returns are the mapping aiohttp's parser already built, looked up
  without regard to case: a provider sends 20-odd headers and the client reads two or three.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Literal

import aiohttp
import httpx

TransportFailure = Literal["timeout", "connection_error", "connection_dropped"]
# Response headers, looked up without regard to case. aiohttp decodes them as UTF-8 with
# `surrogateescape` (so no byte is lost): read a value that leaves the process through
# `providers.base.header_text`, since JSON cannot carry a lone surrogate.
ResponseHeaders = Mapping[str, str]


def make_http_client(
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    max_connections: int = 1000,
    timeout_seconds: float = 120.0,
) -> httpx.AsyncClient:
    """Build the shared client. Proxy variables from the environment are never honoured."""
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=200)
    if transport is None:
        transport = _FetchTransport(limits)
    return httpx.AsyncClient(
        transport=transport,
        timeout=httpx.Timeout(timeout_seconds, connect=10.0),
        trust_env=False,
        follow_redirects=False,
    )


class _FetchTransport(httpx.AsyncBaseTransport):
    """The `httpx-aiohttp` streaming transport, imported and built on the first request: many
    processes never fetch, and the package with the TLS context it loads at construction would
    otherwise stay resident in every process."""

    def __init__(self, limits: httpx.Limits) -> None:
        self._limits = limits
        self._inner: httpx.AsyncBaseTransport | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._inner is None:
            from httpx_aiohttp import AiohttpTransport

            self._inner = AiohttpTransport(limits=self._limits, trust_env=False)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        inner, self._inner = self._inner, None
        if inner is not None:
            await inner.aclose()


class ProviderTransport(httpx.AsyncBaseTransport):
    """httpx's transport seam over one aiohttp session, for whole-body JSON exchanges."""

    def __init__(self, *, max_connections: int = 1000, keepalive_seconds: float = 30.0) -> None:
        self._max_connections = max_connections
        self._keepalive = keepalive_seconds
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        # Made on first use, inside the running event loop aiohttp binds it to.
        connector = aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=self._keepalive)
        # No skip_auto_headers: the adapters name the client themselves (base.JSON_HEADERS), and
        # skipping a header costs a header set and a larger request object per call.
        self._session = aiohttp.ClientSession(connector=connector, trust_env=False, auto_decompress=False)
        return self._session

    async def exchange(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | Sequence[tuple[str, str]],
        body: bytes,
        *,
        total: float | None = None,
        connect: float | None = None,
        read: float | None = None,
        server_hostname: str | None = None,
    ) -> tuple[int, ResponseHeaders, bytes]:
        """Send one request and read the whole answer: (status, headers, body).

        The provider client calls this directly, with plain values: no `httpx.Request` or
        `Response` is built. `total` bounds the whole exchange on aiohttp's own timer (a bare
        `TimeoutError` when it runs out); `connect` and `read` are socket timers. Transport
        failures raise the httpx exceptions `classify_transport_error` reads.
        """
        session = self._session or self._open()
        # no rounding up of the caller's deadline (aiohttp's default for timers past 5 s)
        ceiling = 5.0 if total is None else total + 1.0
        timeout = aiohttp.ClientTimeout(
            total=total, sock_connect=connect, sock_read=read, ceil_threshold=ceiling
        )
        try:
            async with session.request(
                method,
                url,
                data=body,
                headers=headers,
                allow_redirects=False,
                compress=None,
                timeout=timeout,
                server_hostname=server_hostname,
            ) as response:
                return response.status, response.headers, await response.read()
        except aiohttp.ServerTimeoutError as exc:  # a socket timer (connect or read)
            raise httpx.ReadTimeout(str(exc) or "read timed out") from exc
        except aiohttp.ClientConnectorError as exc:
            raise httpx.ConnectError(_connect_failure(exc)) from exc
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise httpx.RemoteProtocolError(str(exc) or type(exc).__name__) from exc
        except aiohttp.ClientError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        try:
            status, headers, body = await self.exchange(
                request.method,
                str(request.url),
                [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw],
                request.content,
                connect=timeouts.get("connect"),
                read=timeouts.get("read"),
                server_hostname=request.extensions.get("sni_hostname"),
            )
        except TimeoutError as exc:  # a socket timer aiohttp did not wrap
            raise httpx.ReadTimeout(str(exc) or "read timed out", request=request) from exc
        except httpx.TransportError as exc:
            exc.request = request
            raise
        return httpx.Response(status, headers=_as_bytes(headers), content=body, request=request)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _connect_failure(exc: aiohttp.ClientConnectorError) -> str:
    """`127.0.0.1:11434: connection refused`, without aiohttp's `ssl:default [Connect call
    failed (...)]` around it."""
    error = exc.os_error
    reason = (os.strerror(error.errno) if error.errno else str(error)) or type(exc).__name__
    return f"{exc.host}:{exc.port}: {reason[:1].lower()}{reason[1:]}"


def _as_bytes(headers: ResponseHeaders) -> list[tuple[bytes, bytes]]:
    """The headers' bytes as received (aiohttp's `surrogateescape` decoding undone): httpx would
    refuse a non-ASCII `str` value."""
    return [
        (k.encode("utf-8", "surrogateescape"), v.encode("utf-8", "surrogateescape"))
        for k, v in headers.items()
    ]


def classify_transport_error(exc: httpx.HTTPError) -> TransportFailure:
    """What really happened under an httpx transport error.

    httpx-aiohttp files refused and dropped connections under `ConnectTimeout`, so the
    aiohttp exception it chains is consulted first.
    """
    cause = exc.__cause__
    if isinstance(cause, aiohttp.ClientConnectorError):
        return "connection_error"
    if isinstance(cause, aiohttp.ClientConnectionError) and not isinstance(cause, aiohttp.ServerTimeoutError):
        return "connection_dropped"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return "connection_dropped"
    return "connection_error"


def transport_of(client: httpx.AsyncClient) -> httpx.AsyncBaseTransport:
    """The transport under a client (tests hand the runtime one MockTransport for everything)."""
    transport: httpx.AsyncBaseTransport = client._transport
    return transport
