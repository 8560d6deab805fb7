"""Where the page finds eval runs: the folders under `evals.dir` that hold a `summary.json`, each
one run of `conclave eval` (`<evals.dir>/<run>/`: `summary.json`, `results.jsonl`, and
`chart.svg` and `chart.png` when matplotlib was there to draw them).

A run's name comes from a URL, so it is a name and nothing else: it must match `RUN_NAME` (no
separator, no `.` or `..`), and the folder it names, and each file read in it, must still be inside
`evals.dir` once symbolic links are resolved; anything else is no run at all. A summary that cannot
be read, is not JSON, or is not a summary (checked against schemas/eval.summary.json, then field by
field as the page reads it) is listed with the reason, never raised.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from conclave.schema.schemas import first_error, json_path, schema_dir

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
    problem = _schema_problem(data)
    if problem is not None:
        return None, problem
    try:
        return _summary(data), None
    except _Invalid as exc:
        return None, f"not a valid summary: {exc}"


def _schema_problem(data: Any) -> str | None:
    """What schemas/eval.summary.json finds wrong with `data`, if anything (and if the schema is
    there: the fields are checked again as they are read, so a summary is never trusted)."""
    if not (schema_dir() / SUMMARY_SCHEMA).is_file():
        return None
    try:
        error = first_error(SUMMARY_SCHEMA, data)
    except (RuntimeError, LookupError):  # the schema itself cannot be loaded
        return None
    if error is None:
        return None
    return f"not a valid summary: {json_path(error)}: {error.message}"


class _Invalid(ValueError):
    """A field of a summary that is missing or not what it must be: `$.path: what`. (A field that
    may be null may also be left out here; the schema, when there, is the stricter check.)"""


def _summary(data: Any) -> Summary:
    top = _object(data, "$")
    _field(top, "version", "$", int)
    strategies = _field(top, "strategies", "$", list)
    judge = top.get("judge")
    return Summary(
        suite=_text(top, "suite", "$"),
        items=_count(top, "items", "$"),
        started_at=_text(top, "started_at", "$"),
        finished_at=_text(top, "finished_at", "$"),
        seed=_field(top, "seed", "$", int),
        budget=_text(top, "budget", "$"),
        panel=_names(top, "panel", "$"),
        stopped=_optional_text(top, "stopped", "$"),
        best_single=_optional_text(top, "best_single", "$"),
        judge=None if judge is None else _judge(_object(judge, "$.judge")),
        strategies=tuple(_strategy(s, f"$.strategies[{i}]") for i, s in enumerate(strategies)),
    )


def _judge(raw: Mapping[str, Any]) -> Judge:
    where = "$.judge"
    return Judge(_names(raw, "judges", where), _count(raw, "judged", where), _number(raw, "kappa", where))


def _strategy(value: Any, where: str) -> StrategyRow:
    raw = _object(value, where)
    versus = raw.get("vs_best_single")
    return StrategyRow(
        strategy=_text(raw, "strategy", where),
        description=_text(raw, "description", where),
        calls_per_item=_count(raw, "calls_per_item", where),
        samples=_count(raw, "samples", where),
        items=_count(raw, "items", where),
        scored=_count(raw, "scored", where),
        correct=_count(raw, "correct", where),
        accuracy=_number(raw, "accuracy", where),
        ci_low=_number(raw, "ci_low", where),
        ci_high=_number(raw, "ci_high", where),
        failed=_count(raw, "failed", where),
        degraded=_count(raw, "degraded", where),
        cost_usd_per_item=_number(raw, "cost_usd_per_item", where),
        tokens_per_item=_number(raw, "tokens_per_item", where),
        latency_ms_p50=_number(raw, "latency_ms_p50", where),
        latency_ms_p95=_number(raw, "latency_ms_p95", where),
        vs_best_single=None if versus is None else _comparison(versus, f"{where}.vs_best_single"),
    )


def _comparison(value: Any, where: str) -> Comparison:
    raw = _object(value, where)
    return Comparison(
        against=_text(raw, "against", where),
        difference=_required_number(raw, "difference", where),
        ci_low=_required_number(raw, "ci_low", where),
        ci_high=_required_number(raw, "ci_high", where),
        mcnemar_p=_required_number(raw, "mcnemar_p", where),
        pairs=_count(raw, "pairs", where),
    )


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _Invalid(f"{where}: not an object")
    return value


def _field(raw: Mapping[str, Any], key: str, where: str, kind: type) -> Any:
    if key not in raw:
        raise _Invalid(f"{where}.{key}: missing")
    value = raw[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _Invalid(f"{where}.{key}: {_shown(value)} is not {_KINDS[kind]}")
    return value


_KINDS: Mapping[type, str] = {str: "a string", int: "an integer", list: "a list"}


def _text(raw: Mapping[str, Any], key: str, where: str) -> str:
    value: str = _field(raw, key, where, str)
    return value


def _optional_text(raw: Mapping[str, Any], key: str, where: str) -> str | None:
    return None if raw.get(key) is None else _text(raw, key, where)


def _count(raw: Mapping[str, Any], key: str, where: str) -> int:
    value: int = _field(raw, key, where, int)
    if value < 0:
        raise _Invalid(f"{where}.{key}: {value} is negative")
    return value


def _names(raw: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    values: Sequence[Any] = _field(raw, key, where, list)
    if not all(isinstance(v, str) for v in values):
        raise _Invalid(f"{where}.{key}: not a list of names")
    return tuple(values)


def _number(raw: Mapping[str, Any], key: str, where: str) -> float | None:
    """A finite number, or None (null, or left out: the schema, when there, says whether it may be)."""
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _Invalid(f"{where}.{key}: {_shown(value)} is not a number")
    return float(value)


def _required_number(raw: Mapping[str, Any], key: str, where: str) -> float:
    value = _number(raw, key, where)
    if value is None:
        raise _Invalid(f"{where}.{key}: null is not a number")
    return value


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
