"""State that outlives one call (docs/deploying.md): provider breakers, the provider concurrency
limit, per-session egress budgets, the task store's records and the session ids in flight.

`open_state(config, telemetry)` opens the backend the config names. `memory` (the default) is
one process's own state, as Conclave always had. `redis` shares it with every replica that
names the same Redis and namespace, and falls back to its own memory while Redis is away."""

from conclave.state.base import Breaker, SessionClaim, Slots, StateBackend, TaskBoard
from conclave.state.open import open_state, redis_url_shown

__all__ = ["Breaker", "SessionClaim", "Slots", "StateBackend", "TaskBoard", "open_state", "redis_url_shown"]
