"""What a span and a tracer are (`Span`, `Tracer`), the null ones used while tracing is off, and
how keyword arguments become attribute names. Imports no OpenTelemetry: `conclave.obs._otel`
builds on these, and `conclave.obs.tracing.tracer_for` picks one of the two."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol


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


def attributes(values: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments to attribute names: `gen_ai__usage__input_tokens` -> `gen_ai.usage.input_tokens`;
    None values are left out."""
    return {key.replace("__", "."): value for key, value in values.items() if value is not None}
