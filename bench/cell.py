"""One measured cell in a fresh process: `python -m bench.cell SPEC_JSON RESULT_PATH`.

A cell is one contender at one operating point (or one of the extra measurements). It
starts the contender, warms it up (every worker runs `warmup` operations: connections
opened, code paths and caches warm), then runs `n` closed-loop workers, started together,
each running `1 + per_worker` operations: the first wave is the burst of N operations begun
at once, the rest the steady state with N in flight (`measure_point`). The JSON written to
RESULT_PATH holds the latency percentiles of both, the throughput of the steady window, the
CPU time of the process doing the work, and its peak RSS, so peaks never mix across
contenders. Nothing is printed on stdout (litellm would be free to print there).
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.common import VERIFY_CHECK, Point, bench_env, percentile
from bench.contenders import make_contender, own_cpu_seconds, own_peak_rss_bytes


@dataclass(frozen=True, slots=True)
class Timed:
    """One operation of a closed-loop worker: which worker, its place in that worker's run,
    when it started and ended (perf_counter seconds), and the error it raised, if any."""

    worker: int
    index: int
    start: float
    end: float
    error: str | None = None

    @property
    def seconds(self) -> float:
        return self.end - self.start


async def closed_loop(op: Callable[[], Awaitable[None]], workers: int, per_worker: int) -> list[Timed]:
    """`workers` tasks, started together, each running `per_worker` operations back to back."""
    timed: list[Timed] = []
    clock = time.perf_counter

    async def worker(number: int) -> None:
        for index in range(per_worker):
            start = clock()
            error = None
            try:
                await op()
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"[:500]
            timed.append(Timed(number, index, start, clock(), error))

    await asyncio.gather(*(worker(number) for number in range(workers)))
    return timed


def steady_window(timed: Sequence[Timed]) -> tuple[float, float] | None:
    """The start times whose operations ran, start to end, with all N workers busy and the
    burst behind: from the moment every worker is past its first operation (the wave begun
    at once) to the first start of an operation still running when the first worker ran out
    of them. Taking every operation begun in the window, whatever its length, is what keeps
    the sample fair: cutting at the first worker's end instead would drop the longest of the
    operations under way there, and running past it would time them at a falling load. None
    when the run is too short for such a window."""
    first_ends: dict[int, float] = {}
    last_ends: dict[int, float] = {}
    for t in timed:
        if t.index == 0:
            first_ends[t.worker] = t.end
        last_ends[t.worker] = max(last_ends.get(t.worker, t.end), t.end)
    opens, first_out = max(first_ends.values(), default=0.0), min(last_ends.values(), default=0.0)
    closes = min((t.start for t in timed if t.end > first_out), default=first_out)
    return (opens, closes) if closes > opens else None


def overheads_ms(timed: Iterable[Timed], ideal_ms: float) -> dict[str, float | None]:
    values = [t.seconds * 1000.0 - ideal_ms for t in timed]
    return {
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "mean": sum(values) / len(values) if values else None,
        "max": max(values, default=None),
    }


async def measure_point(spec: dict[str, Any]) -> dict[str, Any]:
    """Warm up (behind a barrier), then run every worker `1 + per_worker` operations without one.

    The measured run's first wave starts all N operations in the same instant: how long that
    burst takes to clear is reported apart, as `burst_overhead_ms`. The latency percentiles
    come from the operations begun in the steady window after it (`steady_window`), and the
    throughput from them by Little's law: N workers, each with one operation in flight and no
    pause between, complete N / (mean latency) operations per second. (Counting completions
    inside the window instead is biased by where its edges fall: with a fixed 200 ms provider
    latency the waves stay in step, and a window of a few periods holds a whole number of
    them or not.) Before, the figures mixed burst and steady state: with N=100 and five
    operations per worker, a fifth of the samples were the burst, and p95 and p99 measured
    how long a thundering herd took to clear, not the latency with N in flight.
    """
    point = Point.from_dict(spec["point"])
    contender = make_contender(
        spec["contender"],
        point,
        spec["urls"],
        Path(spec["config"]),
        Path(spec["log"]),
        serving_gc=bool(spec.get("serving_gc")),
    )
    started = time.perf_counter()
    await contender.start()
    startup_s = time.perf_counter() - started
    try:
        warm = await closed_loop(contender.op, point.n, point.warmup)
        gc.collect()
        profiler = _start_profiler(spec.get("profile"))
        cpu0, client0 = contender.cpu_seconds(), own_cpu_seconds()
        timed = await closed_loop(contender.op, point.n, 1 + point.per_worker)
        cpu, client_cpu = contender.cpu_seconds() - cpu0, own_cpu_seconds() - client0
        _stop_profiler(profiler, spec.get("profile"))
        peak_rss = contender.peak_rss_bytes()
        server = contender.server_pid() is not None
    finally:
        await contender.close()
    return summarize(spec["contender"], point, warm, timed, cpu=cpu, client_cpu=client_cpu, server=server) | {
        "startup_s": startup_s,
        "peak_rss_mb": peak_rss / 2**20,
        "cpu_measured_in": "server process (psutil)" if server else "this process",
    }


def summarize(
    contender: str,
    point: Point,
    warm: Sequence[Timed],
    timed: Sequence[Timed],
    *,
    cpu: float,
    client_cpu: float,
    server: bool,
) -> dict[str, Any]:
    errors = [t.error for t in (*timed, *warm) if t.error is not None]
    done = [t for t in timed if t.error is None]
    window = steady_window(timed)
    steady = [t for t in done if t.index > 0 and window[0] <= t.start < window[1]] if window else []
    if not steady:  # a contender too slow for a steady window in this many operations (litellm at N=500)
        steady = [t for t in done if t.index > 0]
    if not steady:
        raise RuntimeError(f"{point.id}: no operation completed after the burst")
    calls = len(done) * point.calls_per_op  # CPU covers the whole measured run, burst included
    return {
        "contender": contender,
        "point": point.id,
        "ops": len(steady),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "steady_window_s": window[1] - window[0] if window else None,
        "throughput": point.n * len(steady) / sum(t.seconds for t in steady),
        "ideal_throughput": point.n / (point.ideal_ms / 1000.0),
        "overhead_ms": overheads_ms(steady, point.ideal_ms),
        "burst_overhead_ms": overheads_ms((t for t in done if t.index == 0), point.ideal_ms),
        "cpu_s": cpu,
        "cpu_ms_per_call": cpu * 1000.0 / calls if calls else None,
        "client_cpu_ms_per_call": client_cpu * 1000.0 / calls if server and calls else None,
    }


async def measure_verify_hop(spec: dict[str, Any]) -> dict[str, Any]:
    """`runtime.call_tool("verify", ...)` in process: microseconds per call, batch by batch."""
    from conclave.app.runtime import open_runtime
    from conclave.schema.config import load_config

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
