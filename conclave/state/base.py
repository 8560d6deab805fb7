"""What a state backend offers, as protocols: each consumer (the provider pool, the fetch tool,
the task store, the session scaffold) sees only the part it uses."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from conclave.core.breaker import BreakerState
from conclave.core.budgets import EgressBudget

# Told of a breaker's change: provider name, new state, consecutive failures.
BreakerListener = Callable[[str, BreakerState, int], None]


class Breaker(Protocol):
    """A provider's circuit breaker (closed -> open -> half_open -> closed), wherever it lives."""

    name: str

    @property
    def state(self) -> BreakerState:
        """As this replica last knew it: no I/O."""

    async def current(self) -> BreakerState:
        """As the backend has it, within a second: what `list_providers` reports. A replica
        whose copy may be older than that reads the shared state first."""

    async def check(self) -> None:
        """Raise BreakerOpen unless a call may go through now."""

    async def record_success(self) -> None: ...

    async def record_failure(self) -> None: ...

    async def release(self) -> None:
        """A call ended with neither verdict: a half-open trial may be taken by another."""


class Slots(Protocol):
    """The provider concurrency limit: `limits.max_concurrency` calls in flight."""

    async def acquire(self, seconds: float) -> None:
        """Take a slot, waiting at most `seconds` (TimeoutError)."""

    def release(self) -> None: ...


class TaskBoard(Protocol):
    """Where task records are seen from other replicas (the task store of
    docs/server.md#long-deliberations, shared)."""

    async def publish(self, task_id: str, wire: dict[str, Any], ttl_ms: int) -> None:
        """Write the task as `tasks/get` shows it; a finished task is never overwritten."""

    async def fetch(self, task_id: str) -> dict[str, Any] | None: ...

    async def request_cancel(self, task_id: str) -> dict[str, Any] | None:
        """Mark a task cancelled for the replica running it; the task as it now stands, or None."""

    async def cancelled(self, task_ids: Iterable[str]) -> set[str]:
        """Which of these tasks (run here) another replica asked to cancel."""


class SessionClaim(Protocol):
    async def claim(self, session_id: str) -> bool:
        """True when no call anywhere runs with this session id, and it is now this one's."""

    async def release(self, session_id: str) -> None: ...


class StateBackend(Protocol):
    @property
    def name(self) -> str:
        """ "memory" or "redis"."""

    @property
    def slots(self) -> Slots: ...

    @property
    def tasks(self) -> TaskBoard: ...

    @property
    def sessions(self) -> SessionClaim: ...

    def breaker(self, name: str, on_change: BreakerListener) -> Breaker: ...

    def egress(self, session_id: str | None) -> EgressBudget: ...

    async def health(self) -> tuple[bool, str]:
        """Whether the backend works, and one line saying what it is: for `conclave doctor`."""
