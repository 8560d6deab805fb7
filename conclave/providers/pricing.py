"""Cost from the configured rate card. Unknown price -> None, never a guess."""

from __future__ import annotations

from conclave.core.messages import Usage
from conclave.schema.config import PriceConfig

_PER_MTOK = 1_000_000.0


def cost_usd(usage: Usage, price: PriceConfig | None) -> float | None:
    """Cached reads and cache writes are priced apart when the card has those prices."""
    if price is None:
        return None
    cached = usage.cached_input_tokens or 0
    written = usage.cache_write_tokens or 0
    uncached = max(usage.input_tokens - cached - written, 0)
    read_rate = price.input_per_mtok if price.cached_input_per_mtok is None else price.cached_input_per_mtok
    write_rate = price.input_per_mtok if price.cache_write_per_mtok is None else price.cache_write_per_mtok
    dollars = (
        uncached * price.input_per_mtok
        + cached * read_rate
        + written * write_rate
        + usage.output_tokens * price.output_per_mtok
    ) / _PER_MTOK
    return round(dollars, 10)
