"""`coordinate`: proposer -> critics (in parallel, each seeing only the task and the proposal)
-> synthesizer, for 1-3 rounds, every role answering with a JSON envelope that is validated
and re-prompted once. The synthesizer never gets tools and is never a single point of failure.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
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
    worker_tools_block,
)
from conclave.deliberation.plan import TurnShape, planned_call, summarize
from conclave.deliberation.roles import (
    Role,
    critic_prompt,
    parse_envelope,
    proposer_prompt,
    reprompt,
    role_system,
    synthesizer_prompt,
)
from conclave.messages import Message
from conclave.runtime import Runtime
from conclave.schemas import check_arguments
from conclave.telemetry import session as bind_session
from conclave.worker.hint import tool_hint, with_hint
from conclave.worker.loop import WorkerTurn

TOOL_ROLES = ("proposer", "critic")
MAX_ECHO_CHARS = 20_000


async def coordinate(
    runtime: Runtime, args: Mapping[str, Any], *, progress: ProgressSink | None = None
) -> dict[str, Any]:
    check_arguments("coordinate.input.json", args, tool="coordinate")
    debate = _Debate(runtime, args, progress)
    with bind_session(debate.session.id):
        try:
            return await debate.run()
        except anyio.get_cancelled_exc_class():
            close_cancelled_session(runtime, "coordinate", debate.started)
            raise


@dataclass(frozen=True, slots=True)
class _Cast:
    proposer: str
    critics: tuple[str, ...]
    synthesizers: tuple[str, ...]  # the chosen one first, then the fallbacks

    @classmethod
    def from_args(cls, args: Mapping[str, Any], runtime: Runtime) -> _Cast:
        roles = runtime.config.roles
        synthesizer = args.get("synthesizer") or roles.synthesizer
        fallbacks = [n for n in roles.synthesizer_fallbacks if n != synthesizer]
        return cls(
            args.get("proposer") or roles.proposer,
            tuple(args.get("critics") or roles.critics),
            (synthesizer, *dict.fromkeys(fallbacks)),
        )


class _Debate:
    def __init__(self, runtime: Runtime, args: Mapping[str, Any], progress: ProgressSink | None) -> None:
        config = runtime.config
        self.runtime, self.args, self.progress = runtime, args, progress
        self.session = Session.open(args.get("session_id"))
        self.tools = ToolPlan.from_args(args, runtime)
        self.cast = _Cast.from_args(args, runtime)
        self.rounds = int(args.get("rounds") or 1)
        self.timeout = float(args.get("timeout_seconds") or config.limits.timeout_seconds)
        self.max_tokens = int(args.get("max_tokens") or config.limits.max_tokens)
        self.started = time.perf_counter()
        self.deadline = anyio.current_time() + self.timeout
        self.steps = 0
        self.all_answers: list[Answer] = []

    async def run(self) -> dict[str, Any]:
        self.runtime.telemetry.emit(
            "session_start",
            tool="coordinate",
            providers=[self.cast.proposer, *self.cast.critics, self.cast.synthesizers[0]],
            worker_tools=list(self.tools.accepted),
            dry_run=bool(self.args.get("dry_run")),
            timeout_seconds=self.timeout,
            rounds=self.rounds,
            task=self.args["task"],
        )
        if self.args.get("dry_run"):
            return self._finish(self._dry_run())
        rounds: list[tuple[Answer | None, list[Answer]]] = []
        with anyio.CancelScope(deadline=self.deadline):
            await self._debate(rounds)
        debated = bool(rounds) and rounds[-1][0] is not None and rounds[-1][0].envelope is not None
        synthesis = await self._synthesize(rounds) if debated else None
        return self._finish(self._result(rounds, synthesis))

    # -- the debate ------------------------------------------------------------------------------------

    async def _debate(self, rounds: list[tuple[Answer | None, list[Answer]]]) -> None:
        for number in range(1, self.rounds + 1):
            proposal = await self._propose(number, rounds)
            if proposal.envelope is None:
                if not rounds:  # nothing to review: the debate cannot go on
                    rounds.append((proposal, []))
                return
            critiques = await self._critique(number, proposal)
            rounds.append((proposal, critiques))

    async def _propose(self, number: int, rounds: Sequence[tuple[Answer | None, list[Answer]]]) -> Answer:
        task, context = self.args["task"], self.args.get("context")
        if not rounds:
            prompt = proposer_prompt(task, context)
        else:
            previous, critiques = rounds[-1]
            assert previous is not None
            assert previous.envelope is not None
            prompt = proposer_prompt(
                task, context, previous=previous.envelope, critiques=[_critique_view(c) for c in critiques]
            )
        return await self._role("proposer", self.cast.proposer, prompt, number)

    async def _critique(self, number: int, proposal: Answer) -> list[Answer]:
        assert proposal.envelope is not None
        prompt = critic_prompt(
            self.args["task"], self.args.get("context"), proposal.envelope, round_number=number
        )
        found: dict[str, Answer] = {}

        async def review(name: str) -> None:
            found[name] = await self._role("critic", name, prompt, number)

        async with anyio.create_task_group() as group:
            for name in self.cast.critics:
                group.start_soon(review, name)
        return [found[name] for name in self.cast.critics]

    async def _synthesize(self, rounds: Sequence[tuple[Answer | None, list[Answer]]]) -> Answer:
        proposal, critiques = rounds[-1]
        prompt = synthesizer_prompt(
            self.args["task"],
            self.args.get("context"),
            proposal.envelope if proposal else None,
            [_critique_view(c) for c in critiques],
        )
        failed: list[Answer] = []
        with anyio.CancelScope(deadline=self.deadline):
            for name in self.cast.synthesizers:
                answer = await self._role("synthesizer", name, prompt, len(rounds))
                if answer.envelope is not None:
                    return _with_fallback(answer, failed)
                failed.append(answer)
        elapsed = (time.perf_counter() - self.started) * 1000.0
        last = (
            failed[-1] if failed else timed_out(self.cast.synthesizers[0], None, elapsed, role="synthesizer")
        )
        return _with_fallback(last, failed[:-1]) if failed else last

    # -- one role's turn, envelope validated and re-prompted once ---------------------------------------

    async def _role(self, role: Role, name: str, prompt: str, number: int) -> Answer:
        if name not in self.runtime.config.providers:
            answer = unknown_provider(name, self.runtime, role=role)
        else:
            answer = await self._role_turns(role, name, prompt, number)
        answer.round = number
        self.all_answers.append(answer)
        await self._report(role, answer)
        return answer

    async def _role_turns(self, role: Role, name: str, prompt: str, number: int) -> Answer:
        messages = (Message("user", prompt),)
        tools = self.tools.accepted if role in TOOL_ROLES else ()
        first = await self._turn(role, name, messages, tools)
        first.attempts = 1
        if not first.ok:
            return first
        envelope, error = parse_envelope(role, first.text or "")
        if envelope is not None:
            first.envelope = envelope
            return first
        self._invalid(role, name, number, 1, error or "invalid envelope")
        echoed = (first.text or "")[:MAX_ECHO_CHARS]  # a huge bad reply is not worth paying for twice
        retry_messages = (
            *messages,
            Message("assistant", echoed),
            Message("user", reprompt(role, error or "invalid envelope")),
        )
        second = await self._turn(role, name, retry_messages, ())
        return self._second_try(role, name, number, first, second)

    def _second_try(self, role: Role, name: str, number: int, first: Answer, second: Answer) -> Answer:
        merged = _merge(first, second)
        if not second.ok:
            return merged
        envelope, error = parse_envelope(role, second.text or "")
        if envelope is not None:
            merged.envelope = envelope
            return merged
        self._invalid(role, name, number, 2, error or "invalid envelope", final=True)
        merged.status = "invalid_envelope"
        merged.error = {
            "code": "invalid_envelope",
            "message": f"no valid {role} envelope after a re-prompt: {error}",
        }
        return merged

    async def _turn(
        self, role: Role, name: str, messages: tuple[Message, ...], tools: tuple[str, ...]
    ) -> Answer:
        turn = WorkerTurn(
            provider=self.runtime.providers.get(name),
            messages=messages,
            deadline=self.deadline,
            session_id=self.session.id,
            system=role_system(role),
            max_tokens=self.max_tokens,
            temperature=self.args.get("temperature", self.runtime.config.limits.temperature),
            tools=tools,
            cost_cap=self.tools.cap,
            canary=self.session.canary if tools else "",
            role=role,
        )
        return answer_of(self.runtime, turn, await self.runtime.worker.run(turn), tools_on=bool(tools))

    def _invalid(
        self, role: Role, name: str, number: int, attempt: int, error: str, *, final: bool = False
    ) -> None:
        self.runtime.telemetry.emit(
            "role_envelope_invalid",
            provider=name,
            role=role,
            attempt=attempt,
            round=number,
            error=error,
            final=final,
        )

    async def _report(self, role: Role, answer: Answer) -> None:
        self.steps += 1
        if self.progress is not None:
            await self.progress(
                {
                    "role": role,
                    "provider": answer.provider,
                    "status": answer.status,
                    "round": answer.round,
                    "done": self.steps,
                }
            )

    # -- the result ------------------------------------------------------------------------------------

    def _result(
        self, rounds: list[tuple[Answer | None, list[Answer]]], synthesis: Answer | None
    ) -> dict[str, Any]:
        tools_on = bool(self.tools.accepted)
        final_proposal, final_critiques = rounds[-1] if rounds else (None, [])
        final_proposal = final_proposal or self._missing("proposer", self.cast.proposer)
        missing = self._missing_roles(rounds, final_proposal, synthesis)
        usage, price_unknown = total_usage(self.all_answers)
        result: dict[str, Any] = {
            "session_id": self.session.id,
            "degraded": bool(missing),
            "degraded_reasons": [a.reason() for a in missing],
            "rounds": [
                {
                    "round": n,
                    "proposal": p.to_role_dict(tools_on=tools_on) if p else None,
                    "critiques": [c.to_role_dict(tools_on=tools_on) for c in cs],
                }
                for n, (p, cs) in enumerate(rounds, 1)
            ],
            "proposal": final_proposal.to_role_dict(tools_on=tools_on),
            "critiques": [c.to_role_dict(tools_on=tools_on) for c in final_critiques],
            "synthesis": synthesis.to_role_dict(tools_on=False) if synthesis else None,
            "usage": usage.to_dict(),
            "per_role": self._per_role(),
            "latency_ms": round((time.perf_counter() - self.started) * 1000.0, 3),
            "warnings": merged_warnings(self.all_answers, price_unknown=price_unknown),
        }
        if synthesis is not None and synthesis.fallback_from is not None and synthesis.ok:
            result["warnings"].append("synthesizer_fallback")
        if self.tools.requested:
            result["worker_tools"] = self._worker_tools_block()
        return result

    def _missing_roles(
        self, rounds: list[tuple[Answer | None, list[Answer]]], proposal: Answer, synthesis: Answer | None
    ) -> list[Answer]:
        """Every role whose envelope the result lacks: failed proposals (a failed revision cuts
        the debate short), the final round's failed critiques, and a synthesis nobody delivered."""
        missing = [a for a in self.all_answers if a.role == "proposer" and a.envelope is None]
        if proposal.envelope is None and proposal not in missing:
            missing.append(proposal)
        if rounds:
            missing += [c for c in rounds[-1][1] if c.envelope is None]
        if synthesis is None:
            missing.append(self._missing("synthesizer", self.cast.synthesizers[0]))
        elif synthesis.envelope is None:
            missing += [a for a in self.all_answers if a.role == "synthesizer"]
        return missing

    def _missing(self, role: Role, name: str) -> Answer:
        elapsed = (time.perf_counter() - self.started) * 1000.0
        answer = timed_out(name, None, elapsed, role=role)
        if self.all_answers and role == "synthesizer":
            answer.status, answer.error = (
                "skipped",
                {"code": "no_proposal", "message": "no valid proposal to synthesize"},
            )
        return answer

    def _per_role(self) -> dict[str, Any]:
        per: dict[str, Any] = {}
        for role in ("proposer", "critic", "synthesizer"):
            answers = [a for a in self.all_answers if a.role == role]
            usage, _ = total_usage(answers)
            per[role] = {"usage": usage.to_dict(), "calls": sum(a.hops for a in answers)}
        return per

    def _worker_tools_block(self) -> dict[str, Any]:
        blocks: dict[str, dict[str, object] | None] = {}
        for role in TOOL_ROLES:
            role_blocks = [a.cost_cap for a in self.all_answers if a.role == role and a.cost_cap is not None]
            blocks[role] = _sum_blocks(role_blocks) if role_blocks else None
        return worker_tools_block(
            self.tools,
            self.runtime.config.worker_tools.hop_budget,
            blocks,
            breakdown="per_role",
            applies_to=TOOL_ROLES,
        )

    # -- dry run, transcript, events -------------------------------------------------------------------

    def _dry_run(self) -> dict[str, Any]:
        config, args = self.runtime.config, self.args
        embedded = (1 + len(self.cast.critics)) * self.max_tokens * 2  # earlier outputs quoted back, escaped
        base = len((args["task"] + (args.get("context") or "")).encode("utf-8")) + embedded
        calls = []
        plan: tuple[tuple[Role, tuple[str, ...], int], ...] = (
            ("proposer", (self.cast.proposer,), self.rounds),
            ("critic", self.cast.critics, self.rounds),
            ("synthesizer", self.cast.synthesizers, 1),
        )
        for role, names, repeats in plan:
            tools_on = bool(self.tools.accepted) and role != "synthesizer"
            system = role_system(role)
            if tools_on:
                system = with_hint(
                    system,
                    tool_hint(
                        self.runtime.tools,
                        self.tools.accepted,
                        hop_budget=config.worker_tools.hop_budget,
                        canary=self.session.canary,
                    ),
                )
            shape = TurnShape(
                base + len(system.encode("utf-8")) + 2 * self.max_tokens,
                self.max_tokens,
                tools_on,
                config.worker_tools.hop_budget,
                config.worker_tools.result_max_bytes,
            )
            # every turn may need its re-prompt: twice the calls
            calls += [planned_call(config, name, shape, repeats=2 * repeats, role=role) for name in names]
        result = self._result([], None)
        result.update(
            dry_run=True,
            degraded=False,
            degraded_reasons=[],
            proposal=None,
            synthesis=None,
            plan=summarize(
                calls, rounds=self.rounds, note="synthesizer fallbacks are counted as if every one were tried"
            ),
        )
        return result

    def _finish(self, result: dict[str, Any]) -> dict[str, Any]:
        runtime = self.runtime
        path = None
        if runtime.transcripts is not None and not result.get("dry_run"):
            payload = {
                "tool": "coordinate",
                "session_id": self.session.id,
                "arguments": dict(self.args),
                "result": result,
                "hops": [
                    {"role": a.role, "provider": a.provider, "round": a.round, "exchanges": a.exchanges}
                    for a in self.all_answers
                ],
            }
            path = runtime.transcripts.submit(self.session.id, "coordinate", payload)
        status = "dry_run" if result.get("dry_run") else ("degraded" if result["degraded"] else "ok")
        runtime.telemetry.emit(
            "session_end",
            tool="coordinate",
            status=status,
            usage=result["usage"],
            duration_ms=round((time.perf_counter() - self.started) * 1000.0, 3),
            answers=len(self.all_answers),
            ok=sum(a.envelope is not None for a in self.all_answers),
            degraded_reasons=result["degraded_reasons"],
            transcript=path,
        )
        return result


def _critique_view(answer: Answer) -> dict[str, Any]:
    if answer.envelope is not None:
        return {"critic": answer.provider, "envelope": answer.envelope}
    error = answer.error.get("message") if answer.error else answer.status
    return {"critic": answer.provider, "envelope": None, "error": error}


def _merge(first: Answer, second: Answer) -> Answer:
    """A role's two attempts as one answer: the second's outcome, both attempts' costs."""
    usage, _ = total_usage([first, second])
    return replace(
        second,
        usage=usage,
        hops=first.hops + second.hops,
        attempts=2,
        latency_ms=first.latency_ms + second.latency_ms,
        inner_tool_calls=first.inner_tool_calls + second.inner_tool_calls,
        cost_cap=first.cost_cap,
        exchanges=first.exchanges + second.exchanges,
        warnings=list(dict.fromkeys(first.warnings + second.warnings)),
        text=second.text if second.ok else None,
    )


def _with_fallback(answer: Answer, failed: list[Answer]) -> Answer:
    if failed:
        answer.fallback_from = failed[0].reason()
        answer.fallbacks_tried = [f.reason() for f in failed]
    return answer


def _sum_blocks(blocks: list[dict[str, object]]) -> dict[str, object]:
    first = blocks[0]
    return {
        **first,
        "observed_usd": round(sum(float(str(b["observed_usd"])) for b in blocks), 10),
        "exceeded": any(b["exceeded"] for b in blocks),
        "blocked": any(b["blocked"] for b in blocks),
        "enforceable": all(b.get("enforceable", True) for b in blocks),
    }
