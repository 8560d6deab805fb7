"""`confer`: every provider asked the same question at once, in one task group bounded by
the call's deadline. One failure never fails the call; a partial result says so.

Two optional stages follow (SPEC §9): with `review`, every member that answered ranks the
others' answers blind; with `synthesize`, a chair writes the final answer from them. Both are
role turns (`stages`), so envelopes, re-prompts and fallbacks work as in `coordinate`. With either
stage, the answers are laid out like those turns (the question and context first in the system
prompt), so a member's later turns read them from the cache its answer wrote."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import anyio

from conclave.deliberation import review
from conclave.deliberation.answers import timed_out
from conclave.deliberation.plan import summarize, what_drives_the_bound
from conclave.deliberation.requests import ConferRequest, request_from
from conclave.deliberation.results import (
    Answer,
    ConferResult,
    DegradedReason,
    Ranking,
    Review,
    RoleAnswer,
    Totals,
)
from conclave.deliberation.roles import (
    chair_prompt,
    member_prompt,
    member_system,
    reviewer_prompt,
    shared_system,
    turn_system,
)
from conclave.deliberation.session import ProgressSink, Session, merged_warnings, run_session, user_messages
from conclave.deliberation.stages import PlannedCalls, RoleTurns, synthesizer_chain
from conclave.errors import InvalidArguments
from conclave.runtime import Runtime


async def confer(
    runtime: Runtime, args: Mapping[str, Any] | ConferRequest, *, progress: ProgressSink | None = None
) -> ConferResult:
    """Ask every provider in `providers` (default: the panel); `args` are confer's arguments,
    already valid against `schemas/confer.input.json`, or the request built from them."""
    request = args if isinstance(args, ConferRequest) else request_from(ConferRequest, args)
    if not (request.providers or runtime.config.panel):
        raise InvalidArguments(
            "no providers to ask: the configured panel is empty; pass `providers` or set `panel`",
            path="$.providers",
            tool="confer",
        )
    session = Session(runtime, "confer", request, progress)
    return await run_session(session, _Confer(session, request))


class _Confer:
    def __init__(self, session: Session, request: ConferRequest) -> None:
        self.session, self.request = session, request
        self.providers: tuple[str, ...] = request.providers or session.runtime.config.panel
        self.messages = user_messages(request.question, request.context)
        self.system = request.system
        self.reviewing, self.synthesizing = request.review, request.synthesize
        shared = shared_system(request.question, request.context)
        self.turns = RoleTurns(session, shared, self._planned_calls())
        self.rankings: dict[str, Ranking] = {}  # reviewer -> its valid ranking, as they end

    @property
    def staged(self) -> bool:
        """A review or a synthesis follows the answers: they are laid out like its turns."""
        return self.reviewing or self.synthesizing

    def _planned_calls(self) -> PlannedCalls:
        """The calls that start with the shared part when all goes to plan: every member's answer
        and, with two members or more, its review, with the worker tools; the chair's, without.
        A plain confer has none: each member is asked once, as the caller asked."""
        calls: PlannedCalls = Counter()
        if not self.staged:
            return calls
        reviews = 1 if self.reviewing and len(self.providers) >= 2 else 0
        for name in self.providers:
            calls[(name, self.session.tools.accepted)] += 1 + reviews
        if self.synthesizing:
            calls[(synthesizer_chain(None, self.session.runtime.config.roles)[0], ())] += 1
        return calls

    def opening(self) -> dict[str, Any]:
        return {"providers": list(self.providers), "question": self.request.question}

    async def deliberate(self) -> ConferResult:
        answers = await self._answers()
        peer_review, synthesis = await self._stages(answers)
        return self._result(answers, peer_review, synthesis)

    async def _answers(self) -> list[Answer]:
        done: dict[str, Answer] = {}
        async with anyio.create_task_group() as group:
            group.cancel_scope.deadline = self.session.deadline  # members still out then are timed out
            for name in self.providers:
                group.start_soon(self._ask, name, done)
        config, elapsed = self.session.runtime.config, self.session.elapsed_ms()
        return [
            done.get(name) or timed_out(name, config.providers[name].model, elapsed)
            for name in self.providers
        ]

    async def _stages(self, answers: list[Answer]) -> tuple[Review | None, RoleAnswer | None]:
        """The review and the synthesis the call asked for, within its deadline: what is still
        out then is missing, and says so."""
        peer_review: Review | None = None
        synthesis: RoleAnswer | None = None
        with anyio.CancelScope(deadline=self.session.deadline):
            if self.reviewing:
                await self._review(answers)
                peer_review = self._review_block(answers)
            synthesis = await self._synthesize(answers, peer_review) if self.synthesizing else None
        if self.reviewing:
            peer_review = self._review_block(answers)  # the rankings that ended in time
            self._time_out_missing_reviewers(answers)
        if self.synthesizing and synthesis is None:
            chair = synthesizer_chain(None, self.session.runtime.config.roles)[0]
            synthesis = self.turns.timed_out("synthesizer", chair)
        return peer_review, synthesis

    # -- the review: every member that answered ranks the others, blind ---------------------------------

    def _time_out_missing_reviewers(self, answers: list[Answer]) -> None:
        """A reviewer still out at the deadline is missing, and the result says so."""
        ok = [a.provider for a in answers if a.ok]
        done = {a.provider for a in self.turns.answers if a.role == "reviewer"}
        if len(ok) >= 2:
            self.turns.answers += [self.turns.timed_out("reviewer", p) for p in ok if p not in done]

    async def _review(self, answers: list[Answer]) -> None:
        ok = [a for a in answers if a.ok]
        if len(ok) >= 2:  # one answer has nobody to be compared with
            async with anyio.create_task_group() as group:
                for reviewer in ok:
                    group.start_soon(self._review_by, reviewer.provider, ok)

    def _review_block(self, answers: list[Answer]) -> Review:
        ok = [a.provider for a in answers if a.ok]
        found = tuple(self.rankings[p] for p in ok if p in self.rankings)
        return Review(found, review.aggregate(found, ok), review.agreement(found))

    async def _review_by(self, reviewer: str, ok: list[Answer]) -> None:
        others = [a for a in ok if a.provider != reviewer]
        seating = review.shuffled(self.session.id, reviewer, [a.provider for a in others])
        text_of = {a.provider: a.text or "" for a in others}
        prompt = reviewer_prompt([(label, text_of[who]) for label, who in seating])
        labels = [label for label, _ in seating]
        turn = await self.turns.ask(
            "reviewer",
            reviewer,
            prompt,
            1,
            tools=self.session.tools.accepted,
            check=lambda envelope: review.ranking_problem(envelope, labels),
        )
        ranking = review.read_back(reviewer, turn.envelope, seating) if turn.envelope is not None else None
        if ranking is not None:
            self.rankings[reviewer] = ranking
        self.session.runtime.telemetry.emit(
            "review",
            reviewer=reviewer,
            status=turn.status,
            code=turn.error_code,
            labels=dict(seating),
            ranking=list(ranking.ranking) if ranking else None,
            attempts=turn.attempts,
        )

    # -- the chair: the final answer from the anonymized answers (and the aggregate) --------------------

    async def _synthesize(self, answers: list[Answer], peer_review: Review | None) -> RoleAnswer:
        config = self.session.runtime.config
        chain = synthesizer_chain(None, config.roles)
        ok = [a for a in answers if a.ok]
        if not ok:  # nothing to synthesize from
            error = {"code": "no_answers", "message": "no member answered: nothing to synthesize"}
            return replace(self.turns.timed_out("synthesizer", chain[0]), status="skipped", error=error)
        seating = review.shuffled(self.session.id, "chair", [a.provider for a in ok])
        label_of = {provider: label for label, provider in seating}
        text_of = {a.provider: a.text or "" for a in ok}
        ranked = None
        if peer_review is not None and peer_review.rankings:
            ranked = [{"label": label_of[s.provider], **s.to_dict()} for s in peer_review.aggregate]
            for entry in ranked:
                del entry["provider"]  # the chair sees labels only
        prompt = chair_prompt([(label, text_of[who]) for label, who in seating], ranked)
        synthesis = await self.turns.synthesize(chain, prompt, 1)
        self.session.runtime.telemetry.emit(
            "synthesis",
            provider=synthesis.provider,
            status=synthesis.status,
            code=synthesis.error_code,
            fallback_from=synthesis.fallback_from.provider if synthesis.fallback_from else None,
            reviewed=ranked is not None,
        )
        return synthesis

    async def _ask(self, name: str, done: dict[str, Answer]) -> None:
        tools = self.session.tools.accepted
        if self.staged:
            answer = await self.turns.answer(name, self.system, tools)
        else:
            answer = await self.session.ask(name, self.messages, system=self.system, tools=tools)
        done[name] = answer
        if self.session.progress is not None:
            step = {
                "provider": name,
                "status": answer.status,
                "done": len(done),
                "total": len(self.providers),
            }
            await self.session.progress(step)

    def _result(
        self,
        answers: list[Answer],
        peer_review: Review | None = None,
        synthesis: RoleAnswer | None = None,
        plan: Mapping[str, Any] | None = None,
    ) -> ConferResult:
        stages = self.turns.answers
        totals = Totals.of([*answers, *stages])
        reasons = [DegradedReason.of(a) for a in answers if not a.ok]
        reasons += [a.reason for a in stages if a.role == "reviewer" and a.envelope is None]
        if synthesis is not None and synthesis.envelope is None:
            tried = [a for a in stages if a.role == "synthesizer"] or [synthesis]
            reasons += [a.reason for a in tried]
        reports = {a.provider: [a.cost_cap] if a.cost_cap else [] for a in answers}
        for turn in stages:
            if turn.cost_cap is not None:
                reports.setdefault(turn.provider, []).append(turn.cost_cap)
        warnings = merged_warnings([*answers, *stages], price_unknown=totals.usage.cost_usd is None)
        if synthesis is not None and synthesis.fallback_from is not None and synthesis.ok:
            warnings += ("synthesizer_fallback",)
        return ConferResult(
            session_id=self.session.id,
            degraded=bool(reasons),
            degraded_reasons=tuple(reasons),
            answers=tuple(answers),
            review=peer_review,
            synthesis=synthesis,
            reviewers=tuple(a for a in stages if a.role == "reviewer"),
            usage=totals.usage,
            latency_ms=self.session.elapsed_ms(),
            warnings=warnings,
            worker_tools=self.session.tool_use(reports, breakdown="per_provider"),
            plan=plan,
        )

    def plan(self) -> ConferResult:
        session = self.session
        shape = session.turn_shape(self._asked_bytes(self.staged), tools_on=session.tools_on)
        shared = len(self.turns.shared.encode("utf-8")) if self.staged else 0
        calls = [session.planned_call(name, shape, shared_bytes=shared) for name in self.providers]
        # The stages' bounds start from the question as a plain confer asks it: their own system
        # prompt already counts the shared part.
        planned = calls + self._planned_stages(self._asked_bytes(False))
        return self._result([], plan=summarize(planned, note=what_drives_the_bound(shape)))

    def _asked_bytes(self, staged: bool) -> int:
        """An answer turn's prompt, laid out as `_ask` lays it out with or without stages."""
        session, tools = self.session, self.session.tools.accepted
        if staged:
            system = session.hinted(member_system(self.turns.shared, self.system), tools) or ""
            return len((member_prompt() + system).encode("utf-8"))
        system = session.hinted(self.system, tools) or ""
        return len(("".join(m.content for m in self.messages) + system).encode("utf-8"))

    def _planned_stages(self, asked_bytes: int) -> list[dict[str, Any]]:
        """The review and the synthesis at their largest: every answer quoted in full (escaped),
        every turn re-prompted once; every synthesizer of the chain tried."""
        session, calls = self.session, []
        shared = len(self.turns.shared.encode("utf-8"))
        quoted = asked_bytes + 2 * len(self.providers) * session.max_tokens * 4
        if self.reviewing:
            system = session.hinted(turn_system(self.turns.shared, "reviewer"), session.tools.accepted) or ""
            shape = session.turn_shape(quoted + len(system.encode("utf-8")), tools_on=session.tools_on)
            calls += [
                session.planned_call(n, shape, repeats=2, role="reviewer", shared_bytes=shared)
                for n in self.providers
            ]
        if self.synthesizing:
            system = turn_system(self.turns.shared, "synthesizer")
            shape = session.turn_shape(quoted + len(system.encode("utf-8")), tools_on=False)
            chain = synthesizer_chain(None, session.runtime.config.roles)
            calls += [
                session.planned_call(n, shape, repeats=2, role="synthesizer", shared_bytes=shared)
                for n in chain
            ]
        return calls

    def transcript(self, result: ConferResult) -> dict[str, Any]:
        stages = [
            {"role": a.role, "provider": a.provider, "exchanges": list(a.exchanges)}
            for a in self.turns.answers
        ]
        return {"hops": {a.provider: list(a.exchanges) for a in result.answers}, "stages": stages}

    def tally(self, result: ConferResult) -> tuple[int, int]:
        stages = self.turns.answers
        answered = sum(a.ok for a in result.answers) + sum(a.envelope is not None for a in stages)
        return len(result.answers) + len(stages), answered
