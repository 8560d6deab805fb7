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

from conclave.tail import format_event
from conclave.ui.sessions import SessionSummary

Key = tuple[str | None, str, int | None]  # (role, provider, round) of one member's turn


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
    error: str | None = None
    latency_ms: float | None = None
    cost_usd: float | None = None
    hops: int = 0
    tool_mode: str | None = None
    calls: tuple[Hop, ...] = ()
    warnings: tuple[str, ...] = ()
    fallback_from: str | None = None


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
    degraded: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    answers: tuple[Turn, ...] = ()
    rounds: tuple[Round, ...] = ()
    review: Review | None = None
    synthesis: Turn | None = None
    usage: Mapping[str, Any] = field(default_factory=dict)
    latency_ms: float | None = None
    per_role: Mapping[str, Any] = field(default_factory=dict)
    converged: bool | None = None
    activity: tuple[str, ...] = ()  # while it runs: its events, one line each, as `conclave tail` shows them


def from_transcript(summary: SessionSummary, transcript: Mapping[str, Any]) -> SessionView:
    result = _mapping(transcript.get("result"))
    arguments = _mapping(transcript.get("arguments"))
    exchanges = _exchanges(transcript)
    rounds = tuple(_round(r, exchanges) for r in _dicts(result.get("rounds")))
    synthesis = result.get("synthesis")
    return SessionView(
        summary=summary,
        question=_text(arguments.get("question") or arguments.get("task")),
        context=_text(arguments.get("context")),
        degraded=tuple(describe_reason(r) for r in _dicts(result.get("degraded_reasons"))),
        warnings=tuple(str(w) for w in result.get("warnings") or ()),
        answers=tuple(
            _turn(a, exchanges.get((None, str(a.get("provider")), None))) for a in _answers(result)
        ),
        rounds=rounds,
        review=_review(result.get("review")),
        synthesis=_turn(synthesis, _own(exchanges, synthesis)) if isinstance(synthesis, dict) else None,
        usage=_mapping(result.get("usage")),
        latency_ms=_number(result.get("latency_ms")),
        per_role=_mapping(result.get("per_role")),
        converged=result.get("converged") if isinstance(result.get("converged"), bool) else None,
    )


def from_events(summary: SessionSummary, events: Sequence[Mapping[str, Any]]) -> SessionView:
    """A session without a transcript (still running, or one whose transcript is gone)."""
    start = next((e for e in events if e.get("event") == "session_start"), {})
    end = next((e for e in events if e.get("event") == "session_end"), {})
    return SessionView(
        summary=summary,
        question=_text(start.get("question") or start.get("task")),
        degraded=tuple(describe_reason(r) for r in _dicts(end.get("degraded_reasons"))),
        usage=_mapping(end.get("usage")),
        latency_ms=_number(end.get("duration_ms")),
        activity=tuple(format_event(e) for e in events),
    )


def describe_reason(reason: Mapping[str, Any]) -> str:
    """A `degraded_reasons[]` entry as a sentence part: `sim-openai (critic): timeout [code]`."""
    role = f" ({reason['role']})" if reason.get("role") else ""
    code = f" [{reason['code']}]" if reason.get("code") else ""
    return f"{reason.get('provider', '?')}{role}: {reason.get('status', '?')}{code}"


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
        error=_error(error),
        latency_ms=_number(raw.get("latency_ms")),
        cost_usd=_number(usage.get("cost_usd")),
        hops=int(raw.get("hops") or 0),
        tool_mode=_text(raw.get("tool_mode")),
        calls=_hops(exchanges or ()),
        warnings=tuple(str(w) for w in raw.get("warnings") or ()),
        fallback_from=describe_reason(fallback) if isinstance(fallback, dict) else None,
    )


def _error(error: Mapping[str, Any]) -> str | None:
    if not error:
        return None
    return f"{error.get('code', 'error')}: {error.get('message', '')}".rstrip(": ")


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
