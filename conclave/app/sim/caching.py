"""Each provider's prompt caching, as the simulated panel plays it, so that usage, the demo's
totals and the benchmark show what caching does. Opt in with `SimPanel(caching=True)` (or
`python -m conclave.app.sim --caching`).

The rules, as the services document them (docs/providers.md#prompt-caching), per model and for
the life of the panel; each wire names its own in its `CacheRule` (`conclave/app/sim/kinds/`):
- automatic (OpenAI, Gemini): the longest prefix a request shares with an earlier request is
  read from the cache when it is at least 1,024 tokens, counted in whole steps (OpenAI's are
  128 tokens: `prompt_tokens_details.cached_tokens`; Gemini's `cachedContentTokenCount` has none).
- breakpoints (Anthropic): the prompt up to the last `cache_control` breakpoint (tools, then
  the system blocks) is written to the cache the first time (`cache_creation_input_tokens`) and
  read from it after (`cache_read_input_tokens`), when it is at least 1,024 tokens.
Tokens are the panel's own estimate (characters / 4), as for every count it reports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from conclave.app.sim.kinds import WIRES

MIN_CACHED_TOKENS = 1024


@dataclass(frozen=True, slots=True)
class Cached:
    read: int = 0  # prompt tokens read from the cache
    written: int = 0  # prompt tokens written to it (Anthropic)


def prompt_of(kind: str, body: dict[str, Any]) -> str:
    """A request's cacheable prompt in the provider's own prefix order: tools, system, messages."""
    parts = [body.get(name) for name in WIRES[kind].cache.prompt_fields]
    return "".join(json.dumps(p, ensure_ascii=False) for p in parts if p is not None)


def common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _tokens(chars: int) -> int:
    return chars // 4


class PromptCache:
    """What each model has seen, and what it would read from its cache for a new request."""

    def __init__(self) -> None:
        self._seen: dict[str, list[str]] = {}
        self._written: dict[str, set[str]] = {}

    def apply(self, kind: str, model: str, body: dict[str, Any]) -> Cached:
        rule = WIRES[kind].cache
        if rule.breakpoints:
            return self._breakpoint(model, body)
        prompt = prompt_of(kind, body)
        earlier = self._seen.setdefault(model, [])
        hit = _tokens(max((common_prefix(prompt, old) for old in earlier), default=0))
        earlier.append(prompt)
        if hit < MIN_CACHED_TOKENS:
            return Cached()
        return Cached(read=hit - hit % rule.step_tokens)

    def _breakpoint(self, model: str, body: dict[str, Any]) -> Cached:
        """Anthropic's rule, on its fields: the tools and `system` blocks up to the last mark."""
        system = body.get("system")
        if not isinstance(system, list):
            return Cached()
        marked = [i for i, block in enumerate(system) if isinstance(block, dict) and "cache_control" in block]
        if not marked:
            return Cached()
        prefix = json.dumps(body.get("tools"), ensure_ascii=False) + json.dumps(system[: marked[-1] + 1])
        tokens = _tokens(len(prefix))
        if tokens < MIN_CACHED_TOKENS:
            return Cached()
        written = self._written.setdefault(model, set())
        if prefix in written:
            return Cached(read=tokens)
        written.add(prefix)
        return Cached(written=tokens)
