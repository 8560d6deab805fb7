"""Dry runs: which providers and roles would be called, at most how many model calls, and an
upper bound on the cost from the rate card and the token limits. Nothing is called.

Bounds, all deliberately pessimistic: a token is at least one byte of UTF-8 for the byte-level
tokenizers providers use, so prompt bytes bound prompt tokens; each message adds a fixed
allowance for template tokens; every call may spend its whole `max_tokens`; with worker tools
a turn may make `hop_budget + 2` model calls (two hops, a refused third, a final round), each
carrying the earlier outputs and results of up to `result_max_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conclave.schema.config import Config, ProviderConfig

PER_MESSAGE_TOKENS = 16
FIXED_OVERHEAD_TOKENS = 64
WRAPPER_BYTES = 512


@dataclass(frozen=True, slots=True)
class TurnShape:
    """The size of one role's (or panel member's) turn, before any model output."""

    prompt_bytes: int
    max_tokens: int
    tools_on: bool
    hop_budget: int
    result_max_bytes: int

    @property
    def max_calls(self) -> int:
        return self.hop_budget + 2 if self.tools_on else 1

    @property
    def max_input_tokens(self) -> int:
        base = self.prompt_bytes + FIXED_OVERHEAD_TOKENS + PER_MESSAGE_TOKENS
        growth = self.max_tokens + self.result_max_bytes + WRAPPER_BYTES + 2 * PER_MESSAGE_TOKENS
        return sum(base + k * growth for k in range(self.max_calls))

    @property
    def max_output_tokens(self) -> int:
        return self.max_calls * self.max_tokens


def what_drives_the_bound(shape: TurnShape) -> str:
    """The assumptions the bound rests on, and the settings that tighten it: a bound 400 times
    what a call really costs says nothing unless it says why."""
    spend = f"spends its whole max_tokens ({shape.max_tokens})"
    if not shape.tools_on:
        return f"the bound assumes every call {spend}; a lower max_tokens tightens it"
    return (
        f"the bound assumes every worker turn makes {shape.max_calls} model calls "
        f"(worker_tools.hop_budget {shape.hop_budget}, a refused call and a final round), each "
        f"carrying every earlier tool result at its full worker_tools.result_max_bytes "
        f"({shape.result_max_bytes}) and each {spend}, so it is far above what a call usually "
        "costs; a lower result_max_bytes, hop_budget or max_tokens tightens it"
    )


def price_bound(entry: ProviderConfig, input_tokens: int, output_tokens: int) -> float | None:
    if entry.price is None:
        return None
    dollars = input_tokens * entry.price.input_per_mtok + output_tokens * entry.price.output_per_mtok
    return round(dollars / 1_000_000, 8)


def cached_bound(
    entry: ProviderConfig, input_tokens: int, output_tokens: int, cached_tokens: int
) -> float | None:
    """`price_bound` with `cached_tokens` of the input read from the cache at the cached price."""
    if entry.price is None:
        return None
    cached = min(cached_tokens, input_tokens)
    rate = entry.price.cached_input_per_mtok
    read = entry.price.input_per_mtok if rate is None else rate
    dollars = (input_tokens - cached) * entry.price.input_per_mtok + cached * read
    return round((dollars + output_tokens * entry.price.output_per_mtok) / 1_000_000, 8)


def planned_call(
    config: Config,
    name: str,
    shape: TurnShape,
    *,
    repeats: int = 1,
    role: str | None = None,
    shared_bytes: int = 0,
) -> dict[str, Any]:
    """One provider's (or role's) share of the plan; `repeats` covers rounds and re-prompts;
    `shared_bytes`, the prompt every call of a deliberation starts with, which every call after
    this role's first may read from the provider's cache (docs/providers.md#prompt-caching)."""
    entry = config.providers.get(name)
    call: dict[str, Any] = {"provider": name, "model": entry.model if entry else None}
    if role is not None:
        call["role"] = role
    if entry is None:
        return {**call, "status": "skipped", "reason": "unknown_provider", **_nothing()}
    if not config.key_present(name):
        return {
            **call,
            "status": "skipped",
            "reason": f"missing_api_key: set {entry.api_key_env}",
            **_nothing(),
        }
    inputs, outputs = shape.max_input_tokens * repeats, shape.max_output_tokens * repeats
    calls = shape.max_calls * repeats
    call.update(
        status="planned",
        max_calls=calls,
        max_input_tokens=inputs,
        max_output_tokens=outputs,
        max_cost_usd=price_bound(entry, inputs, outputs),
    )
    if shared_bytes:
        call["max_cost_usd_cached"] = cached_bound(entry, inputs, outputs, shared_bytes * (calls - 1))
    if call["max_cost_usd"] is None:
        call["reason"] = "price_unknown: no price configured for this provider"
    return call


def summarize(calls: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    planned = [c for c in calls if c.get("status") == "planned"]
    unknown = [c["provider"] for c in planned if c["max_cost_usd"] is None]
    plan: dict[str, Any] = {
        "calls": calls,
        "max_calls": sum(c["max_calls"] for c in planned),
        "max_cost_usd": None if unknown else round(sum(c["max_cost_usd"] for c in planned), 8),
        **extra,
    }
    if any("max_cost_usd_cached" in c for c in planned):
        cached = [c.get("max_cost_usd_cached", c["max_cost_usd"]) for c in planned]
        plan["max_cost_usd_cached"] = None if unknown else round(sum(cached), 8)
    if unknown:
        plan["reasons"] = [f"price unknown for {name}: no upper bound on cost" for name in unknown]
    return plan


def _nothing() -> dict[str, Any]:
    return {"max_calls": 0, "max_input_tokens": 0, "max_output_tokens": 0, "max_cost_usd": 0.0}
