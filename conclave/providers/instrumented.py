"""A provider client with tracing: the `chat {model}` span and the GenAI metrics of every call.

The pool wraps each `ProviderClient` in one of these once, when it is built, and only when the
tracer records (docs/telemetry.md#traces-opentelemetry), as pydantic-ai's `InstrumentedModel`
wraps a model. With tracing off the pool hands out the plain clients, so a call pays nothing
for tracing: no branch, no attributes, no layer in its await chain (docs/performance.md).
"""

from __future__ import annotations

from typing import Any

import orjson

from conclave.core.breaker import Clock
from conclave.core.errors import ProviderError
from conclave.core.messages import Completion, CompletionRequest, DeltaListener
from conclave.obs.redact import Redactor
from conclave.obs.telemetry import Telemetry
from conclave.providers.client import CompletionClient
from conclave.providers.kinds import KINDS


class InstrumentedProviderClient:
    """`inner`'s calls, each in its `chat {model}` span (a client span), measured for the
    conventions' metrics, with the request and answer on the span only when content is opted in."""

    def __init__(self, inner: CompletionClient, telemetry: Telemetry, *, clock: Clock) -> None:
        self.inner = inner
        self.entry = inner.entry
        self.adapter = inner.adapter
        self.breaker = inner.breaker
        self._telemetry = telemetry
        self._clock = clock  # the client's own, so a call is timed as its deadline is

    @property
    def name(self) -> str:
        return self.entry.name

    async def complete(
        self, request: CompletionRequest, *, deadline: float, listener: DeltaListener | None = None
    ) -> Completion:
        chat: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": KINDS[self.entry.kind].otel_name,
            "gen_ai.request.model": self.entry.model,
            "gen_ai.request.max_tokens": request.max_tokens,
            "conclave.provider": self.name,
        }
        tracer = self._telemetry.tracer
        started = self._clock()
        with tracer.span(f"chat {self.entry.model}", kind="client", **chat) as span:
            try:
                completion = await self.inner.complete(request, deadline=deadline, listener=listener)
            except ProviderError as exc:
                span.fail(exc.code)
                tracer.measure(self._clock() - started, 0, 0, **_metric(chat), **{"error.type": exc.code})
                raise
            usage = completion.usage
            tracer.measure(self._clock() - started, usage.input_tokens, usage.output_tokens, **_metric(chat))
            if self._telemetry.include_content:  # opt-in, as the conventions ask; redacted like the log
                span.set(**_content(request, completion, self._telemetry.redactor))
            span.set(
                **{
                    "gen_ai.response.model": completion.model,
                    "gen_ai.response.id": completion.request_id,
                    "gen_ai.response.finish_reasons": [completion.finish_reason],
                    "gen_ai.usage.input_tokens": usage.input_tokens,
                    "gen_ai.usage.output_tokens": usage.output_tokens,
                    "gen_ai.usage.cache_read.input_tokens": usage.cached_input_tokens,
                    "gen_ai.usage.reasoning.output_tokens": usage.reasoning_tokens,
                }
            )
            return completion


def _metric(chat: dict[str, Any]) -> dict[str, Any]:
    """The span's attributes the conventions put on the metrics too."""
    keys = ("gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model")
    return {key: chat[key] for key in keys}


def _content(request: CompletionRequest, completion: Completion, redactor: Redactor) -> dict[str, str]:
    """The conventions' opt-in content attributes, as JSON text, redacted."""
    said = [{"role": m.role, "parts": [{"type": "text", "content": m.content}]} for m in request.messages]
    answer = [{"role": "assistant", "parts": [{"type": "text", "content": completion.text}]}]
    out = {
        "gen_ai.input.messages": redactor.text(orjson.dumps(said).decode()),
        "gen_ai.output.messages": redactor.text(orjson.dumps(answer).decode()),
    }
    if request.system:
        system = [{"type": "text", "content": request.system}]
        out["gen_ai.system_instructions"] = redactor.text(orjson.dumps(system).decode())
    return out
