"""Profile one contender at one operating point and name the hot spots in Conclave's own code.

    .venv/bin/python -m bench.profile [--point k5n500] [--contender conclave-api] [--tool py-spy|pyinstrument]

The panel runs in its own process as in the suite; the cell runs under the profiler:
- `py-spy` (default) samples the whole cell process from outside, every thread, only while
  it is on CPU (idle threads are left out), so it shows where CPU goes, including worker
  threads (transcripts) and start-up;
- `pyinstrument` profiles only the timed region, from inside, on the main thread.

Both reports give the samples by area (the module or library the sampled frame is in), the
hottest functions, and "Conclave attribution": every sample charged to the innermost
Conclave frame on its stack, so time spent in httpx, structlog or jsonschema on Conclave's
behalf is charged to the Conclave function that asked for it. Files go to --out-dir.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import orjson

from bench.common import CONTENDERS, VARIANTS, points, scenarios, write_config
from bench.panel import panel_process, put_scenarios
from bench.suite import raise_fd_limit

Frame = tuple[str, str]  # (function, file)
Stack = tuple[Frame, ...]  # root first


def area(file: str) -> str:
    """Which module or library a frame's file belongs to."""
    path = file.replace("\\", "/")
    if "/conclave/" in path and "/site-packages/" not in path:
        module = path.rsplit("/conclave/", 1)[1].removesuffix(".py").replace("/", ".")
        return f"conclave.{module}"
    if "/site-packages/" in path:
        return path.split("/site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if "/bench/" in path:
        return "bench (harness)"
    name = path.rsplit("/", 1)[-1].removesuffix(".py")
    parent = path.rsplit("/", 2)[-2] if path.count("/") >= 2 else ""
    if parent in ("asyncio", "concurrent", "json", "importlib", "email", "http", "urllib"):
        return f"stdlib {parent}"
    return f"stdlib {name}" if path.startswith(("/usr", sys.base_prefix)) else name


def is_conclave(frame: Frame) -> bool:
    return area(frame[1]).startswith("conclave.")


def short(frame: Frame) -> str:
    return f"{area(frame[1])}:{frame[0]}"


def read_pyspy(path: Path) -> list[tuple[Stack, float]]:
    """py-spy `--format raw --nolineno --full-filenames`: `frame;frame;... count` per line."""
    out: list[tuple[Stack, float]] = []
    for line in path.read_text(errors="replace").splitlines():
        stack_text, _, count = line.rpartition(" ")
        if not stack_text or not count.isdigit():
            continue
        frames = []
        for item in stack_text.split(";"):
            function, _, rest = item.partition(" (")
            frames.append((function.strip(), rest.rstrip(")")))
        out.append((tuple(frames), float(count)))
    return out


def read_pyinstrument(path: Path) -> list[tuple[Stack, float]]:
    """A saved pyinstrument session, flattened to (stack, self seconds)."""
    from pyinstrument.session import Session

    root = Session.load(str(path)).root_frame()
    out: list[tuple[Stack, float]] = []
    if root is None:
        return out

    def walk(frame: object, stack: Stack) -> None:
        function = getattr(frame, "function", "") or ""
        file = getattr(frame, "file_path", "") or ""
        if getattr(frame, "is_synthetic_leaf", False):
            out.append((stack, float(getattr(frame, "time", 0.0))))
            return
        here = (*stack, (function, file))
        children = list(getattr(frame, "children", []))
        if not children:
            out.append((here, float(getattr(frame, "time", 0.0))))
        for child in children:
            walk(child, here)

    walk(root, ())
    return out


def _idle(frame: Frame) -> bool:
    """The event loop waiting in epoll (py-spy names the selectors frame, pyinstrument the built-in)."""
    function, file = frame
    waiting = function.rsplit(".", 1)[-1] in ("select", "poll")
    return waiting and ("selectors" in file or "built-in" in file or not file)


def summarize(samples: Sequence[tuple[Stack, float]], top: int) -> str:
    """The report: by area, hottest leaf functions, Conclave attribution (self and inclusive)."""
    busy = [(s, w) for s, w in samples if s and not _idle(s[-1])]
    imports = [(s, w) for s, w in busy if any(f[0] == "_find_and_load" for f in s)]
    steady = [(s, w) for s, w in busy if not any(f[0] == "_find_and_load" for f in s)]
    total = sum(w for _, w in steady) or 1.0
    by_area: dict[str, float] = collections.defaultdict(float)
    by_leaf: dict[str, float] = collections.defaultdict(float)
    attributed: dict[str, float] = collections.defaultdict(float)
    inclusive: dict[str, float] = collections.defaultdict(float)
    for stack, weight in steady:
        by_area[area(stack[-1][1])] += weight
        by_leaf[short(stack[-1])] += weight
        owner = next((f for f in reversed(stack) if is_conclave(f)), None)
        attributed[short(owner) if owner else "(no Conclave frame: event loop, transport, harness)"] += weight
        for name in {short(f) for f in stack if is_conclave(f)}:
            inclusive[name] += weight

    def table(title: str, weights: dict[str, float]) -> Iterable[str]:
        yield f"\n{title}"
        for name, weight in sorted(weights.items(), key=lambda item: -item[1])[:top]:
            yield f"  {100.0 * weight / total:6.1f} %  {name}"

    lines = [
        f"weight (py-spy: samples; pyinstrument: seconds): {sum(w for _, w in samples):.4g}, busy "
        f"{sum(w for _, w in busy):.4g}, imports {sum(w for _, w in imports):.4g} (left out); "
        "percentages of the busy steady-state weight",
    ]
    lines += table("by area (where the sampled frame is):", by_area)
    lines += table("hottest functions (self):", by_leaf)
    lines += table("Conclave attribution (each sample charged to the innermost Conclave frame):", attributed)
    lines += table(
        "Conclave inclusive (a sample counts for every Conclave function on its stack):", inclusive
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--point", default="k5n500", help="k3n1, k5n100, k5n500, coordinate or verify")
    parser.add_argument("--contender", default="conclave-api", choices=CONTENDERS)
    parser.add_argument("--tool", default="py-spy", choices=("py-spy", "pyinstrument"))
    parser.add_argument("--variant", default="default", choices=sorted(VARIANTS))
    parser.add_argument("--high-n", type=int, default=500)
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--ops", type=int, help="measured operations per worker (default: the suite's)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out-dir", type=Path, default=Path(".conclave/bench/profile"))
    args = parser.parse_args(argv)
    chosen = {p.id: p for p in points(quick=False, seq_ops=25, high_n=args.high_n)}
    if args.point not in chosen:
        parser.error(f"unknown point {args.point!r}; choose from {', '.join(chosen)}")
    point = chosen[args.point]
    if args.ops:
        point = dataclasses.replace(point, per_worker=args.ops)
    if args.tool == "py-spy" and shutil.which("py-spy", path=str(Path(sys.executable).parent)) is None:
        parser.error("py-spy is not installed in this environment (pip install -e '.[bench]')")
    raise_fd_limit()
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{args.contender}-{point.id}-{args.tool}"
    work = out / "work"  # config, event log and transcripts of the profiled cell; removed afterwards
    work.mkdir(exist_ok=True)
    with contextlib.ExitStack() as cleanup, panel_process(200.0) as urls:
        cleanup.callback(shutil.rmtree, work, ignore_errors=True)
        put_scenarios(urls, scenarios())
        config = write_config(work, urls["openai"], VARIANTS[args.variant], max_concurrency=4096)
        spec = {
            "kind": "op",
            "contender": args.contender,
            "point": point.to_dict(),
            "urls": urls,
            "config": str(config),
            "log": str(stem) + ".serve.log",
            "variant": None,
        }
        if args.tool == "pyinstrument":
            spec["profile"] = str(stem)
        cell = [sys.executable, "-m", "bench.cell", orjson.dumps(spec).decode(), str(stem) + ".result.json"]
        if args.tool == "py-spy":
            spy = str(Path(sys.executable).with_name("py-spy"))
            raw = str(stem) + ".raw.txt"
            command = [spy, "record", "-f", "raw", "--nolineno", "--full-filenames", "--nonblocking"]
            command += [
                "-r",
                str(args.rate),
                "-o",
                raw,
                *(["--subprocesses"] if "serve" in args.contender else []),
            ]
            subprocess.run([*command, "--", *cell], check=True, timeout=1800)
        else:
            subprocess.run(cell, check=True, timeout=1800)
    result = orjson.loads((Path(str(stem) + ".result.json")).read_bytes())
    if "failed" in result:
        print(result["traceback"], file=sys.stderr)
        return 1
    samples = (
        read_pyspy(Path(raw)) if args.tool == "py-spy" else read_pyinstrument(stem.with_suffix(".pyisession"))
    )
    head = f"{args.contender} at {point.label} under {args.tool}: {result['throughput']:.1f} ops/s, "
    head += f"overhead p50 {result['overhead_ms']['p50']:.1f} ms, "
    head += f"CPU {result['cpu_ms_per_call']:.3f} ms per provider call"
    report = head + "\n" + summarize(samples, args.top)
    Path(str(stem) + ".summary.txt").write_text(report + "\n", encoding="utf-8")
    print(report)
    print(f"\nfiles: {stem}.*")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
