"""OpenAI Chat Completions wire, also spoken by xAI, Mistral, Groq, DeepSeek, OpenRouter,
Ollama, vLLM and llama.cpp. Only mapping lives here, and what the kind can do (`KIND`); the
facts are in docs/providers.md#openai-compatible-wire."""

from __future__ import annotations

import copy
import re
from functools import lru_cache
from typing import Any, ClassVar, NoReturn

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
    event_json,
    event_stream,
    header_text,
    in_stream_status,
    names_streaming,
)
from conclave.providers.streaming import Delta, StreamFailed
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

    def stream_endpoint(self, entry: ProviderConfig, key: str | None) -> Endpoint:
        return event_stream(self.endpoint(entry, key))

    def stream_body(self, request: CompletionRequest, entry: ProviderConfig) -> dict[str, Any]:
        # Without include_usage the stream carries no usage at all (Groq's comes regardless).
        return {**self.body(request, entry), "stream": True, "stream_options": {"include_usage": True}}

    def assembler(self, entry: ProviderConfig) -> OpenAIStream:
        return OpenAIStream()

    def refuses_stream(self, status: int, details: ErrorDetails) -> bool:
        return names_streaming(status, details)


# What of a chunk's top level the plain body has too: the first chunk's id and created, the model
# and fingerprint (the same on every chunk), OpenAI's service tier.
_CHUNK_HEAD = ("id", "created", "model", "system_fingerprint", "service_tier")
# The delta's text fields, concatenated: the answer, a structured-output refusal, and the
# reasoning as DeepSeek (`reasoning_content`) and Groq, OpenRouter, Ollama (`reasoning`) send it.
_DELTA_TEXT = ("content", "refusal", "reasoning_content", "reasoning")
# What a `reasoning_details` entry (OpenRouter) grows by from one chunk to the next; its other
# fields (type, format, signature, data, id) are the last ones sent.
_DETAIL_TEXT = ("text", "summary")
# A tool call delta's own fields; any other is kept as the call's last value.
_CALL_FIELDS = frozenset({"index", "id", "type", "function"})


class OpenAIStream:
    """A `chat.completion.chunk` stream rebuilt into the `chat.completion` body of the same answer
    (docs/providers.md#reading-streams). `data: [DONE]` ends it. Only choice 0 is read, as
    `parse` reads only it; usage is the last chunk's that has one (the `choices: []` chunk of
    `include_usage`, Groq's finish chunk, or every chunk on some servers), else Groq's
    `x_groq.usage`. A chunk with a top-level `error` (OpenRouter, Groq's `event: error`) fails the
    stream."""

    def __init__(self) -> None:
        self._head: dict[str, Any] = {}
        self._groq: dict[str, Any] = {}
        self._role: str | None = None
        self._content: str | None = None  # what the stream gave for content before any text
        self._content_given = False
        self._text: dict[str, list[str]] = {}
        self._calls: dict[int, dict[str, Any]] = {}
        self._details: list[dict[str, Any]] = []
        self._finish: str | None = None
        self._usage: dict[str, Any] | None = None
        self._answered = False  # a choice came: a stream without one rebuilds a body without one
        self._done = False

    @property
    def complete(self) -> bool:
        return self._done

    def feed(self, event: str, data: str) -> list[Delta]:
        if data.strip() == "[DONE]":
            self._done = True
            return []
        chunk = event_json(data)
        error = chunk.get("error")
        if error or event == "error":
            _fail(error if error is not None else chunk)
        for key in _CHUNK_HEAD:
            if chunk.get(key) is not None and (key not in self._head or key not in ("id", "created")):
                self._head[key] = chunk[key]
        groq = chunk.get("x_groq")
        if isinstance(groq, dict):
            self._groq.update(groq)
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        deltas: list[Delta] = []
        for choice in chunk.get("choices") or []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                self._answered = True
                deltas += self._choice(choice)
        return deltas

    def _choice(self, choice: dict[str, Any]) -> list[Delta]:
        if choice.get("finish_reason") is not None:
            self._finish = choice["finish_reason"]
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return []
        if isinstance(delta.get("role"), str):
            self._role = delta["role"]
        deltas: list[Delta] = []
        content = delta.get("content")
        if isinstance(content, list):  # magistral's blocks: the text counts, the thinking is shown
            for block in content:
                deltas += self._block(block)
        elif "content" in delta and (content is None or isinstance(content, str)):
            # "" where the server writes "" on a turn without text (Mistral), null where null (OpenAI)
            self._content = content if self._content is None else self._content
            self._content_given = True
        for field in _DELTA_TEXT:
            piece = delta.get(field)
            if isinstance(piece, str) and piece:
                self._text.setdefault(field, []).append(piece)
        if isinstance(delta.get("content"), str) and delta["content"]:
            deltas.append(Delta("text", delta["content"]))
        # A server that sends both reasoning fields sends the same thought in each: shown once.
        thought = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(thought, str) and thought:
            deltas.append(Delta("thinking", thought))
        for detail in delta.get("reasoning_details") or []:
            if isinstance(detail, dict):
                self._detail(detail)
        for call in delta.get("tool_calls") or []:
            if isinstance(call, dict):
                deltas += self._call(call)
        return deltas

    def _block(self, block: Any) -> list[Delta]:
        if not isinstance(block, dict):
            return []
        if block.get("type") == "text" and isinstance(block.get("text"), str) and block["text"]:
            self._text.setdefault("content", []).append(block["text"])
            return [Delta("text", block["text"])]
        if block.get("type") == "thinking":
            inner = block.get("thinking")
            pieces = inner if isinstance(inner, list) else [{"text": inner}]
            thought = "".join(str(p.get("text") or "") for p in pieces if isinstance(p, dict))
            return [Delta("thinking", thought)] if thought else []
        return []

    def _detail(self, detail: dict[str, Any]) -> None:
        index = detail.get("index")
        same = next((d for d in self._details if index is not None and d.get("index") == index), None)
        if same is None:
            self._details.append(dict(detail))
            return
        for key, value in detail.items():
            if key in _DETAIL_TEXT and isinstance(value, str) and isinstance(same.get(key), str):
                same[key] += value
            elif value is not None:
                same[key] = value

    def _call(self, call: dict[str, Any]) -> list[Delta]:
        index = call.get("index")
        if not isinstance(index, int):  # a server that numbers no calls: a new id is a new call
            known = any(c["id"] == call.get("id") for c in self._calls.values())
            index = len(self._calls) if call.get("id") and not known else max(self._calls, default=0)
        function = call.get("function")
        if not isinstance(function, dict):
            function = {}
        arguments = function.get("arguments")
        if isinstance(arguments, dict):
            arguments = orjson.dumps(arguments).decode()
        fragment = arguments if isinstance(arguments, str) else ""
        slot = self._calls.get(index)
        if slot is not None and slot["id"] and call.get("id") and call["id"] != slot["id"]:
            index, slot = max(self._calls) + 1, None  # parallel calls all numbered 0 by a server
        first = slot is None
        if slot is None:
            slot = self._calls[index] = {"id": None, "type": None, "name": None, "arguments": [], "more": {}}
        # The id, type and name come whole with the call's first delta; some servers repeat them.
        given = {"id": call.get("id"), "type": call.get("type"), "name": function.get("name")}
        for key, value in given.items():
            if slot[key] is None and isinstance(value, str) and value:
                slot[key] = value
        if fragment:
            slot["arguments"].append(fragment)
        # What else a call carries (Gemini's OpenAI-compatible endpoint: the thought signature in
        # `extra_content`, which must go back with it).
        slot["more"].update((k, v) for k, v in call.items() if k not in _CALL_FIELDS and v is not None)
        if first:
            return [Delta("tool_call", fragment, index=index, name=slot["name"])]
        return [Delta("tool_call", fragment, index=index)] if fragment else []

    def body(self) -> dict[str, Any]:
        text = {field: "".join(pieces) for field, pieces in self._text.items()}
        calls = [_wire_call(self._calls[i]) for i in sorted(self._calls)]
        message: dict[str, Any] = {"role": self._role or "assistant"}
        if "content" in text or self._content_given:
            # The text, else what the stream said of it: OpenAI's null on a turn that only calls
            # tools or refuses, the "" of an empty answer or of a server that writes "" there.
            message["content"] = text.get("content", self._content)
        elif not calls:
            message["content"] = ""
        if calls:
            message["tool_calls"] = calls
        for field in ("refusal", "reasoning_content", "reasoning"):
            if field in text:
                message[field] = text[field]
        if self._details:
            message["reasoning_details"] = [dict(d) for d in self._details]
        body: dict[str, Any] = {k: self._head[k] for k in ("id",) if k in self._head}
        body["object"] = "chat.completion"
        body.update({k: v for k, v in self._head.items() if k != "id"})
        if self._answered:
            body["choices"] = [{"index": 0, "message": message, "finish_reason": self._finish}]
        usage = self._usage if self._usage is not None else self._groq.get("usage")
        if isinstance(usage, dict):
            body["usage"] = dict(usage)
        if self._groq:
            body["x_groq"] = dict(self._groq)
        return body


def _wire_call(slot: dict[str, Any]) -> dict[str, Any]:
    """A call as a plain message's `tool_calls` holds it; no `id` or `type` where the stream gave
    none (Mistral's calls have no type, and go back as they came)."""
    call: dict[str, Any] = {}
    if slot["id"] is not None:
        call["id"] = slot["id"]
    if slot["type"] is not None:
        call["type"] = slot["type"]
    call["function"] = {"name": slot["name"] or "", "arguments": "".join(slot["arguments"])}
    return {**call, **slot["more"]}


def _fail(error: Any) -> NoReturn:
    """An in-stream error: its `code` (OpenRouter) or `status_code` (Groq) when it is a status."""
    err = error if isinstance(error, dict) else {"message": str(error)}
    code = err.get("code")
    status = in_stream_status(code if isinstance(code, int) else err.get("status_code"))
    raise StreamFailed(status, {"error": err})


KIND = KindSpec(
    OpenAIAdapter(),
    native_tools=True,
    structured_output=True,
    streaming=True,
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
