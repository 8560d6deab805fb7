"""What every wire adapter shares: the request it builds, the parse it returns, the mapping
from an HTTP status (plus the provider's own error code) to Conclave's error tree, and the
`KindSpec` each kind's module declares next to its adapter."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar, Literal, Protocol

import orjson

from conclave.core.errors import (
    MalformedResponse,
    PermanentProviderError,
    ProviderError,
    ProviderTimeout,
    RateLimited,
    TransientProviderError,
)
from conclave.core.messages import CompletionRequest, ToolUse, Usage
from conclave.core.records import record
from conclave.core.version import __version__
from conclave.net.http import ResponseHeaders
from conclave.providers.streaming import Assembler
from conclave.schema.config import ProviderConfig

Headers = ResponseHeaders  # a response's headers, as the transport hands them over (see conclave.net.http)
# Every request names its client, as the providers' own SDKs do. Set here rather than left to
# aiohttp, whose default would name aiohttp (and skipping it costs a header set per request).
JSON_HEADERS: Mapping[str, str] = {
    "content-type": "application/json",
    "user-agent": f"conclave/{__version__}",
}


@record
class Endpoint:
    """Where a provider's calls go and the headers they carry: the same for every call, so a
    client builds it once (not a URL, a header dict and an auth string per call, each alive for
    the whole round trip)."""

    url: str
    headers: Mapping[str, str]


@record
class ParsedCompletion:
    """An adapter's reading of a 200 response, before pricing and timing are added."""

    text: str
    finish_reason: str
    usage: Usage
    model: str
    request_id: str | None
    tool_uses: tuple[ToolUse, ...] = ()
    echo: Any = None  # the assistant content to repeat unchanged on the next request


@record
class ErrorDetails:
    """What an adapter reads out of a provider's error body."""

    message: str
    code: str | None = None  # the provider's own code/type, e.g. "insufficient_quota"
    retry_after: float | None = None  # a delay the body asks for (Gemini RetryInfo)
    request_id: str | None = None
    sticky_quota: bool = False  # a quota that waiting cannot refill (daily, billing)


class Adapter(Protocol):
    """Maps Conclave's neutral request to one wire format and back. No I/O here.

    A streamed call (docs/providers.md#reading-streams) goes to `stream_endpoint` with
    `stream_body`, and the kind's `assembler` rebuilds from its events the body a plain call
    would have had, which `parse` then reads as it reads any other."""

    kind: ClassVar[str]

    def endpoint(self, entry: ProviderConfig, key: str | None) -> Endpoint: ...

    def body(self, request: CompletionRequest, entry: ProviderConfig) -> dict[str, Any]: ...

    def parse(self, body: Any, headers: Headers, entry: ProviderConfig) -> ParsedCompletion: ...

    def error_details(self, body: Any, headers: Headers) -> ErrorDetails: ...

    def stream_endpoint(self, entry: ProviderConfig, key: str | None) -> Endpoint:
        """Where a streamed call goes, with `endpoint`'s headers (and `accept: text/event-stream`)."""
        ...

    def stream_body(self, request: CompletionRequest, entry: ProviderConfig) -> dict[str, Any]:
        """`body` with the wire's stream flags."""
        ...

    def assembler(self, entry: ProviderConfig) -> Assembler:
        """A new assembler for one streamed answer."""
        ...

    def refuses_stream(self, status: int, details: ErrorDetails) -> bool:
        """Whether this error answer to a streamed request says the server cannot stream (so the
        call is made plainly instead), rather than that the request failed."""
        ...


# How a kind's provider caches a repeated prompt prefix (docs/providers.md#prompt-caching):
# explicit `cache_control` breakpoints, an automatic cache a key routes to, or automatic alone.
CacheMechanics = Literal["breakpoint", "cache_key", "implicit"]


@dataclass(frozen=True)
class KindSpec:
    """A wire kind as one unit: its adapter and what the kind can do. Each kind's module declares
    one next to its adapter; `conclave.providers.kinds.KINDS` lists them, and whatever depends on
    the kind (the pool, tool modes, tracing) reads it there instead of keeping its own list."""

    adapter: Adapter
    native_tools: bool  # tools called through the wire's own fields, not the `<tool_call>` tags
    # The wire can hold an answer to a JSON Schema: a request's `answer_schema` goes out in the
    # wire's own field (docs/providers.md#structured-output).
    structured_output: bool
    # The adapter reads streamed answers: `stream_endpoint`, `stream_body` and an `assembler` that
    # rebuilds the plain body from the events (docs/providers.md#reading-streams).
    streaming: bool
    cache: CacheMechanics
    otel_name: str  # OpenTelemetry's `gen_ai.provider.name` for the kind
    # The member of a successful body that holds the answer: a 200 body with a non-null `error`
    # and without it is an in-band error (OpenRouter sends those).
    answer_field: str

    @property
    def name(self) -> str:
        """The `kind` a provider entry names: the adapter's, so the two cannot disagree."""
        return self.adapter.kind


RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
_PERMANENT_CODES = {
    400: "bad_request",
    401: "auth_error",
    402: "insufficient_quota",  # Payment Required: Anthropic's billing_error, an exhausted credit balance
    403: "permission_denied",
    404: "not_found",
    413: "request_too_large",
    422: "unprocessable",
}
_TRANSIENT_CODES = {408: "timeout", 409: "conflict", 503: "unavailable", 529: "overloaded"}
_UNCURABLE_429 = ("insufficient_quota", "request too large")


def status_error(status: int, details: ErrorDetails, headers: Headers) -> ProviderError:
    """Turn a non-2xx answer into the right branch of the error tree."""
    header_delay = retry_after_from_headers(headers)
    retry_after = header_delay if header_delay is not None else details.retry_after
    kwargs: dict[str, Any] = {"status": status, "retry_after": retry_after, "request_id": details.request_id}
    message = details.message or f"HTTP {status}"
    if status == 429 and _uncurable_rate_limit(details):
        code = "insufficient_quota" if "quota" in (details.code or "") else "quota_exhausted"
        if "request too large" in message.lower():
            code = "request_too_large"
        return PermanentProviderError(message, code=code, **kwargs)
    retryable = status in RETRYABLE_STATUSES or status >= 500
    should_retry = headers.get("x-should-retry")
    if should_retry in ("true", "false"):
        retryable = should_retry == "true"
    if not retryable:
        code = _PERMANENT_CODES.get(status, f"http_{status}")
        if details.code and "api_key" in details.code.lower():
            code = "auth_error"
        return PermanentProviderError(message, code=code, **kwargs)
    if status == 429:
        return RateLimited(message, **kwargs)
    if status == 408:
        return ProviderTimeout(message, **kwargs)
    return TransientProviderError(message, code=_TRANSIENT_CODES.get(status, "server_error"), **kwargs)


def _uncurable_rate_limit(details: ErrorDetails) -> bool:
    if details.sticky_quota:
        return True
    haystack = f"{details.code or ''} {details.message}".lower()
    return any(marker in haystack for marker in _UNCURABLE_429)


# A streamed request refused for being streamed: a 4xx whose words name streaming ("stream",
# "streaming is not supported", "stream_options"), not "upstream".
_NAMES_STREAMING = re.compile(r"\bstream", re.IGNORECASE)
# The status an in-stream error counts as when it names none.
IN_STREAM_ERROR_STATUS = 502


def names_streaming(status: int, details: ErrorDetails) -> bool:
    """The shared half of `Adapter.refuses_stream`: a client error (not one that waiting cures)
    whose message or code speaks of streaming."""
    if not 400 <= status < 500 or status in RETRYABLE_STATUSES:
        return False
    return bool(_NAMES_STREAMING.search(f"{details.code or ''} {details.message}"))


def event_stream(endpoint: Endpoint, url: str | None = None) -> Endpoint:
    """`endpoint` (at `url`, when the stream has its own) asking for server-sent events; an
    `accept` the entry's own headers set is kept."""
    headers = dict(endpoint.headers)
    if not any(name.lower() == "accept" for name in headers):
        headers["accept"] = "text/event-stream"
    return Endpoint(url or endpoint.url, headers)


def event_json(data: str) -> dict[str, Any]:
    """One event's data as a JSON object. Anything else is a malformed answer, as a plain body
    that is not a JSON object is: not retried, and counted against the provider's breaker."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        size = len(data.encode("utf-8", "surrogatepass"))
        raise MalformedResponse(
            f"HTTP 200 stream with an event that is not a JSON object ({size} bytes)", status=200
        )
    return value


def in_stream_status(code: Any) -> int:
    """The HTTP status an in-stream error's own `code` names, when it is one (an int of 400 or
    more), else `IN_STREAM_ERROR_STATUS`."""
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600:
        return code
    return IN_STREAM_ERROR_STATUS


def retry_after_from_headers(headers: Headers) -> float | None:
    """`retry-after-ms`, then `retry-after` as seconds or an HTTP date (as the SDKs do)."""
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            return float(ms) / 1000.0
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    from datetime import UTC, datetime

    return (when - datetime.now(UTC)).total_seconds()


def header_text(headers: Headers, name: str) -> str | None:
    """A header's value fit to leave the process (a request id into events and results).

    Bytes that are not UTF-8 arrive as lone surrogates (aiohttp's `surrogateescape`), which no
    JSON encoder takes: such a value is read as latin-1 instead, byte for byte.
    """
    value = headers.get(name)
    if value is None or value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogateescape").decode("latin-1")
    return value


def parse_duration(value: Any) -> float | None:
    """Google's protobuf Duration as JSON: "47s", "1.5s"."""
    if isinstance(value, str) and value.endswith("s"):
        try:
            return float(value[:-1])
        except ValueError:
            return None
    return None


def as_int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def bare_model(model: str) -> str:
    """`openai/gpt-5-mini` -> `gpt-5-mini`: routers prefix the vendor."""
    return model.rsplit("/", 1)[-1].lower()
