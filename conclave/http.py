"""The one place an `httpx.AsyncClient` is built; everything else is handed it.

Provider traffic goes over an aiohttp-backed transport: httpx's own connection pool
collapses under hundreds of concurrent requests on a small machine (issue F1/F6 figures),
while httpx's API over aiohttp stays near the raw-aiohttp limit.
"""

from __future__ import annotations

from typing import Literal

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

TransportFailure = Literal["timeout", "connection_error", "connection_dropped"]


def make_http_client(
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    max_connections: int = 1000,
    timeout_seconds: float = 120.0,
) -> httpx.AsyncClient:
    """Build the shared client. Proxy variables from the environment are never honoured."""
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=200)
    if transport is None:
        transport = AiohttpTransport(limits=limits, trust_env=False)
    return httpx.AsyncClient(
        transport=transport,
        timeout=httpx.Timeout(timeout_seconds, connect=10.0),
        trust_env=False,
        follow_redirects=False,
    )


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
