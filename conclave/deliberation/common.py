"""What confer and coordinate share: sessions, the per-provider answer and its status,
worker turns, degraded reasons, totals and the worker_tools block."""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conclave.budgets import CostCap
from conclave.errors import BreakerOpen, DeadlineExceeded, MissingApiKey, ProviderError, ProviderTimeout
from conclave.messages import Message, Usage
from conclave.runtime import Runtime
from conclave.worker.leaks import new_canary
from conclave.worker.loop import WORKER_ALLOWLIST, WorkerOutcome, WorkerTurn

ProgressSink = Callable[[Mapping[str, Any]], Awaitable[None]]
OPERATOR_PROMPT = (
    "Worker tool spending went over the cost cap of ${cap:.4f} (observed ${observed:.4f}) in warn mode. "
    'Ask your user whether to enforce the cap (worker_tool_cost_cap_mode: "enforce"), keep warning '
    '("warn"), or ignore it ("off").'
)


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    canary: str

    @classmethod
    def open(cls, session_id: str | None) -> Session:
        return cls(session_id or f"s-{uuid.uuid4().hex[:20]}", new_canary())


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What the caller asked of worker tools, split against the hard allowlist."""

    requested: bool
    accepted: tuple[str, ...]
    rejected: tuple[str, ...]
    cap: CostCap

    @classmethod
    def from_args(cls, args: Mapping[str, Any], runtime: Runtime) -> ToolPlan:
        asked = list(dict.fromkeys(args.get("worker_tools") or []))
        settings = runtime.config.worker_tools
        cap = CostCap.resolve(
            args.get("worker_tool_cost_cap_usd"),
            args.get("worker_tool_cost_cap_mode"),
            default_cap=settings.cost_cap_usd,
            default_mode=settings.cost_cap_mode,
        )
        return cls(
            requested=bool(asked),
            accepted=tuple(t for t in asked if t in WORKER_ALLOWLIST),
            rejected=tuple(t for t in asked if t not in WORKER_ALLOWLIST),
            cap=cap,
        )


@dataclass(slots=True)
class Answer:
    provider: str
    model: str | None
    status: str  # ok | error | timeout | breaker_open | skipped
    text: str | None = None
    error: dict[str, Any] | None = None
    finish_reason: str | None = None
    usage: Usage = field(default_factory=Usage)
    latency_ms: float = 0.0
    hops: int = 0
    warnings: list[str] = field(default_factory=list)
    inner_tool_calls: list[dict[str, Any]] = field(default_factory=list)
    cost_cap: dict[str, object] | None = None
    role: str | None = None
    exchanges: list[dict[str, Any]] = field(default_factory=list)
    envelope: dict[str, Any] | None = None  # coordinate's role answers only
    attempts: int = 0
    round: int | None = None
    fallback_from: dict[str, Any] | None = None
    fallbacks_tried: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self, *, tools_on: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "provider": self.provider,
            "model": self.model,
            "status": self.status,
            "text": self.text,
            "error": self.error,
            "finish_reason": self.finish_reason,
            "usage": self.usage.to_dict(),
            "latency_ms": round(self.latency_ms, 3),
            "hops": self.hops,
            "warnings": list(self.warnings),
        }
        if tools_on:
            out["inner_tool_calls"] = list(self.inner_tool_calls)
            if self.cost_cap is not None:
                out["cost_cap"] = self.cost_cap
        return out

    def to_role_dict(self, *, tools_on: bool) -> dict[str, Any]:
        """A coordinate role answer: the envelope, and the raw text only when it was invalid."""
        out = self.to_dict(tools_on=tools_on and self.role != "synthesizer")
        out.update(role=self.role, envelope=self.envelope, attempts=self.attempts)
        if self.status != "invalid_envelope":
            out["text"] = None
        if self.round is not None:
            out["round"] = self.round
        if self.fallback_from is not None:
            out["fallback_from"] = self.fallback_from
        if self.fallbacks_tried:
            out["fallbacks_tried"] = list(self.fallbacks_tried)
        return out

    def reason(self) -> dict[str, Any]:
        code = self.error.get("code") if self.error else None
        return {"provider": self.provider, "role": self.role, "status": self.status, "code": code}


def status_of(exc: ProviderError) -> str:
    if isinstance(exc, MissingApiKey):
        return "skipped"
    if isinstance(exc, BreakerOpen):
        return "breaker_open"
    if isinstance(exc, DeadlineExceeded | ProviderTimeout):
        return "timeout"
    return "error"


def skipped(name: str, code: str, message: str, *, role: str | None = None) -> Answer:
    return Answer(name, None, "skipped", error={"code": code, "message": message}, role=role)


def timed_out(name: str, model: str | None, elapsed_ms: float, *, role: str | None = None) -> Answer:
    message = "no answer before the call's deadline"
    return Answer(
        name,
        model,
        "timeout",
        error={"code": "deadline_exceeded", "message": message},
        latency_ms=elapsed_ms,
        role=role,
    )


def unknown_provider(name: str, runtime: Runtime, *, role: str | None = None) -> Answer:
    known = ", ".join(runtime.config.providers)
    return skipped(
        name, "unknown_provider", f"provider {name!r} is not configured; known: {known}", role=role
    )


def answer_of(runtime: Runtime, turn: WorkerTurn, outcome: WorkerOutcome, *, tools_on: bool) -> Answer:
    """A finished worker turn as an Answer; a failure is a status, never an exception.

    Callers await `runtime.worker.run(turn)` themselves and pass the outcome here: a coroutine
    layer of its own would stay suspended for the whole provider call."""
    name = turn.provider.name
    model = runtime.config.providers[name].model
    if outcome.failure is not None:  # a bug must cost one answer, not the whole call
        exc = outcome.failure
        message = runtime.telemetry.redactor.text(f"{type(exc).__name__}: {exc}")
        return Answer(
            name, model, "error", error={"code": "internal_error", "message": message}, role=turn.role
        )
    return _answer(name, model, outcome, tools_on, turn.role)


def _answer(name: str, model: str, outcome: WorkerOutcome, tools_on: bool, role: str | None) -> Answer:
    answer = Answer(
        provider=name,
        model=outcome.model or model,
        status="ok",
        text=outcome.text,
        finish_reason=outcome.finish_reason if outcome.hops else None,
        usage=outcome.usage,
        latency_ms=outcome.latency_ms,
        hops=outcome.hops,
        warnings=list(outcome.warnings),
        inner_tool_calls=[c.to_dict() for c in outcome.inner_tool_calls] if tools_on else [],
        cost_cap=outcome.cost_cap,
        role=role,
        exchanges=outcome.exchanges,
    )
    if outcome.error is not None:
        answer.status, answer.text = status_of(outcome.error), None
        answer.error = outcome.error.to_dict()
        answer.model = outcome.model or model
    elif not outcome.text.strip():
        answer.status, answer.text = "error", None
        answer.error = {
            "code": "empty_completion",
            "message": f"the model returned no text (finish_reason: {outcome.finish_reason})",
        }
    return answer


def user_messages(question: str, context: str | None) -> tuple[Message, ...]:
    if context:
        return (Message("user", f"{question}\n\nContext:\n{context}"),)
    return (Message("user", question),)


def total_usage(answers: Sequence[Answer]) -> tuple[Usage, bool]:
    """Summed usage, and whether some cost is unknown (then the total cost is null)."""
    spent = [a for a in answers if a.hops > 0]
    unknown = any(a.usage.cost_usd is None for a in spent)

    def add(attr: str) -> int | None:
        values = [getattr(a.usage, attr) for a in spent if getattr(a.usage, attr) is not None]
        return sum(values) if values else None

    usage = Usage(
        input_tokens=sum(a.usage.input_tokens for a in spent),
        output_tokens=sum(a.usage.output_tokens for a in spent),
        cached_input_tokens=add("cached_input_tokens"),
        cache_write_tokens=add("cache_write_tokens"),
        reasoning_tokens=add("reasoning_tokens"),
        cost_usd=None if unknown else round(sum(a.usage.cost_usd or 0.0 for a in spent), 10),
    )
    return usage, unknown


def merged_warnings(answers: Sequence[Answer], *, price_unknown: bool) -> list[str]:
    warnings: list[str] = []
    for answer in answers:
        for warning in answer.warnings:
            if warning not in warnings:
                warnings.append(warning)
    if price_unknown and "price_unknown" not in warnings:
        warnings.append("price_unknown")
    return warnings


def worker_tools_block(
    plan: ToolPlan,
    hop_budget: int,
    blocks: Mapping[str, dict[str, object] | None],
    *,
    breakdown: str,
    applies_to: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The call-level worker_tools block: accepted/rejected, budget, and the aggregated cap."""
    block: dict[str, Any] = {
        "accepted": list(plan.accepted),
        "rejected": list(plan.rejected),
        "hop_budget": hop_budget,
    }
    if applies_to is not None:
        block["applies_to"] = list(applies_to)
    present = {k: v for k, v in blocks.items() if v is not None}
    if plan.accepted and plan.cap.active:
        block["cost_cap"] = _aggregate_cap(plan.cap, present, breakdown)
    return block


def _aggregate_cap(cap: CostCap, blocks: Mapping[str, dict[str, object]], breakdown: str) -> dict[str, Any]:
    observed = sum(float(str(b["observed_usd"])) for b in blocks.values())
    exceeded = any(b["exceeded"] for b in blocks.values())
    aggregate: dict[str, Any] = {
        "cap_usd": cap.cap_usd,
        "mode": cap.mode,
        "observed_usd": round(observed, 10),
        "exceeded": exceeded,
        "blocked": any(b["blocked"] for b in blocks.values()),
        "enforceable": all(b.get("enforceable", True) for b in blocks.values()),
        breakdown: dict(blocks),
    }
    if not aggregate["enforceable"]:
        aggregate["note"] = "a price is unknown for some calls: the cap cannot be enforced on them"
    if exceeded and cap.mode == "warn":
        aggregate["operator_prompt"] = OPERATOR_PROMPT.format(cap=cap.cap_usd or 0.0, observed=observed)
    return aggregate


def close_cancelled_session(runtime: Runtime, tool: str, started: float) -> None:
    """A cancelled call still closes its session in the event log, so nothing built on the
    log mistakes it for a call still running."""
    runtime.telemetry.emit(
        "session_end",
        tool=tool,
        status="cancelled",
        usage=Usage().to_dict(),
        duration_ms=round((time.perf_counter() - started) * 1000.0, 3),
    )
