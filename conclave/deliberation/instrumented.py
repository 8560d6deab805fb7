"""A session runner with tracing: each call in its `invoke_workflow` span, the root of its trace.

The runtime wraps its `SessionRunner` in one of these once, when it opens, and only when the
tracer records (docs/telemetry.md#traces-opentelemetry). With tracing off `run_session` goes
to the plain runner, so a call pays nothing for tracing: no branch, no layer in its await chain
(docs/performance.md).
"""

from __future__ import annotations

from typing import Any

from conclave.deliberation.session import Deliberation, Result, Session, Sessions
from conclave.obs.telemetry import caller_traceparent
from conclave.obs.tracing import Tracer


class InstrumentedSessionRunner:
    """`inner`'s sessions, each in its `invoke_workflow` span, parented by the caller's W3C
    `traceparent` when the call came with one."""

    def __init__(self, inner: Sessions, tracer: Tracer) -> None:
        self.inner = inner
        self._tracer = tracer

    async def run(self, session: Session, deliberation: Deliberation[Result]) -> Result:
        workflow: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_workflow",
            "gen_ai.conversation.id": session.id,
            "conclave.tool": session.tool,
        }
        parent = caller_traceparent()
        with self._tracer.span(f"invoke_workflow {session.tool}", traceparent=parent, **workflow) as span:
            result = await self.inner.run(session, deliberation)
            span.set(**{"conclave.degraded": result.degraded, "conclave.dry_run": session.dry_run})
            return result
