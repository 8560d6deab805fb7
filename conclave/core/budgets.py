"""Budgets as value objects: each `check_*` raises an error naming the limit and what was used.

The egress budget bounds what one session may pull from the network through `fetch`;
the worker loop's hop and cost budgets live here too.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from conclave.core.errors import ToolRefused
from conclave.core.records import record


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

    async def take_request(self) -> None:
        """Spend one request, or refuse it when either limit is reached. Async because a shared
        budget (docs/deploying.md#what-is-shared) does this in one atomic step on the state
        backend."""
        self.check_request()
        self.record_request()

    async def add_bytes(self, count: int) -> None:
        self.record_bytes(count)

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


class HopBudgetExhausted(ToolRefused):
    def __init__(self, message: str) -> None:
        super().__init__(message, reason="hop_budget_exhausted")


@dataclass(slots=True)
class HopBudget:
    """Tool calls per worker turn: every tag spends one, executed or refused."""

    limit: int
    used: int = 0

    def check_tool_call(self) -> None:
        """Spend one hop, or refuse when the turn has had its `limit` calls already."""
        self.used += 1
        if self.used > self.limit:
            raise HopBudgetExhausted(
                f"hop budget exhausted: this is tool call {self.used} and the limit is {self.limit} "
                "per turn; answer now with what you have"
            )


class CostCapExceeded(ToolRefused):
    def __init__(self, message: str) -> None:
        super().__init__(message, reason="cost_cap_exceeded")


COST_CAP_MODES = ("warn", "enforce", "off")


@record
class CostCap:
    """A resolved cap: `cap_usd` None means no cap (a cap <= 0 disables it)."""

    NONE: ClassVar[CostCap]

    cap_usd: float | None
    mode: str

    @property
    def active(self) -> bool:
        return self.cap_usd is not None and self.mode != "off"

    @classmethod
    def resolve(
        cls, cap_usd: float | None, mode: str | None, *, default_cap: float, default_mode: str
    ) -> CostCap:
        """The call's arguments over config; an unknown mode is `warn`
        (docs/worker-loop.md#cost-caps-budgetspy)."""
        cap = default_cap if cap_usd is None else cap_usd
        chosen = (mode or default_mode).lower()
        if chosen not in COST_CAP_MODES:
            chosen = "warn"
        return cls(cap_usd=cap if cap > 0 else None, mode=chosen)


CostCap.NONE = CostCap(None, "off")


@dataclass(slots=True)
class CostMeter:
    """Observed cost of one worker turn against its cap. Unknown prices are tracked, never
    counted as zero, so a cap that cannot be enforced says so."""

    cap: CostCap
    observed_usd: float = 0.0
    unpriced_calls: int = 0
    exceeded: bool = False
    blocked: bool = False

    def add(self, cost_usd: float | None) -> bool:
        """Record one model call; True the first time the cap is exceeded."""
        if cost_usd is None:
            self.unpriced_calls += 1
        else:
            self.observed_usd += cost_usd
        newly = self.cap.active and not self.exceeded and self.observed_usd > (self.cap.cap_usd or 0.0)
        self.exceeded = self.exceeded or newly
        return newly

    def check_tool_call(self) -> None:
        """Enforce mode refuses a tool call once the observed cost is over the cap."""
        if self.cap.active and self.cap.mode == "enforce" and self.exceeded:
            self.blocked = True
            raise CostCapExceeded(
                f"cost cap exceeded: observed ${self.observed_usd:.6f} is over the cap of "
                f"${self.cap.cap_usd:.6f} for this turn; answer now with what you have"
            )

    def report(self) -> CostCapReport | None:
        """The turn's `cost_cap` block (docs/worker-loop.md#cost-caps-budgetspy), or None when
        there is no active cap."""
        if self.cap.cap_usd is None or self.cap.mode == "off":
            return None
        return CostCapReport(
            cap_usd=self.cap.cap_usd,
            mode=self.cap.mode,
            observed_usd=round(self.observed_usd, 10) if self.unpriced_calls == 0 else None,
            exceeded=self.exceeded,
            blocked=self.blocked,
        )


@record
class CostCapReport:
    """What a cap saw: `observed_usd` is None when some call's price is unknown (never 0), and
    then the cap cannot be enforced on those calls."""

    cap_usd: float
    mode: str
    observed_usd: float | None
    exceeded: bool
    blocked: bool

    @property
    def enforceable(self) -> bool:
        return self.observed_usd is not None

    def to_dict(self) -> dict[str, object]:
        block: dict[str, object] = {
            "cap_usd": self.cap_usd,
            "mode": self.mode,
            "observed_usd": self.observed_usd,
            "exceeded": self.exceeded,
            "blocked": self.blocked,
            "enforceable": self.enforceable,
        }
        if not self.enforceable:
            block["note"] = "a price is unknown for some calls: the cap cannot be enforced on them"
        return block


def combined(cap: CostCap, reports: Sequence[CostCapReport]) -> CostCapReport:
    """Several turns' reports under one cap as one: costs summed (unknown if any is unknown)."""
    observed = [r.observed_usd for r in reports]
    known = [cost for cost in observed if cost is not None]
    return CostCapReport(
        cap_usd=cap.cap_usd or 0.0,
        mode=cap.mode,
        observed_usd=round(sum(known), 10) if len(known) == len(observed) else None,
        exceeded=any(r.exceeded for r in reports),
        blocked=any(r.blocked for r in reports),
    )
