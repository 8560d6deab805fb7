"""A deliberation as a sequence of stages over one board.

`confer` is the members' answers, then optionally a blind review, then optionally a chair's
synthesis; `coordinate` is the debate's rounds, then the synthesis. Each stage is a small
object with one protocol: it says which calls it will make when all goes to plan (so the
turns that share a prompt prefix mark it for the providers' caches), bounds its calls for a
dry run, and runs: it reads what earlier stages left on the board, does its work within the
call's deadline, and leaves its own product there, with what it could not finish in time
marked as missing. The result is read off the board. A new stage (a vote over structured
answers, say) is one new class, added to the list its tool composes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from conclave.deliberation.results import Answer, Review, RoleAnswer, Round
from conclave.deliberation.stages import PlannedCalls
from conclave.deliberation.vote import Vote


@dataclass(slots=True)
class Board:
    """What the stages of one call have produced so far."""

    answers: list[Answer] = field(default_factory=list)  # confer: the members' own answers
    review: Review | None = None  # confer: the blind peer review
    rounds: list[Round] = field(default_factory=list)  # coordinate: the debate
    synthesis: RoleAnswer | None = None
    vote: Vote | None = None  # confer with answer_schema: the vote over the members' answers


class Stage(Protocol):
    def planned_calls(self) -> PlannedCalls:
        """The calls this stage makes when all goes to plan that start with the session's shared
        part, by provider and the worker tools they carry."""

    def bounds(self) -> list[dict[str, Any]]:
        """This stage's calls at their largest, for a dry run's plan (`plan.planned_call`)."""

    async def run(self, board: Board) -> None:
        """Do the work, within the call's deadline, and leave the product on the board."""


def planned_calls(stages: Sequence[Stage]) -> PlannedCalls:
    total: PlannedCalls = Counter()
    for stage in stages:
        total.update(stage.planned_calls())
    return total


def bounds(stages: Sequence[Stage]) -> list[dict[str, Any]]:
    return [call for stage in stages for call in stage.bounds()]


async def run_stages(stages: Sequence[Stage], board: Board) -> Board:
    """Each stage in turn: a stage that finds the deadline past finishes at once, marking its
    product missing, so every stage always leaves the board complete."""
    for stage in stages:
        await stage.run(board)
    return board
