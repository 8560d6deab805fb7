"""Hardening figures: each suite records what it measured; `scripts/hardening` prints them as one table.

A figure is one small JSON file, `.conclave/hardening/<slug of the name>.json` (the directory can be
moved with `CONCLAVE_HARDENING_DIR`), holding one record:

    {"figure": "ssrf: refused via fetch", "value": 48, "total": 48, "target": "== total",
     "command": "CONCLAVE_LONG=1 .venv/bin/pytest tests/hardening/test_ssrf_corpus.py", ...}

Suites call `record(...)` once per figure, normally right before their assertions, so a figure is
written even when the test then fails (the table shows MISS, not "not run"). Recording the same name
again replaces the earlier value.

    from tests.hardening.figures import record
    record("ssrf: refused via fetch", refused, total=len(corpus), target="== total")
    record("fuzz: crashes", crashes, target="== 0")
    record("load stdio: RSS drift %", 3.2, target="abs <= 10", unit="%")

`target` is a small comparison, checked by `verdict()`: `"== total"`, `"== 0"`, `">= 100000"`,
`"<= 10"`, `"< 5"`, `"> 0"`, `"abs <= 10"` (absolute value), or a bare number (meaning `==`).
`None` means informational (no PASS/MISS). `command` defaults to the pytest node running the call,
prefixed with `CONCLAVE_LONG=1` when the long run is on.

The rows the report expects (anything else recorded is shown after them) are `EXPECTED`; use these
names so the table lines up.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shlex
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

REPO_ROOT = Path(__file__).resolve().parents[2]
DIR_ENV = "CONCLAVE_HARDENING_DIR"
LONG_ENV = "CONCLAVE_LONG"


@dataclass(frozen=True)
class Expected:
    name: str
    target: str
    what: str

    @property
    def suite(self) -> str:
        """The test file that records this figure."""
        for prefix, file in SUITES.items():
            if self.name.startswith(prefix):
                return f"tests/hardening/{file}"
        return "tests/hardening"


SUITES = {
    "fault matrix": "test_fault_matrix.py",
    "ssrf": "test_ssrf_corpus.py",
    "injection": "test_injection.py",
    "fuzz": "test_fuzz.py",
    "load": "test_load.py",
    "soak": "test_load.py",
    "secrets": "test_secret_leaks.py",
    "bad input": "test_bad_input.py",
}


EXPECTED: tuple[Expected, ...] = (
    Expected("fault matrix: cells handled", "== total", "wire kind x fault x door cells handled"),
    Expected("fault matrix: cells handled (native)", "== total", "those in a native tool turn"),
    Expected("ssrf: refused via fetch", "== total", "SSRF corpus refused by the fetch tool"),
    Expected("ssrf: refused via worker", "== total", "SSRF corpus refused inside a worker tool call"),
    Expected("ssrf: refused via worker (native)", "== total", "the same, as native tool calls"),
    Expected("injection: neutralized", "== total", "hostile pages structurally neutralized"),
    Expected("injection: canary leaks flagged", "== total", "leaks flagged / leaks planted"),
    Expected("injection: tags executed from tool content", "== 0", "tool_call tags inside tool results"),
    Expected("injection: neutralized (native)", "== total", "the same pages, fetched by native tool calls"),
    Expected("injection: canary leaks flagged (native)", "== total", "leaks flagged / planted, native"),
    Expected("injection: tags executed from tool content (native)", "== 0", "tags are only text there"),
    Expected("fuzz: cases", ">= 100000", "Hypothesis cases generated (long run)"),
    Expected("fuzz: crashes", "== 0", "crashes found by fuzzing"),
    Expected("load stdio: responses lost", "== 0", "confer calls over stdio with no reply"),
    Expected("load stdio: transcripts lost or corrupt", "== 0", "missing, unparsable or mismatched"),
    Expected("load stdio: invalid event lines", "== 0", "event lines failing their schema"),
    Expected("load stdio: RSS drift %", "abs <= 10", "server RSS after the run vs after warm-up"),
    Expected("load http: responses lost", "== 0", "confer calls over HTTP with no reply"),
    Expected("load http: transcripts lost or corrupt", "== 0", "missing, unparsable or mismatched"),
    Expected("load http: invalid event lines", "== 0", "event lines failing their schema"),
    Expected("load http: RSS drift %", "abs <= 10", "server RSS after the run vs after warm-up"),
    Expected("soak: duration s", ">= 600", "steady traffic (long run: 10 minutes)"),
    Expected("soak: throughput confers/s", ">= 19", "completed confers per second"),
    Expected("soak: errors", "== 0", "lost, invalid or duplicated replies; transcript/event faults"),
    Expected("soak: RSS drift %", "abs <= 10", "server RSS at the end vs after warm-up"),
    Expected("secrets: occurrences found", "== 0", "canary keys (plain, base64, URL-encoded) found"),
    Expected("bad input: structured errors", "== total", "cases ending in a structured error"),
)


def figures_dir() -> Path:
    configured = os.environ.get(DIR_ENV)
    return Path(configured) if configured else REPO_ROOT / ".conclave" / "hardening"


def long_run() -> bool:
    return os.environ.get(LONG_ENV) == "1"


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "figure"


def current_command() -> str | None:
    """The command reproducing the running pytest test, from `PYTEST_CURRENT_TEST`."""
    current = os.environ.get("PYTEST_CURRENT_TEST")
    if not current:
        return None
    node = current.rsplit(" (", 1)[0]
    prefix = f"{LONG_ENV}=1 " if long_run() else ""
    return f"{prefix}.venv/bin/pytest {shlex.quote(node)}"


def record(
    name: str,
    value: Any,
    total: Any = None,
    target: str | float | None = None,
    command: str | None = None,
    *,
    unit: str | None = None,
    details: Any = None,
) -> Path:
    """Write one figure (atomically; the same name replaces the earlier record). Returns the file."""
    data = {
        "figure": name,
        "value": value,
        "total": total,
        "target": target,
        "command": command or current_command(),
        "unit": unit,
        "long": long_run(),
        "recorded_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "details": details,
    }
    folder = figures_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{slug(name)}.json"
    fd, temp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(orjson.dumps(data, option=orjson.OPT_INDENT_2, default=str))
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    return path


def load_all(folder: Path | None = None) -> dict[str, dict[str, Any]]:
    """Every readable record by figure name; unreadable files are skipped."""
    out: dict[str, dict[str, Any]] = {}
    folder = folder or figures_dir()
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.json")):
        try:
            data = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        if isinstance(data, dict) and isinstance(data.get("figure"), str):
            out[data["figure"]] = data
    return out


def clear(folder: Path | None = None) -> None:
    folder = folder or figures_dir()
    for path in folder.glob("*.json") if folder.is_dir() else ():
        path.unlink(missing_ok=True)


_TARGET = re.compile(r"^\s*(abs\s+)?(==|=|>=|<=|>|<|!=)\s*(\S+)\s*$")


def verdict(rec: dict[str, Any]) -> str | None:
    """ "PASS", "MISS", or None when the figure has no target (or cannot be judged)."""
    target = rec.get("target")
    value = rec.get("value")
    if target is None or value is None:
        return None if target is None else "MISS"
    if isinstance(target, int | float) and not isinstance(target, bool):
        target = f"== {target}"
    match = _TARGET.match(str(target))
    if match is None or not _is_number(value):
        return None
    absolute, op, rhs_text = match.groups()
    rhs: Any = rec.get("total") if rhs_text == "total" else _number(rhs_text)
    if not _is_number(rhs):
        return None
    left = abs(float(value)) if absolute else float(value)
    right = float(rhs)
    ok = {
        "==": math.isclose(left, right),
        "=": math.isclose(left, right),
        "!=": not math.isclose(left, right),
        ">=": left >= right,
        "<=": left <= right,
        ">": left > right,
        "<": left < right,
    }[op]
    return "PASS" if ok else "MISS"


def ordered(records: dict[str, dict[str, Any]], expected: Iterable[Expected] = EXPECTED) -> list[Any]:
    """Expected rows first (an `Expected` where nothing was recorded), then any others by name."""
    rows: list[Any] = []
    seen = set()
    for row in expected:
        rows.append(records.get(row.name, row))
        seen.add(row.name)
    rows.extend(records[name] for name in sorted(records) if name not in seen)
    return rows


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
