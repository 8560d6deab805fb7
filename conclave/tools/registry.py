"""The tool registry: name -> (input schema, output schema, handler). The one way in for the
server (F5) and the worker loop (F3). Schemas come from `schemas/` and compile at import."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from conclave.errors import InvalidArguments, UnknownTool
from conclave.schemas import acceptor, first_error, json_path, load_schema
from conclave.telemetry import session

if TYPE_CHECKING:
    from conclave.tools.context import ToolContext

Handler = Callable[[Mapping[str, Any], "ToolContext"], Awaitable[dict[str, Any]]]
Renderer = Callable[[Mapping[str, Any]], str]


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    title: str
    description: str
    handler: Handler
    render: Renderer
    annotations: Mapping[str, Any] = field(default_factory=dict)

    @property
    def input_schema(self) -> dict[str, Any]:
        return load_schema(f"{self.name}.input.json")

    @property
    def output_schema(self) -> dict[str, Any]:
        return load_schema(f"{self.name}.output.json")


class ToolRegistry:
    def __init__(self, tools: Iterable[Tool]) -> None:
        self._tools = {tool.name: tool for tool in tools}
        for tool in self._tools.values():  # load now: a missing or broken file fails at start-up
            for kind in ("input", "output"):
                acceptor(f"{tool.name}.{kind}.json")

    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def __iter__(self) -> Any:
        return iter(self._tools.values())

    def get(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            raise UnknownTool(f"unknown tool {name!r}; known tools: {', '.join(self._tools)}") from None

    def validate(self, name: str, args: Any) -> None:
        """Raise InvalidArguments with the validator's message and the failing JSON path."""
        self.get(name)
        error = first_error(f"{name}.input.json", args)
        if error is not None:
            raise InvalidArguments(error.message, path=json_path(error), tool=name)

    async def call(self, name: str, args: Mapping[str, Any], context: ToolContext) -> dict[str, Any]:
        """Validate, then run with the call's session bound to every event it emits."""
        self.validate(name, args)
        session_id = args.get("session_id")
        if isinstance(session_id, str):
            with session(session_id):
                return await self._tools[name].handler(args, context)
        return await self._tools[name].handler(args, context)
