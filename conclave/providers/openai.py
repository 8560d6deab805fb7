"""OpenAI Chat Completions wire, also spoken by xAI, Mistral, Groq, DeepSeek, OpenRouter,
Ollama, vLLM and llama.cpp. Only mapping lives here; see WIRE.md §2 for the facts."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, ClassVar

import httpx

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

# Models that always reason and so reject sampling parameters and `max_tokens`
# (pydantic-ai's OpenAI profile, verified against the live API 2026-07).
_REASONING = re.compile(r"^(o\d|gpt-5($|-mini|-nano|-\d{4}|-pro)|gpt-5\.[5-9]|gpt-5\.\d+-chat)")
_SYSTEM_AS_USER = re.compile(r"^o1-mini")


def is_reasoning_model(entry: ProviderConfig) -> bool:
    if entry.reasoning is not None:
        return entry.reasoning
    return _always_reasons(entry.model)


@lru_cache(maxsize=256)
def _always_reasons(model: str) -> bool:
    return bool(_REASONING.match(bare_model(model)))


def max_tokens_field(entry: ProviderConfig) -> str:
    if entry.max_tokens_field:
        return entry.max_tokens_field
    # The official API deprecates max_tokens; many compatible servers know only it.
    official = _host(entry.base_url) == "api.openai.com"
    return "max_completion_tokens" if official or is_reasoning_model(entry) else "max_tokens"


@lru_cache(maxsize=256)
def _host(base_url: str) -> str:
    return httpx.URL(base_url).host


class OpenAIAdapter:
    kind: ClassVar[str] = "openai"

    def endpoint(self, entry: ProviderConfig, key: str | None) -> Endpoint:
        headers = {**JSON_HEADERS, **entry.headers}
        if key:
            headers["authorization"] = f"Bearer {key}"
        return Endpoint(f"{entry.base_url}/chat/completions", headers)

    def body(self, request: CompletionRequest, entry: ProviderConfig) -> dict[str, Any]:
        reasoning = is_reasoning_model(entry)
        messages: list[dict[str, str]] = []
        if request.system:
            role = "user" if _SYSTEM_AS_USER.match(bare_model(entry.model)) else "system"
            messages.append({"role": role, "content": request.system})
        messages += [{"role": m.role, "content": m.content} for m in request.messages]
        body: dict[str, Any] = {
            "model": entry.model,
            "messages": messages,
            max_tokens_field(entry): request.max_tokens,
        }
        if request.temperature is not None and not reasoning:
            body["temperature"] = request.temperature
        return body

    def parse(self, body: Any, headers: Headers, entry: ProviderConfig) -> ParsedCompletion:
        choice = body["choices"][0]
        return ParsedCompletion(
            text=_content_text(choice["message"].get("content")),
            finish_reason=choice.get("finish_reason") or "stop",
            usage=_usage(body.get("usage") or {}),
            model=body.get("model") or entry.model,
            request_id=header_text(headers, "x-request-id")
            or header_text(headers, "mistral-correlation-id")
            or (body.get("x_groq") or {}).get("id")
            or body.get("id"),
        )

    def error_details(self, body: Any, headers: Headers) -> ErrorDetails:
        # OpenAI nests under "error"; Mistral and old vLLM put it at the top level.
        err = body.get("error", body) if isinstance(body, dict) else {}
        if not isinstance(err, dict):
            err = {"message": str(err)}
        message = str(err.get("message") or "")
        raw = (err.get("metadata") or {}).get("raw") if isinstance(err.get("metadata"), dict) else None
        if raw:  # OpenRouter: the upstream provider's own words
            message = f"{message}: {raw}"
        code = err.get("code") if isinstance(err.get("code"), str) else err.get("type")
        return ErrorDetails(
            message=message, code=str(code) if code else None, request_id=header_text(headers, "x-request-id")
        )


def _content_text(content: Any) -> str:
    """A string, or (magistral) a list of thinking/text blocks of which only text counts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def _usage(raw: dict[str, Any]) -> Usage:
    prompt = as_int(raw.get("prompt_tokens"))
    completion = as_int(raw.get("completion_tokens"))
    total = as_int(raw.get("total_tokens"))
    prompt_details = raw.get("prompt_tokens_details") or {}
    completion_details = raw.get("completion_tokens_details") or {}
    cached = prompt_details.get("cached_tokens")
    if cached is None:
        cached = raw.get("prompt_cache_hit_tokens")  # DeepSeek
    reasoning = completion_details.get("reasoning_tokens")
    output = completion
    # xAI counts reasoning apart from completion_tokens; its total gives it away.
    if reasoning and total == prompt + completion + reasoning:
        output += as_int(reasoning)
    return Usage(
        input_tokens=prompt,
        output_tokens=output,
        cached_input_tokens=as_int(cached) if cached is not None else None,
        cache_write_tokens=prompt_details.get("cache_write_tokens"),
        reasoning_tokens=as_int(reasoning) if reasoning is not None else None,
    )
