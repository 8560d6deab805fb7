"""Google Gemini generateContent wire (docs/providers.md#gemini-wire): `systemInstruction` +
`contents` with roles user/model, the key in `x-goog-api-key` (never the URL), thoughts counted
apart.

Native tools (docs/providers.md#native-tool-calling): declarations as `functionDeclarations`
with `parametersJsonSchema`; calls are `functionCall` parts, whose model turn is repeated
unchanged (thoughtSignature and thought parts included); results go back as one user turn of
`functionResponse` parts.

Structured output (docs/providers.md#structured-output): `responseMimeType: application/json`
with the answer schema as `responseJsonSchema` (plain JSON Schema, as `parametersJsonSchema`);
the reply is the JSON text. Gemini 1.x and 2.x refuse a JSON reply in a request that declares
functions, so there a turn with tools asks for its JSON in the prompt alone."""

from __future__ import annotations

import copy
import re
from typing import Any, ClassVar
from urllib.parse import quote

import orjson

from conclave.core.messages import CompletionRequest, Message, ToolReturn, ToolUse, Usage
from conclave.providers.base import (
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
    in_stream_status,
    names_streaming,
    parse_duration,
)
from conclave.providers.streaming import Delta, StreamFailed
from conclave.schema.config import ProviderConfig
from conclave.schema.strictjson import tool_arguments

_FINISH = {"STOP": "stop", "MAX_TOKENS": "length"}
_FILTERED = frozenset(
    {"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY", "LANGUAGE"}
)
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
_QUOTA_FAILURE = "type.googleapis.com/google.rpc.QuotaFailure"
# Gemini may give a call no id; it then pairs responses with calls by name and order, which the
# tool-result turn keeps. Such a call is named `call-<its index among the turn's calls>`, a name
# never sent back (were a real id of that shape left off, name and order would still pair it).
_MADE_UP_ID = re.compile(r"call-\d+")
# "Function calling with a response mime type: 'application/json' is unsupported" (400): the
# generations before Gemini 3 take a JSON reply or function declarations, not both.
_NO_JSON_WITH_TOOLS = re.compile(r"^gemini-[12][.-]")


class GeminiAdapter:
    kind: ClassVar[str] = "gemini"

    def endpoint(self, entry: ProviderConfig, key: str | None) -> Endpoint:
        headers = {**JSON_HEADERS, **entry.headers}
        if key:
            headers["x-goog-api-key"] = key
        return Endpoint(f"{_model_url(entry)}:generateContent", headers)

    def body(self, request: CompletionRequest, entry: ProviderConfig) -> dict[str, Any]:
        contents = [_content(m) for m in request.messages]
        config: dict[str, Any] = {"maxOutputTokens": request.max_tokens}
        if request.temperature is not None:
            config["temperature"] = request.temperature
        if request.answer_schema is not None and _json_answer(request, entry):
            config["responseMimeType"] = "application/json"
            config["responseJsonSchema"] = request.answer_schema
        body: dict[str, Any] = {"contents": contents, "generationConfig": config}
        if request.system:
            body["systemInstruction"] = {"parts": [{"text": request.system}]}
        if request.tools:
            declarations = [
                {"name": t.name, "description": t.description, "parametersJsonSchema": t.parameters}
                for t in request.tools
            ]
            body["tools"] = [{"functionDeclarations": declarations}]
            if request.tool_choice == "none":
                # The declarations stay so the history's calls remain valid; only new calls are off.
                body["toolConfig"] = {"functionCallingConfig": {"mode": "NONE"}}
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
        uses = _tool_uses(parts)
        # Gemini 3 rejects a call turn whose thoughtSignature is missing or moved: the whole turn
        # goes back as it came, thought parts and all.
        echo = {"role": "model", "parts": copy.deepcopy(parts)} if uses else None
        finish = _finish(candidate.get("finishReason"))
        return ParsedCompletion(text, finish, usage, model, request_id, tool_uses=uses, echo=echo)

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

    def stream_endpoint(self, entry: ProviderConfig, key: str | None) -> Endpoint:
        # alt=sse: server-sent events; without it the stream is one JSON array read as it grows.
        return event_stream(self.endpoint(entry, key), f"{_model_url(entry)}:streamGenerateContent?alt=sse")

    def stream_body(self, request: CompletionRequest, entry: ProviderConfig) -> dict[str, Any]:
        return self.body(request, entry)  # the method in the URL says it all

    def assembler(self, entry: ProviderConfig) -> GeminiStream:
        return GeminiStream()

    def refuses_stream(self, status: int, details: ErrorDetails) -> bool:
        # The stream has its own method: a server without it (a proxy, a compatible server) has no
        # such path, where the plain method's URL would be found.
        return status == 404 or names_streaming(status, details)


class GeminiStream:
    """A streamGenerateContent?alt=sse stream rebuilt into the GenerateContentResponse of the same
    answer (docs/providers.md#reading-streams). Each event is a whole response holding the new
    parts: a text part runs on into the part before when that is text of the same kind (thought
    or not), unless both carry a `thoughtSignature` (which may come on a later, even empty, part);
    other parts (`functionCall`, whole) stand as they come. Every other field of the candidate
    and of the response (`finishReason`, `usageMetadata`, `modelVersion`, `promptFeedback`) is the
    last one sent. A `finishReason`, or a prompt blocked outright, ends the answer; an `error`
    fails the stream."""

    def __init__(self) -> None:
        self._top: dict[str, Any] = {}
        self._candidate: dict[str, Any] | None = None
        self._content: dict[str, Any] | None = None
        self._parts: list[dict[str, Any]] | None = None
        # A text part's pieces by its place in `_parts`, joined once in body(): added to as they
        # came, a long answer would be copied whole at every chunk.
        self._texts: dict[int, list[str]] = {}
        self._calls = 0
        self._done = False

    @property
    def complete(self) -> bool:
        return self._done

    def feed(self, event: str, data: str) -> list[Delta]:
        chunk = event_json(data)
        error = chunk.get("error")
        if error is not None:
            code = error.get("code") if isinstance(error, dict) else None
            raise StreamFailed(in_stream_status(code), chunk)
        self._top.update((key, value) for key, value in chunk.items() if key != "candidates")
        feedback = chunk.get("promptFeedback")
        if isinstance(feedback, dict) and feedback.get("blockReason"):
            self._done = True  # blocked before any answer: no candidates will follow
        candidates = chunk.get("candidates")
        if not isinstance(candidates, list) or not candidates or not isinstance(candidates[0], dict):
            return []
        candidate = candidates[0]
        if self._candidate is None:
            self._candidate = {}
        self._candidate.update((key, value) for key, value in candidate.items() if key != "content")
        if candidate.get("finishReason"):
            self._done = True
        content = candidate.get("content")
        if not isinstance(content, dict):
            return []
        if self._content is None:
            self._content = {}
        self._content.update((key, value) for key, value in content.items() if key != "parts")
        parts = content.get("parts")
        if not isinstance(parts, list):
            return []
        if self._parts is None:
            self._parts = []
        deltas: list[Delta] = []
        for part in parts:
            if isinstance(part, dict):
                deltas += self._part(self._parts, part)
        return deltas

    def _part(self, parts: list[dict[str, Any]], part: dict[str, Any]) -> list[Delta]:
        if isinstance(part.get("functionCall"), dict):
            parts.append(dict(part))
            call = part["functionCall"]
            self._calls += 1
            arguments = orjson.dumps(call.get("args") or {}).decode()
            return [Delta("tool_call", arguments, index=self._calls - 1, name=call.get("name"))]
        if not _is_text(part):
            parts.append(dict(part))
            return []
        text, thought = part["text"], bool(part.get("thought"))
        last = parts[-1] if parts else None
        signed = "thoughtSignature" in part
        if (
            last is not None
            and _is_text(last)
            and bool(last.get("thought")) == thought
            and not (signed and "thoughtSignature" in last)
        ):
            self._texts.setdefault(len(parts) - 1, [last["text"]]).append(text)
            last.update((key, value) for key, value in part.items() if key not in last)
        elif text or signed:  # an empty, unsigned part adds nothing a plain answer would hold
            parts.append(dict(part))
        return [Delta("thinking" if thought else "text", text)] if text else []

    def body(self) -> dict[str, Any]:
        body = dict(self._top)
        if self._candidate is not None:
            candidate = dict(self._candidate)
            if self._content is not None:
                content = dict(self._content)
                if self._parts is not None:
                    content["parts"] = [self._joined(i, part) for i, part in enumerate(self._parts)]
                candidate["content"] = content
            body["candidates"] = [candidate]
        return body


    def _joined(self, index: int, part: dict[str, Any]) -> dict[str, Any]:
        pieces = self._texts.get(index)
        return dict(part) if pieces is None else {**part, "text": "".join(pieces)}


def _is_text(part: dict[str, Any]) -> bool:
    """A part that holds text and nothing else a part can hold (a signature and the thought flag
    aside)."""
    return isinstance(part.get("text"), str) and not any(
        key in part for key in ("functionCall", "functionResponse", "inlineData", "executableCode")
    )


KIND = KindSpec(
    GeminiAdapter(),
    native_tools=True,
    structured_output=True,
    streaming=True,
    cache="implicit",
    otel_name="gcp.gemini",
    answer_field="candidates",
)


def _model_url(entry: ProviderConfig) -> str:
    """The model's URL, named without a `models/` prefix; the method follows it after a colon."""
    model = quote(entry.model.removeprefix("models/"), safe="-._")
    return f"{entry.base_url}/v1beta/models/{model}"


def _json_answer(request: CompletionRequest, entry: ProviderConfig) -> bool:
    """Whether the answer schema goes on the wire: the kind takes one, except in a request that
    declares functions to a model before Gemini 3 (the prompt still asks for the JSON)."""
    return (
        KIND.structured_output
        and entry.structured_output
        and not (request.tools and _NO_JSON_WITH_TOOLS.match(bare_model(entry.model)))
    )


def _content(message: Message) -> dict[str, Any]:
    if message.role == "assistant":
        if message.echo is not None:
            return dict(message.echo)
        return {"role": "model", "parts": _text_parts(message.content) + _call_parts(message.tool_uses)}
    if message.tool_returns:
        parts = [_response_part(r) for r in message.tool_returns] + _text_parts(message.content)
        return {"role": "user", "parts": parts}
    return {"role": "user", "parts": [{"text": message.content}]}


def _text_parts(text: str) -> list[dict[str, Any]]:
    return [{"text": text}] if text else []


def _call_parts(uses: tuple[ToolUse, ...]) -> list[dict[str, Any]]:
    """Calls with no echo to repeat (not read from a Gemini response): rebuilt from their values."""
    parts: list[dict[str, Any]] = []
    for use in uses:
        call: dict[str, Any] = {"name": use.name, "args": dict(use.arguments or {})}
        if (wire_id := _wire_id(use.id)) is not None:
            call["id"] = wire_id
        parts.append({"functionCall": call})
    return parts


def _response_part(result: ToolReturn) -> dict[str, Any]:
    response: dict[str, Any] = {"name": result.name}
    if (wire_id := _wire_id(result.call_id)) is not None:
        response["id"] = wire_id
    response["response"] = {"error" if result.is_error else "output": result.content}
    return {"functionResponse": response}


def _wire_id(call_id: str) -> str | None:
    return None if _MADE_UP_ID.fullmatch(call_id) else call_id


def _tool_uses(parts: list[dict[str, Any]]) -> tuple[ToolUse, ...]:
    calls = [p["functionCall"] for p in parts if isinstance(p.get("functionCall"), dict)]
    return tuple(_tool_use(call, index) for index, call in enumerate(calls))


def _tool_use(call: dict[str, Any], index: int) -> ToolUse:
    # Gemini sends `args` as an object, and leaves it out for a call without arguments.
    arguments, error = tool_arguments(call.get("args"))
    call_id = call.get("id")
    return ToolUse(
        id=call_id if isinstance(call_id, str) and call_id else f"call-{index}",
        name=str(call.get("name") or ""),
        arguments=arguments,
        error=error,
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
