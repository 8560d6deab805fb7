"""A worker loop with tracing: each turn in its `invoke_agent` span.

The runtime wraps its `WorkerLoop` in one of these once, when it opens, and only when the tracer
records (docs/telemetry.md#traces-opentelemetry). With tracing off sessions use the plain loop,
so a turn pays nothing for tracing: no branch, no layer in its await chain
(docs/performance.md). The turn's `execute_tool` spans are opened by the loop itself, on the
tracer's shared null span when tracing is off.
"""

from __future__ import annotations

from typing import Any

from conclave.obs.tracing import Tracer
from conclave.worker.loop import Worker, WorkerOutcome, WorkerTurn, check_tools


class InstrumentedWorkerLoop:
    """`inner`'s turns, each in its `invoke_agent` span; a turn whose outcome carries a provider
    error is a failed span. Everything else is `inner`'s, its providers kept to tags included."""

    def __init__(self, inner: Worker, tracer: Tracer) -> None:
        self.inner = inner
        self._tracer = tracer

    def tags_only(self, provider: str) -> bool:
        return self.inner.tags_only(provider)

    async def run(self, turn: WorkerTurn) -> WorkerOutcome:
        check_tools(turn)  # a turn the loop refuses outright is no agent's work: no span for it
        agent: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": turn.provider.name,
            "conclave.role": turn.role,
        }
        with self._tracer.span(f"invoke_agent {turn.provider.name}", **agent) as span:
            outcome = await self.inner.run(turn)
            span.set(**{"conclave.hops": outcome.hops, "conclave.tool_mode": outcome.tool_mode})
            if outcome.error is not None:
                span.fail(outcome.error.code)
        return outcome
