"""Provider-neutral values that flow between layers: messages, requests, usage, completions."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import field
from typing import Any, Literal, Protocol

from conclave.core.records import record

Speaker = Literal["user", "assistant"]
ToolChoice = Literal["auto", "none"]


@record
class ToolDeclaration:
    """A tool as a model is told of it natively: its name, what it does, and the JSON Schema of
    its arguments (the tool's input schema without what Conclave injects)."""

    name: str
    description: str
    parameters: Mapping[str, Any]


@record
class ToolUse:
    """A tool call a model made natively. `arguments` is None when they could not be read under
    the strict rules of a `<tool_call>` tag (duplicate keys, NaN, size, depth): `error` says why,
    and the call is refused as a `parse_error`, never run."""

    id: str
    name: str
    arguments: Mapping[str, Any] | None
    error: str | None = None


@record
class ToolReturn:
    """What answers one ToolUse: the wrapped result text (or refusal) the model reads next."""

    call_id: str
    name: str
    content: str
    is_error: bool = False


@record
class Message:
    """One message of a conversation. An assistant message that called tools natively carries
    its calls and `echo`, the provider's own content to repeat unchanged on the next request
    (thinking blocks and signatures); the user message after it carries one ToolReturn per call."""

    role: Speaker
    content: str
    tool_uses: tuple[ToolUse, ...] = ()
    tool_returns: tuple[ToolReturn, ...] = ()
    echo: Any = None


@record
class CompletionRequest:
    """What a caller wants from one model call; adapters map it onto their wire."""

    messages: tuple[Message, ...]
    system: str | None = None
    max_tokens: int = 1024
    temperature: float | None = None
    tools: tuple[ToolDeclaration, ...] = ()  # declared natively; empty: no tools in the request
    tool_choice: ToolChoice = "auto"  # "none": the declarations stay, calls are forbidden (a final round)
    # Provider-side prompt caching. `cache_prefix`: the first characters of `system` that another
    # call of the session to this provider repeats byte for byte; adapters that mark cache
    # breakpoints end one there. 0 when no other call reads them, as a marked prefix is written to
    # the cache at more than the input price. `cache_key` names the session for the providers
    # whose API routes on a cache key.
    cache_prefix: int = 0
    cache_key: str | None = None
    # `cache_messages`: the first messages repeat what the same provider was sent, or wrote, in
    # an earlier call (a follow-up's history: docs/tools.md#follow-ups); adapters that mark cache
    # breakpoints end one after them, so the thread's next call reads them from the cache.
    cache_messages: int = 0
    # The reply must be one JSON object valid against `answer_schema`: a kind with native
    # structured output sends it on the wire (docs/providers.md#structured-output); the caller has
    # said so in the prompt either way. `answer_schema_name` names it where a wire wants a name
    # (OpenAI's `json_schema.name`). Compared by value, like `ToolDeclaration.parameters`.
    answer_schema: Mapping[str, Any] | None = None
    answer_schema_name: str = "answer"

    @classmethod
    def ask(cls, question: str, **kwargs: Any) -> CompletionRequest:
        return cls(messages=(Message("user", question),), **kwargs)


@record
class Usage:
    """Token counts in Conclave's one convention (docs/providers.md#usage-normalisation),
    whatever the provider counts.

    `input_tokens` holds every prompt token (cached reads and cache writes included);
    `output_tokens` every generated token (reasoning and thoughts included).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None
    cost_usd: float | None = None

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def with_cost(self, cost_usd: float | None) -> Usage:
        return Usage(
            self.input_tokens,
            self.output_tokens,
            self.cached_input_tokens,
            self.cache_write_tokens,
            self.reasoning_tokens,
            cost_usd,
        )

    def __add__(self, other: Usage) -> Usage:
        """Both usages together; a cost unknown on either side makes the sum unknown (never a guess)."""
        unknown = self.cost_usd is None or other.cost_usd is None
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_input_tokens=_plus(self.cached_input_tokens, other.cached_input_tokens),
            cache_write_tokens=_plus(self.cache_write_tokens, other.cache_write_tokens),
            reasoning_tokens=_plus(self.reasoning_tokens, other.reasoning_tokens),
            cost_usd=None if unknown else (self.cost_usd or 0.0) + (other.cost_usd or 0.0),
        )

    @staticmethod
    def total(usages: Iterable[Usage]) -> Usage:
        """The sum of `usages`; the sum of none is nothing spent, at a known cost of 0."""
        return sum(usages, NOTHING_SPENT)

    def to_dict(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "output_tokens": self.output_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "total_tokens": self.total_tokens,
            "cost_usd": self.cost_usd,
        }


NOTHING_SPENT = Usage(cost_usd=0.0)


def _plus(a: int | None, b: int | None) -> int | None:
    """A count reported by neither side stays unreported."""
    return None if a is None and b is None else (a or 0) + (b or 0)


DeltaKind = Literal["start", "text", "thinking", "tool_call"]


@record
class Delta:
    """A piece of an answer as it streams in: new text, new thinking, or a fragment of a tool
    call's arguments (JSON text) for the call at `index`, whose `name` comes with its first.

    `start` (no text) opens each streamed model call: a turn may make several (a tool hop, a
    re-prompt, a retry of a cut stream), and only the last one's text is the answer, so whoever
    joins the pieces begins again there."""

    kind: DeltaKind
    text: str
    index: int = 0
    name: str | None = None


# Who hears an answer's deltas as they come (the session's progress: a terminal, MCP progress, an
# HTTP stream); never the event log.
DeltaListener = Callable[[Delta], None]


@record
class Completion:
    """One normalized model answer, as every adapter returns it."""

    text: str
    finish_reason: str
    usage: Usage
    model: str
    provider: str = ""
    request_id: str | None = None
    latency_ms: float = 0.0
    ttft_ms: float | None = None  # to the first delta of a streamed answer; a plain one's whole reply
    attempts: int = 1
    warnings: tuple[str, ...] = field(default_factory=tuple)
    tool_uses: tuple[ToolUse, ...] = ()  # the model's native calls, in the order given
    echo: Any = None  # the provider's own assistant content, to repeat unchanged (see Message)

    def to_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "model": self.model,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "usage": self.usage.to_dict(),
            "request_id": self.request_id,
            "latency_ms": round(self.latency_ms, 3),
            "attempts": self.attempts,
            "warnings": list(self.warnings),
        }


class Completer(Protocol):
    """Anything that answers a CompletionRequest: a ProviderClient, or a scripted fake."""

    @property
    def name(self) -> str: ...

    def complete(
        self, request: CompletionRequest, *, deadline: float, listener: DeltaListener | None = None
    ) -> Awaitable[Completion]: ...
