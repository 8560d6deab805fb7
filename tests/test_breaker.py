"""The per-provider circuit breaker, through the provider client, on a controlled clock."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from conclave.core.errors import BreakerOpen, ProviderError
from conclave.core.messages import CompletionRequest
from conclave.providers import ProviderClient
from conclave.schema.config import Config
from tests.conftest import FakeClock
from tests.support import ScriptedTransport, open_pool, provider_entry, read_events

pytestmark = pytest.mark.anyio

ENTRY = provider_entry("openai", "gpt-4o-mini", "https://api.openai.com/v1")


class Switchable(ScriptedTransport):
    """Fails with 503 while `failing` is set, answers otherwise."""

    def __init__(self) -> None:
        self.failing = True
        super().__init__(self._answer)

    def _answer(self, request: httpx.Request) -> httpx.Response:
        if self.failing:
            return httpx.Response(503, json={"error": {"message": "unavailable"}})
        return httpx.Response(
            200,
            json={
                "choices": [{"message": {"content": "back"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            },
        )


async def call(client: ProviderClient, clock: FakeClock) -> str:
    completion = await client.complete(CompletionRequest.ask("q"), deadline=clock() + 10)
    return completion.text


async def fail_times(client: ProviderClient, clock: FakeClock, n: int) -> None:
    for _ in range(n):
        with pytest.raises(ProviderError):
            await call(client, clock)


async def test_breaker_opens_after_threshold_failures_and_then_fails_fast(
    make_config: Callable[..., Config], clock: FakeClock, events_path: Path
) -> None:
    config = make_config({"p": ENTRY}, retry={"max_attempts": 1})
    transport = Switchable()
    async with open_pool(config, transport, clock=clock, sleep=clock.sleep) as pool:
        client = pool.get("p")
        await fail_times(client, clock, 3)
        assert client.breaker.state == "open"
        sent = len(transport.requests)
        with pytest.raises(BreakerOpen) as info:
            await call(client, clock)
        assert len(transport.requests) == sent, "an open breaker must not send anything"
        assert info.value.code == "breaker_open"
        assert "next trial in 30.0s" in info.value.message
    events = read_events(events_path)
    opened = [e for e in events if e["event"] == "breaker_open"]
    assert [(e["provider"], e["consecutive_failures"]) for e in opened] == [("p", 3)]
    assert events[-1]["event"] == "provider_call"
    assert events[-1]["status"] == "breaker_open"


async def test_breaker_half_opens_after_cooldown_and_a_successful_trial_closes_it(
    make_config: Callable[..., Config], clock: FakeClock, events_path: Path
) -> None:
    config = make_config({"p": ENTRY}, retry={"max_attempts": 1})
    transport = Switchable()
    async with open_pool(config, transport, clock=clock, sleep=clock.sleep) as pool:
        client = pool.get("p")
        await fail_times(client, clock, 3)
        clock.advance(29.9)
        assert client.breaker.state == "open"
        clock.advance(0.1)
        assert client.breaker.state == "half_open"
        transport.failing = False
        assert await call(client, clock) == "back"
        assert client.breaker.state == "closed"
    assert [e["event"] for e in read_events(events_path) if e["event"].startswith("breaker")] == [
        "breaker_open",
        "breaker_closed",
    ]


async def test_a_failed_trial_reopens_the_breaker_for_another_cooldown(
    make_config: Callable[..., Config], clock: FakeClock
) -> None:
    config = make_config({"p": ENTRY}, retry={"max_attempts": 1})
    async with open_pool(config, Switchable(), clock=clock, sleep=clock.sleep) as pool:
        client = pool.get("p")
        await fail_times(client, clock, 3)
        clock.advance(30)
        await fail_times(client, clock, 1)
        assert client.breaker.state == "open"
        with pytest.raises(BreakerOpen):
            await call(client, clock)


async def test_a_success_resets_the_consecutive_failure_count(
    make_config: Callable[..., Config], clock: FakeClock
) -> None:
    config = make_config({"p": ENTRY}, retry={"max_attempts": 1})
    transport = Switchable()
    async with open_pool(config, transport, clock=clock, sleep=clock.sleep) as pool:
        client = pool.get("p")
        await fail_times(client, clock, 2)
        transport.failing = False
        await call(client, clock)
        transport.failing = True
        await fail_times(client, clock, 2)
        assert client.breaker.state == "closed"


async def test_client_errors_do_not_count_against_the_provider(
    make_config: Callable[..., Config], clock: FakeClock
) -> None:
    config = make_config({"p": ENTRY}, retry={"max_attempts": 1})
    bad_request = ScriptedTransport(lambda _r: httpx.Response(400, json={"error": {"message": "bad"}}))
    async with open_pool(config, bad_request, clock=clock, sleep=clock.sleep) as pool:
        client = pool.get("p")
        await fail_times(client, clock, 5)
        assert client.breaker.state == "closed"


async def test_breakers_are_per_provider(make_config: Callable[..., Config], clock: FakeClock) -> None:
    config = make_config({"a": ENTRY, "b": ENTRY}, retry={"max_attempts": 1})
    async with open_pool(config, Switchable(), clock=clock, sleep=clock.sleep) as pool:
        await fail_times(pool.get("a"), clock, 3)
        assert pool.get("a").breaker.state == "open"
        assert pool.get("b").breaker.state == "closed"
