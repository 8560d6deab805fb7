"""The benchmark suite: Conclave against the physical limit (raw aiohttp) and against a litellm
fan-out, in one run, interleaved.

    scripts/bench [--quick] [--out PATH] [--reps N] [...]      (= .venv/bin/python -m bench)

The fake provider is the simulated panel in its own process at a fixed latency (200 ms), so
a zero-overhead client would finish a confer in exactly 200 ms. Every (contender, point)
cell runs in a fresh `python -m bench.cell` process, so CPU and peak RSS never mix; cells
are interleaved round-robin (the contender order rotates) within each repetition, and each
figure is the median over repetitions with the range printed beside it.

Operating points: K=3 N=1 (sequential confers), K=5 N=100 and K=5 N=500 (N closed-loop
workers in flight), coordinate 1 proposer + 2 critics + 1 synthesizer (ideal: 3 sequential
calls), and a K=3 confer whose members each make one verify hop (ideal: 2 sequential calls).
Also measured: the in-process verify hop, `conclave serve` start to the first tools/list
reply, the cost of telemetry and transcripts (on/off), and the provider-layer figures
(`bench.providers`). A summary table checks the performance targets (docs/performance.md).
Times are reported, never asserted: a busy machine makes them noisy.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from bench.common import (
    CONCLAVE_CONTENDERS,
    CONTENDERS,
    LATENCY_MS,
    LIMIT,
    LITELLM,
    VARIANTS,
    Point,
    Spread,
    bench_env,
    points,
    scenarios,
    telemetry_off_means,
    write_config,
)
from bench.panel import panel_process, put_scenarios

DEFAULT_OUT = Path(".conclave/bench/results.json")
CELL_TIMEOUT_S = 900  # a hung cell is killed; nothing here is unbounded
SERVE_LIST = (
    b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",'
    b'"capabilities":{},"clientInfo":{"name":"conclave-bench","version":"1"}}}\n'
    b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
    b'{"jsonrpc":"2.0","id":2,"method":"tools/list"}\n'
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def rotated(items: Sequence[Any], by: int) -> list[Any]:
    if not items:
        return []
    by %= len(items)
    return [*items[by:], *items[:by]]


# --------------------------------------------------------------------------- running cells


@dataclass
class Runner:
    work: Path
    urls: dict[str, str]
    configs: dict[str, Path]
    count: int = 0

    def cell(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Run one cell in a fresh process; its JSON result (or a `failed` entry)."""
        self.count += 1
        started = time.perf_counter()
        out = self.work / f"cell-{self.count:04d}.json"
        err = self.work / f"cell-{self.count:04d}.log"
        full = {"urls": self.urls, "log": str(self.work / f"serve-{self.count:04d}.log"), **spec}
        with err.open("wb") as stderr:
            try:
                subprocess.run(
                    [sys.executable, "-m", "bench.cell", orjson.dumps(full).decode(), str(out)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    timeout=CELL_TIMEOUT_S,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                return {"failed": f"cell timed out after {CELL_TIMEOUT_S} s", **_ids(spec)}
        if not out.exists():
            tail = err.read_text(errors="replace")[-2000:]
            return {"failed": f"cell wrote no result; stderr tail:\n{tail}", **_ids(spec)}
        result: dict[str, Any] = orjson.loads(out.read_bytes())
        return {**_ids(spec), **result, "cell_s": time.perf_counter() - started}


def _ids(spec: dict[str, Any]) -> dict[str, Any]:
    point = spec.get("point") or {}
    return {"contender": spec.get("contender"), "point": point.get("id"), "variant": spec.get("variant")}


def without_window(result: dict[str, Any]) -> bool:
    """Whether a cell was too slow for a steady window (`steady_window_s` present and null)."""
    return "steady_window_s" in result and result["steady_window_s"] is None


def describe_cell(result: dict[str, Any]) -> str:
    if "failed" in result:
        return f"FAILED: {result['failed'].splitlines()[0]}"
    if "per_call_us" in result:
        return f"{min(result['per_call_us']):.1f} us/call (best batch)"
    o = result["overhead_ms"]
    text = (
        f"{result['throughput']:8.1f} ops/s  overhead p50 {o['p50']:7.2f} p99 {o['p99']:7.2f} ms  "
        f"CPU {result['cpu_ms_per_call']:.3f} ms/call  RSS {result['peak_rss_mb']:.0f} MB  "
        f"burst max {result['burst_overhead_ms']['max']:.1f} ms"
    )
    if without_window(result):
        text += "  (no steady window: every operation after the burst)"
    if result["errors"]:
        text += f"  ERRORS {result['errors']}: {result['first_error']}"
    return text


# --------------------------------------------------------------------------- serve start-up


def serve_executable() -> list[str]:
    """What an MCP client runs: the `conclave` console script beside this interpreter."""
    script = Path(sys.executable).with_name("conclave")
    return [str(script)] if script.exists() else [sys.executable, "-m", "conclave"]


def serve_startup_ms(config: Path) -> float:
    """From spawning `conclave serve` to its tools/list reply (initialize sent first, pipelined)."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [*serve_executable(), "serve", "--config", str(config)],
        env=bench_env(os.environ),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        proc.stdin.write(SERVE_LIST)
        proc.stdin.flush()
        for _ in range(10):  # the initialize reply, then the tools/list reply
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError("conclave serve exited before answering tools/list")
            reply = orjson.loads(line)
            if reply.get("id") == 2:
                elapsed = (time.perf_counter() - start) * 1000.0
                if not reply.get("result", {}).get("tools"):
                    raise RuntimeError(f"tools/list failed: {reply}")
                return elapsed
        raise RuntimeError("no tools/list reply among the first lines")
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --------------------------------------------------------------------------- aggregation

METRICS: dict[str, Callable[[dict[str, Any]], float | None]] = {
    "overhead_p50_ms": lambda r: r["overhead_ms"]["p50"],
    "overhead_p95_ms": lambda r: r["overhead_ms"]["p95"],
    "overhead_p99_ms": lambda r: r["overhead_ms"]["p99"],
    "throughput": lambda r: r["throughput"],
    "burst_overhead_p50_ms": lambda r: r["burst_overhead_ms"]["p50"],
    "burst_overhead_max_ms": lambda r: r["burst_overhead_ms"]["max"],
    "cpu_ms_per_call": lambda r: r["cpu_ms_per_call"],
    "client_cpu_ms_per_call": lambda r: r.get("client_cpu_ms_per_call"),
    "peak_rss_mb": lambda r: r["peak_rss_mb"],
}


def _ok(result: dict[str, Any]) -> bool:
    return "failed" not in result and result.get("ops", 0) > 0


def aggregate(cells: list[dict[str, Any]], pts: Sequence[Point], contenders: Sequence[str]) -> dict[str, Any]:
    """Per point and contender: the median and range of each metric over repetitions."""
    out: dict[str, Any] = {}
    for point in pts:
        out[point.id] = {}
        for name in contenders:
            mine = [
                c for c in cells if c["point"] == point.id and c["contender"] == name and not c["variant"]
            ]
            good = [c for c in mine if _ok(c)]
            row: dict[str, Any] = {metric: Spread.of(get(c) for c in good) for metric, get in METRICS.items()}
            row["errors"] = sum(c.get("errors", 0) for c in good) + sum(1 for c in mine if not _ok(c))
            row["first_error"] = next(
                (c.get("first_error") or c.get("failed") for c in mine if c.get("errors") or not _ok(c)), None
            )
            row["ops"] = sum(c.get("ops", 0) for c in good)
            row["without_window"] = sum(1 for c in good if without_window(c))
            out[point.id][name] = row
    return out


def paired(
    cells: list[dict[str, Any]],
    point: str,
    a: str,
    b: str,
    combine: Callable[[dict[str, Any], dict[str, Any]], float | None],
) -> Spread | None:
    """`combine(a's cell, b's cell)` within each repetition, so drift hits both sides alike."""
    values = []
    for rep in sorted({c["rep"] for c in cells if "rep" in c}):
        ca = _find(cells, point, a, rep)
        cb = _find(cells, point, b, rep)
        if ca is not None and cb is not None:
            values.append(combine(ca, cb))
    return Spread.of(values)


def _find(cells: list[dict[str, Any]], point: str, contender: str, rep: int) -> dict[str, Any] | None:
    for c in cells:
        if c["point"] == point and c["contender"] == contender and c.get("rep") == rep and not c["variant"]:
            return c if _ok(c) else None
    return None


def _div(x: float | None, y: float | None) -> float | None:
    return None if x is None or not y else x / y


def ratios(cells: list[dict[str, Any]], pts: Sequence[Point], contenders: Sequence[str]) -> dict[str, Any]:
    """Conclave / limit and Conclave / litellm, paired within each repetition."""
    out: dict[str, Any] = {}
    for point in pts:
        out[point.id] = {}
        for name in (c for c in CONCLAVE_CONTENDERS if c in contenders):
            row: dict[str, Spread | None] = {}
            for other, tag in ((LIMIT, "limit"), (LITELLM, "litellm")):
                if other not in contenders:
                    continue
                pid = point.id
                row[f"throughput_vs_{tag}"] = paired(
                    cells, pid, name, other, lambda a, b: _div(a["throughput"], b["throughput"])
                )
                row[f"overhead_p50_vs_{tag}"] = paired(
                    cells,
                    pid,
                    name,
                    other,
                    lambda a, b: _div(a["overhead_ms"]["p50"], b["overhead_ms"]["p50"]),
                )
                row[f"overhead_p50_above_{tag}_ms"] = paired(
                    cells, pid, name, other, lambda a, b: a["overhead_ms"]["p50"] - b["overhead_ms"]["p50"]
                )
                row[f"cpu_per_call_vs_{tag}"] = paired(
                    cells, pid, name, other, lambda a, b: _div(a["cpu_ms_per_call"], b["cpu_ms_per_call"])
                )
                row[f"peak_rss_vs_{tag}"] = paired(
                    cells, pid, name, other, lambda a, b: _div(a["peak_rss_mb"], b["peak_rss_mb"])
                )
            out[point.id][name] = row
    return out


def telemetry_cost(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Throughput lost to telemetry and/or transcripts, against the `off` variant, per repetition."""
    variant_cells = [c for c in cells if c.get("variant")]
    out: dict[str, Any] = {}
    for variant in VARIANTS:
        mine = [c for c in variant_cells if c["variant"] == variant and _ok(c)]
        out[variant] = {
            "throughput": Spread.of(c["throughput"] for c in mine),
            "cpu_ms_per_call": Spread.of(c["cpu_ms_per_call"] for c in mine),
            "errors": sum(c.get("errors", 0) for c in mine),
        }
    reps = sorted({c["rep"] for c in variant_cells})

    def cost(variant: str) -> Spread | None:
        values = []
        for rep in reps:
            on = _variant(variant_cells, variant, rep)
            off = _variant(variant_cells, "off", rep)
            if on and off:
                values.append((1.0 - on["throughput"] / off["throughput"]) * 100.0)
        return Spread.of(values)

    def cpu_cost(variant: str) -> Spread | None:
        values = []
        for rep in reps:
            on = _variant(variant_cells, variant, rep)
            off = _variant(variant_cells, "off", rep)
            if on and off:
                values.append(on["cpu_ms_per_call"] - off["cpu_ms_per_call"])
        return Spread.of(values)

    for variant in ("default", "telemetry-only", "transcripts-only"):
        out[variant]["throughput_cost_pct"] = cost(variant)
        out[variant]["cpu_ms_per_call_added"] = cpu_cost(variant)
    return out


def _variant(cells: list[dict[str, Any]], variant: str, rep: int) -> dict[str, Any] | None:
    for c in cells:
        if c["variant"] == variant and c["rep"] == rep and _ok(c):
            return c
    return None


# --------------------------------------------------------------------------- targets


@dataclass(frozen=True)
class Target:
    label: str
    limit: float
    at_most: bool  # True: value <= limit passes; False: value >= limit passes
    unit: str
    value: Callable[[str], float | None]  # contender -> measured value (median)
    contenders: tuple[str, ...] = CONCLAVE_CONTENDERS

    def judge(self, contender: str) -> tuple[float | None, str]:
        if contender not in self.contenders:
            return None, ""
        v = self.value(contender)
        if v is None:
            return None, "n/a"
        passed = v <= self.limit if self.at_most else v >= self.limit
        return v, "PASS" if passed else "MISS"


def targets(
    agg: dict[str, Any],
    rat: dict[str, Any],
    extras: dict[str, Any],
    pts: dict[str, Point],
) -> list[Target]:
    def med(spread: Spread | None) -> float | None:
        return None if spread is None else spread.median

    def metric(point: str, metric_name: str) -> Callable[[str], float | None]:
        return lambda c: med(agg.get(point, {}).get(c, {}).get(metric_name))

    def ratio(point: str, name: str) -> Callable[[str], float | None]:
        return lambda c: med(rat.get(point, {}).get(c, {}).get(name))

    def label(point: str, text: str) -> str:
        p = pts.get(point)
        return f"K={p.k} N={p.n}: {text}" if p else f"{point}: {text}"

    tele = extras.get("telemetry_cost", {}).get("default", {})
    verify_us: Spread | None = extras.get("verify_hop")
    startup = extras.get("serve_startup_ms")
    api = ("conclave-api",)
    return [
        Target(label("k3n1", "overhead p50 <= 3 ms"), 3.0, True, "ms", metric("k3n1", "overhead_p50_ms")),
        Target(
            label("k3n1", "p50 <= 1.5 ms above raw aiohttp"),
            1.5,
            True,
            "ms",
            ratio("k3n1", "overhead_p50_above_limit_ms"),
        ),
        Target(
            label("k5n100", "throughput >= 0.8 x raw"),
            0.8,
            False,
            "x",
            ratio("k5n100", "throughput_vs_limit"),
        ),
        Target(
            label("k5n500", "throughput >= 0.6 x raw"),
            0.6,
            False,
            "x",
            ratio("k5n500", "throughput_vs_limit"),
        ),
        Target(
            label("k5n100", "throughput >= 5 x litellm"),
            5.0,
            False,
            "x",
            ratio("k5n100", "throughput_vs_litellm"),
        ),
        Target(
            label("k5n500", "throughput >= 5 x litellm"),
            5.0,
            False,
            "x",
            ratio("k5n500", "throughput_vs_litellm"),
        ),
        Target(
            label("k5n100", "overhead p99 <= 150 ms (steady)"),
            150.0,
            True,
            "ms",
            metric("k5n100", "overhead_p99_ms"),
        ),
        Target(
            label("k5n500", "peak RSS <= 0.3 x litellm"),
            0.3,
            True,
            "x",
            ratio("k5n500", "peak_rss_vs_litellm"),
        ),
        Target(
            "verify hop in process <= 1 ms",
            1.0,
            True,
            "ms",
            lambda c: None if verify_us is None else verify_us.median / 1000.0,
            api,
        ),
        Target(
            "serve start -> first tools/list <= 300 ms",
            300.0,
            True,
            "ms",
            lambda c: None if startup is None else startup.median,
            ("conclave-stdio",),
        ),
        Target(
            "telemetry + transcripts cost <= 10 % of throughput",
            10.0,
            True,
            "%",
            lambda c: med(tele.get("throughput_cost_pct")),
            api,
        ),
    ]


# --------------------------------------------------------------------------- printing


def fmt(spread: Spread | None, digits: int = 1) -> str:
    return "-" if spread is None else spread.fmt(digits)


def print_point(point: Point, row: dict[str, Any], rat: dict[str, Any], contenders: Sequence[str]) -> None:
    ideal_tp = point.n / (point.ideal_ms / 1000.0)
    burst = point.n > 1  # with one worker, the "burst" is just the first operation
    print(
        f"\n== {point.label}: {point.ops} ops per cell; ideal {point.ideal_ms:.0f} ms per op, "
        f"{ideal_tp:.0f} ops/s; overhead = wall - {point.ideal_ms:.0f} ms =="
    )
    if burst:
        print(
            f"   percentiles and ops/s: the steady window, {point.n} in flight; burst: the first "
            f"{point.n} begun at once, p50 and the last one's overhead"
        )
    head = (
        f"{'contender':<15} {'overhead p50 ms':>20} {'p95 ms':>20} {'p99 ms':>20} {'ops/s':>22} "
        f"{'CPU ms/call':>20} {'peak RSS MB':>16} {'err':>4}"
    )
    print(head + (f" {'burst p50 ms':>20} {'burst max ms':>20}" if burst else ""))
    for name in contenders:
        r = row.get(name)
        if r is None:
            continue
        line = (
            f"{name:<15} {fmt(r['overhead_p50_ms'], 2):>20} {fmt(r['overhead_p95_ms'], 2):>20} "
            f"{fmt(r['overhead_p99_ms'], 2):>20} {fmt(r['throughput'], 1):>22} "
            f"{fmt(r['cpu_ms_per_call'], 3):>20} {fmt(r['peak_rss_mb'], 0):>16} {r['errors']:>4}"
        )
        if burst:
            line += f" {fmt(r['burst_overhead_p50_ms'], 0):>20} {fmt(r['burst_overhead_max_ms'], 0):>20}"
        print(line)
        if r["first_error"]:
            print(f"{'':<15} first error: {str(r['first_error'])[:300]}")
        if r["without_window"]:
            print(
                f"{'':<15} {r['without_window']} cell(s) too slow for a steady window in this many "
                "operations: their figures take every operation after the burst"
            )
    for name, ratio_row in rat.items():
        parts = []
        for key, title, digits in (
            ("throughput_vs_limit", "ops/s vs raw", 2),
            ("overhead_p50_above_limit_ms", "p50 above raw ms", 2),
            ("cpu_per_call_vs_limit", "CPU vs raw", 1),
            ("throughput_vs_litellm", "ops/s vs litellm", 2),
            ("peak_rss_vs_litellm", "RSS vs litellm", 2),
        ):
            if ratio_row.get(key) is not None:
                parts.append(f"{title} {fmt(ratio_row[key], digits)}")
        if parts:
            print(f"  {name}: " + "; ".join(parts))


def print_extras(extras: dict[str, Any]) -> None:
    print("\n== also measured ==")
    hop = extras.get("verify_hop")
    if hop is not None:
        print(f"verify hop in process (runtime.call_tool): {hop.fmt(1)} us per call")
    startup = extras.get("serve_startup_ms")
    if startup is not None:
        print(f"conclave serve start -> first tools/list reply: {startup.fmt(0)} ms (n={startup.n})")
    tele = extras.get("telemetry_cost")
    if tele:
        point = extras.get("telemetry_point", {})
        print(
            f"telemetry / transcripts on vs off (conclave-api, {point.get('label', '')}; "
            f"'off' = {extras.get('telemetry_off', '?')} + transcripts.enabled false):"
        )
        for variant, row in tele.items():
            cost = row.get("throughput_cost_pct")
            added = row.get("cpu_ms_per_call_added")
            line = f"  {variant:<17} {fmt(row['throughput'], 1):>22} ops/s"
            line += f"  CPU {fmt(row['cpu_ms_per_call'], 3)} ms/call"
            if cost is not None:
                line += f"  throughput cost {fmt(cost, 1)} %"
            if added is not None:
                line += f"  CPU added {fmt(added, 3)} ms/call"
            print(line)


def print_targets(tgts: list[Target], contenders: Sequence[str]) -> list[dict[str, Any]]:
    shown = [c for c in CONCLAVE_CONTENDERS if c in contenders]
    print("\n== targets (medians of this run; PASS/MISS) ==")
    print(f"{'target':<52} " + " ".join(f"{c:>20}" for c in shown))
    rows = []
    for t in tgts:
        cells = []
        row: dict[str, Any] = {"target": t.label, "limit": t.limit, "unit": t.unit, "results": {}}
        for c in shown:
            value, verdict = t.judge(c)
            if not verdict:
                cells.append("")
            elif value is None:
                cells.append("n/a")
            else:
                cells.append(f"{value:.2f} {t.unit} {verdict}")
                row["results"][c] = {"value": value, "verdict": verdict}
        print(f"{t.label:<52} " + " ".join(f"{s:>20}" for s in cells))
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- the run


def jsonable(value: Any) -> Any:
    if isinstance(value, Spread):
        return value.to_dict()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("conclave", "aiohttp", "httpx", "httpx-aiohttp", "litellm", "openai", "psutil"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


@contextlib.contextmanager
def work_dir(base: Path, keep: bool) -> Iterator[Path]:
    work = base / f"work-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    work.mkdir(parents=True)
    try:
        yield work
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def raise_fd_limit() -> None:
    """N=500 x K=5 is 2,500 sockets on each side; children inherit the raised soft limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke test: 1 repetition, small N, few ops")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"results JSON (default {DEFAULT_OUT})")
    parser.add_argument("--reps", type=int, help="repetitions (default 3; --quick: 1)")
    parser.add_argument("--seq-ops", type=int, default=25, help="measured confers per cell at K=3 N=1")
    parser.add_argument("--high-n", type=int, default=500, help="N of the K=5 high-load point")
    parser.add_argument(
        "--serving-gc",
        action="store_true",
        help="the Python-API contender calls conclave.serving_gc() once started (as `conclave serve` "
        "does); the others keep the default collector",
    )
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=4096,
        help="limits.max_concurrency in the generated config (the shipped default, 64, caps N=500)",
    )
    parser.add_argument("--contenders", help=f"comma-separated subset of {','.join(CONTENDERS)}")
    parser.add_argument("--points", help="comma-separated subset of k3n1,k5n100,k5n500,coordinate,verify")
    parser.add_argument("--no-extras", action="store_true", help="skip verify hop, serve start-up, telemetry")
    parser.add_argument("--no-provider-layer", action="store_true", help="skip the provider-layer figures")
    parser.add_argument("--keep-work", action="store_true", help="keep configs, logs and cell results")
    args = parser.parse_args(argv)
    args.reps = args.reps or (1 if args.quick else 3)
    if args.reps < 1 or args.seq_ops < 1 or args.high_n < 1:
        parser.error("--reps, --seq-ops and --high-n must be >= 1")
    return args


def choose_contenders(args: argparse.Namespace, notes: list[str]) -> list[str]:
    wanted = args.contenders.split(",") if args.contenders else list(CONTENDERS)
    unknown = sorted(set(wanted) - set(CONTENDERS))
    if unknown:
        raise SystemExit(f"bench: unknown contender(s) {unknown}; choose from {', '.join(CONTENDERS)}")
    from bench.contenders import litellm_available

    if LITELLM in wanted and not litellm_available():
        wanted.remove(LITELLM)
        notes.append(
            "litellm is not installed: its column and ratios are skipped (pip install -e '.[bench]')"
        )
    return wanted


def run_matrix(
    runner: Runner, args: argparse.Namespace, pts: Sequence[Point], contenders: Sequence[str], tele: Point
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every repetition: each point with every contender (rotated order), then the extras' cells."""
    cells: list[dict[str, Any]] = []
    hops: list[dict[str, Any]] = []
    configs = runner.configs

    def record(rep: int, what: str, result: dict[str, Any], into: list[dict[str, Any]]) -> None:
        result["rep"] = rep
        into.append(result)
        took = f"{result['cell_s']:5.1f}s" if "cell_s" in result else "     "
        log(f"[rep {rep + 1}/{args.reps}] {took} {what:<44} {describe_cell(result)}")

    for rep in range(args.reps):
        for index, point in enumerate(pts):
            for name in rotated(contenders, rep + index):
                spec = {
                    "kind": "op",
                    "contender": name,
                    "point": point.to_dict(),
                    "variant": None,
                    "serving_gc": args.serving_gc,
                }
                result = runner.cell({**spec, "config": str(configs["default"])})
                record(rep, f"{point.label} {name}", result, cells)
        if args.no_extras:
            continue
        for variant in rotated(list(VARIANTS), rep):
            spec = {"kind": "op", "contender": "conclave-api", "point": tele.to_dict(), "variant": variant}
            result = runner.cell({**spec, "config": str(configs[variant])})
            record(rep, f"telemetry/transcripts: {variant}", result, cells)
        calls, batches = (200, 1) if args.quick else (2000, 3)
        spec = {"kind": "verify_hop", "config": str(configs["default"]), "calls": calls, "batches": batches}
        record(rep, "verify hop in process", runner.cell(spec), hops)
    return cells, hops


def measure_startup(config: Path, samples: int, notes: list[str]) -> Spread | None:
    values = []
    for _ in range(samples):
        try:
            values.append(serve_startup_ms(config))
        except (RuntimeError, OSError) as exc:
            notes.append(f"serve start-up measurement failed: {exc}")
            break
    log(f"serve start -> tools/list: {', '.join(f'{v:.0f}' for v in values)} ms")
    return Spread.of(values)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    notes: list[str] = []
    contenders = choose_contenders(args, notes)
    all_points = points(quick=args.quick, seq_ops=args.seq_ops, high_n=args.high_n)
    pts = [p for p in all_points if not args.points or p.id in args.points.split(",")]
    n, per_worker = (20, 2) if args.quick else (100, 4)
    tele = Point("telemetry", "confer", 3, n, per_worker, 1, LATENCY_MS)
    raise_fd_limit()
    started = time.perf_counter()
    load_before = os.getloadavg()
    if load_before[0] > 0.5:
        cores = os.cpu_count()
        notes.append(f"busy machine (load average {load_before[0]:.2f} on {cores} cores): figures are noisy")
    extras: dict[str, Any] = {}
    base = args.out.parent if str(args.out.parent) not in ("", ".") else Path(".conclave/bench")
    with work_dir(base, args.keep_work) as work:
        with panel_process(LATENCY_MS) as urls:
            put_scenarios(urls, scenarios())
            configs = {
                name: write_config(work, urls["openai"], variant, max_concurrency=args.max_concurrency)
                for name, variant in VARIANTS.items()
            }
            log(
                f"bench: panel at {urls['openai']} ({LATENCY_MS:.0f} ms); {len(pts)} points x "
                f"{len(contenders)} contenders x {args.reps} repetition(s); work dir {work}"
            )
            cells, hops = run_matrix(Runner(work, urls, configs), args, pts, contenders, tele)
            if not args.no_extras:
                extras["serve_startup_ms"] = measure_startup(
                    configs["default"], 2 if args.quick else 5, notes
                )
        if not args.no_provider_layer:
            extras["provider_layer"] = provider_layer(work, quick=args.quick)
    good_hops = [h for h in hops if "failed" not in h]
    if good_hops:
        extras["verify_hop"] = Spread.of(min(h["per_call_us"]) for h in good_hops)
    if not args.no_extras:
        extras["telemetry_cost"] = telemetry_cost(cells)
        extras["telemetry_point"] = tele.to_dict()
        extras["telemetry_off"] = telemetry_off_means()
    agg = aggregate(cells, pts, contenders)
    rat = ratios(cells, pts, contenders)
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "argv": list(sys.argv[1:] if argv is None else argv),
        "quick": args.quick,
        "reps": args.reps,
        "latency_ms": LATENCY_MS,
        "max_concurrency": args.max_concurrency,
        "serving_gc": args.serving_gc,  # the Python-API contender only
        "cpu_count": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "platform": platform.platform(),
        "versions": versions(),
        "elapsed_s": time.perf_counter() - started,
        "notes": notes,
    }
    target_rows = print_report(meta, pts, contenders, agg, rat, extras)
    print(f"results: {args.out}")
    payload = {
        "meta": meta,
        "points": [p.to_dict() for p in pts],
        "contenders": contenders,
        "aggregate": agg,
        "ratios": rat,
        "extras": extras,
        "targets": target_rows,
        "cells": cells + hops,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(orjson.dumps(jsonable(payload), option=orjson.OPT_INDENT_2))
    failed = sum(1 for c in [*cells, *hops] if "failed" in c or c.get("errors"))
    if failed:
        print(f"WARNING: {failed} cell(s) failed or had errors; see the table and {args.out}")
    return 1 if failed else 0


def print_report(
    meta: dict[str, Any],
    pts: Sequence[Point],
    contenders: Sequence[str],
    agg: dict[str, Any],
    rat: dict[str, Any],
    extras: dict[str, Any],
) -> list[dict[str, Any]]:
    print(
        f"Conclave benchmark: simulated panel at {LATENCY_MS:.0f} ms in its own process; "
        f"{meta['reps']} interleaved repetition(s); each cell a fresh process; "
        "figures are medians [min-max over repetitions]."
    )
    before, after = meta["load_average_before"][0], meta["load_average_after"][0]
    print(f"machine: {meta['cpu_count']} cores, load average {before:.2f} before / {after:.2f} after")
    for point in pts:
        print_point(point, agg[point.id], rat[point.id], contenders)
    print_extras(extras)
    if extras.get("provider_layer"):
        from bench.providers import report

        print("\n== provider layer (0 ms panel) ==")
        report(extras["provider_layer"])
    rows = print_targets(targets(agg, rat, extras, {p.id: p for p in pts}), contenders)
    for note in meta["notes"]:
        print(f"note: {note}")
    print(f"total time {meta['elapsed_s']:.0f} s")
    return rows


def provider_layer(work: Path, *, quick: bool) -> dict[str, Any] | None:
    """The provider-layer figures (`bench.providers`, its own 0 ms panel), in a subprocess."""
    out = work / "provider-layer.json"
    counts = ["--calls", "30", "--rounds", "1", "--rate-requests", "300"] if quick else [
        "--calls", "200", "--rounds", "3", "--rate-requests", "3000"
    ]  # fmt: skip
    log("provider layer (0 ms panel) ...")
    try:
        subprocess.run(
            [sys.executable, "-m", "bench.providers", *counts, "--json", str(out)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            timeout=CELL_TIMEOUT_S,
            check=True,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        log(f"provider layer failed: {exc}")
        return None
    figures: dict[str, Any] = orjson.loads(out.read_bytes())
    return figures


if __name__ == "__main__":
    raise SystemExit(main())
