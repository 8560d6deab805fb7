"""Anthropic Messages as the simulated panel speaks it: the counterpart of
`conclave/providers/anthropic.py` (docs/providers.md#anthropic-wire). Requests are checked as
the API checks them (the version header, `max_tokens`, roles, tool histories and thinking
signatures); replies, compact JSON errors and headers are laid out as Anthropic lays them out.
Structured output is read from `output_config.format` (or the beta's `output_format`, only with
its `anthropic-beta` header), its schema held to the documented limits; the answer is then one
JSON text block (`conclave/app/sim/structured.py`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import orjson

from conclave.app.sim import native, structured
from conclave.app.sim.kinds.base import (
    Answer,
    CacheRule,
    ErrorSpec,
    ParsedRequest,
    StreamAsk,
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

_TOOL_CHOICES = frozenset({"auto", "any", "tool", "none"})
_OUTPUTS_BETA = "structured-outputs-2025-11-13"  # the beta header `output_format` needs
# Structured outputs' documented limits: these keywords are refused, `minItems` takes 0 or 1.
_UNSUPPORTED = (
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "maxItems",
    "uniqueItems",
)


class AnthropicWire:
    kind: ClassVar[str] = "anthropic"
    base_path: ClassVar[str] = "/anthropic"
    api_path: ClassVar[re.Pattern[str]] = re.compile(r"/v1/messages\Z")
    exact_route: ClassVar[str | None] = "/v1/messages"
    answer_field: ClassVar[str] = "content"
    invalid_json: ClassVar[str] = "There was an error parsing the body of your request: invalid JSON."
    # Explicit: the tools and system blocks up to the last cache_control mark.
    cache: ClassVar[CacheRule] = CacheRule(("tools", "system", "messages"), breakpoints=True)
    stream_error_status: ClassVar[int] = 529  # "Overloaded", the error streams meet most

    def parse(
        self,
        body: Mapping[str, Any],
        path_model: str | None,
        headers: Mapping[str, str],
        stream_query: Mapping[str, str] | None = None,
    ) -> ParsedRequest:
        return _parse(body, headers)

    def success(self, answer: Answer) -> dict[str, Any]:
        return _success(answer)

    def stream(self, answer: Answer, ask: StreamAsk, answerless: bool = False) -> list[bytes]:
        return _stream(answer, answerless)

    def stream_error(self, spec: ErrorSpec, model: str, ask: StreamAsk) -> bytes:
        # An `error` event, then the connection closes with no message_stop.
        default_type, template = by_status(_BY_STATUS, spec.status)
        error = {
            "details": None,
            "type": spec.error_type or default_type,
            "message": spec.message or default_message(template, model),
        }
        return sse({"type": "error", "error": error}, "error")

    def stream_headers(self, seq: int, ask: StreamAsk) -> dict[str, str]:
        return {
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            "request-id": self.request_id(seq),
        }

    def stream_unsupported(self, model: str) -> ErrorSpec:
        return streaming_unsupported(model)

    def error(self, spec: ErrorSpec, model: str, request_id: str | None) -> bytes:
        return _error(spec, model, request_id)

    def request_id(self, seq: int) -> str:
        return f"req_sim{seq:020d}"

    def headers(self, seq: int, status: int) -> dict[str, str]:
        headers = {"content-type": "application/json", "request-id": self.request_id(seq)}
        if status == 529:  # Anthropic's own retry hint on overload
            headers["x-should-retry"] = "true"
        return headers


WIRE = AnthropicWire()


# ---------------------------------------------------------------------------- parsing


def _parse(body: Mapping[str, Any], headers: Mapping[str, str]) -> ParsedRequest:
    if not headers.get("anthropic-version"):
        raise invalid("anthropic-version: header is required")
    model = require_model(body, "model: Field required")
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise invalid(
            "max_tokens: Field required"
            if max_tokens is None
            else "max_tokens: Input should be a valid integer"
        )
    messages = require_list(
        body,
        "messages",
        missing=lambda: invalid("messages: Field required"),
        empty=lambda: invalid("messages: at least one message is required"),
    )
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise invalid(
                f'messages.{i}: Unexpected role "{role}". The Messages API accepts a top-level '
                f'`system` parameter, not "{role}" as an input message role.'
            )
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise invalid("stream: Input should be a valid boolean")
    _check_tools(body, messages)
    texts = [text_of(m.get("content")) for m in messages]
    user_texts = [t for m, t in zip(messages, texts, strict=True) if m["role"] == "user"]
    return ParsedRequest(
        model=model,
        last_text=texts[-1],
        last_user_text=user_texts[-1] if user_texts else "",
        input_chars=len(text_of(body.get("system"))) + sum(map(len, texts)),
        max_tokens=max_tokens,
        declares_tools=native.declares_tools(body),
        answer_schema=_answer_schema(body, headers.get("anthropic-beta") or ""),
        stream=_STREAM if stream else None,
    )


_STREAM = StreamAsk()


# ---------------------------------------------------------------------------- structured output


def _answer_schema(body: Mapping[str, Any], betas: str) -> Mapping[str, Any] | None:
    """The schema `output_config.format` (GA) or `output_format` (the beta, which needs its
    header) holds the answer to, refused where the API refuses it."""
    config = body.get("output_config")
    if config is not None and not isinstance(config, dict):
        raise invalid("output_config: Input should be a valid dictionary")
    fmt, where = (config or {}).get("format"), "output_config.format"
    if "output_format" in body:
        if _OUTPUTS_BETA not in (b.strip() for b in betas.split(",")):
            raise invalid("output_format: Extra inputs are not permitted")
        if fmt is not None:
            raise invalid("output_format and output_config.format cannot both be set")
        fmt, where = body["output_format"], "output_format"
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise invalid(f"{where}: Input should be a valid dictionary")
    if fmt.get("type") != "json_schema":
        raise invalid(f"{where}.type: Input should be 'json_schema'")
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        wrong = "Field required" if schema is None else "Input should be a valid dictionary"
        raise invalid(f"{where}.schema: {wrong}")
    problem = _schema_problem(schema)
    if problem is not None:
        raise invalid(f"{where}.schema: {problem}")
    return schema


def _schema_problem(schema: Mapping[str, Any]) -> str | None:
    """What the documented limits refuse (the wording is the panel's own)."""
    for path, node in structured.walk(schema):
        where = "/".join(path) or "(root)"
        refused = next((k for k in _UNSUPPORTED if k in node), None)
        if refused is not None:
            return f"'{refused}' is not supported (at {where})"
        if node.get("minItems", 0) not in (0, 1):
            return f"'minItems' only supports the values 0 and 1 (at {where})"
        if structured.is_object(node) and node.get("additionalProperties") is not False:
            return f"For 'object' type, 'additionalProperties' must be explicitly set to false (at {where})"
    return None


# ---------------------------------------------------------------------------- native tools


def _check_tools(body: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]) -> None:
    """Declarations well formed, every `tool_use` answered in the very next message, thinking
    signed, and no tool blocks without declarations."""
    _check_declarations(body)
    uses_tools = False
    asked: list[str] = []  # tool_use ids of the previous assistant message
    for i, message in enumerate(messages):
        blocks = [b for b in _blocks(message) if isinstance(b, dict)]
        answered = _results(blocks, asked, i)
        missing = [call_id for call_id in asked if call_id not in answered]
        if missing:
            raise Rejected(_unanswered(i - 1, missing))
        asked = []
        if message.get("role") == "assistant":
            _check_thinking(blocks, i)
            asked = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
        uses_tools = uses_tools or bool(asked) or bool(answered)
    if asked:
        raise Rejected(_unanswered(len(messages) - 1, asked))
    if uses_tools and not native.declares_tools(body):
        raise Rejected("Requests which include `tool_use` or `tool_result` blocks must define tools.")


def _blocks(message: Mapping[str, Any]) -> list[Any]:
    content = message.get("content")
    return content if isinstance(content, list) else []


def _results(blocks: list[dict[str, Any]], asked: list[str], i: int) -> list[str]:
    answered: list[str] = []
    for j, block in enumerate(blocks):
        if block.get("type") != "tool_result":
            continue
        call_id = block.get("tool_use_id")
        if call_id not in asked:
            raise Rejected(
                f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: "
                f"{call_id}. Each `tool_result` block must have a corresponding `tool_use` block in "
                "the previous message."
            )
        answered.append(call_id)
    return answered


def _unanswered(i: int, ids: list[str]) -> str:
    return (
        f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: "
        f"{', '.join(ids)}. Each `tool_use` block must have a corresponding `tool_result` block in "
        "the next message."
    )


def _check_thinking(blocks: list[dict[str, Any]], i: int) -> None:
    for j, block in enumerate(blocks):
        if block.get("type") != "thinking":
            continue
        if not isinstance(block.get("signature"), str):
            raise Rejected(f"messages.{i}.content.{j}.thinking.signature: Field required")
        if block["signature"] != native.signature(str(block.get("thinking"))):
            raise Rejected(f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block")


def _check_declarations(body: Mapping[str, Any]) -> None:
    tools = body.get("tools")
    for k, tool in enumerate(tools if isinstance(tools, list) else []):
        for key in ("name", "input_schema"):
            if not isinstance(tool, dict) or key not in tool:
                raise Rejected(f"tools.{k}.custom.{key}: Field required")
    choice = body.get("tool_choice")
    if choice is not None and (not isinstance(choice, dict) or choice.get("type") not in _TOOL_CHOICES):
        tag = choice.get("type") if isinstance(choice, dict) else choice
        raise Rejected(
            f"tool_choice: Input tag '{tag}' found using 'type' does not match any of the expected "
            "tags: 'auto', 'any', 'tool', 'none'"
        )


def _content_blocks(
    thinking: str | None, text: str, calls: Sequence[NativeCall], seq: int
) -> list[dict[str, Any]]:
    """Thinking first, then text, then the calls. Claude sends no empty text block."""
    blocks: list[dict[str, Any]] = []
    if thinking is not None:
        blocks.append({"type": "thinking", "thinking": thinking, "signature": native.signature(thinking)})
    if text:
        blocks.append({"type": "text", "text": text})
    for i, call in enumerate(calls):
        call_id = call.id or f"toolu_sim{seq:015d}{i:03d}"
        blocks.append(
            {"type": "tool_use", "id": call_id, "name": call.name, "input": native.arguments_object(call)}
        )
    return blocks


# ---------------------------------------------------------------------------- success


def _success(a: Answer) -> dict[str, Any]:
    # An empty turn is an empty content list, as Claude really sends it.
    return {**_message(a), "content": _content_blocks(a.thinking, a.text, a.calls, a.seq)}


def _message(a: Answer) -> dict[str, Any]:
    """The message without its content, as `message_start` carries it."""
    stop_reason = "end_turn" if a.finish_reason == "stop" else "max_tokens"
    return {
        "id": f"msg_sim{a.seq:020d}",
        "type": "message",
        "role": "assistant",
        "model": a.model,
        "content": [],
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


# ---------------------------------------------------------------------------- streaming


def _stream(a: Answer, answerless: bool = False) -> list[bytes]:
    """`message_start` (no content, no stop reason yet, one output token so far), each block
    opened empty, filled by its deltas and closed, then `message_delta` with the stop reason and
    the final usage (the cumulative counts newer servers send), and `message_stop`."""
    message = _message(a)
    stop_reason = message["stop_reason"]
    usage = dict(message["usage"])
    message.update(stop_reason=None, usage={**usage, "output_tokens": 1})
    blocks = _content_blocks(a.thinking, a.text, a.calls, a.seq)
    if answerless:  # a message without `content`, and no block
        del message["content"]
        blocks = []
    frames = [sse({"type": "message_start", "message": message}, "message_start")]
    for index, block in enumerate(blocks):
        frames.append(
            sse(
                {"type": "content_block_start", "index": index, "content_block": _opened(block)},
                "content_block_start",
            )
        )
        if index == 0:
            frames.append(_PING)
        frames.extend(
            sse({"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta")
            for delta in _deltas(block)
        )
        frames.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
    if len(frames) == 1:  # no block: the ping still comes
        frames.append(_PING)
    del usage["service_tier"]
    delta = {"stop_reason": stop_reason, "stop_sequence": None}
    frames.append(sse({"type": "message_delta", "delta": delta, "usage": usage}, "message_delta"))
    frames.append(sse({"type": "message_stop"}, "message_stop"))
    return frames


_PING = b'event: ping\ndata: {"type": "ping"}\n\n'


def _opened(block: dict[str, Any]) -> dict[str, Any]:
    """A block as `content_block_start` opens it: its text, thinking and signature empty, its
    input `{}`."""
    if block["type"] == "text":
        return {"type": "text", "text": ""}
    if block["type"] == "thinking":
        return {"type": "thinking", "thinking": "", "signature": ""}
    return {**block, "input": {}}


def _deltas(block: dict[str, Any]) -> list[dict[str, Any]]:
    if block["type"] == "text":
        return [{"type": "text_delta", "text": piece} for piece in pieces(block["text"])]
    if block["type"] == "thinking":
        thought = [{"type": "thinking_delta", "thinking": piece} for piece in pieces(block["thinking"])]
        return [*thought, {"type": "signature_delta", "signature": block["signature"]}]
    # The input's JSON text, its first piece empty; a call without arguments sends only that.
    arguments = block["input"]
    text = "" if arguments == {} else orjson.dumps(arguments).decode()
    return [{"type": "input_json_delta", "partial_json": piece} for piece in ["", *pieces(text)]]


# ---------------------------------------------------------------------------- errors

# Default (type, message) per status. `{model}` is filled in.
_BY_STATUS: dict[int, tuple[str, str]] = {
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


def _error(spec: ErrorSpec, model: str, request_id: str | None) -> bytes:
    default_type, template = by_status(_BY_STATUS, spec.status)
    error = {
        "type": spec.error_type or default_type,
        "message": spec.message or default_message(template, model),
    }
    return orjson.dumps({"type": "error", "error": error, "request_id": request_id})
