"""What the server shows of its tools (MCP `tools/list`): each catalog entry's name, title,
description, annotations and its schemas from `schemas/`. Imports nothing heavy, so a starting
server can answer `tools/list` while the runtime is still loading."""

from __future__ import annotations

from typing import Any

from conclave.app.catalog import ToolSpec
from conclave.schema.schemas import dereferenced


def describe(tool: ToolSpec) -> dict[str, Any]:
    """One MCP `tools/list` entry."""
    return {
        "name": tool.name,
        "title": tool.title,
        "description": tool.description,
        "inputSchema": _public(dereferenced(f"{tool.name}.input.json")),  # a shared shape inlined
        "outputSchema": _public(tool.output_schema),
        "annotations": {"title": tool.title, **{k: v for k, v in tool.annotations.items() if k != "title"}},
    }


def _public(schema: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in schema.items() if k != "$id"}
