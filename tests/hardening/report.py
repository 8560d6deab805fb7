"""`scripts/hardening`: run the hardening suites, then print one table of their figures.

    scripts/hardening                 # the fast subset (what CI runs), then the table
    scripts/hardening --long          # the long runs too (CONCLAVE_LONG=1: 1,000-call load, 10-minute soak, ...)
    scripts/hardening --no-run        # only print the table from the figures already recorded
    scripts/hardening -- -k load      # extra pytest arguments (earlier figures are then kept)
    scripts/hardening --markdown      # the table as Markdown, for the README

Each suite records its figures with `tests.hardening.figures.record` into `.conclave/hardening/`.
A full run clears that directory first, so a figure no suite wrote shows as "not run". The exit
status is 0 when pytest passed and no figure missed its target, else 1.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from tests.hardening.figures import (
    DIR_ENV,
    LONG_ENV,
    REPO_ROOT,
    Expected,
    clear,
    figures_dir,
    load_all,
    ordered,
    verdict,
)

HEADERS = ("figure", "value", "target", "result", "command to reproduce")


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, pytest_args = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(prog="scripts/hardening", description=__doc__.split("\n\n")[0])
    parser.add_argument("--long", action="store_true", help="run the long suites too (CONCLAVE_LONG=1)")
    parser.add_argument("--no-run", action="store_true", help="print the recorded figures without running")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    return parser.parse_args(argv), pytest_args


def run_suites(long: bool, pytest_args: list[str]) -> int:
    env = dict(os.environ)
    env[DIR_ENV] = str(figures_dir())
    if long:
        env[LONG_ENV] = "1"
    else:
        env.pop(LONG_ENV, None)
    command = [sys.executable, "-m", "pytest", "tests/hardening", "-q", *pytest_args]
    print(f"== {'CONCLAVE_LONG=1 ' if long else ''}{' '.join(command[2:])}", flush=True)
    return subprocess.run(command, cwd=REPO_ROOT, env=env, check=False).returncode


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.0f}"
    return str(value)


def row_cells(row: Any, since: datetime | None) -> tuple[str, str, str, str, str]:
    if isinstance(row, Expected):
        return row.name, "not run", row.target, "-", f".venv/bin/pytest {row.suite}"
    value = fmt(row.get("value"))
    if row.get("unit") and row.get("unit") not in ("%",):
        value = f"{value} {row['unit']}"
    elif row.get("unit") == "%":
        value = f"{value}%"
    if row.get("total") is not None:
        value = f"{value} / {fmt(row['total'])}"
    result = verdict(row) or "-"
    recorded = _parse_time(row.get("recorded_at"))
    if since is not None and recorded is not None and recorded < since:
        result += " (earlier run)"
    target = "-" if row.get("target") is None else str(row["target"])
    return row["figure"], value, target, result, str(row.get("command") or "-")


def render(rows: Sequence[tuple[str, ...]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
        for cells in rows:
            *first, command = cells
            lines.append("| " + " | ".join([*first, f"`{command}`"]) + " |")
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS[:-1])]
    out = []
    for cells in [HEADERS, (*("-" * w for w in widths), "-" * 20), *rows]:
        out.append("  ".join(c.ljust(w) for c, w in zip(cells[:-1], widths, strict=True)) + "  " + cells[-1])
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    args, pytest_args = parse_args(argv)
    status = 0
    since = None
    if not args.no_run:
        if not pytest_args:
            clear()
        since = datetime.now(UTC).replace(microsecond=0)
        status = run_suites(args.long, pytest_args)
    rows = [row_cells(row, since) for row in ordered(load_all())]
    print()
    print(f"Conclave hardening figures ({'long run' if args.long else 'fast subset'}; {figures_dir()})")
    print(render(rows, args.markdown))
    results = [r[3].split(" ")[0] for r in rows]
    summary = (
        f"{results.count('PASS')} PASS, {results.count('MISS')} MISS, "
        f"{sum(r[1] == 'not run' for r in rows)} not run"
    )
    if not args.no_run:
        summary += f"; pytest exit status {status}"
    print(summary)
    return 1 if results.count("MISS") or status not in (0, 5) else 0


def _parse_time(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text))
    except ValueError:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
