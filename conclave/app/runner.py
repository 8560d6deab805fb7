"""Running one tool in this process, as the command line and the demo do: through its catalog
entry, on arguments the caller has checked, with live progress drawn meanwhile if asked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conclave.app.catalog import Invocation, tool_spec
from conclave.app.render import LiveProgress
from conclave.app.runtime import Runtime


async def run_tool(
    runtime: Runtime, name: str, args: Mapping[str, Any], progress: LiveProgress | None = None
) -> dict[str, Any]:
    tool = tool_spec(name)
    if progress is None:
        return await tool.run(args, Invocation(runtime.tool_context, runtime))
    async with progress.shown():
        return await tool.run(args, Invocation(runtime.tool_context, runtime, progress.sink, progress.heard))
