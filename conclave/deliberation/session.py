"""The scaffold every deliberation runs in, written once.

A `Session` is one `confer` or `coordinate` call: its id and canary, the worker tools the caller
asked for, its deadline and limits. `run_session` plugs a deliberation (the phases that differ
between tools) into the steps that do not:

    session_start -> the dry-run plan, or the deliberation -> transcript -> session_end

and closes the session in the event log when the call is cancelled.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

import anyio
import httpx

from conclave.core.budgets import CostCap, CostCapReport, combined
from conclave.core.errors import SessionInFlight
from conclave.core.messages import Delta, DeltaListener, Message, Usage
from conclave.deliberation.answers import answer_from, unknown_provider
from conclave.deliberation.live import LiveDeltas
from conclave.deliberation.plan import TurnShape, planned_call
from conclave.deliberation.requests import CallRequest
from conclave.deliberation.results import (
    Answer,
    ConferResult,
    CoordinateResult,
    CostCapSummary,
    ToolUseSummary,
)
from conclave.deliberation.threads import HISTORY_TRUNCATED, Thread, ThreadStore, with_history
from conclave.deliberation.transcripts import TranscriptWriter
from conclave.obs.telemetry import Telemetry
from conclave.obs.telemetry import session as bind_session
from conclave.providers import ProviderPool
from conclave.providers.kinds import KINDS
from conclave.schema.config import Config, ProviderConfig
from conclave.state import StateBackend
from conclave.tools.context import ToolContext
from conclave.tools.registry import ToolRegistry
from conclave.worker.encodings import ENCODINGS, ToolMode, Toolset
from conclave.worker.leaks import new_canary
from conclave.worker.loop import WORKER_ALLOWLIST, Worker, WorkerTurn

# Progress steps: one per finished answer ({"provider", "status", ...}), and while a call runs,
# a heartbeat every server.progress_heartbeat_seconds ({"waiting": ["critic beta", ...]}).
ProgressSink = Callable[[Mapping[str, Any]], Awaitable[None]]
# Who hears the answers as they stream in, each delta with the provider and role it comes from
# (None: a panel member's answer). Called in the stream's own task: it must not block. Every
# session also publishes its deltas to its runtime's hub (`Runtime.live`), for listeners in this
# process (the session page served by `serve --http`).
DeltaSink = Callable[[str, str | None, Delta], None]
Result = TypeVar("Result", ConferResult, CoordinateResult)
NATIVE_KINDS = frozenset(kind for kind, spec in KINDS.items() if spec.native_tools)


@dataclass(frozen=True, slots=True)
class Runtime:
    """What a deliberation runs on, opened and closed by `conclave.app.runtime.open_runtime`.

    With tracing on, `providers` hands out instrumented clients, and `worker` and `sessions`
    are the instrumented decorators of the plain loop and runner, wrapped once, by `open_runtime`;
    with it off they are the plain objects themselves (docs/telemetry.md#traces-opentelemetry)."""

    config: Config
    http: httpx.AsyncClient
    telemetry: Telemetry
    providers: ProviderPool
    tools: ToolRegistry
    tool_context: ToolContext
    worker: Worker
    sessions: Sessions
    state: StateBackend
    transcripts: TranscriptWriter | None = None
    live: LiveDeltas = field(default_factory=LiveDeltas)  # the running sessions' deltas, in-process
    threads: ThreadStore = field(default_factory=lambda: ThreadStore(None))  # what follow-ups read

    async def call_tool(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """The Python door to the worker tools: the arguments are checked here, then the tool runs."""
        self.tools.validate(name, args)
        return await self.tools.call(name, args, self.tool_context)


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What the caller asked of worker tools, split against the hard allowlist."""

    requested: bool
    accepted: tuple[str, ...]
    rejected: tuple[str, ...]
    cap: CostCap

    @classmethod
    def of(cls, request: CallRequest, runtime: Runtime) -> ToolPlan:
        asked = list(dict.fromkeys(request.worker_tools))
        settings = runtime.config.worker_tools
        cap = CostCap.resolve(
            request.worker_tool_cost_cap_usd,
            request.worker_tool_cost_cap_mode,
            default_cap=settings.cost_cap_usd,
            default_mode=settings.cost_cap_mode,
        )
        return cls(
            requested=bool(asked),
            accepted=tuple(t for t in asked if t in WORKER_ALLOWLIST),
            rejected=tuple(t for t in asked if t not in WORKER_ALLOWLIST),
            cap=cap,
        )


class Session:
    """One call's shared state and the one way its members are asked."""

    def __init__(
        self,
        runtime: Runtime,
        tool: str,
        request: CallRequest,
        progress: ProgressSink | None,
        deltas: DeltaSink | None = None,
        thread: Thread | None = None,
    ) -> None:
        limits = runtime.config.limits
        self.runtime, self.tool, self.request, self.progress = runtime, tool, request, progress
        self.deltas, self.thread = deltas, thread  # `thread`: the one a follow-up continues
        self.id: str = request.session_id or f"s-{uuid.uuid4().hex[:20]}"
        self.canary = new_canary()
        self.tools = ToolPlan.of(request, runtime)
        self.timeout = float(request.timeout_seconds or limits.timeout_seconds)
        self.max_tokens = int(request.max_tokens or limits.max_tokens)
        self.temperature = limits.temperature if request.temperature is None else request.temperature
        self.dry_run = request.dry_run
        self.started = time.perf_counter()
        self.deadline = anyio.current_time() + self.timeout
        self.awaiting: dict[int, str] = {}  # the turns in flight, by ticket: "critic beta", "alpha"
        self._tickets = itertools.count()

    @property
    def tools_on(self) -> bool:
        return bool(self.tools.accepted)

    @property
    def thread_id(self) -> str:
        return self.id if self.thread is None else self.thread.thread_id

    @property
    def parent(self) -> str | None:
        return None if self.thread is None else self.thread.parent

    def history_bytes(self, names: Sequence[str]) -> int:
        """The largest history any of `names` is sent, for a dry run's bounds."""
        if self.thread is None:
            return 0
        sizes = (sum(len(m.content.encode("utf-8")) for m in self.thread.history_for(n)[0]) for n in names)
        return max(sizes, default=0)

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000.0

    async def ask(
        self,
        name: str,
        messages: tuple[Message, ...],
        *,
        system: str | None,
        tools: tuple[str, ...],
        role: str | None = None,
        shared: int = 0,
        marked: bool = False,
        answer_schema: Mapping[str, Any] | None = None,
        history: bool = False,
    ) -> Answer:
        """One worker turn for provider `name`, as an Answer: a failure is a status, never raised.
        `shared`: the characters of `system` this session's calls start with (the question or
        task, and the context), for which the turn names the session as its cache key; `marked`:
        another call of the session sends `name` the same prefix, so a cache breakpoint ends it
        (the first such call writes the cache, the others read it). `history`: a follow-up's
        member turn, sent the thread's earlier turns first (docs/tools.md#follow-ups)."""
        if name not in self.runtime.config.providers:
            return unknown_provider(name, self.runtime.config)
        truncated, repeated = False, 0
        if history and self.thread is not None:
            earlier, truncated = self.thread.history_for(name)
            messages, repeated = with_history(earlier, messages)
        turn = WorkerTurn(
            provider=self.runtime.providers.get(name),
            messages=messages,
            deadline=self.deadline,
            session_id=self.id,
            system=system,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            tools=tools,
            cost_cap=self.tools.cap,
            canary=self.canary if tools else "",
            role=role,
            tool_mode=self._tool_mode(name) if tools else "tags",
            cache_prefix=shared if marked else 0,
            # A thread's calls share one key, so a follow-up is routed to the cache its history is in.
            cache_key=self.thread_id if shared or self.thread is not None else None,
            cache_messages=repeated,
            answer_schema=answer_schema,
        )
        ticket = next(self._tickets)
        self.awaiting[ticket] = f"{role} {name}" if role else name
        turn = replace(turn, listener=self._listener(name, role))
        try:
            outcome = await self.runtime.worker.run(turn)
        finally:
            del self.awaiting[ticket]
        answer = answer_from(outcome, name, self.runtime.config, self.runtime.telemetry.redactor)
        return replace(answer, warnings=(*answer.warnings, HISTORY_TRUNCATED)) if truncated else answer

    def _listener(self, provider: str, role: str | None) -> DeltaListener:
        """Who hears `provider`'s deltas: the runtime's hub (one dict lookup when nobody listens
        to this session), and the caller's delta sink when it gave one."""
        publish, session_id, sink = self.runtime.live.publish, self.id, self.deltas
        if sink is None:

            def published(delta: Delta) -> None:
                publish(session_id, provider, role, delta)

            return published

        def both(delta: Delta) -> None:
            publish(session_id, provider, role, delta)
            sink(provider, role, delta)

        return both

    def declares_tools(self, name: str, tools: tuple[str, ...]) -> bool:
        """Whether `name`'s turns with `tools` declare them natively. Declarations come before the
        system prompt, so they belong to the prefix a provider caches; the tags hint follows it."""
        if not tools or name not in self.runtime.config.providers or self.runtime.worker.tags_only(name):
            return False
        return self._tool_mode(name) == "native"

    def _tool_mode(self, name: str) -> ToolMode:
        config = self.runtime.config
        return tool_mode(self.request.worker_tool_mode, config.providers[name], config.worker_tools.mode)

    def hinted(self, system: str | None, tools: Sequence[str]) -> str | None:
        """The system prompt a turn with `tools` is sent in tags mode, for a dry run's bounds: the
        worker loop's own, whose hint carries every tool's schema (native mode sends the same
        schemas as declarations)."""
        if not tools:
            return system
        toolset = Toolset(
            self.runtime.tools, tuple(tools), self.runtime.config.worker_tools.hop_budget, self.canary
        )
        return ENCODINGS["tags"].declare(toolset, system, final_round=False).system

    def turn_shape(self, prompt_bytes: int, *, tools_on: bool) -> TurnShape:
        """The size of one planned turn of this call, for a dry run's bounds."""
        settings = self.runtime.config.worker_tools
        return TurnShape(
            prompt_bytes, self.max_tokens, tools_on, settings.hop_budget, settings.result_max_bytes
        )

    def planned_call(self, name: str, shape: TurnShape, **options: Any) -> dict[str, Any]:
        return planned_call(self.runtime.config, name, shape, **options)

    def tool_use(
        self,
        reports: Mapping[str, Sequence[CostCapReport]],
        *,
        breakdown: str,
        applies_to: tuple[str, ...] | None = None,
    ) -> ToolUseSummary | None:
        """The call's `worker_tools` block (only when the caller passed `worker_tools`), with the
        cost cap combined over `reports` (name -> the CostCapReports of that name's turns)."""
        if not self.tools.requested:
            return None
        cap = self.tools.cap
        summary = None
        if self.tools.accepted and cap.active:
            parts = {name: combined(cap, found) for name, found in reports.items() if found}
            summary = CostCapSummary(combined(cap, list(parts.values())), breakdown, parts)
        hop_budget = self.runtime.config.worker_tools.hop_budget
        return ToolUseSummary(self.tools.accepted, self.tools.rejected, hop_budget, applies_to, summary)


class Deliberation(Protocol[Result]):
    """What confer and coordinate plug into the scaffold."""

    def opening(self) -> dict[str, Any]:
        """`session_start`'s own fields: who is asked, and the question or task."""

    async def deliberate(self) -> Result: ...

    def plan(self) -> Result:
        """The dry run: what would be called, at most what it would cost; nothing is called."""

    def transcript(self, result: Result) -> dict[str, Any]:
        """What the transcript keeps beyond the result: every hop's exchanges."""

    def tally(self, result: Result) -> tuple[int, int]:
        """How many answers, and how many of them are usable, for `session_end`."""


class Sessions(Protocol):
    """How the runtime runs a session: `SessionRunner`, or with tracing on the
    `InstrumentedSessionRunner` (instrumented.py) wrapped around it once, when the runtime opens."""

    async def run(self, session: Session, deliberation: Deliberation[Result]) -> Result: ...


def run_session(session: Session, deliberation: Deliberation[Result]) -> Awaitable[Result]:
    """The call, run by the runtime's session runner: the plain one, or with tracing on the one
    that puts it in its `invoke_workflow` span. Chosen once, when the runtime opened: nothing
    here asks whether tracing is on."""
    return session.runtime.sessions.run(session, deliberation)


class SessionRunner:
    """The plain runner: no span."""

    async def run(self, session: Session, deliberation: Deliberation[Result]) -> Result:
        """The session, bound to the events written meanwhile, with its session id claimed while
        it runs, and closed in the event log even when the call is cancelled."""
        with bind_session(session.id):
            try:
                async with _claimed(session):
                    with session.runtime.live.running(session.id):  # its page may hear it meanwhile
                        return await _run(session, deliberation)
            except anyio.get_cancelled_exc_class():
                # A cancelled call still closes its session, so nothing built on the log mistakes
                # it for a call still running.
                _end(session, "cancelled", Usage(), duration_ms=session.elapsed_ms())
                raise


@contextlib.asynccontextmanager
async def _claimed(session: Session) -> AsyncIterator[None]:
    """A session id the caller chose is this call's alone while it runs, on every replica
    sharing state: two calls under one id would share an egress budget and a transcript.
    Generated ids are unique already."""
    if session.request.session_id is None:
        yield
        return
    sessions = session.runtime.state.sessions
    if not await sessions.claim(session.id):
        raise SessionInFlight(
            f"session_id {session.id!r} belongs to a call still running; wait for it to end, "
            "or use another session_id"
        )
    try:
        yield
    finally:
        with anyio.CancelScope(shield=True):
            await sessions.release(session.id)


async def _run(session: Session, deliberation: Deliberation[Result]) -> Result:
    session.runtime.telemetry.emit(
        "session_start",
        tool=session.tool,
        worker_tools=list(session.tools.accepted),
        dry_run=session.dry_run,
        timeout_seconds=session.timeout,
        **deliberation.opening(),
    )
    result = deliberation.plan() if session.dry_run else await _deliberate(session, deliberation)
    path = None
    transcripts = session.runtime.transcripts
    if not session.dry_run:
        payload = {
            "tool": session.tool,
            "session_id": session.id,
            "thread_id": session.thread_id,
            "parent": session.parent,
            "arguments": dict(session.request.arguments),
            "result": result.to_dict(),
            **deliberation.transcript(result),
        }
        session.runtime.threads.remember(payload)  # a follow-up may come before the disk has it
        if transcripts is not None:
            path = transcripts.submit(session.id, session.tool, payload)
    status = "dry_run" if session.dry_run else ("degraded" if result.degraded else "ok")
    answers, ok = deliberation.tally(result)
    # A dry run writes no transcript: its bound is kept here, for the page and `conclave tail`.
    bound = {"max_cost_usd": result.plan["max_cost_usd"]} if session.dry_run and result.plan else {}
    _end(
        session,
        status,
        result.usage,
        duration_ms=session.elapsed_ms(),
        answers=answers,
        ok=ok,
        degraded_reasons=[reason.to_dict() for reason in result.degraded_reasons],
        transcript=path,
        **bound,
    )
    return result


async def _deliberate(session: Session, deliberation: Deliberation[Result]) -> Result:
    """The deliberation, with a heartbeat while it runs when someone follows its progress."""
    if session.progress is None:
        return await deliberation.deliberate()
    async with anyio.create_task_group() as group:
        group.start_soon(_heartbeat, session, session.progress)
        result = await deliberation.deliberate()
        group.cancel_scope.cancel()
    return result


async def _heartbeat(session: Session, progress: ProgressSink) -> None:
    """Every `server.progress_heartbeat_seconds`, a step naming who is still awaited: clients
    whose idle timer is reset by progress keep waiting through a long deliberation
    (docs/server.md#long-deliberations)."""
    interval = session.runtime.config.server.progress_heartbeat_seconds
    while True:
        await anyio.sleep(interval)
        if session.awaiting:
            await progress({"waiting": sorted(set(session.awaiting.values()))})


def _end(session: Session, status: str, usage: Usage, **fields: Any) -> None:
    fields["duration_ms"] = round(fields["duration_ms"], 3)
    session.runtime.telemetry.emit(
        "session_end", tool=session.tool, status=status, usage=usage.to_dict(), **fields
    )


def tool_mode(asked: str | None, provider: ProviderConfig, configured: str) -> ToolMode:
    """The call's argument, over the provider's `tool_mode`, over the config's mode
    (docs/worker-loop.md#native-tool-calling); `auto` is native where the adapter speaks it and
    the provider entry does not say tags. A kind without native tool calling (its `KindSpec`) gets
    tags whatever was asked: its adapter has no field to declare tools in. (A provider that refused
    native declarations is kept to tags by the worker loop itself.)"""
    if provider.kind not in NATIVE_KINDS:
        return "tags"
    mode = asked or provider.tool_mode or configured
    if mode == "auto":
        return "native" if provider.tool_mode != "tags" else "tags"
    return "native" if mode == "native" else "tags"


def default_tool_mode(runtime: Runtime, name: str) -> ToolMode:
    """The encoding `name`'s worker tools get in a call that does not choose one."""
    if runtime.worker.tags_only(name):
        return "tags"
    return tool_mode(None, runtime.config.providers[name], runtime.config.worker_tools.mode)


def merged_warnings(answers: Sequence[Answer], *, price_unknown: bool) -> tuple[str, ...]:
    """Every answer's warnings once, in order; `price_unknown` when some cost is unknown."""
    warnings = dict.fromkeys(w for answer in answers for w in answer.warnings)
    if price_unknown:
        warnings["price_unknown"] = None
    return tuple(warnings)


def thread_of(runtime: Runtime, request: CallRequest, tool: str) -> Thread | None:
    """The thread a call with `follow_up_of` continues; invalid params naming the id, before any
    call, when there is no such session."""
    if request.follow_up_of is None:
        return None
    budget = runtime.config.follow_ups.max_history_tokens
    return runtime.threads.thread(request.follow_up_of, max_history_tokens=budget, tool=tool)


def user_messages(question: str, context: str | None, instruction: str | None = None) -> tuple[Message, ...]:
    """The caller's question as a member is asked it, the context after it, and (for a structured
    answer) what its answer must look like last."""
    text = f"{question}\n\nContext:\n{context}" if context else question
    return (Message("user", text if instruction is None else f"{text}\n\n{instruction}"),)
