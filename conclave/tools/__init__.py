"""The tools a caller or a worker may use: `fetch` and `verify`, behind one registry."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conclave.catalog import FETCH_INFO, VERIFY_INFO
from conclave.tools.context import ToolContext
from conclave.tools.fetch import fetch, render_fetch
from conclave.tools.registry import Tool, ToolRegistry
from conclave.tools.verify import render_verify, run_verify

__all__ = ["Tool", "ToolContext", "ToolRegistry", "build_registry", "render_fetch", "render_verify"]

FETCH = Tool(
    name=FETCH_INFO.name,
    title=FETCH_INFO.title,
    description=FETCH_INFO.description,
    handler=fetch,
    render=render_fetch,
    annotations=FETCH_INFO.annotations,
)


async def _verify(args: Mapping[str, Any], _ctx: ToolContext) -> dict[str, Any]:
    return await run_verify(args)


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
