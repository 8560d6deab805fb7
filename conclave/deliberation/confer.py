"""`confer`: every provider asked the same question at once, in one task group bounded by
the call's deadline. One failure never fails the call; a partial result says so."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import anyio

from conclave.deliberation.common import (
    Answer,
    ProgressSink,
    Session,
    ToolPlan,
    answer_of,
    close_cancelled_session,
    merged_warnings,
    timed_out,
    total_usage,
    unknown_provider,
    user_messages,
    worker_tools_block,
)
from conclave.deliberation.plan import TurnShape, planned_call, summarize
from conclave.errors import InvalidArguments
from conclave.runtime import Runtime
from conclave.schemas import check_arguments
from conclave.telemetry import session as bind_session
from conclave.worker.hint import tool_hint, with_hint
from conclave.worker.loop import WorkerTurn


async def confer(
    runtime: Runtime, args: Mapping[str, Any], *, progress: ProgressSink | None = None
) -> dict[str, Any]:
    check_arguments("confer.input.json", args, tool="confer")
    if not (args.get("providers") or runtime.config.panel):
        raise InvalidArguments(
            "no providers to ask: the configured panel is empty; pass `providers` or set `panel`",
            path="$.providers",
            tool="confer",
        )
    call = _Confer(runtime, args, progress)
    with bind_session(call.session.id):
        try:
            return await call.run()
        except anyio.get_cancelled_exc_class():
            close_cancelled_session(runtime, "confer", call.started)
            raise


class _Confer:
    def __init__(self, runtime: Runtime, args: Mapping[str, Any], progress: ProgressSink | None) -> None:
        config = runtime.config
        self.runtime = runtime
        self.args = args
        self.progress = progress
        self.session = Session.open(args.get("session_id"))
        self.tools = ToolPlan.from_args(args, runtime)
        self.providers: tuple[str, ...] = tuple(args.get("providers") or config.panel)
        self.timeout = float(args.get("timeout_seconds") or config.limits.timeout_seconds)
        self.max_tokens = int(args.get("max_tokens") or config.limits.max_tokens)
        self.messages = user_messages(args["question"], args.get("context"))  # one for every member
        self.started = time.perf_counter()

    async def run(self) -> dict[str, Any]:
        telemetry = self.runtime.telemetry
        telemetry.emit(
            "session_start",
            tool="confer",
            providers=list(self.providers),
            worker_tools=list(self.tools.accepted),
            dry_run=bool(self.args.get("dry_run")),
            timeout_seconds=self.timeout,
            question=self.args["question"],
        )
        if self.args.get("dry_run"):
            return self._finish(self._dry_run())
        answers = await self._ask_everyone()
        return self._finish(self._result(answers), answers)

    async def _ask_everyone(self) -> list[Answer]:
        done: dict[str, Answer] = {}
        deadline = anyio.current_time() + self.timeout
        *others, own = self.providers
        async with anyio.create_task_group() as group:
            # The deadline rides on the group's own cancel scope: a second scope around the
            # group cancelled exactly the same tasks, at a scope's set-up and teardown per confer.
            group.cancel_scope.deadline = deadline
            for name in others:
                group.start_soon(self._ask, name, deadline, done)
            # The host task asks one member itself: a spawned task is ~3.6 KB held for the
            # whole provider call (anyio's handle, scope and event), so one fewer per confer.
            await self._ask(own, deadline, done)
        elapsed = (time.perf_counter() - self.started) * 1000.0
        config = self.runtime.config
        return [
            done.get(name) or timed_out(name, config.providers[name].model, elapsed)
            for name in self.providers
        ]

    async def _ask(self, name: str, deadline: float, done: dict[str, Answer]) -> None:
        if name not in self.runtime.config.providers:
            done[name] = unknown_provider(name, self.runtime)
        else:
            turn = self._turn(name, deadline)
            outcome = await self.runtime.worker.run(turn)
            done[name] = answer_of(self.runtime, turn, outcome, tools_on=self._tools_on)
        if self.progress is not None:
            answer = done[name]
            await self.progress(
                {"provider": name, "status": answer.status, "done": len(done), "total": len(self.providers)}
            )

    @property
    def _tools_on(self) -> bool:
        return bool(self.tools.accepted)

    def _turn(self, name: str, deadline: float) -> WorkerTurn:
        args = self.args
        return WorkerTurn(
            provider=self.runtime.providers.get(name),
            messages=self.messages,
            deadline=deadline,
            session_id=self.session.id,
            system=args.get("system"),
            max_tokens=self.max_tokens,
            temperature=args.get("temperature", self.runtime.config.limits.temperature),
            tools=self.tools.accepted,
            cost_cap=self.tools.cap,
            canary=self.session.canary,
        )

    def _result(self, answers: list[Answer]) -> dict[str, Any]:
        usage, price_unknown = total_usage(answers)
        missing = [a for a in answers if not a.ok]
        result: dict[str, Any] = {
            "session_id": self.session.id,
            "degraded": bool(missing),
            "degraded_reasons": [a.reason() for a in missing],
            "answers": [a.to_dict(tools_on=self._tools_on) for a in answers],
            "usage": usage.to_dict(),
            "latency_ms": round((time.perf_counter() - self.started) * 1000.0, 3),
            "warnings": merged_warnings(answers, price_unknown=price_unknown),
        }
        if self.tools.requested:
            blocks = {a.provider: a.cost_cap for a in answers}
            result["worker_tools"] = worker_tools_block(
                self.tools, self.runtime.config.worker_tools.hop_budget, blocks, breakdown="per_provider"
            )
        return result

    def _dry_run(self) -> dict[str, Any]:
        config, args = self.runtime.config, self.args
        system = args.get("system")
        if self._tools_on:
            hint = tool_hint(
                self.runtime.tools,
                self.tools.accepted,
                hop_budget=config.worker_tools.hop_budget,
                canary=self.session.canary,
            )
            system = with_hint(system, hint)
        prompt = "".join(m.content for m in self.messages) + (system or "")
        shape = TurnShape(
            len(prompt.encode("utf-8")),
            self.max_tokens,
            self._tools_on,
            config.worker_tools.hop_budget,
            config.worker_tools.result_max_bytes,
        )
        calls = [planned_call(config, name, shape) for name in self.providers]
        result = self._result([])
        result.update(dry_run=True, plan=summarize(calls))
        return result

    def _finish(self, result: dict[str, Any], answers: list[Answer] | None = None) -> dict[str, Any]:
        runtime = self.runtime
        path = None
        if runtime.transcripts is not None and answers is not None:
            payload = {
                "tool": "confer",
                "session_id": self.session.id,
                "arguments": dict(self.args),
                "result": result,
                "hops": {a.provider: a.exchanges for a in answers},
            }
            path = runtime.transcripts.submit(self.session.id, "confer", payload)
        status = "dry_run" if result.get("dry_run") else ("degraded" if result["degraded"] else "ok")
        runtime.telemetry.emit(
            "session_end",
            tool="confer",
            status=status,
            usage=result["usage"],
            duration_ms=round((time.perf_counter() - self.started) * 1000.0, 3),
            answers=len(result["answers"]),
            ok=sum(a["status"] == "ok" for a in result["answers"]),
            degraded_reasons=result["degraded_reasons"],
            transcript=path,
        )
        return result
