"""`confer`: every provider asked the same question at once, in one task group bounded by
the call's deadline. One failure never fails the call; a partial result says so."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio

from conclave.deliberation.answers import timed_out
from conclave.deliberation.plan import summarize
from conclave.deliberation.results import Answer, ConferResult, DegradedReason, Totals
from conclave.deliberation.session import ProgressSink, Session, merged_warnings, run_session, user_messages
from conclave.errors import InvalidArguments
from conclave.runtime import Runtime


async def confer(
    runtime: Runtime, args: Mapping[str, Any], *, progress: ProgressSink | None = None
) -> ConferResult:
    """Ask every provider in `args["providers"]` (default: the panel); `args` are confer's
    arguments, already valid against `schemas/confer.input.json`."""
    if not (args.get("providers") or runtime.config.panel):
        raise InvalidArguments(
            "no providers to ask: the configured panel is empty; pass `providers` or set `panel`",
            path="$.providers",
            tool="confer",
        )
    session = Session(runtime, "confer", args, progress)
    return await run_session(session, _Confer(session))


class _Confer:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.providers: tuple[str, ...] = tuple(session.args.get("providers") or session.runtime.config.panel)
        self.messages = user_messages(session.args["question"], session.args.get("context"))
        self.system: str | None = session.args.get("system")

    def opening(self) -> dict[str, Any]:
        return {"providers": list(self.providers), "question": self.session.args["question"]}

    async def deliberate(self) -> ConferResult:
        done: dict[str, Answer] = {}
        async with anyio.create_task_group() as group:
            group.cancel_scope.deadline = self.session.deadline  # members still out then are timed out
            for name in self.providers:
                group.start_soon(self._ask, name, done)
        config, elapsed = self.session.runtime.config, self.session.elapsed_ms()
        answers = [
            done.get(name) or timed_out(name, config.providers[name].model, elapsed)
            for name in self.providers
        ]
        return self._result(answers)

    async def _ask(self, name: str, done: dict[str, Answer]) -> None:
        tools = self.session.tools.accepted
        done[name] = answer = await self.session.ask(name, self.messages, system=self.system, tools=tools)
        if self.session.progress is not None:
            step = {
                "provider": name,
                "status": answer.status,
                "done": len(done),
                "total": len(self.providers),
            }
            await self.session.progress(step)

    def _result(self, answers: list[Answer], plan: Mapping[str, Any] | None = None) -> ConferResult:
        totals = Totals.of(answers)
        missing = [a for a in answers if not a.ok]
        reports = {a.provider: [a.cost_cap] if a.cost_cap else [] for a in answers}
        return ConferResult(
            session_id=self.session.id,
            degraded=bool(missing),
            degraded_reasons=tuple(DegradedReason.of(a) for a in missing),
            answers=tuple(answers),
            usage=totals.usage,
            latency_ms=self.session.elapsed_ms(),
            warnings=merged_warnings(answers, price_unknown=totals.usage.cost_usd is None),
            worker_tools=self.session.tool_use(reports, breakdown="per_provider"),
            plan=plan,
        )

    def plan(self) -> ConferResult:
        session = self.session
        system = session.hinted(self.system, session.tools.accepted)
        prompt = "".join(m.content for m in self.messages) + (system or "")
        shape = session.turn_shape(len(prompt.encode("utf-8")), tools_on=session.tools_on)
        return self._result(
            [], plan=summarize([session.planned_call(name, shape) for name in self.providers])
        )

    def transcript(self, result: ConferResult) -> dict[str, Any]:
        return {"hops": {a.provider: list(a.exchanges) for a in result.answers}}

    def tally(self, result: ConferResult) -> tuple[int, int]:
        return len(result.answers), sum(a.ok for a in result.answers)
