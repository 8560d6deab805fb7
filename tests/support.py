"""Test helpers: wire samples served through the in-memory transport, and a pool builder."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
from aiohttp import web

from conclave.net.http import AiohttpTransport, MemoryTransport, Transport
from conclave.obs.telemetry import Telemetry
from conclave.providers import ProviderPool
from conclave.schema.config import Config

SAMPLES: dict[str, Any] = json.loads(
    (Path(__file__).parent / "fixtures" / "wire_samples.json").read_text(encoding="utf-8")
)

Step = str | Callable[[httpx.Request], httpx.Response]


def sample_response(name: str) -> httpx.Response:
    sample = SAMPLES[name]
    return httpx.Response(sample["status"], headers=sample["headers"], json=sample["body"])


class ScriptedTransport(MemoryTransport):
    """Answers the n-th request with the n-th step (the last one repeats) and records requests."""

    def __init__(self, *steps: Step) -> None:
        self.steps = steps
        self.requests: list[httpx.Request] = []
        super().__init__(self._handle)

    def _handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        step = self.steps[min(len(self.requests), len(self.steps)) - 1]
        return sample_response(step) if isinstance(step, str) else step(request)

    def bodies(self) -> list[Any]:
        return [orjson.loads(r.content) for r in self.requests]


@contextlib.asynccontextmanager
async def open_pool(
    config: Config, transport: Transport | None = None, **kwargs: Any
) -> AsyncIterator[ProviderPool]:
    """A pool over `transport`, by default the production one (real HTTP), closed afterwards."""
    telemetry = Telemetry(config.telemetry.path, secrets=config.secrets.values())
    transport = transport or AiohttpTransport()
    try:
        yield ProviderPool(config, transport=transport, telemetry=telemetry, **kwargs)
    finally:
        await transport.aclose()
        telemetry.close()


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line]


def provider_entry(kind: str, model: str, base_url: str, **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "model": model, "base_url": base_url, **extra}


def system_text(kind: str, body: dict[str, Any]) -> str:
    """The system prompt of a request body, whatever the wire."""
    if kind == "openai":
        return str(body["messages"][0]["content"])
    if kind == "anthropic":
        return str(body["system"])
    return str(body["systemInstruction"]["parts"][0]["text"])


@contextlib.asynccontextmanager
async def local_page(
    path: str, handler: Callable[[web.Request], Awaitable[web.Response]]
) -> AsyncIterator[int]:
    """A local page answered by `handler` over real HTTP, for `fetch`; yields its port."""
    app = web.Application()
    app.router.add_get(path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


def text_page(path: str, text: str) -> contextlib.AbstractAsyncContextManager[int]:
    """A local page serving `text` at `path`."""

    async def page(_request: web.Request) -> web.Response:
        return web.Response(text=text, content_type="text/plain")

    return local_page(path, page)


def last_tool_result_text(kind: str, mode: str, body: Any) -> str:
    """The tool result text a request body sent last, as each wire carries it in each worker tool
    encoding: the user message's text (tags), or the native result block's content."""
    if kind == "gemini":
        part = body["contents"][-1]["parts"][0]
        if mode == "native":
            response = part["functionResponse"]["response"]
            return str(response.get("output", response.get("error")))
        return str(part["text"])
    content = body["messages"][-1]["content"]
    if isinstance(content, str):
        return content
    blocks = [b.get("content", b.get("text")) for b in content]
    return "".join(b if isinstance(b, str) else "".join(x["text"] for x in b) for b in blocks)
