"""What each tool is called and how it presents itself: name, title, description and MCP
annotations, with no behaviour attached. Kept apart from the handlers (and importing nothing
heavy) so that a server can describe its tools before the HTTP stack is even imported."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class ToolInfo:
    name: str
    title: str
    description: str
    annotations: Mapping[str, Any] = field(default_factory=dict)


FETCH_INFO = ToolInfo(
    name="fetch",
    title="Fetch a web page",
    description=(
        "Fetch one http(s) URL and return its readable text (HTML reduced to text; JSON and plain "
        "text as sent). Private, loopback and cloud-metadata addresses are refused, redirects are "
        "re-checked, and the body is capped."
    ),
    annotations={
        "title": "Fetch a web page",
        "readOnlyHint": True,
        "destructiveHint": False,
        "idempotentHint": True,
        "openWorldHint": True,
    },
)

VERIFY_INFO = ToolInfo(
    name="verify",
    title="Run deterministic checks",
    description=(
        "Run deterministic checks with no network and no eval: regex, json_schema, math "
        "(+ - * / // % ** and parentheses over numbers), equals, contains, json_parse. "
        "Returns whether all passed and a result per check."
    ),
    annotations={
        "title": "Run deterministic checks",
        "readOnlyHint": True,
        "destructiveHint": False,
        "idempotentHint": True,
        "openWorldHint": False,
    },
)

CONFER_INFO = ToolInfo(
    name="confer",
    title="Ask the panel",
    description=(
        "Ask every provider in the panel the same question in parallel and get every answer back, each "
        "with its status, usage and cost. One provider failing never fails the call; a partial result is "
        "flagged degraded. Optionally let panel members fetch evidence or run checks (worker_tools)."
    ),
    annotations={"readOnlyHint": True, "openWorldHint": True, "idempotentHint": False},
)

COORDINATE_INFO = ToolInfo(
    name="coordinate",
    title="Run a structured debate",
    description=(
        "Run a structured debate: a proposer answers, critics review the proposal independently and in "
        "parallel, and a synthesizer combines them into a final answer with what was resolved and what "
        "remains in dissent. 1-3 rounds; the synthesizer falls back to another provider if it fails."
    ),
    annotations={"readOnlyHint": True, "openWorldHint": True, "idempotentHint": False},
)

LIST_PROVIDERS_INFO = ToolInfo(
    name="list_providers",
    title="List providers",
    description=(
        "Every configured provider: kind, model, whether its key is present (never the key), whether it "
        "is in the default panel, and its breaker state."
    ),
    annotations={"readOnlyHint": True, "openWorldHint": False, "idempotentHint": True},
)

# The order `tools/list` shows them in.
SERVER_TOOLS = (CONFER_INFO, COORDINATE_INFO, FETCH_INFO, VERIFY_INFO, LIST_PROVIDERS_INFO)
