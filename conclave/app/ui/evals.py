"""Where the page finds eval runs: the folders under `evals.dir` that hold a `summary.json`, each
one run of `conclave eval` (`<evals.dir>/<run>/`: `summary.json`, `results.jsonl`, and
`chart.svg` and `chart.png` when matplotlib was there to draw them).

A run's name comes from a URL, so it is a name and nothing else: it must match `RUN_NAME` (no
separator, no `.` or `..`), and the folder it names, and each file read in it, must still be inside
`evals.dir` once symbolic links are resolved; anything else is no run at all. A summary that cannot
be read, is not JSON, or is not a summary (checked against schemas/eval.summary.json) is listed
with the reason, never raised.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from conclave.schema.schemas import first_error, json_path

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")  # a file name: at most 255 bytes
SUMMARY = "summary.json"
RESULTS = "results.jsonl"
CHART_SVG = "chart.svg"
SUMMARY_SCHEMA = "eval.summary.json"
SUMMARY_VERSION = 1
MAX_SUMMARY_BYTES = 4_194_304  # a summary is a few KB: past this it is not one
LISTED = 200  # runs the list shows, newest first


@dataclass(frozen=True, slots=True)
class Comparison:
    """A strategy against the best single member, on the same items: `difference` in accuracy
    (a fraction, as `accuracy` is) with its 95% interval, McNemar's p, and the pairs compared."""

    against: str
    difference: float
    ci_low: float
    ci_high: float
    mcnemar_p: float
    pairs: int


@dataclass(frozen=True, slots=True)
class StrategyRow:
    strategy: str
    description: str
    calls_per_item: int
    samples: int
    items: int
    scored: int
    correct: int
    accuracy: float | None  # 0..1
    ci_low: float | None
    ci_high: float | None
    failed: int
    degraded: int
    cost_usd_per_item: float | None
    tokens_per_item: float | None
    latency_ms_p50: float | None
    latency_ms_p95: float | None
    vs_best_single: Comparison | None


@dataclass(frozen=True, slots=True)
class Judge:
    judges: tuple[str, ...]
    judged: int
    kappa: float | None


@dataclass(frozen=True, slots=True)
class Summary:
    suite: str
    items: int
    started_at: str
    finished_at: str
    seed: int
    budget: str
    panel: tuple[str, ...]
    stopped: str | None  # max_cost | interrupted
    best_single: str | None
    judge: Judge | None
    strategies: tuple[StrategyRow, ...]

    @property
    def best(self) -> StrategyRow | None:
        """The strategy with the highest accuracy (the first of equals); None when none has one."""
        scored = [s for s in self.strategies if s.accuracy is not None]
        return max(scored, key=lambda s: s.accuracy or 0.0) if scored else None


@dataclass(frozen=True, slots=True)
class Run:
    """One folder of `evals.dir` with a `summary.json`: its summary, or why it cannot be read."""

    name: str
    folder: Path
    summary: Summary | None
    problem: str | None
    written: float  # the summary's modification time (what orders an unreadable one)

    @property
    def started(self) -> float:
        """When the run started, as a timestamp (its summary's time when it has one)."""
        if self.summary is not None and (stamp := parse_time(self.summary.started_at)) is not None:
            return stamp.timestamp()
        return self.written


class EvalRuns:
    """The runs under one `evals.dir`, read afresh at each request (they are few and small)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def runs(self, limit: int = LISTED) -> list[Run]:
        """Every run, newest first (by when it started)."""
        try:
            names = sorted(entry.name for entry in self.root.iterdir())
        except OSError:  # no folder yet, or not one we may read
            return []
        found = [run for name in names if (run := self.run(name)) is not None]
        return sorted(found, key=lambda run: run.started, reverse=True)[:limit]

    def run(self, name: str) -> Run | None:
        """The run named `name`, or None: not a run name, not a folder inside `evals.dir`, or no
        `summary.json` in it."""
        folder = self.folder(name)
        if folder is None:
            return None
        path = inside(folder, SUMMARY)
        if path is None:
            return None
        try:
            written = path.stat().st_mtime
        except OSError:
            return None
        summary, problem = read_summary(path)
        return Run(name, folder, summary, problem, written)

    def folder(self, name: str) -> Path | None:
        """The folder of the run named `name`, resolved, when it is one inside `evals.dir`."""
        if not RUN_NAME.fullmatch(name):
            return None
        try:
            root = self.root.resolve()
            folder = (root / name).resolve()
        except (OSError, RuntimeError):  # a symbolic link loop
            return None
        if folder == root or not folder.is_relative_to(root) or not folder.is_dir():
            return None
        return folder

    def file(self, name: str, filename: str) -> Path | None:
        """A file of a run (`results.jsonl`, `chart.svg`), when the run and the file are there
        (its summary is not read: an unreadable one still offers the results)."""
        folder = self.folder(name)
        if folder is None or inside(folder, SUMMARY) is None:
            return None
        return inside(folder, filename)


def inside(folder: Path, filename: str) -> Path | None:
    """`folder/filename` resolved, when it is a file that is still inside `folder`."""
    try:
        path = (folder / filename).resolve()
        return path if path.is_relative_to(folder) and path.is_file() else None
    except (OSError, RuntimeError):
        return None


# -- reading a summary ------------------------------------------------------------------------


def read_summary(path: Path) -> tuple[Summary | None, str | None]:
    """The summary in `path`, or None and why it cannot be read, in words."""
    try:
        size = path.stat().st_size
        if size > MAX_SUMMARY_BYTES:
            return None, f"too large to be a summary ({size:,} bytes)"
        raw = path.read_bytes()
    except OSError as exc:
        return None, f"cannot be read: {exc.strerror or exc}"
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return None, f"not JSON: {exc}"
    if isinstance(data, dict) and "version" in data and data["version"] != SUMMARY_VERSION:
        return None, f"version {_shown(data['version'])}: this page reads version {SUMMARY_VERSION}"
    error = first_error(SUMMARY_SCHEMA, data)
    if error is not None:
        return None, f"not a valid summary: {json_path(error)}: {error.message}"
    return _summary(data), None


def _summary(data: Mapping[str, Any]) -> Summary:
    """A summary valid against schemas/eval.summary.json, as records."""
    judge = data["judge"]
    return Summary(
        suite=data["suite"],
        items=data["items"],
        started_at=data["started_at"],
        finished_at=data["finished_at"],
        seed=data["seed"],
        budget=data["budget"],
        panel=tuple(data["panel"]),
        stopped=data["stopped"],
        best_single=data["best_single"],
        judge=None if judge is None else Judge(tuple(judge["judges"]), judge["judged"], judge["kappa"]),
        strategies=tuple(_strategy(row) for row in data["strategies"]),
    )


def _strategy(row: Mapping[str, Any]) -> StrategyRow:
    versus = row["vs_best_single"]
    fields = {name: row[name] for name in StrategyRow.__dataclass_fields__ if name != "vs_best_single"}
    return StrategyRow(**fields, vs_best_single=None if versus is None else Comparison(**versus))


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_time(text: str) -> datetime | None:
    """An ISO-8601 time in UTC (one without a zone is taken as UTC); None when it is not one."""
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        return None
    return stamp.replace(tzinfo=UTC) if stamp.tzinfo is None else stamp.astimezone(UTC)
