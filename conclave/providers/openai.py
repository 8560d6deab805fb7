"""OpenAI Chat Completions wire, also spoken by xAI, Mistral, Groq, DeepSeek, OpenRouter,
Ollama, vLLM and llama.cpp. Only mapping lives here, and what the kind can do (`KIND`); the
facts are in docs/providers.md#openai-compatible-wire."""

from __future__ import annotations

import copy
import re
from functools import lru_cache
from typing import Any, ClassVar

import httpx
import orjson

from conclave.core.messages import CompletionRequest, Message, ToolDeclaration, ToolUse, Usage
from conclave.providers.base import (
    JSON_HEADERS,
    Endpoint,
    ErrorDetails,
    Headers,
    KindSpec,
    ParsedCompletion,
    as_int,
    bare_model,
    header_text,
)
from conclave.schema.answer_schema import strict_compatible
from conclave.schema.config import ProviderConfig
from conclave.schema.strictjson import tool_arguments

# Models that always reason and so reject sampling parameters and `max_tokens`
# (pydantic-ai's OpenAI profile, verified against the live API 2026-07).
_REASONING = re.compile(r"^(o\d|gpt-5($|-mini|-nano|-\d{4}|-pro)|gpt-5\.[5-9]|gpt-5\.\d+-chat)")
_SYSTEM_AS_USER = re.compile(r"^o1-mini")
# What of a response's assistant message goes back on the next request. Not the whole message:
# strict servers reject fields they send but do not take (Groq 400s on its own `reasoning`,
# karthink/gptel#774), and `refusal`/`annotations` are response-only. `reasoning_content` is
# DeepSeek's thinking, which it requires back within a tool-call turn (400 "must be passed
# back", api-docs.deepseek.com/guides/thinking_mode#tool-calls); `reasoning_details` is
# OpenRouter's, which carries upstream thought signatures.
_ECHOED = ("role", "content", "tool_calls", "reasoning_content", "reasoning_details")
# What `response_format.json_schema.name` may hold; anything else is a 400.
_NOT_IN_NAME = re.compile(r"[^a-zA-Z0-9_-]")


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
        messages: list[dict[str, Any]] = []
        if request.system:
            role = "user" if _SYSTEM_AS_USER.match(bare_model(entry.model)) else "system"
            messages.append({"role": role, "content": request.system})
        for m in request.messages:
            messages += _wire_messages(m)
        body: dict[str, Any] = {
            "model": entry.model,
            "messages": messages,
            max_tokens_field(entry): request.max_tokens,
        }
        if request.temperature is not None and not reasoning:
            body["temperature"] = request.temperature
        if request.tools:
            body["tools"] = [_declaration(t) for t in request.tools]
            if request.tool_choice == "none":  # "auto" is the default whenever tools are declared
                body["tool_choice"] = "none"
        if request.cache_key and entry.prompt_cache_key:
            # Routes a session's calls to the same prompt cache. Sent only where the provider
            # entry says its API takes the field: compatible servers may refuse one they do not
            # know, and a host name says nothing about what a proxy in front of it accepts.
            body["prompt_cache_key"] = request.cache_key
        if request.answer_schema is not None and KIND.structured_output and entry.structured_output:
            body["response_format"] = _response_format(request.answer_schema, request.answer_schema_name)
        return body

    def parse(self, body: Any, headers: Headers, entry: ProviderConfig) -> ParsedCompletion:
        choice = body["choices"][0]
        message = choice["message"]
        calls = message.get("tool_calls") or []
        text = _content_text(message.get("content"))
        finish = choice.get("finish_reason") or "stop"
        if not text and isinstance(message.get("refusal"), str) and message["refusal"]:
            finish = "content_filter"  # a structured-output refusal: no content, the reason apart
        return ParsedCompletion(
            text=text,
            finish_reason=finish,
            usage=_usage(body.get("usage") or {}),
            model=body.get("model") or entry.model,
            request_id=header_text(headers, "x-request-id")
            or header_text(headers, "mistral-correlation-id")
            or (body.get("x_groq") or {}).get("id")
            or body.get("id"),
            tool_uses=tuple(_tool_use(call, index) for index, call in enumerate(calls)),
            echo={k: copy.deepcopy(message[k]) for k in _ECHOED if k in message} if calls else None,
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


KIND = KindSpec(
    OpenAIAdapter(),
    native_tools=True,
    structured_output=True,
    streaming=False,
    cache="cache_key",  # automatic, with prompt_cache_key to route a session to one cache
    otel_name="openai",
    answer_field="choices",
)


def _response_format(schema: Any, name: str) -> dict[str, Any]:
    """Structured output (docs/providers.md#structured-output): strict, so the server holds the
    reply to the schema, where strict mode takes the schema; otherwise as a guide the reply is
    still checked against."""
    json_schema = {
        "name": _NOT_IN_NAME.sub("_", name)[:64] or "answer",
        "schema": schema,
        "strict": strict_compatible(schema),
    }
    return {"type": "json_schema", "json_schema": json_schema}


def _declaration(tool: ToolDeclaration) -> dict[str, Any]:
    function = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
    return {"type": "function", "function": function}


def _wire_messages(m: Message) -> list[dict[str, Any]]:
    """One neutral message as chat messages: a plain turn, an assistant turn with its calls,
    or one `tool` message per return (and the user's text after them, if any)."""
    if m.role == "assistant" and m.echo is not None:
        return [m.echo]  # the provider's own message, ids and reasoning fields as it sent them
    if m.role == "assistant" and m.tool_uses:
        return [_assistant_turn(m)]
    if not m.tool_returns:
        return [{"role": m.role, "content": m.content}]
    results = [{"role": "tool", "tool_call_id": r.call_id, "content": r.content} for r in m.tool_returns]
    # A refusal has no flag on this wire: is_error is already said by the content's own words.
    return results + ([{"role": "user", "content": m.content}] if m.content else [])


def _assistant_turn(m: Message) -> dict[str, Any]:
    """A call turn rebuilt from neutral values, when no echo was kept (arguments that could not
    be read go back as {}, as their raw text is gone)."""
    calls = [
        {
            "id": use.id,
            "type": "function",
            "function": {"name": use.name, "arguments": orjson.dumps(dict(use.arguments or {})).decode()},
        }
        for use in m.tool_uses
    ]
    # OpenAI itself answers a calls-only turn with content null.
    return {"role": "assistant", "content": m.content or None, "tool_calls": calls}


def _tool_use(call: Any, index: int) -> ToolUse:
    """One of `message.tool_calls`; its arguments (a JSON string here) under the strict rules.
    A server that gives no id (some local ones) gets `call-<index>`, and its result is sent
    back under that id, in the same order as the calls."""
    function = call.get("function") or {}
    arguments, error = tool_arguments(function.get("arguments"))
    return ToolUse(
        id=call.get("id") or f"call-{index}",
        name=str(function.get("name") or ""),
        arguments=arguments,
        error=error,
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
