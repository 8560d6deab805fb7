"""The tools a caller or a worker may use: `fetch` and `verify`, behind one registry.

Each tool's module is imported on its first use, as jsonschema and tenacity are: most calls
use neither tool, and the two with what they import (the fetch guard, the HTML reader, the
process pool, decimal and fractions) were ~1.2 MB resident in every process (the F6
peak-memory target counts it) and ~35 ms of `conclave serve` start-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conclave.catalog import FETCH_INFO, VERIFY_INFO
from conclave.tools.context import ToolContext
from conclave.tools.registry import Tool, ToolRegistry

__all__ = ["Tool", "ToolContext", "ToolRegistry", "build_registry", "render_fetch", "render_verify"]


async def _fetch(args: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    from conclave.tools.fetch import fetch

    return await fetch(args, ctx)


def render_fetch(result: Mapping[str, Any]) -> str:
    from conclave.tools.fetch import render_fetch as render

    return render(result)


async def _verify(args: Mapping[str, Any], _ctx: ToolContext) -> dict[str, Any]:
    from conclave.tools.verify import run_verify

    return await run_verify(args)


def render_verify(result: Mapping[str, Any]) -> str:
    from conclave.tools.verify import render_verify as render

    return render(result)


FETCH = Tool(
    name=FETCH_INFO.name,
    title=FETCH_INFO.title,
    description=FETCH_INFO.description,
    handler=_fetch,
    render=render_fetch,
    annotations=FETCH_INFO.annotations,
)


VERIFY = Tool(
    name=VERIFY_INFO.name,
    title=VERIFY_INFO.title,
    description=VERIFY_INFO.description,
    handler=_verify,
    render=render_verify,
    annotations=VERIFY_INFO.annotations,
)


def build_registry() -> ToolRegistry:
    return ToolRegistry([FETCH, VERIFY])
