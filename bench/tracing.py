"""What OpenTelemetry tracing costs: K=5 `confer` throughput with tracing off and on (a batch
span exporter sending OTLP/HTTP to a receiver on loopback), interleaved, in one run.

Run: .venv/bin/python -m bench.tracing [--confers 100] [--concurrency 10] [--latency-ms 0] [--reps 3]
(needs the extra `conclave[otel]`, which `scripts/setup dev` installs)

At `--latency-ms 0` the panel answers at once from this process, so the figure is Conclave's
own work per call, where tracing weighs the most; `--latency-ms 200 --concurrency 100` is the
benchmark suite's load (N=100 calls in flight against 200 ms models).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from aiohttp import web
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from conclave.app.runtime import open_runtime
from conclave.app.sim import SimPanel
from conclave.deliberation.confer import confer
from conclave.obs._otel import OtelTracer
from conclave.obs.telemetry import Telemetry
from conclave.obs.tracing import NO_TRACER, Tracer
from conclave.schema.config import load_config

MEMBERS = {"m1": "openai", "m2": "anthropic", "m3": "gemini", "m4": "openai", "m5": "anthropic"}


async def _receiver() -> tuple[web.AppRunner, int, list[int]]:
    received: list[int] = []

    async def traces(request: web.Request) -> web.Response:
        received.append(len(await request.read()))
        return web.Response(content_type="application/x-protobuf", body=b"")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1], received  # type: ignore[union-attr]


async def _rate(panel: SimPanel, workdir: Path, tracer: Tracer, confers: int, concurrency: int) -> float:
    providers = {
        name: {"kind": kind, "model": f"model-{name}", "base_url": panel.base_url(kind)}  # type: ignore[arg-type]
        for name, kind in MEMBERS.items()
    }
    data = {"providers": providers, "panel": list(MEMBERS), "transcripts": {"enabled": False}}
    path = workdir / "tracing.yaml"
    path.write_text(json.dumps(data), encoding="utf-8")
    config = load_config(str(path), env={}, dotenv=None)
    async with open_runtime(config, telemetry=Telemetry(None, tracer=tracer)) as runtime:
        limiter = anyio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with limiter:
                await confer(runtime, {"question": f"Which option? ({i})"})

        started = time.perf_counter()
        async with anyio.create_task_group() as group:
            for i in range(confers):
                group.start_soon(one, i)
        return confers / (time.perf_counter() - started)


async def _measure(confers: int, concurrency: int, latency_ms: float, reps: int) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"off": [], "on": []}
    runner, port, received = await _receiver()
    try:
        with tempfile.TemporaryDirectory() as workdir:
            async with SimPanel(record=False, latency_ms=latency_ms) as panel:
                for _ in range(reps):
                    rates["off"].append(await _rate(panel, Path(workdir), NO_TRACER, confers, concurrency))
                    provider = TracerProvider()
                    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")
                    provider.add_span_processor(BatchSpanProcessor(exporter))
                    tracer = OtelTracer(provider)
                    rates["on"].append(await _rate(panel, Path(workdir), tracer, confers, concurrency))
                    await anyio.to_thread.run_sync(tracer.shutdown)  # the exporter posts from its thread
    finally:
        await runner.cleanup()
    return {"rates": rates, "exports": len(received)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--confers", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--reps", type=int, default=3)
    opts = parser.parse_args()
    out = anyio.run(_measure, opts.confers, opts.concurrency, opts.latency_ms, opts.reps)
    off, on = (statistics.median(out["rates"][k]) for k in ("off", "on"))
    load = f"N={opts.confers}, {opts.concurrency} at a time, {opts.latency_ms:.0f} ms per model call"
    print(f"K=5 confer, {load}, median of {opts.reps} interleaved runs")
    print(f"  tracing off: {off:7.1f} confers/s")
    fewer = f"{1 - on / off:.1%} fewer; {out['exports']} OTLP exports received"
    print(f"  tracing on:  {on:7.1f} confers/s  ({fewer})")


if __name__ == "__main__":
    main()
