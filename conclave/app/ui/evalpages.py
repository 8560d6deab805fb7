"""The eval runs as HTML: the list of the runs under `evals.dir`, and one run as the table of its
strategies, the judges' agreement and the chart `conclave eval` drew.

Pure functions of the records in `evals`; every piece of text goes through `markup` (a strategy's
description, a suite's name and an unreadable summary's reason are data like any other). The
chart is an `<img>` of this same server: an SVG shown as an image runs no script.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlencode

from conclave.app.render import fmt_cost
from conclave.app.ui.evals import Comparison, Judge, Run, StrategyRow, Summary, parse_time
from conclave.app.ui.markup import Safe, el, join, void
from conclave.app.ui.pages import TITLE, document

NONE = "—"  # a number the run could not measure (no priced call, no scored item)
STOPPED = {
    "max_cost": "the cost cap was reached",
    "interrupted": "it was interrupted",
}


def eval_href(prefix: str, run: str) -> str:
    return f"{prefix}/eval?{urlencode({'run': run})}"


def chart_href(prefix: str, run: str) -> str:
    return f"{prefix}/eval/chart.svg?{urlencode({'run': run})}"


def results_href(prefix: str, run: str) -> str:
    return f"{prefix}/eval/results.jsonl?{urlencode({'run': run})}"


# -- the list ---------------------------------------------------------------------------------


def evals_page(runs: Sequence[Run], prefix: str, where: str) -> Safe:
    """Every run under `where` (`evals.dir`), newest first."""
    if not runs:
        empty = f"No eval runs under {where} yet. Run `conclave eval`, and each run appears here."
        return document(f"{TITLE} · evals", el("main", el("p", empty, class_="empty")), prefix, "evals")
    head = el(
        "tr",
        [el("th", h) for h in ("run", "suite", "items", "started", "strategies", "best", "stopped")],
    )
    table = el("table", el("thead", head), el("tbody", [_run_row(r, prefix) for r in runs]), class_="evals")
    main = el("main", el("h1", "Eval runs"), el("p", f"Under {where}, newest first.", class_="muted"), table)
    return document(f"{TITLE} · evals", main, prefix, "evals")


def _run_row(run: Run, prefix: str) -> Safe:
    link = el("td", el("a", run.name, href=eval_href(prefix, run.name)), class_="run")
    summary = run.summary
    if summary is None:
        problem = el("td", _unreadable(), " ", run.problem, colspan=6, class_="problem")
        return el("tr", link, problem, data_run=run.name, data_readable="false")
    best = summary.best
    shown_best = None if best is None else join([el("strong", best.strategy), " ", _percent(best.accuracy)])
    return el(
        "tr",
        link,
        el("td", summary.suite),
        el("td", str(summary.items), class_="num"),
        el("td", _when(summary.started_at), class_="when"),
        el("td", str(len(summary.strategies)), class_="num"),
        el("td", shown_best or NONE, class_="best"),
        el("td", _stopped_badge(summary.stopped)),
        data_run=run.name,
        data_readable="true",
    )


def _unreadable() -> Safe:
    return el("span", "unreadable", class_="badge bad")


def _stopped_badge(stopped: str | None) -> Safe | None:
    if stopped is None:
        return None
    return el("span", f"stopped: {stopped}", class_="badge bad", title=STOPPED.get(stopped, stopped))


# -- one run ----------------------------------------------------------------------------------


def eval_page(run: Run, prefix: str, *, chart: bool, results: bool) -> Safe:
    """One run: `chart` and `results` say whether its `chart.svg` and `results.jsonl` are there."""
    summary = run.summary
    stopped = None if summary is None else _stopped_badge(summary.stopped)
    title = el("h1", el("span", "eval", class_="tool"), " ", run.name, " ", stopped)
    parts: list[Safe | None] = [title]
    if summary is None:
        head = el("strong", "Unreadable: ")
        text = f"its summary.json is {run.problem}" if run.problem else "its summary.json cannot be read"
        parts.append(el("section", head, _unreadable(), " ", text, class_="banner degraded", role="alert"))
    else:
        parts += [_stopped_banner(summary), _facts(summary), _strategies(summary), _judge(summary.judge)]
        parts.append(_chart(run.name, prefix, chart))
    parts.append(_files(run, prefix, results))
    return document(f"{TITLE} · eval {run.name}", el("main", join(parts)), prefix, "evals")


def _stopped_banner(summary: Summary) -> Safe | None:
    if summary.stopped is None:
        return None
    why = STOPPED.get(summary.stopped, summary.stopped)
    text = f"{why} ({summary.stopped}); the numbers cover only the items run before it stopped."
    return el("section", el("strong", "Stopped early: "), text, class_="banner warn", role="alert")


def _facts(summary: Summary) -> Safe:
    started, finished = parse_time(summary.started_at), parse_time(summary.finished_at)
    took = (finished - started).total_seconds() if started and finished else None
    cells = [
        ("suite", summary.suite),
        ("items", str(summary.items)),
        ("started", _when(summary.started_at)),
        ("took", _duration(took)),
        ("panel", ", ".join(summary.panel) or NONE),
        ("best single member", summary.best_single or NONE),
        ("budget", summary.budget),
        ("seed", str(summary.seed)),
    ]
    return el("dl", [el("div", el("dt", name), el("dd", value)) for name, value in cells], class_="totals")


def _strategies(summary: Summary) -> Safe:
    names = (
        "strategy",
        "description",
        "accuracy",
        "correct / scored",
        "failed",
        "degraded",
        "cost / item",
        "tokens / item",
        "latency p50 / p95",
        "vs best single",
    )
    head = el("tr", [el("th", h) for h in names])
    best = summary.best
    rows = [_strategy_row(s, s is best) for s in summary.strategies]
    table = el("div", el("table", el("thead", head), el("tbody", rows), class_="strategies"), class_="wide")
    about = (
        "Accuracy: correct of scored, with its 95% interval. vs best single: the difference in "
        "accuracy against the best single member on the same items, in points, with its 95% "
        "interval and McNemar's p. ★ marks the most accurate strategy."
    )
    return el("section", el("h2", "Strategies"), table, el("p", about, class_="muted"))


def _strategy_row(row: StrategyRow, best: bool) -> Safe:
    accuracy = el(
        "td",
        _percent(row.accuracy),
        el("div", _interval(row.ci_low, row.ci_high), class_="hint"),
        class_="num",
        data_accuracy=NONE if row.accuracy is None else repr(row.accuracy),
    )
    return el(
        "tr",
        el("th", row.strategy, " ★" if best else None),
        el("td", row.description, class_="description"),
        accuracy,
        el("td", f"{row.correct}/{row.scored}", class_="num"),
        el("td", str(row.failed), class_="num bad" if row.failed else "num"),
        el("td", str(row.degraded), class_="num bad" if row.degraded else "num"),
        el("td", NONE if row.cost_usd_per_item is None else fmt_cost(row.cost_usd_per_item), class_="num"),
        el("td", _amount(row.tokens_per_item), class_="num"),
        el("td", _latency(row.latency_ms_p50, row.latency_ms_p95), class_="num"),
        el("td", _versus(row.vs_best_single), class_="num versus"),
        data_strategy=row.strategy,
        class_="top" if best else None,
    )


def _percent(fraction: float | None) -> str:
    return NONE if fraction is None else f"{fraction * 100:.1f}%"


def _interval(low: float | None, high: float | None) -> str | None:
    if low is None or high is None:
        return None
    return f"{low * 100:.1f}–{high * 100:.1f}"


def _amount(value: float | None) -> str:
    return NONE if value is None else f"{value:,.0f}"


def _latency(p50: float | None, p95: float | None) -> str:
    if p50 is None and p95 is None:
        return NONE
    return f"{_amount(p50)} / {_amount(p95)} ms"


def _versus(comparison: Comparison | None) -> Safe | str:
    if comparison is None:
        return NONE
    lines = (
        f"95% CI {comparison.ci_low * 100:+.1f} to {comparison.ci_high * 100:+.1f}",
        f"McNemar {_p(comparison.mcnemar_p)}, {comparison.pairs} pairs",
        f"vs {comparison.against}",
    )
    points = el("strong", f"{comparison.difference * 100:+.1f} pts")
    return join([points, [el("div", line, class_="hint") for line in lines]])


def _p(value: float) -> str:
    return "p < 0.001" if value < 0.001 else f"p = {value:.3f}"


def _judge(judge: Judge | None) -> Safe | None:
    if judge is None:
        return None
    kappa = "undefined (too few answers or judges, or one verdict throughout)"
    if judge.kappa is not None:
        kappa = f"{judge.kappa:.2f}"
    text = (
        f"Judged by {', '.join(judge.judges) or NONE}: {judge.judged} answers judged. Agreement "
        f"between the judges (Fleiss' κ; 1: complete, 0: no better than chance): {kappa}."
    )
    return el("section", el("h2", "Judge agreement"), el("p", text), class_="judge")


def _chart(name: str, prefix: str, present: bool) -> Safe:
    if not present:
        missing = "No chart: chart.svg is drawn only where matplotlib is installed."
        return el("section", el("h2", "Chart"), el("p", missing, class_="muted"))
    image = void(
        "img",
        src=chart_href(prefix, name),
        alt=f"{name}: each strategy's accuracy against its cost per item",
        class_="chart",
    )
    return el("section", el("h2", "Chart"), image)


def _files(run: Run, prefix: str, results: bool) -> Safe:
    if results:
        link: Safe = el(
            "a", "results.jsonl", href=results_href(prefix, run.name), download=f"{run.name}-results.jsonl"
        )
        line = join([link, " (every item, strategy and answer: one JSON object a line)"])
    else:
        line = el("span", "results.jsonl is missing", class_="muted")
    return el("section", el("h2", "Files"), el("p", line), el("p", str(run.folder), class_="sid"))


def _duration(seconds: float | None) -> str:
    """How long a run took, as its times (whole seconds) allow: `12 min 30 s`, `under 1 s`."""
    if seconds is None or seconds < 0:
        return NONE
    if seconds < 1:
        return "under 1 s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def _when(ts: str) -> str:
    stamp = parse_time(ts)
    return ts if stamp is None else stamp.strftime("%Y-%m-%d %H:%M:%S UTC")
