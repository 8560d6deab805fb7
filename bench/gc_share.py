"""How a confer's speed and the garbage collector's share change with the confers in flight.

Run: .venv/bin/python -m bench.gc_share [--batch 50,500] [--confers 2000] [--variant default]

`bench.instructions` counts instructions, which the collector adds ~15 % to at 500 confers in
flight; this prints what the wall clock says of the same in-memory confers (the Python API
from a host's asyncio loop, the provider transport answering from memory, as its `api` via):
confers per second, the time spent in each generation's collections (timed by a
`gc.callbacks` hook), and the minor page faults per confer (memory the process touches
for the first time: kernel work that instruction counts leave out). It runs in this
process, so the figures carry this machine's noise: compare batches within one run. The
collector stays at CPython's defaults, as in a host that never called `serving_gc()`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import VARIANTS
from bench.instructions import WARM_UP_WAVES, bench_config, confer_wave, in_memory_transport


class CollectionTimes:
    """Collections and seconds spent in them, per generation, while installed."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            generation = info["generation"]
            self.count[generation] += 1
            self.seconds[generation] += time.perf_counter() - self._started


async def measure(variant: str, batch: int, confers: int, work: Path) -> dict[str, Any]:
    from conclave import Conclave

    async with Conclave(bench_config(variant, work), transport=in_memory_transport()) as client:
        for _ in range(WARM_UP_WAVES):
            await confer_wave(client, batch)
        waves = max(1, confers // batch)
        times = CollectionTimes()
        gc.callbacks.append(times)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        started = time.perf_counter()
        try:
            for _ in range(waves):
                await confer_wave(client, batch)
        finally:
            elapsed = time.perf_counter() - started
            gc.callbacks.remove(times)
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    done = waves * batch
    return {
        "batch": batch,
        "confers_per_s": done / elapsed,
        "gc_share": sum(times.seconds) / elapsed,
        "collections": times.count,
        "collection_ms": [round(s * 1000.0, 1) for s in times.seconds],
        "page_faults_per_confer": faults / done,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gc_share", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", default="50,500", help="comma-separated confers in flight")
    parser.add_argument("--confers", type=int, default=2000, help="measured confers per batch size")
    parser.add_argument("--variant", default="default", choices=sorted(VARIANTS))
    args = parser.parse_args(argv)
    print(f"confer K=5 in memory, {args.variant}; {args.confers} confers per batch size")
    for batch in (int(b) for b in args.batch.split(",")):
        with tempfile.TemporaryDirectory(prefix="conclave-gc-share-") as work:
            row = asyncio.run(measure(args.variant, batch, args.confers, Path(work)))
        pairs = zip(row["collections"], row["collection_ms"], strict=True)
        per_generation = ", ".join(f"gen{g} {n} x ({ms} ms)" for g, (n, ms) in enumerate(pairs))
        print(
            f"  {batch:5d} in flight: {row['confers_per_s']:7.0f} confers/s; "
            f"collector {row['gc_share'] * 100:4.1f} % of the time: {per_generation}; "
            f"{row['page_faults_per_confer']:.1f} page faults per confer"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
