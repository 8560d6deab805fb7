"""The worker's turn: call the model -> (a tag?) run the tool -> call the model again -> finish.

Each step is a method returning the next step, so the transitions read top-down:

    call_model --no tag--> finish
    call_model --tag-----> run_tool --> call_model        (a refusal is a result too)
    run_tool   --budget or cost cap spent--> final round: the next tag is not executed

With no worker tools the turn is exactly one plain call: no hint, no parsing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from conclave.budgets import CostCap, CostCapReport, CostMeter, HopBudget
from conclave.config import WorkerToolsConfig
from conclave.errors import InvalidArguments, ProviderError, ToolError, ToolRefused
from conclave.messages import Completer, Completion, CompletionRequest, Message, Usage
from conclave.records import record
from conclave.telemetry import Telemetry, session
from conclave.tools import ToolContext, ToolRegistry
from conclave.worker.hint import tool_hint, with_hint
from conclave.worker.leaks import leaks
from conclave.worker.tags import TagError, ToolCall, find_tool_call
from conclave.worker.untrusted import new_nonce, wrap_refusal, wrap_result

WORKER_ALLOWLIST = frozenset({"fetch", "verify"})  # hard: no LLM-spawning tool, ever
_FETCH_REASONS_PASSED_THROUGH = frozenset({"egress_budget_exhausted"})


@record
class WorkerTurn:
    """Everything one worker turn needs; `tools` empty means a plain call."""

    provider: Completer
    messages: tuple[Message, ...]
    deadline: float
    session_id: str
    system: str | None = None
    max_tokens: int = 1024
    temperature: float | None = None
    tools: tuple[str, ...] = ()
    cost_cap: CostCap = CostCap.NONE
    canary: str = ""
    role: str | None = None


@record
class InnerCall:
    hop: int
    name: str | None
    status: str  # ok | refused | error
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"hop": self.hop, "name": self.name, "status": self.status, "reason": self.reason}


@dataclass(slots=True)
class WorkerOutcome:
    """A finished turn: usage, cost and time summed over every model call."""

    text: str = ""
    finish_reason: str = "stop"
    model: str = ""
    usage: Usage = field(default_factory=Usage)
    latency_ms: float = 0.0
    hops: int = 0
    inner_tool_calls: list[InnerCall] = field(default_factory=list)
    cost_cap: CostCapReport | None = None
    warnings: list[str] = field(default_factory=list)
    exchanges: list[dict[str, Any]] = field(default_factory=list)
    error: ProviderError | None = None
    failure: Exception | None = None  # a bug: it costs this answer, never the whole call


@dataclass(slots=True)
class _TurnState:
    turn: WorkerTurn
    hops: HopBudget
    cost: CostMeter
    messages: list[Message]
    outcome: WorkerOutcome
    pending: ToolCall | TagError | None = None
    final_round: bool = False
    final_reason: str | None = None
    nonces: list[str] = field(default_factory=list)


Step = Callable[[_TurnState], Awaitable["Step | None"]]


class WorkerLoop:
    def __init__(
        self,
        *,
        registry: ToolRegistry,
        tool_context: ToolContext,
        telemetry: Telemetry,
        settings: WorkerToolsConfig,
    ) -> None:
        self._registry = registry
        self._tool_context = tool_context
        self._telemetry = telemetry
        self._settings = settings

    async def run(self, turn: WorkerTurn) -> WorkerOutcome:
        """The whole turn; a provider failure or a bug is recorded on the outcome, never raised."""
        unknown = [t for t in turn.tools if t not in WORKER_ALLOWLIST]
        if unknown:
            raise ValueError(f"worker tools outside the allowlist: {unknown}")
        started = time.perf_counter()
        hops, cost = HopBudget(self._settings.hop_budget), CostMeter(turn.cost_cap)
        state = _TurnState(turn, hops, cost, list(turn.messages), WorkerOutcome())
        with session(turn.session_id):
            try:
                step: Step | None = self._call_model
                while step is not None:
                    step = await step(state)
            except ProviderError as exc:
                state.outcome.error = exc  # what earlier hops cost is kept, not lost
            except Exception as exc:
                state.outcome.failure = exc
        state.outcome.latency_ms = (time.perf_counter() - started) * 1000.0
        state.outcome.cost_cap = cost.report() if turn.tools else None
        return state.outcome

    # -- steps -----------------------------------------------------------------------------------

    async def _call_model(self, state: _TurnState) -> Step | None:
        completion = await state.turn.provider.complete(self._request(state), deadline=state.turn.deadline)
        _record(state.outcome, completion)
        if not state.turn.tools:  # a plain call: no tags to look for, nothing to meter
            return None
        self._meter(state, completion)
        found = find_tool_call(completion.text, truncated=completion.finish_reason == "length")
        if found is None:
            return self._finish
        if state.final_round:
            self._refuse_in_final_round(state, found)
            return self._finish
        state.pending = found
        return self._run_tool

    async def _run_tool(self, state: _TurnState) -> Step | None:
        found = state.pending
        assert found is not None
        state.pending = None
        call, wrapped = await self._dispatch(state, found)
        state.outcome.inner_tool_calls.append(call)
        state.outcome.exchanges.append({"hop": call.hop, "tool_call": call.to_dict(), "tool_result": wrapped})
        spoken = state.outcome.text[: found.end] if isinstance(found, ToolCall) else state.outcome.text
        state.messages += [Message("assistant", spoken), Message("user", wrapped)]
        return self._call_model

    async def _finish(self, state: _TurnState) -> Step | None:
        turn = state.turn
        leaked = leaks(state.outcome.text, [turn.canary, *state.nonces] if turn.canary else state.nonces)
        if leaked:
            state.outcome.warnings.append("canary_leak")
            self._emit("canary_leak", state, what="canary" if turn.canary in leaked else "nonce")
        return None

    # -- the tool call, checked in SPEC order ------------------------------------------------------

    async def _dispatch(self, state: _TurnState, found: ToolCall | TagError) -> tuple[InnerCall, str]:
        name = found.name if isinstance(found, ToolCall) else None
        nonce = new_nonce()
        state.nonces.append(nonce)
        started = time.perf_counter()
        hop = state.hops.used + 1
        try:
            state.hops.check_tool_call()
            if isinstance(found, TagError):
                raise ToolRefused(found.detail, reason="parse_error")
            args = self._vetted_args(state, found, hop)
            self._check_smuggling(state, found)
            state.cost.check_tool_call()
            result = await self._registry.call(found.name, args, self._tool_context)
        except ToolRefused as exc:
            return self._refused(state, hop, name, nonce, exc, started)
        except ToolError as exc:
            call = InnerCall(hop, name, "error", "tool_error")
            self._emit_inner(state, call, started, 0)
            return call, wrap_refusal(name or "tool_call", "tool_error", nonce=nonce, detail=exc.message)
        content = self._registry.get(found.name).render(result)
        call = InnerCall(hop, found.name, "ok")
        self._emit_inner(state, call, started, len(content.encode("utf-8")))
        return call, wrap_result(found.name, content, nonce=nonce, max_bytes=self._settings.result_max_bytes)

    def _vetted_args(self, state: _TurnState, call: ToolCall, hop: int) -> dict[str, Any]:
        """Allowlist, then the input schema; the session id is injected only after both."""
        if call.name not in WORKER_ALLOWLIST or call.name not in state.turn.tools:
            allowed = ", ".join(state.turn.tools)
            raise ToolRefused(
                f"tool {call.name!r} is not available here; available: {allowed}", reason="not_allowlisted"
            )
        try:
            self._registry.validate(call.name, call.args)
        except InvalidArguments as exc:
            self._emit(
                "worker_inner_validation_fail",
                state,
                hop=hop,
                tool=call.name,
                message=exc.message,
                path=exc.path,
            )
            raise _SchemaRefusal(exc) from None
        return {**call.args, "session_id": state.turn.session_id}

    def _check_smuggling(self, state: _TurnState, call: ToolCall) -> None:
        """The canary or a nonce in a tool call's arguments is a leak on its way out (e.g. a URL
        query to an attacker's server): flag it and never send it."""
        secrets = [state.turn.canary, *state.nonces] if state.turn.canary else state.nonces
        leaked = leaks(json.dumps(call.args, ensure_ascii=False), secrets)
        if leaked:
            if "canary_leak" not in state.outcome.warnings:
                state.outcome.warnings.append("canary_leak")
            self._emit("canary_leak", state, what="canary" if state.turn.canary in leaked else "nonce")
            raise ToolRefused(
                "the call's arguments carry a confidential marker; it was not run", reason="canary_leak"
            )

    def _refused(
        self, state: _TurnState, hop: int, name: str | None, nonce: str, exc: ToolRefused, started: float
    ) -> tuple[InnerCall, str]:
        reason, extra = _refusal_reason(exc)
        if reason in ("hop_budget_exhausted", "cost_cap_exceeded"):
            state.final_round, state.final_reason = True, reason
            if reason == "hop_budget_exhausted":
                self._emit("worker_hop_budget_exhausted", state, hop=hop, limit=state.hops.limit)
        call = InnerCall(hop, name, "refused", reason)
        self._emit_inner(state, call, started, 0)
        return call, wrap_refusal(name or "tool_call", reason, nonce=nonce, detail=exc.message, extra=extra)

    def _refuse_in_final_round(self, state: _TurnState, found: ToolCall | TagError) -> None:
        """A tag in the final round is never executed; the answer is marked."""
        name = found.name if isinstance(found, ToolCall) else None
        state.hops.used += 1
        state.outcome.inner_tool_calls.append(InnerCall(state.hops.used, name, "refused", state.final_reason))
        state.outcome.text = state.outcome.text[: found.start].rstrip()
        state.outcome.warnings.append("tool_call_not_executed")

    # -- bookkeeping ---------------------------------------------------------------------------------

    def _request(self, state: _TurnState) -> CompletionRequest:
        turn = state.turn
        system = turn.system
        if turn.tools:
            hint = tool_hint(self._registry, turn.tools, hop_budget=state.hops.limit, canary=turn.canary)
            system = with_hint(system, hint)
        return CompletionRequest(
            messages=tuple(state.messages),
            system=system,
            max_tokens=turn.max_tokens,
            temperature=turn.temperature,
        )

    def _meter(self, state: _TurnState, completion: Completion) -> None:
        if state.cost.add(completion.usage.cost_usd) and state.cost.cap.mode == "warn":
            self._emit(
                "worker_tool_cost_warning",
                state,
                cap_usd=state.cost.cap.cap_usd,
                observed_usd=round(state.cost.observed_usd, 10),
                mode="warn",
            )

    def _emit_inner(self, state: _TurnState, call: InnerCall, started: float, size: int) -> None:
        self._emit(
            "worker_inner_call",
            state,
            hop=call.hop,
            tool=call.name,
            status=call.status,
            reason=call.reason,
            duration_ms=round((time.perf_counter() - started) * 1000.0, 3),
            bytes=size,
        )

    def _emit(self, event: str, state: _TurnState, **fields: Any) -> None:
        self._telemetry.emit(event, provider=state.turn.provider.name, role=state.turn.role, **fields)


class _SchemaRefusal(ToolRefused):
    def __init__(self, error: InvalidArguments) -> None:
        super().__init__(
            f"arguments do not match the input schema at {error.path}: {error.message}", reason="schema_error"
        )
        self.schema_error = {"message": error.message, "path": error.path}


def _refusal_reason(exc: ToolRefused) -> tuple[str, Mapping[str, Any] | None]:
    """SPEC §4 reasons: a fetch policy refusal is `fetch_blocked`, carrying the policy's own reason."""
    if isinstance(exc, _SchemaRefusal):
        return "schema_error", {"schema_error": exc.schema_error}
    if exc.tool == "fetch" and exc.reason not in _FETCH_REASONS_PASSED_THROUGH:
        return "fetch_blocked", {"fetch_reason": exc.reason}
    return exc.reason, None


def _record(out: WorkerOutcome, completion: Completion) -> None:
    """One model call into the turn's outcome: its text, summed usage and an exchange."""
    out.text, out.finish_reason, out.model = completion.text, completion.finish_reason, completion.model
    out.usage = completion.usage if out.hops == 0 else out.usage + completion.usage
    out.hops += 1
    out.exchanges.append(
        {
            "hop": out.hops,
            "model": completion.model,
            "text": completion.text,
            "finish_reason": completion.finish_reason,
            "usage": completion.usage.to_dict(),
        }
    )
    for warning in completion.warnings:
        if warning not in out.warnings:
            out.warnings.append(warning)


__all__ = ["WORKER_ALLOWLIST", "InnerCall", "WorkerLoop", "WorkerOutcome", "WorkerTurn"]
