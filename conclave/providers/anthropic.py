"""Anthropic Messages wire (WIRE.md §3): `system` is top-level, `max_tokens` is required,
and `input_tokens` excludes cached tokens."""

from __future__ import annotations

import re
from typing import Any, ClassVar

from conclave.config import ProviderConfig
from conclave.messages import CompletionRequest, Usage
from conclave.providers.base import (
    JSON_HEADERS,
    Endpoint,
    ErrorDetails,
    Headers,
    ParsedCompletion,
    as_int,
    bare_model,
    header_text,
)

API_VERSION = "2023-06-01"
# Claude Opus 4.7 / 4.8 / 5 reject sampling settings altogether (pydantic-ai profile).
_NO_SAMPLING = re.compile(r"^claude-opus-(4-[7-9]|[5-9])")
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    "model_context_window_exceeded": "length",
}


class AnthropicAdapter:
    kind: ClassVar[str] = "anthropic"

    def endpoint(self, entry: ProviderConfig, key: str | None) -> Endpoint:
        headers = {**JSON_HEADERS, "anthropic-version": API_VERSION, **entry.headers}
        if key:
            headers["x-api-key"] = key
        return Endpoint(f"{entry.base_url}/v1/messages", headers)

    def body(self, request: CompletionRequest, entry: ProviderConfig) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": entry.model,
            "max_tokens": request.max_tokens,
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
        }
        if request.system:
            body["system"] = request.system
        if request.temperature is not None and not _NO_SAMPLING.match(bare_model(entry.model)):
            body["temperature"] = min(request.temperature, 1.0)
        return body

    def parse(self, body: Any, headers: Headers, entry: ProviderConfig) -> ParsedCompletion:
        blocks = body["content"]
        text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        stop = body.get("stop_reason") or "end_turn"
        return ParsedCompletion(
            text=text,
            finish_reason=_FINISH.get(stop, stop),
            usage=_usage(body.get("usage") or {}),
            model=body.get("model") or entry.model,
            request_id=header_text(headers, "request-id") or body.get("id"),
        )

    def error_details(self, body: Any, headers: Headers) -> ErrorDetails:
        err = body.get("error") if isinstance(body, dict) else None
        if not isinstance(err, dict):
            err = {}
        from_body = body.get("request_id") if isinstance(body, dict) else None
        request_id = from_body or header_text(headers, "request-id")
        code = err.get("type")
        return ErrorDetails(
            message=str(err.get("message") or ""),
            code=str(code) if code else None,
            request_id=request_id,
            sticky_quota=code == "billing_error",
        )


def _usage(raw: dict[str, Any]) -> Usage:
    uncached = as_int(raw.get("input_tokens"))
    read = raw.get("cache_read_input_tokens")
    written = raw.get("cache_creation_input_tokens")
    return Usage(
        input_tokens=uncached + as_int(read) + as_int(written),
        output_tokens=as_int(raw.get("output_tokens")),
        cached_input_tokens=as_int(read) if read is not None else None,
        cache_write_tokens=as_int(written) if written is not None else None,
    )
