"""The two encodings of a worker turn (docs/worker-loop.md#native-tool-calling): how tools are
declared, how calls are read and how results are written back. Everything else about a tool call is
the loop's, the same in both."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

from conclave.core.messages import Completion, Message, ToolChoice, ToolDeclaration, ToolReturn
from conclave.core.records import record
from conclave.tools.registry import ToolRegistry
from conclave.worker.hint import declarations, native_hint, tool_hint, with_hint
from conclave.worker.tags import ToolCall, find_tool_call

ToolMode = Literal["native", "tags"]


@record
class Call:
    """One tool call as the loop sees it, whatever its encoding: `error` set means its arguments
    could not be read (a `parse_error` refusal), and `name` may then be unknown."""

    name: str | None
    args: dict[str, Any] | None
    error: str | None = None
    id: str = ""  # the provider's call id (native); tags have none


@record
class Decoded:
    """A model turn's calls, the text to repeat in the history, and the answer if none is run."""

    calls: tuple[Call, ...]
    spoken: str
    answer: str


@record
class Returned:
    """One call's outcome as the model reads it."""

    call: Call
    text: str
    is_error: bool


@record
class Toolset:
    """The tools a turn may call, with what the hint says of them."""

    registry: ToolRegistry
    names: tuple[str, ...]
    hop_budget: int
    canary: str


@record
class Declared:
    system: str | None
    tools: tuple[ToolDeclaration, ...] = ()
    tool_choice: ToolChoice = "auto"


class Encoding(Protocol):
    mode: ToolMode

    def declare(self, tools: Toolset, system: str | None, *, final_round: bool) -> Declared: ...

    def decode(self, completion: Completion) -> Decoded: ...

    def write_back(
        self, completion: Completion, decoded: Decoded, returned: Sequence[Returned]
    ) -> list[Message]: ...


class TagEncoding:
    """The `<tool_call>` text protocol (docs/worker-loop.md#tags-tagspy): the first tag of the
    text is the one call."""

    mode: ToolMode = "tags"

    def declare(self, tools: Toolset, system: str | None, *, final_round: bool) -> Declared:
        hint = tool_hint(tools.registry, tools.names, hop_budget=tools.hop_budget, canary=tools.canary)
        return Declared(with_hint(system, hint))

    def decode(self, completion: Completion) -> Decoded:
        text = completion.text
        found = find_tool_call(text, truncated=completion.finish_reason == "length")
        if found is None:
            return Decoded((), text, text)
        if isinstance(found, ToolCall):
            return Decoded((Call(found.name, found.args),), text[: found.end], text[: found.start].rstrip())
        return Decoded((Call(None, None, found.detail),), text, text[: found.start].rstrip())

    def write_back(
        self, completion: Completion, decoded: Decoded, returned: Sequence[Returned]
    ) -> list[Message]:
        return [Message("assistant", decoded.spoken), *(Message("user", r.text) for r in returned)]


class NativeEncoding:
    """The provider's own tool calling: every call of a turn is read, each answered by id; a tag in
    the text is just text."""

    mode: ToolMode = "native"

    def declare(self, tools: Toolset, system: str | None, *, final_round: bool) -> Declared:
        hint = native_hint(hop_budget=tools.hop_budget, canary=tools.canary)
        # The final round keeps the declarations so the history stays valid, and forbids calls.
        return Declared(
            with_hint(system, hint),
            declarations(tools.registry, tools.names),
            "none" if final_round else "auto",
        )

    def decode(self, completion: Completion) -> Decoded:
        calls = tuple(
            Call(use.name, dict(use.arguments) if use.arguments is not None else None, use.error, use.id)
            for use in completion.tool_uses
        )
        return Decoded(calls, completion.text, completion.text)

    def write_back(
        self, completion: Completion, decoded: Decoded, returned: Sequence[Returned]
    ) -> list[Message]:
        said = Message("assistant", completion.text, tool_uses=completion.tool_uses, echo=completion.echo)
        answers = tuple(ToolReturn(r.call.id, r.call.name or "", r.text, r.is_error) for r in returned)
        return [said, Message("user", "", tool_returns=answers)]


ENCODINGS: dict[ToolMode, Encoding] = {"tags": TagEncoding(), "native": NativeEncoding()}
