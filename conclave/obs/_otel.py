"""OpenTelemetry behind `conclave.obs.tracing` (the optional extra `conclave[otel]`). Imported only
when `telemetry.otel` is on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from conclave.core.version import __version__
from conclave.obs.spans import Span, attributes

_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT, "server": SpanKind.SERVER}
_PROPAGATOR = TraceContextTextMapPropagator()


class _OtelSpan:
    def __init__(self, span: trace.Span) -> None:
        self._span = span
        self.failed = False  # said why already: an exception on its way out keeps that reason

    def set(self, **values: Any) -> None:
        self._span.set_attributes(attributes(values))

    def event(self, name: str, **values: Any) -> None:
        self._span.add_event(name, attributes(values))

    def fail(self, error_type: str) -> None:
        self.failed = True
        self._span.set_attribute("error.type", error_type)
        self._span.set_status(Status(StatusCode.ERROR))


class OtelTracer:
    """Spans from `provider` and metrics from `meters` (their processors and readers export them)."""

    recording = True

    def __init__(self, provider: TracerProvider, meters: MeterProvider | None = None) -> None:
        self._provider = provider
        self._meters = meters or MeterProvider()
        self._tracer = provider.get_tracer("conclave", __version__)
        meter = self._meters.get_meter("conclave", __version__)
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="GenAI operation duration"
        )
        self._tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Measures number of input and output tokens used",
        )

    @classmethod
    def from_environment(cls) -> OtelTracer:
        """A batch exporter over OTLP/HTTP, configured by the standard `OTEL_*` variables (endpoint,
        headers, service name, sampler) as the SDK reads them."""
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        resource = Resource.create({"service.version": __version__})
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        meters = MeterProvider(
            resource=resource, metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())]
        )
        return cls(provider, meters)

    def span(
        self, name: str, *, kind: str = "internal", traceparent: str | None = None, **values: Any
    ) -> AbstractContextManager[Span]:
        return self._span(name, kind, traceparent, values)

    @contextmanager
    def _span(self, name: str, kind: str, traceparent: str | None, values: dict[str, Any]) -> Iterator[Span]:
        parent = _PROPAGATOR.extract({"traceparent": traceparent}) if traceparent else None
        with self._tracer.start_as_current_span(
            name,
            context=parent,
            kind=_KINDS[kind],
            attributes=attributes(values),
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            handle = _OtelSpan(span)
            try:
                yield handle
            except BaseException as exc:
                if not handle.failed:
                    handle.fail(type(exc).__name__)
                raise

    def event(self, name: str, **values: Any) -> None:
        trace.get_current_span().add_event(name, attributes(values))

    def measure(self, seconds: float, input_tokens: int, output_tokens: int, **values: Any) -> None:
        common = attributes(values)
        self._duration.record(seconds, common)
        self._tokens.record(input_tokens, {**common, "gen_ai.token.type": "input"})
        self._tokens.record(output_tokens, {**common, "gen_ai.token.type": "output"})

    def shutdown(self) -> None:
        self._provider.shutdown()
        self._meters.shutdown()
