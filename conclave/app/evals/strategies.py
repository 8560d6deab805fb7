"""The strategies an eval compares, each one way of answering an item through the public API.

- `single:NAME`: one member alone; under `--budget equal` it takes as many samples as the
  cheapest panel strategy makes calls, majority-voted, so the comparison is at equal calls.
- `sc:NAME:N`: self-consistency, N samples of one member, majority-voted.
- `vote`: the panel answers once each and the vote (docs/tools.md#structured-answers-and-the-vote) decides.
- `council`: the panel answers, reviews blind, and the chair decides (`synthesis.value`).
- `coordinate`: proposer, critics and synthesizer debate; the synthesizer decides.

Every strategy asks through the item's answer schema (`scoring.answer_schema`), so scoring never
reads prose. Free-text (`judge`) items have no schema: a sample is its text, the council's and
the debate's answer is the synthesis's, and a vote has nothing it could count (skipped).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, Final, Literal

import anyio

from conclave.app.api import Conclave
from conclave.app.evals import scoring
from conclave.app.evals.suite import Item
from conclave.core.errors import ConclaveError
from conclave.core.messages import Usage
from conclave.core.records import record
from conclave.deliberation.results import Answer, ConferResult, CoordinateResult, RoleAnswer
from conclave.deliberation.vote import Vote, tally

# Samples of one model are drawn warm: at temperature 0 they would all be the same answer.
SAMPLE_TEMPERATURE: Final = 0.7
Status = Literal["ok", "degraded", "failed", "skipped"]


class UnknownStrategy(ConclaveError):
    """A strategy the eval does not know, or one naming a provider that is not configured."""

    code = "invalid_strategy"


@record(kw_only=True)
class Outcome:
    """What one strategy answered on one item, and what that cost."""

    value: Any
    status: Status
    usage: Usage
    calls: int
    error: str | None = None


@record(kw_only=True)
class Ask:
    """One item as every strategy asks it."""

    item: Item
    schema: Mapping[str, Any] | None
    field: str | None
    vote_fields: tuple[str, ...]
    tolerance: float
    session: str  # a prefix for the calls' session ids, so an eval's sessions are findable

    @classmethod
    def of(cls, item: Item, session: str) -> Ask:
        tolerance = item.tolerance if item.kind == "number" and item.tolerance is not None else 0.0
        return cls(
            item=item,
            schema=scoring.answer_schema(item),
            field=scoring.scored_field(item),
            vote_fields=scoring.vote_fields(item),
            tolerance=tolerance,
            session=session,
        )

    def structured(self) -> dict[str, Any]:
        """The confer arguments that ask for the item's answer object (none for free text)."""
        if self.schema is None:
            return {}
        out: dict[str, Any] = {"answer_schema": self.schema, "tolerance": self.tolerance}
        if self.vote_fields:
            out["vote_fields"] = list(self.vote_fields)
        return out


class Strategy(ABC):
    """One way of answering; `name` is how `--strategies` and the report spell it."""

    name: str
    description: str
    samples: int = 1

    @property
    @abstractmethod
    def calls_per_item(self) -> int:
        """The model calls one item takes when nothing is re-asked or retried."""

    @abstractmethod
    async def answer(self, client: Conclave, ask: Ask) -> Outcome:
        """Answer one item; provider failures become a failed or degraded outcome, not an error."""

    @abstractmethod
    async def bound(self, client: Conclave, ask: Ask) -> float | None:
        """The dry-run bound on what answering `ask` may cost (None when a price is unknown)."""

    def applies_to(self, item: Item) -> bool:
        return True


class Samples(Strategy):
    """`n` answers of one member, majority-voted on the scored field (`single` and `sc`)."""

    def __init__(self, name: str, provider: str, n: int, description: str) -> None:
        self.name = name
        self.provider = provider
        self.samples = n
        self.description = description

    @property
    def calls_per_item(self) -> int:
        return self.samples

    def _arguments(self, ask: Ask, n: int) -> dict[str, Any]:
        args: dict[str, Any] = {"context": ask.item.context, "providers": [self.provider], **ask.structured()}
        if n > 1:
            args["temperature"] = SAMPLE_TEMPERATURE
        return args

    def _count(self, ask: Ask) -> int:
        return self.samples if ask.schema is not None else 1  # free text cannot be voted

    async def answer(self, client: Conclave, ask: Ask) -> Outcome:
        n = self._count(ask)
        args = self._arguments(ask, n)
        results: list[ConferResult | None] = [None] * n

        async def sample(i: int) -> None:
            session_id = f"{ask.session}-{i}" if n > 1 else ask.session
            results[i] = await client.confer(ask.item.question, session_id=session_id, **args)

        async with anyio.create_task_group() as group:
            for i in range(n):
                group.start_soon(sample, i)
        answers = [r.answers[0] for r in results if r is not None and r.answers]
        return _majority(ask, answers)

    async def bound(self, client: Conclave, ask: Ask) -> float | None:
        n = self._count(ask)
        plan = await client.confer(ask.item.question, dry_run=True, **self._arguments(ask, n))
        cost = plan_cost(plan)
        return None if cost is None else cost * n


class _Panel(Strategy):
    """A confer of the whole panel: the stages it runs beside the answers, and its dry run."""

    stages: ClassVar[Mapping[str, bool]] = MappingProxyType({})

    def __init__(self, panel: Sequence[str]) -> None:
        self.panel = tuple(panel)

    def _arguments(self, ask: Ask) -> dict[str, Any]:
        return {"context": ask.item.context, "providers": list(self.panel), **self.stages, **ask.structured()}

    async def _confer(self, client: Conclave, ask: Ask) -> ConferResult:
        return await client.confer(ask.item.question, session_id=ask.session, **self._arguments(ask))

    async def bound(self, client: Conclave, ask: Ask) -> float | None:
        return plan_cost(await client.confer(ask.item.question, dry_run=True, **self._arguments(ask)))


class PanelVote(_Panel):
    """Every panel member once; the vote's winner on the scored field."""

    name = "vote"

    def __init__(self, panel: Sequence[str]) -> None:
        super().__init__(panel)
        self.description = f"majority vote of the panel ({len(self.panel)} members)"

    @property
    def calls_per_item(self) -> int:
        return len(self.panel)

    def applies_to(self, item: Item) -> bool:
        return scoring.answer_schema(item) is not None

    async def answer(self, client: Conclave, ask: Ask) -> Outcome:
        result = await self._confer(client, ask)
        winner = _winner(result.vote, ask.field)
        return _outcome(result, winner, failed=not any(a.value is not None for a in result.answers))


class Council(_Panel):
    """The panel answers, reviews blind, and the chair decides."""

    name = "council"
    stages = MappingProxyType({"review": True, "synthesize": True})

    def __init__(self, panel: Sequence[str]) -> None:
        super().__init__(panel)
        self.description = f"confer, blind review and the chair's decision ({len(self.panel)} members)"

    @property
    def calls_per_item(self) -> int:
        return 2 * len(self.panel) + 1

    async def answer(self, client: Conclave, ask: Ask) -> Outcome:
        result = await self._confer(client, ask)
        value = _decided(result.synthesis, ask.field)
        return _outcome(result, value, failed=value is None)


class Debate(Strategy):
    """`coordinate` with the configured roles; the synthesizer decides."""

    def __init__(self, critics: int, rounds: int = 1) -> None:
        self.name = "coordinate"
        self.critics = critics
        self.rounds = rounds
        self.description = f"proposer, {critics} critic(s), synthesizer; {rounds} round(s)"

    @property
    def calls_per_item(self) -> int:
        return self.rounds * (1 + self.critics) + 1

    def _arguments(self, ask: Ask) -> dict[str, Any]:
        args: dict[str, Any] = {"context": ask.item.context, "rounds": self.rounds}
        if ask.schema is not None:
            args["answer_schema"] = ask.schema
        return args

    async def answer(self, client: Conclave, ask: Ask) -> Outcome:
        result = await client.coordinate(ask.item.question, session_id=ask.session, **self._arguments(ask))
        value = _decided(result.synthesis, ask.field)
        return _outcome(result, value, failed=value is None)

    async def bound(self, client: Conclave, ask: Ask) -> float | None:
        return plan_cost(await client.coordinate(ask.item.question, dry_run=True, **self._arguments(ask)))


def parse_strategies(
    text: str | None,
    *,
    panel: Sequence[str],
    providers: Sequence[str],
    critics: int,
    budget: Literal["equal", "none"],
) -> list[Strategy]:
    """`--strategies` (None: every single, vote and council), checked against the configured
    `providers` before anything is called; singles get their equal-budget samples here."""
    names = [part.strip() for part in (text or "").split(",") if part.strip()]
    if not names:
        names = [*(f"single:{name}" for name in panel), "vote", "council"]
    strategies = [_strategy(name, panel=panel, providers=providers, critics=critics) for name in names]
    seen: set[str] = set()
    for strategy in strategies:
        if strategy.name in seen:
            raise UnknownStrategy(f"strategy {strategy.name!r} is named twice in --strategies")
        seen.add(strategy.name)
    if budget == "equal":
        panel_calls = [s.calls_per_item for s in strategies if not isinstance(s, Samples)]
        samples = min(panel_calls, default=1)
        for strategy in strategies:
            if isinstance(strategy, Samples) and strategy.name.startswith("single:"):
                strategy.samples = samples
                if samples > 1:
                    strategy.description = f"{strategy.provider} alone, {samples} samples majority-voted"
    return strategies


_USAGE = "strategies: single:NAME, sc:NAME:N, vote, council, coordinate (comma-separated)"


def _strategy(name: str, *, panel: Sequence[str], providers: Sequence[str], critics: int) -> Strategy:
    head, _, rest = name.partition(":")
    if head in ("vote", "council", "coordinate") and rest:
        raise UnknownStrategy(f"strategy {name!r} takes no argument; {_USAGE}")
    if head == "vote":
        return PanelVote(_panel(panel, name))
    if head == "council":
        return Council(_panel(panel, name))
    if head == "coordinate":
        return Debate(critics)
    if head == "single" and rest:
        return Samples(name, _provider(rest, providers, name), 1, f"{rest} alone")
    if head == "sc":
        provider, _, count = rest.rpartition(":")
        n = _count(count, name)
        return Samples(
            name, _provider(provider, providers, name), n, f"{provider}, {n} samples majority-voted"
        )
    raise UnknownStrategy(f"unknown strategy {name!r}; {_USAGE}")


def _panel(panel: Sequence[str], name: str) -> Sequence[str]:
    if len(panel) < 2:
        raise UnknownStrategy(f"strategy {name!r} needs a panel of at least 2 members, not {len(panel)}")
    return panel


def _provider(provider: str, providers: Sequence[str], name: str) -> str:
    if provider not in providers:
        known = ", ".join(providers) or "none"
        raise UnknownStrategy(
            f"strategy {name!r} names provider {provider!r}, which is not configured ({known})"
        )
    return provider


def _count(text: str, name: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 64:
        raise UnknownStrategy(f"strategy {name!r}: N must be a whole number from 1 to 64, as in sc:NAME:5")
    return int(text)


def _majority(ask: Ask, answers: Sequence[Answer]) -> Outcome:
    usage = Usage.total(a.usage for a in answers)
    calls = sum(a.hops for a in answers)
    degraded = any(not a.ok for a in answers)
    if ask.schema is None:  # free text: the one sample's text
        text = next((a.text for a in answers if a.ok and a.text), None)
        return _made(text, usage, calls, degraded=degraded, failed=text is None, answers=answers)
    counted = [(f"sample-{i}", a.value) for i, a in enumerate(answers)]
    vote = tally(ask.schema, counted, vote_fields=ask.vote_fields, tolerance=ask.tolerance)
    winner = _winner(vote, ask.field)
    failed = not any(value is not None for _, value in counted)
    return _made(winner, usage, calls, degraded=degraded, failed=failed, answers=answers)


def _made(
    value: Any, usage: Usage, calls: int, *, degraded: bool, failed: bool, answers: Sequence[Answer]
) -> Outcome:
    if failed:
        return Outcome(value=None, status="failed", usage=usage, calls=calls, error=_first_error(answers))
    return Outcome(value=value, status="degraded" if degraded else "ok", usage=usage, calls=calls)


def _winner(vote: Vote | None, field: str | None) -> Any:
    if vote is None or field is None:
        return None
    return next((f.winner for f in vote.fields if f.field == field), None)


def _decided(synthesis: RoleAnswer | None, field: str | None) -> Any:
    """The synthesis's decided value on the scored field, or its text for free-text items."""
    if synthesis is None or synthesis.envelope is None:
        return None
    if field is None:
        return synthesis.envelope.get("answer")
    value = synthesis.value if synthesis.value is not None else synthesis.envelope.get("value")
    return value.get(field) if isinstance(value, Mapping) else None


def _outcome(result: ConferResult | CoordinateResult, value: Any, *, failed: bool) -> Outcome:
    calls = _calls(result)
    if failed:
        reasons = "; ".join(f"{r.provider}: {r.status}" for r in result.degraded_reasons)
        error = reasons or "no decided value"
        return Outcome(value=None, status="failed", usage=result.usage, calls=calls, error=error)
    status: Status = "degraded" if result.degraded else "ok"
    return Outcome(value=value, status=status, usage=result.usage, calls=calls)


def _calls(result: ConferResult | CoordinateResult) -> int:
    if isinstance(result, CoordinateResult):
        return sum(totals.calls for totals in result.per_role.values())
    turns: list[Answer] = [*result.answers, *result.reviewers]
    if result.synthesis is not None:
        turns.append(result.synthesis)
    return sum(a.hops for a in turns)


def _first_error(answers: Sequence[Answer]) -> str:
    for answer in answers:
        if not answer.ok:
            message = (answer.error or {}).get("message")
            return f"{answer.provider}: {answer.status}" + (f" ({message})" if message else "")
    return "no valid answer"


def plan_cost(result: ConferResult | CoordinateResult) -> float | None:
    """A dry run's bound on the cost (None when a price is unknown)."""
    plan = result.plan or {}
    cost = plan.get("max_cost_usd")
    return float(cost) if isinstance(cost, int | float) else None
