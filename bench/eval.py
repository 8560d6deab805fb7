"""How long `conclave eval` takes on the simulated panel: 100 items, the 5 default strategies (three
single members at equal calls, the vote, the council), through the real stack.

Run: .venv/bin/python -m bench.eval [--items 100] [--concurrency 1,4,16] [--latency-ms 0] [--reps 3]

The suite is `builtin:basic` followed by generated sums up to `--items`; the panel's oracle draws
the answers as in `conclave eval --demo`. Prints, per concurrency, the wall time of each run, its
items/s, and the model calls made (from the results lines). The target (docs/performance.md):
under a minute for 100 items and 5 strategies at the default concurrency.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
import orjson


def _suite(path: Path, items: int) -> None:
    """The built-in suite's first `items` lines as they are, then generated sums up to `items`."""
    from conclave.app.evals.suite import DATA_DIR

    lines = [line for line in (DATA_DIR / "basic.jsonl").read_bytes().splitlines() if line.strip()][:items]
    for i in range(len(lines), items):
        a, b = 1000 + 37 * i, 200 + 11 * i
        lines.append(
            orjson.dumps(
                {"id": f"sum-{i:03d}", "question": f"What is {a} + {b}?", "answer": a + b, "kind": "number"}
            )
        )
    path.write_bytes(b"\n".join(lines) + b"\n")


async def _one(suite_path: Path, out: Path, concurrency: int, latency_ms: float) -> tuple[float, int, int]:
    import conclave
    from conclave.app.evals import command, demo, runner
    from conclave.app.evals.suite import load_suite
    from conclave.schema.config import load_config

    suite = load_suite(str(suite_path))
    base = load_config(None, env={}, dotenv=None)
    async with conclave.SimulatedPanel(base, latency_ms=latency_ms) as sim:
        sim.panel.set_oracle(demo.oracle(suite, demo.CASES[0], seed=0))
        options = command.Options(suite=str(suite_path), out=str(out), concurrency=concurrency)
        prepared = command.prepare(sim.config, options)
        async with conclave.Conclave(sim.config) as client:
            started = time.perf_counter()
            ran = await runner.run(client, prepared.plan)
            elapsed = time.perf_counter() - started
    return elapsed, len(ran.lines), sum(int(line["calls"]) for line in ran.lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=100)
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated (default: 1,4,16)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="the simulated models' latency")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-eval-") as tmp:
        work = Path(tmp)
        suite_path = work / "suite.jsonl"
        _suite(suite_path, args.items)
        os.chdir(work)  # the event log and transcripts go with the temporary directory
        print(f"eval of {args.items} items x 5 strategies, simulated panel, latency {args.latency_ms:g} ms")
        heads = ("concurrency", "wall s (median)", "runs", "items/s", "answers", "calls")
        widths = (11, 15, 24, 8, 7, 6)
        print("  ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True)))
        for concurrency in [int(c) for c in args.concurrency.split(",")]:
            runs = [
                anyio.run(_one, suite_path, work / f"out-{concurrency}-{rep}", concurrency, args.latency_ms)
                for rep in range(args.reps)
            ]
            walls = [wall for wall, _, _ in runs]
            median = statistics.median(walls)
            shown = " ".join(f"{w:.2f}" for w in walls)
            _, answers, calls = runs[-1]
            cells = (
                str(concurrency),
                f"{median:.2f}",
                shown,
                f"{args.items / median:.1f}",
                str(answers),
                str(calls),
            )
            print("  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
