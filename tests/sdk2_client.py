"""A client built on the official MCP Python SDK 2.x, run by tests/test_mcp_client_v2.py.

SDK 2.x cannot share a virtualenv with the 1.x the other tests use, so this file runs under
`.venv/sdk2/bin/python` (made by `scripts/setup dev`) and is not a test module itself. It takes
one JSON job on argv and prints one JSON object: what the SDK saw.

    {"server": "http://127.0.0.1:PORT/mcp" | ["cmd", "arg", ...], "cwd": "...", "mode": "auto",
     "job": "probe" | "resources" | "task" | "task-start" | "task-cancel" | "task-get", ...}

The tasks extension (io.modelcontextprotocol/tasks) is not built into SDK 2.x: `Tasks` below is
a client extension through its documented hooks, a `ResultClaim` on `tools/call` for
`resultType: "task"` that polls `tasks/get` until the task ends.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Literal

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from pydantic import ConfigDict, Field

TASKS = "io.modelcontextprotocol/tasks"
STATUSES_SEEN: list[str] = []
MESSAGES_SEEN: list[str] = []


class TaskParams(types.RequestParams):
    task_id: str


class GetTask(types.Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"


class CancelTask(types.Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param = "taskId"


class TaskState(types.Result):
    """A task as `tasks/get` shows it."""

    model_config = ConfigDict(extra="allow")
    task_id: str
    status: str
    status_message: str | None = None
    poll_interval_ms: int | None = None
    ttl_ms: int | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class CreatedTask(TaskState):
    """A `CreateTaskResult`: what `tools/call` answers when the server makes a task."""

    result_type: Literal["task"] = Field(alias="resultType")


async def get_task(session: Any, task_id: str) -> TaskState:
    request = GetTask(params=TaskParams(task_id=task_id))
    state: TaskState = await session.send_request(request, TaskState)
    STATUSES_SEEN.append(state.status)
    if state.status_message:
        MESSAGES_SEEN.append(state.status_message)
    return state


async def poll(session: Any, task_id: str) -> TaskState:
    while True:
        state = await get_task(session, task_id)
        if state.status in ("completed", "failed", "cancelled"):
            return state
        await anyio.sleep((state.poll_interval_ms or 200) / 1000 / 10)  # tests need not wait the full hint


async def resolve(created: CreatedTask, ctx: ClaimContext) -> types.CallToolResult:
    state = await poll(ctx.session, created.task_id)
    if state.status != "completed" or state.result is None:
        raise RuntimeError(f"task {created.task_id} ended {state.status}: {state.error}")
    return types.CallToolResult.model_validate(state.result)


class Tasks(ClientExtension):
    identifier = TASKS

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=resolve)]


def client_for(job: dict[str, Any]) -> Client:
    server = job["server"]
    if isinstance(server, list):
        server = StdioServerParameters(
            command=server[0], args=server[1:], cwd=job.get("cwd"), env=job.get("env")
        )
    extensions = [Tasks()] if job["job"].startswith("task") else None
    return Client(server, mode=job.get("mode", "auto"), extensions=extensions, read_timeout_seconds=60)


async def run(job: dict[str, Any]) -> dict[str, Any]:
    async with client_for(job) as client:
        out: dict[str, Any] = {"protocol_version": client.protocol_version}
        out["tools"] = sorted(t.name for t in (await client.list_tools()).tools)
        kind = job["job"]
        if kind == "probe":
            checks = {"checks": [{"type": "math", "expression": "6*7", "expected": 42}]}
            result = await client.call_tool("verify", checks)
            out["verify"] = result.structured_content
        elif kind == "resources":  # a confer, then its session as a resource, listed and read
            called = await client.call_tool("confer", {"question": job["question"]})
            session_id = (called.structured_content or {})["session_id"]
            listed = await client.list_resources()
            templates = await client.list_resource_templates()
            read = await client.read_resource(f"conclave://sessions/{session_id}/summary")
            out["session_id"] = session_id
            out["resources"] = [r.name for r in listed.resources]
            out["templates"] = [t.uri_template for t in templates.resource_templates]
            out["summary"] = [c.model_dump(by_alias=True, exclude_none=True) for c in read.contents]
        elif kind == "task":  # resolved transparently through the extension's claim
            result = await client.call_tool(job["tool"], job["arguments"])
            out["result"] = result.structured_content
            out["is_error"] = result.is_error
        else:
            out.update(await task_job(client, job))
        out["statuses"], out["messages"] = STATUSES_SEEN, MESSAGES_SEEN
        return out


async def task_job(client: Client, job: dict[str, Any]) -> dict[str, Any]:
    session = client.session
    if job["job"] == "task-get":
        state = await poll(session, job["task_id"])
        return {"final": state.model_dump(by_alias=True, exclude_none=True)}
    created = await session.call_tool(job["tool"], job["arguments"], allow_claimed=True)
    assert isinstance(created, CreatedTask), created
    out: dict[str, Any] = {"created": created.model_dump(by_alias=True, exclude_none=True)}
    if job["job"] == "task-cancel":
        await session.send_request(CancelTask(params=TaskParams(task_id=created.task_id)), types.EmptyResult)
        out["final"] = (await poll(session, created.task_id)).model_dump(by_alias=True, exclude_none=True)
    return out  # task-start: leave at once, with the task still working


def main() -> None:
    job = json.loads(sys.argv[1])
    print(json.dumps(anyio.run(run, job)))


if __name__ == "__main__":
    main()
