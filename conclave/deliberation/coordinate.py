"""`coordinate`: proposer -> critics (in parallel, each seeing only the task and the proposal)
-> synthesizer, for 1-3 rounds, every role answering with a JSON envelope that is validated
and re-prompted once. The synthesizer never gets tools and is never a single point of failure.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import anyio

from conclave.deliberation import pipeline
from conclave.deliberation.pipeline import Stage
from conclave.deliberation.plan import summarize, what_drives_the_bound
from conclave.deliberation.requests import CoordinateRequest, check_quorum, request_from
from conclave.deliberation.results import (
    CoordinateResult,
    RoleAnswer,
    Round,
    ToolUseSummary,
    Totals,
)
from conclave.deliberation.roles import (
    Role,
    critic_prompt,
    proposer_prompt,
    shared_system,
    synthesizer_prompt,
    turn_system,
)
from conclave.deliberation.session import (
    DeltaSink,
    ProgressSink,
    Runtime,
    Session,
    merged_warnings,
    run_session,
    thread_of,
)
from conclave.deliberation.stages import PlannedCalls, RoleTurns, synthesizer_chain
from conclave.schema.answer_schema import check_answer_schema
from conclave.schema.config import RolesConfig

TOOL_ROLES = ("proposer", "critic")
ROLES: tuple[Role, ...] = ("proposer", "critic", "synthesizer")


async def coordinate(
    runtime: Runtime,
    args: Mapping[str, Any] | CoordinateRequest,
    *,
    progress: ProgressSink | None = None,
    deltas: DeltaSink | None = None,
) -> CoordinateResult:
    """Run the debate on `task`; `args` are coordinate's arguments, already valid against
    `schemas/coordinate.input.json`, or the request built from them."""
    request = args if isinstance(args, CoordinateRequest) else request_from(CoordinateRequest, args)
    if request.answer_schema is not None:  # held to the portable subset, as confer's is
        check_answer_schema(request.answer_schema, tool="coordinate")
    critics = request.critics or runtime.config.roles.critics
    check_quorum(request.quorum, len(critics), "coordinate", who="critic")
    thread = thread_of(runtime, request, "coordinate")
    session = Session(runtime, "coordinate", request, progress, deltas, thread)
    return await run_session(session, _Debate(session, request))


@dataclass(frozen=True, slots=True)
class _Cast:
    proposer: str
    critics: tuple[str, ...]
    synthesizers: tuple[str, ...]  # the chosen one first, then the fallbacks

    @classmethod
    def of(cls, request: CoordinateRequest, roles: RolesConfig) -> _Cast:
        return cls(
            request.proposer or roles.proposer,
            request.critics or roles.critics,
            synthesizer_chain(request.synthesizer, roles),
        )


class _Debate:
    def __init__(self, session: Session, request: CoordinateRequest) -> None:
        self.session = session
        self.task, self.context = request.task, request.context
        self.cast = _Cast.of(request, session.runtime.config.roles)
        self.rounds = request.rounds
        self.stop_when_converged = request.stop_when_converged
        self.quorum, self.grace_seconds = request.quorum, request.grace_seconds  # of each round's critics
        self.answer_schema = request.answer_schema  # the synthesis decides a value valid against it
        self.turns = RoleTurns(session, shared_system(self.task, self.context), history=True)
        self.stages: list[Stage] = [_Rounds(self), _Synthesis(self)]
        self.turns.planned = pipeline.planned_calls(self.stages)

    @property
    def all_answers(self) -> list[RoleAnswer]:
        return self.turns.answers

    def opening(self) -> dict[str, Any]:
        cast = self.cast
        return {
            "providers": [cast.proposer, *cast.critics, cast.synthesizers[0]],
            "rounds": self.rounds,
            "task": self.task,
        }

    async def deliberate(self) -> CoordinateResult:
        board = await pipeline.run_stages(self.stages, pipeline.Board())
        return self._result(board.rounds, board.synthesis)

    def role_bounds(self, role: Role, names: tuple[str, ...], repeats: int) -> list[dict[str, Any]]:
        """A role's calls at their largest: each turn re-prompted, each prompt quoting every
        earlier output in full."""
        session = self.session
        embedded = (1 + len(self.cast.critics)) * session.max_tokens * 2  # earlier outputs quoted, escaped
        base = len((self.task + (self.context or "")).encode("utf-8")) + embedded + 2 * session.max_tokens
        base += session.history_bytes(names)
        tools = session.tools.accepted if role in TOOL_ROLES else ()
        system = session.hinted(turn_system(self.turns.shared, role), tools) or ""
        asked = base + len(system.encode("utf-8")) + self._schema_bytes(role)
        shape = session.turn_shape(asked, tools_on=bool(tools))
        shared = len(self.turns.shared.encode("utf-8"))
        return [
            session.planned_call(name, shape, repeats=2 * repeats, role=role, shared_bytes=shared)
            for name in names
        ]

    def _schema_bytes(self, role: Role) -> int:
        """What the answer schema adds to a role's prompt: the proposer is shown the answer's
        shape, the synthesizer what its `value` must be."""
        schema = self.answer_schema
        if schema is None or role == "critic":
            return 0
        if role == "proposer":
            told, plain = proposer_prompt(answer_schema=schema), proposer_prompt()
        else:
            told, plain = synthesizer_prompt(None, [], schema), synthesizer_prompt(None, [])
        return len(told.encode("utf-8")) - len(plain.encode("utf-8"))

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
            thread_id=self.session.thread_id,
            parent=self.session.parent,
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
            converged=bool(rounds) and _converged(rounds[-1]),
            structured=self.answer_schema is not None,
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
        return self.turns.timed_out(role, name)

    def _no_synthesis(self) -> RoleAnswer:
        """The synthesis of a debate that never reached it: out of time, or nothing to synthesize."""
        answer = self._timed_out("synthesizer", self.cast.synthesizers[0])
        if self.all_answers:
            error = {"code": "no_proposal", "message": "no valid proposal to synthesize"}
            answer = replace(answer, status="skipped", error=error)
        return answer

    def _per_role(self) -> dict[str, Totals]:
        return {role: self.turns.totals(role) for role in ROLES}

    def _tool_use(self) -> ToolUseSummary | None:
        reports = {
            role: [a.cost_cap for a in self.all_answers if a.role == role and a.cost_cap is not None]
            for role in TOOL_ROLES
        }
        return self.session.tool_use(reports, breakdown="per_role", applies_to=TOOL_ROLES)

    # -- dry run, transcript, tally --------------------------------------------------------------------

    def plan(self) -> CoordinateResult:
        tools_on = bool(self.session.tools.accepted)
        drives = what_drives_the_bound(self.session.turn_shape(0, tools_on=tools_on))
        note = f"{drives}; synthesizer fallbacks are counted as if every one were tried"
        return CoordinateResult(
            session_id=self.session.id,
            thread_id=self.session.thread_id,
            parent=self.session.parent,
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
            plan=summarize(pipeline.bounds(self.stages), rounds=self.rounds, note=note),
            structured=self.answer_schema is not None,
        )

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


def _converged(last: Round) -> bool:
    """Every critic reviewed the proposal and accepts it as it stands."""
    critiques = last.critiques
    return bool(critiques) and all((c.envelope or {}).get("verdict") == "accept" for c in critiques)


# ---------------------------------------------------------------- the stages


class _Rounds:
    """The debate: each round, the proposer proposes (from round 2, revising in the light of the
    critiques), then the critics review it at once; all within the call's deadline. It stops
    early when a proposal fails (nothing to review) or, unless asked to run every round, once
    every critic accepts."""

    def __init__(self, debate: _Debate) -> None:
        self.debate, self.session, self.turns, self.cast = debate, debate.session, debate.turns, debate.cast

    def planned_calls(self) -> PlannedCalls:
        """The proposer and the critics once a round, with the worker tools."""
        tools, rounds = self.session.tools.accepted, self.debate.rounds
        return Counter({(name, tools): rounds for name in (self.cast.proposer, *self.cast.critics)})

    def bounds(self) -> list[dict[str, Any]]:
        rounds = self.debate.rounds
        proposers = self.debate.role_bounds("proposer", (self.cast.proposer,), rounds)
        return proposers + self.debate.role_bounds("critic", self.cast.critics, rounds)

    async def run(self, board: pipeline.Board) -> None:
        with anyio.CancelScope(deadline=self.session.deadline):
            await self._debate(board.rounds)

    async def _debate(self, rounds: list[Round]) -> None:
        for number in range(1, self.debate.rounds + 1):
            proposal = await self._propose(number, rounds[-1] if rounds else None)
            if proposal.envelope is None:
                if not rounds:  # nothing to review: the debate cannot go on
                    rounds.append(Round(number, proposal))
                return
            rounds.append(Round(number, proposal, await self._critique(number, proposal.envelope)))
            if self.debate.stop_when_converged and _converged(rounds[-1]):
                return  # every critic accepts: more rounds would only cost

    async def _propose(self, number: int, previous: Round | None) -> RoleAnswer:
        schema = self.debate.answer_schema
        if previous is None:
            prompt = proposer_prompt(answer_schema=schema)
        else:
            critiques = [_critique_view(c) for c in previous.critiques]
            prompt = proposer_prompt(
                previous=previous.proposal.envelope, critiques=critiques, answer_schema=schema
            )
        return await self._role("proposer", self.cast.proposer, prompt, number)

    async def _critique(self, number: int, proposal: Mapping[str, Any]) -> tuple[RoleAnswer, ...]:
        """Every critic at once. With a quorum, once that many have given a valid critique the
        rest get `grace_seconds` more (never past the call's deadline), then are stopped as late."""
        prompt = critic_prompt(proposal, round_number=number)
        found: dict[str, RoleAnswer] = {}
        critics, quorum = self.cast.critics, self.debate.quorum

        async with anyio.create_task_group() as group:

            async def review(name: str) -> None:
                found[name] = await self._role("critic", name, prompt, number)
                valid = sum(a.envelope is not None for a in found.values())
                grace_begun = group.cancel_scope.deadline != math.inf
                if quorum is not None and valid >= quorum and len(found) < len(critics) and not grace_begun:
                    group.cancel_scope.deadline = anyio.current_time() + self.debate.grace_seconds

            for name in critics:
                group.start_soon(review, name)
        return tuple(found.get(name) or self.turns.late("critic", name, number) for name in critics)

    async def _role(self, role: Role, name: str, prompt: str, number: int) -> RoleAnswer:
        return await self.turns.ask(role, name, prompt, number, tools=self.session.tools.accepted)


class _Synthesis:
    """The synthesizer writes the final answer from the last round's proposal and critiques,
    falling back along its chain; never with tools. Nothing to synthesize when the debate ended
    without a valid proposal. With an answer schema, it also decides the answer's `value`, held to
    the schema natively and re-prompted once when missing or invalid (as `confer`'s chair); a
    synthesizer that still gives none is a failed one, and the next in the chain is asked."""

    def __init__(self, debate: _Debate) -> None:
        self.debate, self.turns, self.cast = debate, debate.turns, debate.cast

    def planned_calls(self) -> PlannedCalls:
        return Counter({(self.cast.synthesizers[0], ()): 1})

    def bounds(self) -> list[dict[str, Any]]:
        return self.debate.role_bounds("synthesizer", self.cast.synthesizers, 1)

    async def run(self, board: pipeline.Board) -> None:
        last = board.rounds[-1] if board.rounds else None
        if last is None or last.proposal.envelope is None:
            return
        critiques = [_critique_view(c) for c in last.critiques]
        schema = self.debate.answer_schema
        prompt = synthesizer_prompt(last.proposal.envelope, critiques, schema)
        board.synthesis = await self.turns.synthesize(
            self.cast.synthesizers, prompt, last.number, answer_schema=schema
        )
