"""Gemini generateContent as the simulated panel speaks it: the counterpart of
`conclave/providers/gemini.py` (docs/providers.md#gemini-wire). The model is named in the path;
requests are checked as the API checks them (roles, function call and response counts, thought
signatures); replies leave out what is empty or zero, and errors are 2-space pretty JSON with
Google's `details`, as Google lays them out. `generationConfig.responseMimeType:
application/json` asks for a JSON answer, held to `responseJsonSchema` when it is given
(`conclave/app/sim/structured.py`).

`:streamGenerateContent` streams the turn as whole GenerateContentResponse chunks, one part each
(text a token at a time, a function call whole), every chunk with the usage so far and the last
with the finish reason: with `?alt=sse` each chunk a `data:` event ending in CRLF CRLF, without
it one JSON array written as it goes."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

import orjson

from conclave.app.sim import native
from conclave.app.sim.kinds.base import (
    LABEL,
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
    sse,
    text_of,
)
from conclave.app.sim.native import Rejected
from conclave.app.sim.scenarios import NativeCall

_MODES = frozenset({"MODE_UNSPECIFIED", "AUTO", "ANY", "NONE", "VALIDATED"})
_MIME_TYPES = frozenset(
    {"text/plain", "application/json", "application/xml", "application/yaml", "text/x.enum"}
)
# The generations before Gemini 3 take a JSON answer or function declarations, not both.
_NO_JSON_WITH_TOOLS = re.compile(r"^gemini-[12][.-]")
_COUNTS_DIFFER = (
    "Please ensure that the number of function response parts is equal to the number "
    "of function call parts of the function call turn."
)


class GeminiWire:
    kind: ClassVar[str] = "gemini"
    base_path: ClassVar[str] = "/gemini"
    api_path: ClassVar[re.Pattern[str]] = re.compile(
        r"/v1(?:beta|alpha)?/models/(?P<model>[^/]+):(?:generateContent|(?P<stream>streamGenerateContent))$"
    )
    exact_route: ClassVar[str | None] = None  # the path names the model: the catch-all routes it
    answer_field: ClassVar[str] = "candidates"
    invalid_json: ClassVar[str] = "Invalid JSON payload received. Unexpected token."
    # Implicit: the longest earlier prefix, counted to the token.
    cache: ClassVar[CacheRule] = CacheRule(("tools", "systemInstruction", "contents"))
    stream_error_status: ClassVar[int] = 503  # "The model is overloaded."

    def parse(
        self,
        body: Mapping[str, Any],
        path_model: str | None,
        headers: Mapping[str, str],
        stream_query: Mapping[str, str] | None = None,
    ) -> ParsedRequest:
        parsed = _parse(body, path_model or "")
        if stream_query is None:
            return parsed
        return replace(parsed, stream=_SSE if stream_query.get("alt") == "sse" else _ARRAY)

    def success(self, answer: Answer) -> dict[str, Any]:
        return _success(answer)

    def stream(self, answer: Answer, ask: StreamAsk, answerless: bool = False) -> list[bytes]:
        dicts = _chunks(answer)
        if answerless:
            for chunk in dicts:
                del chunk["candidates"]
        chunks = [orjson.dumps(chunk) for chunk in dicts]
        if ask.sse:
            return [sse(chunk, end=b"\r\n\r\n") for chunk in chunks]
        # One JSON array, written element by element.
        return [b"[" + chunks[0], *(b",\r\n" + chunk for chunk in chunks[1:]), b"]"]

    def stream_error(self, spec: ErrorSpec, model: str, ask: StreamAsk) -> bytes:
        error = orjson.dumps(_error_body(spec, model))
        return sse(error, end=b"\r\n\r\n") if ask.sse else b",\r\n" + error + b"]"

    def stream_headers(self, seq: int, ask: StreamAsk) -> dict[str, str]:
        if ask.sse:
            return {"content-type": "text/event-stream", "content-disposition": "attachment"}
        return self.headers(seq, 200)

    def stream_unsupported(self, model: str) -> ErrorSpec:
        # A server that only has generateContent: the streaming method is not found.
        message = _BY_STATUS[404][1].replace("for generateContent", "for streamGenerateContent")
        return ErrorSpec(404, message=LABEL + message.replace("{model}", model))

    def error(self, spec: ErrorSpec, model: str, request_id: str | None) -> bytes:
        return _error(spec, model)

    def request_id(self, seq: int) -> None:
        return None  # Google sends no request id header; the body's responseId stands in

    def headers(self, seq: int, status: int) -> dict[str, str]:
        return {"content-type": "application/json; charset=UTF-8"}


WIRE = GeminiWire()


_SSE = StreamAsk()
_ARRAY = StreamAsk(sse=False)


# ---------------------------------------------------------------------------- parsing


def _parse(body: Mapping[str, Any], model: str) -> ParsedRequest:
    def not_specified() -> WireError:
        return invalid("* GenerateContentRequest.contents: contents is not specified")

    contents = require_list(body, "contents", missing=not_specified, empty=not_specified)
    for content in contents:
        if content.get("role", "user") not in ("user", "model"):
            raise invalid("Please use a valid role: user, model.")
    _check_tools(body, contents)
    texts = [text_of(c.get("parts")) for c in contents]
    user_texts = [t for c, t in zip(contents, texts, strict=True) if c.get("role", "user") == "user"]
    system = body.get("systemInstruction")
    system_text = text_of(system.get("parts")) if isinstance(system, dict) else ""
    config = body.get("generationConfig")
    config = config if isinstance(config, dict) else {}
    max_tokens = config.get("maxOutputTokens")
    return ParsedRequest(
        model=model,
        last_text=texts[-1],
        last_user_text=user_texts[-1] if user_texts else "",
        input_chars=len(system_text) + sum(map(len, texts)),
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        declares_tools=native.declares_tools(body),
        answer_schema=_answer_schema(config, model, _declares_functions(body)),
    )


# ---------------------------------------------------------------------------- structured output


def _answer_schema(config: Mapping[str, Any], model: str, functions: bool) -> Mapping[str, Any] | None:
    """The schema a JSON answer is held to ({"type": "object"} for JSON mode without one), or
    None for text; refused where the API refuses it."""
    mime = config.get("responseMimeType")
    schema = config.get("responseJsonSchema")
    if mime is not None and mime not in _MIME_TYPES:
        raise invalid(
            "* GenerateContentRequest.generation_config.response_mime_type: allowed mimetypes are "
            "`text/plain`, `application/json`, `application/xml`, `application/yaml` and `text/x.enum`."
        )
    if schema is not None and mime != "application/json":
        raise invalid(
            "* GenerateContentRequest.generation_config.response_mime_type: "
            "response_mime_type must be `application/json` when response_json_schema is set."
        )
    if mime != "application/json":
        return None
    if functions and _NO_JSON_WITH_TOOLS.match(model.removeprefix("models/").lower()):
        raise invalid("Function calling with a response mime type: 'application/json' is unsupported")
    if schema is None:
        return {"type": "object"}
    if not isinstance(schema, dict):
        raise invalid("* GenerateContentRequest.generation_config.response_json_schema: must be an object.")
    return schema


def _declares_functions(body: Mapping[str, Any]) -> bool:
    tools = body.get("tools")
    return isinstance(tools, list) and any(
        isinstance(t, dict) and t.get("functionDeclarations") for t in tools
    )


# ---------------------------------------------------------------------------- native tools


def _check_tools(body: Mapping[str, Any], contents: Sequence[Mapping[str, Any]]) -> None:
    """Declarations well formed, each call turn answered by as many responses in the next turn,
    and thought signatures kept where they were given."""
    _check_declarations(body)
    previous_calls = 0
    for content in contents:
        parts = [p for p in _parts(content) if isinstance(p, dict)]
        responses = sum(1 for p in parts if "functionResponse" in p)
        if responses != previous_calls and (responses or previous_calls):
            raise Rejected(_COUNTS_DIFFER)
        previous_calls = 0
        if content.get("role") == "model":
            _check_thought_signatures(parts)
            previous_calls = sum(1 for p in parts if "functionCall" in p)
    if previous_calls:
        raise Rejected(_COUNTS_DIFFER)


def _parts(content: Mapping[str, Any]) -> list[Any]:
    parts = content.get("parts")
    return parts if isinstance(parts, list) else []


def _check_thought_signatures(parts: list[dict[str, Any]]) -> None:
    """A signature must sit unchanged on the part it came with; a turn that thought must keep
    the signature of its first call."""
    for part in parts:
        sig = part.get("thoughtSignature")
        if sig is not None and sig != _part_signature(part):
            raise Rejected("Thought signature is not valid.")
    calls = [p for p in parts if "functionCall" in p]
    if calls and any(p.get("thought") for p in parts) and "thoughtSignature" not in calls[0]:
        name = calls[0]["functionCall"].get("name") if isinstance(calls[0]["functionCall"], dict) else ""
        raise Rejected(
            "Function call is missing a thought_signature in functionCall parts. This is required "
            "for tools to work correctly, and missing thought_signature may lead to degraded model "
            f"performance. Additional data, function call `default_api:{name}` , position "
            f"{parts.index(calls[0]) + 1}. Please refer to "
            "https://ai.google.dev/gemini-api/docs/thought-signatures for more details."
        )


def _check_declarations(body: Mapping[str, Any]) -> None:
    tools = body.get("tools")
    for k, tool in enumerate(tools if isinstance(tools, list) else []):
        declarations = tool.get("functionDeclarations") if isinstance(tool, dict) else None
        for d, declaration in enumerate(declarations if isinstance(declarations, list) else []):
            if not isinstance(declaration, dict) or not declaration.get("name"):
                where = f"tools[{k}].function_declarations[{d}]"
                raise Rejected(f"* GenerateContentRequest.{where}.name: Name cannot be empty.")
    config = body.get("toolConfig")
    calling = config.get("functionCallingConfig") if isinstance(config, dict) else None
    mode = calling.get("mode") if isinstance(calling, dict) else None
    if mode is not None and mode not in _MODES:
        raise Rejected(
            "Invalid value at 'tool_config.function_calling_config.mode' "
            f'(type.googleapis.com/google.ai.generativelanguage.v1beta.FunctionCallingConfig.Mode), "{mode}"'
        )


def _content_parts(thinking: str | None, text: str, calls: Sequence[NativeCall]) -> list[dict[str, Any]]:
    """A thought part, text, then functionCall parts; with thinking, the first call (or the text
    when there is no call) carries the thoughtSignature. Gemini gives a call no id of its own."""
    parts: list[dict[str, Any]] = [{"text": thinking, "thought": True}] if thinking is not None else []
    if text:
        parts.append({"text": text})
    for call in calls:
        function_call: dict[str, Any] = {"name": call.name}
        if call.id is not None:
            function_call["id"] = call.id
        arguments = native.arguments_object(call)
        if arguments:  # Gemini leaves `args` out of a call without arguments
            function_call["args"] = arguments
        parts.append({"functionCall": function_call})
    signed = next((p for p in parts if "functionCall" in p), None) or (parts[-1] if text else None)
    if thinking is not None and signed is not None:
        signed["thoughtSignature"] = _part_signature(signed)
    return parts


def _part_signature(part: Mapping[str, Any]) -> str:
    """Signs the part itself (its signature aside), so one moved to another part fails."""
    signed = {k: v for k, v in part.items() if k != "thoughtSignature"}
    return native.signature(orjson.dumps(signed, option=orjson.OPT_SORT_KEYS).decode())


# ---------------------------------------------------------------------------- success


def _success(a: Answer) -> dict[str, Any]:
    # Google leaves out what is empty or zero: no parts when nothing was emitted
    # (the wire sample gemini_max_tokens_no_parts), no zero token counts.
    parts = _content_parts(a.thinking, a.text, a.calls)
    return _response(a, parts, _finish_reason(a), a.output_tokens)


def _response(
    a: Answer, parts: list[dict[str, Any]], finish: str | None, output_tokens: int
) -> dict[str, Any]:
    """A GenerateContentResponse: the whole answer, or one chunk of its stream (`finish` None
    before the last, `output_tokens` the visible tokens so far)."""
    content: dict[str, Any] = {"parts": parts, "role": "model"} if parts else {"role": "model"}
    candidate: dict[str, Any] = {"content": content, "finishReason": finish, "index": 0}
    if finish is None:
        del candidate["finishReason"]
    return {
        "candidates": [candidate],
        "usageMetadata": _usage(a, output_tokens),
        "modelVersion": a.model,
        "responseId": f"sim{a.seq:016x}",
    }


def _finish_reason(a: Answer) -> str:
    # A function call ends with STOP on this wire, not a tool reason.
    return "STOP" if a.finish_reason == "stop" or a.calls else "MAX_TOKENS"


def _usage(a: Answer, output_tokens: int) -> dict[str, Any]:
    prompt = a.input_tokens + a.cached_tokens
    usage: dict[str, Any] = {"promptTokenCount": prompt}
    if output_tokens:
        usage["candidatesTokenCount"] = output_tokens
    usage["totalTokenCount"] = prompt + output_tokens + a.reasoning_tokens
    if a.cached_tokens:
        usage["cachedContentTokenCount"] = a.cached_tokens
    if a.reasoning_tokens:
        usage["thoughtsTokenCount"] = a.reasoning_tokens
    return usage


# ---------------------------------------------------------------------------- streaming


def _chunks(a: Answer) -> list[dict[str, Any]]:
    """One part per chunk: the thought and the text a token at a time, each function call whole
    (with its thoughtSignature). The last chunk carries the finish reason and an empty text part,
    which holds the thoughtSignature when the text is what is signed; a turn with no parts ends
    on a chunk with none. Each chunk's usage counts the visible tokens so far (thoughts come
    first, counted whole), the last one the answer's."""
    whole = _content_parts(a.thinking, a.text, a.calls)
    streamed: list[tuple[dict[str, Any], int]] = []  # a part, and the visible tokens it adds
    closing: dict[str, Any] = {"text": ""}
    for part in whole:
        if "functionCall" in part:
            streamed.append((part, 1))
            continue
        if "thoughtSignature" in part:
            closing["thoughtSignature"] = part["thoughtSignature"]
        thought = {"thought": True} if part.get("thought") else {}
        # An empty thought is still a part (text is never empty here).
        texts = pieces(part["text"]) or [""]
        streamed.extend(({"text": piece, **thought}, 0 if thought else 1) for piece in texts)
    chunks: list[dict[str, Any]] = []
    emitted = 0
    for part, tokens in streamed:
        emitted = min(emitted + tokens, a.output_tokens)
        chunks.append(_response(a, [part], None, emitted))
    chunks.append(_response(a, [closing] if whole else [], _finish_reason(a), a.output_tokens))
    return chunks


# ---------------------------------------------------------------------------- errors

# Default (status, message) per HTTP status. `{model}` is filled in.
_BY_STATUS: dict[int, tuple[str, str]] = {
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


def _error(spec: ErrorSpec, model: str) -> bytes:
    return orjson.dumps(_error_body(spec, model), option=orjson.OPT_INDENT_2)


def _error_body(spec: ErrorSpec, model: str) -> dict[str, Any]:
    default_status, template = by_status(_BY_STATUS, spec.status)
    error = {
        "code": spec.status,
        "message": spec.message or default_message(template, model),
        "status": spec.error_type or default_status,
        "details": _error_details(spec),
    }
    return {"error": error}


def _error_details(spec: ErrorSpec) -> list[dict[str, Any]]:
    """Google's typed details: the quota that ran out, then how long to wait."""
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
    return details
