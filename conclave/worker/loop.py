"""The worker's turn: call the model -> (calls?) run the tools -> call the model again -> finish.

Each step is a method returning the next step, so the transitions read top-down:

    call_model --no call--> finish
    call_model --calls----> run_tools --> call_model        (a refusal is a result too)
    run_tools  --budget or cost cap spent--> final round: a call that still comes is not executed
    finish     --answer imitates tool output, once--> call_model   (asked to call or answer in prose)

One machine serves both encodings (docs/worker-loop.md#native-tool-calling): `tags` reads the
first `<tool_call>` of the text, `native` the provider's own calls, all of them; `encodings.py`
holds the only difference. A provider that refuses native declarations gets the turn again in
tags, and tags from then on.
With no worker tools the turn is exactly one plain call: no hint, no parsing.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import anyio

from conclave.core.budgets import CostCap, CostCapReport, CostMeter, HopBudget
from conclave.core.errors import (
    InvalidArguments,
    PermanentProviderError,
    ProviderError,
    ToolError,
    ToolRefused,
)
from conclave.core.messages import Completer, Completion, CompletionRequest, DeltaListener, Message, Usage
from conclave.core.records import record
from conclave.obs.telemetry import Telemetry, session
from conclave.schema.config import WorkerToolsConfig
from conclave.tools.context import ToolContext
from conclave.tools.registry import ToolRegistry
from conclave.worker.encodings import ENCODINGS, Call, Decoded, Encoding, Returned, ToolMode, Toolset
from conclave.worker.forgery import FORGED_TOOL_OUTPUT, ForgedToolOutput, Imitation, find_imitation, usable
from conclave.worker.hint import imitation_reprompt
from conclave.worker.leaks import leaks, leaks_across
from conclave.worker.untrusted import neutralize, new_nonce, wrap_refusal, wrap_result

WORKER_ALLOWLIST = frozenset({"fetch", "verify"})  # hard: no LLM-spawning tool, ever
_FETCH_REASONS_PASSED_THROUGH = frozenset({"egress_budget_exhausted"})
_ABOUT_TOOLS = re.compile(r"tool|function", re.IGNORECASE)
# An answer that imitates tool output is asked again once, only with this much time left: less,
# and it is flagged at once. The rest of the turn then ends this much before the turn's deadline,
# so that a provider timeout there still leaves time to return the answer already in hand (the
# call's own deadline cancels a member outright, answer and all).
_ASK_AGAIN_MIN_LEFT_S = 1.0
_ASK_AGAIN_RESERVE_S = 0.5


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
    tool_mode: ToolMode = "tags"
    # characters of `system` every call of the session shares (docs/providers.md#prompt-caching)
    cache_prefix: int = 0
    cache_key: str | None = None
    cache_messages: int = 0  # leading messages a follow-up repeats from its thread's earlier calls
    # the final reply must be a JSON object valid against it: held to it natively where the
    # provider can (never on a tags-mode hop, whose reply may be a tool call)
    answer_schema: Mapping[str, Any] | None = None
    listener: DeltaListener | None = None  # hears each model call's deltas as they stream in


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
    ttft_ms: float | None = None  # the first model call's
    hops: int = 0
    inner_tool_calls: list[InnerCall] = field(default_factory=list)
    cost_cap: CostCapReport | None = None
    warnings: list[str] = field(default_factory=list)
    exchanges: list[dict[str, Any]] = field(default_factory=list)
    error: ProviderError | None = None
    failure: Exception | None = None  # a bug: it costs this answer, never the whole call
    tool_mode: ToolMode | None = None  # the encoding the turn used; None without worker tools


@record
class _Held:
    """An answer that imitated tool output, kept while the model is asked once more."""

    text: str
    finish_reason: str
    model: str
    model_call: int
    imitation: Imitation


@dataclass(slots=True)
class _TurnState:
    turn: WorkerTurn
    hops: HopBudget
    cost: CostMeter
    messages: list[Message]
    outcome: WorkerOutcome
    encoding: Encoding
    last: Completion | None = None
    pending: Decoded | None = None
    final_round: bool = False
    final_reason: str | None = None
    nonces: list[str] = field(default_factory=list)
    sent: list[str] = field(default_factory=list)  # the arguments of the calls let through, as JSON
    held: _Held | None = None  # set once the model has been asked again (one re-prompt per turn)

    def secrets(self) -> list[str]:
        """What a worker must never write out: the canary, and the nonce of every result so far."""
        return [self.turn.canary, *self.nonces] if self.turn.canary else list(self.nonces)


Step = Callable[[_TurnState], Awaitable["Step | None"]]


class Worker(Protocol):
    """What sessions ask of the runtime's worker: the plain `WorkerLoop`, or with tracing on the
    `InstrumentedWorkerLoop` wrapped around it once, when the runtime opens."""

    async def run(self, turn: WorkerTurn) -> WorkerOutcome: ...

    def tags_only(self, provider: str) -> bool: ...


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
        # Providers that refused native declarations; the runtime builds one loop per process,
        # so this lasts as long as the process and is shared by every session in it.
        self._tags_only: set[str] = set()

    def tags_only(self, provider: str) -> bool:
        return provider in self._tags_only

    async def run(self, turn: WorkerTurn) -> WorkerOutcome:
        """The whole turn; a provider failure or a bug is recorded on the outcome, never raised.
        No span here: with tracing on, the runtime wraps this loop once in an
        `InstrumentedWorkerLoop` (instrumented.py), which opens the turn's `invoke_agent` span."""
        check_tools(turn)
        started = time.perf_counter()
        mode: ToolMode = "tags" if self.tags_only(turn.provider.name) else turn.tool_mode
        with session(turn.session_id):
            state = await self._drive(turn, mode)
            # Only a first call is re-run: a refusal after native hops is a broken history, and
            # what those hops cost must not be spent twice.
            if mode == "native" and state.outcome.hops == 0 and _rejects_tools(state.outcome.error):
                self._tags_only.add(turn.provider.name)
                state = await self._drive(turn, "tags")
                state.outcome.warnings.append("native_tools_unsupported")
        state.outcome.latency_ms = (time.perf_counter() - started) * 1000.0
        state.outcome.cost_cap = state.cost.report() if turn.tools else None
        state.outcome.tool_mode = state.encoding.mode if turn.tools else None
        return state.outcome

    async def _drive(self, turn: WorkerTurn, mode: ToolMode) -> _TurnState:
        """The state machine, from a fresh state to its last step."""
        hops, cost = HopBudget(self._settings.hop_budget), CostMeter(turn.cost_cap)
        state = _TurnState(turn, hops, cost, list(turn.messages), WorkerOutcome(), ENCODINGS[mode])
        try:
            step: Step | None = self._call_model
            while step is not None:
                step = await step(state)
        except ProviderError as exc:
            if state.held is None:
                state.outcome.error = exc  # what earlier hops cost is kept, not lost
            else:  # asking again is a second chance, never a way to lose the answer in hand
                self._fall_back(state, exc)
        except Exception as exc:
            state.outcome.failure = exc
        return state

    # -- steps -----------------------------------------------------------------------------------

    async def _call_model(self, state: _TurnState) -> Step | None:
        turn = state.turn
        completion = await turn.provider.complete(
            self._request(state), deadline=turn.deadline, listener=turn.listener
        )
        _record(state.outcome, completion)
        if not state.turn.tools:  # a plain call: no tags to look for, nothing to meter
            return None
        self._meter(state, completion)
        decoded = state.encoding.decode(completion)
        if not decoded.calls:
            return self._finish
        if state.final_round:
            self._refuse_in_final_round(state, decoded)
            return self._finish
        state.last, state.pending = completion, decoded
        return self._run_tools

    async def _run_tools(self, state: _TurnState) -> Step | None:
        """Each call spends a hop in the order given; those admitted run concurrently."""
        decoded, completion = state.pending, state.last
        assert decoded is not None
        assert completion is not None
        state.pending = None
        done: list[tuple[InnerCall, str]] = [(InnerCall(0, None, "error"), "")] * len(decoded.calls)

        async def run(index: int, call: Call, hop: int, nonce: str, refused: ToolRefused | None) -> None:
            done[index] = await self._dispatch(state, call, hop, nonce, refused)

        spelled_across = self._leak_across_calls(state, decoded.calls)
        async with anyio.create_task_group() as group:
            for index, call in enumerate(decoded.calls):
                hop, nonce = state.hops.used + 1, new_nonce()
                state.nonces.append(nonce)
                group.start_soon(run, index, call, hop, nonce, _spend_hop(state.hops) or spelled_across)
        returned = []
        for call, (inner, wrapped) in zip(decoded.calls, done, strict=True):
            state.outcome.inner_tool_calls.append(inner)
            state.outcome.exchanges.append(  # the arguments as the model wrote them (None: unreadable)
                {
                    "hop": inner.hop,
                    "tool_call": inner.to_dict(),
                    "arguments": call.args,
                    "tool_result": wrapped,
                }
            )
            returned.append(Returned(call, wrapped, inner.status != "ok"))
        state.messages += state.encoding.write_back(completion, decoded, returned)
        return self._call_model

    async def _finish(self, state: _TurnState) -> Step | None:
        """A final answer: checked for leaks, then for imitated tool output (asked again once when
        the model wrote the output itself, else flagged)."""
        leaked = leaks(state.outcome.text, state.secrets())
        if leaked:
            _warn(state.outcome, "canary_leak")
            self._emit("canary_leak", state, what="canary" if state.turn.canary in leaked else "nonce")
        imitation = find_imitation(state.outcome.text, state.nonces)
        if imitation is None:
            return None
        # An echo (every block carries a nonce of this turn) copies a result the model did get:
        # there is no call to make properly, so it is only flagged.
        if imitation.forged and self._may_ask_again(state):
            return self._ask_again(state, imitation)
        self._flag_imitation(state, imitation)
        return None

    # -- answers that imitate tool output (docs/worker-loop.md#answers-that-imitate-tool-output) ----

    def _may_ask_again(self, state: _TurnState) -> bool:
        """Once per turn, with time left, and not past an enforced cost cap (asking costs a call)."""
        cost = state.cost
        if state.held is not None or (cost.cap.active and cost.cap.mode == "enforce" and cost.exceeded):
            return False
        return state.turn.deadline - anyio.current_time() > _ASK_AGAIN_MIN_LEFT_S

    def _ask_again(self, state: _TurnState, imitation: Imitation) -> Step:
        """Hold the answer, and ask the model to call the tool or answer in prose. Its own answer
        goes back neutralized, so it does not read its forged block as a result."""
        out = state.outcome
        self._emit_imitation(state, imitation, "reprompt", out.hops)
        state.held = _Held(out.text, out.finish_reason, out.model, out.hops, imitation)
        state.turn = replace(state.turn, deadline=state.turn.deadline - _ASK_AGAIN_RESERVE_S)
        ask = imitation_reprompt(native=state.encoding.mode == "native", final_round=state.final_round)
        state.messages += [Message("assistant", neutralize(out.text)), Message("user", ask)]
        return self._call_model

    def _flag_imitation(
        self, state: _TurnState, imitation: Imitation, failed: ProviderError | None = None
    ) -> None:
        """Defang the imitation as untrusted text is defanged, so no later reader takes it for a
        result, and flag it; an answer with nothing else in it is no answer."""
        out = state.outcome
        left = imitation.remainder(out.text)
        out.text = neutralize(out.text)
        _warn(out, FORGED_TOOL_OUTPUT)
        degraded = not usable(left)
        if degraded:
            out.error = ForgedToolOutput(
                "the model answered with imitated tool output and nothing else",
                provider=state.turn.provider.name,
            )
        model_call = state.held.model_call if failed is not None and state.held else out.hops
        self._emit_imitation(state, imitation, "degraded" if degraded else "flagged", model_call, failed)

    def _fall_back(self, state: _TurnState, exc: ProviderError) -> None:
        """The turn failed after the model was asked again: the answer held is the answer, flagged."""
        held, out = state.held, state.outcome
        assert held is not None
        out.text, out.finish_reason, out.model = held.text, held.finish_reason, held.model
        self._flag_imitation(state, held.imitation, exc)

    def _emit_imitation(
        self,
        state: _TurnState,
        imitation: Imitation,
        action: str,
        model_call: int,
        failed: ProviderError | None = None,
    ) -> None:
        fields: dict[str, Any] = {
            "action": action,
            "kinds": list(imitation.kinds),
            "echo": not imitation.forged,
            "asked_again": state.held is not None,
            "model_call": model_call,
        }
        if failed is not None:
            fields["error"] = failed.code
        self._emit("worker_forged_tool_output", state, **fields)

    # -- the tool call, checked in the order of docs/worker-loop.md#checks-in-order ----------------

    async def _dispatch(
        self, state: _TurnState, call: Call, hop: int, nonce: str, over_budget: ToolRefused | None
    ) -> tuple[InnerCall, str]:
        """One call, run or refused, in its `execute_tool` span (a refusal's reason is its error)."""
        tool: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "conclave.hop": hop,
        }
        if call.id:
            tool["gen_ai.tool.call.id"] = call.id
        with self._telemetry.tracer.span(f"execute_tool {call.name or 'tool_call'}", **tool) as span:
            inner, said = await self._run_call(state, call, hop, nonce, over_budget)
            if inner.status != "ok":
                span.fail(inner.reason or inner.status)
            return inner, said

    async def _run_call(
        self, state: _TurnState, call: Call, hop: int, nonce: str, over_budget: ToolRefused | None
    ) -> tuple[InnerCall, str]:
        name = call.name
        started = time.perf_counter()
        try:
            if over_budget is not None:
                raise over_budget
            if call.error is not None or call.args is None or name is None:
                raise ToolRefused(call.error or "the call could not be read", reason="parse_error")
            args = self._vetted_args(state, name, call.args, hop)
            self._check_smuggling(state, call.args)
            state.cost.check_tool_call()
            result = await self._registry.call(name, args, self._tool_context)
        except ToolRefused as exc:
            return self._refused(state, hop, name, nonce, exc, started)
        except ToolError as exc:
            inner = InnerCall(hop, name, "error", "tool_error")
            self._emit_inner(state, inner, started, 0)
            return inner, wrap_refusal(name or "tool_call", "tool_error", nonce=nonce, detail=exc.message)
        content = self._registry.get(name).render(result)
        inner = InnerCall(hop, name, "ok")
        self._emit_inner(state, inner, started, len(content.encode("utf-8")))
        return inner, wrap_result(name, content, nonce=nonce, max_bytes=self._settings.result_max_bytes)

    def _vetted_args(self, state: _TurnState, name: str, args: dict[str, Any], hop: int) -> dict[str, Any]:
        """Allowlist (a name never declared included), then the input schema; the session id is
        injected only after both."""
        if name not in WORKER_ALLOWLIST or name not in state.turn.tools:
            allowed = ", ".join(state.turn.tools)
            raise ToolRefused(
                f"tool {name!r} is not available here; available: {allowed}", reason="not_allowlisted"
            )
        try:
            self._registry.validate(name, args)
        except InvalidArguments as exc:
            self._emit(
                "worker_inner_validation_fail",
                state,
                hop=hop,
                tool=name,
                message=exc.message,
                path=exc.path,
            )
            raise _SchemaRefusal(exc) from None
        return {**args, "session_id": state.turn.session_id}

    def _check_smuggling(self, state: _TurnState, args: dict[str, Any]) -> None:
        """The canary or a nonce in a tool call's arguments is a leak on its way out (e.g. a URL
        query to an attacker's server): flag it and never send it."""
        text = _arguments_text(args)
        if leaked := leaks(text, state.secrets()):
            raise self._smuggled(state, leaked, "the call's arguments carry a confidential marker")
        state.sent.append(text)

    def _leak_across_calls(self, state: _TurnState, calls: Sequence[Call]) -> ToolRefused | None:
        """A secret spelled across calls (half of it in one call's URL, the rest in the next
        call's, or in two calls of one round) leaks as surely as in one. So the round's
        arguments are read together with those already let through this turn; if together
        they carry a secret, none of the round's calls runs."""
        texts = [_arguments_text(call.args) for call in calls if call.args is not None]
        if not texts or len(texts) + len(state.sent) < 2:
            return None  # a lone call is checked on its own
        if not (leaked := leaks_across([*state.sent, *texts], state.secrets())):
            return None
        return self._smuggled(
            state, leaked, "with the calls made before it, this call's arguments spell a confidential marker"
        )

    def _smuggled(self, state: _TurnState, leaked: list[str], why: str) -> ToolRefused:
        if "canary_leak" not in state.outcome.warnings:
            state.outcome.warnings.append("canary_leak")
        self._emit("canary_leak", state, what="canary" if state.turn.canary in leaked else "nonce")
        return ToolRefused(f"{why}; it was not run", reason="canary_leak")

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

    def _refuse_in_final_round(self, state: _TurnState, decoded: Decoded) -> None:
        """A call in the final round is never executed; the text is the answer, and it is marked."""
        for call in decoded.calls:
            state.hops.used += 1
            state.outcome.inner_tool_calls.append(
                InnerCall(state.hops.used, call.name, "refused", state.final_reason)
            )
        state.outcome.text = decoded.answer
        _warn(state.outcome, "tool_call_not_executed")  # once, though a re-prompt may bring another

    # -- bookkeeping ---------------------------------------------------------------------------------

    def _request(self, state: _TurnState) -> CompletionRequest:
        turn = state.turn
        request = CompletionRequest(
            messages=tuple(state.messages),
            system=turn.system,
            max_tokens=turn.max_tokens,
            temperature=turn.temperature,
            cache_prefix=turn.cache_prefix,
            cache_key=turn.cache_key,
            cache_messages=turn.cache_messages,
            answer_schema=turn.answer_schema,
        )
        if not turn.tools:
            return request
        tools = Toolset(self._registry, turn.tools, state.hops.limit, turn.canary)
        declared = state.encoding.declare(tools, turn.system, final_round=state.final_round)
        schema = turn.answer_schema if state.encoding.mode == "native" or state.final_round else None
        return replace(
            request,
            system=declared.system,
            tools=declared.tools,
            tool_choice=declared.tool_choice,
            answer_schema=schema,
        )

    def _meter(self, state: _TurnState, completion: Completion) -> None:
        if state.cost.add(completion.usage.cost_usd) and state.cost.cap.mode == "warn":
            self._emit(
                "worker_tool_cost_warning",
                state,
                cap_usd=state.cost.cap.cap_usd,
                observed_usd=round(state.cost.observed_usd, 10),
                cap_mode="warn",
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

    def _emit(self, event: str, state: _TurnState, *, cap_mode: str | None = None, **fields: Any) -> None:
        """A worker event names its encoding as `mode`; the cost warning's `mode` is already the
        cap's (a wire name), so there the encoding is `tool_mode`."""
        if cap_mode is None:
            fields["mode"] = state.encoding.mode
        else:
            fields.update(mode=cap_mode, tool_mode=state.encoding.mode)
        self._telemetry.emit(event, provider=state.turn.provider.name, role=state.turn.role, **fields)


class _SchemaRefusal(ToolRefused):
    def __init__(self, error: InvalidArguments) -> None:
        super().__init__(
            f"arguments do not match the input schema at {error.path}: {error.message}", reason="schema_error"
        )
        self.schema_error = {"message": error.message, "path": error.path}


def _refusal_reason(exc: ToolRefused) -> tuple[str, Mapping[str, Any] | None]:
    """The reasons of docs/worker-loop.md#refusal-reasons: a fetch policy refusal is `fetch_blocked`,
    carrying the policy's own reason."""
    if isinstance(exc, _SchemaRefusal):
        return "schema_error", {"schema_error": exc.schema_error}
    if exc.tool == "fetch" and exc.reason not in _FETCH_REASONS_PASSED_THROUGH:
        return "fetch_blocked", {"fetch_reason": exc.reason}
    return exc.reason, None


def check_tools(turn: WorkerTurn) -> None:
    """Only the allowlist's tools, ever: a turn asking for another is a bug of its caller."""
    if not WORKER_ALLOWLIST.issuperset(turn.tools):
        unknown = [t for t in turn.tools if t not in WORKER_ALLOWLIST]
        raise ValueError(f"worker tools outside the allowlist: {unknown}")


def _spend_hop(hops: HopBudget) -> ToolRefused | None:
    """One hop for the next call in order; past the budget, the refusal it will get."""
    try:
        hops.check_tool_call()
    except ToolRefused as exc:
        return exc
    return None


def _rejects_tools(error: ProviderError | None) -> bool:
    """The provider refused the tool declarations themselves: a 400 that speaks of tools."""
    return (
        isinstance(error, PermanentProviderError)
        and error.status == 400
        and bool(_ABOUT_TOOLS.search(error.message))
    )


def _warn(out: WorkerOutcome, warning: str) -> None:
    if warning not in out.warnings:
        out.warnings.append(warning)


def _record(out: WorkerOutcome, completion: Completion) -> None:
    """One model call into the turn's outcome: its text, summed usage and an exchange."""
    out.text, out.finish_reason, out.model = completion.text, completion.finish_reason, completion.model
    out.usage = completion.usage if out.hops == 0 else out.usage + completion.usage
    if out.hops == 0:
        out.ttft_ms = completion.ttft_ms
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


__all__ = [
    "WORKER_ALLOWLIST",
    "InnerCall",
    "Worker",
    "WorkerLoop",
    "WorkerOutcome",
    "WorkerTurn",
    "check_tools",
]


def _arguments_text(args: dict[str, Any]) -> str:
    """A call's arguments as the text leak detection reads (as the model wrote them)."""
    return json.dumps(args, ensure_ascii=False)
