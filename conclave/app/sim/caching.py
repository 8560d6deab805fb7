"""Each provider's prompt caching, as the simulated panel plays it, so that usage, the demo's
totals and the benchmark show what caching does. Opt in with `SimPanel(caching=True)` (or
`python -m conclave.app.sim --caching`).

The rules, as the services document them (docs/providers.md#prompt-caching), per model and for
the life of the panel; each wire names its own in its `CacheRule` (`conclave/app/sim/kinds/`):
- automatic (OpenAI, Gemini): the longest prefix a request shares with an earlier request is
  read from the cache when it is at least 1,024 tokens, counted in whole steps (OpenAI's are
  128 tokens: `prompt_tokens_details.cached_tokens`; Gemini's `cachedContentTokenCount` has none).
- breakpoints (Anthropic): the prompt up to each `cache_control` breakpoint (tools, then the
  system blocks, then the messages) is written to the cache (`cache_creation_input_tokens`), and
  a later request reads the longest written prefix ending at most 20 blocks before one of its
  breakpoints (`cache_read_input_tokens`), when it is at least 1,024 tokens.
Tokens are the panel's own estimate (characters / 4), as for every count it reports.
"""

from __future__ import annotations

import hashlib
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


def comparable_prompt(kind: str, body: dict[str, Any]) -> str:
    """`prompt_of`, as the provider's cache compares it: on Anthropic's wire a breakpoint's mark
    is not part of the prompt, and a string content is its one text block."""
    if not WIRES[kind].cache.breakpoints:
        return prompt_of(kind, body)
    plain = {
        **body,
        "system": _bare(_as_blocks(body.get("system"))) if body.get("system") is not None else None,
        "messages": [
            {**m, "content": _bare(_as_blocks(m.get("content")))} for m in body.get("messages") or []
        ],
    }
    return prompt_of(kind, plain)


def _bare(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in block.items() if k != "cache_control"} for block in blocks]


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
        """Anthropic's rule, on its fields: each `cache_control` mark ends a prefix (the tools, the
        system blocks, then the messages' blocks) that is written to the cache; a request reads
        the longest prefix already written that ends at most 20 blocks before one of its marks,
        and writes from there to its last mark."""
        ends = _block_ends(body)
        marks = [i for i, end in enumerate(ends) if end.marked]
        if not marks:
            return Cached()
        total = _tokens(ends[marks[-1]].chars)
        if total < MIN_CACHED_TOKENS:
            return Cached()
        written = self._written.setdefault(model, set())
        looked_at = {i for mark in marks for i in range(max(0, mark - LOOKBACK_BLOCKS + 1), mark + 1)}
        hits = [i for i in looked_at if ends[i].key in written]
        read = _tokens(ends[max(hits)].chars) if hits else 0
        for mark in marks:
            if _tokens(ends[mark].chars) >= MIN_CACHED_TOKENS:
                written.add(ends[mark].key)
        return Cached(read=read, written=total - read)


LOOKBACK_BLOCKS = 20  # how far back from a breakpoint Anthropic looks for a prefix it has cached


def marked_chars(body: dict[str, Any]) -> int:
    """An Anthropic request's prompt up to its last breakpoint, in characters (0 without one)."""
    marked = [end.chars for end in _block_ends(body) if end.marked]
    return marked[-1] if marked else 0


@dataclass(frozen=True, slots=True)
class _End:
    """Where one block of an Anthropic request ends: the prefix through it (`key`: a digest of
    what the cache compares, marks left out), its length as the panel counts it, and whether the
    block carries a mark."""

    key: str
    chars: int
    marked: bool


def _block_ends(body: dict[str, Any]) -> list[_End]:
    """Each block's end, its length counted as the JSON of the prefix through it (`_array` sums
    the lengths as they come: serializing each prefix again would cost the square of the prompt)."""
    tools = json.dumps(body.get("tools"), ensure_ascii=False)
    system = body.get("system")
    digest = hashlib.sha256(tools.encode())
    ends: list[_End] = []
    items = 0
    for i, block in enumerate(_as_blocks(system)):
        digest.update(_comparable(block))
        if isinstance(system, list):
            items += len(json.dumps(system[i]))
            chars = len(tools) + _array(items, i + 1)
        else:
            chars = len(tools) + len(json.dumps(system))
        ends.append(_End(digest.copy().hexdigest(), chars, "cache_control" in block))
    before = len(tools) + (len(json.dumps(system)) if system is not None else 0)
    earlier = 0  # the JSON lengths of the messages before this one
    for j, message in enumerate(body.get("messages") or []):
        blocks, written = _as_blocks(message.get("content")), 0
        for k, block in enumerate(blocks):
            digest.update(str(message.get("role")).encode() + _comparable(block))
            written += len(json.dumps(block))
            chars = before + _array(earlier, j) + _array(written, k + 1)
            ends.append(_End(digest.copy().hexdigest(), chars, "cache_control" in block))
        earlier += len(json.dumps(message))
    return ends


def _array(items: int, count: int) -> int:
    """The length of `json.dumps` of a list of `count` items whose own JSON lengths sum to `items`:
    the brackets, and `, ` between each two."""
    return 2 + items + 2 * max(count - 1, 0)


def _as_blocks(content: Any) -> list[dict[str, Any]]:
    """A system prompt's or a message's content as blocks: a string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _comparable(block: dict[str, Any]) -> bytes:
    """A block as the cache compares it: its mark is not part of it."""
    return json.dumps({k: v for k, v in block.items() if k != "cache_control"}, sort_keys=True).encode()
