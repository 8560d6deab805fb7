"""What a tool is (`ToolSpec`), what its handler is handed (`ToolInvocation`), and the two tools
a panel member may call mid-answer, `fetch` and `verify` (`WORKER_TOOLS`). The whole catalog,
with the tools only the server and the CLI run, is `conclave.app.catalog.TOOLS`.

Handlers and renderers are named by dotted path and imported on first use, so this module
imports nothing heavy: a starting server answers `initialize` and `tools/list` from the catalog
before the runtime loads, and a `confer` never imports the fetch or verify modules.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from conclave.schema.schemas import check_arguments, dereferenced, load_schema

if TYPE_CHECKING:
    from conclave.tools.context import ToolContext

Handler = Callable[[Mapping[str, Any], "ToolInvocation"], Awaitable[dict[str, Any]]]
Renderer = Callable[[Mapping[str, Any]], str]


@dataclass(frozen=True, slots=True)
class ToolInvocation:
    """What a handler is handed besides its arguments: a panel member's inner tool call has only
    the tool context. The server and the CLI hand over more (`conclave.app.catalog.Invocation`:
    the runtime and a progress sink)."""

    context: ToolContext


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

    async def run(self, args: Mapping[str, Any], invocation: ToolInvocation) -> dict[str, Any]:
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


FETCH = ToolSpec(
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
    handler_path="conclave.tools.handlers:run_fetch",
    renderer_path="conclave.tools.fetch:render_fetch",
    worker=True,
)
VERIFY = ToolSpec(
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
    handler_path="conclave.tools.handlers:run_verify",
    renderer_path="conclave.tools.verify:render_verify",
    worker=True,
)
WORKER_TOOLS = (FETCH, VERIFY)
"""What `build_registry` offers panel members."""
