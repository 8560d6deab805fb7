"""How an eval item is asked and scored (conclave.app.evals.scoring): each kind's answer schema,
the scored field, and what counts as right."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conclave.app.evals.scoring import (
    DEFAULT_TOLERANCE,
    answer_schema,
    normalize,
    score,
    scored_field,
    vote_fields,
)
from conclave.app.evals.suite import Item
from conclave.deliberation.vote import tally
from conclave.schema.answer_schema import answer_errors, check_answer_schema, strict_compatible

NUMBER = Item(id="n", question="What is 6 x 7?", kind="number", answer=42.0)
CHOICE = Item(id="c", question="Symbol of gold?", kind="choice", answer="B", choices=("Ag", "Au", "Gd", "Go"))
EXACT = Item(id="e", question="Capital of France?", kind="exact", answer="Paris")
JUDGE = Item(id="j", question="Explain TCP.", kind="judge", answer="A reliable stream protocol.")


def number(answer: float, tolerance: float | None = None) -> Item:
    return Item(id="n", question="q", kind="number", answer=answer, tolerance=tolerance)


# ------------------------------------------------------------------ the schemas


@pytest.mark.parametrize("item", [NUMBER, CHOICE, EXACT], ids=lambda item: item.kind)
def test_each_answer_schema_is_portable_closed_and_has_the_scored_field(item: Item) -> None:
    schema = answer_schema(item)
    assert schema is not None
    check_answer_schema(schema)  # raises InvalidArguments outside the portable subset
    assert strict_compatible(schema)
    field = scored_field(item)
    assert field is not None
    assert schema["required"] == ["reason", field]  # the working before the value: see the module
    assert schema["additionalProperties"] is False
    assert all(prop.get("description") for prop in schema["properties"].values())


def test_the_schemas_field_types() -> None:
    number_schema, choice_schema, exact_schema = (answer_schema(i) for i in (NUMBER, CHOICE, EXACT))
    assert number_schema is not None and choice_schema is not None and exact_schema is not None
    assert number_schema["properties"]["value"]["type"] == "number"
    assert choice_schema["properties"]["choice"]["enum"] == ["A", "B", "C", "D"]
    assert exact_schema["properties"]["answer"]["type"] == "string"
    assert answer_errors(number_schema, {"reason": "6*7", "value": 42}) == []
    assert answer_errors(number_schema, {"reason": "6*7", "value": "42"}) != []
    assert answer_errors(choice_schema, {"reason": "r", "choice": "E"}) != []
    assert answer_errors(exact_schema, {"answer": "Paris"}) != []  # reason required


def test_the_choice_enum_has_one_letter_per_option() -> None:
    two = Item(id="c", question="q", kind="choice", answer="A", choices=("yes", "no"))
    schema = answer_schema(two)
    assert schema is not None
    assert schema["properties"]["choice"]["enum"] == ["A", "B"]


def test_fields_per_kind() -> None:
    assert [scored_field(i) for i in (NUMBER, CHOICE, EXACT, JUDGE)] == ["value", "choice", "answer", None]
    assert [vote_fields(i) for i in (NUMBER, CHOICE, EXACT, JUDGE)] == [(), (), ("answer",), ()]
    assert answer_schema(JUDGE) is None


# ------------------------------------------------------------------ normalization and exact


@pytest.mark.parametrize(
    ("given", "normal"),
    [
        ("Paris", "paris"),
        ("  New   York\n", "new york"),
        ('"Paris."', "paris"),
        ("'Paris'.", "paris"),
        ("\u201cParis\u201d", "paris"),
        ("Straße", "strasse"),  # case folding, not lowercasing
        ("Cafe\u0301", "café"),  # NFC: e + combining acute is é
        ("2025-04-11.", "2025-04-11"),
        ("U.S.", "u.s"),
        ('"unbalanced', '"unbalanced'),
        ("", ""),
    ],
)
def test_normalize(given: str, normal: str) -> None:
    assert normalize(given) == normal


def test_exact_scoring() -> None:
    assert score(EXACT, "paris")
    assert score(EXACT, ' "PARIS." ')
    assert not score(EXACT, "Pari")
    assert not score(EXACT, "Paris, France")
    assert not score(EXACT, "")
    for wrong_type in (None, 42, ["Paris"], {"answer": "Paris"}, True):
        assert not score(EXACT, wrong_type)
    assert score(Item(id="e", question="q", kind="exact", answer="Café"), "CAFE\u0301")


# ------------------------------------------------------------------ number


def test_number_default_tolerance_is_equality_up_to_float_noise() -> None:
    assert DEFAULT_TOLERANCE == 1e-9
    assert score(NUMBER, 42)
    assert score(NUMBER, 42.0)
    assert score(number(0.3), 0.1 + 0.2)
    assert not score(NUMBER, 42.0001)
    assert not score(NUMBER, 41)
    assert score(number(0.0), -0.0)
    assert not score(number(0.0), 1e-12)  # relative: nothing is within a fraction of 0 but 0


def test_number_tolerance_is_relative() -> None:
    item = number(100.0, tolerance=0.01)
    assert score(item, 100.9)
    assert score(item, 99.0)  # |1| <= 0.01 * max(99, 100)
    assert not score(item, 98.9)
    assert not score(item, 101.1)
    assert score(item, 101.005)  # within 1% of 101.005, though not of 100: the larger one counts
    assert score(number(-5.0, 0.1), -5.4)
    assert not score(number(-5.0, 0.1), 5.0)


def test_number_strings_only_when_they_are_plain_numbers() -> None:
    big = number(1234.0)
    assert score(big, "1234")
    assert score(big, "1,234")
    assert score(big, " 1234.0 ")
    assert score(number(1234567.5), "1,234,567.5")
    assert score(number(1500.0), "1.5e3")
    for not_plain in (
        "42 km",
        "$1234",
        "1,23,4",
        "12,34",
        "1 234",
        "1_234",
        "nan",
        "inf",
        "",
        "e5",
        "--1",
        "½",
    ):
        assert not score(big, not_plain), not_plain
    assert score(NUMBER, "42")
    assert not score(NUMBER, "42 km")
    assert not score(NUMBER, "\u0664\u0662")  # Arabic-Indic digits: not a plain number here


def test_number_wrong_types_and_non_finite_values_are_wrong() -> None:
    for value in (None, True, False, [42], {"value": 42}, math.nan, math.inf, -math.inf, 10**400):
        assert not score(NUMBER, value), value


@given(
    answer=st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    value=st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    tolerance=st.sampled_from([0.0, 1e-9, 0.001, 0.01, 0.5]),
)
def test_a_number_is_right_exactly_when_the_vote_would_count_it_as_agreeing(
    answer: float, value: float, tolerance: float
) -> None:
    """One relative rule for the vote and for scoring: a value the council settled on scores
    as the same yardstick says."""
    item = number(answer, tolerance)
    schema = answer_schema(item)
    assert schema is not None
    vote = tally(schema, [("a", {"value": answer}), ("b", {"value": value})], tolerance=tolerance)
    assert score(item, value) == (vote.consensus is not None)


# ------------------------------------------------------------------ choice


def test_choice_by_letter() -> None:
    assert score(CHOICE, "B")
    assert score(CHOICE, "b")
    assert score(CHOICE, " (B) ".strip(" ()"))
    assert not score(CHOICE, "A")
    assert not score(CHOICE, "D")


def test_choice_by_the_options_text() -> None:
    assert score(CHOICE, "Au")
    assert score(CHOICE, ' "au." ')
    assert not score(CHOICE, "Ag")
    assert not score(CHOICE, "gold")


def test_choice_a_letter_is_read_as_a_letter_first() -> None:
    """An option whose text is a letter: the schema asks for letters, so "A" means option A."""
    item = Item(id="c", question="q", kind="choice", answer="B", choices=("B", "A"))
    assert score(item, "B")
    assert score(item, "b")
    assert not score(item, "A")  # letter A, though option B's text is "A"
    letters_out_of_range = Item(id="c", question="q", kind="choice", answer="A", choices=("E", "F"))
    assert score(letters_out_of_range, "E")  # no option E: the text of option A


def test_choice_wrong_types_are_wrong() -> None:
    for value in (None, 1, ["B"], {"choice": "B"}, True):
        assert not score(CHOICE, value)


def test_judge_items_are_not_scored_here() -> None:
    with pytest.raises(ValueError, match="judge"):
        score(JUDGE, "anything")


def test_every_kind_is_covered() -> None:
    seen: dict[str, Any] = {item.kind: score(item, item.answer) for item in (NUMBER, CHOICE, EXACT)}
    assert seen == {"number": True, "choice": True, "exact": True}
