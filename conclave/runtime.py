"""Wiring: the shared HTTP client, the event log and the provider pool, opened and closed
together. The CLI and the server open one Runtime per process; tests open their own."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx

from conclave.config import Config
from conclave.http import make_http_client
from conclave.providers import ProviderPool
from conclave.telemetry import Telemetry


@dataclass(frozen=True, slots=True)
class Runtime:
    config: Config
    http: httpx.AsyncClient
    telemetry: Telemetry
    providers: ProviderPool


@contextlib.asynccontextmanager
async def open_runtime(
    config: Config, *, transport: httpx.AsyncBaseTransport | None = None
) -> AsyncIterator[Runtime]:
    telemetry = Telemetry(
        config.telemetry.path,
        include_content=config.telemetry.include_content,
        secrets=config.secrets.values(),
    )
    http = make_http_client(transport=transport, max_connections=config.limits.max_concurrency * 4)
    try:
        async with http:
            yield Runtime(config, http, telemetry, ProviderPool(config, http=http, telemetry=telemetry))
    finally:
        telemetry.close()
