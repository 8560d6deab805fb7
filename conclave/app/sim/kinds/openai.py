"""OpenAI Chat Completions as the simulated panel speaks it: the counterpart of
`conclave/providers/openai.py` (docs/providers.md#openai-compatible-wire). Requests are checked
as the API checks them, tool histories included; replies, errors (4-space pretty JSON with a
trailing newline) and headers are laid out as OpenAI lays them out. `response_format` is read as
the API reads it: `json_schema` (strict mode refusing a schema it cannot enforce) or
`json_object`, whose answer is then one JSON object (`conclave/app/sim/structured.py`).

`stream: true` streams the turn as `chat.completion.chunk`s, each a `data:` line: the role, the
text, each tool call's start and then its arguments, the finish reason, the usage chunk (with
`stream_options.include_usage`), then `data: [DONE]`."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from conclave.app.sim import native, structured
from conclave.app.sim.kinds.base import (
    Answer,
    CacheRule,
    ErrorSpec,
    ParsedRequest,
    StreamAsk,
    WireError,
    by_status,
    default_message,
    invalid,
    pieces,
    require_list,
    require_model,
    sse,
    streaming_unsupported,
    text_of,
)
from conclave.app.sim.native import Rejected
from conclave.app.sim.scenarios import NativeCall

_REASONING = re.compile(r"o\d|gpt-5($|-mini|-nano|-\d{4})")
_TOOL_CHOICES = frozenset({"none", "auto", "required"})
_SCHEMA_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
# What strict mode refuses in a schema, whatever else it holds.
_NOT_STRICT = (
    *("allOf", "not", "if", "then", "else"),
    *("dependentRequired", "dependentSchemas", "patternProperties"),
)
_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer"}


class OpenAIWire:
    kind: ClassVar[str] = "openai"
    base_path: ClassVar[str] = "/openai/v1"
    api_path: ClassVar[re.Pattern[str]] = re.compile(r"/chat/completions\Z")
    exact_route: ClassVar[str | None] = "/chat/completions"
    answer_field: ClassVar[str] = "choices"
    invalid_json: ClassVar[str] = (
        "We could not parse the JSON body of your request. (HINT: This likely means "
        "you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, "
        "but what was sent was not valid JSON.)"
    )
    # Automatic: the longest earlier prefix, in steps of 128 tokens; the system prompt is a message.
    cache: ClassVar[CacheRule] = CacheRule(("tools", "messages"), step_tokens=128)
    stream_error_status: ClassVar[int] = 500

    def parse(
        self,
        body: Mapping[str, Any],
        path_model: str | None,
        headers: Mapping[str, str],
        stream_query: Mapping[str, str] | None = None,
    ) -> ParsedRequest:
        return _parse(body)

    def success(self, answer: Answer) -> dict[str, Any]:
        return _success(answer)

    def stream(self, answer: Answer, ask: StreamAsk, answerless: bool = False) -> list[bytes]:
        return _stream(answer, ask, answerless)

    def stream_error(self, spec: ErrorSpec, model: str, ask: StreamAsk) -> bytes:
        # What the SDK raises on: a `data:` line holding a top-level `error`, then nothing.
        return sse({"error": _error_object(spec, model)})

    def error(self, spec: ErrorSpec, model: str, request_id: str | None) -> bytes:
        return _error(spec, model)

    def request_id(self, seq: int) -> str:
        return f"req_{seq:032x}"

    def headers(self, seq: int, status: int) -> dict[str, str]:
        return {"content-type": "application/json; charset=utf-8", "x-request-id": self.request_id(seq)}

    def stream_headers(self, seq: int, ask: StreamAsk) -> dict[str, str]:
        return {"content-type": "text/event-stream; charset=utf-8", "x-request-id": self.request_id(seq)}

    def stream_unsupported(self, model: str) -> ErrorSpec:
        return streaming_unsupported(model)


WIRE = OpenAIWire()


# ---------------------------------------------------------------------------- parsing


def _parse(body: Mapping[str, Any]) -> ParsedRequest:
    model = require_model(body, "you must provide a model parameter")
    messages = require_list(body, "messages", missing=_missing_messages, empty=_empty_messages)
    stream = body.get("stream")
    ask = None if stream is None or stream is False else _stream_ask(body, stream)
    if ask is None and body.get("stream_options") is not None:
        raise invalid(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.", param="stream_options"
        )
    if _is_reasoning_model(model):
        _check_reasoning_params(body)
    _check_tools(body, messages)
    texts = [text_of(m.get("content")) for m in messages]
    # Tool messages are the user's side of the turn, as tool results are on the other wires.
    user_texts = [t for m, t in zip(messages, texts, strict=True) if m.get("role") in ("user", "tool")]
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return ParsedRequest(
        model=model,
        last_text=_last_text(messages, texts),
        last_user_text=user_texts[-1] if user_texts else "",
        input_chars=sum(map(len, texts)),
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        declares_tools=native.declares_tools(body),
        answer_schema=_answer_schema(body, texts),
        stream=ask,
    )


def _stream_ask(body: Mapping[str, Any], stream: Any) -> StreamAsk:
    if stream is not True:
        raise invalid(
            f"Invalid type for 'stream': expected a boolean, but got {_json_type(stream)} instead.",
            param="stream",
            code="invalid_type",
        )
    options = body.get("stream_options")
    if options is None:
        return StreamAsk(usage=False)
    if not isinstance(options, dict):
        raise invalid(
            f"Invalid type for 'stream_options': expected an object, but got {_json_type(options)} instead.",
            param="stream_options",
            code="invalid_type",
        )
    return StreamAsk(
        usage=options.get("include_usage") is True,
        obfuscation=options.get("include_obfuscation") is not False,
    )


def _missing_messages() -> WireError:
    return invalid(
        "Missing required parameter: 'messages'.", param="messages", code="missing_required_parameter"
    )


def _empty_messages() -> WireError:
    return invalid(
        "Invalid 'messages': empty array. Expected an array with minimum length 1, "
        "but got an empty array instead.",
        param="messages",
        code="empty_array",
    )


def _is_reasoning_model(model: str) -> bool:
    return _REASONING.match(model.rsplit("/", 1)[-1]) is not None


def _last_text(messages: list[dict[str, Any]], texts: list[str]) -> str:
    """The last message, where a run of tool messages counts as one: the other wires put
    parallel results in one turn, and a rule should see them all there too."""
    start = len(messages) - 1
    while start > 0 and messages[start].get("role") == "tool" and messages[start - 1].get("role") == "tool":
        start -= 1
    return "\n".join(texts[start:])


def _check_reasoning_params(body: Mapping[str, Any]) -> None:
    """o-series and gpt-5 refuse the legacy token cap and sampling settings."""
    if body.get("max_tokens") is not None:
        raise invalid(
            "Unsupported parameter: 'max_tokens' is not supported with this model. "
            "Use 'max_completion_tokens' instead.",
            param="max_tokens",
            code="unsupported_parameter",
        )
    temperature = body.get("temperature")
    if temperature is not None and temperature != 1:
        raise invalid(
            f"Unsupported value: 'temperature' does not support {temperature} with this model. "
            "Only the default (1) value is supported.",
            param="temperature",
            code="unsupported_value",
        )


# ---------------------------------------------------------------------------- structured output


def _answer_schema(body: Mapping[str, Any], texts: Sequence[str]) -> Mapping[str, Any] | None:
    """The schema `response_format` holds the answer to, refused where the API refuses it."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise invalid(
            f"Invalid type for 'response_format': expected an object, but got {_json_type(fmt)} instead.",
            param="response_format",
            code="invalid_type",
        )
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        if not any("json" in text.lower() for text in texts):
            raise invalid(
                "'messages' must contain the word 'json' in some form, to use 'response_format' of "
                "type 'json_object'.",
                param="messages",
            )
        return {"type": "object"}
    if kind != "json_schema":
        raise invalid(
            f"Invalid value: '{kind}'. Supported values are: 'text', 'json_object', and 'json_schema'.",
            param="response_format.type",
            code="invalid_value",
        )
    return _json_schema(fmt.get("json_schema"))


def _json_schema(spec: Any) -> Mapping[str, Any]:
    if not isinstance(spec, dict):
        raise invalid(
            "Missing required parameter: 'response_format.json_schema'.",
            param="response_format.json_schema",
            code="missing_required_parameter",
        )
    name = spec.get("name")
    if not isinstance(name, str):
        raise invalid(
            "Missing required parameter: 'response_format.json_schema.name'.",
            param="response_format.json_schema.name",
            code="missing_required_parameter",
        )
    if not _SCHEMA_NAME.fullmatch(name):
        raise invalid(
            "Invalid 'response_format.json_schema.name': string does not match pattern. Expected a "
            "string that matches the pattern '^[a-zA-Z0-9_-]+$'.",
            param="response_format.json_schema.name",
            code="invalid_value",
        )
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise invalid(
            "Invalid type for 'response_format.json_schema.schema': expected an object, but got "
            f"{_json_type(schema)} instead.",
            param="response_format.json_schema.schema",
            code="invalid_type",
        )
    strict = spec.get("strict", False)
    if not isinstance(strict, bool) and strict is not None:
        raise invalid(
            "Invalid type for 'response_format.json_schema.strict': expected a boolean, but got "
            f"{_json_type(strict)} instead.",
            param="response_format.json_schema.strict",
            code="invalid_type",
        )
    problem = _strict_problem(schema) if strict else None
    if problem is not None:
        # OpenAI's own layout: param response_format, code null.
        raise invalid(f"Invalid schema for response_format '{name}': {problem}", param="response_format")
    return schema


def _strict_problem(schema: Mapping[str, Any]) -> str | None:
    """Why strict mode cannot enforce `schema`, in OpenAI's words; None when it can: an object at
    the root, every object closed and all of its properties required."""
    if schema.get("type") != "object":
        return f"schema must be a JSON Schema of 'type: \"object\"', got 'type: \"{schema.get('type')}\"'."
    for path, node in structured.walk(schema):
        context = f"In context={path!r}"
        refused = next((k for k in _NOT_STRICT if k in node), None)
        if refused is not None:
            return f"{context}, '{refused}' is not permitted."
        if not structured.is_object(node):
            continue
        if node.get("additionalProperties") is not False:
            return f"{context}, 'additionalProperties' is required to be supplied and to be false."
        properties = node.get("properties") or {}
        required = node.get("required")
        required = required if isinstance(required, list) else []
        missing = [name for name in properties if name not in required]
        if missing:
            return (
                f"{context}, 'required' is required to be supplied and to be an array including "
                f"every key in properties. Missing '{missing[0]}'."
            )
    return None


def _json_type(value: Any) -> str:
    return _JSON_TYPES.get(type(value), "a number" if isinstance(value, float) else "null")


# ---------------------------------------------------------------------------- native tools


def _check_tools(body: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]) -> None:
    """Declarations well formed, and every call answered by tool messages right after it."""
    _check_declarations(body)
    pending: list[str] = []  # call ids still waiting for their tool message
    asked_at = 0
    for i, message in enumerate(messages):
        if message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in pending:
                raise Rejected(
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    f"messages.[{i}].role",
                )
            pending.remove(call_id)
            continue
        _unanswered(pending, asked_at)
        if message.get("role") == "assistant" and message.get("tool_calls"):
            pending, asked_at = _call_ids(message["tool_calls"], i), i
    _unanswered(pending, asked_at)


def _unanswered(pending: list[str], asked_at: int) -> None:
    if pending:
        raise Rejected(
            "An assistant message with 'tool_calls' must be followed by tool messages responding "
            "to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
            + ", ".join(pending),
            f"messages.[{asked_at}].role",
        )


def _call_ids(calls: Any, i: int) -> list[str]:
    if not isinstance(calls, list):
        raise Rejected(
            f"Invalid type for 'messages[{i}].tool_calls': expected an array.", f"messages.[{i}].tool_calls"
        )
    ids: list[str] = []
    for j, call in enumerate(calls):
        where = f"messages[{i}].tool_calls[{j}]"
        if not isinstance(call, dict) or not isinstance(call.get("id"), str):
            raise Rejected(f"Missing required parameter: '{where}.id'.", where)
        function = call.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
            raise Rejected(
                f"Invalid type for '{where}.function.arguments': expected a string.",
                f"{where}.function.arguments",
            )
        ids.append(call["id"])
    return ids


def _check_declarations(body: Mapping[str, Any]) -> None:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None:
        if choice is not None:
            raise Rejected(
                "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
                "tool_choice",
            )
        return
    if not isinstance(tools, list) or not tools:
        raise Rejected(
            "Invalid 'tools': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            "tools",
        )
    for k, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise Rejected(
                f"Missing required parameter: 'tools[{k}].function.name'.", f"tools[{k}].function.name"
            )
    if isinstance(choice, str) and choice not in _TOOL_CHOICES:
        raise Rejected(
            f"Invalid value: '{choice}'. Supported values are: 'none', 'auto', and 'required'.", "tool_choice"
        )


def _tool_calls(calls: Sequence[NativeCall], seq: int) -> list[dict[str, Any]]:
    return [
        {
            "id": call.id or f"call_sim{seq:013d}{i:03d}",
            "type": "function",
            "function": {"name": call.name, "arguments": native.arguments_text(call.arguments)},
        }
        for i, call in enumerate(calls)
    ]


# ---------------------------------------------------------------------------- success


def _success(a: Answer) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": a.text, "refusal": None, "annotations": []}
    if a.calls:
        # OpenAI says null, not "", for a turn that only calls.
        message["content"] = a.text or None
        message["tool_calls"] = _tool_calls(a.calls, a.seq)
    return {
        "id": f"chatcmpl-sim{a.seq}",
        "object": "chat.completion",
        "created": a.created,
        "model": a.model,
        "choices": [{"index": 0, "message": message, "finish_reason": _finish_reason(a), "logprobs": None}],
        "usage": _usage(a),
        "service_tier": "default",
        "system_fingerprint": None,
    }


def _finish_reason(a: Answer) -> str:
    return "tool_calls" if a.calls else a.finish_reason


def _usage(a: Answer) -> dict[str, Any]:
    prompt = a.input_tokens + a.cached_tokens
    completion = a.output_tokens + a.reasoning_tokens
    return {
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
    }


# ---------------------------------------------------------------------------- streaming

# Padding characters for `obfuscation`, which OpenAI sends random and the panel derives.
_PAD = "kSx18Gpkah38dLw0M5wAKbe8E2c6Xq1aQpK3qslFTUGILk1H5PIzYSIGNFGWO"


def _stream(a: Answer, ask: StreamAsk, answerless: bool = False) -> list[bytes]:
    """The role chunk (`content` "" before text, null for a turn that only calls, which starts
    its first call there instead), the text a token at a time, each call's start (id, name,
    `arguments: ""`) and then its arguments in pieces, the finish reason, the usage chunk when
    asked for, `[DONE]`. Every chunk repeats the id, created, model and tier."""
    head = {
        "id": f"chatcmpl-sim{a.seq}",
        "object": "chat.completion.chunk",
        "created": a.created,
        "model": a.model,
        "service_tier": "default",
        "system_fingerprint": None,
    }
    calls = _tool_calls(a.calls, a.seq)
    opening: dict[str, Any] = {"role": "assistant", "content": "" if a.text or not calls else None}
    deltas: list[dict[str, Any]] = [opening]
    deltas.extend({"content": piece} for piece in pieces(a.text))
    for i, call in enumerate(calls):
        function = call["function"]
        start = {
            "index": i,
            "id": call["id"],
            "type": "function",
            "function": {"name": function["name"], "arguments": ""},
        }
        if i == 0 and not a.text:
            opening["tool_calls"] = [start]
        else:
            deltas.append({"tool_calls": [start]})
        deltas.extend(
            {"tool_calls": [{"index": i, "function": {"arguments": piece}}]}
            for piece in pieces(function["arguments"])
        )
    opening["refusal"] = None
    chunks = [{**head, "choices": [_choice(delta, None)]} for delta in deltas]
    chunks.append({**head, "choices": [_choice({}, _finish_reason(a))]})
    if ask.usage:
        for chunk in chunks:
            chunk["usage"] = None
        chunks.append({**head, "choices": [], "usage": _usage(a)})
    if answerless:
        for chunk in chunks:
            del chunk["choices"]
    if ask.obfuscation:
        for i, chunk in enumerate(chunks):
            chunk["obfuscation"] = _PAD[i % 16 : i % 16 + 1 + (i * 5) % 15]
    return [*map(sse, chunks), b"data: [DONE]\n\n"]


def _choice(delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


# ---------------------------------------------------------------------------- errors

# Default (type, code, message) per status. `{model}` is filled in.
_BY_STATUS: dict[int, tuple[str, str | None, str]] = {
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
_BY_ERROR_TYPE: dict[str, tuple[str, str | None, str]] = {
    "insufficient_quota": (
        "insufficient_quota",
        "insufficient_quota",
        "You exceeded your current quota, please check your plan and billing "
        "details. For more information on this error, read the docs: "
        "https://platform.openai.com/docs/guides/error-codes/api-errors.",
    ),
    "rate_limit_exceeded": _BY_STATUS[429],
    "tokens": (
        "tokens",
        "rate_limit_exceeded",
        _BY_STATUS[429][2].replace(
            "requests per min (RPM): Limit 500, Used 500, Requested 1",
            "tokens per min (TPM): Limit 30000, Used 30000, Requested 1",
        ),
    ),
    "invalid_api_key": _BY_STATUS[401],
    "model_not_found": _BY_STATUS[404],
}


def _error(spec: ErrorSpec, model: str) -> bytes:
    return (json.dumps({"error": _error_object(spec, model)}, indent=4) + "\n").encode("utf-8")


def _error_object(spec: ErrorSpec, model: str) -> dict[str, Any]:
    row = by_status(_BY_STATUS, spec.status)
    if spec.error_type is None:
        err_type, code, template = row
    else:
        err_type, code, template = _BY_ERROR_TYPE.get(spec.error_type, (spec.error_type, row[1], row[2]))
    return {
        "message": spec.message or default_message(template, model),
        "type": err_type,
        "param": spec.param,
        "code": spec.code or code,
    }
