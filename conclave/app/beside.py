"""Running a background task beside a block, as the live progress of a call does."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import anyio


@contextlib.asynccontextmanager
async def running_beside(background: Callable[[], Coroutine[Any, Any, None]]) -> AsyncIterator[None]:
    """Run `background` while the block runs, and stop it when the block ends. The block's own
    exception comes out as it is, not wrapped in the task group's ExceptionGroup: the callers map
    their exceptions by type (an RpcError to its code, a ConfigError to one line)."""
    failure: Exception | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(background)
        try:
            yield
        except Exception as exc:
            failure = exc
        finally:
            group.cancel_scope.cancel()
    if failure is not None:
        raise failure
