"""What the simulated wires share for native tool calls (docs/providers.md#native-tool-calling):
the refusal of a bad tool history, the thinking signature, and call arguments in the two forms
the wires carry. Each wire's own rendering of calls and checks of a tool history live in its
module under `conclave/app/sim/kinds/`.

Only rules that are cheap and well known are checked: every call answered in the very next
turn, results that answer no call, and thinking signatures repeated unchanged. The panel signs
what it thinks with a digest of the content, so a signature can be checked without keeping
state: an altered thought, or a signature moved to another part, no longer matches.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

from conclave.app.sim.scenarios import NativeCall

_SIGNING_PREFIX = b"conclave-sim thought:"


class Rejected(Exception):
    """A request the service would refuse with a 400: `args[0]` is its message."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def declares_tools(body: Mapping[str, Any]) -> bool:
    tools = body.get("tools")
    return isinstance(tools, list) and bool(tools)


def signature(content: str) -> str:
    """The panel's thinking signature: opaque base64, as the services' are, but derived."""
    return base64.b64encode(hashlib.sha256(_SIGNING_PREFIX + content.encode("utf-8")).digest()).decode()


def arguments_text(arguments: Mapping[str, Any] | str) -> str:
    """Arguments as a JSON string (OpenAI's `function.arguments`): a scripted raw string as written."""
    return arguments if isinstance(arguments, str) else orjson.dumps(dict(arguments)).decode()


def arguments_object(call: NativeCall) -> Any:
    """Arguments as the object wires carry them: a scripted raw string is decoded as their own
    decoders would (the last duplicate key wins), or sent as it is when it is not JSON."""
    if not isinstance(call.arguments, str):
        return dict(call.arguments)
    try:
        return orjson.loads(call.arguments)
    except orjson.JSONDecodeError:
        return call.arguments
