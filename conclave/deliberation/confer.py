"""`confer`: every provider asked the same question at once, in one task group bounded by
the call's deadline. One failure never fails the call; a partial result says so.

Two optional stages follow (docs/tools.md#confer): with `review`, every member that answered
ranks the others' answers blind; with `synthesize`, a chair writes the final answer from them. Both are
role turns (`stages`), so envelopes, re-prompts and fallbacks work as in `coordinate`. With either
stage, the answers are laid out like those turns (the question and context first in the system
prompt), so a member's later turns read them from the cache its answer wrote."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import anyio

from conclave.core.errors import InvalidArguments, PartialResult
from conclave.core.messages import Message
from conclave.deliberation import pipeline, review
from conclave.deliberation.answers import failed_for_good, late, timed_out
from conclave.deliberation.pipeline import Stage
from conclave.deliberation.plan import TurnShape, summarize, what_drives_the_bound
from conclave.deliberation.requests import ConferRequest, check_quorum, request_from
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
    answer_instruction,
    chair_prompt,
    member_system,
    reviewer_prompt,
    shared_system,
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
    user_messages,
)
from conclave.deliberation.stages import PlannedCalls, RoleTurns, synthesizer_chain
from conclave.deliberation.structured import structured_answer
from conclave.deliberation.vote import FieldVote, Vote, tally
from conclave.schema.answer_schema import check_answer_schema


async def confer(
    runtime: Runtime,
    args: Mapping[str, Any] | ConferRequest,
    *,
    progress: ProgressSink | None = None,
    deltas: DeltaSink | None = None,
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
    _check_structured(request)
    check_quorum(request.quorum, len(request.providers or runtime.config.panel), "confer")
    session = Session(runtime, "confer", request, progress, deltas, thread_of(runtime, request, "confer"))
    result = await run_session(session, _Confer(session, request))
    _check_partial(request, result)
    return result


def _check_partial(request: ConferRequest, result: ConferResult) -> None:
    """With `on_partial: "error"`, a result short of every member (of the quorum, when the call
    set one) is a tool error carrying what arrived."""
    if request.on_partial != "error" or result.dry_run:
        return
    needed = request.quorum or len(result.answers)
    answered = sum(a.ok for a in result.answers)
    if answered >= needed:
        return
    missing = ", ".join(f"{a.provider} ({a.status})" for a in result.answers if not a.ok)
    message = (
        f"partial result: {answered} of {len(result.answers)} members answered, {needed} needed "
        f"(on_partial: error); missing: {missing}"
    )
    raise PartialResult(message, answers=result.to_dict()["answers"], result=result)


def _check_structured(request: ConferRequest) -> None:
    """`answer_schema` holds to the portable subset; the vote's options need it."""
    if request.answer_schema is not None:
        check_answer_schema(request.answer_schema)
        return
    for option in ("vote_fields", "tolerance"):
        if option in request.arguments:
            raise InvalidArguments(f"{option} needs answer_schema", path=f"$.{option}", tool="confer")


class _Confer:
    """The members' answers, then the stages the call asked for (`pipeline`)."""

    def __init__(self, session: Session, request: ConferRequest) -> None:
        self.session, self.request = session, request
        self.providers: tuple[str, ...] = request.providers or session.runtime.config.panel
        self.turns = RoleTurns(session, shared_system(request.question, request.context))
        staged = request.review or request.synthesize
        self.members = _Answers(session, self.turns, request, self.providers, staged=staged)
        self.stages: list[Stage] = [self.members]
        if request.answer_schema is not None:
            self.stages.append(_Vote(session, request, request.answer_schema))
        if request.review:
            self.stages.append(_Review(session, self.turns, self.providers, self.members))
        if request.synthesize:
            self.stages.append(_Chair(session, self.turns, self.providers, self.members))
        self.turns.planned = pipeline.planned_calls(self.stages)

    def opening(self) -> dict[str, Any]:
        return {"providers": list(self.providers), "question": self.request.question}

    async def deliberate(self) -> ConferResult:
        board = await pipeline.run_stages(self.stages, pipeline.Board())
        return self._result(board)

    def _result(self, board: pipeline.Board, plan: Mapping[str, Any] | None = None) -> ConferResult:
        answers, synthesis, stages = board.answers, board.synthesis, self.turns.answers
        replaced = self.members.replaced
        totals = Totals.of([*answers, *stages, *replaced])
        reasons = [DegradedReason.of(a) for a in answers if not a.ok]
        reasons += [a.reason for a in stages if a.role == "reviewer" and a.envelope is None]
        if synthesis is not None and synthesis.envelope is None:
            tried = [a for a in stages if a.role == "synthesizer"] or [synthesis]
            reasons += [a.reason for a in tried]
        reports = {a.provider: [a.cost_cap] if a.cost_cap else [] for a in answers}
        for turn in (*stages, *replaced):
            if turn.cost_cap is not None:
                reports.setdefault(turn.provider, []).append(turn.cost_cap)
        warnings = merged_warnings([*answers, *stages], price_unknown=totals.usage.cost_usd is None)
        if synthesis is not None and synthesis.fallback_from is not None and synthesis.ok:
            warnings += ("synthesizer_fallback",)
        return ConferResult(
            session_id=self.session.id,
            thread_id=self.session.thread_id,
            parent=self.session.parent,
            degraded=bool(reasons),
            degraded_reasons=tuple(reasons),
            answers=tuple(answers),
            review=board.review,
            synthesis=synthesis,
            reviewers=tuple(a for a in stages if a.role == "reviewer"),
            usage=totals.usage,
            latency_ms=self.session.elapsed_ms(),
            warnings=warnings,
            worker_tools=self.session.tool_use(reports, breakdown="per_provider"),
            plan=plan,
            vote=board.vote,
        )

    def plan(self) -> ConferResult:
        plan = summarize(pipeline.bounds(self.stages), note=what_drives_the_bound(self.members.shape()))
        return self._result(pipeline.Board(), plan=plan)

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


# ---------------------------------------------------------------- the stages


class _Answers:
    """Every member answers at once, in one task group bounded by the call's deadline; a member
    still out then is timed out. With a `quorum`, once that many have answered ok the rest get
    `grace_seconds` more, then are stopped as late. With a stage after it, each answer is laid out like that
    stage's turns (the question and context first in the system prompt), so the member's next
    turn reads them from the cache this one wrote."""

    def __init__(
        self,
        session: Session,
        turns: RoleTurns,
        request: ConferRequest,
        providers: tuple[str, ...],
        *,
        staged: bool,
    ) -> None:
        self.session, self.turns, self.providers, self.staged = session, turns, providers, staged
        self.request, self.system = request, request.system
        self.schema = request.answer_schema
        self.messages = self.asked(staged)
        self.scope: anyio.CancelScope | None = None  # the members' task group's, while they answer
        self.grace_ends: float | None = None  # when the quorum's grace ends, once it has begun
        self.standing_in: set[str] = set()  # fallbacks that took a member's seat in this call
        self.replaced: list[Answer] = []  # what the members a fallback replaced spent: it counts too

    def planned_calls(self) -> PlannedCalls:
        """A plain confer sends each member the caller's question as it is: nothing shared."""
        tools = self.session.tools.accepted
        return Counter({(name, tools): 1 for name in self.providers} if self.staged else {})

    def bounds(self) -> list[dict[str, Any]]:
        shared = len(self.turns.shared.encode("utf-8")) if self.staged else 0
        shape = self.shape()
        repeats = 1 if self.schema is None else 2  # a structured answer may be asked for again
        return [
            self.session.planned_call(name, shape, repeats=repeats, shared_bytes=shared) | seat
            for name, seat in self.seats()
        ]

    def seats(self) -> list[tuple[str, dict[str, str]]]:
        """Whoever may answer, for the dry run's bound: each member, then its fallbacks (marked
        `fallback_for`), counted as if every one were asked."""
        return [
            (name, {"fallback_for": member} if name != member else {})
            for member in self.providers
            for name in (member, *self.stand_ins(member))
        ]

    def stand_ins(self, member: str) -> tuple[str, ...]:
        """The fallbacks that may answer for `member`: those not already among the call's members."""
        entry = self.session.runtime.config.providers.get(member)
        return tuple(name for name in entry.fallbacks if name not in self.providers) if entry else ()

    def shape(self) -> TurnShape:
        return self.session.turn_shape(self.asked_bytes(self.staged), tools_on=self.session.tools_on)

    def asked_bytes(self, staged: bool) -> int:
        """An answer turn's prompt, laid out as `_ask` lays it out with or without stages."""
        session, tools = self.session, self.session.tools.accepted
        if staged:
            system = session.hinted(member_system(self.turns.shared, self.system), tools) or ""
        else:
            system = session.hinted(self.system, tools) or ""
        asked = len(("".join(m.content for m in self.asked(staged)) + system).encode("utf-8"))
        return asked + session.history_bytes([name for name, _ in self.seats()])

    def asked(self, staged: bool) -> tuple[Message, ...]:
        """What a member is asked, laid out with or without stages; for a structured answer, the
        schema's instruction last."""
        instruction = None if self.schema is None else answer_instruction(self.schema)
        if staged:
            return self.turns.member_messages(instruction)
        return user_messages(self.request.question, self.request.context, instruction)

    def quoted_bytes(self) -> int:
        """A later stage's prompt at its largest: the question as a plain confer asks it (the
        stage's own system prompt counts the shared part), and every answer quoted in full,
        escaped, re-prompted once."""
        return self.asked_bytes(False) + 2 * len(self.providers) * self.session.max_tokens * 4

    async def run(self, board: pipeline.Board) -> None:
        done: dict[str, Answer] = {}
        async with anyio.create_task_group() as group:
            group.cancel_scope.deadline = self.session.deadline  # members still out then are timed out
            self.scope = group.cancel_scope
            for name in self.providers:
                group.start_soon(self._ask, name, done)
        config, elapsed = self.session.runtime.config, self.session.elapsed_ms()
        missing = timed_out if self.grace_ends is None else late  # the grace ended it, not the deadline
        board.answers = [
            done.get(name) or missing(name, config.providers[name].model, elapsed) for name in self.providers
        ]
        for answer in board.answers:
            if answer.status == "late":
                self.session.runtime.telemetry.emit(
                    "member_late", provider=answer.provider, elapsed_ms=round(elapsed, 3)
                )

    def _quorum_reached(self, done: Mapping[str, Answer]) -> None:
        """Once `quorum` members have answered ok, those still out get `grace_seconds` more (never
        past the call's deadline), then are stopped: their requests cancelled, their status late."""
        quorum = self.request.quorum
        if quorum is None or self.grace_ends is not None or len(done) == len(self.providers):
            return
        if sum(a.ok for a in done.values()) < quorum:
            return
        ends = anyio.current_time() + self.request.grace_seconds
        if self.scope is not None and ends < self.scope.deadline:
            self.scope.deadline, self.grace_ends = ends, ends

    async def _send(self, name: str, messages: tuple[Message, ...], tools: tuple[str, ...]) -> Answer:
        if self.staged:
            return await self.turns.answer(name, messages, self.system, tools, self.schema)
        return await self.session.ask(
            name, messages, system=self.system, tools=tools, answer_schema=self.schema, history=True
        )

    async def _ask(self, name: str, done: dict[str, Answer]) -> None:
        answer = await self._answer(name)
        if failed_for_good(answer):
            answer = await self._stand_in(name, answer)
        done[name] = answer
        self._quorum_reached(done)
        if self.session.progress is not None:
            step = {
                "provider": name,
                "status": answer.status,
                "done": len(done),
                "total": len(self.providers),
            }
            await self.session.progress(step)

    async def _answer(self, name: str) -> Answer:
        tools = self.session.tools.accepted
        if self.schema is None:
            return await self._send(name, self.messages, tools)
        return await structured_answer(
            lambda messages, tools: self._send(name, messages, tools),
            self.messages,
            tools,
            self.schema,
            self.session.runtime.telemetry,
        )

    async def _stand_in(self, member: str, failed: Answer) -> Answer:
        """The first of the member's fallbacks not among the call's members (nor standing in for
        another) answers in its place, naming it in `fallback_from`; the next is tried while each
        fails for good too. `failed` as it is when the member has none left."""
        answer = failed
        for name in self.stand_ins(member):
            if name in self.standing_in:
                continue
            self.standing_in.add(name)
            self.replaced.append(answer)
            self.session.runtime.telemetry.emit(
                "member_fallback",
                provider=member,
                fallback=name,
                status=failed.status,
                code=failed.error_code,
            )
            answer = await self._answer(name)
            if not failed_for_good(answer):
                break
        if answer is failed:
            return failed
        warnings = (*answer.warnings, "member_fallback")
        return replace(answer, fallback_from=DegradedReason.replaced(failed), warnings=warnings)


class _Vote:
    """The vote over the members' structured answers (docs/tools.md#structured-answers-and-the-vote):
    counted, not asked, so it makes no call."""

    def __init__(self, session: Session, request: ConferRequest, schema: Mapping[str, Any]) -> None:
        self.session, self.request, self.schema = session, request, schema

    def planned_calls(self) -> PlannedCalls:
        return Counter()

    def bounds(self) -> list[dict[str, Any]]:
        return []

    async def run(self, board: pipeline.Board) -> None:
        vote = tally(
            self.schema,
            [(a.provider, a.value) for a in board.answers],
            vote_fields=self.request.vote_fields,
            tolerance=self.request.tolerance,
        )
        self.session.runtime.telemetry.emit(
            "vote",
            fields=[_counted(field) for field in vote.fields],
            consensus=vote.consensus is not None,
            reason=vote.reason,
            not_counted=list(vote.not_counted),
        )
        board.vote = vote


def _counted(field: FieldVote) -> dict[str, Any]:
    """A voted field as the event log keeps it: the counts, never the values."""
    return {
        "field": field.field,
        "votes": field.votes,
        "of": field.of,
        "share": round(field.share, 4),
        "unanimous": field.unanimous,
        "tie": field.winner is None and field.of > 0,
    }


class _Review:
    """Every member that answered ranks the others' answers, blind (shuffled labels), within
    the call's deadline; a reviewer still out then is missing, and the result says so."""

    def __init__(
        self, session: Session, turns: RoleTurns, providers: tuple[str, ...], members: _Answers
    ) -> None:
        self.session, self.turns, self.providers, self.members = session, turns, providers, members
        self.rankings: dict[str, Ranking] = {}  # reviewer -> its valid ranking, as they end

    def planned_calls(self) -> PlannedCalls:
        if len(self.providers) < 2:  # one answer has nobody to be compared with
            return Counter()
        tools = self.session.tools.accepted
        return Counter({(name, tools): 1 for name in self.providers})

    def bounds(self) -> list[dict[str, Any]]:
        session, shared = self.session, len(self.turns.shared.encode("utf-8"))
        system = session.hinted(turn_system(self.turns.shared, "reviewer"), session.tools.accepted) or ""
        shape = session.turn_shape(
            self.members.quoted_bytes() + len(system.encode("utf-8")), tools_on=session.tools_on
        )
        return [
            session.planned_call(n, shape, repeats=2, role="reviewer", shared_bytes=shared) | seat
            for n, seat in self.members.seats()
        ]

    async def run(self, board: pipeline.Board) -> None:
        ok = [a for a in board.answers if a.ok]
        with anyio.CancelScope(deadline=self.session.deadline):
            if len(ok) >= 2:
                async with anyio.create_task_group() as group:
                    for reviewer in ok:
                        group.start_soon(self._review_by, reviewer.provider, ok)
        found = tuple(self.rankings[a.provider] for a in ok if a.provider in self.rankings)
        board.review = Review(
            found, review.aggregate(found, [a.provider for a in ok]), review.agreement(found)
        )
        done = {a.provider for a in self.turns.answers if a.role == "reviewer"}
        if len(ok) >= 2:
            self.turns.answers += [
                self.turns.timed_out("reviewer", a.provider) for a in ok if a.provider not in done
            ]

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
            schema=review.wire_schema(labels),
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


class _Chair:
    """A chair writes the final answer from the anonymized answers (and the review's aggregate,
    when there was one), falling back along the synthesizer chain; never with tools."""

    def __init__(
        self, session: Session, turns: RoleTurns, providers: tuple[str, ...], members: _Answers
    ) -> None:
        self.session, self.turns, self.providers, self.members = session, turns, providers, members
        self.chain = synthesizer_chain(None, session.runtime.config.roles)

    def planned_calls(self) -> PlannedCalls:
        return Counter({(self.chain[0], ()): 1})

    def bounds(self) -> list[dict[str, Any]]:
        session, shared = self.session, len(self.turns.shared.encode("utf-8"))
        system = turn_system(self.turns.shared, "synthesizer")
        shape = session.turn_shape(self.members.quoted_bytes() + len(system.encode("utf-8")), tools_on=False)
        return [
            session.planned_call(n, shape, repeats=2, role="synthesizer", shared_bytes=shared)
            for n in self.chain
        ]

    async def run(self, board: pipeline.Board) -> None:
        with anyio.CancelScope(deadline=self.session.deadline):
            board.synthesis = await self._synthesize(board.answers, board.review, board.vote)
        if board.synthesis is None:  # out of time before the chair could start
            board.synthesis = self.turns.timed_out("synthesizer", self.chain[0])

    async def _synthesize(
        self, answers: list[Answer], peer_review: Review | None, vote: Vote | None
    ) -> RoleAnswer:
        ok = [a for a in answers if a.ok]
        if not ok:  # nothing to synthesize from
            error = {"code": "no_answers", "message": "no member answered: nothing to synthesize"}
            return replace(self.turns.timed_out("synthesizer", self.chain[0]), status="skipped", error=error)
        seating = review.shuffled(self.session.id, "chair", [a.provider for a in ok])
        label_of = {provider: label for label, provider in seating}
        text_of = {a.provider: a.text or "" for a in ok}
        ranked = None
        if peer_review is not None and peer_review.rankings:
            ranked = [{"label": label_of[s.provider], **s.to_dict()} for s in peer_review.aggregate]
            for entry in ranked:
                del entry["provider"]  # the chair sees labels only
        schema = self.members.schema
        if schema is None or vote is None:
            prompt = chair_prompt([(label, text_of[who]) for label, who in seating], ranked)
            synthesis = await self.turns.synthesize(self.chain, prompt, 1)
        else:
            counts = [
                {"field": f.field, "winner": f.winner, "votes": f.votes, "of": f.of} for f in vote.fields
            ]
            answers_seen = [(label, text_of[who]) for label, who in seating]
            prompt = chair_prompt(answers_seen, ranked, (schema, counts))
            synthesis = await self.turns.synthesize(self.chain, prompt, 1, answer_schema=schema)
        self.session.runtime.telemetry.emit(
            "synthesis",
            provider=synthesis.provider,
            status=synthesis.status,
            code=synthesis.error_code,
            fallback_from=synthesis.fallback_from.provider if synthesis.fallback_from else None,
            reviewed=ranked is not None,
        )
        return synthesis
