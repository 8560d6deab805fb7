"""Provider-layer floor figures: the simulated panel's own maximum rate, and what Conclave's provider
layer adds per call over a raw aiohttp request for the same body, for each wire kind.

Run: .venv/bin/python -m bench.providers --calls 1000 --rounds 5  (`scripts/bench` runs it too,
as the "provider layer" section of the full suite, `python -m bench`).

The panel runs in its own process at 0 ms latency so its CPU is not counted here. Raw and
Conclave batches are interleaved round by round and medians reported, so drift on a busy
machine hits both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import orjson

from bench.panel import panel_process
from conclave.app.sim.simulated import simulated_config
from conclave.core.messages import CompletionRequest
from conclave.net.http import AiohttpTransport
from conclave.obs.telemetry import Telemetry
from conclave.providers import ADAPTERS, CompletionClient, ProviderPool
from conclave.schema.config import Config, load_config
from conclave.schema.schemas import data_path

KINDS = ("openai", "anthropic", "gemini")
REQUEST = CompletionRequest.ask("Which option is best, and why?", max_tokens=64)


async def timed(n: int, call: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """Wall and CPU seconds per call over n sequential calls."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        await call()
    return (time.perf_counter() - wall) / n, (time.process_time() - cpu) / n


async def panel_rate(
    session: aiohttp.ClientSession, url: str, body: bytes, total: int, concurrency: int
) -> float:
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            async with session.post(url, data=body, headers={"content-type": "application/json"}) as r:
                await r.read()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return total / (time.perf_counter() - start)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The figures, as the suite stores them (milliseconds per call, medians over rounds)."""
    with panel_process(0.0) as urls:
        base = load_config(str(data_path("config.yaml")), env={}, dotenv=None)
        config: Config = simulated_config(base, urls)
        telemetry = Telemetry(None)
        transport = AiohttpTransport()
        async with contextlib.aclosing(transport), aiohttp.ClientSession() as session:
            pool = ProviderPool(config, transport=transport, telemetry=telemetry)
            clients: dict[str, CompletionClient] = {
                pool.get(name).entry.kind: pool.get(name) for name in config.providers
            }

            # What each kind's raw call sends: the adapter's endpoint and its encoded body.
            sent = {
                k: (
                    ADAPTERS[k].endpoint(clients[k].entry, None),
                    orjson.dumps(ADAPTERS[k].body(REQUEST, clients[k].entry)),
                )
                for k in KINDS
            }

            def raw_call(kind: str) -> Callable[[], Awaitable[Any]]:
                target, payload = sent[kind]

                async def call() -> Any:
                    async with session.post(target.url, data=payload, headers=dict(target.headers)) as r:
                        return orjson.loads(await r.read())

                return call

            def conclave_call(kind: str) -> Callable[[], Awaitable[Any]]:
                client = clients[kind]
                return lambda: client.complete(REQUEST, deadline=anyio.current_time() + 30)

            samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
            for kind in KINDS:  # warm connections and code paths
                await timed(50, raw_call(kind))
                await timed(50, conclave_call(kind))
            for _ in range(args.rounds):
                for kind in KINDS:
                    samples.setdefault((kind, "raw"), []).append(await timed(args.calls, raw_call(kind)))
                    samples.setdefault((kind, "conclave"), []).append(
                        await timed(args.calls, conclave_call(kind))
                    )

            target, payload = sent["openai"]
            rates = [
                await panel_rate(session, target.url, payload, args.rate_requests, c) for c in (16, 64, 256)
            ]

    kinds: dict[str, dict[str, float]] = {}
    for kind in KINDS:
        raw = samples[(kind, "raw")]
        ours = samples[(kind, "conclave")]
        kinds[kind] = {
            "raw_ms_per_call": statistics.median(s[0] for s in raw) * 1e3,
            "conclave_ms_per_call": statistics.median(s[0] for s in ours) * 1e3,
            "raw_cpu_ms_per_call": statistics.median(s[1] for s in raw) * 1e3,
            "conclave_cpu_ms_per_call": statistics.median(s[1] for s in ours) * 1e3,
        }
        kinds[kind]["overhead_ms"] = kinds[kind]["conclave_ms_per_call"] - kinds[kind]["raw_ms_per_call"]
    return {
        "calls": args.calls,
        "rounds": args.rounds,
        "kinds": kinds,
        "panel_rate": {str(c): rate for rate, c in zip(rates, (16, 64, 256), strict=True)},
        "rate_requests": args.rate_requests,
    }


def report(figures: dict[str, Any]) -> None:
    print(
        f"Conclave provider-layer benchmark (simulated panel, 0 ms latency, its own process; "
        f"{figures['rounds']} interleaved rounds x {figures['calls']} sequential calls, medians)"
    )
    print(
        f"{'kind':<10} {'raw aiohttp ms/call':>20} {'conclave ms/call':>17} {'overhead ms':>12} "
        f"{'raw CPU ms':>11} {'conclave CPU ms':>16}"
    )
    for kind, row in figures["kinds"].items():
        print(
            f"{kind:<10} {row['raw_ms_per_call']:>20.3f} {row['conclave_ms_per_call']:>17.3f} "
            f"{row['overhead_ms']:>12.3f} {row['raw_cpu_ms_per_call']:>11.3f} "
            f"{row['conclave_cpu_ms_per_call']:>16.3f}"
        )
    print(
        f"panel max rate (raw aiohttp client, {figures['rate_requests']} requests): "
        + ", ".join(f"{rate:,.0f} req/s at concurrency {c}" for c, rate in figures["panel_rate"].items())
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=500, help="sequential calls per batch")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--rate-requests", type=int, default=5000, help="requests per panel-rate point")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args()
    figures = anyio.run(measure, args)
    report(figures)
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(figures))


if __name__ == "__main__":
    main()
