"""Spans for tracing (docs/telemetry.md#traces-opentelemetry): one `invoke_workflow` per call,
`invoke_agent` per worker turn, `chat {model}` per provider call, `execute_tool {name}` per hop,
named and attributed by the OpenTelemetry GenAI semantic conventions.

This module never imports OpenTelemetry. With `telemetry.otel` off (the default) every span is
the shared null span, and a call costs what it did. With it on, `conclave.obs._otel` (the optional
extra `conclave[otel]`) makes real spans and exports them over OTLP/HTTP as the standard
`OTEL_*` variables say. No prompt or answer text is ever put on a span.
"""

from __future__ import annotations

from conclave.core.errors import ConfigError
from conclave.obs.spans import NO_SPAN, NO_TRACER, NoTracer, Span, Tracer, attributes

__all__ = ["NO_SPAN", "NO_TRACER", "NoTracer", "Span", "Tracer", "attributes", "tracer_for"]


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
