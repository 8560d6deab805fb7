"""Running an eval: every strategy on every item, each line written to `results.jsonl` as it comes.

The order of events is the user's protection:
- everything that can be refused is refused before the first call (the suite, the strategy
  names, an `--out` that already holds another run, and with `--max-cost` the dry-run bound);
- items run `concurrency` at a time, but one item's strategies run one after another, so the
  requests a member receives for one item come in the same order on every run;
- each finished (strategy, item) is one line appended and flushed, so an interrupted run loses
  nothing it paid for, and `--resume` skips what the file already holds;
- with `--max-cost`, an item is started only while what was spent plus its own bound fits.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Final, Literal, Protocol

import anyio
import orjson

from conclave.app.api import Conclave
from conclave.app.evals import judging, scoring
from conclave.app.evals.strategies import Ask, Outcome, Strategy
from conclave.app.evals.suite import Item, Suite
from conclave.core.errors import ConclaveError
from conclave.core.messages import Usage
from conclave.core.records import record
from conclave.schema.schemas import first_error

RESULTS: Final = "results.jsonl"
Stopped = Literal["max_cost", "interrupted"] | None
_SESSION_UNSAFE = str.maketrans(dict.fromkeys(" /\\\"'<>|?*#%&{}[]()!$@+=,;~`^", "_"))


class EvalRefused(ConclaveError):
    """The eval would not start: nothing was sent. The message says why and what to change."""

    code = "eval_refused"


@record(kw_only=True)
class Plan:
    """What to run: the suite, the strategies, and the limits the user set."""

    suite: Suite
    strategies: tuple[Strategy, ...]
    out: Path
    judges: tuple[str, ...] = ()
    concurrency: int = 4
    max_cost: float | None = None
    resume: bool = False


@record(kw_only=True)
class Ran:
    """How the run ended, and every results line the run directory now holds for this plan."""

    lines: tuple[Mapping[str, Any], ...]
    stopped: Stopped
    spent_usd: float
    bound_usd: float | None


def earlier_lines(out: Path) -> list[dict[str, Any]]:
    """The lines of an earlier run in `out` (a torn last line, from a run killed mid-write, is
    dropped: its answer is asked again)."""
    path = out / RESULTS
    if not path.is_file():
        return []
    lines: list[dict[str, Any]] = []
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        problem = first_error("eval.result.json", line)
        if problem is not None:
            raise EvalRefused(
                f"{path} line {number} is not an eval result ({problem.message}); "
                "move the file away to start over"
            )
        lines.append(line)
    return lines


class Progress(Protocol):
    """Who is told how far the run is (the terminal's progress bar)."""

    def started(self, total: int) -> None: ...

    def answered(self, line: Mapping[str, Any]) -> None: ...


async def run(client: Conclave, plan: Plan, *, progress: Progress | None = None) -> Ran:
    """Run `plan`; see the module for the order of things. Refusals raise EvalRefused."""
    earlier = _earlier(plan)
    done = {(line["strategy"], line["item"]) for line in earlier}
    work = [(item, todo) for item in plan.suite.items if (todo := _todo(plan, item, done))]
    bounds = await _bounds(client, plan, work) if plan.max_cost is not None else None
    _check_total(plan, bounds)
    plan.out.mkdir(parents=True, exist_ok=True)
    state = _State(plan, bounds)
    if progress is not None:
        progress.started(sum(len(todo) for _, todo in work))
    with (plan.out / RESULTS).open("ab") as sink:
        writer = _Writer(sink, state, progress)
        limiter = anyio.CapacityLimiter(max(plan.concurrency, 1))
        async with anyio.create_task_group() as group:
            for item, todo in work:
                group.start_soon(_run_item, client, plan, item, todo, writer, limiter)
    return Ran(
        lines=tuple(_for_plan(plan, [*earlier, *writer.lines])),
        stopped=state.stopped,
        spent_usd=state.spent,
        bound_usd=sum(b for b in bounds.values() if b is not None) if bounds is not None else None,
    )


def _earlier(plan: Plan) -> list[dict[str, Any]]:
    earlier = earlier_lines(plan.out)
    if earlier and not plan.resume:
        raise EvalRefused(
            f"{plan.out} already holds an eval's results ({len(earlier)} lines); "
            "add --resume to finish that run, or give another --out"
        )
    return earlier


def _todo(plan: Plan, item: Item, done: set[tuple[str, str]]) -> tuple[Strategy, ...]:
    return tuple(s for s in plan.strategies if s.applies_to(item) and (s.name, item.id) not in done)


def lines_of(plan: Plan) -> list[Mapping[str, Any]]:
    """What `plan.out`'s results file holds about `plan` (after an interrupted run)."""
    return _for_plan(plan, earlier_lines(plan.out))


def _for_plan(plan: Plan, lines: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The lines about this plan's items and strategies (a resumed directory may hold others)."""
    items = {item.id for item in plan.suite.items}
    names = {s.name for s in plan.strategies}
    return [line for line in lines if line["item"] in items and line["strategy"] in names]


async def _bounds(
    client: Conclave, plan: Plan, work: Sequence[tuple[Item, tuple[Strategy, ...]]]
) -> dict[str, float | None]:
    """Each item's dry-run bound over its strategies (and its judging): nothing is sent."""
    bounds: dict[str, float | None] = {}
    for item, todo in work:
        ask = Ask.of(item, "dry-run")
        parts = [await strategy.bound(client, ask) for strategy in todo]
        if item.kind == "judge":
            judged = await judging.bound(client, plan.judges, item)
            parts.extend([judged] * len(todo))
        bounds[item.id] = None if any(p is None for p in parts) else sum(p for p in parts if p is not None)
    return bounds


def _check_total(plan: Plan, bounds: Mapping[str, float | None] | None) -> None:
    if plan.max_cost is None or bounds is None:
        return
    unknown = [item for item, bound in bounds.items() if bound is None]
    if unknown:
        raise EvalRefused(
            f"--max-cost {plan.max_cost:g}: the cost cannot be bounded, because a provider the run uses "
            f"has no price (first item: {unknown[0]}); give it a `price` in the config, or drop --max-cost"
        )
    total = sum(b for b in bounds.values() if b is not None)
    if total > plan.max_cost:
        raise EvalRefused(
            f"--max-cost {plan.max_cost:g}: the dry-run bound is ${total:.4f} for {len(bounds)} items "
            "(every call spending its whole max_tokens); nothing was sent. Lower --limit or max_tokens, "
            "or raise --max-cost"
        )


class _State:
    """What the run has spent, and whether it stopped; one per run."""

    def __init__(self, plan: Plan, bounds: Mapping[str, float | None] | None) -> None:
        self.max_cost = plan.max_cost
        self.bounds = bounds or {}
        self.spent = 0.0
        self.reserved = 0.0
        self.stopped: Stopped = None

    def may_start(self, item: Item) -> bool:
        """With --max-cost, reserve the item's bound; refuse when it would not fit."""
        if self.stopped is not None:
            return False
        if self.max_cost is None:
            return True
        bound = self.bounds.get(item.id) or 0.0
        if self.spent + self.reserved + bound > self.max_cost:
            self.stopped = "max_cost"
            return False
        self.reserved += bound
        return True

    def finished(self, item: Item, spent: float) -> None:
        if self.max_cost is not None:
            self.reserved -= self.bounds.get(item.id) or 0.0
        self.spent += spent


class _Writer:
    """Appends one results line per answer, flushed, and tells the progress display."""

    def __init__(self, sink: IO[bytes], state: _State, progress: Progress | None) -> None:
        self.sink = sink
        self.state = state
        self.progress = progress
        self.lines: list[dict[str, Any]] = []

    def write(self, line: dict[str, Any]) -> None:
        self.sink.write(orjson.dumps(line) + b"\n")
        self.sink.flush()
        self.lines.append(line)
        if self.progress is not None:
            self.progress.answered(line)


async def _run_item(
    client: Conclave,
    plan: Plan,
    item: Item,
    todo: Sequence[Strategy],
    writer: _Writer,
    limiter: anyio.CapacityLimiter,
) -> None:
    async with limiter:
        if not writer.state.may_start(item):
            return
        spent = 0.0
        token = secrets.token_hex(3)
        for strategy in todo:
            line = await _answer(client, plan, item, strategy, token)
            spent += line["cost_usd"] or 0.0
            writer.write(line)
        writer.state.finished(item, spent)


async def _answer(client: Conclave, plan: Plan, item: Item, strategy: Strategy, token: str) -> dict[str, Any]:
    ask = Ask.of(item, session_id(item, strategy, token))
    started = time.perf_counter()
    try:
        outcome = await strategy.answer(client, ask)
    except ConclaveError as exc:  # a refusal of the call itself (a provider gone from the config)
        outcome = Outcome(value=None, status="failed", usage=Usage(), calls=0, error=str(exc))
    latency_ms = (time.perf_counter() - started) * 1000
    line = _line(strategy, item, outcome, latency_ms)
    if outcome.status != "failed" and item.kind == "judge":
        verdict = await judging.judge(
            client, plan.judges, item, outcome.value, session=f"{ask.session}-judge"
        )
        line.update(correct=verdict.correct, judges=verdict.to_list())
    elif outcome.status != "failed":
        line["correct"] = scoring.score(item, outcome.value)
    return line


def _line(strategy: Strategy, item: Item, outcome: Outcome, latency_ms: float) -> dict[str, Any]:
    cost = outcome.usage.cost_usd
    line: dict[str, Any] = {
        "strategy": strategy.name,
        "item": item.id,
        "correct": False,  # a failed answer is a wrong one: the table counts failures apart too
        "value": outcome.value,
        "cost_usd": round(cost, 10) if cost is not None else None,
        "latency_ms": round(latency_ms, 3),
        "tokens": outcome.usage.total_tokens,
        "calls": outcome.calls,
        "status": outcome.status,
    }
    if outcome.error is not None:
        line["error"] = outcome.error
    return line


def session_id(item: Item, strategy: Strategy, token: str) -> str:
    """A session id the calls' events and transcripts can be found by: `eval-<item>-<strategy>-<token>`."""
    readable = f"eval-{item.id}-{strategy.name}".translate(_SESSION_UNSAFE)
    return f"{readable[:100]}-{token}"
