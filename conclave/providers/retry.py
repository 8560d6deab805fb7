"""When to retry a provider call and how long to wait, as tenacity strategies: the providers'
retry hints (docs/providers.md#errors-and-retry-hints) and the `limits.retry` policy
(docs/configuration.md, Resilience), bounded by the call's deadline.

The judgements are small pure functions (`delay`, `stop_reason`); the strategy classes only
read tenacity's `RetryCallState` and hand them the error, the attempt number and the time left.
"""

from __future__ import annotations

from collections.abc import Callable

from tenacity import RetryCallState
from tenacity.retry import retry_base
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from conclave.core.errors import ProviderError, TransientProviderError
from conclave.schema.config import RetryConfig

# Why retrying stopped, for the final error's message ("" while it has not).
RETRY_AFTER_TOO_LONG = "retry_after_too_long"
ATTEMPTS = "attempts"
DEADLINE = "deadline"


def delay(
    exc: TransientProviderError, attempt: int, policy: RetryConfig, jitter: Callable[[], float]
) -> float:
    """The wait after failed attempt `attempt` (1-based): the provider's hint when it gives one."""
    hinted = exc.retry_after
    return hinted if hinted is not None and hinted > 0 else backoff(attempt, policy, jitter)


def backoff(attempt: int, policy: RetryConfig, jitter: Callable[[], float]) -> float:
    """min(initial * 2**(n-1), max), shaved by up to 25% so clients don't retry in step."""
    base = min(policy.initial_delay_seconds * 2.0 ** (attempt - 1), policy.max_delay_seconds)
    return base * (1.0 - 0.25 * jitter())


def stop_reason(
    exc: TransientProviderError, *, attempt: int, wait: float, policy: RetryConfig, remaining: float
) -> str:
    """Why not to try again after failed attempt `attempt`, `wait` seconds from now with
    `remaining` seconds left; "" to try again. The checks keep this order: a hint longer than
    Conclave waits is reported as such even on the last attempt."""
    hinted = exc.retry_after
    if hinted is not None and hinted > policy.max_retry_after_seconds:
        return RETRY_AFTER_TOO_LONG
    if attempt >= policy.max_attempts:
        return ATTEMPTS
    if wait >= remaining:
        return DEADLINE
    return ""


def failure(state: RetryCallState) -> TransientProviderError:
    """The error the attempt just raised: past `RetryTransient`, always a transient one."""
    exc = state.outcome.exception() if state.outcome is not None else None
    assert isinstance(exc, TransientProviderError)  # tenacity asks wait and stop only after retry
    return exc


class RetryTransient(retry_base):
    """Retry what the error's classification says may pass (429, 5xx, timeouts, dropped
    connections); anything else, a permanent error or a bug, is raised at once."""

    def __call__(self, retry_state: RetryCallState) -> bool:
        outcome = retry_state.outcome
        return outcome is not None and isinstance(outcome.exception(), TransientProviderError)


class WaitForHintOrBackoff(wait_base):
    """The provider's retry hint when it gives one, else exponential backoff with jitter. A hint
    longer than Conclave waits is returned as it is: `StopAtAttemptsOrDeadline` refuses it."""

    def __init__(self, policy: RetryConfig, jitter: Callable[[], float]) -> None:
        self.policy = policy
        self.jitter = jitter

    def __call__(self, retry_state: RetryCallState) -> float:
        return delay(failure(retry_state), retry_state.attempt_number, self.policy, self.jitter)


class StopAtAttemptsOrDeadline(stop_base):
    """Stop when the hint is too long, the attempts are spent, or the wait tenacity has just
    computed (`upcoming_sleep`) would reach the call's deadline. One per call (the deadline is
    the call's); `reason` keeps why it stopped, which the final error explains."""

    def __init__(self, policy: RetryConfig, deadline: float, clock: Callable[[], float]) -> None:
        self.policy = policy
        self.deadline = deadline
        self.clock = clock
        self.reason = ""

    def __call__(self, retry_state: RetryCallState) -> bool:
        self.reason = stop_reason(
            failure(retry_state),
            attempt=retry_state.attempt_number,
            wait=retry_state.upcoming_sleep,
            policy=self.policy,
            remaining=self.deadline - self.clock(),
        )
        return bool(self.reason)


def explain_give_up(exc: ProviderError, reason: str, attempts: int) -> str:
    """The final error message: the provider's words plus why Conclave stopped asking."""
    if reason == RETRY_AFTER_TOO_LONG:
        hinted = exc.retry_after or 0.0  # this reason means there was one
        return (
            f"{exc.message} (the provider asks to retry after {hinted:.0f}s, longer "
            "than Conclave waits; try again then)"
        )
    if reason == DEADLINE:
        return f"{exc.message} (gave up after {attempts} attempts: the deadline left no time to retry)"
    if reason == ATTEMPTS and attempts > 1:
        return f"{exc.message} (after {attempts} attempts)"
    return exc.message
