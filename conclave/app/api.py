"""The Python API: the same tools the server offers, as typed calls.

    async with conclave.Conclave(config="config.yaml") as c:   # the runtime opens once
        result = await c.confer("Which option?", providers=["openai", "anthropic"])
        debate = await c.coordinate("Design a rate limiter", rounds=2)
    result.to_dict()                                          # the tool's JSON result

        page = await c.fetch("https://example.com/")            # the fetch and verify tools too
    result = await conclave.confer("Which option?")          # one call, one runtime
    result = conclave.confer_sync("Which option?")           # from non-async code

Keyword arguments are the tools' arguments (`schemas/<tool>.input.json`); they are validated
here, at this door, as the server validates its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Literal

import anyio

from conclave.app.runner import run_tool
from conclave.app.runtime import Runtime, open_runtime
from conclave.core.errors import ConclaveError
from conclave.deliberation.confer import confer as _confer
from conclave.deliberation.coordinate import coordinate as _coordinate
from conclave.deliberation.results import ConferResult, CoordinateResult
from conclave.deliberation.session import DeltaSink, ProgressSink
from conclave.net.http import Transport
from conclave.schema.config import Config, CostCapMode, WorkerToolMode, load_config
from conclave.schema.schemas import check_arguments, load_schema


class Conclave:
    """A reusable client: the HTTP pool, event log and providers open once, for every call."""

    def __init__(self, config: Config | str | None = None, *, transport: Transport | None = None) -> None:
        """`config`: a Config, a path, or None to discover one; `transport`: what every HTTP
        request (provider calls and fetches) goes through, by default aiohttp's; tests and
        benchmarks hand in a `conclave.net.http.MemoryTransport`."""
        self._config = config if isinstance(config, Config) else load_config(config)
        self._transport = transport
        self._stack: contextlib.AsyncExitStack | None = None
        self._runtime: Runtime | None = None

    @property
    def config(self) -> Config:
        return self._config

    async def __aenter__(self) -> Conclave:
        stack = contextlib.AsyncExitStack()
        self._runtime = await stack.enter_async_context(open_runtime(self._config, transport=self._transport))
        self._stack = stack
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack, self._stack, self._runtime = self._stack, None, None
        if stack is not None:
            await stack.__aexit__(kind, exc, tb)

    async def confer(
        self,
        question: str,
        *,
        context: str | None = None,
        system: str | None = None,
        providers: Sequence[str] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout_seconds: float | None = None,
        session_id: str | None = None,
        follow_up_of: str | None = None,
        dry_run: bool | None = None,
        worker_tools: Sequence[str] | None = None,
        worker_tool_cost_cap_usd: float | None = None,
        worker_tool_cost_cap_mode: CostCapMode | None = None,
        worker_tool_mode: WorkerToolMode | None = None,
        review: bool | None = None,
        synthesize: bool | None = None,
        answer_schema: Mapping[str, Any] | None = None,
        vote_fields: Sequence[str] | None = None,
        tolerance: float | None = None,
        quorum: int | None = None,
        grace_seconds: float | None = None,
        on_partial: Literal["return", "error"] | None = None,
        progress: ProgressSink | None = None,
        deltas: DeltaSink | None = None,
    ) -> ConferResult:
        """Ask every panel member (or `providers`) `question` at once; with `review`, each ranks
        the others' answers blind; with `synthesize`, a chair writes the final answer. With
        `answer_schema`, each answers with a JSON object valid against it, and the result's
        `vote` counts them (`vote_fields`, `tolerance`: what is voted, and how close numbers
        must be to agree). With `quorum`, once that many have answered the others get
        `grace_seconds` more, then are stopped as `late`; with `on_partial="error"`, a result short
        of its members (or of the quorum) raises `PartialResult`, whose `result` is that partial
        result. `deltas(provider, role, delta)` hears each answer as it streams in. With
        `follow_up_of` (a session id), each member is first sent that session's thread: the
        earlier questions, its own answers, the syntheses."""
        args = _arguments("confer", locals())
        return await _confer(self._open(), args, progress=progress, deltas=deltas)

    async def coordinate(
        self,
        task: str,
        *,
        context: str | None = None,
        proposer: str | None = None,
        critics: Sequence[str] | None = None,
        synthesizer: str | None = None,
        rounds: int | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout_seconds: float | None = None,
        session_id: str | None = None,
        follow_up_of: str | None = None,
        dry_run: bool | None = None,
        worker_tools: Sequence[str] | None = None,
        worker_tool_cost_cap_usd: float | None = None,
        worker_tool_cost_cap_mode: CostCapMode | None = None,
        worker_tool_mode: WorkerToolMode | None = None,
        stop_when_converged: bool | None = None,
        answer_schema: Mapping[str, Any] | None = None,
        quorum: int | None = None,
        grace_seconds: float | None = None,
        progress: ProgressSink | None = None,
        deltas: DeltaSink | None = None,
    ) -> CoordinateResult:
        """Run a proposer -> critics -> synthesizer debate on `task`, stopping early (unless
        `stop_when_converged` is False) once every critic accepts. With `answer_schema`, the
        synthesizer also decides the answer as an object valid against it:
        `result.synthesis.value` (None when no synthesizer gave a valid one; the result is then
        degraded). With `quorum`, once that many critics of a round have critiqued, the others get
        `grace_seconds` more, then are stopped as `late`. `follow_up_of` continues a session's
        thread, as `confer`'s does."""
        args = _arguments("coordinate", locals())
        return await _coordinate(self._open(), args, progress=progress, deltas=deltas)

    async def fetch(
        self, url: str, *, max_bytes: int | None = None, session_id: str | None = None
    ) -> dict[str, Any]:
        """Fetch one http(s) URL under the configured policies; the `fetch` tool's result."""
        args = _arguments("fetch", locals())
        return await run_tool(self._open(), "fetch", args)

    async def verify(
        self, checks: Sequence[Mapping[str, Any]], *, session_id: str | None = None
    ) -> dict[str, Any]:
        """Run deterministic checks; the `verify` tool's result."""
        args = _arguments("verify", locals())
        return await run_tool(self._open(), "verify", args)

    def _open(self) -> Runtime:
        if self._runtime is None:
            raise ConclaveError("the client is not open: use `async with conclave.Conclave(...) as c:`")
        return self._runtime


async def confer(question: str, *, config: Config | str | None = None, **arguments: Any) -> ConferResult:
    """One confer with a runtime of its own; the arguments are `Conclave.confer`'s."""
    async with Conclave(config) as client:
        return await client.confer(question, **arguments)


async def coordinate(task: str, *, config: Config | str | None = None, **arguments: Any) -> CoordinateResult:
    """One debate with a runtime of its own; the arguments are `Conclave.coordinate`'s."""
    async with Conclave(config) as client:
        return await client.coordinate(task, **arguments)


def confer_sync(question: str, **arguments: Any) -> ConferResult:
    """`confer` from code that is not async."""
    result: ConferResult = anyio.run(lambda: confer(question, **arguments))
    return result


def coordinate_sync(task: str, **arguments: Any) -> CoordinateResult:
    """`coordinate` from code that is not async."""
    result: CoordinateResult = anyio.run(lambda: coordinate(task, **arguments))
    return result


def _arguments(tool: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """The tool's arguments, from a method's keywords, as the server would receive them: those
    the tool's input schema names and the caller gave, as JSON values, valid against that schema
    (else InvalidArguments naming the failing path)."""
    names = load_schema(f"{tool}.input.json")["properties"]
    args = {name: _json(value) for name, value in given.items() if name in names and value is not None}
    check_arguments(f"{tool}.input.json", args, tool=tool)
    return args


def _json(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return dict(value) if isinstance(value, Mapping) and not isinstance(value, dict) else value
