"""Google Gemini generateContent wire (WIRE.md §4): `systemInstruction` + `contents` with
roles user/model, the key in `x-goog-api-key` (never the URL), thoughts counted apart."""

from __future__ import annotations

from typing import Any, ClassVar
from urllib.parse import quote

from conclave.config import ProviderConfig
from conclave.messages import CompletionRequest, Usage
from conclave.providers.base import (
    JSON_HEADERS,
    Endpoint,
    ErrorDetails,
    Headers,
    ParsedCompletion,
    as_int,
    parse_duration,
)

_FINISH = {"STOP": "stop", "MAX_TOKENS": "length"}
_FILTERED = frozenset(
    {"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY", "LANGUAGE"}
)
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
_QUOTA_FAILURE = "type.googleapis.com/google.rpc.QuotaFailure"


class GeminiAdapter:
    kind: ClassVar[str] = "gemini"

    def endpoint(self, entry: ProviderConfig, key: str | None) -> Endpoint:
        headers = {**JSON_HEADERS, **entry.headers}
        if key:
            headers["x-goog-api-key"] = key
        model = quote(entry.model.removeprefix("models/"), safe="-._")
        return Endpoint(f"{entry.base_url}/v1beta/models/{model}:generateContent", headers)

    def body(self, request: CompletionRequest, entry: ProviderConfig) -> dict[str, Any]:
        contents = [
            {"role": "model" if m.role == "assistant" else "user", "parts": [{"text": m.content}]}
            for m in request.messages
        ]
        config: dict[str, Any] = {"maxOutputTokens": request.max_tokens}
        if request.temperature is not None:
            config["temperature"] = request.temperature
        body: dict[str, Any] = {"contents": contents, "generationConfig": config}
        if request.system:
            body["systemInstruction"] = {"parts": [{"text": request.system}]}
        return body

    def parse(self, body: Any, headers: Headers, entry: ProviderConfig) -> ParsedCompletion:
        candidates = body.get("candidates")
        usage = _usage(body.get("usageMetadata") or {})
        model = str(body.get("modelVersion") or entry.model).removeprefix("models/")
        request_id = body.get("responseId")
        if not candidates:
            if "promptFeedback" not in body:
                raise KeyError("candidates")
            # The prompt itself was blocked: HTTP 200 with no candidates.
            return ParsedCompletion("", "content_filter", usage, model, request_id)
        candidate = candidates[0]
        parts = (candidate.get("content") or {}).get("parts") or []
        text = "".join(p.get("text", "") for p in parts if not p.get("thought"))
        return ParsedCompletion(text, _finish(candidate.get("finishReason")), usage, model, request_id)

    def error_details(self, body: Any, headers: Headers) -> ErrorDetails:
        err = body.get("error") if isinstance(body, dict) else None
        if not isinstance(err, dict):
            err = {}
        details = [d for d in err.get("details") or [] if isinstance(d, dict)]
        retry_after = next(
            (parse_duration(d.get("retryDelay")) for d in details if d.get("@type") == _RETRY_INFO),
            None,
        )
        reason = next((d.get("reason") for d in details if d.get("reason")), None)
        return ErrorDetails(
            message=str(err.get("message") or ""),
            code=str(reason or err.get("status") or "") or None,
            retry_after=retry_after,
            sticky_quota=_daily_quota(details),
        )


def _finish(reason: str | None) -> str:
    if reason is None:
        return "stop"
    if reason in _FILTERED:
        return "content_filter"
    return _FINISH.get(reason, reason.lower())


def _daily_quota(details: list[dict[str, Any]]) -> bool:
    """A per-day quota does not refill in seconds: retrying cannot help."""
    for detail in details:
        if detail.get("@type") == _QUOTA_FAILURE:
            for violation in detail.get("violations") or []:
                if "PerDay" in str(violation.get("quotaId", "")):
                    return True
    return False


def _usage(raw: dict[str, Any]) -> Usage:
    cached = raw.get("cachedContentTokenCount")
    thoughts = raw.get("thoughtsTokenCount")
    prompt = as_int(raw.get("promptTokenCount")) + as_int(raw.get("toolUsePromptTokenCount"))
    return Usage(
        input_tokens=prompt,
        output_tokens=as_int(raw.get("candidatesTokenCount")) + as_int(thoughts),
        cached_input_tokens=as_int(cached) if cached is not None else None,
        reasoning_tokens=as_int(thoughts) if thoughts is not None else None,
    )
