"""What a deliberation returns: typed records, rendered to JSON once, at the boundary.

`to_dict()` gives exactly the shapes of `schemas/confer.output.json` and
`schemas/coordinate.output.json`. A confer answer carries no coordinate-only fields; a
coordinate role answer is an `Answer` plus its role, round, envelope and attempts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import field, replace
from typing import Any

from conclave.core.budgets import CostCapReport
from conclave.core.messages import Usage
from conclave.core.records import record
from conclave.deliberation.roles import Role
from conclave.deliberation.vote import Vote
from conclave.worker.loop import InnerCall

OPERATOR_PROMPT = (
    "Worker tool spending went over the cost cap of ${cap:.4f} (observed {observed}) in warn mode. "
    'Ask your user whether to enforce the cap (worker_tool_cost_cap_mode: "enforce"), keep warning '
    '("warn"), or ignore it ("off").'
)


@record
class Answer:
    """One provider's answer to one turn. `status`: ok | error | timeout | breaker_open | skipped
    | late (a confer member stopped once the quorum had answered and its grace ran out) (and,
    for a role, invalid_envelope; for a structured answer, invalid_answer). `value`: the
    structured answer, when the call asked for one and the reply was valid. `fallback_from`:
    whom this answer replaces (a confer member that failed for good, a synthesizer)."""

    provider: str
    model: str | None
    status: str
    text: str | None = None
    error: Mapping[str, Any] | None = None
    finish_reason: str | None = None
    usage: Usage = field(default_factory=Usage)
    latency_ms: float = 0.0
    ttft_ms: float | None = None  # to its first streamed delta (a plain call: its whole reply)
    hops: int = 0
    warnings: tuple[str, ...] = ()
    inner_tool_calls: tuple[InnerCall, ...] = ()
    cost_cap: CostCapReport | None = None
    tool_mode: str | None = None  # native | tags: how this turn's tools were encoded
    value: Mapping[str, Any] | None = None
    fallback_from: DegradedReason | None = None
    exchanges: tuple[Mapping[str, Any], ...] = field(default=(), repr=False, compare=False)  # transcripts

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def error_code(self) -> str | None:
        return self.error.get("code") if self.error else None

    def to_dict(self, *, tools_on: bool, structured: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "provider": self.provider,
            "model": self.model,
            "status": self.status,
            "text": self.text,
            "error": dict(self.error) if self.error is not None else None,
            "finish_reason": self.finish_reason,
            "usage": self.usage.to_dict(),
            "latency_ms": round(self.latency_ms, 3),
            "ttft_ms": round(self.ttft_ms, 3) if self.ttft_ms is not None else None,
            "hops": self.hops,
            "warnings": list(self.warnings),
        }
        if structured:
            out["value"] = dict(self.value) if self.value is not None else None
        if tools_on:
            out["inner_tool_calls"] = [call.to_dict() for call in self.inner_tool_calls]
            if self.tool_mode is not None:
                out["tool_mode"] = self.tool_mode
            if self.cost_cap is not None:
                out["cost_cap"] = self.cost_cap.to_dict()
        if self.fallback_from is not None:
            out["fallback_from"] = self.fallback_from.to_dict()
        return out


@record
class DegradedReason:
    """Why a result is not whole: who is missing, in which role, and with what status."""

    provider: str
    role: str | None
    status: str
    code: str | None
    elapsed_ms: float | None = None  # a late member: when it was stopped, from the call's start
    message: str | None = None  # the error's own words, kept when another answer replaces this one

    @classmethod
    def of(cls, answer: Answer, role: str | None = None) -> DegradedReason:
        elapsed = answer.latency_ms if answer.status == "late" else None
        return cls(answer.provider, role, answer.status, answer.error_code, elapsed)

    @classmethod
    def replaced(cls, answer: Answer, role: str | None = None) -> DegradedReason:
        """Who a fallback answers for, with what went wrong in its own words."""
        message = answer.error.get("message") if answer.error else None
        return replace(cls.of(answer, role), message=message)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "provider": self.provider,
            "role": self.role,
            "status": self.status,
            "code": self.code,
        }
        if self.elapsed_ms is not None:
            out["elapsed_ms"] = round(self.elapsed_ms, 3)
        if self.message is not None:
            out["message"] = self.message
        return out


@record(kw_only=True)
class RoleAnswer(Answer):
    """A coordinate role's answer: the envelope it emitted (None when it has none), over one or two
    attempts; a synthesizer that replaced another names it in `fallback_from`."""

    role: Role
    round: int | None = None
    envelope: Mapping[str, Any] | None = None
    attempts: int = 0
    fallbacks_tried: tuple[DegradedReason, ...] = ()

    @property
    def reason(self) -> DegradedReason:
        return DegradedReason.of(self, self.role)

    def to_dict(self, *, tools_on: bool, structured: bool = False) -> dict[str, Any]:
        out = Answer.to_dict(self, tools_on=tools_on and self.role != "synthesizer", structured=structured)
        out.update(role=self.role, envelope=self.envelope, attempts=self.attempts)
        if self.round is not None:
            out["round"] = self.round
        if self.status != "invalid_envelope":
            out["text"] = None  # the envelope is the answer; raw text is kept only when it is invalid
        if self.fallbacks_tried:
            out["fallbacks_tried"] = [reason.to_dict() for reason in self.fallbacks_tried]
        return out


@record
class Round:
    """One round of the debate: the proposal and the critiques of it."""

    number: int
    proposal: RoleAnswer
    critiques: tuple[RoleAnswer, ...] = ()

    def to_dict(self, *, tools_on: bool) -> dict[str, Any]:
        return {
            "round": self.number,
            "proposal": self.proposal.to_dict(tools_on=tools_on),
            "critiques": [c.to_dict(tools_on=tools_on) for c in self.critiques],
        }


@record
class CostCapSummary:
    """The call-level cost cap: every turn's report combined, with the breakdown by provider
    (confer) or by role (coordinate)."""

    total: CostCapReport
    breakdown_name: str  # "per_provider" | "per_role"
    breakdown: Mapping[str, CostCapReport]

    @property
    def operator_prompt(self) -> str | None:
        if not (self.total.exceeded and self.total.mode == "warn"):
            return None
        observed = self.total.observed_usd
        shown = "an unknown amount" if observed is None else f"${observed:.4f}"
        return OPERATOR_PROMPT.format(cap=self.total.cap_usd, observed=shown)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = self.total.to_dict()
        out[self.breakdown_name] = {name: report.to_dict() for name, report in self.breakdown.items()}
        if self.operator_prompt is not None:
            out["operator_prompt"] = self.operator_prompt
        return out


@record
class ToolUseSummary:
    """The `worker_tools` block: what the caller asked for, against the hard allowlist."""

    accepted: tuple[str, ...]
    rejected: tuple[str, ...]
    hop_budget: int
    applies_to: tuple[str, ...] | None = None
    cost_cap: CostCapSummary | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "accepted": list(self.accepted),
            "rejected": list(self.rejected),
            "hop_budget": self.hop_budget,
        }
        if self.applies_to is not None:
            out["applies_to"] = list(self.applies_to)
        if self.cost_cap is not None:
            out["cost_cap"] = self.cost_cap.to_dict()
        return out


@record
class Totals:
    """What a set of answers spent: usage and model calls."""

    usage: Usage
    calls: int

    @classmethod
    def of(cls, answers: Sequence[Answer]) -> Totals:
        """Only answers that called a model count: a skipped provider spent nothing, and its unknown
        cost must not make the total unknown."""
        spent = [a for a in answers if a.hops > 0]
        usage = Usage.total(a.usage for a in spent)
        if usage.cost_usd is not None:
            usage = usage.with_cost(round(usage.cost_usd, 10))
        return cls(usage, sum(a.hops for a in spent))

    def to_dict(self) -> dict[str, Any]:
        return {"usage": self.usage.to_dict(), "calls": self.calls}


@record(kw_only=True)
class _Result:
    session_id: str
    degraded: bool
    degraded_reasons: tuple[DegradedReason, ...]
    usage: Usage
    latency_ms: float
    warnings: tuple[str, ...]
    worker_tools: ToolUseSummary | None = None
    plan: Mapping[str, Any] | None = None  # a dry run's plan; nothing was called
    thread_id: str | None = None  # the thread's first session (None: this one, which starts it)
    parent: str | None = None  # the session this call followed up (`follow_up_of`)

    @property
    def dry_run(self) -> bool:
        return self.plan is not None

    @property
    def tools_on(self) -> bool:
        return self.worker_tools is not None and bool(self.worker_tools.accepted)

    def _head(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "thread_id": self.thread_id or self.session_id,
            "parent": self.parent,
            "degraded": self.degraded,
            "degraded_reasons": [reason.to_dict() for reason in self.degraded_reasons],
        }

    def _tail(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "usage": self.usage.to_dict(),
            "latency_ms": round(self.latency_ms, 3),
            "warnings": list(self.warnings),
        }
        if self.worker_tools is not None:
            out["worker_tools"] = self.worker_tools.to_dict()
        if self.plan is not None:
            out.update(dry_run=True, plan=self.plan)
        return out


@record
class Ranking:
    """One reviewer's ranking, de-anonymized: providers best first, its note on each."""

    reviewer: str
    ranking: tuple[str, ...]
    notes: Mapping[str, str]
    confidence: float | None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "reviewer": self.reviewer,
            "ranking": list(self.ranking),
            "notes": dict(self.notes),
        }
        if self.confidence is not None:
            out["confidence"] = self.confidence
        return out


@record
class Standing:
    """One answer in the aggregate: normalized Borda points, mean rank, reviews received."""

    provider: str
    borda: float
    mean_rank: float | None
    reviews: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "borda": self.borda,
            "mean_rank": self.mean_rank,
            "reviews": self.reviews,
        }


@record
class Review:
    """`confer`'s blind peer review: every ranking, the aggregate best first, the reviewers' agreement."""

    rankings: tuple[Ranking, ...]
    aggregate: tuple[Standing, ...]
    agreement: float | None

    @property
    def top(self) -> str | None:
        return self.aggregate[0].provider if self.aggregate and self.aggregate[0].reviews else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rankings": [r.to_dict() for r in self.rankings],
            "aggregate": [a.to_dict() for a in self.aggregate],
            "top": self.top,
            "agreement": self.agreement,
        }


@record(kw_only=True)
class ConferResult(_Result):
    """`confer`'s result: every panel member's answer, in the order they were asked; with the
    optional stages, their blind review and the chair's synthesis."""

    answers: tuple[Answer, ...]
    review: Review | None = None
    synthesis: RoleAnswer | None = None
    reviewers: tuple[RoleAnswer, ...] = ()  # every reviewer's turn (for totals and transcripts)
    vote: Vote | None = None  # when the call asked for structured answers

    def to_dict(self) -> dict[str, Any]:
        structured = self.vote is not None
        answers = [a.to_dict(tools_on=self.tools_on, structured=structured) for a in self.answers]
        out = {**self._head(), "answers": answers}
        if self.vote is not None:
            out["vote"] = self.vote.to_dict()
        if self.review is not None:
            out["review"] = self.review.to_dict()
        if self.synthesis is not None:
            out["synthesis"] = self.synthesis.to_dict(tools_on=False, structured=structured)
        return {**out, **self._tail()}


@record(kw_only=True)
class CoordinateResult(_Result):
    """`coordinate`'s result: every round, the final round's proposal and critiques, the synthesis
    (asked with an answer schema, `synthesis.value` is the decided answer, else None)."""

    rounds: tuple[Round, ...]
    proposal: RoleAnswer | None
    critiques: tuple[RoleAnswer, ...]
    synthesis: RoleAnswer | None
    per_role: Mapping[str, Totals]
    converged: bool = False  # the last round ran had every critic accept
    structured: bool = False  # asked with an answer_schema: the synthesis has its `value`

    def to_dict(self) -> dict[str, Any]:
        tools_on = self.tools_on
        tail = self._tail()
        usage = tail.pop("usage")
        return {
            **self._head(),
            "rounds": [r.to_dict(tools_on=tools_on) for r in self.rounds],
            "proposal": self.proposal.to_dict(tools_on=tools_on) if self.proposal else None,
            "critiques": [c.to_dict(tools_on=tools_on) for c in self.critiques],
            "synthesis": (
                self.synthesis.to_dict(tools_on=False, structured=self.structured) if self.synthesis else None
            ),
            "usage": usage,
            "per_role": {role: totals.to_dict() for role, totals in self.per_role.items()},
            **({} if self.dry_run else {"rounds_run": len(self.rounds), "converged": self.converged}),
            **tail,
        }
