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
from conclave.app.sim.kinds.base import LABEL, Answer, ErrorSpec, ParsedRequest, WireError, invalid
from conclave.app.sim.recording import Kind

# What the server reads from here, wherever it is defined.
__all__ = [
    "LABEL",
    "Answer",
    "ErrorSpec",
    "ParsedRequest",
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
    "success_body",
    "tools_unsupported",
    "without_answer",
]


# Each wire's path search, and whether its path names a model: looked up once, not per request
# (the panel serves benchmarks on the same cores as what they measure).
_ROUTES = tuple((kind, w.api_path.search, "model" in w.api_path.groupindex) for kind, w in WIRES.items())


def route(path: str) -> tuple[Kind, str | None] | None:
    """Which wire a path speaks (by its end, so any prefix works), and the model it names."""
    for kind, search, names_model in _ROUTES:
        match = search(path)
        if match is not None:
            return kind, match["model"] if names_model else None
    return None


def estimate_input_tokens(chars: int) -> int:
    return max(1, chars // 4)


def estimate_output_tokens(text: str) -> int:
    # Nothing emitted costs nothing: Gemini then omits candidatesTokenCount.
    return max(1, len(text) // 4) if text else 0


def invalid_json(kind: Kind) -> ErrorSpec:
    return ErrorSpec(400, message=LABEL + WIRES[kind].invalid_json)


def parse_request(
    kind: Kind, body: Any, *, path_model: str | None, headers: Mapping[str, str]
) -> ParsedRequest:
    """Validate a decoded body like the real API would; `WireError` if it would refuse it."""
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.")
    try:
        return WIRES[kind].parse(body, path_model, headers)
    except native.Rejected as exc:
        raise invalid(str(exc), param=exc.param) from None


def tools_unsupported(model: str) -> ErrorSpec:
    """How a server without tool support refuses declarations (Ollama's words)."""
    return ErrorSpec(400, message=f"{LABEL}{model} does not support tools")


def success_body(kind: Kind, answer: Answer) -> dict[str, Any]:
    return WIRES[kind].success(answer)


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
