"""OpenTelemetry tracing (docs/telemetry.md#traces-opentelemetry): one trace per call, workflow ->
agents -> chats and tools, in the GenAI conventions' names and attributes, parented by the
caller's `traceparent`; exported over real OTLP/HTTP to a receiver in the test; and nothing of
OpenTelemetry loaded when off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import pytest
import yaml
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from conclave.app.runtime import open_runtime
from conclave.app.sim import NativeCall, Reply, Rule, Scenario, SimPanel
from conclave.core.errors import ConfigError
from conclave.deliberation.confer import confer
from conclave.deliberation.coordinate import coordinate
from conclave.obs import tracing
from conclave.obs._otel import OtelTracer
from conclave.obs.telemetry import Telemetry, traced
from conclave.schema.config import Config

pytestmark = pytest.mark.anyio

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TASK = "SECRET-TASK-TEXT: pick a database."
PROPOSAL = {"proposal": "PostgreSQL.", "rationale": "Transactions.", "confidence": 0.7}
CHECK = {"checks": [{"type": "math", "expression": "6*7", "expected": 42}]}


def tree(spans: list[ReadableSpan]) -> list[str]:
    """The spans as an indented tree, children in start order."""
    by_parent: dict[int | None, list[ReadableSpan]] = {}
    ids = {s.context.span_id for s in spans}
    for span in spans:
        parent = span.parent.span_id if span.parent and span.parent.span_id in ids else None
        by_parent.setdefault(parent, []).append(span)
    lines: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        for span in sorted(by_parent.get(parent, []), key=lambda s: s.start_time or 0):
            lines.append("  " * depth + span.name)
            walk(span.context.span_id, depth + 1)

    walk(None, 0)
    return lines


@pytest.fixture
async def panel() -> AsyncIterator[SimPanel]:
    async with SimPanel() as sim:
        verify = Reply(tool_calls=(NativeCall("verify", CHECK),))
        rules = (Rule("<tool_result", Reply(text=json.dumps(PROPOSAL))),)
        sim.set_scenario("m-prop", Scenario(replies=(verify,), rules=rules))
        sim.set_scenario(
            "m-crit", Scenario(replies=(Reply(text=json.dumps({"verdict": "accept", "issues": []})),))
        )
        sim.set_scenario(
            "m-synth",
            Scenario(replies=(Reply(text=json.dumps({"answer": "PostgreSQL.", "confidence": 0.9})),)),
        )
        yield sim


@pytest.fixture
def config(make_config: Callable[..., Config], panel: SimPanel) -> Config:
    kinds = {"prop": "openai", "crit": "gemini", "synth": "anthropic"}
    providers = {
        name: {"kind": kind, "model": f"m-{name}", "base_url": panel.base_url(kind)}  # type: ignore[arg-type]
        for name, kind in kinds.items()
    }
    return make_config(providers, roles={"proposer": "prop", "critics": ["crit"], "synthesizer": "synth"})


async def test_a_coordinate_is_one_trace_parented_by_the_caller_in_the_conventions_names(
    config: Config,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = Telemetry(None, tracer=OtelTracer(provider))
    async with open_runtime(config, telemetry=telemetry) as rt:
        with traced(f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"):
            result = await coordinate(rt, {"task": TASK, "worker_tools": ["verify"]})
    assert result.degraded is False
    spans = list(exporter.get_finished_spans())
    assert tree(spans) == [
        "invoke_workflow coordinate",
        "  invoke_agent prop",
        "    chat m-prop",
        "    execute_tool verify",
        "    chat m-prop",
        "  invoke_agent crit",
        "    chat m-crit",
        "  invoke_agent synth",
        "    chat m-synth",
    ]
    assert {f"{s.context.trace_id:032x}" for s in spans} == {CALLER_TRACE}, "one trace: the caller's"
    (workflow,) = [s for s in spans if s.name.startswith("invoke_workflow")]
    assert workflow.parent is not None and f"{workflow.parent.span_id:016x}" == CALLER_SPAN
    assert workflow.attributes is not None
    assert workflow.attributes["gen_ai.operation.name"] == "invoke_workflow"
    assert workflow.attributes["gen_ai.conversation.id"] == result.session_id
    chats = {
        s.attributes["gen_ai.provider.name"]: s for s in spans if s.name.startswith("chat") and s.attributes
    }
    assert set(chats) == {"openai", "gcp.gemini", "anthropic"}
    chat = chats["anthropic"].attributes or {}
    assert chat["gen_ai.operation.name"] == "chat" and chat["gen_ai.request.model"] == "m-synth"
    assert chat["gen_ai.response.finish_reasons"] == ("stop",)
    assert chat["gen_ai.usage.input_tokens"] > 0 and chat["gen_ai.usage.output_tokens"] > 0
    (tool,) = [s for s in spans if s.name == "execute_tool verify"]
    assert (tool.attributes or {})["gen_ai.tool.name"] == "verify" and tool.status.is_ok
    agent = next(s for s in spans if s.name == "invoke_agent prop")
    assert (agent.attributes or {})["conclave.tool_mode"] == "native" and (agent.attributes or {})[
        "conclave.hops"
    ] == 2
    everything = json.dumps([dict(s.attributes or {}) for s in spans], default=str)
    assert "SECRET-TASK-TEXT" not in everything, "no content on spans"


async def test_a_failing_chat_says_why_and_its_retries_are_events(config: Config, panel: SimPanel) -> None:
    panel.set_scenario("m-crit", Scenario(replies=(Reply(status=503),)))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with open_runtime(config, telemetry=Telemetry(None, tracer=OtelTracer(provider))) as rt:
        await coordinate(rt, {"task": TASK, "worker_tools": ["verify"]})
    (chat,) = [s for s in exporter.get_finished_spans() if s.name == "chat m-crit"]
    assert (chat.attributes or {})["error.type"] == "unavailable" and not chat.status.is_ok
    assert [e.name for e in chat.events] == ["retry", "retry"], "three attempts, two retries"


class Receiver:
    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []

    async def traces(self, request: web.Request) -> web.Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        self.requests.append(message)
        return web.Response(content_type="application/x-protobuf", body=b"")


async def test_spans_reach_an_otlp_receiver_over_http_from_the_command_line(
    panel: SimPanel, tmp_path: Path
) -> None:
    receiver = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", receiver.traces)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    config = {
        "providers": {
            "alpha": {"kind": "anthropic", "model": "m-synth", "base_url": panel.base_url("anthropic")}
        },
        "panel": ["alpha"],
        "telemetry": {"otel": True, "path": str(tmp_path / "events.ndjson")},
        "transcripts": {"dir": str(tmp_path / "t")},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "CONCLAVE_CONFIG"}
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}", OTEL_SERVICE_NAME="conclave-under-test"
    )
    try:
        with anyio.fail_after(60):
            done = await anyio.run_process(
                [sys.executable, "-m", "conclave", "confer", "Which?", "--json"],
                cwd=tmp_path,
                env=env,
                check=False,
            )
    finally:
        await runner.cleanup()
    assert done.returncode == 0, done.stderr.decode()
    spans = [
        (span.name, resource.resource)
        for message in receiver.requests
        for resource in message.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    assert sorted(name for name, _ in spans) == [
        "chat m-synth",
        "invoke_agent alpha",
        "invoke_workflow confer",
    ]
    service = {a.key: a.value.string_value for a in spans[0][1].attributes}
    assert service["service.name"] == "conclave-under-test"


def test_with_tracing_off_nothing_of_opentelemetry_is_imported(tmp_path: Path) -> None:
    script = (
        "import sys, conclave.app.runtime, conclave.obs.telemetry, conclave.app.server.core, conclave.deliberation.coordinate\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert out.stdout.strip() == "[]"


def test_tracing_on_without_the_extra_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "conclave.obs._otel", None)  # as if opentelemetry were absent
    with pytest.raises(ConfigError, match=r"conclave\[otel\]"):
        tracing.tracer_for(True)
    assert tracing.tracer_for(False) is tracing.NO_TRACER


async def test_each_model_call_feeds_the_conventions_metrics(config: Config) -> None:
    reader = InMemoryMetricReader()
    tracer = OtelTracer(TracerProvider(), MeterProvider(metric_readers=[reader]))
    async with open_runtime(config, telemetry=Telemetry(None, tracer=tracer)) as rt:
        await coordinate(rt, {"task": TASK, "worker_tools": ["verify"]})
    data = reader.get_metrics_data()
    assert data is not None
    metrics = {
        metric.name: metric
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert set(metrics) == {"gen_ai.client.operation.duration", "gen_ai.client.token.usage"}
    durations = metrics["gen_ai.client.operation.duration"].data.data_points
    assert sum(p.count for p in durations) == 4, (
        "four model calls: two hops of the proposer, critic, synthesizer"
    )
    assert {p.attributes["gen_ai.provider.name"] for p in durations} == {"openai", "gcp.gemini", "anthropic"}
    tokens = metrics["gen_ai.client.token.usage"].data.data_points
    assert {p.attributes["gen_ai.token.type"] for p in tokens} == {"input", "output"}
    assert all(p.sum > 0 for p in tokens)


async def test_content_goes_on_chat_spans_only_when_asked_and_redacted(
    make_config: Callable[..., Config], panel: SimPanel
) -> None:
    secret = "sk-live-CANARY0123456789abcdef"
    panel.set_scenario("m-synth", Scenario(replies=(Reply(text=f"The key is {secret}."),)))
    providers = {
        "alpha": {
            "kind": "anthropic",
            "model": "m-synth",
            "base_url": panel.base_url("anthropic"),
            "api_key_env": "ALPHA_KEY",
        }
    }
    for include in (False, True):
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        config = make_config(providers, env={"ALPHA_KEY": secret}, telemetry={"include_content": include})
        telemetry = Telemetry(
            None, include_content=include, secrets=config.secrets.values(), tracer=OtelTracer(provider)
        )
        async with open_runtime(config, telemetry=telemetry) as rt:
            await confer(rt, {"question": "QUESTION-MARK: which?"})
        (chat,) = [s for s in exporter.get_finished_spans() if s.name == "chat m-synth"]
        attributes = dict(chat.attributes or {})
        if not include:
            assert not any(k.startswith("gen_ai.input") or k.startswith("gen_ai.output") for k in attributes)
            continue
        assert "QUESTION-MARK" in attributes["gen_ai.input.messages"]
        assert "The key is" in attributes["gen_ai.output.messages"]
        assert secret not in json.dumps(attributes), "redacted like the event log"
