"""Every tool, once: what it is called, how it presents itself, its schemas, and where its
behaviour lives. The server and the CLI read `TOOLS`; the worker tool registry reads the part of
it panel members may call (`conclave.tools.spec.WORKER_TOOLS`, defined with the tools).

Adding a tool is one `ToolSpec` (here, or in `conclave/tools/spec.py` for a worker tool), its
two files `schemas/<name>.input.json` and `schemas/<name>.output.json`, and the module its
handler and renderer live in. Handlers and renderers are named by dotted path and imported on
first use, so this module imports nothing heavy: a starting server answers `initialize` and
`tools/list` from it before the runtime loads, and a `confer` never imports the fetch or verify
modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from conclave.core.errors import UnknownTool
from conclave.tools.spec import FETCH, VERIFY, ToolInvocation, ToolSpec

if TYPE_CHECKING:
    from conclave.app.runtime import Runtime
    from conclave.deliberation.session import DeltaSink, ProgressSink

__all__ = ["TOOLS", "TOOL_NAMES", "Invocation", "ToolSpec", "handler_modules", "tool_spec"]


@dataclass(frozen=True, slots=True)
class Invocation(ToolInvocation):
    """What the server and the CLI hand a handler: the tool context, and the runtime, a progress
    sink and a delta sink, which `confer`, `coordinate` and `list_providers` need."""

    runtime: Runtime | None = None
    progress: ProgressSink | None = None
    deltas: DeltaSink | None = None  # hears the answers as they stream in (a terminal, MCP progress)

    def require_runtime(self) -> Runtime:
        if self.runtime is None:
            raise RuntimeError("this tool runs only where a whole runtime is at hand (server, CLI)")
        return self.runtime


def handler_modules() -> tuple[str, ...]:
    """The modules every handler lives in: what a starting server loads in the background."""
    return tuple(dict.fromkeys(spec.handler_path.partition(":")[0] for spec in TOOLS))


def tool_spec(name: str) -> ToolSpec:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnknownTool(f"unknown tool {name!r}; known tools: {', '.join(TOOL_NAMES)}") from None


TOOLS = (
    ToolSpec(
        name="confer",
        title="Ask the panel",
        description=(
            "Ask every provider in the panel the same question in parallel and get every answer back, "
            "each with its status, usage and cost. One provider failing never fails the call; a partial "
            "result is flagged degraded. Optionally let panel members fetch evidence or run checks "
            "(worker_tools)."
        ),
        annotations={"readOnlyHint": True, "openWorldHint": True, "idempotentHint": False},
        handler_path="conclave.app.server.handlers:run_confer",
        renderer_path="conclave.app.server.handlers:render_confer",
    ),
    ToolSpec(
        name="coordinate",
        title="Run a structured debate",
        description=(
            "Run a structured debate: a proposer answers, critics review the proposal independently and "
            "in parallel, and a synthesizer combines them into a final answer with what was resolved and "
            "what remains in dissent. 1-3 rounds; the synthesizer falls back to another provider if it "
            "fails."
        ),
        annotations={"readOnlyHint": True, "openWorldHint": True, "idempotentHint": False},
        handler_path="conclave.app.server.handlers:run_coordinate",
        renderer_path="conclave.app.server.handlers:render_coordinate",
    ),
    FETCH,
    VERIFY,
    ToolSpec(
        name="list_providers",
        title="List providers",
        description=(
            "Every configured provider: kind, model, whether its key is present (never the key), whether "
            "it is in the default panel, its debate roles, whether its price is known, and its breaker "
            "state."
        ),
        annotations={"readOnlyHint": True, "openWorldHint": False, "idempotentHint": True},
        handler_path="conclave.app.server.handlers:run_list_providers",
        renderer_path="conclave.app.server.handlers:render_providers",
    ),
)
"""In the order `tools/list` shows them."""

TOOL_NAMES = tuple(tool.name for tool in TOOLS)
_BY_NAME = {tool.name: tool for tool in TOOLS}
