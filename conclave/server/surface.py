"""What the server shows of its tools (MCP `tools/list`): each tool's name, title, description,
annotations and its schemas from `schemas/`. Imports nothing heavy, so a starting server can
answer `initialize` and `tools/list` while the runtime is still loading (see `handlers` for
what the tools do)."""

from __future__ import annotations

from typing import Any

from conclave.catalog import SERVER_TOOLS, ToolInfo
from conclave.schemas import load_schema


def describe(info: ToolInfo) -> dict[str, Any]:
    """One MCP `tools/list` entry."""
    return {
        "name": info.name,
        "title": info.title,
        "description": info.description,
        "inputSchema": _public(load_schema(f"{info.name}.input.json")),
        "outputSchema": _public(load_schema(f"{info.name}.output.json")),
        "annotations": {"title": info.title, **{k: v for k, v in info.annotations.items() if k != "title"}},
    }


def _public(schema: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in schema.items() if k not in ("$id",)}


TOOL_NAMES = tuple(info.name for info in SERVER_TOOLS)  # the order tools/list shows them in
