"""What streaming costs, on the simulated panel through the real stack (the Python API, the
adapters, aiohttp on loopback):

1. Time to first token: from the moment the transport hands Conclave the first bytes of a
   streamed answer to the moment the caller's `deltas` listener hears its first delta: SSE
   parsing, the wire's assembler and the listener chain, per wire. Goal: p50 <= 2 ms.
2. Throughput: K=5 confers with N in flight, streamed against plain calls (`stream: false`),
   with the panel in its own process (`bench.panel`), so that only Conclave's side is measured.

Run: .venv/bin/python -m bench.streaming [--calls 200] [--confers 300] [--in-flight 100] [--tokens 200]

Each answer is `--tokens` simulated tokens (about four characters each), sent as fast as the
panel can. Prints the figures; docs/performance.md#streaming keeps them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio

from bench.common import percentile
from bench.panel import panel_process, put_scenarios

KINDS = ("openai", "anthropic", "gemini")


class FirstByteTransport:
    """The production transport, noting when each streamed answer's first bytes arrive."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.first_bytes: list[float] = []

    async def exchange(self, *args: Any, **kwargs: Any) -> Any:
        return await self.inner.exchange(*args, **kwargs)

    @contextlib.asynccontextmanager
    async def stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async with self.inner.stream(*args, **kwargs) as streamed:
            yield _Timed(streamed, self.first_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Timed:
    def __init__(self, streamed: Any, marks: list[float]) -> None:
        self.status, self.headers = streamed.status, streamed.headers
        self._streamed, self._marks = streamed, marks

    async def chunks(self) -> AsyncIterator[bytes]:
        first = True
        async for chunk in self._streamed.chunks():
            if first:
                self._marks.append(time.perf_counter())
                first = False
            yield chunk


def _config(panel: Any, kinds: tuple[str, ...], *, stream: bool) -> Any:
    from conclave.schema.config import load_config

    overrides = [
        *(
            f"providers.m{i}={{kind: {kind}, model: m{i}, base_url: '{panel.base_url(kind)}', "
            f"api_key_env: null, stream: {str(stream).lower()}}}"
            for i, kind in enumerate(kinds)
        ),
        f"panel=[{', '.join(f'm{i}' for i in range(len(kinds)))}]",
        "roles={}",
        "telemetry.enabled=false",
        "transcripts.enabled=false",
    ]
    return load_config(None, env={}, dotenv=None, overrides=overrides)


async def _ttft(calls: int, tokens: int) -> dict[str, list[float]]:
    from conclave.app.api import Conclave
    from conclave.app.sim import Reply, Scenario, SimPanel
    from conclave.net.http import AiohttpTransport

    gaps: dict[str, list[float]] = {}
    async with SimPanel(record=False) as panel:
        for kind in KINDS:
            config = _config(panel, (kind,), stream=True)
            panel.set_scenario("m0", Scenario(replies=(Reply(text="word " * (tokens * 4 // 5)),)))
            transport = FirstByteTransport(AiohttpTransport())
            heard: list[float] = []

            def listener(_provider: str, _role: str | None, _delta: Any, heard: list[float] = heard) -> None:
                heard.append(time.perf_counter())

            async with Conclave(config, transport=transport) as client:
                for _ in range(calls):
                    heard.clear()
                    marks = len(transport.first_bytes)
                    await client.confer("Which?", deltas=listener)
                    gaps.setdefault(kind, []).append((heard[0] - transport.first_bytes[marks]) * 1000)
    return gaps


async def _throughput(urls: dict[str, str], confers: int, in_flight: int, *, stream: bool) -> float:
    from conclave.app.api import Conclave

    async with Conclave(_config(_Urls(urls), THROUGHPUT_KINDS, stream=stream)) as client:
        limiter = anyio.Semaphore(in_flight)

        async def one() -> None:
            async with limiter:
                await client.confer("Which?")

        await client.confer("warm-up")
        started = time.perf_counter()
        async with anyio.create_task_group() as group:
            for _ in range(confers):
                group.start_soon(one)
        return confers / (time.perf_counter() - started)


THROUGHPUT_KINDS = ("openai", "anthropic", "gemini", "openai", "anthropic")


class _Urls:
    """The panel process's base URLs, as `_config` reads a panel's."""

    def __init__(self, urls: dict[str, str]) -> None:
        self.urls = urls

    def base_url(self, kind: str) -> str:
        return self.urls[kind]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.streaming", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="streamed calls per wire for the TTFT figure")
    parser.add_argument("--confers", type=int, default=300)
    parser.add_argument("--in-flight", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=200, help="simulated tokens per answer")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-streaming-") as tmp:
        os.chdir(Path(tmp))
        gaps = anyio.run(_ttft, args.calls, args.tokens)
        print(f"first bytes -> first delta heard by the caller ({args.calls} calls per wire, ms)")
        for kind, values in gaps.items():
            p50, p95 = percentile(values, 50), percentile(values, 95)
            print(f"  {kind:10} p50 {p50:.3f}  p95 {p95:.3f}  max {max(values):.3f}")
        with panel_process(0.0) as urls:  # in its own process: its cost is not Conclave's
            text = "word " * (args.tokens * 4 // 5)
            put_scenarios(
                urls, {f"m{i}": {"replies": [{"text": text}]} for i in range(len(THROUGHPUT_KINDS))}
            )
            plain = anyio.run(lambda: _throughput(urls, args.confers, args.in_flight, stream=False))
            streamed = anyio.run(lambda: _throughput(urls, args.confers, args.in_flight, stream=True))
        print(f"K=5 confers/s, N={args.in_flight} in flight, {args.tokens}-token answers:")
        print(f"  plain {plain:.1f}   streamed {streamed:.1f}   ({(streamed / plain - 1) * 100:+.1f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
