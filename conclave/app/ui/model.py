"""One session as the page shows it: a transcript (or, while it runs, its events) turned into plain
records, so the HTML is a pure rendering of them and the tests can read them without a browser.

A transcript is the call's JSON result plus every hop's exchanges (`deliberation/transcripts.py`):
confer keeps them by provider under `hops` and the stages' under `stages`, coordinate keeps one
entry per role, provider and round under `hops`. Everything here is read defensively: a transcript
from another version, or a hand-edited one, shows what it has instead of failing the page.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conclave.app.labels import plural, reason_codes, reason_label, unique
from conclave.app.tail import format_event
from conclave.app.ui.sessions import SessionSummary

Key = tuple[str | None, str, int | None]  # (role, provider, round) of one member's turn


@dataclass(frozen=True, slots=True)
class Reason:
    """Why a part is missing (a `degraded_reasons[]` entry, or whom a fallback replaced): who, in
    which role, what happened in words, and the codes it was recorded with."""

    provider: str
    role: str | None
    label: str
    codes: tuple[str, ...]

    @property
    def who(self) -> str:
        return f"{self.provider} ({self.role})" if self.role else self.provider


@dataclass(frozen=True, slots=True)
class CostPart:
    """One line of where a session's cost went: a confer's answers, review and synthesis, or a
    coordinate's roles. The parts add up to the session's total (a remainder nobody accounts
    for is a part of its own, so nothing is hidden)."""

    name: str
    detail: str  # "3 answers", "1 call"
    cost_usd: float | None
    usage: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Hop:
    """One tool call inside a member's turn: what the model wrote to make it (the tag, for the tag
    protocol; nothing, for a native call), the arguments it gave, the call's outcome, and the
    neutralized result that was fed back to the model."""

    number: int
    tool: str
    status: str
    reason: str | None = None
    said: str | None = None
    result: str | None = None
    arguments: str | None = None  # as JSON


@dataclass(frozen=True, slots=True)
class Turn:
    """One member's answer in one role."""

    provider: str
    model: str
    status: str
    role: str | None = None
    text: str | None = None
    envelope: Mapping[str, Any] | None = None
    error: str | None = None  # the error's message (a provider's words: untrusted)
    error_code: str | None = None
    latency_ms: float | None = None
    cost_usd: float | None = None
    hops: int = 0
    tool_mode: str | None = None
    calls: tuple[Hop, ...] = ()
    warnings: tuple[str, ...] = ()
    fallback_from: Reason | None = None
    value: Mapping[str, Any] | None = None  # a structured answer's object (with answer_schema)


@dataclass(frozen=True, slots=True)
class Dissent:
    """A member whose value on a voted field does not agree with the winner, and that value."""

    provider: str
    value: Any


@dataclass(frozen=True, slots=True)
class VotedField:
    """One field put to the vote: its winner (`won` False when there is none: a tie, or no valid
    answer gives the field), the votes for it (the tied count, on a tie) out of the valid answers
    (`of`), their share, and who dissented with what."""

    field: str
    winner: Any
    won: bool
    votes: int | None
    of: int | None
    share: float | None
    unanimous: bool
    dissent: tuple[Dissent, ...] = ()


@dataclass(frozen=True, slots=True)
class Vote:
    """A confer's vote over its structured answers (the result's `vote`): every voted field, the
    consensus (None, with the reason, when there is none), and the members not counted."""

    fields: tuple[VotedField, ...]
    consensus: Mapping[str, Any] | None
    reason: str | None
    not_counted: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Round:
    number: int
    proposal: Turn | None
    critiques: tuple[Turn, ...]


@dataclass(frozen=True, slots=True)
class Ranking:
    reviewer: str
    ranking: tuple[str, ...]
    notes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Review:
    rankings: tuple[Ranking, ...]
    aggregate: tuple[Mapping[str, Any], ...]
    top: str | None
    agreement: float | None


@dataclass(frozen=True, slots=True)
class SessionView:
    summary: SessionSummary
    question: str | None = None
    context: str | None = None
    degraded: tuple[Reason, ...] = ()
    warnings: tuple[str, ...] = ()  # codes, each once
    answers: tuple[Turn, ...] = ()
    rounds: tuple[Round, ...] = ()
    review: Review | None = None
    vote: Vote | None = None
    synthesis: Turn | None = None
    usage: Mapping[str, Any] = field(default_factory=dict)
    latency_ms: float | None = None
    per_role: Mapping[str, Any] = field(default_factory=dict)
    converged: bool | None = None
    costs: tuple[CostPart, ...] = ()
    rounds_asked: int | None = None  # coordinate
    rounds_run: int | None = None
    stop_reason: str | None = None
    dry_run: bool = False
    planned: tuple[str, ...] = ()  # a dry run's members, as session_start names them
    activity: tuple[str, ...] = ()  # while it runs: its events, one line each, as `conclave tail` shows them


def from_transcript(summary: SessionSummary, transcript: Mapping[str, Any]) -> SessionView:
    result = _mapping(transcript.get("result"))
    arguments = _mapping(transcript.get("arguments"))
    exchanges = _exchanges(transcript)
    rounds = tuple(_round(r, exchanges) for r in _dicts(result.get("rounds")))
    synthesis = result.get("synthesis")
    degraded = _reasons(result.get("degraded_reasons"))
    coordinate = "coordinate" in (summary.tool, transcript.get("tool"))
    asked = (_int(arguments.get("rounds")) or 1) if coordinate else None  # 1: the input schema's default
    converged = result.get("converged") if isinstance(result.get("converged"), bool) else None
    ran = _int(result.get("rounds_run"))
    ran = len(rounds) if ran is None and coordinate else ran
    stopped = None
    if asked is not None and converged is not None:
        stopped = _stop_reason(asked, ran, converged, degraded, rounds)
    return SessionView(
        summary=summary,
        question=_text(arguments.get("question") or arguments.get("task")),
        context=_text(arguments.get("context")),
        degraded=degraded,
        warnings=unique(str(w) for w in result.get("warnings") or ()),
        answers=tuple(
            _turn(a, exchanges.get((None, str(a.get("provider")), None))) for a in _answers(result)
        ),
        rounds=rounds,
        review=_review(result.get("review")),
        vote=_vote(result.get("vote")),
        synthesis=_turn(synthesis, _own(exchanges, synthesis)) if isinstance(synthesis, dict) else None,
        usage=_mapping(result.get("usage")),
        latency_ms=_number(result.get("latency_ms")),
        per_role=_mapping(result.get("per_role")),
        converged=converged,
        costs=_role_costs(result) if coordinate else _confer_costs(result, transcript),
        rounds_asked=asked,
        rounds_run=ran,
        stop_reason=stopped,
    )


def from_events(summary: SessionSummary, events: Sequence[Mapping[str, Any]]) -> SessionView:
    """A session without a transcript: still running, a dry run (which writes none), or one whose
    transcript is gone."""
    start = next((e for e in events if e.get("event") == "session_start"), {})
    end = next((e for e in events if e.get("event") == "session_end"), {})
    return SessionView(
        summary=summary,
        question=_text(start.get("question") or start.get("task")),
        degraded=_reasons(end.get("degraded_reasons")),
        usage=_mapping(end.get("usage")),
        latency_ms=_number(end.get("duration_ms")),
        rounds_asked=_int(start.get("rounds")),
        dry_run=start.get("dry_run") is True or summary.status == "dry_run",
        planned=unique(p for p in start.get("providers") or () if isinstance(p, str)),
        activity=tuple(format_event(e) for e in events),
    )


def describe_reason(reason: Mapping[str, Any]) -> Reason:
    """A `degraded_reasons[]` entry in words, its codes kept (each once)."""
    return Reason(
        provider=str(reason.get("provider", "?")),
        role=_text(reason.get("role")),
        label=reason_label(reason),
        codes=reason_codes(reason),
    )


def _reasons(raw: Any) -> tuple[Reason, ...]:
    """Each reason once: the same member failing the same way twice is one line."""
    return tuple(dict.fromkeys(describe_reason(r) for r in _dicts(raw)))


def _stop_reason(
    asked: int, ran: int | None, converged: bool, degraded: Sequence[Reason], rounds: Sequence[Round]
) -> str:
    """Why a debate ran the rounds it ran, in words, from the result's own fields: `converged`
    (the last round's critics all accepted), `rounds_run` against the rounds asked, a failed
    proposal among the degraded reasons (a failed proposal ends the debate), and the last
    round's verdicts. (A result without `converged`, from before it was kept, gets none.)"""
    ran = ran or 0
    if converged:
        skipped = asked - ran
        rest = f"; the {plural(skipped, 'remaining round')} did not run" if skipped > 0 else ""
        return f"every critic accepted{rest}"
    proposer = next((r for r in degraded if r.role == "proposer"), None)
    if proposer is not None and "timeout" in proposer.codes:
        return "out of time: the proposer did not answer before the call's deadline"
    if proposer is not None:
        return f"a proposal failed ({proposer.label}), so the debate could not go on"
    if ran >= asked:
        last = rounds[-1].critiques if rounds else ()
        holdouts = [c.provider for c in last if (c.envelope or {}).get("verdict") != "accept"]
        who = f"{', '.join(holdouts)} had not accepted" if holdouts else "not every critic accepted"
        return f"rounds exhausted: after the last round asked for, {who}"
    return "out of time: the call's deadline ended the debate"


# -- where the cost went ----------------------------------------------------------------------


def _confer_costs(result: Mapping[str, Any], transcript: Mapping[str, Any]) -> tuple[CostPart, ...]:
    """The answers, the review and the synthesis. The result keeps no usage for the review, so
    it is read from the transcript's stages: every exchange of every reviewer (and of every
    synthesizer tried, fallbacks included)."""
    answers = _answers(result)
    parts = [CostPart("answers", plural(len(answers), "answer"), *_spent(_usages(answers)))]
    stages = _dicts(transcript.get("stages"))
    reviewers = [s for s in stages if s.get("role") == "reviewer"]
    if reviewers:
        detail = plural(len(reviewers), "reviewer")
        parts.append(CostPart("review", detail, *_spent(_stage_usages(reviewers))))
    synthesizers = [s for s in stages if s.get("role") == "synthesizer"]
    synthesis = result.get("synthesis")
    if synthesizers:
        detail = plural(len(synthesizers), "synthesizer") + (" tried" if len(synthesizers) > 1 else "")
        parts.append(CostPart("synthesis", detail, *_spent(_stage_usages(synthesizers))))
    elif isinstance(synthesis, dict):  # a transcript without stages: the synthesis's own usage
        parts.append(CostPart("synthesis", "1 synthesizer", *_spent(_usages([synthesis]))))
    return _with_remainder(parts, _mapping(result.get("usage")))


def _role_costs(result: Mapping[str, Any]) -> tuple[CostPart, ...]:
    """A coordinate's `per_role` totals, as the CLI shows them."""
    parts = []
    for role, entry in _mapping(result.get("per_role")).items():
        usage = _mapping(_mapping(entry).get("usage"))
        calls = _int(_mapping(entry).get("calls")) or 0
        parts.append(CostPart(str(role), plural(calls, "call"), _number(usage.get("cost_usd")), usage))
    return _with_remainder(parts, _mapping(result.get("usage"))) if parts else ()


def _with_remainder(parts: list[CostPart], total: Mapping[str, Any]) -> tuple[CostPart, ...]:
    """The parts, and what of the total none of them accounts for (a transcript from another
    version, say) when that shows at the page's precision."""
    whole = _number(total.get("cost_usd"))
    costs = [p.cost_usd for p in parts]
    if whole is not None and None not in costs:
        rest = whole - sum(c for c in costs if c is not None)
        if abs(rest) >= 5e-7:  # below what fmt_cost shows
            parts.append(CostPart("not attributed", "in the total, in no part above", rest))
    return tuple(parts)


def _usages(turns: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [_mapping(t.get("usage")) for t in turns]


def _stage_usages(stages: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The usage of every model exchange of the stages (tool exchanges carry none)."""
    found = []
    for stage in stages:
        found += [e["usage"] for e in _dicts(stage.get("exchanges")) if isinstance(e.get("usage"), dict)]
    return found


_TOKENS = ("input_tokens", "cached_input_tokens", "output_tokens", "reasoning_tokens")


def _spent(usages: Sequence[Mapping[str, Any]]) -> tuple[float | None, dict[str, Any]]:
    """The cost (None when any part's price is unknown: never a guess) and the tokens."""
    costs = [_number(u.get("cost_usd")) for u in usages]
    cost = None if None in costs else sum(c for c in costs if c is not None)
    tokens = {key: sum(_int(u.get(key)) or 0 for u in usages) for key in _TOKENS}
    return cost, {**tokens, "cost_usd": cost}


# -- members' turns ---------------------------------------------------------------------------


def _answers(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    return _dicts(result.get("answers"))


def _round(raw: Mapping[str, Any], exchanges: Mapping[Key, list[Any]]) -> Round:
    proposal = raw.get("proposal")
    return Round(
        number=int(raw.get("round") or 0),
        proposal=_turn(proposal, _own(exchanges, proposal)) if isinstance(proposal, dict) else None,
        critiques=tuple(_turn(c, _own(exchanges, c)) for c in _dicts(raw.get("critiques"))),
    )


def _own(exchanges: Mapping[Key, list[Any]], turn: Any) -> list[Any] | None:
    """A role's exchanges: coordinate keys them by round too, confer's stages do not."""
    if not isinstance(turn, dict):
        return None
    role, provider = turn.get("role"), str(turn.get("provider"))
    return exchanges.get((role, provider, turn.get("round"))) or exchanges.get((role, provider, None))


def _turn(raw: Mapping[str, Any], exchanges: Iterable[Any] | None) -> Turn:
    usage = _mapping(raw.get("usage"))
    error = _mapping(raw.get("error"))
    fallback = raw.get("fallback_from")
    envelope = raw.get("envelope")
    return Turn(
        provider=str(raw.get("provider", "?")),
        model=str(raw.get("model", "?")),
        status=str(raw.get("status", "?")),
        role=_text(raw.get("role")),
        text=_text(raw.get("text")),
        envelope=envelope if isinstance(envelope, dict) else None,
        error=_text(error.get("message")),
        error_code=_text(error.get("code")) or ("error" if error else None),
        latency_ms=_number(raw.get("latency_ms")),
        cost_usd=_number(usage.get("cost_usd")),
        hops=int(raw.get("hops") or 0),
        tool_mode=_text(raw.get("tool_mode")),
        calls=_hops(exchanges or ()),
        warnings=unique(str(w) for w in raw.get("warnings") or ()),
        fallback_from=describe_reason(fallback) if isinstance(fallback, dict) else None,
        value=value if isinstance(value := raw.get("value"), dict) else None,
    )


def _hops(exchanges: Iterable[Any]) -> tuple[Hop, ...]:
    """Each tool exchange, with the model text of the call that asked for it (the model exchange
    just before it)."""
    hops: list[Hop] = []
    said: str | None = None
    for exchange in exchanges:
        if not isinstance(exchange, dict):
            continue
        call = exchange.get("tool_call")
        if not isinstance(call, dict):
            said = _text(exchange.get("text"))
            continue
        hops.append(
            Hop(
                number=int(exchange.get("hop") or call.get("hop") or 0),
                tool=str(call.get("name", "?")),
                status=str(call.get("status", "?")),
                reason=_text(call.get("reason")),
                said=said,
                result=_text(exchange.get("tool_result")),
                arguments=_arguments(exchange.get("arguments")),
            )
        )
        said = None  # a second call in the same model turn was written by the same text
    return tuple(hops)


def _arguments(raw: Any) -> str | None:
    """A call's arguments as indented JSON; transcripts from before they were kept have none."""
    if not isinstance(raw, dict):
        return None
    return json.dumps(raw, ensure_ascii=False, indent=2)


def _exchanges(transcript: Mapping[str, Any]) -> dict[Key, list[Any]]:
    """Every turn's exchanges by (role, provider, round); confer's answers have no role."""
    found: dict[Key, list[Any]] = {}
    hops = transcript.get("hops")
    if isinstance(hops, dict):  # confer: the answers, by provider
        found.update({(None, str(p), None): list(e) for p, e in hops.items() if isinstance(e, list)})
    entries = _dicts(hops) + _dicts(transcript.get("stages"))  # coordinate's roles, confer's stages
    for entry in entries:
        key = (_text(entry.get("role")), str(entry.get("provider")), _int(entry.get("round")))
        found[key] = list(entry.get("exchanges") or ())
    return found


def _review(raw: Any) -> Review | None:
    if not isinstance(raw, dict):
        return None
    rankings = tuple(
        Ranking(
            reviewer=str(r.get("reviewer", "?")),
            ranking=tuple(str(p) for p in r.get("ranking") or ()),
            notes={str(k): str(v) for k, v in _mapping(r.get("notes")).items()},
        )
        for r in _dicts(raw.get("rankings"))
    )
    top = raw.get("top")
    return Review(rankings, tuple(_dicts(raw.get("aggregate"))), _text(top), _number(raw.get("agreement")))


def _vote(raw: Any) -> Vote | None:
    """The result's `vote` block (docs/tools.md#structured-answers-and-the-vote), as it is."""
    if not isinstance(raw, dict):
        return None
    consensus = raw.get("consensus")
    return Vote(
        fields=tuple(_voted_field(f) for f in _dicts(raw.get("fields"))),
        consensus=consensus if isinstance(consensus, dict) else None,
        reason=_text(raw.get("reason")),
        not_counted=tuple(str(p) for p in raw.get("not_counted") or () if isinstance(p, str)),
    )


def _voted_field(raw: Mapping[str, Any]) -> VotedField:
    """A `winner` of null is no winner (a tie) unless the dissent says otherwise: an explicit null
    can win a vote too, and then some valid answers agree with it (the dissent is not all of
    them), while with no winner every valid answer is a dissent."""
    winner, of = raw.get("winner"), _int(raw.get("of"))
    dissent = tuple(Dissent(str(d.get("provider", "?")), d.get("value")) for d in _dicts(raw.get("dissent")))
    return VotedField(
        field=str(raw.get("field", "?")),
        winner=winner,
        won=winner is not None or (of is not None and len(dissent) < of),
        votes=_int(raw.get("votes")),
        of=of,
        share=_number(raw.get("share")),
        unanimous=raw.get("unanimous") is True,
        dissent=dissent,
    )


# -- defensive readers ------------------------------------------------------------------------


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
