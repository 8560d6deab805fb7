"""Objects the garbage collector tracks per in-flight provider call, counted mid-flight.

Run: .venv/bin/python -m bench.live_objects [--confers 20] [--top 25]

Under load the collector's cost follows what stays alive while calls wait on their providers:
every full collection walks all of it (see conclave/app/gcpolicy.py). Unlike throughput, this
count is deterministic, so a change that adds or removes one object per call shows here even
when the timing figures cannot tell it from this machine's noise.

N confers of K=5 run at once through the Python API against the simulated panel (its own
process, 500 ms per answer). Half-way through the wait, the tracked objects are counted by type
and compared with a count taken between two warm-up waves; the difference divided by the
calls in flight is the figure. It includes aiohttp's own share (about 60 per call here).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import tempfile
from pathlib import Path

from bench.common import VARIANTS, bench_env, op_arguments, points, scenarios, write_config
from bench.panel import panel_process, put_scenarios

LATENCY_MS = 500.0
CALLS_PER_CONFER = 5


def count_by_type() -> collections.Counter[str]:
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())


async def measure(urls: dict[str, str], confers: int, work: Path) -> collections.Counter[str]:
    from conclave import Conclave
    from conclave.schema.config import load_config

    config_path = write_config(work, urls["openai"], VARIANTS["default"], max_concurrency=4096)
    config = load_config(str(config_path), env=bench_env(), dotenv=None)
    point = next(p for p in points(quick=False, seq_ops=25, high_n=500) if p.id == "k5n100")
    args = op_arguments(point)
    async with Conclave(config) as client:
        for _ in range(2):  # warm: connections open, caches filled
            await asyncio.gather(*(client.confer(**args) for _ in range(confers)))
        gc.collect()
        before = count_by_type()
        calls = [asyncio.ensure_future(client.confer(**args)) for _ in range(confers)]
        await asyncio.sleep(LATENCY_MS / 2000.0)
        during = count_by_type()
        await asyncio.gather(*calls)
    return during - before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.live_objects", description=__doc__.split("\n")[0])
    parser.add_argument("--confers", type=int, default=20, help="confers in flight (K=5 each)")
    parser.add_argument("--top", type=int, default=25, help="types to list")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work, panel_process(LATENCY_MS) as urls:
        put_scenarios(urls, scenarios())
        alive = asyncio.run(measure(urls, args.confers, Path(work)))
    in_flight = args.confers * CALLS_PER_CONFER
    print(f"tracked objects per in-flight provider call: {sum(alive.values()) / in_flight:.1f}")
    for name, count in alive.most_common(args.top):
        print(f"  {count / in_flight:6.2f}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
