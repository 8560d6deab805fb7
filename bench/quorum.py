"""A quorum against a heavy-tailed member: K=5 `confer`s on the simulated panel where four
members answer in a fixed latency and the fifth's latency is heavy-tailed (median 200 ms, p99
10 s), with `quorum: 4, grace_seconds: 0.5` against without (every member awaited).

Run: .venv/bin/python -m bench.quorum [--confers 200] [--concurrency 10] [--seed 7]

The slow member's latencies are drawn from a seeded lognormal fitted to its two quantiles
(mu = ln 200 ms, sigma = ln(10 s / 200 ms) / z(0.99)) and scripted into its scenario's replies in
call order; both modes get the same draws. N confers run closed-loop on `--concurrency` workers
over loopback HTTP (the panel in-process); the figures are the confers' wall times: p50, p95
and p99, and how many times lower the quorum's p95 is.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from bench.common import percentile
from conclave.app.runtime import Runtime, open_runtime
from conclave.app.sim import Reply, Scenario, SimPanel
from conclave.deliberation.confer import confer
from conclave.schema.config import Config, load_config

MEMBERS = ("m1", "m2", "m3", "m4", "m5")
KINDS = ("openai", "anthropic", "gemini", "openai", "anthropic")
SLOW = "m5"
FAST_MS = 100.0
MEDIAN_MS, P99_MS, Z99 = 200.0, 10_000.0, 2.3263478740408408


def tail_latencies(count: int, seed: int) -> list[float]:
    """`count` latencies (ms) from the lognormal whose median is 200 ms and p99 10 s."""
    mu, sigma = math.log(MEDIAN_MS), math.log(P99_MS / MEDIAN_MS) / Z99
    draw = random.Random(seed)
    return [draw.lognormvariate(mu, sigma) for _ in range(count)]


def _config(panel: SimPanel, workdir: Path) -> Config:
    providers = {
        name: {"kind": kind, "model": f"model-{name}", "base_url": panel.base_url(kind)}  # type: ignore[arg-type]
        for name, kind in zip(MEMBERS, KINDS, strict=True)
    }
    data = {
        "providers": providers,
        "panel": list(MEMBERS),
        "limits": {"timeout_seconds": 60, "retry": {"max_attempts": 1}},
        "telemetry": {"enabled": False},
        "transcripts": {"enabled": False},
    }
    path = workdir / "quorum.yaml"
    path.write_text(json.dumps(data), encoding="utf-8")
    return load_config(str(path), env={}, dotenv=None)


def _script(panel: SimPanel, latencies: list[float]) -> None:
    panel.reset()
    for name in MEMBERS:
        if name == SLOW:
            replies = tuple(Reply(latency_ms=ms) for ms in latencies)
            panel.set_scenario(f"model-{name}", Scenario(replies=replies))
        else:
            panel.set_scenario(f"model-{name}", Scenario(latency_ms=FAST_MS))


async def _run(runtime: Runtime, confers: int, concurrency: int, extra: dict[str, Any]) -> list[float]:
    seconds: list[float] = []
    late = 0
    queue = iter(range(confers))

    async def worker() -> None:
        nonlocal late
        for _ in queue:
            started = time.perf_counter()
            result = await confer(runtime, {"question": "Which option?", **extra})
            seconds.append(time.perf_counter() - started)
            late += sum(a.status == "late" for a in result.answers)
            missing = [a for a in result.answers if a.status not in ("ok", "late")]
            if missing:
                raise RuntimeError(f"a failed answer is no measurement: {missing[0]}")

    async with anyio.create_task_group() as group:
        for _ in range(concurrency):
            group.start_soon(worker)
    print(f"    ({late} late of {confers} confers)")
    return seconds


async def measure(confers: int, concurrency: int, seed: int) -> dict[str, list[float]]:
    latencies = tail_latencies(confers, seed)
    shown = ", ".join(f"p{int(q * 100)} {percentile(latencies, q * 100):.0f} ms" for q in (0.5, 0.95, 0.99))
    print(f"the slow member's scripted latencies: {shown}, max {max(latencies):.0f} ms")
    out: dict[str, list[float]] = {}
    modes: dict[str, dict[str, Any]] = {
        "every member": {},
        "quorum 4, grace 0.5 s": {"quorum": 4, "grace_seconds": 0.5},
    }
    with tempfile.TemporaryDirectory() as workdir:
        async with SimPanel() as panel, open_runtime(_config(panel, Path(workdir))) as runtime:
            for mode, extra in modes.items():
                _script(panel, latencies)
                print(f"  {mode}: {confers} confers, {concurrency} at a time")
                out[mode] = await _run(runtime, confers, concurrency, extra)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--confers", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    opts = parser.parse_args()
    results = anyio.run(measure, opts.confers, opts.concurrency, opts.seed)
    print(
        f"K=5 confer wall time, one member heavy-tailed (p50 {MEDIAN_MS:.0f} ms, p99 {P99_MS / 1000:.0f} s):"
    )
    for mode, seconds in results.items():
        figures = " ".join(
            f"p{int(q * 100)} {percentile(seconds, q * 100) * 1000:7.1f} ms" for q in (0.5, 0.95, 0.99)
        )
        print(f"  {mode:<22} {figures}   mean {statistics.fmean(seconds) * 1000:7.1f} ms")
    every, quorum = results.values()
    print(f"p95 without / with the quorum: {percentile(every, 95) / percentile(quorum, 95):.1f}x")


if __name__ == "__main__":
    main()
