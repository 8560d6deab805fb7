"""The council's vote over structured answers: one tally per voted field, and the consensus.

Pure and deterministic: no I/O, no logging. `tally()` takes the schema the members answered to
and each member's value object (None when it has none that is valid), in panel order, and
returns a `Vote` whose `to_dict()` is the result's `vote` block.

- Voted fields: the schema's top-level properties, in its `properties` order, whose type is
  boolean, number or integer, or that have an `enum` (a closed set of choices); then each of
  `vote_fields` not already there, even one naming no property (its value is read from each
  answer). Free-text strings are otherwise not voted, so a `reason` never blocks a consensus.
- `of` counts the valid answers. A valid answer that lacks a voted field casts no vote on it and
  is a dissent with value None; an explicit `null` is a value like any other.
- Agreement: booleans by equality, and a bool never agrees with a number (True is not 1);
  numbers (int or float) when |a - b| <= tolerance * max(|a|, |b|), so tolerance 0 is exact
  equality (3 == 3.0, -0.0 == 0.0); strings by canonical caseless matching (NFC, case folding)
  with whitespace collapsed and stripped; anything else (lists, objects, null) by its canonical
  JSON (sorted keys). Values of different kinds never agree.
- Each distinct answered value is a candidate, and its votes are the answers agreeing with it,
  counted per candidate since agreement within a tolerance is not transitive (10, 10.5, 11 at
  0.05: 10.5 has 3 votes, 10 and 11 have 2). The most-voted candidate wins, spelled as its first
  giver spelled it; when candidates that do not all agree tie for the most votes there is no
  winner (`winner` None, `votes` the tied count).
- `dissent`: the members, in panel order, whose value does not agree with the winner (every valid
  member when there is none). `share` = votes / of (0.0 when of is 0); `unanimous` when
  votes == of > 0.
- `consensus`: every voted field's winner when each has a strict majority (share > 0.5); else
  None, and `reason` names the first field that failed and why (no valid answer at all, or no
  voted field, is said first). NaN agrees only with NaN and an infinity only with itself; a
  tolerance below 0 or not finite is a ValueError.
"""

from __future__ import annotations

import json
import math
import unicodedata
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from conclave.core.records import record

_VOTED_TYPES = frozenset({"boolean", "number", "integer"})
_MISSING: Any = object()  # a valid answer without the field: no vote, a dissent with value None

NO_VALID_ANSWER = "no member gave a valid answer"
NOTHING_TO_VOTE_ON = (
    "nothing to vote on: the schema has no boolean, number or enum field, and vote_fields names none"
)


@record
class Dissent:
    """A member whose value does not agree with the winner, and that value as it gave it."""

    provider: str
    value: Any

    def to_dict(self) -> dict[str, Any]:
        return {"provider": self.provider, "value": self.value}


@record
class FieldVote:
    """One voted field: the winning value (None on a tie), its votes out of the valid answers."""

    field: str
    winner: Any
    votes: int
    of: int
    share: float
    unanimous: bool
    dissent: tuple[Dissent, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "field": self.field,
            "winner": self.winner,
            "votes": self.votes,
            "of": self.of,
            "share": round(self.share, 4),
            "unanimous": self.unanimous,
            "dissent": [d.to_dict() for d in self.dissent],
        }


@record
class Vote:
    """The council's vote: every voted field, the consensus (None with a reason when there is
    none), and the members without a valid answer."""

    fields: tuple[FieldVote, ...]
    consensus: dict[str, Any] | None
    reason: str | None
    not_counted: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "fields": [f.to_dict() for f in self.fields],
            "consensus": dict(self.consensus) if self.consensus is not None else None,
            "reason": self.reason,
            "not_counted": list(self.not_counted),
        }


def voted_fields(schema: Mapping[str, Any], vote_fields: Sequence[str] = ()) -> tuple[str, ...]:
    """The fields put to the vote, in the schema's `properties` order, then `vote_fields`' own."""
    properties = schema.get("properties")
    out: list[str] = []
    if isinstance(properties, Mapping):
        out.extend(name for name, prop in properties.items() if _is_voted(prop))
    for name in vote_fields:
        if name not in out:
            out.append(name)
    return tuple(out)


def tally(
    schema: Mapping[str, Any],
    answers: Sequence[tuple[str, Mapping[str, Any] | None]],
    *,
    vote_fields: Sequence[str] = (),
    tolerance: float = 0.0,
) -> Vote:
    """Count the valid answers' votes on each voted field; see the module for the rules."""
    if not (tolerance >= 0 and math.isfinite(tolerance)):
        raise ValueError(f"tolerance must be a finite number >= 0, not {tolerance!r}")
    fields = voted_fields(schema, vote_fields)
    valid = [(provider, value) for provider, value in answers if value is not None]
    not_counted = tuple(provider for provider, value in answers if value is None)
    tallied = [_tally_field(name, valid, tolerance) for name in fields]
    if not valid:
        reason: str | None = NO_VALID_ANSWER
    elif not fields:
        reason = NOTHING_TO_VOTE_ON
    else:
        reason = next((why for _, why in tallied if why is not None), None)
    consensus = {f.field: f.winner for f, _ in tallied} if reason is None else None
    return Vote(tuple(f for f, _ in tallied), consensus, reason, not_counted)


def _is_voted(prop: Any) -> bool:
    if not isinstance(prop, Mapping):
        return False
    if "enum" in prop:
        return True
    kind = prop.get("type")
    kinds = {kind} if isinstance(kind, str) else set(kind) if isinstance(kind, list) else set()
    return bool(kinds & _VOTED_TYPES)


def _tally_field(
    name: str, valid: Sequence[tuple[str, Mapping[str, Any]]], tolerance: float
) -> tuple[FieldVote, str | None]:
    """The field's vote, and why it gives no consensus (None when it has a strict majority)."""
    given = [(provider, value.get(name, _MISSING)) for provider, value in valid]
    keys = [_Key.of(value) for _, value in given]
    of = len(given)
    candidates: list[tuple[int, _Key]] = []  # each distinct value, with the index of its first giver
    for i, key in enumerate(keys):
        if key is not None and all(key != seen for _, seen in candidates):
            candidates.append((i, key))
    counts = [
        sum(1 for other in keys if other is not None and key.agrees(other, tolerance))
        for _, key in candidates
    ]
    top = max(counts, default=0)
    leaders = [candidate for candidate, n in zip(candidates, counts, strict=True) if n == top]
    tie = any(not a.agrees(b, tolerance) for i, (_, a) in enumerate(leaders) for _, b in leaders[i + 1 :])
    win = leaders[0] if leaders and not tie else None
    winner_key = win[1] if win is not None else None
    dissent = tuple(
        Dissent(provider, None if value is _MISSING else value)
        for (provider, value), key in zip(given, keys, strict=True)
        if winner_key is None or key is None or not winner_key.agrees(key, tolerance)
    )
    share = top / of if of else 0.0
    vote = FieldVote(
        field=name,
        winner=given[win[0]][1] if win is not None else None,
        votes=top,
        of=of,
        share=share,
        unanimous=of > 0 and top == of,
        dissent=dissent,
    )
    return vote, _why_not(name, vote, tie=tie, answered=bool(candidates))


def _why_not(name: str, vote: FieldVote, *, tie: bool, answered: bool) -> str | None:
    count = f"{vote.votes} of {vote.of}"
    if not answered:
        return f"no strict majority on {name!r}: {count} (no valid answer gives it)"
    if tie:
        lead = "no strict majority" if vote.share <= 0.5 else "no single winner"
        return f"{lead} on {name!r}: {count} (a tie)"
    if vote.share <= 0.5:
        return f"no strict majority on {name!r}: {count}"
    return None


@record
class _Key:
    """A value as it is compared: its kind, and the normalized form agreement reads."""

    kind: str  # bool | number | string | json
    norm: Any

    @classmethod
    def of(cls, value: Any) -> _Key | None:
        if value is _MISSING:
            return None
        if isinstance(value, bool):
            return cls("bool", value)
        if isinstance(value, int | float):
            return cls("number", value)
        if isinstance(value, str):
            return cls("string", _fold(value))
        return cls("json", json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr))

    def agrees(self, other: _Key, tolerance: float) -> bool:
        if self.kind != other.kind:
            return False
        if self.kind != "number":
            return bool(self.norm == other.norm)
        return _near(self.norm, other.norm, tolerance)


def _near(a: float, b: float, tolerance: float) -> bool:
    """|a - b| <= tolerance * max(|a|, |b|); NaN agrees only with NaN, infinity only with itself."""
    if a == b:
        return True
    if not all(math.isfinite(x) for x in (a, b) if isinstance(x, float)):
        return all(isinstance(x, float) and math.isnan(x) for x in (a, b))
    try:
        return abs(a - b) <= tolerance * max(abs(float(a)), abs(float(b)))
    except OverflowError:  # an int too large for a float: compare exactly
        fa, fb = Fraction(a), Fraction(b)
        return abs(fa - fb) <= Fraction(tolerance) * max(abs(fa), abs(fb))


def _fold(text: str) -> str:
    """Canonical caseless form (Unicode's NFD, case fold, then NFC), whitespace collapsed."""
    folded = unicodedata.normalize("NFC", unicodedata.normalize("NFD", text).casefold())
    return " ".join(folded.split())
