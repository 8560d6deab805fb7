"""The provider wire formats behind one front, as pure functions: route a path, parse a request,
render a reply or an error. Each wire is its module under `conclave/app/sim/kinds/` (OpenAI Chat
Completions, Anthropic Messages, Gemini generateContent; the facts: docs/providers.md), down to
the body layout each provider really uses; this module dispatches by kind through
`kinds.WIRES` and holds what is the same on every wire. No I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from conclave.app.sim import native
from conclave.app.sim.kinds import WIRES
from conclave.app.sim.kinds.base import (
    LABEL,
    Answer,
    ErrorSpec,
    ParsedRequest,
    StreamAsk,
    WireError,
    invalid,
)
from conclave.app.sim.recording import Kind

# What the server reads from here, wherever it is defined.
__all__ = [
    "LABEL",
    "Answer",
    "ErrorSpec",
    "ParsedRequest",
    "StreamAsk",
    "WireError",
    "encode",
    "error_body",
    "estimate_input_tokens",
    "estimate_output_tokens",
    "invalid_json",
    "parse_request",
    "request_id",
    "response_headers",
    "route",
    "stream_error_frame",
    "stream_error_status",
    "stream_frames",
    "stream_headers",
    "stream_unsupported",
    "success_body",
    "tools_unsupported",
    "without_answer",
]


# Each wire's path search, whether its path names a model and whether it can ask for a stream:
# looked up once, not per request (the panel serves benchmarks on the same cores as what they
# measure).
_ROUTES = tuple(
    (kind, w.api_path.search, "model" in w.api_path.groupindex, "stream" in w.api_path.groupindex)
    for kind, w in WIRES.items()
)


def route(path: str) -> tuple[Kind, str | None, bool] | None:
    """Which wire a path speaks (by its end, so any prefix works), the model it names, and
    whether the path itself asks for a stream (Gemini's `:streamGenerateContent`)."""
    for kind, search, names_model, streams in _ROUTES:
        match = search(path)
        if match is not None:
            return kind, match["model"] if names_model else None, streams and match["stream"] is not None
    return None


def estimate_input_tokens(chars: int) -> int:
    return max(1, chars // 4)


def estimate_output_tokens(text: str) -> int:
    # Nothing emitted costs nothing: Gemini then omits candidatesTokenCount.
    return max(1, len(text) // 4) if text else 0


def invalid_json(kind: Kind) -> ErrorSpec:
    return ErrorSpec(400, message=LABEL + WIRES[kind].invalid_json)


def parse_request(
    kind: Kind,
    body: Any,
    *,
    path_model: str | None,
    headers: Mapping[str, str],
    stream_query: Mapping[str, str] | None = None,
) -> ParsedRequest:
    """Validate a decoded body like the real API would; `WireError` if it would refuse it.
    `stream_query`: the query string of a path that asks for a stream, else None."""
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.")
    try:
        return WIRES[kind].parse(body, path_model, headers, stream_query)
    except native.Rejected as exc:
        raise invalid(str(exc), param=exc.param) from None


def tools_unsupported(model: str) -> ErrorSpec:
    """How a server without tool support refuses declarations (Ollama's words)."""
    return ErrorSpec(400, message=f"{LABEL}{model} does not support tools")


def success_body(kind: Kind, answer: Answer) -> dict[str, Any]:
    return WIRES[kind].success(answer)


def stream_frames(kind: Kind, answer: Answer, ask: StreamAsk, *, answerless: bool = False) -> list[bytes]:
    return WIRES[kind].stream(answer, ask, answerless)


def stream_error_status(kind: Kind, status: int) -> int:
    """The status of the error a `stream_error` fault reports: the reply's own, else the wire's."""
    return status if status != 200 else WIRES[kind].stream_error_status


def stream_error_frame(kind: Kind, spec: ErrorSpec, model: str, ask: StreamAsk) -> bytes:
    return WIRES[kind].stream_error(spec, model, ask)


def stream_headers(kind: Kind, seq: int, ask: StreamAsk) -> dict[str, str]:
    return WIRES[kind].stream_headers(seq, ask)


def stream_unsupported(kind: Kind, model: str) -> ErrorSpec:
    return WIRES[kind].stream_unsupported(model)


def without_answer(kind: Kind, body: dict[str, Any]) -> dict[str, Any]:
    """The same envelope minus the part that carries the answer (the missing_fields fault)."""
    key = WIRES[kind].answer_field
    return {k: v for k, v in body.items() if k != key}


def encode(body: Mapping[str, Any]) -> bytes:
    return orjson.dumps(body)


def error_body(kind: Kind, spec: ErrorSpec, *, model: str, request_id: str | None) -> bytes:
    return WIRES[kind].error(spec, model, request_id)


def request_id(kind: Kind, seq: int) -> str | None:
    return WIRES[kind].request_id(seq)


def response_headers(kind: Kind, seq: int, status: int) -> dict[str, str]:
    return WIRES[kind].headers(seq, status)
