"""Every tool, once: what it is called, how it presents itself, its schemas, and where its
behaviour lives. The server, the worker tool registry and the CLI all read `TOOLS`.

Adding a tool is one `ToolSpec` below, its two files `schemas/<name>.input.json` and
`schemas/<name>.output.json`, and the module its handler and renderer live in. Handlers and
renderers are named by dotted path and imported on first use, so this module imports nothing
heavy: a starting server answers `initialize` and `tools/list` from it before the runtime
loads, and a `confer` never imports the fetch or verify modules.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from conclave.core.errors import UnknownTool
from conclave.schema.schemas import check_arguments, dereferenced, load_schema

if TYPE_CHECKING:
    from conclave.app.runtime import Runtime
    from conclave.deliberation.session import ProgressSink
    from conclave.tools.context import ToolContext

Handler = Callable[[Mapping[str, Any], "Invocation"], Awaitable[dict[str, Any]]]
Renderer = Callable[[Mapping[str, Any]], str]


@dataclass(frozen=True, slots=True)
class Invocation:
    """What a handler is handed besides its arguments. A panel member's inner tool call has only
    the tool context; the server and the CLI also hand over the runtime and a progress sink."""

    context: ToolContext
    runtime: Runtime | None = None
    progress: ProgressSink | None = None

    def require_runtime(self) -> Runtime:
        if self.runtime is None:
            raise RuntimeError("this tool runs only where a whole runtime is at hand (server, CLI)")
        return self.runtime


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    title: str
    description: str
    annotations: Mapping[str, Any]
    handler_path: str  # "module:function", a Handler
    renderer_path: str  # "module:function", the text of a result (MCP `content`, the worker's view)
    worker: bool = False  # panel members may call it mid-answer (`worker_tools`)

    @property
    def input_schema(self) -> dict[str, Any]:
        return load_schema(f"{self.name}.input.json")

    @property
    def output_schema(self) -> dict[str, Any]:
        """The result's schema self-contained, the shapes it names in `schemas/defs/` inlined:
        `tools/list` hands it to clients whole. Built once; not to be changed."""
        return dereferenced(f"{self.name}.output.json")

    def validate(self, args: Any) -> None:
        """Raise InvalidArguments with the validator's message and the failing JSON path."""
        check_arguments(f"{self.name}.input.json", args, tool=self.name)

    async def run(self, args: Mapping[str, Any], invocation: Invocation) -> dict[str, Any]:
        """Run on arguments the caller has validated, with the call's session bound to every
        event it emits."""
        from conclave.obs.telemetry import session  # structlog: not for `--help` or `tools/list`

        handler = cast(Handler, _load(self.handler_path))
        session_id = args.get("session_id")
        if not isinstance(session_id, str):
            return await handler(args, invocation)
        with session(session_id):
            return await handler(args, invocation)

    def render(self, result: Mapping[str, Any]) -> str:
        return cast(Renderer, _load(self.renderer_path))(result)


def _load(path: str) -> Any:
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


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
    ToolSpec(
        name="fetch",
        title="Fetch a web page",
        description=(
            "Fetch one http(s) URL and return its readable text (HTML reduced to text; JSON and plain "
            "text as sent). Private, loopback and cloud-metadata addresses are refused, redirects are "
            "re-checked, and the body is capped."
        ),
        annotations={
            "readOnlyHint": True,
            "destructiveHint": False,
            "idempotentHint": True,
            "openWorldHint": True,
        },
        handler_path="conclave.tools:run_fetch",
        renderer_path="conclave.tools.fetch:render_fetch",
        worker=True,
    ),
    ToolSpec(
        name="verify",
        title="Run deterministic checks",
        description=(
            "Run deterministic checks with no network and no eval: regex, json_schema, math "
            "(+ - * / // % ** and parentheses over numbers), equals, contains, json_parse. "
            "Returns whether all passed and a result per check."
        ),
        annotations={
            "readOnlyHint": True,
            "destructiveHint": False,
            "idempotentHint": True,
            "openWorldHint": False,
        },
        handler_path="conclave.tools:run_verify",
        renderer_path="conclave.tools.verify:render_verify",
        worker=True,
    ),
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
