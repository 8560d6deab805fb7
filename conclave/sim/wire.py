"""The three provider wire formats, as pure functions: parse a request, render a reply.

Shapes follow /work/shared/providers/WIRE.md §2-4: OpenAI Chat Completions, Anthropic
Messages and Gemini generateContent, usage fields and error envelopes included, down
to the body layout each provider really uses (OpenAI errors 4-space pretty with a
trailing newline, Anthropic errors compact, Google errors 2-space pretty). No I/O here.
Native tool calls (their rendering and the checks of a tool history) live in `native`.

Token counts use one convention inside the panel (`Answer`): `input_tokens` is the
uncached prompt, `cached_tokens` the cached part on top of it, `output_tokens` the
visible text and `reasoning_tokens` the hidden part on top of that. Each renderer maps
them onto its provider's own semantics.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from conclave.sim import native
from conclave.sim.recording import Kind
from conclave.sim.scenarios import FinishReason, NativeCall

LABEL = "[simulated] "  # prefixed to every error message the panel writes itself

_GEMINI_PATH = re.compile(r"/v1(?:beta|alpha)?/models/([^/]+):generateContent$")
_OPENAI_REASONING = re.compile(r"o\d|gpt-5($|-mini|-nano|-\d{4})")


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """What the panel needs from a valid request, whatever its wire format."""

    model: str
    last_text: str  # the last message, any role: what rules match against
    last_user_text: str  # the last user message: `{last}` and the default answer
    input_chars: int  # every input text, system included, for the token estimate
    max_tokens: int | None
    declares_tools: bool = False


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


def route(path: str) -> tuple[Kind, str | None] | None:
    """Which wire a path speaks (by suffix, so any prefix works), and Gemini's path model."""
    if path.endswith("/chat/completions"):
        return "openai", None
    if path.endswith("/v1/messages"):
        return "anthropic", None
    match = _GEMINI_PATH.search(path)
    if match:
        return "gemini", match.group(1)
    return None


def estimate_input_tokens(chars: int) -> int:
    return max(1, chars // 4)


def estimate_output_tokens(text: str) -> int:
    # Nothing emitted costs nothing: Gemini then omits candidatesTokenCount.
    return max(1, len(text) // 4) if text else 0


def invalid_json(kind: Kind) -> ErrorSpec:
    message = {
        "openai": "We could not parse the JSON body of your request. (HINT: This likely means "
        "you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, "
        "but what was sent was not valid JSON.)",
        "anthropic": "There was an error parsing the body of your request: invalid JSON.",
        "gemini": "Invalid JSON payload received. Unexpected token.",
    }[kind]
    return ErrorSpec(400, message=LABEL + message)


def parse_request(
    kind: Kind, body: Any, *, path_model: str | None, anthropic_version: str | None
) -> ParsedRequest:
    """Validate a decoded body like the real API would; `WireError` if it would refuse it."""
    if not isinstance(body, dict):
        raise _invalid("The request body must be a JSON object.")
    try:
        if kind == "openai":
            return _parse_openai(body)
        if kind == "anthropic":
            return _parse_anthropic(body, anthropic_version)
        return _parse_gemini(body, path_model or "")
    except native.Rejected as exc:
        raise _invalid(str(exc), param=exc.param) from None


def tools_unsupported(model: str) -> ErrorSpec:
    """How a server without tool support refuses declarations (Ollama's words)."""
    return ErrorSpec(400, message=f"{LABEL}{model} does not support tools")


# ---------------------------------------------------------------------------- parsing


def _invalid(message: str, *, param: str | None = None, code: str | None = None) -> WireError:
    return WireError(ErrorSpec(400, message=LABEL + message, param=param, code=code))


def _require_model(body: Mapping[str, Any], message: str) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _invalid(message, param="model")
    return model


def _require_list(
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
        raise _invalid(f"Invalid type for '{key}': every entry must be an object.", param=key)
    return items


def _missing(key: str) -> WireError:
    return _invalid(f"Missing required parameter: '{key}'.", param=key, code="missing_required_parameter")


def _openai_empty_messages() -> WireError:
    return _invalid(
        "Invalid 'messages': empty array. Expected an array with minimum length 1, "
        "but got an empty array instead.",
        param="messages",
        code="empty_array",
    )


def _is_openai_reasoning_model(model: str) -> bool:
    return _OPENAI_REASONING.match(model.rsplit("/", 1)[-1]) is not None


def _parse_openai(body: Mapping[str, Any]) -> ParsedRequest:
    model = _require_model(body, "you must provide a model parameter")
    messages = _require_list(
        body, "messages", missing=lambda: _missing("messages"), empty=_openai_empty_messages
    )
    if body.get("stream"):
        raise _invalid("Streaming is not simulated; send stream=false.", param="stream")
    if _is_openai_reasoning_model(model):
        _check_reasoning_params(body)
    native.check_openai(body, messages)
    texts = [_text_of(m.get("content")) for m in messages]
    # Tool messages are the user's side of the turn, as tool results are on the other wires.
    user_texts = [t for m, t in zip(messages, texts, strict=True) if m.get("role") in ("user", "tool")]
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return ParsedRequest(
        model=model,
        last_text=_openai_last_text(messages, texts),
        last_user_text=user_texts[-1] if user_texts else "",
        input_chars=sum(map(len, texts)),
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        declares_tools=native.declares_tools(body),
    )


def _openai_last_text(messages: list[dict[str, Any]], texts: list[str]) -> str:
    """The last message, where a run of tool messages counts as one: the other wires put
    parallel results in one turn, and a rule should see them all there too."""
    start = len(messages) - 1
    while start > 0 and messages[start].get("role") == "tool" and messages[start - 1].get("role") == "tool":
        start -= 1
    return "\n".join(texts[start:])


def _check_reasoning_params(body: Mapping[str, Any]) -> None:
    """o-series and gpt-5 refuse the legacy token cap and sampling settings."""
    if body.get("max_tokens") is not None:
        raise _invalid(
            "Unsupported parameter: 'max_tokens' is not supported with this model. "
            "Use 'max_completion_tokens' instead.",
            param="max_tokens",
            code="unsupported_parameter",
        )
    temperature = body.get("temperature")
    if temperature is not None and temperature != 1:
        raise _invalid(
            f"Unsupported value: 'temperature' does not support {temperature} with this model. "
            "Only the default (1) value is supported.",
            param="temperature",
            code="unsupported_value",
        )


def _parse_anthropic(body: Mapping[str, Any], version: str | None) -> ParsedRequest:
    if not version:
        raise _invalid("anthropic-version: header is required")
    model = _require_model(body, "model: Field required")
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise _invalid(
            "max_tokens: Field required"
            if max_tokens is None
            else "max_tokens: Input should be a valid integer"
        )
    messages = _require_list(
        body,
        "messages",
        missing=lambda: _invalid("messages: Field required"),
        empty=lambda: _invalid("messages: at least one message is required"),
    )
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise _invalid(
                f'messages.{i}: Unexpected role "{role}". The Messages API accepts a top-level '
                f'`system` parameter, not "{role}" as an input message role.'
            )
    if body.get("stream"):
        raise _invalid("Streaming is not simulated; send stream=false.")
    native.check_anthropic(body, messages)
    texts = [_text_of(m.get("content")) for m in messages]
    user_texts = [t for m, t in zip(messages, texts, strict=True) if m["role"] == "user"]
    return ParsedRequest(
        model=model,
        last_text=texts[-1],
        last_user_text=user_texts[-1] if user_texts else "",
        input_chars=len(_text_of(body.get("system"))) + sum(map(len, texts)),
        max_tokens=max_tokens,
        declares_tools=native.declares_tools(body),
    )


def _parse_gemini(body: Mapping[str, Any], model: str) -> ParsedRequest:
    def not_specified() -> WireError:
        return _invalid("* GenerateContentRequest.contents: contents is not specified")

    contents = _require_list(body, "contents", missing=not_specified, empty=not_specified)
    for content in contents:
        if content.get("role", "user") not in ("user", "model"):
            raise _invalid("Please use a valid role: user, model.")
    native.check_gemini(body, contents)
    texts = [_text_of(c.get("parts")) for c in contents]
    user_texts = [t for c, t in zip(contents, texts, strict=True) if c.get("role", "user") == "user"]
    system = body.get("systemInstruction")
    system_text = _text_of(system.get("parts")) if isinstance(system, dict) else ""
    config = body.get("generationConfig")
    max_tokens = config.get("maxOutputTokens") if isinstance(config, dict) else None
    return ParsedRequest(
        model=model,
        last_text=texts[-1],
        last_user_text=user_texts[-1] if user_texts else "",
        input_chars=len(system_text) + sum(map(len, texts)),
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        declares_tools=native.declares_tools(body),
    )


def _text_of(content: Any) -> str:
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
            pieces.append(_text_of(part.get("content")))
        elif isinstance(part.get("functionResponse"), dict):
            pieces.append(_response_text(part["functionResponse"].get("response")))
    return "\n".join(pieces)


def _response_text(response: Any) -> str:
    """A Gemini functionResponse's text: its string values (`output` or `error`), else its JSON."""
    if not isinstance(response, dict):
        return ""
    return "\n".join(v if isinstance(v, str) else orjson.dumps(v).decode() for v in response.values())


# ---------------------------------------------------------------------------- success


def success_body(kind: Kind, answer: Answer) -> dict[str, Any]:
    if kind == "openai":
        return _openai_success(answer)
    if kind == "anthropic":
        return _anthropic_success(answer)
    return _gemini_success(answer)


def without_answer(kind: Kind, body: dict[str, Any]) -> dict[str, Any]:
    """The same envelope minus the part that carries the answer (the missing_fields fault)."""
    key = {"openai": "choices", "anthropic": "content", "gemini": "candidates"}[kind]
    return {k: v for k, v in body.items() if k != key}


def encode(body: Mapping[str, Any]) -> bytes:
    return orjson.dumps(body)


def _openai_success(a: Answer) -> dict[str, Any]:
    prompt = a.input_tokens + a.cached_tokens
    completion = a.output_tokens + a.reasoning_tokens
    message: dict[str, Any] = {"role": "assistant", "content": a.text, "refusal": None, "annotations": []}
    finish_reason: str = a.finish_reason
    if a.calls:
        # OpenAI says null, not "", for a turn that only calls.
        message["content"] = a.text or None
        message["tool_calls"] = native.openai_calls(a.calls, a.seq)
        finish_reason = "tool_calls"
    return {
        "id": f"chatcmpl-sim{a.seq}",
        "object": "chat.completion",
        "created": a.created,
        "model": a.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": a.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": a.reasoning_tokens,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        },
        "service_tier": "default",
        "system_fingerprint": None,
    }


def _anthropic_success(a: Answer) -> dict[str, Any]:
    # An empty turn is an empty content list, as Claude really sends it.
    content = native.anthropic_blocks(a.thinking, a.text, a.calls, a.seq)
    stop_reason = "end_turn" if a.finish_reason == "stop" else "max_tokens"
    return {
        "id": f"msg_sim{a.seq:020d}",
        "type": "message",
        "role": "assistant",
        "model": a.model,
        "content": content,
        "stop_reason": "tool_use" if a.calls else stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": a.input_tokens,
            "cache_creation_input_tokens": a.cache_write_tokens,
            "cache_read_input_tokens": a.cached_tokens,
            "output_tokens": a.output_tokens,
            "service_tier": "standard",
        },
    }


def _gemini_success(a: Answer) -> dict[str, Any]:
    # Google leaves out what is empty or zero: no parts when nothing was emitted
    # (WIRE.md gemini_quirk_max_tokens_no_parts), no zero token counts.
    parts = native.gemini_parts(a.thinking, a.text, a.calls)
    content: dict[str, Any] = {"parts": parts, "role": "model"} if parts else {"role": "model"}
    prompt = a.input_tokens + a.cached_tokens
    usage: dict[str, Any] = {"promptTokenCount": prompt}
    if a.output_tokens:
        usage["candidatesTokenCount"] = a.output_tokens
    usage["totalTokenCount"] = prompt + a.output_tokens + a.reasoning_tokens
    if a.cached_tokens:
        usage["cachedContentTokenCount"] = a.cached_tokens
    if a.reasoning_tokens:
        usage["thoughtsTokenCount"] = a.reasoning_tokens
    return {
        "candidates": [
            {
                "content": content,
                # A function call ends with STOP on this wire, not a tool reason.
                "finishReason": "STOP" if a.finish_reason == "stop" or a.calls else "MAX_TOKENS",
                "index": 0,
            }
        ],
        "usageMetadata": usage,
        "modelVersion": a.model,
        "responseId": f"sim{a.seq:016x}",
    }


# ---------------------------------------------------------------------------- errors

# Default (type, code, message) per status. `{model}` is filled in.
_OPENAI_BY_STATUS: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", None, "Invalid request."),
    401: (
        "invalid_request_error",
        "invalid_api_key",
        "Incorrect API key provided: sk-sim***. You can find your API key at "
        "https://platform.openai.com/account/api-keys.",
    ),
    403: (
        "request_forbidden",
        "unsupported_country_region_territory",
        "Country, region, or territory not supported",
    ),
    404: (
        "invalid_request_error",
        "model_not_found",
        "The model `{model}` does not exist or you do not have access to it.",
    ),
    429: (
        "requests",
        "rate_limit_exceeded",
        "Rate limit reached for {model} in organization org-sim on requests per min (RPM): "
        "Limit 500, Used 500, Requested 1. Please try again in 120ms. Visit "
        "https://platform.openai.com/account/rate-limits to learn more.",
    ),
    500: ("server_error", None, "The server had an error while processing your request. Sorry about that!"),
    503: ("server_error", None, "The engine is currently overloaded, please try again later."),
}
# A scripted `error_type` that is really an OpenAI error *code* picks its real type.
_OPENAI_BY_ERROR_TYPE: dict[str, tuple[str, str | None, str]] = {
    "insufficient_quota": (
        "insufficient_quota",
        "insufficient_quota",
        "You exceeded your current quota, please check your plan and billing "
        "details. For more information on this error, read the docs: "
        "https://platform.openai.com/docs/guides/error-codes/api-errors.",
    ),
    "rate_limit_exceeded": _OPENAI_BY_STATUS[429],
    "tokens": (
        "tokens",
        "rate_limit_exceeded",
        _OPENAI_BY_STATUS[429][2].replace(
            "requests per min (RPM): Limit 500, Used 500, Requested 1",
            "tokens per min (TPM): Limit 30000, Used 30000, Requested 1",
        ),
    ),
    "invalid_api_key": _OPENAI_BY_STATUS[401],
    "model_not_found": _OPENAI_BY_STATUS[404],
}
_ANTHROPIC_BY_STATUS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Invalid request."),
    401: ("authentication_error", "invalid x-api-key"),
    402: ("billing_error", "Your credit balance is too low to access the Anthropic API."),
    403: ("permission_error", "Your API key does not have permission to use the specified resource."),
    404: ("not_found_error", "model: {model}"),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: (
        "rate_limit_error",
        "This request would exceed the rate limit for your organization of 50 requests "
        "per minute. For details, refer to: https://docs.claude.com/en/api/rate-limits.",
    ),
    500: ("api_error", "Internal server error"),
    504: ("gateway_timeout_error", "Gateway timeout"),
    529: ("overloaded_error", "Overloaded"),
}
_GEMINI_BY_STATUS: dict[int, tuple[str, str]] = {
    400: ("INVALID_ARGUMENT", "Request contains an invalid argument."),
    401: ("UNAUTHENTICATED", "Request had invalid authentication credentials."),
    403: ("PERMISSION_DENIED", "The caller does not have permission"),
    404: (
        "NOT_FOUND",
        "models/{model} is not found for API version v1beta, or is not supported "
        "for generateContent. Call ListModels to see the list of available models and their "
        "supported methods.",
    ),
    429: (
        "RESOURCE_EXHAUSTED",
        "You exceeded your current quota, please check your plan and "
        "billing details. For more information on this error, head to: "
        "https://ai.google.dev/gemini-api/docs/rate-limits.",
    ),
    500: (
        "INTERNAL",
        "An internal error has occurred. Please retry or report in "
        "https://developers.generativeai.google/guide/troubleshooting",
    ),
    503: ("UNAVAILABLE", "The model is overloaded. Please try again later."),
    504: ("DEADLINE_EXCEEDED", "The request timed out. Please try again."),
}


def _fallback_status(status: int) -> int:
    """The table row for a status no table lists: a generic client or server error."""
    return 500 if status >= 500 else 400


def error_body(kind: Kind, spec: ErrorSpec, *, model: str, request_id: str | None) -> bytes:
    if kind == "openai":
        return _openai_error(spec, model)
    if kind == "anthropic":
        return _anthropic_error(spec, model, request_id)
    return _gemini_error(spec, model)


def _default_message(template: str, model: str) -> str:
    return LABEL + template.replace("{model}", model)


def _openai_error(spec: ErrorSpec, model: str) -> bytes:
    by_status = _OPENAI_BY_STATUS.get(spec.status) or _OPENAI_BY_STATUS[_fallback_status(spec.status)]
    if spec.error_type is None:
        err_type, code, template = by_status
    else:
        err_type, code, template = _OPENAI_BY_ERROR_TYPE.get(
            spec.error_type, (spec.error_type, by_status[1], by_status[2])
        )
    error = {
        "message": spec.message or _default_message(template, model),
        "type": err_type,
        "param": spec.param,
        "code": spec.code or code,
    }
    return (json.dumps({"error": error}, indent=4) + "\n").encode("utf-8")


def _anthropic_error(spec: ErrorSpec, model: str, request_id: str | None) -> bytes:
    default_type, template = (
        _ANTHROPIC_BY_STATUS.get(spec.status) or _ANTHROPIC_BY_STATUS[_fallback_status(spec.status)]
    )
    error = {
        "type": spec.error_type or default_type,
        "message": spec.message or _default_message(template, model),
    }
    return orjson.dumps({"type": "error", "error": error, "request_id": request_id})


def _gemini_error(spec: ErrorSpec, model: str) -> bytes:
    default_status, template = (
        _GEMINI_BY_STATUS.get(spec.status) or _GEMINI_BY_STATUS[_fallback_status(spec.status)]
    )
    details: list[dict[str, Any]] = []
    if spec.quota_id is not None:
        details.append(
            {
                "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                "violations": [
                    {
                        "quotaMetric": "generativelanguage.googleapis.com/generate_content_requests",
                        "quotaId": spec.quota_id,
                    }
                ],
            }
        )
    if spec.retry_delay is not None:
        details.append({"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": spec.retry_delay})
    error = {
        "code": spec.status,
        "message": spec.message or _default_message(template, model),
        "status": spec.error_type or default_status,
        "details": details,
    }
    return orjson.dumps({"error": error}, option=orjson.OPT_INDENT_2)


# ---------------------------------------------------------------------------- headers

CONTENT_TYPES: dict[Kind, str] = {
    "openai": "application/json; charset=utf-8",
    "anthropic": "application/json",
    "gemini": "application/json; charset=UTF-8",
}


def request_id(kind: Kind, seq: int) -> str | None:
    """A unique, deterministic request id per response (Gemini sends none in headers)."""
    if kind == "openai":
        return f"req_{seq:032x}"
    if kind == "anthropic":
        return f"req_sim{seq:020d}"
    return None


def response_headers(kind: Kind, seq: int, status: int) -> dict[str, str]:
    """The provider's own headers: its request id, and Anthropic's retry hint on 529."""
    headers = {"content-type": CONTENT_TYPES[kind]}
    rid = request_id(kind, seq)
    if kind == "openai" and rid:
        headers["x-request-id"] = rid
    elif kind == "anthropic" and rid:
        headers["request-id"] = rid
        if status == 529:
            headers["x-should-retry"] = "true"
    return headers
