"""Budgets as value objects: each `check_*` raises an error naming the limit and what was used.

The egress budget bounds what one session may pull from the network through `fetch`;
the worker loop's hop and cost budgets join it here (F3).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from conclave.errors import ToolRefused


class EgressExhausted(ToolRefused):
    def __init__(self, message: str) -> None:
        super().__init__(message, reason="egress_budget_exhausted", tool="fetch")


@dataclass(slots=True)
class EgressBudget:
    max_bytes: int
    max_requests: int
    used_bytes: int = 0
    requests: int = 0

    def check_request(self) -> None:
        """Refuse the request that would go over either limit."""
        if self.requests >= self.max_requests:
            raise EgressExhausted(
                f"egress budget exhausted: {self.requests} of {self.max_requests} requests used this session"
            )
        if self.used_bytes >= self.max_bytes:
            raise EgressExhausted(
                f"egress budget exhausted: {self.used_bytes} of {self.max_bytes} bytes used this session"
            )

    def bytes_left(self) -> int:
        return max(self.max_bytes - self.used_bytes, 0)

    def record_request(self) -> None:
        self.requests += 1

    def record_bytes(self, count: int) -> None:
        self.used_bytes += count


class EgressLedger:
    """Budgets by session id, oldest forgotten first so memory stays bounded."""

    def __init__(self, max_bytes: int, max_requests: int, *, max_sessions: int = 10_000) -> None:
        self._limits = (max_bytes, max_requests)
        self._max_sessions = max_sessions
        self._budgets: OrderedDict[str, EgressBudget] = OrderedDict()

    def for_session(self, session_id: str | None) -> EgressBudget:
        """A call without a session gets a budget of its own."""
        if session_id is None:
            return EgressBudget(*self._limits)
        budget = self._budgets.get(session_id)
        if budget is None:
            budget = self._budgets[session_id] = EgressBudget(*self._limits)
            if len(self._budgets) > self._max_sessions:
                self._budgets.popitem(last=False)
        else:
            self._budgets.move_to_end(session_id)
        return budget
