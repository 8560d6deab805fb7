"""How a member is asked to answer an item, and whether its answer is right.

Each kind of item is answered through a JSON Schema (`answer_schema`), so the council votes on
and scoring reads one field (`scored_field`), never a number or a letter guessed out of prose:

- number: `{reason, value: number}`, right when within the item's relative tolerance;
- choice: `{reason, choice: one of the option letters}`, right when it is the answer's letter
  (or, from a reply not held to the schema, the option's text);
- exact:  `{reason, answer: string}`, right when equal once normalized (`normalize`); the
  vote counts `answer` too (`vote_fields`), since a free string is otherwise not voted;
- judge:  free text, no schema: a judge panel scores it (judging.py), not this module.

`reason` comes first in each schema: models write an object's members in schema order, and one
that gives its working before the value gets arithmetic right far more often than one that
commits to a number first.
"""

from __future__ import annotations

import math
from typing import Any

from conclave.app.evals.suite import Item, letters, normalize, parse_number

__all__ = ["DEFAULT_TOLERANCE", "answer_schema", "normalize", "score", "scored_field", "vote_fields"]

DEFAULT_TOLERANCE = 1e-9  # relative: equal but for floating-point noise (0.1 + 0.2 is 0.3)

_REASON = {
    "type": "string",
    "description": "The working or the deciding reasons, briefly, before the answer.",
}
_FIELDS: dict[str, str] = {"number": "value", "choice": "choice", "exact": "answer"}


def answer_schema(item: Item) -> dict[str, Any] | None:
    """The schema a member answers `item` through (inside the portable subset every provider
    takes, and strict-mode compatible: closed, every member required); None for a judge item,
    answered in free text."""
    field = scored_field(item)
    if field is None:
        return None
    return {
        "type": "object",
        "properties": {"reason": _REASON, field: _field_schema(item)},
        "required": ["reason", field],
        "additionalProperties": False,
    }


def _field_schema(item: Item) -> dict[str, Any]:
    if item.kind == "number":
        return {
            "type": "number",
            "description": "The number asked for, as a plain number: no units, no thousands separators.",
        }
    if item.kind == "choice":
        return {
            "type": "string",
            "enum": list(letters(len(item.choices))),
            "description": "The letter of the option chosen.",
        }
    return {"type": "string", "description": "The answer itself, as short as the question allows."}


def scored_field(item: Item) -> str | None:
    """The member of the answer object that is scored: value, choice or answer; None for judge."""
    return _FIELDS.get(item.kind)


def vote_fields(item: Item) -> tuple[str, ...]:
    """Fields the council's vote must count beyond those it counts of itself (numbers and enums):
    the free-text `answer` of an exact item."""
    return ("answer",) if item.kind == "exact" else ()


def score(item: Item, value: Any) -> bool:
    """Whether `value`, the scored field's value (not the whole answer object), is right.
    A value of the wrong type is wrong, not an error; a judge item is a ValueError, since only
    the judge panel can score it."""
    if item.kind == "judge":
        raise ValueError(f"item {item.id!r} is a judge item: the judge panel scores it, not score()")
    if item.kind == "number":
        return _number_right(item, value)
    if not isinstance(value, str):
        return False
    if item.kind == "choice":
        return _choice_right(item, value)
    return normalize(value) == normalize(str(item.answer))


def _number_right(item: Item, value: Any) -> bool:
    """|value - answer| <= tolerance * max(|value|, |answer|): the relative rule the vote uses,
    so an answer the council agreed on is scored by the same yardstick."""
    if isinstance(value, bool):
        return False
    if isinstance(value, str):
        number = parse_number(value)
    elif isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float is no answer in range of any item
            return False
    else:
        return False
    if number is None or not math.isfinite(number):
        return False
    expected = float(item.answer)
    tolerance = item.tolerance if item.tolerance is not None else DEFAULT_TOLERANCE
    return number == expected or abs(number - expected) <= tolerance * max(abs(number), abs(expected))


def _choice_right(item: Item, value: str) -> bool:
    """The answer's letter (either case), or the text of the answer's option; a letter is read
    as a letter first, as the schema's enum asks for letters."""
    wanted = normalize(value)
    names = letters(len(item.choices))
    if wanted.upper() in names:
        return wanted.upper() == item.answer
    index = names.index(str(item.answer))
    return wanted == normalize(item.choices[index])
