"""One process's own state: the default backend, and what the Redis backend falls back on."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import anyio

from conclave.core.breaker import BreakerState, CircuitBreaker, Clock
from conclave.core.budgets import EgressBudget, EgressLedger
from conclave.schema.config import Config
from conclave.state.base import BreakerListener


class LocalBreaker:
    """A `CircuitBreaker` behind the backend's async face."""

    def __init__(self, inner: CircuitBreaker) -> None:
        self.inner = inner
        self.name = inner.name

    @property
    def state(self) -> BreakerState:
        return self.inner.state

    async def current(self) -> BreakerState:
        return self.inner.state

    async def check(self) -> None:
        self.inner.check()

    async def record_success(self) -> None:
        self.inner.record_success()

    async def record_failure(self) -> None:
        self.inner.record_failure()

    async def release(self) -> None:
        self.inner.release()


class LocalSlots:
    """The concurrency limit as a semaphore. Not a CapacityLimiter: nothing here needs to know
    which task holds a slot. `fast_acquire`: a free slot is taken without yielding, as the
    exchange after it yields anyway."""

    def __init__(self, limit: int) -> None:
        self._semaphore = anyio.Semaphore(limit, max_value=limit, fast_acquire=True)

    async def acquire(self, seconds: float) -> None:
        try:
            self._semaphore.acquire_nowait()
        except anyio.WouldBlock:
            with anyio.fail_after(seconds):
                await self._semaphore.acquire()

    def release(self) -> None:
        self._semaphore.release()


class LocalTaskBoard:
    """The task store's own dict is the whole truth in one process: nothing to share."""

    async def publish(self, task_id: str, wire: dict[str, Any], ttl_ms: int) -> None:
        return None

    async def fetch(self, task_id: str) -> dict[str, Any] | None:
        return None

    async def request_cancel(self, task_id: str) -> dict[str, Any] | None:
        return None

    async def cancelled(self, task_ids: Iterable[str]) -> set[str]:
        return set()


class LocalSessions:
    """Session ids that a call in this process runs with now."""

    def __init__(self) -> None:
        self._running: set[str] = set()

    async def claim(self, session_id: str) -> bool:
        if session_id in self._running:
            return False
        self._running.add(session_id)
        return True

    async def release(self, session_id: str) -> None:
        self._running.discard(session_id)


class MemoryState:
    name = "memory"

    def __init__(self, config: Config, *, clock: Clock) -> None:
        self._config = config
        self._clock = clock
        self.slots = LocalSlots(config.limits.max_concurrency)
        self.tasks = LocalTaskBoard()
        self.sessions = LocalSessions()
        policy = config.fetch
        self._egress = EgressLedger(policy.session_max_bytes, policy.session_max_requests)

    def local_breaker(self, name: str, on_change: BreakerListener | None) -> CircuitBreaker:
        breakers = self._config.breakers
        return CircuitBreaker(
            name,
            failure_threshold=breakers.failure_threshold,
            cooldown_seconds=breakers.cooldown_seconds,
            clock=self._clock,
            on_change=on_change,
        )

    def breaker(self, name: str, on_change: BreakerListener) -> LocalBreaker:
        return LocalBreaker(self.local_breaker(name, on_change))

    def egress(self, session_id: str | None) -> EgressBudget:
        return self._egress.for_session(session_id)

    async def health(self) -> tuple[bool, str]:
        return True, "memory (this process only; replicas do not share it)"
