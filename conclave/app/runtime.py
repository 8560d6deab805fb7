"""Wiring: the shared HTTP client, the event log, the provider pool and the tools, opened and
closed together as a `Runtime` (the record is `conclave.deliberation.session.Runtime`, what a
deliberation runs on). The CLI and the server open one per process; tests open their own."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from conclave.deliberation.live import LiveDeltas
from conclave.deliberation.session import Runtime, Sessions
from conclave.deliberation.threads import ThreadStore
from conclave.deliberation.transcripts import TranscriptWriter
from conclave.net.http import AiohttpTransport, Transport, make_http_client
from conclave.obs.telemetry import Telemetry
from conclave.providers import ProviderPool
from conclave.schema.config import Config
from conclave.state import StateBackend, open_state
from conclave.tools.context import ToolContext
from conclave.tools.registry import ToolRegistry, build_registry
from conclave.worker.instrumented import InstrumentedWorkerLoop
from conclave.worker.loop import Worker, WorkerLoop

__all__ = ["Runtime", "open_runtime"]


@contextlib.asynccontextmanager
async def open_runtime(
    config: Config,
    *,
    transport: Transport | None = None,
    telemetry: Telemetry | None = None,
    state: StateBackend | None = None,
    live: LiveDeltas | None = None,
    **tool_options: Any,
) -> AsyncIterator[Runtime]:
    """`transport` carries every request, provider calls and fetches (by default aiohttp's; tests
    hand in a `MemoryTransport`), and is closed with the runtime. `tool_options` go to
    ToolContext (tests inject a `resolver` or a `clock`). A `telemetry` or a `state` passed in
    stays open afterwards: whoever opened it closes it. `live`: the hub the sessions publish their
    deltas to, when whoever listens to it (`serve --http`'s page) made it first; else a new one."""
    owns_telemetry = telemetry is None
    telemetry = telemetry or Telemetry.for_config(config)
    writer = (
        TranscriptWriter(config.transcripts.dir, telemetry.redactor, fsync=config.transcripts.fsync)
        if config.transcripts.enabled
        else None
    )
    transport = transport or AiohttpTransport(max_connections=config.limits.max_concurrency * 4)
    http = make_http_client(transport)
    try:
        async with http, _closing(transport), _state(config, telemetry, state) as shared:
            tools = build_registry()
            tool_context = ToolContext(config, http, telemetry, state=shared, **tool_options)
            worker, sessions = _worker_and_sessions(config, telemetry, tools, tool_context)
            yield Runtime(
                config=config,
                http=http,
                telemetry=telemetry,
                providers=ProviderPool(config, transport=transport, telemetry=telemetry, state=shared),
                state=shared,
                tools=tools,
                tool_context=tool_context,
                transcripts=writer,
                worker=worker,
                sessions=sessions,
                live=live or LiveDeltas(),
                threads=ThreadStore(config.transcripts.dir if config.transcripts.enabled else None),
            )
    finally:
        if writer is not None:
            writer.close()
        if owns_telemetry:
            telemetry.close()


def _worker_and_sessions(
    config: Config, telemetry: Telemetry, tools: ToolRegistry, tool_context: ToolContext
) -> tuple[Worker, Sessions]:
    """The worker loop and the session runner, wrapped in their tracing decorators when the
    tracer records: decided here, once, so no call asks whether tracing is on."""
    from conclave.deliberation.session import SessionRunner

    worker = WorkerLoop(
        registry=tools, tool_context=tool_context, telemetry=telemetry, settings=config.worker_tools
    )
    tracer = telemetry.tracer
    if not tracer.recording:
        return worker, SessionRunner()
    from conclave.deliberation.instrumented import InstrumentedSessionRunner

    return InstrumentedWorkerLoop(worker, tracer), InstrumentedSessionRunner(SessionRunner(), tracer)


@contextlib.asynccontextmanager
async def _closing(transport: Transport) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await transport.aclose()


@contextlib.asynccontextmanager
async def _state(
    config: Config, telemetry: Telemetry, given: StateBackend | None
) -> AsyncIterator[StateBackend]:
    if given is not None:
        yield given
        return
    async with open_state(config, telemetry) as state:
        yield state
