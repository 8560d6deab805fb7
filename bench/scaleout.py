"""Scaling out (docs/deploying.md): what `serve --http --workers 2` gains over one process, and
what the Redis state backend costs against the in-memory one, measured in one run.

Run: .venv/bin/python -m bench.scaleout [--reps 3] [--quick]
(needs Debian's redis-server, which `scripts/setup dev` installs, and the bench extra:
`.venv/bin/pip install -e '.[bench]'`)

The panel answers every call in 200 ms from its own process, as in `scripts/bench`. Each cell
runs in a fresh process, contenders interleaved within each repetition, medians reported:
- K=5, N=500 confers in flight: `serve --http` with one process, with `--workers 2`, and the
  raw aiohttp fan-out (the machine's limit);
- K=5, N=100: `serve --http` with `state.backend: memory`, and with `redis` (a real
  redis-server on loopback).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from bench.common import LATENCY_MS, VARIANTS, Point, scenarios, write_config
from bench.panel import panel_process, put_scenarios
from bench.suite import Runner, describe_cell, log, raise_fd_limit, rotated


@contextmanager
def redis_server(work: Path) -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("bench.scaleout needs redis-server (Debian's package; scripts/setup dev installs it)")
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(work),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(10)


def with_redis(config: Path, url: str) -> Path:
    raw = yaml.safe_load(config.read_text(encoding="utf-8"))
    raw["state"] = {"backend": "redis", "redis_url": url, "namespace": "bench"}
    path = config.with_name("config-redis.yaml")
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a smoke run: one repetition, small N")
    args = parser.parse_args()
    reps = 1 if args.quick else args.reps
    high = Point("k5n500", "confer", 5, 100 if args.quick else 500, 2 if args.quick else 4, 1, LATENCY_MS)
    load = Point("k5n100", "confer", 5, 30 if args.quick else 100, 2 if args.quick else 5, 1, LATENCY_MS)
    cells: list[dict[str, Any]] = []
    raise_fd_limit()
    with tempfile.TemporaryDirectory() as tmp, panel_process(LATENCY_MS) as urls:
        work = Path(tmp)
        put_scenarios(urls, scenarios())
        memory = write_config(work, urls["openai"], VARIANTS["default"], max_concurrency=4096)
        with redis_server(work) as url:
            configs = {"memory": memory, "redis": with_redis(memory, url)}
            runner = Runner(work, urls, configs)
            plan = [
                (high, "conclave-http", "memory"),
                (high, "conclave-http-w2", "memory"),
                (high, "raw-aiohttp", "memory"),
                (load, "conclave-http", "memory"),
                (load, "conclave-http", "redis"),
            ]
            for rep in range(reps):
                for point, contender, state in rotated(plan, rep):
                    spec = {"kind": "op", "contender": contender, "point": point.to_dict(), "variant": None}
                    result = runner.cell({**spec, "config": str(configs[state])})
                    result.update(rep=rep, state=state)
                    cells.append(result)
                    log(f"[rep {rep + 1}/{reps}] {point.id} {contender} ({state}): {describe_cell(result)}")
    report(cells, high, load, reps)
    return 1 if any("failed" in c or c.get("errors") for c in cells) else 0


def median(cells: list[dict[str, Any]], point: Point, contender: str, state: str) -> float | None:
    rates = [
        c["throughput"]
        for c in cells
        if c.get("point") == point.id
        and c.get("contender") == contender
        and c.get("state") == state
        and "throughput" in c
    ]
    return statistics.median(rates) if rates else None


def report(cells: list[dict[str, Any]], high: Point, load: Point, reps: int) -> None:
    one = median(cells, high, "conclave-http", "memory")
    two = median(cells, high, "conclave-http-w2", "memory")
    raw = median(cells, high, "raw-aiohttp", "memory")
    mem = median(cells, load, "conclave-http", "memory")
    red = median(cells, load, "conclave-http", "redis")
    print(f"\nbench.scaleout: medians of {reps} interleaved repetition(s), {LATENCY_MS:.0f} ms per call")
    print(f"confer K=5 N={high.n} (ideal {high.n * 1000 / LATENCY_MS:.0f}/s), confers/s:")
    print(f"  serve --http, 1 process:    {fmt(one)}")
    print(f"  serve --http --workers 2:   {fmt(two)}   ({ratio(two, one)} x one process; target >= 1.6)")
    print(f"  raw aiohttp fan-out:        {fmt(raw)}   (workers 2 = {ratio(two, raw)} x raw)")
    print(f"confer K=5 N={load.n} (ideal {load.n * 1000 / LATENCY_MS:.0f}/s), serve --http, confers/s:")
    print(f"  state.backend memory:       {fmt(mem)}")
    fewer = f"{abs(1 - red / mem):.1%} {'fewer' if red < mem else 'more'}" if red and mem else "n/a"
    print(f"  state.backend redis:        {fmt(red)}   ({fewer}; target <= 15 %)")


def fmt(value: float | None) -> str:
    return f"{value:7.1f}" if value is not None else "    n/a"


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "n/a"


if __name__ == "__main__":
    raise SystemExit(main())
