"""A circuit breaker, one per provider and one per fetched host: closed -> open after N
consecutive failures -> half_open after a cooldown (one trial call) -> closed on success,
open again on failure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from conclave.core.errors import BreakerOpen

BreakerState = Literal["closed", "open", "half_open"]
Clock = Callable[[], float]  # monotonic seconds: `time.monotonic`, or a test's fake
Listener = Callable[[str, BreakerState, int], None]


class CircuitBreaker:
    def __init__(
        self,
        name: str,
        *,
        subject: str = "provider",
        failure_threshold: int,
        cooldown_seconds: float,
        clock: Clock,
        on_change: Listener | None = None,
    ) -> None:
        self.name = name
        self.subject = subject
        self._threshold = failure_threshold
        self._cooldown = cooldown_seconds
        self._clock = clock
        self._on_change = on_change
        self._failures = 0
        self._opened_at = 0.0
        self._state: BreakerState = "closed"
        self._trial_in_flight = False

    @property
    def state(self) -> BreakerState:
        if self._state == "open" and self._clock() - self._opened_at >= self._cooldown:
            return "half_open"
        return self._state

    def check(self) -> None:
        """Raise BreakerOpen unless a call may go through now (half-open lets one trial by)."""
        state = self.state
        if state == "closed":
            return
        if state == "half_open" and not self._trial_in_flight:
            self._set("half_open")
            self._trial_in_flight = True
            return
        remaining = max(self._cooldown - (self._clock() - self._opened_at), 0.0)
        raise breaker_open(self.subject, self.name, self._failures, remaining)

    def record_success(self) -> None:
        self._failures = 0
        self._trial_in_flight = False
        if self._state != "closed":
            self._set("closed")

    def record_failure(self) -> None:
        self._failures += 1
        was_trial = self._trial_in_flight
        self._trial_in_flight = False
        if was_trial or (self._state == "closed" and self._failures >= self._threshold):
            self._opened_at = self._clock()
            self._set("open")

    def release(self) -> None:
        """A call ended with neither verdict (e.g. a 400): let another trial through."""
        self._trial_in_flight = False

    def _set(self, state: BreakerState) -> None:
        if state != self._state:
            self._state = state
            if self._on_change is not None:
                self._on_change(self.name, state, self._failures)


def breaker_open(subject: str, name: str, failures: int, remaining: float) -> BreakerOpen:
    """The refusal of a call while `name`'s breaker is open: who, why, and when to try again."""
    return BreakerOpen(
        f"{subject} {name!r} is failing: circuit breaker open after "
        f"{failures} consecutive failures; next trial in {remaining:.1f}s",
        provider=name,
        retry_after=remaining,
    )
