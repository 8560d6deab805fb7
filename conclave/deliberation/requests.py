"""The arguments of a `confer` or `coordinate` call as typed records.

Every door (the MCP and JSON-RPC server, the Python API, the command line) validates a call's
arguments against `schemas/<tool>.input.json`, then hands them to `confer()` or `coordinate()`,
which build one of these once. Past that point the deliberation reads typed fields, never the
raw mapping. A field the caller left out is None (or the empty or default value the input
schema gives it): the deliberation then falls back to the config. `arguments` keeps the call's
arguments as given, for the transcript.

The field names are the input schema's property names: tests/test_requests.py checks that the
schemas, these records, the Python API's keywords and the command line's options agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypeVar

from conclave.core.errors import InvalidArguments
from conclave.schema.config import CostCapMode, WorkerToolMode

# Arguments that arrive as JSON arrays and are kept as tuples, so a request is immutable.
_SEQUENCES = frozenset({"providers", "critics", "worker_tools", "vote_fields"})


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRequest:
    """The arguments `confer` and `coordinate` share."""

    context: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    timeout_seconds: float | None = None
    session_id: str | None = None
    dry_run: bool = False
    worker_tools: tuple[str, ...] = ()
    worker_tool_cost_cap_usd: float | None = None
    worker_tool_cost_cap_mode: CostCapMode | None = None
    worker_tool_mode: WorkerToolMode | None = None
    answer_schema: Mapping[str, Any] | None = None  # the answer as an object valid against it
    follow_up_of: str | None = None  # a session whose thread this call continues
    arguments: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConferRequest(CallRequest):
    question: str
    system: str | None = None
    providers: tuple[str, ...] = ()
    review: bool = False
    synthesize: bool = False
    vote_fields: tuple[str, ...] = ()
    tolerance: float = 0.0
    quorum: int | None = None  # None: every member
    grace_seconds: float = 5.0
    on_partial: Literal["return", "error"] = "return"


@dataclass(frozen=True, slots=True, kw_only=True)
class CoordinateRequest(CallRequest):
    task: str
    proposer: str | None = None
    critics: tuple[str, ...] = ()
    synthesizer: str | None = None
    rounds: int = 1
    stop_when_converged: bool = True
    quorum: int | None = None  # of the critics, each round; None: every critic
    grace_seconds: float = 5.0


Request = TypeVar("Request", ConferRequest, CoordinateRequest)


def request_from(kind: type[Request], arguments: Mapping[str, Any]) -> Request:
    """The typed request of arguments already valid against the tool's input schema; an
    argument given as JSON null counts as left out."""
    given: dict[str, Any] = {}
    for name in request_fields(kind):
        value = arguments.get(name)
        if value is not None:
            given[name] = tuple(value) if name in _SEQUENCES else value
    return kind(**given, arguments=dict(arguments))


def check_quorum(quorum: int | None, asked: int, tool: str, who: str = "member") -> None:
    """A quorum can be met: at most as many as are asked."""
    if quorum is not None and quorum > asked:
        raise InvalidArguments(
            f"quorum {quorum} is more than the {asked} {who}(s) asked", path="$.quorum", tool=tool
        )


def request_fields(kind: type[CallRequest]) -> tuple[str, ...]:
    """The argument names a request holds (its tool's input schema's properties)."""
    return _FIELDS.get(kind) or _names(kind)


def _names(kind: type[CallRequest]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(kind) if f.name != "arguments")


# Read once: dataclasses.fields() walks a class's fields on every call, and a request is built
# per call.
_FIELDS: dict[type[CallRequest], tuple[str, ...]] = {
    kind: _names(kind) for kind in (ConferRequest, CoordinateRequest)
}
