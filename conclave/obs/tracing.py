"""Spans for tracing (docs/telemetry.md#traces-opentelemetry): one `invoke_workflow` per call,
`invoke_agent` per worker turn, `chat {model}` per provider call, `execute_tool {name}` per hop,
named and attributed by the OpenTelemetry GenAI semantic conventions.

This module never imports OpenTelemetry. With `telemetry.otel` off (the default) every span is
the shared null span, and a call costs what it did. With it on, `conclave.obs._otel` (the optional
extra `conclave[otel]`) makes real spans and exports them over OTLP/HTTP as the standard
`OTEL_*` variables say. No prompt or answer text is ever put on a span.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

from conclave.core.errors import ConfigError


class Span(Protocol):
    def set(self, **attributes: Any) -> None:
        """Attributes known once the work is done (dots spelled as `__` in the names)."""

    def event(self, name: str, **attributes: Any) -> None: ...

    def fail(self, error_type: str) -> None:
        """The work failed: `error.type` and an error status."""


class Tracer(Protocol):
    recording: bool  # False: spans are null, so callers need not build their attributes

    def span(
        self, name: str, *, kind: str = "internal", traceparent: str | None = None, **attributes: Any
    ) -> AbstractContextManager[Span]:
        """A span for the work inside the block; `traceparent` (W3C) parents it from outside."""

    def event(self, name: str, **attributes: Any) -> None:
        """An event on the current span (a retry, a breaker opening)."""

    def measure(self, seconds: float, input_tokens: int, output_tokens: int, **attributes: Any) -> None:
        """One model call for the conventions' metrics: `gen_ai.client.operation.duration` and
        `gen_ai.client.token.usage` (input and output)."""

    def shutdown(self) -> None:
        """Export what is left and stop."""


class _NoSpan:
    def set(self, **attributes: Any) -> None:
        pass

    def event(self, name: str, **attributes: Any) -> None:
        pass

    def fail(self, error_type: str) -> None:
        pass


NO_SPAN = _NoSpan()


class _NoSpanContext:
    """A reusable `with` block around the null span: nothing is allocated per span."""

    def __enter__(self) -> Span:
        return NO_SPAN

    def __exit__(self, *_exc: object) -> None:
        return None


_NO_SPAN_CONTEXT = _NoSpanContext()


class NoTracer:
    """Tracing off: one shared null span, nothing recorded."""

    recording = False

    def span(
        self, name: str, *, kind: str = "internal", traceparent: str | None = None, **attributes: Any
    ) -> AbstractContextManager[Span]:
        return _NO_SPAN_CONTEXT

    def event(self, name: str, **attributes: Any) -> None:
        pass

    def measure(self, seconds: float, input_tokens: int, output_tokens: int, **attributes: Any) -> None:
        pass

    def shutdown(self) -> None:
        pass


NO_TRACER = NoTracer()


def tracer_for(enabled: bool) -> Tracer:
    """The tracer `telemetry.otel` asks for: OpenTelemetry's, or none."""
    if not enabled:
        return NO_TRACER
    try:
        from conclave.obs._otel import OtelTracer
    except ImportError:
        raise ConfigError(
            "telemetry.otel is on but OpenTelemetry is not installed: install conclave[otel] "
            "(pip install 'conclave[otel]'), or turn telemetry.otel off"
        ) from None
    return OtelTracer.from_environment()


def attributes(values: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments to attribute names: `gen_ai__usage__input_tokens` -> `gen_ai.usage.input_tokens`;
    None values are left out."""
    return {key.replace("__", "."): value for key, value in values.items() if value is not None}
