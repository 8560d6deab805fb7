"""What every simulated wire shares: the request the panel reads out of a body, the turn and the
error it renders, the `SimWire` interface each kind's module implements (the panel's side of
`conclave.providers.base.Adapter`), and the parsing helpers the wires have in common.

Token counts use one convention inside the panel (`Answer`): `input_tokens` is the uncached
prompt, `cached_tokens` the cached part on top of it, `output_tokens` the visible text and
`reasoning_tokens` the hidden part on top of that. Each wire maps them onto its provider's own
semantics (docs/providers.md#usage-normalisation).

A streamed answer is the same turn cut into its wire's frames (`SimWire.stream`): text goes out
`TOKEN_CHARS` characters (one simulated token) at a time, and putting the frames back together
as the provider's SDK does gives exactly the body `SimWire.success` renders.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

import orjson

from conclave.app.sim.scenarios import FinishReason, NativeCall

LABEL = "[simulated] "  # prefixed to every error message the panel writes itself
Row = TypeVar("Row")


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """What the panel needs from a valid request, whatever its wire format."""

    model: str
    last_text: str  # the last message, any role: what rules match against
    last_user_text: str  # the last user message: `{last}` and the default answer
    input_chars: int  # every input text, system included, for the token estimate
    max_tokens: int | None
    declares_tools: bool = False
    # The schema the wire's structured-output field asked the answer to follow ({"type":
    # "object"} for a bare JSON mode); None: free text. Checked as the service checks it.
    answer_schema: Mapping[str, Any] | None = None
    stream: StreamAsk | None = None  # how the request asked for a stream; None: a plain call


@dataclass(frozen=True, slots=True)
class StreamAsk:
    """What a streamed request asked of its stream (the fields a wire has no say in keep their
    defaults)."""

    usage: bool = True  # OpenAI: `stream_options.include_usage`, the closing usage chunk
    obfuscation: bool = True  # OpenAI: `stream_options.include_obfuscation`, padding on each chunk
    sse: bool = True  # Gemini: `?alt=sse`; without it the stream is one JSON array


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    """An error to render; None fields take the provider's default for the status."""

    status: int
    message: str | None = None
    error_type: str | None = None
    param: str | None = None
    code: str | None = None
    retry_delay: str | None = None
    quota_id: str | None = None  # Gemini only: rendered as a QuotaFailure violation


class WireError(Exception):
    """The request would be rejected by the real API before reaching a model."""

    def __init__(self, spec: ErrorSpec) -> None:
        super().__init__(spec.message)
        self.spec = spec


@dataclass(frozen=True, slots=True)
class Answer:
    """A successful model turn, before it is put on a wire."""

    model: str
    text: str
    finish_reason: FinishReason
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    reasoning_tokens: int
    seq: int
    created: int
    calls: tuple[NativeCall, ...] = ()  # native tool calls, rendered after the text
    thinking: str | None = None  # shown where the service shows it, with its signature
    cache_write_tokens: int = 0  # Anthropic: prompt tokens written to the cache (on top, too)


@dataclass(frozen=True, slots=True)
class CacheRule:
    """How a wire's provider caches prompts, as the panel plays it with `caching=True`
    (conclave/app/sim/caching.py; the rules: docs/providers.md#prompt-caching)."""

    prompt_fields: tuple[str, ...]  # the body fields of the cacheable prompt, in prefix order
    breakpoints: bool = False  # cached up to the last `cache_control` mark, not by any prefix
    step_tokens: int = 1  # an automatic hit counts in whole steps of this many tokens


class SimWire(Protocol):
    """One provider's wire as the panel speaks it: requests checked as the service checks them,
    replies and errors in the service's own shapes. No I/O here; the server dispatches by kind
    through `conclave.app.sim.kinds.WIRES`."""

    kind: ClassVar[str]  # the provider `kind` this wire is the counterpart of
    base_path: ClassVar[str]  # where `SimPanel.base_url(kind)` points
    # The API path, searched for at the end of a request path (any prefix works); a `model`
    # group is the model the path names.
    api_path: ClassVar[re.Pattern[str]]
    exact_route: ClassVar[str | None]  # base_path + this, routed ahead of the catch-all
    answer_field: ClassVar[str]  # the reply field the missing_fields fault drops
    invalid_json: ClassVar[str]  # the service's words for a body that is not JSON
    cache: ClassVar[CacheRule]

    stream_error_status: ClassVar[int]  # the error the `stream_error` fault reports by default

    def parse(
        self,
        body: Mapping[str, Any],
        path_model: str | None,
        headers: Mapping[str, str],
        stream_query: Mapping[str, str] | None = None,
    ) -> ParsedRequest:
        """Validate a JSON object like the real API would: `WireError` (or `native.Rejected`)
        if it would refuse it. `stream_query` is the query string of a path that asks for a
        stream (a `stream` group in `api_path`: Gemini's `:streamGenerateContent`), else None."""
        ...

    def success(self, answer: Answer) -> dict[str, Any]: ...

    def stream(self, answer: Answer, ask: StreamAsk, answerless: bool = False) -> list[bytes]:
        """The same turn as `success(answer)`, as the frames the service streams it in: each a
        complete server-sent event (Gemini's JSON-array form: a piece of the array). With
        `answerless` (the `missing_fields` fault) the frames leave out what carries the answer,
        as `answer_field` is left out of a plain body."""
        ...

    def stream_error(self, spec: ErrorSpec, model: str, ask: StreamAsk) -> bytes:
        """The frame that reports an error inside a stream already answered with a 200, after
        which the service sends nothing more."""
        ...

    def stream_headers(self, seq: int, ask: StreamAsk) -> dict[str, str]:
        """The service's response headers for a stream: its content type, its request id."""
        ...

    def stream_unsupported(self, model: str) -> ErrorSpec:
        """How a server that cannot stream refuses a streamed request (`Scenario.rejects_stream`)."""
        ...

    def error(self, spec: ErrorSpec, model: str, request_id: str | None) -> bytes:
        """The error body as the service lays it out, byte for byte."""
        ...

    def request_id(self, seq: int) -> str | None:
        """A unique, deterministic request id per response (None: the service sends none)."""
        ...

    def headers(self, seq: int, status: int) -> dict[str, str]:
        """The service's own response headers: its content type and request id, its hints."""
        ...


# ---------------------------------------------------------------------------- parsing


def invalid(message: str, *, param: str | None = None, code: str | None = None) -> WireError:
    return WireError(ErrorSpec(400, message=LABEL + message, param=param, code=code))


def require_model(body: Mapping[str, Any], message: str) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid(message, param="model")
    return model


def require_list(
    body: Mapping[str, Any], key: str, *, missing: Callable[[], WireError], empty: Callable[[], WireError]
) -> list[dict[str, Any]]:
    """A non-empty list of objects under `key` (messages or contents).

    The errors come from factories, so a valid request builds no exception: the panel serves
    benchmarks on the same cores as what they measure.
    """
    items = body.get(key)
    if not isinstance(items, list):
        raise missing()
    if not items:
        raise empty()
    if not all(isinstance(item, dict) for item in items):
        raise invalid(f"Invalid type for '{key}': every entry must be an object.", param=key)
    return items


def text_of(content: Any) -> str:
    """The text in a message's content: a string, or text parts/blocks (tool results too)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    pieces: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("text"), str):
            pieces.append(part["text"])
        elif part.get("type") == "tool_result":
            pieces.append(text_of(part.get("content")))
        elif isinstance(part.get("functionResponse"), dict):
            pieces.append(_response_text(part["functionResponse"].get("response")))
    return "\n".join(pieces)


def _response_text(response: Any) -> str:
    """A Gemini functionResponse's text: its string values (`output` or `error`), else its JSON."""
    if not isinstance(response, dict):
        return ""
    return "\n".join(v if isinstance(v, str) else orjson.dumps(v).decode() for v in response.values())


# ---------------------------------------------------------------------------- streams

TOKEN_CHARS = 4  # one simulated token: what each text frame carries


def pieces(text: str, size: int = TOKEN_CHARS) -> list[str]:
    """`text` in consecutive pieces of `size` characters (none for an empty text)."""
    return [text[i : i + size] for i in range(0, len(text), size)]


def sse(payload: Mapping[str, Any] | bytes, event: str | None = None, end: bytes = b"\n\n") -> bytes:
    """One server-sent event: an optional `event:` line, one `data:` line (compact JSON never
    holds a raw newline), then the blank line that ends it."""
    data = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    head = b"event: " + event.encode() + b"\n" if event is not None else b""
    return head + b"data: " + data + end


def streaming_unsupported(model: str) -> ErrorSpec:
    """How an OpenAI-compatible server without streaming refuses `stream: true`."""
    return ErrorSpec(400, message=f"{LABEL}Streaming is not supported for model {model}; send stream=false.")


# ---------------------------------------------------------------------------- errors


def by_status(table: Mapping[int, Row], status: int) -> Row:
    """A wire's default row for `status`; for a status no row lists, a generic client or server
    error's."""
    return table.get(status) or table[500 if status >= 500 else 400]


def default_message(template: str, model: str) -> str:
    return LABEL + template.replace("{model}", model)
