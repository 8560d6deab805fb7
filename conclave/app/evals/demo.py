"""`conclave eval --demo`: `builtin:basic` on the simulated panel, twice, with members whose accuracy
and shared mistakes are set (seeded), so the report shows both sides of the question.

- "independent": three comparable members whose mistakes rarely coincide. A majority of them is
  right more often than any one of them, even one sampled as often as the vote asks the panel.
- "shared mistakes": one strong member and two weak ones who tend to make the same mistake. Two
  wrong answers outvote the right one, and the vote falls below its best member.

Every call goes through the real stack (adapters, HTTP on loopback, the simulated wires); only the
answers are drawn by the simulated panel's oracle (conclave/app/sim/oracle.py).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Final

import anyio

from conclave.app.evals import command, scoring
from conclave.app.evals.suite import Item, Suite, letters, load_suite
from conclave.app.sim.oracle import Oracle, OracleItem
from conclave.app.sim.simulated import SimulatedPanel
from conclave.core.records import record
from conclave.schema.config import Config


@record(kw_only=True)
class Case:
    name: str
    story: str
    accuracy: Mapping[str, float]  # by the simulated model's name
    correlation: float  # errors shared across members (the oracle's rho)
    consistency: float  # a member's own samples agreeing beyond that (sigma)


CASES: Final = (
    Case(
        name="independent",
        story="three comparable members whose mistakes rarely coincide",
        accuracy={"sim-gpt": 0.78, "sim-claude": 0.75, "sim-gemini": 0.72},
        correlation=0.0,
        consistency=0.85,  # a member's own samples mostly repeat its answer, as real ones do
    ),
    Case(
        name="shared-mistakes",
        story="one strong member and two weaker ones who tend to make the same mistakes",
        accuracy={"sim-gpt": 0.90, "sim-claude": 0.62, "sim-gemini": 0.60},
        correlation=0.75,
        consistency=0.2,
    ),
)
SUITE: Final = "builtin:basic"


def main(config: Config, options: command.Options, *, out: IO[str], err: IO[str]) -> int:
    suite = load_suite(SUITE, limit=options.limit)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    root = Path(options.out) if options.out is not None else Path(config.evals.dir)
    verdicts: list[str] = []
    for case in CASES:
        print(f"\n== case {case.name!r}: {case.story}", file=out)
        summary = anyio.run(_case, config, suite, case, options, root / f"{stamp}-demo-{case.name}", out, err)
        verdicts.append(verdict(case, summary))
    print("\n" + "\n".join(verdicts), file=out)
    print("Nothing called a real provider: the simulated panel drew every answer.", file=out)
    return command.EXIT_OK


async def _case(
    config: Config,
    suite: Suite,
    case: Case,
    options: command.Options,
    out_dir: Path,
    out: IO[str],
    err: IO[str],
) -> dict[str, Any]:
    async with SimulatedPanel(config) as sim:
        sim.panel.set_oracle(oracle(suite, case, seed=options.seed))
        case_options = dataclasses.replace(options, suite=SUITE, out=str(out_dir), resume=False)
        prepared = command.prepare(sim.config, case_options)
        started = command.now()
        ran = await command.run(sim.config, prepared, err, f"demo {case.name}")
        return command.finish(prepared, ran, case_options, started=started, out=out, err=err)


def oracle(suite: Suite, case: Case, *, seed: int) -> Oracle:
    items = [_oracle_item(item, suite.items) for item in suite.items if item.kind != "judge"]
    return Oracle(items, case.accuracy, correlation=case.correlation, consistency=case.consistency, seed=seed)


def _oracle_item(item: Item, suite: Sequence[Item]) -> OracleItem:
    field = scoring.scored_field(item)
    assert field is not None  # judge items are left out
    return OracleItem(
        question=item.question, field=field, correct=item.answer, wrong=wrong_answers(item, suite)
    )


def wrong_answers(item: Item, suite: Sequence[Item]) -> tuple[Any, ...]:
    """Plausible mistakes: a number off by a slip, another option, or another item's answer of
    the same family (another weekday for a weekday)."""
    if item.kind == "choice":
        return tuple(letter for letter in letters(len(item.choices)) if letter != item.answer)
    if item.kind == "number":
        value = float(item.answer)
        slips = (value + 1, value - 1, value * 10, value / 2 if value else 2.0, -value if value else 1.0)
        return tuple(s for s in dict.fromkeys(slips) if not scoring.score(item, s))
    family = item.id.split("-", 1)[0]
    others = [str(o.answer) for o in suite if o.kind == "exact" and o.id.split("-", 1)[0] == family]
    wrong = tuple(a for a in dict.fromkeys(others) if not scoring.score(item, a))
    return wrong or (f"not {item.answer}",)


def verdict(case: Case, summary: Mapping[str, Any]) -> str:
    """One line: did the vote beat the best single member in this case, by how much, and is that
    more than chance on this many items."""
    rows = {row["strategy"]: row for row in summary["strategies"]}
    vote, best = rows.get("vote"), summary.get("best_single")
    if vote is None or best is None or vote["vs_best_single"] is None:
        return f"{case.name}: no comparison (nothing scored)"
    versus = vote["vs_best_single"]
    points = versus["difference"] * 100
    if points > 0:
        said = f"the vote beat its best member, {best}, by {points:.1f} points"
    elif points < 0:
        said = f"the vote did not beat its best member, {best}: {-points:.1f} points below it"
    else:
        said = f"the vote tied with its best member, {best}"
    beyond = versus["mcnemar_p"] < 0.05 and (versus["ci_low"] > 0 or versus["ci_high"] < 0)
    return f"{case.name}: {said}" + ("" if beyond or not points else " (within chance on this many items)")
