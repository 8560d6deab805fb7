"""Each adapter against the simulated panel over real loopback HTTP, through the same
aiohttp-backed client real providers get: answers, usage, cost, auth, quirks and faults."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

import conclave
from conclave.app.sim import Reply, Rule, Scenario, SimPanel
from conclave.app.sim.recording import mask_secret
from conclave.core.errors import (
    DeadlineExceeded,
    MalformedResponse,
    PermanentProviderError,
    ProviderTimeout,
    ProviderUnreachable,
    RateLimited,
    TransientProviderError,
)
from conclave.core.messages import Completion, CompletionRequest, Message
from conclave.schema.config import Config
from tests.support import open_pool, read_events

pytestmark = pytest.mark.anyio

KINDS = ["openai", "anthropic", "gemini"]
KEY = "sk-sim-key-0123456789abcdef"
AUTH = {
    "openai": ("authorization", f"Bearer {KEY}"),
    "anthropic": ("x-api-key", KEY),
    "gemini": ("x-goog-api-key", KEY),
}
PRICE = {"input_per_mtok": 2.0, "output_per_mtok": 8.0, "cached_input_per_mtok": 0.5}



class Harness:
    def __init__(self, panel: SimPanel, make_config: Callable[..., Config]) -> None:
        self.panel = panel
        self.make_config = make_config

    async def ask(
        self,
        kind: str,
        model: str = "m1",
        *,
        request: CompletionRequest | None = None,
        retry: dict[str, Any] | None = None,
        deadline_in: float = 10.0,
        **entry: Any,
    ) -> Completion:
        providers = {
            "p": {
                "kind": kind,
                "model": model,
                "base_url": self.panel.base_url(kind),
                "api_key_env": "SIM_KEY",
                "price": PRICE,
                **entry,
            }
        }
        config = self.make_config(providers, env={"SIM_KEY": KEY}, retry=retry)
        async with open_pool(config) as pool:
            return await pool.get("p").complete(
                request or CompletionRequest.ask("Which option?"),
                deadline=anyio.current_time() + deadline_in,
            )


@pytest.fixture
def sim(panel: SimPanel, make_config: Callable[..., Config]) -> Harness:
    return Harness(panel, make_config)


@pytest.mark.parametrize("kind", KINDS)
async def test_plain_answer_arrives_labelled_simulated_with_usage_and_cost(sim: Harness, kind: str) -> None:
    c = await sim.ask(kind)
    assert c.text.startswith("[simulated m1]")
    assert c.finish_reason == "stop"
    assert c.model == "m1"
    assert c.usage.input_tokens > 0 and c.usage.output_tokens > 0
    expected = (c.usage.input_tokens * 2.0 + c.usage.output_tokens * 8.0) / 1e6
    assert c.usage.cost_usd == pytest.approx(expected)
    assert c.request_id
    assert c.attempts == 1, "a first-try answer took one attempt"


@pytest.mark.parametrize("kind", KINDS)
async def test_the_key_travels_in_the_kinds_own_auth_header(sim: Harness, kind: str) -> None:
    await sim.ask(kind)
    header, value = AUTH[kind]
    received = sim.panel.received[-1]
    assert received.headers[header] == mask_secret(value)
    assert KEY not in received.path


@pytest.mark.parametrize("kind", KINDS)
async def test_system_prompt_and_conversation_reach_the_model_in_the_wire_shape(
    sim: Harness, kind: str
) -> None:
    sim.panel.set_scenario("m1", Scenario(rules=(Rule("follow-up", Reply(text="saw: {last}")),)))
    request = CompletionRequest(
        messages=(
            Message("user", "first"),
            Message("assistant", "reply"),
            Message("user", "follow-up question"),
        ),
        system="Be terse.",
    )
    c = await sim.ask(kind, request=request)
    assert c.text == "saw: follow-up question"


@pytest.mark.parametrize("kind", KINDS)
async def test_cached_tokens_are_normalised_into_input_and_priced_apart(sim: Harness, kind: str) -> None:
    sim.panel.set_scenario("m1", Scenario(replies=(Reply(text="cached", cached_tokens=1000),)))
    c = await sim.ask(kind)
    assert c.usage.cached_input_tokens == 1000
    assert c.usage.input_tokens >= 1000
    uncached = c.usage.input_tokens - 1000
    assert c.usage.cost_usd == pytest.approx(
        (uncached * 2.0 + 1000 * 0.5 + c.usage.output_tokens * 8.0) / 1e6
    )


@pytest.mark.parametrize("kind", ["openai", "gemini"])
async def test_reasoning_tokens_are_counted_inside_output(sim: Harness, kind: str) -> None:
    sim.panel.set_scenario("m1", Scenario(replies=(Reply(text="four words are here", reasoning_tokens=50),)))
    c = await sim.ask(kind)
    assert c.usage.reasoning_tokens == 50
    assert c.usage.output_tokens >= 51


@pytest.mark.parametrize("model", ["o3", "gpt-5-mini"])
async def test_reasoning_model_quirk_is_handled_so_the_real_api_shape_accepts_it(
    sim: Harness, model: str
) -> None:
    request = CompletionRequest.ask("q", temperature=0.2, max_tokens=64)
    c = await sim.ask("openai", model, request=request, base_url=sim.panel.base_url("openai"))
    assert c.text
    body = sim.panel.received[-1].body
    assert "temperature" not in body and body["max_completion_tokens"] == 64


async def test_the_panel_would_reject_the_unhandled_quirk(sim: Harness) -> None:
    """Control for the test above: forcing max_tokens on o3 is refused by the panel as by OpenAI."""
    with pytest.raises(PermanentProviderError) as info:
        await sim.ask("openai", "o3", max_tokens_field="max_tokens")
    assert info.value.status == 400
    assert "max_completion_tokens" in info.value.message


@pytest.mark.parametrize("kind", KINDS)
async def test_429_with_retry_after_is_retried_then_succeeds(
    sim: Harness, kind: str, events_path: Path
) -> None:
    sim.panel.set_scenario(
        "m1",
        Scenario(
            replies=(Reply(status=429, headers={"retry-after-ms": "20"}), Reply(text="second time lucky"))
        ),
    )
    c = await sim.ask(kind)
    assert (c.text, c.attempts) == ("second time lucky", 2)
    assert sim.panel.calls("m1") == 2
    retry = next(e for e in read_events(events_path) if e["event"] == "provider_retry")
    assert (retry["http_status"], retry["delay_seconds"]) == (429, 0.02)


@pytest.mark.parametrize(("kind", "status"), [("openai", 500), ("anthropic", 529), ("gemini", 503)])
async def test_server_errors_every_time_give_the_status_after_the_configured_attempts(
    sim: Harness, kind: str, status: int
) -> None:
    sim.panel.set_scenario("m1", Scenario(replies=(Reply(status=status),)))
    with pytest.raises(TransientProviderError) as info:
        await sim.ask(kind, retry={"max_attempts": 3})
    assert info.value.status == status
    assert sim.panel.calls("m1") == 3


@pytest.mark.parametrize("kind", KINDS)
async def test_400_is_not_retried_and_keeps_the_providers_message(sim: Harness, kind: str) -> None:
    sim.panel.set_scenario("m1", Scenario(replies=(Reply(status=400, error_message="bad field xyz"),)))
    with pytest.raises(PermanentProviderError) as info:
        await sim.ask(kind)
    assert "bad field xyz" in info.value.message
    assert sim.panel.calls("m1") == 1


async def test_insufficient_quota_is_not_retried(sim: Harness) -> None:
    sim.panel.set_scenario("m1", Scenario(replies=(Reply(status=429, error_type="insufficient_quota"),)))
    with pytest.raises(PermanentProviderError) as info:
        await sim.ask("openai")
    assert info.value.code == "insufficient_quota"
    assert sim.panel.calls("m1") == 1


async def test_gemini_retry_info_beyond_the_limit_is_not_waited_for(sim: Harness) -> None:
    sim.panel.set_scenario("m1", Scenario(replies=(Reply(status=429, retry_delay="120s"),)))
    with pytest.raises(RateLimited) as info:
        await sim.ask("gemini")
    assert info.value.retry_after == 120.0
    assert "retry after 120s" in info.value.message
    assert sim.panel.calls("m1") == 1


@pytest.mark.parametrize("kind", KINDS)
async def test_retry_after_of_120_seconds_fails_at_once_saying_when(sim: Harness, kind: str) -> None:
    sim.panel.set_scenario("m1", Scenario(replies=(Reply(status=429, headers={"retry-after": "120"}),)))
    with pytest.raises(RateLimited) as info:
        await sim.ask(kind)
    assert "retry after 120s" in info.value.message
    assert sim.panel.calls("m1") == 1


@pytest.mark.parametrize("kind", KINDS)
async def test_a_slow_answer_is_a_typed_timeout(sim: Harness, kind: str) -> None:
    sim.panel.set_scenario("m1", Scenario(latency_ms=2000))
    with pytest.raises(ProviderTimeout) as info:
        await sim.ask(kind, retry={"max_attempts": 1, "attempt_timeout_seconds": 0.2})
    assert info.value.code == "timeout"


async def test_a_slow_answer_past_the_deadline_is_deadline_exceeded(sim: Harness) -> None:
    sim.panel.set_scenario("m1", Scenario(latency_ms=2000))
    with pytest.raises(DeadlineExceeded):
        await sim.ask("openai", deadline_in=0.2)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fault", ["malformed", "missing_fields"])
async def test_broken_bodies_are_malformed_responses(sim: Harness, kind: str, fault: str) -> None:
    sim.panel.set_scenario("m1", Scenario(replies=(Reply(fault=fault),)))  # type: ignore[arg-type]
    with pytest.raises(MalformedResponse):
        await sim.ask(kind)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_dropped_connection_is_reported_as_dropped(sim: Harness, kind: str) -> None:
    sim.panel.set_scenario("m1", Scenario(replies=(Reply(fault="drop"),)))
    with pytest.raises(ProviderUnreachable) as info:
        await sim.ask(kind, retry={"max_attempts": 2})
    assert info.value.code == "connection_dropped"
    assert sim.panel.calls("m1") == 2


@pytest.mark.parametrize("kind", KINDS)
async def test_an_empty_answer_comes_back_empty_with_finish_reason_length(sim: Harness, kind: str) -> None:
    sim.panel.set_scenario("m1", Scenario(replies=(Reply(fault="empty"),)))
    c = await sim.ask(kind)
    assert (c.text, c.finish_reason) == ("", "length")


async def test_connection_refused_is_unreachable(make_config: Callable[..., Config]) -> None:
    with anyio.fail_after(10):
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        await listener.aclose()  # nothing listens there any more
    config = make_config(
        {"p": {"kind": "openai", "model": "m", "base_url": f"http://127.0.0.1:{port}/v1"}},
        retry={"max_attempts": 1},
    )
    async with open_pool(config) as pool:
        with pytest.raises(ProviderUnreachable) as info:
            await pool.get("p").complete(CompletionRequest.ask("q"), deadline=anyio.current_time() + 5)
    assert info.value.code == "connection_error"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("configured", [None, "my-gateway-client/2"])
async def test_requests_name_conclave_as_their_client_unless_configured_otherwise(
    panel: SimPanel, make_config: Callable[..., Config], kind: str, configured: str | None
) -> None:
    """Through the production transport (AiohttpTransport): aiohttp's own User-Agent never goes
    out, a configured header replaces Conclave's."""
    headers = {"User-Agent": configured} if configured else {}
    entry = {"kind": kind, "model": "m1", "base_url": panel.base_url(kind), "api_key_env": None}
    config = make_config({"p": {**entry, "headers": headers}})
    async with open_pool(config) as pool:
        await pool.get("p").complete(CompletionRequest.ask("hi"), deadline=anyio.current_time() + 10)

    sent = {name.lower(): value for name, value in panel.received[-1].headers.items()}
    assert sent["user-agent"] == (configured or f"conclave/{conclave.__version__}")
    assert "aiohttp" not in sent["user-agent"].lower()
