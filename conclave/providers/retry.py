"""When to retry a provider call and how long to wait: the SDKs' policy (WIRE.md §1),
bounded by the call's deadline."""

from __future__ import annotations

import random
from collections.abc import Callable

from conclave.config import RetryConfig
from conclave.errors import ProviderError, TransientProviderError
from conclave.records import record


@record
class RetryDecision:
    retry: bool
    delay: float
    reason: str  # why not, when not retrying: "permanent", "attempts", "deadline", "retry_after_too_long"


def decide(
    exc: BaseException,
    *,
    attempt: int,
    policy: RetryConfig,
    remaining: float,
    jitter: Callable[[], float] = random.random,
) -> RetryDecision:
    """Decide after failed attempt number `attempt` (1-based) with `remaining` seconds left."""
    if not isinstance(exc, TransientProviderError):
        return RetryDecision(False, 0.0, "permanent")
    hinted = exc.retry_after
    if hinted is not None and hinted > policy.max_retry_after_seconds:
        return RetryDecision(False, hinted, "retry_after_too_long")
    if attempt >= policy.max_attempts:
        return RetryDecision(False, 0.0, "attempts")
    delay = hinted if hinted is not None and hinted > 0 else backoff(attempt, policy, jitter)
    if delay >= remaining:
        return RetryDecision(False, delay, "deadline")
    return RetryDecision(True, delay, "")


def backoff(attempt: int, policy: RetryConfig, jitter: Callable[[], float]) -> float:
    """min(initial * 2**(n-1), max), shaved by up to 25% so clients don't retry in step."""
    base = min(policy.initial_delay_seconds * 2.0 ** (attempt - 1), policy.max_delay_seconds)
    return base * (1.0 - 0.25 * jitter())


def explain_give_up(exc: ProviderError, decision: RetryDecision, attempts: int) -> str:
    """The final error message: the provider's words plus why Conclave stopped asking."""
    if decision.reason == "retry_after_too_long":
        return (
            f"{exc.message} (the provider asks to retry after {decision.delay:.0f}s, longer "
            "than Conclave waits; try again then)"
        )
    if decision.reason == "deadline":
        return f"{exc.message} (gave up after {attempts} attempts: the deadline left no time to retry)"
    if decision.reason == "attempts" and attempts > 1:
        return f"{exc.message} (after {attempts} attempts)"
    return exc.message
