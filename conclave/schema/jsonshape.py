"""The shape of a JSON value, as error messages name it: its type, and how deep it nests.

Nothing here recurses: a value nested deeper than the interpreter's recursion limit is what
the depth walk is for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def json_type(value: Any) -> str:
    """The JSON type name: object, array, string, number, boolean or null (anything else by its
    Python type name). bool is tested before int because True is an int in Python."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def a_json_type(value: Any) -> str:
    """`json_type` as a sentence says it: "an object", "a number", "null"."""
    name = json_type(value)
    if name == "null":
        return name
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def deepest_path(value: Any, *, stop_past: int | None = None) -> list[Any]:
    """The keys and indexes from `value` down to its deepest point (the first found of equals);
    empty for a scalar or an empty container. With `stop_past`, the walk ends at the first path
    longer than that. A container met twice (shared, or inside itself) is walked once, so the walk
    always ends."""
    nodes: list[tuple[Any, int]] = [(None, -1)]  # (key or index, parent node), node 0 is the root
    deepest, deepest_depth = 0, 0
    seen: set[int] = set()
    stack: list[tuple[Any, int, int]] = [(value, 0, 0)]  # (value, node, depth)
    while stack:
        item, node, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            if id(item) in seen:
                continue
            seen.add(id(item))
        if depth > deepest_depth:
            deepest, deepest_depth = node, depth
            if stop_past is not None and depth > stop_past:
                break
        for key, child in _children(item):
            nodes.append((key, node))
            stack.append((child, len(nodes) - 1, depth + 1))
    path: list[Any] = []
    while deepest != 0:
        key, deepest = nodes[deepest]
        path.append(key)
    path.reverse()
    return path


def nests_deeper_than(value: Any, levels: int) -> bool:
    """Whether `value` nests more than `levels` deep, a scalar being one level (`[[1]]` is three)."""
    return len(deepest_path(value, stop_past=levels - 1)) >= levels


def _children(value: Any) -> Iterable[tuple[Any, Any]]:
    if isinstance(value, dict):
        return value.items()
    if isinstance(value, list | tuple):
        return enumerate(value)
    return ()
