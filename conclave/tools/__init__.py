"""The tools a panel member may use mid-answer, `fetch` and `verify`, behind one registry.

Each tool's module is imported on its first use: most calls use neither tool, and the two
with what they import would otherwise load into every process and slow `conclave serve`'s
start-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conclave.app.catalog import TOOLS, Invocation
from conclave.tools.context import ToolContext
from conclave.tools.registry import ToolRegistry

__all__ = ["ToolContext", "ToolRegistry", "build_registry", "run_fetch", "run_verify"]


async def run_fetch(args: Mapping[str, Any], invocation: Invocation) -> dict[str, Any]:
    from conclave.tools.fetch import fetch

    return await fetch(args, invocation.context)


async def run_verify(args: Mapping[str, Any], _invocation: Invocation) -> dict[str, Any]:
    from conclave.tools.verify import run_verify as verify

    return await verify(args)


def build_registry() -> ToolRegistry:
    """The worker tools, as the catalog lists them."""
    return ToolRegistry(tool for tool in TOOLS if tool.worker)
