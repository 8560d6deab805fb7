"""The arithmetic of `confer`'s blind peer review (docs/tools.md#confer): labels shuffled per
reviewer, a reviewer's ranking read back into providers, the Borda aggregate and the reviewers'
agreement. Pure functions; the stage that asks the reviewers is in `confer`."""

from __future__ import annotations

import itertools
import random
import string
from collections.abc import Mapping, Sequence
from typing import Any

from conclave.deliberation.results import Ranking, Standing

LABELS = tuple(f"Response {letter}" for letter in string.ascii_uppercase)


def shuffled(session_id: str, seat: str, providers: Sequence[str]) -> list[tuple[str, str]]:
    """(label, provider) for `providers` in an order shuffled for this `seat` (a reviewer, or the
    chair): reproducible from the session id, so a rerun of the session shows the same order,
    and different per seat, so no position favours one answer for every reviewer."""
    order = list(providers)
    random.Random(f"{session_id}\x1f{seat}").shuffle(order)
    return list(zip(LABELS, order, strict=False))


def wire_schema(labels: Sequence[str]) -> dict[str, Any]:
    """The reviewer envelope for one reviewer's labels, exactly: every label ranked once, a note
    for each, in the portable subset (so a provider can hold the reply to it natively, strictly
    where it can; the reply is still checked against the reviewer schema and `ranking_problem`)."""
    label = {"type": "string", "enum": list(labels)}
    note = {"type": "string", "description": "what makes this answer better or worse than the others"}
    return {
        "type": "object",
        "properties": {
            "ranking": {"type": "array", "items": label, "minItems": len(labels), "maxItems": len(labels)},
            "notes": {
                "type": "object",
                "properties": dict.fromkeys(labels, note),
                "required": list(labels),
                "additionalProperties": False,
            },
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["ranking", "notes", "confidence"],
        "additionalProperties": False,
    }


def ranking_problem(envelope: Mapping[str, Any], labels: Sequence[str]) -> str | None:
    """Why a reviewer envelope's ranking is not the labels it was shown, each exactly once."""
    ranking, shown = list(envelope.get("ranking") or ()), set(labels)
    unknown = [label for label in ranking if label not in shown]
    if unknown:
        return f"$.ranking: {unknown} were not shown to you; rank exactly these labels: {list(labels)}"
    missing = [label for label in labels if label not in ranking]
    if missing or len(ranking) != len(labels):
        return f"$.ranking: {missing} are missing; rank every label exactly once: {list(labels)}"
    strays = [label for label in envelope.get("notes") or {} if label not in shown]
    if strays:
        return f"$.notes: {strays} were not shown to you; give notes for these labels only: {list(labels)}"
    return None


def read_back(reviewer: str, envelope: Mapping[str, Any], seating: Sequence[tuple[str, str]]) -> Ranking:
    """A valid reviewer envelope with its labels replaced by the providers behind them."""
    provider_of = dict(seating)
    notes = {provider_of[label]: note for label, note in (envelope.get("notes") or {}).items()}
    ranking = tuple(provider_of[label] for label in envelope["ranking"])
    return Ranking(reviewer, ranking, notes, envelope.get("confidence"))


def aggregate(rankings: Sequence[Ranking], providers: Sequence[str]) -> tuple[Standing, ...]:
    """Every provider's standing, best first. Borda points per ranking run from 1 (first) to 0
    (last), so rankings of different lengths weigh the same, and are averaged over the reviews
    the answer got; ties go to the better mean rank, then to the name."""
    standings = []
    for provider in providers:
        places = [(r.ranking.index(provider), len(r.ranking)) for r in rankings if provider in r.ranking]
        points = [(n - 1 - i) / (n - 1) if n > 1 else 1.0 for i, n in places]
        borda = round(sum(points) / len(points), 6) if points else 0.0
        mean_rank = round(sum(i + 1 for i, _ in places) / len(places), 6) if places else None
        standings.append(Standing(provider, borda, mean_rank, len(places)))
    worst = float(len(providers) + 1)
    return tuple(sorted(standings, key=lambda s: (-s.borda, s.mean_rank or worst, s.provider)))


def agreement(rankings: Sequence[Ranking]) -> float | None:
    """Kendall's W of the rankings, from the mean Spearman correlation of each pair of rankings
    over the answers both ranked: W = ((m - 1) * mean_rho + 1) / m for m rankings, which is
    Kendall's W exactly when every reviewer ranked the same answers. Reviewers never rank their
    own answer, so pairs compare their common answers; None with fewer than two rankings, or
    when no pair shares two answers."""
    rhos = [rho for a, b in itertools.combinations(rankings, 2) if (rho := _spearman(a, b)) is not None]
    if not rhos:
        return None
    m = len(rankings)
    w = ((m - 1) * (sum(rhos) / len(rhos)) + 1) / m
    return round(min(1.0, max(0.0, w)), 6)


def _spearman(a: Ranking, b: Ranking) -> float | None:
    common = [p for p in a.ranking if p in b.ranking]
    n = len(common)
    if n < 2:
        return None
    in_b = sorted(common, key=b.ranking.index)
    d_squared = sum((i - in_b.index(p)) ** 2 for i, p in enumerate(common))
    return 1 - 6 * d_squared / (n * (n * n - 1))
