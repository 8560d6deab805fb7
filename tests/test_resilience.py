"""Retries, backoff, retry hints and deadlines, driven by a controlled clock (no real sleeps)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import tenacity

from conclave.core.errors import (
    DeadlineExceeded,
    PermanentProviderError,
    ProviderError,
    ProviderTimeout,
    ProviderUnreachable,
    RateLimited,
    TransientProviderError,
)
from conclave.core.messages import Completion, CompletionRequest
from conclave.net.http import TransportError
from conclave.providers.retry import StopAtAttemptsOrDeadline, stop_reason
from conclave.schema.config import Config, RetryConfig
from tests.conftest import FakeClock
from tests.support import ScriptedTransport, Step, open_pool, provider_entry, read_events

pytestmark = pytest.mark.anyio

ENTRIES = {
    "openai": provider_entry("openai", "gpt-4o-mini", "https://api.openai.com/v1"),
    "anthropic": provider_entry("anthropic", "claude-haiku-4-5", "https://api.anthropic.com"),
    "gemini": provider_entry("gemini", "gemini-2.5-flash", "https://generativelanguage.googleapis.com"),
}
OK = {"openai": "openai_basic", "anthropic": "anthropic_cached", "gemini": "gemini_thoughts"}


def status(code: int, headers: dict[str, str] | None = None, body: Any = None) -> Step:
    return lambda _request: httpx.Response(
        code, headers=headers or {}, json=body or {"error": {"message": f"boom {code}"}}
    )


def raise_(exc: Exception) -> Step:
    def step(request: httpx.Request) -> httpx.Response:
        raise exc

    return step


async def run(
    make_config: Callable[..., Config],
    clock: FakeClock,
    *steps: Step,
    kind: str = "openai",
    retry: dict[str, Any] | None = None,
    deadline_in: float = 100.0,
) -> tuple[Completion, ScriptedTransport]:
    config = make_config({"p": ENTRIES[kind]}, retry=retry)
    transport = ScriptedTransport(*steps)
    async with open_pool(config, transport, clock=clock, sleep=clock.sleep, jitter=lambda: 0.0) as pool:
        try:
            result = await pool.get("p").complete(CompletionRequest.ask("q"), deadline=clock() + deadline_in)
        except ProviderError as exc:
            exc.add_note(f"requests sent: {len(transport.requests)}")
            exc.transport = transport  # type: ignore[attr-defined]
            raise
    return result, transport


@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
async def test_429_with_retry_after_is_waited_for_then_succeeds(
    make_config: Callable[..., Config], clock: FakeClock, events_path: Path, kind: str
) -> None:
    completion, transport = await run(
        make_config, clock, status(429, {"retry-after": "2"}), OK[kind], kind=kind
    )
    assert completion.attempts == 2
    assert len(transport.requests) == 2
    assert clock.slept == [2.0]
    retries = [e for e in read_events(events_path) if e["event"] == "provider_retry"]
    assert retries == [
        {
            **retries[0],
            "provider": "p",
            "attempt": 1,
            "delay_seconds": 2.0,
            "code": "rate_limited",
            "http_status": 429,
        }
    ]


async def test_retry_after_ms_wins_over_retry_after(
    make_config: Callable[..., Config], clock: FakeClock
) -> None:
    await run(make_config, clock, status(429, {"retry-after-ms": "250", "retry-after": "9"}), "openai_basic")
    assert clock.slept == [0.25]


async def test_retry_after_as_an_http_date_is_honoured(
    make_config: Callable[..., Config], clock: FakeClock
) -> None:
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    await run(make_config, clock, status(503, {"retry-after": when}), "openai_basic")
    assert len(clock.slept) == 1
    assert 25 < clock.slept[0] <= 30


async def test_gemini_retry_info_in_the_body_is_honoured(
    make_config: Callable[..., Config], clock: FakeClock
) -> None:
    await run(make_config, clock, "gemini_error_429_retryinfo", "gemini_thoughts", kind="gemini")
    assert clock.slept == [47.0]


async def test_gemini_daily_quota_is_not_retried(
    make_config: Callable[..., Config], clock: FakeClock
) -> None:
    with pytest.raises(PermanentProviderError) as info:
        await run(make_config, clock, "gemini_error_429_daily", "gemini_thoughts", kind="gemini")
    assert info.value.code == "quota_exhausted"
    assert clock.slept == []


async def test_500_every_time_fails_after_the_configured_attempts_with_the_status(
    make_config: Callable[..., Config], clock: FakeClock
) -> None:
    with pytest.raises(TransientProviderError) as info:
        await run(make_config, clock, status(500), retry={"max_attempts": 4})
    assert info.value.status == 500
    assert info.value.code == "server_error"
    assert "after 4 attempts" in info.value.message
    assert len(info.value.transport.requests) == 4  # type: ignore[attr-defined]
    assert clock.slept == [0.01, 0.02, 0.04]


async def test_backoff_is_capped_at_the_max_delay(
    make_config: Callable[..., Config], clock: FakeClock
) -> None:
    with pytest.raises(TransientProviderError):
        await run(
            make_config,
            clock,
            status(502),
            retry={"max_attempts": 5, "initial_delay_seconds": 1, "max_delay_seconds": 3},
        )
    assert clock.slept == [1.0, 2.0, 3.0, 3.0]


@pytest.mark.parametrize("code", [400, 401, 403, 404, 422])
async def test_client_errors_fail_at_once_without_retry(
    make_config: Callable[..., Config], clock: FakeClock, code: int
) -> None:
    with pytest.raises(PermanentProviderError) as info:
        await run(make_config, clock, status(code), "openai_basic")
    assert info.value.status == code
    assert len(info.value.transport.requests) == 1  # type: ignore[attr-defined]
    assert clock.slept == []


async def test_insufficient_quota_429_is_not_retried(
    make_config: Callable[..., Config], clock: FakeClock
) -> None:
    with pytest.raises(PermanentProviderError) as info:
        await run(make_config, clock, "openai_error_429_insufficient_quota", "openai_basic")
    assert info.value.code == "insufficient_quota"
    assert "billing" in info.value.message
    assert clock.slept == []


async def test_request_larger_than_the_whole_limit_is_not_retried(
    make_config: Callable[..., Config], clock: FakeClock
) -> None:
    with pytest.raises(PermanentProviderError) as info:
        await run(make_config, clock, "openai_error_429_request_too_large", "openai_basic")
    assert info.value.code == "request_too_large"


async def test_retry_after_longer_than_the_limit_is_not_waited_and_the_error_says_when(
    make_config: Callable[..., Config], clock: FakeClock
) -> None:
    with pytest.raises(RateLimited) as info:
        await run(make_config, clock, status(429, {"retry-after": "120"}), "openai_basic")
    assert clock.slept == []
    assert info.value.retry_after == 120.0
    assert "retry after 120s" in info.value.message
    assert info.value.to_dict()["retry_after_seconds"] == 120.0


async def test_anthropic_529_overloaded_is_retried(
    make_config: Callable[..., Config], clock: FakeClock
) -> None:
    completion, _ = await run(make_config, clock, "anthropic_error_529", "anthropic_cached", kind="anthropic")
    assert completion.attempts == 2


async def test_x_should_retry_false_stops_a_retryable_status(
    make_config: Callable[..., Config], clock: FakeClock
) -> None:
    with pytest.raises(PermanentProviderError):
        await run(make_config, clock, status(500, {"x-should-retry": "false"}), "openai_basic")


async def test_x_should_retry_true_retries_an_otherwise_final_status(
    make_config: Callable[..., Config], clock: FakeClock
) -> None:
    completion, _ = await run(make_config, clock, status(400, {"x-should-retry": "true"}), "openai_basic")
    assert completion.attempts == 2


async def test_read_timeout_is_a_typed_timeout_and_is_retried(
    make_config: Callable[..., Config], clock: FakeClock
) -> None:
    with pytest.raises(ProviderTimeout) as info:
        await run(make_config, clock, raise_(TransportError("read timed out", failure="timeout")), retry={"max_attempts": 2})
    assert info.value.code == "timeout"
    assert len(clock.slept) == 1


async def test_refused_connection_is_unreachable_and_retried_then_succeeds(
    make_config: Callable[..., Config], clock: FakeClock
) -> None:
    completion, _ = await run(make_config, clock, raise_(TransportError("refused", failure="connection_error")), "openai_basic")
    assert completion.attempts == 2


async def test_dropped_connection_is_reported_as_dropped(
    make_config: Callable[..., Config], clock: FakeClock
) -> None:
    with pytest.raises(ProviderUnreachable) as info:
        await run(
            make_config, clock, raise_(TransportError("peer closed", failure="connection_dropped")), retry={"max_attempts": 1}
        )
    assert info.value.code == "connection_dropped"


async def test_retries_stop_when_the_next_wait_would_pass_the_deadline(
    make_config: Callable[..., Config], clock: FakeClock
) -> None:
    with pytest.raises(TransientProviderError) as info:
        await run(
            make_config,
            clock,
            status(503),
            retry={"max_attempts": 10, "initial_delay_seconds": 0.4, "max_delay_seconds": 10},
            deadline_in=1.0,
        )
    # attempt 1 at t=0, wait 0.4, attempt 2 at t=0.4; the next wait (0.8) would end past t=1.0.
    assert clock.slept == [0.4]
    assert len(info.value.transport.requests) == 2  # type: ignore[attr-defined]
    # The provider's own answer is kept (not a timeout: nothing timed out), with why we stopped.
    assert (info.value.code, info.value.status) == ("unavailable", 503)
    assert "deadline left no time to retry" in info.value.message


async def test_a_retry_after_past_the_deadline_is_not_waited_for_and_keeps_the_hint(
    make_config: Callable[..., Config], clock: FakeClock
) -> None:
    with pytest.raises(RateLimited) as info:
        await run(make_config, clock, status(429, {"retry-after": "30"}), "openai_basic", deadline_in=10)
    assert clock.slept == []
    assert info.value.retry_after == 30.0


async def test_a_timeout_whose_retry_would_pass_the_deadline_is_deadline_exceeded(
    make_config: Callable[..., Config], clock: FakeClock
) -> None:
    with pytest.raises(DeadlineExceeded):
        await run(
            make_config,
            clock,
            raise_(TransportError("slow", failure="timeout")),
            retry={"max_attempts": 5, "initial_delay_seconds": 5, "max_delay_seconds": 10},
            deadline_in=1.0,
        )


async def test_a_call_whose_deadline_has_passed_sends_nothing(
    make_config: Callable[..., Config], clock: FakeClock
) -> None:
    with pytest.raises(DeadlineExceeded) as info:
        await run(make_config, clock, "openai_basic", deadline_in=0)
    assert info.value.transport.requests == []  # type: ignore[attr-defined]


async def test_every_call_leaves_one_provider_call_event_with_attempts(
    make_config: Callable[..., Config], clock: FakeClock, events_path: Path
) -> None:
    await run(make_config, clock, status(500), status(500), "openai_basic")
    calls = [e for e in read_events(events_path) if e["event"] == "provider_call"]
    assert len(calls) == 1
    assert calls[0]["status"] == "ok"
    assert calls[0]["attempts"] == 3
    assert calls[0]["usage"]["input_tokens"] == 14


async def test_the_attempts_run_on_tenacity_with_the_injected_sleep(
    make_config: Callable[..., Config], clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[tenacity.AsyncRetrying] = []

    class Seen(tenacity.AsyncRetrying):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            made.append(self)

    monkeypatch.setattr(tenacity, "AsyncRetrying", Seen)
    plain, _ = await run(make_config, clock, "openai_basic")
    assert plain.attempts == 1 and made == [], "a first attempt that succeeds needs no controller"
    completion, _ = await run(make_config, clock, status(503), "openai_basic")
    assert completion.attempts == 2
    [retrying] = made  # one controller for the call, handed the failed first attempt, then the second
    assert retrying.statistics["attempt_number"] == 2
    sleep: object = retrying.sleep  # typed by tenacity as a sync sleep; ours is awaited
    assert sleep == clock.sleep
    assert isinstance(retrying.stop, StopAtAttemptsOrDeadline)
    assert clock.slept == [0.01]


async def test_a_hint_past_the_deadline_stops_at_once_saying_why(
    make_config: Callable[..., Config], clock: FakeClock, events_path: Path
) -> None:
    with pytest.raises(RateLimited) as info:
        await run(make_config, clock, status(429, {"retry-after": "5"}), "openai_basic", deadline_in=3)
    assert len(info.value.transport.requests) == 1  # type: ignore[attr-defined]
    assert clock.slept == []
    assert "deadline left no time to retry" in info.value.message
    assert [e for e in read_events(events_path) if e["event"] == "provider_retry"] == []


def test_a_hint_longer_than_conclave_waits_is_named_even_on_the_last_attempt() -> None:
    policy = RetryConfig(max_attempts=2, max_retry_after_seconds=60)

    def reason(retry_after: float | None, attempt: int, wait: float) -> str:
        hinted = RateLimited("slow down", retry_after=retry_after)
        return stop_reason(hinted, attempt=attempt, wait=wait, policy=policy, remaining=10.0)

    assert reason(120, attempt=2, wait=120) == "retry_after_too_long"
    assert reason(None, attempt=2, wait=1) == "attempts"
    assert reason(None, attempt=1, wait=10) == "deadline"
    assert reason(None, attempt=1, wait=1) == ""
