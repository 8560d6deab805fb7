"""`conclave eval SUITE`: check everything, run, then write and print the report (docs/eval.md).

Exit statuses: 0 the run finished; 1 it stopped early (--max-cost) and --resume finishes it; 2 it
was refused before anything was sent (a malformed suite, an unknown strategy or provider, an
--out holding another run, a bound over --max-cost); 130 interrupted (what was answered is kept).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Final, Literal

import anyio
import orjson

from conclave.app.api import Conclave
from conclave.app.evals import chart, report, runner
from conclave.app.evals.progress import Bar
from conclave.app.evals.strategies import UnknownStrategy, parse_strategies
from conclave.app.evals.suite import Suite, SuiteError, load_suite
from conclave.core.records import record
from conclave.schema.config import Config

EXIT_OK, EXIT_STOPPED, EXIT_REFUSED, EXIT_INTERRUPTED = 0, 1, 2, 130
SUMMARY: Final = "summary.json"
Budget = Literal["equal", "none"]


@record(kw_only=True)
class Options:
    """`conclave eval`'s options, as parsed."""

    suite: str
    strategies: str | None = None
    budget: Budget = "equal"
    limit: int | None = None
    concurrency: int = 4
    max_cost: float | None = None
    out: str | None = None
    resume: bool = False
    seed: int = 0
    judges: str | None = None
    json: bool = False


@record(kw_only=True)
class Prepared:
    """Everything checked before the first call: what `run` needs."""

    suite: Suite
    plan: runner.Plan
    panel: tuple[str, ...]


def main(config: Config, options: Options, *, out: IO[str], err: IO[str]) -> int:
    try:
        prepared = prepare(config, options)
    except (SuiteError, UnknownStrategy, runner.EvalRefused) as exc:
        print(f"conclave eval: {exc}", file=err)
        return EXIT_REFUSED
    started = now()
    try:
        ran = anyio.run(run, config, prepared, err, f"eval {prepared.suite.name}")
    except runner.EvalRefused as exc:
        print(f"conclave eval: {exc}", file=err)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        lines = runner.lines_of(prepared.plan)
        ran = runner.Ran(lines=tuple(lines), stopped="interrupted", spent_usd=0.0, bound_usd=None)
        finish(prepared, ran, options, started=started, out=out, err=err)
        return EXIT_INTERRUPTED
    summary = finish(prepared, ran, options, started=started, out=out, err=err)
    return EXIT_STOPPED if summary["stopped"] else EXIT_OK


def prepare(config: Config, options: Options) -> Prepared:
    """Load the suite and check every name against the config; raise before anything is sent."""
    suite = load_suite(options.suite, limit=options.limit)
    providers = tuple(config.providers)
    panel = tuple(config.panel)
    strategies = parse_strategies(
        options.strategies,
        panel=panel,
        providers=providers,
        critics=len(config.roles.critics),
        budget=options.budget,
    )
    judges = _judges(options.judges, panel, providers) if any(i.kind == "judge" for i in suite.items) else ()
    out = _out_dir(config, suite, options)
    plan = runner.Plan(
        suite=suite,
        strategies=tuple(strategies),
        out=out,
        judges=judges,
        concurrency=options.concurrency,
        max_cost=options.max_cost,
        resume=options.resume,
    )
    return Prepared(suite=suite, plan=plan, panel=panel)


async def run(config: Config, prepared: Prepared, err: IO[str], description: str) -> runner.Ran:
    """The prepared plan on `config`'s panel, with its progress bar on `err`."""
    async with Conclave(config) as client:
        with Bar(err, description=description) as bar:
            return await runner.run(client, prepared.plan, progress=bar)


def finish(
    prepared: Prepared, ran: runner.Ran, options: Options, *, started: str, out: IO[str], err: IO[str]
) -> dict[str, Any]:
    """Write summary.json and the chart beside results.jsonl, and print the table (or the JSON)."""
    summary = summarize(prepared, ran, options, started=started)
    plan = prepared.plan
    if chart.available() and any(row["accuracy"] is not None for row in summary["strategies"]):
        png, svg = chart.draw(summary, plan.out)
        summary["files"].update(chart_png=png, chart_svg=svg)
    elif not chart.available():
        print(f"conclave eval: {chart.MISSING}", file=err)
    plan.out.mkdir(parents=True, exist_ok=True)
    (plan.out / SUMMARY).write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2) + b"\n")
    if options.json:
        print(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode(), file=out)
    else:
        print(headline(summary), file=out)
        print(report.table(summary), file=out)
        print(
            f"files: {plan.out}/ ({', '.join(f for f in summary['files'].values() if f)}, {SUMMARY})",
            file=out,
        )
    return summary


def summarize(prepared: Prepared, ran: runner.Ran, options: Options, *, started: str) -> dict[str, Any]:
    plan = prepared.plan
    head = {
        "suite": prepared.suite.name,
        "items": len(prepared.suite.items),
        "started_at": started,
        "finished_at": now(),
        "seed": options.seed,
        "budget": options.budget,
        "panel": list(prepared.panel),
        "stopped": ran.stopped,
        "files": {"results": runner.RESULTS, "chart_png": None, "chart_svg": None},
    }
    return report.summarize(ran.lines, plan.strategies, head=head, seed=options.seed)


def headline(summary: Mapping[str, Any]) -> str:
    singles = [row for row in summary["strategies"] if row["strategy"].startswith("single:")]
    samples = (
        f", {singles[0]['samples']} samples per single member"
        if singles and singles[0]["samples"] > 1
        else ""
    )
    return (
        f"eval {summary['suite']}: {summary['items']} items, panel {', '.join(summary['panel'])}; "
        f"budget {summary['budget']}{samples}; seed {summary['seed']}"
    )


def _judges(text: str | None, panel: Sequence[str], providers: Sequence[str]) -> tuple[str, ...]:
    names = tuple(n.strip() for n in (text or "").split(",") if n.strip()) or tuple(panel)
    unknown = [n for n in names if n not in providers]
    if unknown:
        raise UnknownStrategy(
            f"--judges names {unknown[0]!r}, which is not configured ({', '.join(providers)})"
        )
    if not names:
        raise UnknownStrategy("the suite has judge items but there is no judge: give --judges or a panel")
    return names


_SLUG = re.compile(r"[^A-Za-z0-9._-]+")


def _out_dir(config: Config, suite: Suite, options: Options) -> Path:
    """--out, or for --resume without it the newest run of this suite, or a new dated directory."""
    if options.out is not None:
        return Path(options.out)
    root = Path(config.evals.dir)
    slug = _SLUG.sub("-", suite.name.removeprefix("builtin:").rsplit("/", 1)[-1]).strip("-") or "suite"
    if options.resume:
        earlier = sorted(p for p in root.glob(f"*-{slug}") if (p / runner.RESULTS).is_file())
        if not earlier:
            raise runner.EvalRefused(f"--resume: no earlier run of {suite.name} under {root}; give --out DIR")
        return earlier[-1]
    return root / f"{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}-{slug}"


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


__all__ = ["Options", "main", "prepare"]
