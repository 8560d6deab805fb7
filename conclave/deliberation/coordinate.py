"""`coordinate`: proposer -> critics (in parallel, each seeing only the task and the proposal)
-> synthesizer, for 1-3 rounds, every role answering with a JSON envelope that is validated
and re-prompted once. The synthesizer never gets tools and is never a single point of failure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import anyio

from conclave.deliberation.answers import timed_out
from conclave.deliberation.plan import summarize
from conclave.deliberation.results import (
    Answer,
    CoordinateResult,
    RoleAnswer,
    Round,
    ToolUseSummary,
    Totals,
)
from conclave.deliberation.roles import (
    Role,
    critic_prompt,
    parse_envelope,
    proposer_prompt,
    reprompt,
    role_system,
    synthesizer_prompt,
)
from conclave.deliberation.session import ProgressSink, Session, merged_warnings, run_session
from conclave.messages import Message
from conclave.runtime import Runtime

TOOL_ROLES = ("proposer", "critic")
ROLES = ("proposer", "critic", "synthesizer")
MAX_ECHO_CHARS = 20_000


async def coordinate(
    runtime: Runtime, args: Mapping[str, Any], *, progress: ProgressSink | None = None
) -> CoordinateResult:
    """Run the debate on `args["task"]`; `args` are coordinate's arguments, already valid against
    `schemas/coordinate.input.json`."""
    session = Session(runtime, "coordinate", args, progress)
    return await run_session(session, _Debate(session))


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
    def __init__(self, session: Session) -> None:
        self.session = session
        self.task: str = session.args["task"]
        self.context: str | None = session.args.get("context")
        self.cast = _Cast.from_args(session.args, session.runtime)
        self.rounds = int(session.args.get("rounds") or 1)
        self.all_answers: list[RoleAnswer] = []

    def opening(self) -> dict[str, Any]:
        cast = self.cast
        return {
            "providers": [cast.proposer, *cast.critics, cast.synthesizers[0]],
            "rounds": self.rounds,
            "task": self.task,
        }

    async def deliberate(self) -> CoordinateResult:
        rounds: list[Round] = []
        with anyio.CancelScope(deadline=self.session.deadline):
            await self._debate(rounds)
        final = rounds[-1].proposal if rounds else None
        synthesis = await self._synthesize(rounds[-1]) if final and final.envelope is not None else None
        return self._result(rounds, synthesis)

    # -- the debate ------------------------------------------------------------------------------------

    async def _debate(self, rounds: list[Round]) -> None:
        for number in range(1, self.rounds + 1):
            proposal = await self._propose(number, rounds[-1] if rounds else None)
            if proposal.envelope is None:
                if not rounds:  # nothing to review: the debate cannot go on
                    rounds.append(Round(number, proposal))
                return
            rounds.append(Round(number, proposal, await self._critique(number, proposal.envelope)))

    async def _propose(self, number: int, previous: Round | None) -> RoleAnswer:
        if previous is None:
            prompt = proposer_prompt(self.task, self.context)
        else:
            critiques = [_critique_view(c) for c in previous.critiques]
            prompt = proposer_prompt(
                self.task, self.context, previous=previous.proposal.envelope, critiques=critiques
            )
        return await self._role("proposer", self.cast.proposer, prompt, number)

    async def _critique(self, number: int, proposal: Mapping[str, Any]) -> tuple[RoleAnswer, ...]:
        prompt = critic_prompt(self.task, self.context, proposal, round_number=number)
        found: dict[str, RoleAnswer] = {}

        async def review(name: str) -> None:
            found[name] = await self._role("critic", name, prompt, number)

        async with anyio.create_task_group() as group:
            for name in self.cast.critics:
                group.start_soon(review, name)
        return tuple(found[name] for name in self.cast.critics)

    async def _synthesize(self, last: Round) -> RoleAnswer:
        prompt = synthesizer_prompt(
            self.task,
            self.context,
            last.proposal.envelope,
            [_critique_view(c) for c in last.critiques],
        )
        failed: list[RoleAnswer] = []
        with anyio.CancelScope(deadline=self.session.deadline):
            for name in self.cast.synthesizers:
                answer = await self._role("synthesizer", name, prompt, last.number)
                if answer.envelope is not None:
                    return _with_fallback(answer, failed)
                failed.append(answer)
        if not failed:  # out of time before any synthesizer answered
            return self._timed_out("synthesizer", self.cast.synthesizers[0])
        return _with_fallback(failed[-1], failed[:-1])

    # -- one role's turn, envelope validated and re-prompted once ---------------------------------------

    async def _role(self, role: Role, name: str, prompt: str, number: int) -> RoleAnswer:
        messages = (Message("user", prompt),)
        first = await self._turn(
            role, name, messages, self.session.tools.accepted if role in TOOL_ROLES else ()
        )
        asked = first.error_code != "unknown_provider"
        answer = RoleAnswer(**_fields(first), role=role, round=number, attempts=1 if asked else 0)
        if first.ok:
            answer = await self._envelope_of(answer, messages)
        self.all_answers.append(answer)
        if self.session.progress is not None:
            await self.session.progress(self._step(answer))
        return answer

    def _step(self, answer: RoleAnswer) -> dict[str, Any]:
        """A progress step: one role has answered."""
        return {
            "role": answer.role,
            "provider": answer.provider,
            "status": answer.status,
            "round": answer.round,
            "done": len(self.all_answers),
        }

    async def _envelope_of(self, first: RoleAnswer, messages: tuple[Message, ...]) -> RoleAnswer:
        """The envelope in the first reply, or in the reply to one re-prompt with the errors."""
        role = first.role
        envelope, error = parse_envelope(role, first.text or "")
        if envelope is not None:
            return replace(first, envelope=envelope)
        self._invalid(first, 1, error or "invalid envelope")
        echoed = (first.text or "")[:MAX_ECHO_CHARS]  # a huge bad reply is not worth paying for twice
        retry = (
            *messages,
            Message("assistant", echoed),
            Message("user", reprompt(role, error or "invalid envelope")),
        )
        second = _merged(first, await self._turn(role, first.provider, retry, ()))
        if not second.ok:
            return second
        envelope, error = parse_envelope(role, second.text or "")
        if envelope is not None:
            return replace(second, envelope=envelope)
        self._invalid(second, 2, error or "invalid envelope", final=True)
        message = f"no valid {role} envelope after a re-prompt: {error}"
        return replace(
            second, status="invalid_envelope", error={"code": "invalid_envelope", "message": message}
        )

    async def _turn(
        self, role: Role, name: str, messages: tuple[Message, ...], tools: tuple[str, ...]
    ) -> Answer:
        return await self.session.ask(name, messages, system=role_system(role), tools=tools, role=role)

    def _invalid(self, answer: RoleAnswer, attempt: int, error: str, *, final: bool = False) -> None:
        self.session.runtime.telemetry.emit(
            "role_envelope_invalid",
            provider=answer.provider,
            role=answer.role,
            attempt=attempt,
            round=answer.round,
            error=error,
            final=final,
            text=answer.text,  # kept only when telemetry.include_content is on
        )

    # -- the result ------------------------------------------------------------------------------------

    def _result(self, rounds: list[Round], synthesis: RoleAnswer | None) -> CoordinateResult:
        proposal = rounds[-1].proposal if rounds else self._timed_out("proposer", self.cast.proposer)
        missing = self._missing_roles(rounds, proposal, synthesis)
        totals = Totals.of(self.all_answers)
        warnings = merged_warnings(self.all_answers, price_unknown=totals.usage.cost_usd is None)
        if synthesis is not None and synthesis.fallback_from is not None and synthesis.ok:
            warnings += ("synthesizer_fallback",)
        return CoordinateResult(
            session_id=self.session.id,
            degraded=bool(missing),
            degraded_reasons=tuple(a.reason for a in missing),
            rounds=tuple(rounds),
            proposal=proposal,
            critiques=rounds[-1].critiques if rounds else (),
            synthesis=synthesis,
            usage=totals.usage,
            per_role=self._per_role(),
            latency_ms=self.session.elapsed_ms(),
            warnings=warnings,
            worker_tools=self._tool_use(),
        )

    def _missing_roles(
        self, rounds: list[Round], proposal: RoleAnswer, synthesis: RoleAnswer | None
    ) -> list[RoleAnswer]:
        """Every role whose envelope the result lacks: failed proposals (a failed revision cuts
        the debate short), the final round's failed critiques, and a synthesis nobody delivered."""
        missing = [a for a in self.all_answers if a.role == "proposer" and a.envelope is None]
        if proposal.envelope is None and proposal not in missing:
            missing.append(proposal)
        if rounds:
            missing += [c for c in rounds[-1].critiques if c.envelope is None]
        if synthesis is None:
            missing.append(self._no_synthesis())
        elif synthesis.envelope is None:
            missing += [a for a in self.all_answers if a.role == "synthesizer"]
        return missing

    def _timed_out(self, role: Role, name: str) -> RoleAnswer:
        return RoleAnswer(**_fields(timed_out(name, None, self.session.elapsed_ms())), role=role)

    def _no_synthesis(self) -> RoleAnswer:
        """The synthesis of a debate that never reached it: out of time, or nothing to synthesize."""
        answer = self._timed_out("synthesizer", self.cast.synthesizers[0])
        if self.all_answers:
            error = {"code": "no_proposal", "message": "no valid proposal to synthesize"}
            answer = replace(answer, status="skipped", error=error)
        return answer

    def _per_role(self) -> dict[str, Totals]:
        return {role: Totals.of([a for a in self.all_answers if a.role == role]) for role in ROLES}

    def _tool_use(self) -> ToolUseSummary | None:
        reports = {
            role: [a.cost_cap for a in self.all_answers if a.role == role and a.cost_cap is not None]
            for role in TOOL_ROLES
        }
        return self.session.tool_use(reports, breakdown="per_role", applies_to=TOOL_ROLES)

    # -- dry run, transcript, tally --------------------------------------------------------------------

    def plan(self) -> CoordinateResult:
        note = "synthesizer fallbacks are counted as if every one were tried"
        return CoordinateResult(
            session_id=self.session.id,
            degraded=False,
            degraded_reasons=(),
            rounds=(),
            proposal=None,
            critiques=(),
            synthesis=None,
            usage=Totals.of([]).usage,
            per_role=self._per_role(),
            latency_ms=self.session.elapsed_ms(),
            warnings=(),
            worker_tools=self._tool_use(),
            plan=summarize(self._planned_calls(), rounds=self.rounds, note=note),
        )

    def _planned_calls(self) -> list[dict[str, Any]]:
        """Every role's calls at their largest: each turn re-prompted, each prompt quoting every
        earlier output in full."""
        session = self.session
        embedded = (1 + len(self.cast.critics)) * session.max_tokens * 2  # earlier outputs quoted, escaped
        base = len((self.task + (self.context or "")).encode("utf-8")) + embedded + 2 * session.max_tokens
        casting: tuple[tuple[Role, tuple[str, ...], int], ...] = (
            ("proposer", (self.cast.proposer,), self.rounds),
            ("critic", self.cast.critics, self.rounds),
            ("synthesizer", self.cast.synthesizers, 1),
        )
        calls = []
        for role, names, repeats in casting:
            tools = session.tools.accepted if role in TOOL_ROLES else ()
            system = session.hinted(role_system(role), tools) or ""
            shape = session.turn_shape(base + len(system.encode("utf-8")), tools_on=bool(tools))
            calls += [session.planned_call(name, shape, repeats=2 * repeats, role=role) for name in names]
        return calls

    def transcript(self, result: CoordinateResult) -> dict[str, Any]:
        hops = [
            {"role": a.role, "provider": a.provider, "round": a.round, "exchanges": list(a.exchanges)}
            for a in self.all_answers
        ]
        return {"hops": hops}

    def tally(self, result: CoordinateResult) -> tuple[int, int]:
        return len(self.all_answers), sum(a.envelope is not None for a in self.all_answers)


def _critique_view(answer: RoleAnswer) -> dict[str, Any]:
    if answer.envelope is not None:
        return {"critic": answer.provider, "envelope": answer.envelope}
    error = answer.error.get("message") if answer.error else answer.status
    return {"critic": answer.provider, "envelope": None, "error": error}


def _fields(answer: Answer) -> dict[str, Any]:
    """An Answer's fields, to make the RoleAnswer that carries them."""
    return {name: getattr(answer, name) for name in Answer.__dataclass_fields__}


def _merged(first: RoleAnswer, second: Answer) -> RoleAnswer:
    """A role's two attempts as one answer: the second's outcome, both attempts' costs."""
    spent = [a for a in (first, second) if a.hops > 0]
    return RoleAnswer(
        **{
            **_fields(second),
            "usage": Totals.of(spent).usage,
            "hops": first.hops + second.hops,
            "latency_ms": first.latency_ms + second.latency_ms,
            "inner_tool_calls": first.inner_tool_calls + second.inner_tool_calls,
            "cost_cap": first.cost_cap,
            "exchanges": first.exchanges + second.exchanges,
            "warnings": tuple(dict.fromkeys(first.warnings + second.warnings)),
            "text": second.text if second.ok else None,
        },
        role=first.role,
        round=first.round,
        attempts=2,
    )


def _with_fallback(answer: RoleAnswer, failed: Sequence[RoleAnswer]) -> RoleAnswer:
    if not failed:
        return answer
    return replace(answer, fallback_from=failed[0].reason, fallbacks_tried=tuple(f.reason for f in failed))
