"""The tools a panel member may call mid-answer, by name: the worker loop's one way to reach
them. Each is a `spec.ToolSpec`; the schemas load at construction, so a missing or broken
file fails at start-up."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from conclave.core.errors import UnknownTool
from conclave.schema.schemas import acceptor
from conclave.tools.spec import WORKER_TOOLS, ToolInvocation, ToolSpec

if TYPE_CHECKING:
    from conclave.tools.context import ToolContext


class ToolRegistry:
    def __init__(self, tools: Iterable[ToolSpec]) -> None:
        self._tools = {tool.name: tool for tool in tools}
        for tool in self._tools.values():
            for kind in ("input", "output"):
                acceptor(f"{tool.name}.{kind}.json")

    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter(self._tools.values())

    def get(self, name: str) -> ToolSpec:
        try:
            return self._tools[name]
        except KeyError:
            raise UnknownTool(f"unknown tool {name!r}; known tools: {', '.join(self._tools)}") from None

    def validate(self, name: str, args: Any) -> None:
        """Raise InvalidArguments with the validator's message and the failing JSON path."""
        self.get(name).validate(args)

    async def call(self, name: str, args: Mapping[str, Any], context: ToolContext) -> dict[str, Any]:
        """Run a tool on arguments its caller has validated (see `validate`)."""
        return await self.get(name).run(args, ToolInvocation(context))


def build_registry() -> ToolRegistry:
    """The worker tools, as the catalog lists them."""
    return ToolRegistry(WORKER_TOOLS)
