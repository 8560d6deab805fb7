"""The server: MCP in both eras (the stateless revision 2026-07-28, and the handshake revisions
2025-11-25 and older that clients still send; see `eras`) and plain JSON-RPC methods over one
tool surface. Transports hand it one decoded message at a time.

A server answers from the moment it exists: `initialize`, `ping` and `tools/list` need only the
tool catalog and `schemas/`. Tool calls wait until a runtime is attached (`attach`), which a
starting server does in the background (see `lifecycle`)."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import orjson

from conclave.app.catalog import TOOL_NAMES, TOOLS, Invocation, ToolSpec, tool_spec
from conclave.app.server import eras, resources
from conclave.app.server.jsonrpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    Invalid,
    Request,
    RequestId,
    RpcError,
    classify,
    error_response,
    response,
    to_rpc_error,
)
from conclave.app.server.progress import CallProgress
from conclave.app.server.surface import describe
from conclave.core.errors import ConfigError, InvalidArguments, PartialResult, ToolError
from conclave.core.version import __version__
from conclave.obs.telemetry import Telemetry, traced

if TYPE_CHECKING:
    from conclave.app.runtime import Runtime
    from conclave.app.server.tasks import TaskRecord, TaskStore
    from conclave.deliberation.session import DeltaSink, ProgressSink

SUPPORTED_VERSIONS = eras.HANDSHAKE_VERSIONS  # what `initialize` negotiates
PLAIN_METHODS = frozenset(TOOL_NAMES)  # every tool is also a plain method (docs/server.md#plain-json-rpc)
TASK_TOOLS = frozenset({"confer", "coordinate"})  # the calls long enough to run as tasks
INSTRUCTIONS = (
    "Conclave asks several LLMs at once. Use `confer` to get every panel member's answer to one question, "
    "`coordinate` for a proposer/critics/synthesizer debate, `fetch` and `verify` for evidence and checks, "
    "`list_providers` to see who is configured. Results carry per-provider status, usage and cost; "
    "`degraded: true` means some answer is missing."
)

Send = Callable[[Any], Awaitable[None]]


class Server:
    """`Server(runtime)` is ready at once; `Server(telemetry=...)` waits for `attach(runtime)`
    before running any tool."""

    def __init__(
        self, runtime: Runtime | None = None, *, telemetry: Telemetry | None = None, page_size: int = 50
    ) -> None:
        if telemetry is None:
            if runtime is None:
                raise TypeError("Server needs a runtime, or the telemetry to use until one is attached")
            telemetry = runtime.telemetry
        self.telemetry = telemetry
        self.page_size = page_size
        self.protocol_version: str | None = None
        self._in_flight: dict[tuple[object, RequestId], anyio.CancelScope] = {}
        self._runtime: Runtime | None = None
        self._attached: anyio.Event | None = None
        self.tasks: TaskStore | None = None  # set by a serving process (see `lifecycle`)
        self._library: resources.Library | None = None
        if runtime is not None:
            self.attach(runtime)

    def attach(self, runtime: Runtime) -> None:
        """Tool calls may run from now on; those already waiting go ahead."""
        self._runtime = runtime
        if self._attached is not None:
            self._attached.set()

    async def runtime(self) -> Runtime:
        """The runtime, once attached."""
        if self._runtime is None:
            if self._attached is None:
                self._attached = anyio.Event()
            await self._attached.wait()
        assert self._runtime is not None
        return self._runtime

    async def run_tool(
        self,
        tool: ToolSpec,
        args: dict[str, Any],
        progress: ProgressSink | None = None,
        deltas: DeltaSink | None = None,
    ) -> dict[str, Any]:
        """The server's door: every tool's arguments are checked here, once, before it runs."""
        tool.validate(args)
        runtime = await self.runtime()
        return await tool.run(args, Invocation(runtime.tool_context, runtime, progress, deltas))

    async def handle_message(self, message: Any, send: Send, *, connection: object = None) -> Any:
        """One decoded message (object or batch); returns what to send back, or None."""
        if isinstance(message, list):
            return await self._batch(message, send, connection)
        return await self._one(message, send, connection)

    async def _batch(
        self, messages: list[Any], send: Send, connection: object
    ) -> list[Any] | dict[str, Any] | None:
        if not messages:
            return error_response(None, RpcError(INVALID_REQUEST, "Invalid Request: empty batch"))
        replies: list[Any] = [None] * len(messages)

        async def run(index: int, message: Any) -> None:
            replies[index] = await self._one(message, send, connection)

        async with anyio.create_task_group() as group:
            for index, message in enumerate(messages):
                group.start_soon(run, index, message)
        answered = [r for r in replies if r is not None]
        return answered or None

    async def _one(self, message: Any, send: Send, connection: object) -> dict[str, Any] | None:
        parsed = classify(message)
        if parsed is None:
            return None
        if isinstance(parsed, Invalid):
            return error_response(parsed.id, parsed.error)
        if parsed.is_notification:
            await self._notification(parsed, connection)
            return None
        return await self._request(parsed, send, connection)

    async def _request(self, request: Request, send: Send, connection: object) -> dict[str, Any] | None:
        scope = anyio.CancelScope()
        key = (connection, request.id)  # ids are only unique per connection (each client counts from 1)
        self._in_flight[key] = scope
        try:
            with scope:
                return response(request.id, await self._dispatch(request, send))
            return None  # cancelled by notifications/cancelled: no reply, ever
        except Exception as exc:
            return error_response(
                request.id, to_rpc_error(exc, method=request.method, telemetry=self.telemetry)
            )
        finally:
            self._in_flight.pop(key, None)

    async def _notification(self, note: Request, connection: object) -> None:
        if note.method == "notifications/cancelled" and isinstance(note.params, dict):
            target = note.params.get("requestId")
            # Only a string or an integer can name a request in flight. Anything else (an array or
            # an object is not even hashable) is ignored, like every malformed notification.
            if isinstance(target, str) or (isinstance(target, int) and not isinstance(target, bool)):
                scope = self._in_flight.get((connection, target))
                if scope is not None:
                    scope.cancel()
        # notifications/initialized and anything else: nothing to answer, ever

    async def _dispatch(self, request: Request, send: Send) -> Any:
        if request.method == "server/discover" or eras.is_stateless(request.params):
            return await self._stateless(request, eras.stateless_context(request.params), send)
        return await self._handshake(request, send)

    async def _stateless(self, request: Request, context: eras.Stateless, send: Send) -> dict[str, Any]:
        """Revision 2026-07-28: no initialize, ping or sessions; every result says its type."""
        params = _object_params(request)
        method = request.method
        if method == "server/discover":
            return eras.discover(INSTRUCTIONS, tasks=self.tasks is not None)
        if method == "tools/list":
            return eras.complete(self._list_tools(params), cacheable=True)
        if method == "tools/call":
            if self.tasks is not None and self._as_task(params, context):
                return self._start_task(self.tasks, params)
            return eras.complete(await self._call_reporting(params, send))
        if method in eras.TASK_METHODS:
            return eras.complete(await self._task_method(method, params, context))
        if method == "resources/list":
            return eras.sessions_result(await self._list_resources(params))
        if method == "resources/templates/list":
            return eras.complete(_templates(params), cacheable=True)
        if method == "resources/read":
            # Revision 2026-07-28 says an unknown resource is invalid params.
            return eras.sessions_result(await (await self.library()).read(params, not_found=INVALID_PARAMS))
        raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method} (revision {context.version})")

    @staticmethod
    def _as_task(params: Mapping[str, Any], context: eras.Stateless) -> bool:
        """A deliberation runs as a task for a client that said it can take one
        (docs/server.md#long-deliberations)."""
        return params.get("name") in TASK_TOOLS and context.declares_extension(eras.TASKS_EXTENSION)

    def _start_task(self, store: TaskStore, params: dict[str, Any]) -> dict[str, Any]:
        """A `CreateTaskResult` at once; the call runs on in the store's task group."""

        async def work(task: TaskRecord) -> dict[str, Any]:
            return eras.complete(await self._call_tool(params, _task_progress(task)))

        task = store.create(work)
        return eras.complete({**task.to_wire(), "resultType": "task"})

    async def _task_method(
        self, method: str, params: dict[str, Any], context: eras.Stateless
    ) -> dict[str, Any]:
        if not context.declares_extension(eras.TASKS_EXTENSION):
            raise eras.missing_extension(eras.TASKS_EXTENSION, method)
        if self.tasks is None:  # this process keeps no tasks, so it knows none
            raise RpcError(INVALID_PARAMS, f"Failed to retrieve task: no task {params.get('taskId')!r}")
        if method == "tasks/cancel":
            await self.tasks.cancel(params)
            return {}
        task = await self.tasks.find(params)
        return task if method == "tasks/get" else {}  # tasks/update: nothing is ever asked

    def task_error(self, exc: BaseException) -> dict[str, Any]:
        """The JSON-RPC error body of a task whose call failed, as the call itself would have."""
        body: dict[str, Any] = error_response(
            None, to_rpc_error(exc, method="tools/call", telemetry=self.telemetry)
        )["error"]
        return body

    async def _handshake(self, request: Request, send: Send) -> Any:
        """The handshake era (2025-11-25 and older), and the plain JSON-RPC tool methods."""
        method = request.method
        if method == "initialize":
            return self._initialize(_object_params(request))
        if method == "ping":
            return {}
        if method == "tools/list":
            return self._list_tools(_object_params(request))
        if method == "tools/call":
            params = _object_params(request)
            return await self._call_reporting(params, send)
        if method == "resources/list":
            return await self._list_resources(_object_params(request))
        if method == "resources/templates/list":
            return _templates(_object_params(request))
        if method == "resources/read":
            library = await self.library()
            return await library.read(_object_params(request), not_found=resources.RESOURCE_NOT_FOUND)
        if method in PLAIN_METHODS:
            return await self.run_tool(tool_spec(method), _object_params(request))
        raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")

    def _initialize(self, params: Mapping[str, Any]) -> dict[str, Any]:
        asked = params.get("protocolVersion")
        self.protocol_version = asked if asked in SUPPORTED_VERSIONS else SUPPORTED_VERSIONS[0]
        return {
            "protocolVersion": self.protocol_version,
            "capabilities": {name: dict(offer) for name, offer in eras.CAPABILITIES.items()},
            "serverInfo": {"name": "conclave", "title": "Conclave", "version": __version__},
            "instructions": INSTRUCTIONS,
        }

    def _list_tools(self, params: Mapping[str, Any]) -> dict[str, Any]:
        start = _decode_cursor(params.get("cursor"))
        page = TOOLS[start : start + self.page_size]
        result: dict[str, Any] = {"tools": [describe(tool) for tool in page]}
        if start + self.page_size < len(TOOLS):
            result["nextCursor"] = _encode_cursor(start + self.page_size)
        return result

    async def library(self) -> resources.Library:
        """The past sessions, where the runtime's config keeps them (it is waited for, as a tool
        call waits: a starting server does not know its config's folders before)."""
        if self._library is None:
            config = (await self.runtime()).config
            if self._library is None:  # another request may have made it while this one waited
                self._library = resources.Library(Path(config.telemetry.path), Path(config.transcripts.dir))
        return self._library

    async def _list_resources(self, params: Mapping[str, Any]) -> dict[str, Any]:
        start = _decode_cursor(params.get("cursor"))
        listed, more = await (await self.library()).page(start, self.page_size)
        result: dict[str, Any] = {"resources": listed}
        if more:
            result["nextCursor"] = _encode_cursor(start + self.page_size)
        return result

    async def _call_tool(
        self, params: Mapping[str, Any], progress: ProgressSink | None, deltas: DeltaSink | None = None
    ) -> dict[str, Any]:
        name = params.get("name")
        if not isinstance(name, str) or name not in TOOL_NAMES:
            raise RpcError(INVALID_PARAMS, f"Unknown tool: {name!r}; tools: {', '.join(TOOL_NAMES)}")
        arguments = params.get("arguments") if params.get("arguments") is not None else {}
        if not isinstance(arguments, dict):
            raise RpcError(INVALID_PARAMS, "Invalid params: tools/call arguments must be an object")
        tool = tool_spec(name)
        meta = params.get("_meta")
        traceparent = meta.get("traceparent") if isinstance(meta, dict) else None
        try:
            with traced(traceparent):
                result = await self.run_tool(tool, arguments, progress, deltas)
        except InvalidArguments as exc:
            return _tool_error(f"Invalid arguments for {name} at {exc.path}: {exc.message}")
        except (ToolError, ConfigError) as exc:
            # A partial confer keeps what arrived: its reason, message and answers, as structured content.
            return _tool_error(str(exc), exc.to_dict() if isinstance(exc, PartialResult) else None)
        return {
            "content": [{"type": "text", "text": tool.render(result)}],
            "structuredContent": result,
            "isError": False,
        }

    async def _call_reporting(self, params: Mapping[str, Any], send: Send) -> dict[str, Any]:
        """A `tools/call` that notifies its progress when the client gave a token for it."""
        reporter = CallProgress.of(params, send)
        if reporter is None:
            return await self._call_tool(params, None)
        return await reporter.around(lambda: self._call_tool(params, reporter.step, reporter.heard))


def _task_progress(task: TaskRecord) -> ProgressSink:
    """Keeps a task's statusMessage saying who has answered so far."""
    answered: list[str] = []

    async def progress(step: Mapping[str, Any]) -> None:
        if "waiting" in step:
            said = f"{len(answered)} answered: {', '.join(answered)}; " if answered else ""
            task.update(message=f"{said}waiting for {', '.join(step['waiting'])}")
            return
        who = f"{step.get('role')} {step.get('provider')}" if step.get("role") else str(step.get("provider"))
        answered.append(f"{who} ({step.get('status')})")
        total = f" of {step['total']}" if step.get("total") else ""
        task.update(message=f"{len(answered)}{total} answered: {', '.join(answered)}")

    return progress


def _templates(params: Mapping[str, Any]) -> dict[str, Any]:
    _decode_cursor(params.get("cursor"))  # one page holds both, but a bad cursor is still refused
    return {"resourceTemplates": [dict(template) for template in resources.TEMPLATES]}


def _tool_error(text: str, structured: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": True}
    if structured is not None:
        out["structuredContent"] = structured
    return out


def _object_params(request: Request) -> dict[str, Any]:
    if request.params is None:
        return {}
    if isinstance(request.params, dict):
        return request.params
    raise RpcError(INVALID_PARAMS, f"Invalid params: {request.method} takes named parameters (an object)")


def _encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(orjson.dumps({"offset": offset})).decode()


def _decode_cursor(cursor: Any) -> int:
    if cursor is None:
        return 0
    try:
        offset = orjson.loads(base64.urlsafe_b64decode(str(cursor).encode()))["offset"]
    except (ValueError, TypeError, KeyError, orjson.JSONDecodeError):
        raise RpcError(INVALID_PARAMS, "Invalid params: unknown cursor") from None
    if not isinstance(offset, int) or offset < 0:
        raise RpcError(INVALID_PARAMS, "Invalid params: unknown cursor")
    return offset
