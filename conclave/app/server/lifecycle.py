"""A starting server answers before its runtime is up.

MCP clients spawn `conclave serve` and open with `initialize` and `tools/list`; both need only
the tool catalog and `schemas/`. The runtime (providers, the HTTP stack, deliberation) takes
most of start-up, almost all of it imports, so it loads in the background while the server is
already answering, and tool calls wait for it. A runtime that fails to open stops the server
with the same error it always did.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from conclave.app.catalog import handler_modules
from conclave.app.gcpolicy import serving_gc
from conclave.app.server.core import Server
from conclave.app.server.tasks import TaskStore
from conclave.obs.telemetry import Telemetry
from conclave.schema.config import Config
from conclave.state import StateBackend, open_state

if TYPE_CHECKING:
    from conclave.deliberation.live import LiveDeltas

# The heavy half of the server. Imported on a worker thread: the import lock keeps it safe, and
# the GIL, handed over every few milliseconds, lets the event loop keep answering meanwhile.
_RUNTIME_MODULES = ("conclave.app.runtime", *handler_modules())


@contextlib.asynccontextmanager
async def serving(config: Config, *, live: LiveDeltas | None = None) -> AsyncIterator[Server]:
    """A Server that answers at once and runs tools once its runtime has opened. On leaving,
    calls still running have finished (the caller waits for them) and the runtime closes.
    `live`: the hub its sessions publish their deltas to (the page's, under `serve --http`)."""
    telemetry = Telemetry.for_config(config)
    server = Server(telemetry=telemetry)
    failure: list[Exception] = []
    try:
        async with (
            open_state(config, telemetry) as state,
            anyio.create_task_group() as group,
            TaskStore.running(config.tasks, server.task_error, state.tasks) as tasks,
        ):
            server.tasks = tasks
            done = anyio.Event()
            group.start_soon(_hold_runtime, config, server, state, live, done, failure, group.cancel_scope)
            try:
                yield server
            finally:
                done.set()
    finally:
        telemetry.close()
    if failure:
        raise failure[0]


async def _hold_runtime(
    config: Config,
    server: Server,
    state: StateBackend,
    live: LiveDeltas | None,
    done: anyio.Event,
    failure: list[Exception],
    serving_scope: anyio.CancelScope,
) -> None:
    try:
        await anyio.to_thread.run_sync(_import_runtime)
        if done.is_set():  # the client came and went (initialize, tools/list, EOF): nothing to run
            return
        from conclave.app.runtime import open_runtime

        async with open_runtime(config, telemetry=server.telemetry, state=state, live=live) as runtime:
            server.attach(runtime)
            serving_gc()  # start-up is done: this process is a server now
            await done.wait()
    except Exception as exc:
        # Re-raised by `serving` as itself, not inside an exception group, so `conclave serve`
        # reports an unwritable log or a bad provider entry the way it reports any start-up error.
        failure.append(exc)
        serving_scope.cancel()


def _import_runtime() -> None:
    for name in _RUNTIME_MODULES:
        importlib.import_module(name)
