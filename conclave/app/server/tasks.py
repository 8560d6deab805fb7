"""Long tool calls as MCP tasks (`io.modelcontextprotocol/tasks`, docs/server.md#long-deliberations).

A client that declares the extension on a stateless `tools/call` of `confer` or `coordinate` gets
a task handle at once instead of waiting: the call runs on in the store's own task group, so it
outlives the request (and the client's patience, and its connection). `tasks/get` reports
`working` with who has answered so far, then `completed` with the tool result or `failed` with
the JSON-RPC error; `tasks/cancel` stops the work. A task is kept for `tasks.ttl_seconds` after
it was created, then forgotten. One store per serving process; with a shared state backend
(docs/deploying.md#what-is-shared) each task is also published there, so any replica can report
it or cancel it, and the replica running it stops it when another one was asked to."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import anyio
import anyio.abc

from conclave.app.server.jsonrpc import INVALID_PARAMS, RpcError
from conclave.schema.config import TasksConfig
from conclave.state.base import TaskBoard
from conclave.state.memory import LocalTaskBoard

CANCEL_POLL_SECONDS = 0.25

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
Work = Callable[["TaskRecord"], Awaitable[dict[str, Any]]]
ErrorBody = Callable[[BaseException], dict[str, Any]]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class TaskRecord:
    """One task: its state as `tasks/get` shows it, and the scope that can stop its work."""

    task_id: str
    ttl_ms: int
    poll_interval_ms: int
    expires_at: float  # time.monotonic()
    status: TaskStatus = "working"
    status_message: str = "started"
    created_at: str = field(default_factory=_now)
    last_updated_at: str = ""
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    on_change: Callable[[TaskRecord], None] | None = None

    def __post_init__(self) -> None:
        self.last_updated_at = self.created_at

    @property
    def finished(self) -> bool:
        return self.status in ("completed", "failed", "cancelled")

    def update(self, status: TaskStatus | None = None, message: str | None = None) -> None:
        if self.finished:
            return  # a terminal state never changes
        self.status = status or self.status
        self.status_message = message if message is not None else self.status_message
        self.last_updated_at = _now()
        if self.on_change is not None:
            self.on_change(self)

    def ms_left(self) -> int:
        return max(int((self.expires_at - time.monotonic()) * 1000), 1)

    def to_wire(self) -> dict[str, Any]:
        """The task as a `CreateTaskResult` or `tasks/get` result carries it (without resultType)."""
        out: dict[str, Any] = {
            "taskId": self.task_id,
            "status": self.status,
            "statusMessage": self.status_message,
            "createdAt": self.created_at,
            "lastUpdatedAt": self.last_updated_at,
            "ttlMs": self.ttl_ms,
            "pollIntervalMs": self.poll_interval_ms,
        }
        if self.status == "completed":
            out["result"] = self.result
        elif self.status == "failed":
            out["error"] = self.error
        return out


class TaskStore:
    """Creates tasks, runs their work in its own task group, and finds them again by id."""

    def __init__(
        self, settings: TasksConfig, group: anyio.abc.TaskGroup, error_body: ErrorBody, board: TaskBoard
    ) -> None:
        self._settings = settings
        self._group = group
        self._error_body = error_body
        self._board = board
        self._shared = not isinstance(board, LocalTaskBoard)  # else this dict is the whole truth
        self._tasks: dict[str, TaskRecord] = {}

    @classmethod
    @contextlib.asynccontextmanager
    async def running(
        cls, settings: TasksConfig, error_body: ErrorBody, board: TaskBoard | None = None
    ) -> AsyncIterator[TaskStore]:
        """A store for the life of a server; leaving it stops the tasks still working."""
        async with anyio.create_task_group() as group:
            store = cls(settings, group, error_body, board or LocalTaskBoard())
            group.start_soon(store._watch_cancels)
            yield store
            group.cancel_scope.cancel()

    def create(self, work: Work) -> TaskRecord:
        """A new task, already findable by `get` when this returns; `work` runs in the background."""
        self._forget_expired()
        ttl = self._settings.ttl_seconds
        task = TaskRecord(
            task_id=str(uuid.uuid4()),
            ttl_ms=ttl * 1000,
            poll_interval_ms=self._settings.poll_interval_ms,
            expires_at=time.monotonic() + ttl,
            on_change=self._publish_soon if self._shared else None,
        )
        self._tasks[task.task_id] = task
        self._group.start_soon(self._run, task, work)
        if self._shared:
            self._publish_soon(task)
        return task

    async def find(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The task `params.taskId` names, as `tasks/get` shows it, whichever replica runs it;
        -32602 when there is none (unknown, or expired)."""
        self._forget_expired()
        task_id = params.get("taskId")
        if not isinstance(task_id, str):
            raise _unknown(task_id)
        task = self._tasks.get(task_id)
        if task is not None:
            return task.to_wire()
        wire = await self._board.fetch(task_id)
        if wire is None:
            raise _unknown(task_id)
        return wire

    async def cancel(self, params: Mapping[str, Any]) -> None:
        task_id = params.get("taskId")
        task = self._tasks.get(task_id) if isinstance(task_id, str) else None
        if task is None:
            await self.find(params)  # unknown anywhere: -32602
            assert isinstance(task_id, str)
            await self._board.request_cancel(task_id)
            return
        self._stop(task)

    def _stop(self, task: TaskRecord) -> None:
        if not task.finished:
            task.scope.cancel()
            task.update("cancelled", "cancelled by the client")

    def _publish_soon(self, task: TaskRecord) -> None:
        self._group.start_soon(self._publish, task)

    async def _publish(self, task: TaskRecord) -> None:
        await self._board.publish(task.task_id, task.to_wire(), task.ms_left())

    async def _watch_cancels(self) -> None:
        """Cancels asked of another replica reach the one running the task within a tick."""
        while self._shared:
            await anyio.sleep(CANCEL_POLL_SECONDS)
            running = [task_id for task_id, task in self._tasks.items() if not task.finished]
            if running:
                for task_id in await self._board.cancelled(running):
                    self._stop(self._tasks[task_id])

    async def _run(self, task: TaskRecord, work: Work) -> None:
        with task.scope:
            try:
                result = await work(task)
            except Exception as exc:  # a protocol error: the task failed, and says how
                task.error = self._error_body(exc)
                task.update("failed", str(task.error.get("message", "failed")))
            else:
                task.result = result
                task.update("completed", "completed")

    def _forget_expired(self) -> None:
        now = time.monotonic()
        for task_id in [t.task_id for t in self._tasks.values() if t.expires_at <= now]:
            self._tasks.pop(task_id).scope.cancel()


def _unknown(task_id: object) -> RpcError:
    return RpcError(INVALID_PARAMS, f"Failed to retrieve task: no task {task_id!r} (unknown or expired)")
