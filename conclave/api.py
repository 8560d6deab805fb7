"""The Python API: `conclave.confer(...)` and `conclave.coordinate(...)`, the same structured
results the JSON-RPC surface returns. One implementation, two doors.

    result = await conclave.confer("Which option?", providers=["openai", "anthropic"])
    result = conclave.confer_sync("Which option?")          # from non-async code
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio

from conclave.config import Config, load_config
from conclave.deliberation.common import ProgressSink
from conclave.deliberation.confer import confer as _confer
from conclave.deliberation.coordinate import coordinate as _coordinate
from conclave.runtime import open_runtime


async def confer(
    question: str,
    *,
    config: Config | str | None = None,
    progress: ProgressSink | None = None,
    **arguments: Any,
) -> dict[str, Any]:
    """Ask every panel member `question` at once; `arguments` are confer's other arguments."""
    async with open_runtime(_resolve(config)) as runtime:
        return await _confer(runtime, {"question": question, **arguments}, progress=progress)


async def coordinate(
    task: str, *, config: Config | str | None = None, progress: ProgressSink | None = None, **arguments: Any
) -> dict[str, Any]:
    """Run a proposer -> critics -> synthesizer debate on `task`."""
    async with open_runtime(_resolve(config)) as runtime:
        return await _coordinate(runtime, {"task": task, **arguments}, progress=progress)


def confer_sync(question: str, **kwargs: Any) -> dict[str, Any]:
    return anyio.run(_call, confer, question, kwargs)


def coordinate_sync(task: str, **kwargs: Any) -> dict[str, Any]:
    return anyio.run(_call, coordinate, task, kwargs)


async def _call(function: Any, first: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = await function(first, **kwargs)
    return result


def _resolve(config: Config | str | None) -> Config:
    return config if isinstance(config, Config) else load_config(config)


__all__: Sequence[str] = ["confer", "confer_sync", "coordinate", "coordinate_sync"]
