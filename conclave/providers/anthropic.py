"""Anthropic Messages wire (docs/providers.md#anthropic-wire): `system` is top-level,
`max_tokens` is required, and `input_tokens` excludes cached tokens.

Native tools (docs/providers.md#native-tool-calling): declared as
`tools[{name, description, input_schema}]`; calls come back as `tool_use` content blocks
matched to their results by the block's own `toolu_…` id. The assistant turn that made them
is repeated as the very blocks the response held (`echo`): with extended thinking the API
rejects a tool loop whose `thinking` / `redacted_thinking` blocks come back altered or without
their signatures.

Structured output (docs/providers.md#structured-output): the answer schema as
`output_config.format`, closed and stripped to what the API takes; the reply is one JSON text
block."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any, ClassVar

import orjson

from conclave.core.messages import CompletionRequest, Message, ToolDeclaration, ToolUse, Usage
from conclave.providers.base import (
    IN_STREAM_ERROR_STATUS,
    JSON_HEADERS,
    Endpoint,
    ErrorDetails,
    Headers,
    KindSpec,
    ParsedCompletion,
    as_int,
    bare_model,
    event_json,
    event_stream,
    header_text,
    names_streaming,
)
from conclave.providers.streaming import Delta, StreamFailed
from conclave.schema.config import ProviderConfig
from conclave.schema.strictjson import tool_arguments

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
# Structured outputs refuse these schema keywords (400); the SDKs move them into the description
# and check the reply against the full schema, as Conclave does too.
_UNSUPPORTED = frozenset(
    {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength"}
    | {"maxItems", "uniqueItems"}
)
_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "uri", "ipv4", "ipv6", "uuid"}
)
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_ONES = ("items", "additionalProperties", "contains", "not", "if", "then", "else")
_SCHEMA_LISTS = ("items", "prefixItems", "anyOf", "oneOf", "allOf")


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
            "messages": _marked([_message(m) for m in request.messages], request.cache_messages),
        }
        if request.system:
            body["system"] = _system(request.system, request.cache_prefix)
        if request.temperature is not None and not _NO_SAMPLING.match(bare_model(entry.model)):
            body["temperature"] = min(request.temperature, 1.0)
        if request.tools:
            body["tools"] = [_declaration(t) for t in request.tools]
            if request.tool_choice == "none":
                # Keeps the declarations (the history's tool_use blocks need them) but forbids calls.
                body["tool_choice"] = {"type": "none"}
        if request.answer_schema is not None and KIND.structured_output and entry.structured_output:
            # The GA shape: no beta header (the beta's top-level `output_format` needed one).
            body["output_config"] = {
                "format": {"type": "json_schema", "schema": _output_schema(request.answer_schema)}
            }
        return body

    def parse(self, body: Any, headers: Headers, entry: ProviderConfig) -> ParsedCompletion:
        blocks = body["content"]
        text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        stop = body.get("stop_reason") or "end_turn"
        uses = tuple(_tool_use(b) for b in blocks if b.get("type") == "tool_use")
        return ParsedCompletion(
            text=text,
            finish_reason=_FINISH.get(stop, stop),
            usage=_usage(body.get("usage") or {}),
            model=body.get("model") or entry.model,
            request_id=header_text(headers, "request-id") or body.get("id"),
            tool_uses=uses,
            # Only a turn with calls is repeated: a plain answer ends the loop, nothing follows it.
            echo=copy.deepcopy(blocks) if uses else None,
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

    def stream_endpoint(self, entry: ProviderConfig, key: str | None) -> Endpoint:
        return event_stream(self.endpoint(entry, key))

    def stream_body(self, request: CompletionRequest, entry: ProviderConfig) -> dict[str, Any]:
        return {**self.body(request, entry), "stream": True}

    def assembler(self, entry: ProviderConfig) -> AnthropicStream:
        return AnthropicStream()

    def refuses_stream(self, status: int, details: ErrorDetails) -> bool:
        return names_streaming(status, details)


# The HTTP status of each error type, for an `error` event inside a stream that began with 200.
_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "gateway_timeout_error": 504,
    "overloaded_error": 529,
}


class AnthropicStream:
    """A Messages event stream rebuilt into the Messages response of the same answer
    (docs/providers.md#reading-streams): `message_start`'s message, its content blocks in index
    order grown by their deltas (text, thinking and its signature, citations, and a tool call's
    input as the JSON of its concatenated `partial_json`), `message_delta`'s stop reason and usage
    (each count it repeats, the last value), until `message_stop`. An `error` event fails the
    stream."""

    def __init__(self) -> None:
        self._message: dict[str, Any] = {}
        self._usage: dict[str, Any] = {}
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}
        # A text or thinking block's pieces, joined once in body(): added to as they came, a long
        # answer would be copied whole at every delta.
        self._pieces: dict[tuple[int, str], list[str]] = {}
        self._calls: dict[int, int] = {}  # a tool_use block's index -> its place among the calls
        self._done = False

    @property
    def complete(self) -> bool:
        return self._done

    def feed(self, event: str, data: str) -> list[Delta]:
        payload = event_json(data)
        kind = payload.get("type") if event == "message" else event  # "message": no `event:` line
        if kind == "error":
            err = payload.get("error")
            error_type = err.get("type") if isinstance(err, dict) else None
            raise StreamFailed(_ERROR_STATUS.get(str(error_type), IN_STREAM_ERROR_STATUS), payload)
        if kind == "message_start" and isinstance(payload.get("message"), dict):
            self._message = dict(payload["message"])
            self._usage = dict(self._message.get("usage") or {})
        elif kind == "content_block_start":
            return self._start(payload)
        elif kind == "content_block_delta":
            return self._delta(payload)
        elif kind == "message_delta":
            self._message.update(payload.get("delta") or {})
            # message_start counts the input; output_tokens here is the total so far, and newer
            # servers repeat the input and cache counts too: the last value of each wins.
            self._usage.update({k: v for k, v in (payload.get("usage") or {}).items() if v is not None})
        elif kind == "message_stop":
            self._done = True
        return []  # ping, content_block_stop, and what a later API adds

    def _start(self, payload: dict[str, Any]) -> list[Delta]:
        index, block = payload.get("index"), payload.get("content_block")
        if not isinstance(index, int) or not isinstance(block, dict):
            return []
        self._blocks[index] = dict(block)
        if "input" in block:  # tool_use (and the server's own tools): input comes as JSON pieces
            self._json[index] = []
        if block.get("type") == "tool_use":
            self._calls[index] = len(self._calls)
            return [Delta("tool_call", "", index=self._calls[index], name=block.get("name"))]
        return []

    def _delta(self, payload: dict[str, Any]) -> list[Delta]:
        index, delta = payload.get("index"), payload.get("delta")
        if not isinstance(index, int) or index not in self._blocks or not isinstance(delta, dict):
            return []
        block = self._blocks[index]
        kind = delta.get("type")
        if kind == "text_delta" and isinstance(delta.get("text"), str):
            self._pieces.setdefault((index, "text"), []).append(delta["text"])
            return [Delta("text", delta["text"])] if delta["text"] else []
        if kind == "thinking_delta" and isinstance(delta.get("thinking"), str):
            self._pieces.setdefault((index, "thinking"), []).append(delta["thinking"])
            return [Delta("thinking", delta["thinking"])] if delta["thinking"] else []
        if kind == "signature_delta":
            block["signature"] = delta.get("signature")  # whole, as the SDK takes it
        elif kind == "citations_delta":
            block["citations"] = [*(block.get("citations") or []), delta.get("citation")]
        elif kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            fragment = delta["partial_json"]
            self._json.setdefault(index, []).append(fragment)
            if index in self._calls and fragment:
                return [Delta("tool_call", fragment, index=self._calls[index])]
        return []

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"type": "message", "role": "assistant", **self._message}
        if self._blocks or "content" in body:  # message_start's content is [], when it has one
            body["content"] = [self._block(index) for index in sorted(self._blocks)]
        body.setdefault("stop_reason", None)
        body.setdefault("stop_sequence", None)
        body["usage"] = dict(self._usage)
        return body

    def _block(self, index: int) -> dict[str, Any]:
        block = dict(self._blocks[index])
        for field in ("text", "thinking"):
            if (pieces := self._pieces.get((index, field))) is not None:
                block[field] = str(block.get(field) or "") + "".join(pieces)
        if index in self._json:
            block["input"] = _streamed_input("".join(self._json[index]))
        return block


def _streamed_input(text: str) -> Any:
    """A tool call's input from its concatenated `partial_json`: {} for none, decoded as a plain
    body is (a duplicate key collapses the same way); JSON that does not decode stays text, for
    the strict arguments check to refuse."""
    if not text:
        return {}
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


KIND = KindSpec(
    AnthropicAdapter(),
    native_tools=True,
    structured_output=True,
    streaming=True,
    cache="breakpoint",  # cache_control on the shared system block (`_system`)
    otel_name="anthropic",
    answer_field="content",
)


def _output_schema(node: Any) -> Any:
    """The answer schema as structured outputs take it: every object closed
    (`additionalProperties: false`, which the API requires: only a narrowing, so a reply valid
    here is valid against the caller's schema), and the numeric, length and item-count limits and
    string formats it refuses moved into the description, as the SDKs' `transform_schema` does.
    The reply is still checked against the caller's full schema."""
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    moved: dict[str, Any] = {}
    for key, value in node.items():
        if _refused(key, value):
            moved[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, Mapping):
            out[key] = {name: _output_schema(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_output_schema(sub) for sub in value]
        elif key in _SCHEMA_ONES:
            out[key] = _output_schema(value)
        else:
            out[key] = value
    kind = out.get("type")
    if kind == "object" or (isinstance(kind, list) and "object" in kind) or "properties" in out:
        out["additionalProperties"] = False
    if moved:
        note = ", ".join(f"{k}: {orjson.dumps(v).decode()}" for k, v in moved.items())
        description = out.get("description")
        out["description"] = f"{description} ({note})" if isinstance(description, str) else f"({note})"
    return out


def _refused(key: str, value: Any) -> bool:
    if key == "minItems":
        return value not in (0, 1)
    return key in _UNSUPPORTED or (key == "format" and value not in _FORMATS)


def _message(m: Message) -> dict[str, Any]:
    if m.tool_returns:
        return {"role": m.role, "content": _results(m)}
    if m.echo is not None:
        return {"role": m.role, "content": m.echo}
    if m.tool_uses:
        return {"role": m.role, "content": _calls(m)}
    return {"role": m.role, "content": m.content}


def _marked(messages: list[dict[str, Any]], repeated: int) -> list[dict[str, Any]]:
    """A cache breakpoint after the first `repeated` messages (a follow-up's history): this call
    writes them to the cache, and the thread's next call, whose history starts with them, reads
    them, as Anthropic looks back from a breakpoint for the longest prefix it has cached."""
    if not 0 < repeated <= len(messages):
        return messages
    last = messages[repeated - 1]
    content = last["content"]
    blocks: list[dict[str, Any]] = (
        [{"type": "text", "text": content}] if isinstance(content, str) else [dict(b) for b in content]
    )
    if not blocks:
        return messages
    blocks[-1]["cache_control"] = {"type": "ephemeral"}
    return [*messages[: repeated - 1], {**last, "content": blocks}, *messages[repeated:]]


def _calls(m: Message) -> list[dict[str, Any]]:
    """An assistant turn rebuilt from its calls, for a history that kept no echo. The API
    rejects empty text blocks, hence none for an empty text."""
    text = [{"type": "text", "text": m.content}] if m.content else []
    return text + [
        {"type": "tool_use", "id": u.id, "name": u.name, "input": dict(u.arguments or {})}
        for u in m.tool_uses
    ]


def _results(m: Message) -> list[dict[str, Any]]:
    """One tool_result block per return, in order. They must open the user turn (the API
    rejects text before them), so any text of the message follows them."""
    blocks: list[dict[str, Any]] = []
    for r in m.tool_returns:
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": r.call_id, "content": r.content}
        if r.is_error:
            block["is_error"] = True
        blocks.append(block)
    if m.content:
        blocks.append({"type": "text", "text": m.content})
    return blocks


def _system(system: str, shared: int) -> str | list[dict[str, Any]]:
    """The system prompt; when another call of the session repeats its first `shared` characters,
    as two blocks with a cache breakpoint after the shared one: tools and that block are written
    to Anthropic's prompt cache by the first such call and read by the others. One breakpoint of
    the four allowed."""
    if not 0 < shared < len(system) + 1:
        return system
    blocks: list[dict[str, Any]] = [
        {"type": "text", "text": system[:shared], "cache_control": {"type": "ephemeral"}}
    ]
    if system[shared:].strip():
        blocks.append({"type": "text", "text": system[shared:]})
    return blocks


def _declaration(tool: ToolDeclaration) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}


def _tool_use(block: dict[str, Any]) -> ToolUse:
    # `input` arrives decoded with the body, so the strict rules see it after the body's own
    # decoder: size, depth and type are checked here; a duplicate key has already collapsed.
    arguments, error = tool_arguments(block.get("input"))
    return ToolUse(id=block["id"], name=block["name"], arguments=arguments, error=error)


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
