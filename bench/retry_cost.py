"""What a provider call's attempt loop costs: one call that succeeds at once, and one whose first
attempt fails (a 503) and is retried, through `ProviderClient.complete` on a transport that
answers from memory, with a sleep that only yields. Optionally against the loop of another
commit, in the same run.

Run: .venv/bin/python -m bench.retry_cost                        (this tree, wall time)
     .venv/bin/python -m bench.retry_cost --against c2f3e48       (and the loop as of c2f3e48)
     .venv/bin/python -m bench.retry_cost --against c2f3e48 --instructions   (callgrind counts)

`--against REV` copies this tree's `conclave/` and `bench/` to a temporary folder with only
`conclave/providers/client.py` and `retry.py` taken from REV, so the two figures differ by the
loop alone. Wall time: trees alternate process by process, medians over `--rounds`; this
machine swings ±15 %, so trust differences of tens of µs only. `--instructions` (valgrind)
counts each scenario as the difference between a run of `--calls` calls and a run of none,
a figure that stays within about 0.3 %.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

SCENARIOS = ("ok", "retried")  # one attempt; a 503, then the answer
_FAILED = (503, {"content-type": "application/json"}, b'{"error":{"message":"overloaded"}}')
_COLLECTED = re.compile(r"Collected : (\d+)")
_LOOP_FILES = ("conclave/providers/client.py", "conclave/providers/retry.py")


async def _calls(scenario: str, calls: int, warm_up: int) -> float:
    """Seconds per call over `calls` sequential calls, after `warm_up` unmeasured ones."""
    from bench.instructions import ANSWER, ANSWER_HEADERS, bench_config
    from conclave.core.messages import CompletionRequest
    from conclave.obs.telemetry import Telemetry
    from conclave.providers import ProviderPool

    fail_first = scenario == "retried"

    class InMemory:  # the exchange alone: what provider calls use of a transport
        sent = 0

        async def exchange(self, *_args: Any, **_kwargs: Any) -> tuple[int, Any, bytes]:
            await asyncio.sleep(0)  # a real exchange suspends the caller at least once
            self.sent += 1
            return _FAILED if fail_first and self.sent % 2 else (200, ANSWER_HEADERS, ANSWER)

    async def no_wait(_seconds: float) -> None:
        await asyncio.sleep(0)  # the backoff suspends, as anyio.sleep does, but costs no time

    request = CompletionRequest.ask("Which option is best, and why?", max_tokens=64)
    with tempfile.TemporaryDirectory(prefix="conclave-retry-cost-") as work:
        config = bench_config("off", Path(work))
        pool = ProviderPool(
            config,
            telemetry=Telemetry(None),
            transport=InMemory(),  # type: ignore[arg-type]
            sleep=no_wait,
            jitter=lambda: 0.0,
        )
        client = pool.get("bench-m0")
        expected = 2 if fail_first else 1
        for _ in range(warm_up):
            done = await client.complete(request, deadline=time.monotonic() + 60)
            if done.attempts != expected:
                raise RuntimeError(f"{scenario}: {done.attempts} attempts, expected {expected}")
        start = time.perf_counter()
        for _ in range(calls):
            await client.complete(request, deadline=time.monotonic() + 60)
        return (time.perf_counter() - start) / max(calls, 1)


@contextmanager
def _tree(rev: str | None) -> Iterator[Path]:
    """This checkout, or a copy of it whose attempt loop is REV's."""
    here = Path(__file__).resolve().parent.parent
    if rev is None:
        yield here
        return
    with tempfile.TemporaryDirectory(prefix="conclave-loop-") as tmp:
        root = Path(tmp)
        for package in ("conclave", "bench"):
            shutil.copytree(here / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
        for data in ("config.yaml", "schemas"):  # a checkout's data files sit beside the package
            (root / data).symlink_to(here / data)
        for path in _LOOP_FILES:
            old = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=here, capture_output=True, check=True)
            (root / path).write_bytes(old.stdout)
        yield root


def _child(
    root: Path, args: Sequence[str], *, under_valgrind: bool = False
) -> subprocess.CompletedProcess[str]:
    # Run from `root`, so its `conclave` is imported ahead of the installed one.
    command = [sys.executable, "-m", "bench.retry_cost", "--child", *args]
    if under_valgrind:
        command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *command]
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(root)}
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"child failed ({done.returncode}): {done.stderr[-2000:]}")
    return done


def _wall(root: Path, calls: int) -> dict[str, float]:
    done = _child(root, ["--calls", str(calls)])
    return {k: float(v) for k, v in orjson.loads(done.stdout).items()}


def _instructions(root: Path, scenario: str, calls: int) -> float:
    """Instructions per call: a run of `calls` calls minus a run of none (imports cancel out)."""

    def count(n: int) -> int:
        done = _child(root, ["--calls", str(n), "--scenario", scenario], under_valgrind=True)
        found = _COLLECTED.search(done.stderr)
        if found is None:
            raise RuntimeError(f"no callgrind total: {done.stderr[-2000:]}")
        return int(found.group(1))

    return (count(calls) - count(0)) / calls


def _report(label: str, ok: float, retried: float, unit: str) -> None:
    figures = f"ok {ok:>10,.1f} {unit}   retried {retried:>10,.1f} {unit}"
    print(f"  {label:<10} {figures}   retry adds {retried - ok:>10,.1f} {unit}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.retry_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--calls", type=int, default=2000, help="measured calls per scenario and round")
    parser.add_argument("--rounds", type=int, default=5, help="child processes per tree (wall time)")
    parser.add_argument("--against", metavar="REV", help="also measure the attempt loop as of this commit")
    parser.add_argument("--instructions", action="store_true", help="count instructions (valgrind)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--scenario", choices=SCENARIOS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:  # one process measuring its own tree
        names = [args.scenario] if args.scenario else list(SCENARIOS)
        warm_up = 50 if args.scenario else 200  # fewer under callgrind, where it is 50x slower
        figures = {name: asyncio.run(_calls(name, args.calls, warm_up)) for name in names}
        print(orjson.dumps(figures).decode())
        return 0
    with _tree(args.against) as old, _tree(None) as here:
        roots = {"this tree": here} if args.against is None else {args.against[:10]: old, "this tree": here}
        if args.instructions:
            if shutil.which("valgrind") is None:
                print("--instructions needs valgrind (apt install valgrind)", file=sys.stderr)
                return 2
            print(f"instructions per call ({args.calls} calls, less a run of none)")
            for label, root in roots.items():
                ok, retried = (_instructions(root, s, args.calls) for s in SCENARIOS)
                _report(label, ok, retried, "instr")
            return 0
        samples: dict[str, list[dict[str, float]]] = {label: [] for label in roots}
        for _ in range(args.rounds):  # alternate the trees, so drift hits both alike
            for label, root in roots.items():
                samples[label].append(_wall(root, args.calls))
        print(f"µs per call, median of {args.rounds} processes x {args.calls} calls")
        for label, runs in samples.items():
            ok, retried = (statistics.median(run[s] for run in runs) * 1e6 for s in SCENARIOS)
            _report(label, ok, retried, "µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
