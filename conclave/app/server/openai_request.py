"""An OpenAI Chat Completions request as a Conclave call (docs/openai-endpoint.md).

The body is checked against `schemas/openai.chat_request.json`, which names every parameter
OpenAI's API takes, so an unknown one is refused; then each parameter is honoured (passed to the
panel), ignored (it cannot change what the panel answers: `user`, `seed`, `top_p`...) or refused
with a 400 naming it (it would change the answer's meaning and Conclave cannot do it: `tools`,
`n > 1`, `stop`...). The messages become the tool's `system`, question and `context`.

Pure: no I/O, no runtime. `openai_compat` serves it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from conclave.core.errors import InvalidArguments
from conclave.schema.schemas import first_error, json_path

REQUEST_SCHEMA = "openai.chat_request.json"
Tool = Literal["confer", "coordinate"]


class OpenAIError(Exception):
    """A refusal in OpenAI's error shape: `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param
        self.extra = dict(extra or {})  # top-level members beside `error` (the `conclave` field)

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return {"error": error, **self.extra}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model name: which tool it runs, and with which of the tool's stages."""

    id: str
    tool: Tool
    council: bool = False  # confer with review and a chair's synthesis
    description: str = ""

    @property
    def synthesizes(self) -> bool:
        """The reply is a synthesizer's (or chair's) envelope, which can stream as prose."""
        return self.tool == "coordinate" or self.council


MODELS: dict[str, ModelSpec] = {
    spec.id: spec
    for spec in (
        ModelSpec("conclave-confer", "confer", description="every panel member's answer, as a digest"),
        ModelSpec(
            "conclave-council",
            "confer",
            council=True,
            description="confer + blind review + a chair's synthesis",
        ),
        ModelSpec("conclave-coordinate", "coordinate", description="proposer -> critics -> synthesizer"),
    )
}


@dataclass(frozen=True, slots=True)
class ChatCall:
    """What a chat request asks of Conclave: the tool, its arguments, and how to reply."""

    model: ModelSpec
    args: dict[str, Any]
    stream: bool = False
    include_usage: bool = False
    structured: bool = False  # response_format json_schema: the content is the decided value as JSON

    @property
    def streams_prose(self) -> bool:
        """The synthesizer's prose goes out as it is written (not for a structured answer: its
        content is the decided value, known only at the end)."""
        return self.stream and self.model.synthesizes and not self.structured


def parse_chat(body: Any) -> ChatCall:
    """The call a request body asks for, or OpenAIError (400, 404) naming what is wrong."""
    _check_schema(body)
    model = MODELS.get(body["model"])
    if model is None:
        raise OpenAIError(
            404,
            f"The model {body['model']!r} does not exist; models: {', '.join(MODELS)} (GET /v1/models)",
            code="model_not_found",
            param="model",
        )
    _refuse_unsupported(body)
    structured, schema = _response_format(body.get("response_format"))
    args = _arguments(model, body, schema)
    stream = bool(body.get("stream"))
    options = body.get("stream_options") or {}
    return ChatCall(model, args, stream, stream and bool(options.get("include_usage")), structured)


def _check_schema(body: Any) -> None:
    error = first_error(REQUEST_SCHEMA, body)
    if error is None:
        return
    path = json_path(error)
    if error.validator == "additionalProperties" and path == "$" and isinstance(body, dict):
        known = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
        unknown = next((k for k in body if k not in known), None)
        raise OpenAIError(400, f"Unrecognized request argument supplied: {unknown}", param=unknown)
    param = path.removeprefix("$").removeprefix(".") or None
    if error.validator == "required" and isinstance(error.instance, dict):  # name the missing one
        required: list[str] = list(error.schema.get("required", [])) if isinstance(error.schema, dict) else []
        missing = [name for name in required if name not in error.instance]
        param = ".".join(p for p in (param, missing[0] if missing else None) if p) or None
    raise OpenAIError(400, f"Invalid request body at {path}: {error.message}", param=param)


# -- what cannot be honoured ----------------------------------------------------------------------

# (parameter, when its value changes the answer, why Conclave refuses it)
_REFUSED: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("n", lambda v: v not in (None, 1), "n > 1 is not supported: each call gives one answer; send it again"),
    ("tools", bool, "tool calling is not supported: the panel's own tools are configured in Conclave"),
    ("functions", bool, "function calling is not supported"),
    ("tool_choice", lambda v: v not in ("none", "auto"), "tool_choice is not supported (no tools)"),
    ("function_call", lambda v: v not in ("none", "auto"), "function_call is not supported (no functions)"),
    ("logprobs", bool, "logprobs are not supported: the answer is a deliberation's, not one model's"),
    ("top_logprobs", bool, "top_logprobs is not supported"),
    ("logit_bias", bool, "logit_bias is not supported: the panel's models have different vocabularies"),
    ("stop", bool, "stop sequences are not supported"),
    ("modalities", lambda v: v not in (None, ["text"]), "only the text modality is supported"),
    ("audio", lambda v: v is not None, "audio output is not supported"),
    ("prediction", lambda v: v is not None, "predicted outputs are not supported"),
    ("web_search_options", lambda _v: True, "web search is not supported"),
    (
        "reasoning_effort",
        lambda v: v is not None,
        "reasoning_effort is set per provider in Conclave's config",
    ),
    ("verbosity", lambda v: v is not None, "verbosity is not supported"),
    ("moderation", lambda _v: True, "moderation is not supported"),
)


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    for name, changes, why in _REFUSED:
        if name in body and changes(body[name]):
            raise OpenAIError(400, why, code="unsupported_parameter", param=name)


def _response_format(fmt: Any) -> tuple[bool, dict[str, Any] | None]:
    """(structured, the answer schema). json_object has no schema to vote on or decide against,
    and Conclave's structured answers need one: it is refused rather than guessed at."""
    kind = fmt.get("type") if isinstance(fmt, dict) else "text"
    if kind == "text":
        return False, None
    if kind == "json_object":
        raise OpenAIError(
            400,
            'response_format {"type": "json_object"} is not supported: give a schema with '
            '{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}',
            code="unsupported_parameter",
            param="response_format",
        )
    schema = fmt.get("json_schema", {}).get("schema")
    if schema is None:
        raise OpenAIError(400, "response_format.json_schema.schema is required", param="response_format")
    return True, schema


# -- the messages -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Turns:
    system: str | None
    question: str
    earlier: tuple[tuple[str, str | None, str], ...]  # (role, name, text) before the question


def _turns(messages: Sequence[Mapping[str, Any]]) -> _Turns:
    systems: list[str] = []
    earlier: list[tuple[str, str | None, str]] = []
    for index, message in enumerate(messages):
        role = message["role"]
        if role in ("tool", "function") or message.get("tool_calls") or message.get("function_call"):
            raise OpenAIError(
                400,
                "tool and function messages are not supported: Conclave offers the client no tools",
                code="unsupported_parameter",
                param=f"messages[{index}]",
            )
        text = _text(message.get("content"), index)
        if role in ("system", "developer"):
            systems.append(text)
        else:
            earlier.append((role, message.get("name"), text))
    if not earlier or earlier[-1][0] != "user" or not earlier[-1][2].strip():
        raise OpenAIError(400, "the last message must be the user's question, not blank", param="messages")
    question = earlier.pop()[2]
    return _Turns("\n\n".join(s for s in systems if s) or None, question, tuple(earlier))


def _text(content: Any, index: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts: list[str] = []
    for number, part in enumerate(content):
        if part["type"] != "text" or not isinstance(part.get("text"), str):
            raise OpenAIError(
                400,
                f"only text content is supported, not {part['type']!r}",
                code="unsupported_parameter",
                param=f"messages[{index}].content[{number}]",
            )
        parts.append(part["text"])
    return "\n".join(parts)


def transcript(earlier: Sequence[tuple[str, str | None, str]]) -> str:
    """The turns before the question, as a reader would want them in the context."""
    lines = ["The conversation so far (the question is its next turn):"]
    for role, name, text in earlier:
        who = "User" if role == "user" else "Assistant"
        lines.append(f"{who}{f' ({name})' if name else ''}: {text}")
    return "\n\n".join(lines)


# -- the tool's arguments ---------------------------------------------------------------------------


def _arguments(model: ModelSpec, body: Mapping[str, Any], schema: dict[str, Any] | None) -> dict[str, Any]:
    turns = _turns(body["messages"])
    context = transcript(turns.earlier) if turns.earlier else None
    args: dict[str, Any]
    if model.tool == "confer":
        args = {"question": turns.question}
        if turns.system is not None:
            args["system"] = turns.system
        if model.council:
            args.update(review=True, synthesize=True)
    else:
        # coordinate takes no system prompt: the caller's instructions lead its context instead.
        args = {"task": turns.question}
        if turns.system is not None:
            context = f"Instructions:\n{turns.system}" + (f"\n\n{context}" if context else "")
    if context is not None:
        args["context"] = context
    limit = _first_set(body, "max_completion_tokens", "max_tokens")
    if limit is not None:
        args["max_tokens"] = limit
    if body.get("temperature") is not None:
        args["temperature"] = body["temperature"]
    if schema is not None:
        args["answer_schema"] = schema
    args.update(body.get("conclave") or {})  # timeout_seconds, session_id: the schema allows no more
    return args


def _first_set(body: Mapping[str, Any], *names: str) -> Any:
    """The newer spelling wins: max_completion_tokens replaced max_tokens in OpenAI's API."""
    return next((body[name] for name in names if body.get(name) is not None), None)


# The tool argument a Conclave refusal names, as the request parameter it came from.
_PARAMS = {
    "question": "messages",
    "task": "messages",
    "context": "messages",
    "system": "messages",
    "max_tokens": "max_tokens",
    "temperature": "temperature",
    "answer_schema": "response_format",
    "timeout_seconds": "conclave.timeout_seconds",
    "session_id": "conclave.session_id",
}


def invalid_arguments(exc: InvalidArguments) -> OpenAIError:
    """Conclave's own InvalidArguments (a schema it cannot use, an argument out of range) as a 400
    naming the request parameter it came from."""
    argument = exc.path.removeprefix("$.").split(".")[0].split("[")[0]
    return OpenAIError(400, f"{exc.path}: {exc.message}", param=_PARAMS.get(argument))
