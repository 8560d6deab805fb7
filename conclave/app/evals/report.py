"""The eval's report: `summary.json` (schemas/eval.summary.json) and the table a terminal shows.

Accuracy is over the items that could be scored (a failed answer is scored, as wrong; only a
free-text answer no judge could grade is not), with a 95% Wilson interval. Each strategy is
compared with the best single member on the items both answered: the difference in accuracy,
its paired-bootstrap interval, and McNemar's exact p. Nothing here calls a model.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Final

from conclave.app.evals import stats
from conclave.app.evals.strategies import Samples, Strategy

VERSION: Final = 1


def summarize(
    lines: Sequence[Mapping[str, Any]],
    strategies: Sequence[Strategy],
    *,
    head: Mapping[str, Any],
    seed: int,
) -> dict[str, Any]:
    """summary.json's content: `head` (suite, items, times, seed, budget, panel, stopped, files)
    and one row per strategy, in the order given."""
    by_strategy = {s.name: [line for line in lines if line["strategy"] == s.name] for s in strategies}
    rows = [_row(s, by_strategy[s.name]) for s in strategies]
    best = _best_single(strategies, rows)
    if best is not None:
        for row in rows:
            if row["strategy"] != best:
                row["vs_best_single"] = _paired(by_strategy[row["strategy"]], by_strategy[best], best, seed)
    return {"version": VERSION, **head, "best_single": best, "judge": _judge(lines), "strategies": rows}


def _row(strategy: Strategy, lines: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    scored = [line for line in lines if line["correct"] is not None]
    correct = sum(1 for line in scored if line["correct"])
    low, high = stats.wilson(correct, len(scored))
    costs = [line["cost_usd"] for line in lines]
    latencies = [float(line["latency_ms"]) for line in lines]
    return {
        "strategy": strategy.name,
        "description": strategy.description,
        "calls_per_item": strategy.calls_per_item,
        "samples": strategy.samples,
        "items": len(lines),
        "scored": len(scored),
        "correct": correct,
        "accuracy": correct / len(scored) if scored else None,
        "ci_low": low if scored else None,
        "ci_high": high if scored else None,
        "failed": sum(1 for line in lines if line["status"] == "failed"),
        "degraded": sum(1 for line in lines if line["status"] == "degraded"),
        "cost_usd_per_item": _mean(costs) if lines and None not in costs else None,
        "tokens_per_item": _mean([line["tokens"] for line in lines]),
        "latency_ms_p50": stats.percentile(latencies, 50),
        "latency_ms_p95": stats.percentile(latencies, 95),
        "vs_best_single": None,
    }


def _best_single(strategies: Sequence[Strategy], rows: Sequence[Mapping[str, Any]]) -> str | None:
    """The single member with the highest accuracy (the first of equals, in the order given)."""
    singles = [
        row
        for strategy, row in zip(strategies, rows, strict=True)
        if isinstance(strategy, Samples)
        and strategy.name.startswith("single:")
        and row["accuracy"] is not None
    ]
    if not singles:
        return None
    return str(max(singles, key=lambda row: row["accuracy"])["strategy"])


def _paired(
    lines: Sequence[Mapping[str, Any]], best: Sequence[Mapping[str, Any]], against: str, seed: int
) -> dict[str, Any] | None:
    theirs = {line["item"]: line["correct"] for line in best if line["correct"] is not None}
    pairs = [
        (bool(line["correct"]), bool(theirs[line["item"]]))
        for line in lines
        if line["correct"] is not None and line["item"] in theirs
    ]
    if not pairs:
        return None
    ours, reference = [a for a, _ in pairs], [b for _, b in pairs]
    difference, low, high = stats.paired_bootstrap(ours, reference, seed=seed)
    return {
        "against": against,
        "difference": difference,
        "ci_low": low,
        "ci_high": high,
        "mcnemar_p": stats.mcnemar_exact(ours, reference),
        "pairs": len(pairs),
    }


def _judge(lines: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    judged = [line["judges"] for line in lines if line.get("judges")]
    if not judged:
        return None
    judges = list(dict.fromkeys(entry["judge"] for verdicts in judged for entry in verdicts))
    complete = [
        [entry["verdict"] for entry in verdicts] for verdicts in judged if all(e["verdict"] for e in verdicts)
    ]
    # Kappa needs as many ratings per answer; a resumed run may have changed its judges.
    raters = Counter(len(row) for row in complete).most_common(1)
    kappa = stats.fleiss_kappa([row for row in complete if len(row) == raters[0][0]]) if raters else None
    return {"judges": judges, "judged": len(judged), "kappa": kappa}


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


# ------------------------------------------------------------------ the terminal's table


def table(summary: Mapping[str, Any]) -> str:
    """The summary as a fixed-width table, then what the comparison says in words."""
    header = [
        "strategy",
        "accuracy",
        "95% CI",
        "cost/item",
        "tokens/item",
        "p50 ms",
        "p95 ms",
        "failed",
        "vs best single",
    ]
    rows = [header, *(_cells(row) for row in summary["strategies"])]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    text = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    return "\n".join([*text, *_notes(summary)])


def _cells(row: Mapping[str, Any]) -> list[str]:
    versus = row["vs_best_single"]
    return [
        row["strategy"],
        _percent(row["accuracy"]) + (f" ({row['correct']}/{row['scored']})" if row["scored"] else ""),
        f"{_percent(row['ci_low'])}–{_percent(row['ci_high'])}" if row["ci_low"] is not None else "—",
        _usd(row["cost_usd_per_item"]),
        f"{row['tokens_per_item']:.0f}" if row["tokens_per_item"] is not None else "—",
        _ms(row["latency_ms_p50"]),
        _ms(row["latency_ms_p95"]),
        str(row["failed"]),
        _versus(versus) if versus is not None else "—",
    ]


def _versus(versus: Mapping[str, Any]) -> str:
    points = versus["difference"] * 100
    low, high = versus["ci_low"] * 100, versus["ci_high"] * 100
    return f"{points:+.1f} pts [{low:+.1f}, {high:+.1f}] p={versus['mcnemar_p']:.2g}"


def _notes(summary: Mapping[str, Any]) -> list[str]:
    notes = [""]
    best = summary.get("best_single")
    if best is not None:
        notes.append(
            f"vs best single: accuracy difference against {best} on the same items, in points, "
            "with its 95% paired-bootstrap interval and McNemar's exact p."
        )
    judge = summary.get("judge")
    if judge is not None:
        kappa = judge["kappa"]
        agreement = f"{kappa:.2f}" if kappa is not None else "undefined"
        notes.append(
            f"judges ({', '.join(judge['judges'])}): {judge['judged']} answers judged, "
            f"Fleiss' kappa {agreement}"
        )
    if summary.get("stopped") == "max_cost":
        notes.append("stopped: the next item's bound would have passed --max-cost; --resume finishes the run")
    elif summary.get("stopped") == "interrupted":
        notes.append("stopped: interrupted; --resume finishes the run")
    return notes


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def _usd(value: float | None) -> str:
    if value is None:
        return "—"
    return f"${value:.6f}" if value < 0.01 else f"${value:.4f}"


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"
