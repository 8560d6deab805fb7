"""One measured cell in a fresh process: `python -m bench.cell SPEC_JSON RESULT_PATH`.

A cell is one contender at one operating point (or one of the extra measurements). It
starts the contender, warms it up (every worker runs `warmup` operations: connections
opened, code paths and caches warm), then times `n` closed-loop workers each running
`per_worker` operations. The JSON written to RESULT_PATH holds every latency, the wall
time, the CPU time of the process doing the work, and its peak RSS, so peaks never mix
across contenders. Nothing is printed on stdout (litellm would be free to print there).
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

from bench.common import VERIFY_CHECK, Point, bench_env, percentile
from bench.contenders import make_contender, own_cpu_seconds, own_peak_rss_bytes


async def closed_loop(
    op: Callable[[], Awaitable[None]], workers: int, per_worker: int
) -> tuple[list[float], list[str]]:
    """`workers` tasks each running `per_worker` operations back to back: seconds each, errors."""
    latencies: list[float] = []
    errors: list[str] = []
    clock = time.perf_counter

    async def worker() -> None:
        for _ in range(per_worker):
            start = clock()
            try:
                await op()
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}"[:500])
            else:
                latencies.append(clock() - start)

    await asyncio.gather(*(worker() for _ in range(workers)))
    return latencies, errors


async def measure_point(spec: dict[str, Any]) -> dict[str, Any]:
    point = Point.from_dict(spec["point"])
    contender = make_contender(
        spec["contender"], point, spec["urls"], Path(spec["config"]), Path(spec["log"])
    )
    started = time.perf_counter()
    await contender.start()
    startup_s = time.perf_counter() - started
    try:
        _, warm_errors = await closed_loop(contender.op, point.n, point.warmup)
        gc.collect()
        profiler = _start_profiler(spec.get("profile"))
        cpu0, client0, t0 = contender.cpu_seconds(), own_cpu_seconds(), time.perf_counter()
        latencies, errors = await closed_loop(contender.op, point.n, point.per_worker)
        wall = time.perf_counter() - t0
        cpu, client_cpu = contender.cpu_seconds() - cpu0, own_cpu_seconds() - client0
        _stop_profiler(profiler, spec.get("profile"))
        peak_rss = contender.peak_rss_bytes()
        server = contender.server_pid() is not None
    finally:
        await contender.close()
    ok = len(latencies)
    overhead_ms = [s * 1000.0 - point.ideal_ms for s in latencies]
    calls = ok * point.calls_per_op
    return {
        "contender": spec["contender"],
        "point": point.id,
        "ops": ok,
        "errors": len(errors) + len(warm_errors),
        "first_error": next(iter([*errors, *warm_errors]), None),
        "wall_s": wall,
        "startup_s": startup_s,
        "throughput": ok / wall if wall > 0 else None,
        "ideal_throughput": point.n / (point.ideal_ms / 1000.0),
        "overhead_ms": {
            "p50": percentile(overhead_ms, 50),
            "p95": percentile(overhead_ms, 95),
            "p99": percentile(overhead_ms, 99),
            "mean": sum(overhead_ms) / ok if ok else None,
            "max": max(overhead_ms, default=None),
        },
        "cpu_s": cpu,
        "cpu_ms_per_call": cpu * 1000.0 / calls if calls else None,
        "client_cpu_ms_per_call": client_cpu * 1000.0 / calls if server and calls else None,
        "peak_rss_mb": peak_rss / 2**20,
        "cpu_measured_in": "server process (psutil)" if server else "this process",
    }


async def measure_verify_hop(spec: dict[str, Any]) -> dict[str, Any]:
    """`runtime.call_tool("verify", ...)` in process: microseconds per call, batch by batch."""
    from conclave.config import load_config
    from conclave.runtime import open_runtime

    config = load_config(spec["config"], env=bench_env(), dotenv=None)
    args = {"checks": [VERIFY_CHECK]}
    calls, batches = int(spec["calls"]), int(spec["batches"])
    per_call_us: list[float] = []
    async with open_runtime(config) as runtime:
        for _ in range(min(calls, 200)):  # warm-up
            result = await runtime.call_tool("verify", dict(args))
        if not result.get("passed"):
            raise RuntimeError(f"verify did not pass: {result}")
        gc.collect()
        cpu0 = own_cpu_seconds()
        for _ in range(batches):
            start = time.perf_counter()
            for _ in range(calls):
                await runtime.call_tool("verify", dict(args))
            per_call_us.append((time.perf_counter() - start) * 1e6 / calls)
        cpu = own_cpu_seconds() - cpu0
    return {
        "per_call_us": per_call_us,
        "cpu_us_per_call": cpu * 1e6 / (calls * batches),
        "calls": calls * batches,
    }


def _start_profiler(target: str | None) -> Any:
    if not target:
        return None
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.0005, async_mode="disabled")
    profiler.start()
    return profiler


def _stop_profiler(profiler: Any, target: str | None) -> None:
    """Write `<target>.txt` (the call tree) and `<target>.pyisession` (for `bench.profile`)."""
    if profiler is None or not target:
        return
    session = profiler.stop()
    prefix = Path(target)
    prefix.with_suffix(".txt").write_text(
        profiler.output_text(unicode=False, color=False, show_all=False), encoding="utf-8"
    )
    session.save(str(prefix.with_suffix(".pyisession")))


async def main_async(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["kind"] == "verify_hop":
        return await measure_verify_hop(spec)
    return await measure_point(spec)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m bench.cell SPEC_JSON RESULT_PATH", file=sys.stderr)
        return 2
    spec, out = orjson.loads(argv[0]), Path(argv[1])
    try:
        result = asyncio.run(main_async(spec))
        result["cell_peak_rss_mb"] = own_peak_rss_bytes() / 2**20
    except Exception as exc:
        result = {"failed": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    out.write_bytes(orjson.dumps(result))
    return 0 if "failed" not in result else 1


if __name__ == "__main__":
    raise SystemExit(main())
