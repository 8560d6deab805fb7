"""A call argument is written in four places that must agree: the tool's input schema, its typed
request, the Python API's keywords and the command line's options."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from conclave.app.api import Conclave
from conclave.app.cli import build_parser, deliberation_arguments
from conclave.deliberation.requests import (
    ConferRequest,
    CoordinateRequest,
    request_fields,
    request_from,
)
from conclave.schema.schemas import load_schema

REQUESTS = {"confer": ConferRequest, "coordinate": CoordinateRequest}

# Every option of each command, so that the arguments it gives are every argument it can give.
EVERY_OPTION = {
    "confer": [
        *("confer", "Which queue?", "--providers", "a,b", "--system", "S", "--review", "--synthesize"),
        *("--choices", "SQS,Kafka", "--vote-fields", "reason", "--tolerance", "0.1"),
        *("--quorum", "2", "--grace", "0.5", "--on-partial", "error"),
    ],
    "coordinate": [
        "coordinate",
        "Design it.",
        *("--proposer", "a", "--critics", "b,c", "--synthesizer", "d", "--rounds", "2", "--all-rounds"),
        *("--choices", "SQS,Kafka", "--quorum", "1", "--grace", "0.5"),
    ],
}
CALL_OPTIONS = [
    *("--context", "C", "--worker-tools", "fetch,verify", "--cost-cap", "0.5", "--cost-cap-mode", "enforce"),
    *("--worker-tool-mode", "tags", "--timeout", "30", "--max-tokens", "99", "--temperature", "0.2"),
    *("--session", "s-1", "--follow-up", "s-0", "--dry-run"),
]


def properties(tool: str) -> set[str]:
    return set(load_schema(f"{tool}.input.json")["properties"])


@pytest.mark.parametrize("tool", REQUESTS)
def test_the_typed_request_holds_exactly_the_input_schemas_properties(tool: str) -> None:
    assert set(request_fields(REQUESTS[tool])) == properties(tool)


@pytest.mark.parametrize("tool", REQUESTS)
def test_the_python_api_takes_exactly_the_input_schemas_properties(tool: str) -> None:
    parameters = inspect.signature(getattr(Conclave, tool)).parameters
    keywords = set(parameters) - {"self", "progress", "deltas"}  # callbacks, not arguments
    assert keywords == properties(tool)


@pytest.mark.parametrize("tool", REQUESTS)
def test_the_command_line_gives_every_argument_and_only_those(tool: str) -> None:
    args = build_parser().parse_args([*EVERY_OPTION[tool], *CALL_OPTIONS])
    given = deliberation_arguments(tool, args)  # type: ignore[arg-type]
    assert set(given) == properties(tool)
    request = request_from(REQUESTS[tool], given)
    assert request.worker_tools == ("fetch", "verify") and request.timeout_seconds == 30
    assert request.arguments == given, "the arguments as given are kept for the transcript"


def test_a_request_fills_what_the_caller_left_out_with_the_schemas_defaults() -> None:
    confer = request_from(ConferRequest, {"question": "q"})
    assert (confer.providers, confer.review, confer.dry_run, confer.temperature) == ((), False, False, None)
    debate = request_from(CoordinateRequest, {"task": "t", "stop_when_converged": False, "critics": ["x"]})
    assert (debate.rounds, debate.stop_when_converged, debate.critics) == (1, False, ("x",))
    explicit_null: dict[str, Any] = {"task": "t", "proposer": None}
    assert request_from(CoordinateRequest, explicit_null).proposer is None
