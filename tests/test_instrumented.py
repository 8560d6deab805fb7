"""Tracing is decided once, when the runtime opens (docs/telemetry.md#traces-opentelemetry): with
it on, the provider clients, the worker loop and the session runner are wrapped in their
instrumented decorators; with it off the plain objects serve every call, and no call asks the
tracer whether it records."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from conclave.app.runtime import open_runtime
from conclave.app.sim import SimPanel
from conclave.core.messages import Message
from conclave.deliberation.confer import confer
from conclave.deliberation.instrumented import InstrumentedSessionRunner
from conclave.deliberation.session import SessionRunner
from conclave.obs._otel import OtelTracer
from conclave.obs.telemetry import Telemetry
from conclave.obs.tracing import NoTracer
from conclave.providers import InstrumentedProviderClient, ProviderClient
from conclave.schema.config import Config
from conclave.worker.instrumented import InstrumentedWorkerLoop
from conclave.worker.loop import WorkerLoop, WorkerTurn

pytestmark = pytest.mark.anyio



@pytest.fixture
def config(make_config: Callable[..., Config], panel: SimPanel) -> Config:
    providers = {
        "alpha": {"kind": "openai", "model": "m-alpha", "base_url": panel.base_url("openai")},
        "beta": {"kind": "anthropic", "model": "m-beta", "base_url": panel.base_url("anthropic")},
    }
    return make_config(providers)


class CountingTracer(NoTracer):
    """The null tracer, counting how often it is asked whether it records."""

    def __init__(self) -> None:
        self.asked = 0

    @property
    def recording(self) -> bool:
        self.asked += 1
        return False

    @recording.setter
    def recording(self, value: bool) -> None:
        raise AssertionError("not settable")


async def test_with_tracing_off_the_runtime_holds_the_plain_objects(config: Config) -> None:
    async with open_runtime(config) as rt:
        assert {"alpha", "beta"} <= {client.name for client in rt.providers}
        assert all(type(client) is ProviderClient for client in rt.providers)
        assert type(rt.providers.get("alpha")) is ProviderClient
        assert type(rt.worker) is WorkerLoop
        assert type(rt.sessions) is SessionRunner


async def test_with_tracing_on_each_is_wrapped_once_around_the_plain_one(config: Config) -> None:
    telemetry = Telemetry(None, tracer=OtelTracer(TracerProvider()))
    async with open_runtime(config, telemetry=telemetry) as rt:
        for client in rt.providers:
            assert isinstance(client, InstrumentedProviderClient)
            assert type(client.inner) is ProviderClient
            assert (client.name, client.entry, client.breaker) == (
                client.inner.name,
                client.inner.entry,
                client.inner.breaker,
            )
        assert {"alpha", "beta"} <= {client.name for client in rt.providers}
        assert isinstance(rt.worker, InstrumentedWorkerLoop)
        assert type(rt.worker.inner) is WorkerLoop
        assert isinstance(rt.sessions, InstrumentedSessionRunner)
        assert type(rt.sessions.inner) is SessionRunner


async def test_with_tracing_off_no_call_asks_the_tracer_whether_it_records(config: Config) -> None:
    tracer = CountingTracer()
    async with open_runtime(config, telemetry=Telemetry(None, tracer=tracer)) as rt:
        opened = tracer.asked
        assert opened > 0, "the runtime decided once, when it opened"
        for _ in range(3):
            result = await confer(rt, {"question": "Which?"})
            assert [answer.status for answer in result.answers] == ["ok", "ok"]
    assert tracer.asked == opened, "three confers, two members each: not one question more"


async def test_a_turn_outside_the_allowlist_is_refused_before_any_span(config: Config) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with open_runtime(config, telemetry=Telemetry(None, tracer=OtelTracer(provider))) as rt:
        turn = WorkerTurn(
            provider=rt.providers.get("alpha"),
            messages=(Message("user", "Hi"),),
            deadline=anyio.current_time() + 10,
            session_id="s-1",
            tools=("verify", "shell"),
        )
        with pytest.raises(ValueError, match=r"outside the allowlist: \['shell'\]"):
            await rt.worker.run(turn)
    assert exporter.get_finished_spans() == ()
