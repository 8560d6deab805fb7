"""The tools a caller or a worker may use: `fetch` and `verify`, behind one registry."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conclave.tools.context import ToolContext
from conclave.tools.fetch import fetch, render_fetch
from conclave.tools.registry import Tool, ToolRegistry
from conclave.tools.verify import render_verify, run_verify

__all__ = ["Tool", "ToolContext", "ToolRegistry", "build_registry"]

FETCH = Tool(
    name="fetch",
    title="Fetch a web page",
    description=(
        "Fetch one http(s) URL and return its readable text (HTML reduced to text; JSON and plain "
        "text as sent). Private, loopback and cloud-metadata addresses are refused, redirects are "
        "re-checked, and the body is capped."
    ),
    handler=fetch,
    render=render_fetch,
    annotations={
        "title": "Fetch a web page",
        "readOnlyHint": True,
        "destructiveHint": False,
        "idempotentHint": True,
        "openWorldHint": True,
    },
)


async def _verify(args: Mapping[str, Any], _ctx: ToolContext) -> dict[str, Any]:
    return await run_verify(args)


VERIFY = Tool(
    name="verify",
    title="Run deterministic checks",
    description=(
        "Run deterministic checks with no network and no eval: regex, json_schema, math "
        "(+ - * / // % ** and parentheses over numbers), equals, contains, json_parse. "
        "Returns whether all passed and a result per check."
    ),
    handler=_verify,
    render=render_verify,
    annotations={
        "title": "Run deterministic checks",
        "readOnlyHint": True,
        "destructiveHint": False,
        "idempotentHint": True,
        "openWorldHint": False,
    },
)


def build_registry() -> ToolRegistry:
    return ToolRegistry([FETCH, VERIFY])
