"""Eval suites (conclave.app.evals.suite): the three shapes read, every problem refused with the
line named, and the built-in suite whose answers are checked here by computing them."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from conclave.app.evals.scoring import answer_schema, normalize, score
from conclave.app.evals.suite import BUILTIN, Item, Suite, SuiteError, letters, load_suite
from conclave.schema.answer_schema import check_answer_schema


def jsonl(tmp_path: Path, *lines: Any, name: str = "suite.jsonl") -> str:
    """A suite file of `lines` (dicts as JSON, strings as written); its path as a spec."""
    path = tmp_path / name
    text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
    path.write_text(text + "\n", encoding="utf-8")
    return str(path)


def refused(spec: str, **kwargs: Any) -> SuiteError:
    with pytest.raises(SuiteError) as caught:
        load_suite(spec, **kwargs)
    assert caught.value.code == "invalid_suite"
    return caught.value


Q = {"id": "q1", "question": "What is 2 + 2?", "answer": 4, "kind": "number"}


# ------------------------------------------------------------------ the shapes that load


def test_conclave_jsonl_loads_every_kind(tmp_path: Path) -> None:
    spec = jsonl(
        tmp_path,
        {"id": "n", "question": "How far?", "answer": "1,234.5", "kind": "number", "tolerance": 0.01},
        "",  # blank lines are skipped, and lines still counted
        {
            "id": "c",
            "question": "Which?",
            "answer": " gold ",
            "kind": "choice",
            "choices": ["Silver", "Gold"],
        },
        {"id": "e", "question": "Year?", "answer": 1969, "kind": "exact", "context": "It was 1969."},
        {"id": "j", "question": "Explain.", "answer": "Because.", "kind": "judge", "rubric": "Be clear."},
        {"id": "c2", "question": "Which?", "answer": "b", "kind": "choice", "choices": ["x", "y", "z"]},
    )
    suite = load_suite(spec)
    assert suite.name == spec
    assert suite.items == (
        Item(id="n", question="How far?", kind="number", answer=1234.5, tolerance=0.01, line=1),
        Item(id="c", question="Which?", kind="choice", answer="B", choices=("Silver", "Gold"), line=3),
        Item(id="e", question="Year?", kind="exact", answer="1969", context="It was 1969.", line=4),
        Item(id="j", question="Explain.", kind="judge", answer="Because.", rubric="Be clear.", line=5),
        Item(id="c2", question="Which?", kind="choice", answer="B", choices=("x", "y", "z"), line=6),
    )
    assert isinstance(suite.items[0].answer, float)


def test_a_json_file_is_read_as_json_lines_and_a_bom_is_no_error(tmp_path: Path) -> None:
    path = tmp_path / "suite.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(Q).encode() + b"\r\n")
    assert load_suite(str(path)).items[0].id == "q1"


def test_gsm8k_lines_load_as_number_items(tmp_path: Path) -> None:
    spec = jsonl(
        tmp_path,
        {"question": "Natalia sold 48 clips...", "answer": "She sold 48/2 = 24.\n48 + 24 = 72\n#### 72"},
        {"question": "A big one?", "answer": "Work #### not this\n#### 1,234"},
        {"id": "mine", "question": "Negative?", "answer": "#### -3.5"},
    )
    items = load_suite(spec).items
    assert [(i.id, i.kind, i.answer, i.line) for i in items] == [
        ("line-1", "number", 72.0, 1),
        ("line-2", "number", 1234.0, 2),
        ("mine", "number", -3.5, 3),
    ]
    assert items[0].question == "Natalia sold 48 clips..."


MMLU_ROWS = [
    ["What is 2 + 2?", "3", "4", "5", "22", "B"],
    ["Which is a primary colour?", "Green", "Orange", "Red", "Purple", "c"],
    ['A "quoted",\nmulti-line question?', "yes", "no", "maybe", "never", "A"],
    ["Last?", "a", "b", "c", "d", "D"],
]


def write_csv(tmp_path: Path, rows: list[list[str]], *, header: bool) -> str:
    import csv

    path = tmp_path / "mmlu.csv"
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        if header:
            writer.writerow(["question", "A", "B", "C", "D", "answer"])
        writer.writerows(rows)
    return str(path)


@pytest.mark.parametrize("header", [False, True])
def test_mmlu_csv_loads_with_or_without_a_header(tmp_path: Path, header: bool) -> None:
    items = load_suite(write_csv(tmp_path, MMLU_ROWS, header=header)).items
    shift = 1 if header else 0
    assert [(i.kind, i.answer, i.line) for i in items] == [
        ("choice", "B", 1 + shift),
        ("choice", "C", 2 + shift),
        ("choice", "A", 3 + shift),
        ("choice", "D", 5 + shift),  # the row above spans two lines
    ]
    assert [i.id for i in items] == [f"line-{i.line}" for i in items]
    assert items[0].choices == ("3", "4", "5", "22")
    assert items[2].question == 'A "quoted",\nmulti-line question?'


def test_limit_keeps_the_first_items_in_file_order(tmp_path: Path) -> None:
    spec = jsonl(tmp_path, *({**Q, "id": f"q{n}"} for n in range(1, 6)))
    assert [i.id for i in load_suite(spec, limit=2).items] == ["q1", "q2"]
    assert len(load_suite(spec, limit=99).items) == 5
    with pytest.raises(ValueError, match="limit"):
        load_suite(spec, limit=0)


def test_limit_does_not_hide_a_bad_line_further_on(tmp_path: Path) -> None:
    spec = jsonl(tmp_path, Q, {**Q, "id": "q2", "kind": "guess"})
    assert "line 2" in str(refused(spec, limit=1))


# ------------------------------------------------------------------ what is refused, by line


@pytest.mark.parametrize(
    ("line", "needles"),
    [
        ('{"id": "q2", "question": "x", ', ["line 2", "not valid JSON"]),
        (
            '{"id": "q2", "id": "q3", "question": "x", "answer": 1, "kind": "number"}',
            ["line 2", "duplicate key"],
        ),
        ('{"id": "q2", "question": "x", "answer": NaN, "kind": "number"}', ["line 2", "NaN"]),
        ('["q2", "x"]', ["line 2", "JSON object", "array"]),
        ({"id": "q2", "answer": 1, "kind": "number"}, ["line 2", "'question' is a required property"]),
        ({"question": "x", "answer": 1, "kind": "number"}, ["line 2", "'id'", "unique 'id'"]),
        ({"id": "q2", "question": "x", "answer": 1}, ["line 2", "'kind'", "####"]),
        ({"id": "q2", "question": "x", "answer": 1, "kind": "guess"}, ["line 2", "$.kind", "'guess'"]),
        ({"id": " ", "question": "x", "answer": 1, "kind": "number"}, ["line 2", "$.id", "blank"]),
        ({"id": "q2", "question": "x", "answer": 1, "kind": "number", "extra": 1}, ["line 2", "'extra'"]),
        (
            {"id": "q2", "question": "x", "answer": "many", "kind": "number"},
            ["line 2", "finite number", "many"],
        ),
        (
            {"id": "q2", "question": "x", "answer": 1, "kind": "number", "tolerance": -1},
            ["line 2", "$.tolerance"],
        ),
        (
            {"id": "q2", "question": "x", "answer": "a", "kind": "exact", "tolerance": 0.1},
            ["line 2", "number items only"],
        ),
        (
            {"id": "q2", "question": "x", "answer": "a", "kind": "exact", "choices": ["a", "b"]},
            ["line 2", "choice items only"],
        ),
        (
            {"id": "q2", "question": "x", "answer": "a", "kind": "exact", "rubric": "r"},
            ["line 2", "judge items only"],
        ),
        ({"id": "q2", "question": "x", "answer": " . ", "kind": "exact"}, ["line 2", "blank"]),
        ({"id": "q2", "question": "x", "answer": "A", "kind": "choice"}, ["line 2", "needs 'choices'"]),
        (
            {"id": "q2", "question": "x", "answer": "A", "kind": "choice", "choices": ["only"]},
            ["line 2", "$.choices"],
        ),
        (
            {
                "id": "q2",
                "question": "x",
                "answer": "A",
                "kind": "choice",
                "choices": [str(n) for n in range(27)],
            },
            ["line 2", "$.choices"],
        ),
        (
            {"id": "q2", "question": "x", "answer": "E", "kind": "choice", "choices": ["a", "b", "c", "d"]},
            ["line 2", "'E' names no option", "A..D"],
        ),
        (
            {"id": "q2", "question": "x", "answer": "Zinc", "kind": "choice", "choices": ["a", "b"]},
            ["line 2", "names no option"],
        ),
        (
            {"id": "q2", "question": "x", "answer": "B", "kind": "choice", "choices": ["B", "A"]},
            ["line 2", "ambiguous"],
        ),
        (
            {"id": "q2", "question": "x", "answer": "same", "kind": "choice", "choices": ["same", "Same"]},
            ["line 2", "options A, B"],
        ),
        ({"question": "x", "answer": "#### twelve"}, ["line 2", "####", "'twelve'"]),
        ({"question": " ", "answer": "#### 12"}, ["line 2", "question"]),
    ],
)
def test_a_bad_line_is_refused_naming_it(tmp_path: Path, line: Any, needles: list[str]) -> None:
    spec = jsonl(tmp_path, Q, line, {**Q, "id": "q9"})
    message = str(refused(spec))
    assert message.startswith(f"{spec} line 2: ")
    for needle in needles:
        assert needle in message, (needle, message)


def test_the_error_carries_its_line(tmp_path: Path) -> None:
    error = refused(jsonl(tmp_path, Q, Q))
    assert (error.suite, error.line) == (str(tmp_path / "suite.jsonl"), 2)
    assert error.to_dict() == {"code": "invalid_suite", "message": str(error), "line": 2}


def test_duplicate_ids_name_both_lines(tmp_path: Path) -> None:
    spec = jsonl(tmp_path, Q, {**Q, "id": "other"}, "", {**Q, "question": "Again?"})
    message = str(refused(spec))
    assert message.startswith(f"{spec} line 4: ")
    assert "'q1'" in message and "line 1" in message


def test_gsm8k_ids_clash_with_a_given_one(tmp_path: Path) -> None:
    spec = jsonl(
        tmp_path, {"question": "x", "answer": "#### 1"}, {"id": "line-1", "question": "y", "answer": "#### 2"}
    )
    assert "line 2" in str(refused(spec)) and "line 1" in str(refused(spec))


@pytest.mark.parametrize(
    ("rows", "needles"),
    [
        (
            [["Q?", "a", "b", "c", "d", "A"], ["Q2?", "a", "b", "c", "d", "E"]],
            ["line 2", "answer letter", "'E'"],
        ),
        ([["Q?", "a", "b", "c", "d", "A"], ["Q2?", "a", "b", "c", "B"]], ["line 2", "5 cells", "6"]),
        ([["Q?", "a", "b", "c", "d", "A"], ["", "a", "b", "c", "d", "B"]], ["line 2", "question"]),
        ([["Q?", "a", "b", "c", "d", "A"], ["Q2?", "a", "", "c", "d", "B"]], ["line 2", "option B is blank"]),
        ([["Q?", "A"], ["Q2?", "B"]], ["line 1", "2 cells"]),
    ],
)
def test_a_bad_csv_row_is_refused_naming_it(
    tmp_path: Path, rows: list[list[str]], needles: list[str]
) -> None:
    message = str(refused(write_csv(tmp_path, rows, header=False)))
    for needle in needles:
        assert needle in message, (needle, message)


def test_an_empty_suite_is_refused(tmp_path: Path) -> None:
    for name, text in (
        ("empty.jsonl", ""),
        ("blank.jsonl", "\n  \n"),
        ("header-only.csv", "question,A,B,C,D,answer\n"),
    ):
        (tmp_path / name).write_text(text, encoding="utf-8")
        message = str(refused(str(tmp_path / name)))
        assert "has no items" in message and name in message


def test_missing_files_and_unknown_built_ins_are_refused(tmp_path: Path) -> None:
    assert "no such file" in str(refused(str(tmp_path / "nope.jsonl")))
    message = str(refused("builtin:nope"))
    assert message.startswith("builtin:nope: ") and "builtin:basic" in message
    (tmp_path / "suite.txt").write_text(json.dumps(Q), encoding="utf-8")
    assert "*.jsonl" in str(refused(str(tmp_path / "suite.txt")))


def test_a_file_that_is_not_utf8_is_refused_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(Q).encode() + b'\n{"id": "caf\xe9"}\n')
    assert "line 2: is not UTF-8" in str(refused(str(path)))


def test_letters() -> None:
    assert letters(4) == ("A", "B", "C", "D")
    assert letters(26)[-1] == "Z"
    assert letters(0) == ()
    with pytest.raises(ValueError, match="count"):
        letters(27)


# ------------------------------------------------------------------ builtin:basic


@pytest.fixture(scope="module")
def basic() -> Suite:
    return load_suite("builtin:basic")


def by_id(suite: Suite) -> dict[str, Item]:
    return {item.id: item for item in suite.items}


def test_basic_is_built_in_and_about_sixty_items_of_every_checkable_kind(basic: Suite) -> None:
    assert BUILTIN == ("basic",)
    assert basic.name == "builtin:basic"
    assert 55 <= len(basic.items) <= 65
    assert {item.kind for item in basic.items} == {"number", "exact", "choice"}  # no judge items
    groups = Counter(re.sub(r"-\d+$", "", item.id) for item in basic.items)
    assert groups == {"arith": 15, "units": 10, "dates": 10, "reading": 10, "mc": 15}
    assert all(re.fullmatch(r"[a-z]+-\d\d", item.id) for item in basic.items)
    assert load_suite("builtin:basic", limit=5).items == basic.items[:5]


def test_basic_questions_say_what_form_the_answer_takes(basic: Suite) -> None:
    for item in basic.items:
        assert "Answer with" in item.question, item.id
        schema = answer_schema(item)
        assert schema is not None
        check_answer_schema(schema)
        assert score(item, item.answer), item.id  # its own answer scores as right


# id -> (what the question asks, quoted from it, and the answer computed here)
ARITHMETIC: dict[str, tuple[str, Fraction]] = {
    "arith-01": ("347 + 589", Fraction(347 + 589)),
    "arith-02": ("1000 - 387", Fraction(1000 - 387)),
    "arith-03": ("23 × 47", Fraction(23 * 47)),
    "arith-04": ("7344 divided by 17", Fraction(7344, 17)),
    "arith-05": ("2 raised to the power 10", Fraction(2**10)),
    "arith-06": ("15% of 240", Fraction(15, 100) * 240),
    "arith-07": ("square root of 1764", Fraction(next(n for n in range(100) if n * n == 1764))),
    "arith-08": ("(12 + 8) × 3 - 7", Fraction((12 + 8) * 3 - 7)),
    "arith-09": ("3/8", Fraction(3, 8)),
    "arith-10": ("999 × 999", Fraction(999 * 999)),
    "arith-11": ("from 1 to 100 inclusive", Fraction(sum(range(1, 101)))),
    "arith-12": ("35 cents each. How many cents do 12 pencils", Fraction(35 * 12)),
    "arith-13": ("12, 15, 18, 21 and 24", Fraction(12 + 15 + 18 + 21 + 24, 5)),
    "arith-14": ("7 factorial", Fraction(1 * 2 * 3 * 4 * 5 * 6 * 7)),
    "arith-15": ("remainder when 1000 is divided by 7", Fraction(1000 % 7)),
}


def test_basic_arithmetic_answers(basic: Suite) -> None:
    items = by_id(basic)
    for ident, (asked, expected) in ARITHMETIC.items():
        item = items[ident]
        assert asked in item.question, ident
        assert item.kind == "number" and item.tolerance is None, ident
        assert Fraction(repr(item.answer)) == expected, ident
    assert ARITHMETIC["arith-04"][1].denominator == 1  # a division that comes out whole


MILE_KM = Fraction("1.609344")
INCH_CM = Fraction("2.54")
GALLON_L = Fraction("3.785411784")
# id -> (the exact value, decimal places the question asks to round to, or None for exact)
UNITS: dict[str, tuple[Fraction, int | None]] = {
    "units-01": (Fraction(5 * 1000), None),
    "units-02": (Fraction(7, 2) * 60, None),
    "units-03": (10 * MILE_KM, 2),
    "units-04": ((Fraction(100) - 32) * Fraction(5, 9), 2),
    "units-05": (Fraction(5, 2) * 1000, None),
    "units-06": (Fraction(3 * 1024), None),
    "units-07": (Fraction(72 * 1000, 3600), None),
    "units-08": (5 * 12 * INCH_CM, None),
    "units-09": (4 * GALLON_L, 1),
    "units-10": (Fraction(2 * 24 * 3600), None),
}


def test_basic_unit_answers(basic: Suite) -> None:
    items = by_id(basic)
    for ident, (exact, places) in UNITS.items():
        item = items[ident]
        assert item.kind == "number"
        if places is None:
            assert Fraction(repr(item.answer)) == exact, ident  # as written in the file
            assert item.tolerance is None, ident
        else:
            assert f"rounded to {['zero', 'one', 'two'][places]} decimal place" in item.question, ident
            assert item.answer == round(float(exact), places), ident
            # the unrounded value scores as right, and a slip in the last rounded digit does not
            assert score(item, float(exact)), ident
            for slip in (-(10**-places), 10**-places):
                assert not score(item, float(item.answer) + slip), ident
    assert "1.609344" in items["units-03"].question and "3.785411784" in items["units-09"].question


DATES: dict[str, str | int] = {
    "dates-01": dt.date(1969, 7, 20).strftime("%A"),
    "dates-02": dt.date(2000, 1, 1).strftime("%A"),
    "dates-03": dt.date(2024, 2, 29).strftime("%A"),
    "dates-04": dt.date(2030, 12, 25).strftime("%A"),
    "dates-05": (dt.date(2024, 3, 1) - dt.date(2024, 1, 1)).days,
    "dates-06": (dt.date(2023, 7, 4) - dt.date(2023, 3, 15)).days,
    "dates-07": (dt.date(2020, 1, 1) - dt.date(2000, 1, 1)).days,
    "dates-08": (dt.date(2025, 1, 1) + dt.timedelta(days=100)).isoformat(),
    "dates-09": (dt.date(2024, 3, 15) - dt.timedelta(days=30)).isoformat(),
    "dates-10": (dt.date(2100, 3, 1) - dt.date(2100, 2, 1)).days,
}


def test_basic_date_answers(basic: Suite) -> None:
    items = by_id(basic)
    for ident, expected in DATES.items():
        item = items[ident]
        if isinstance(expected, int):
            assert item.kind == "number" and item.answer == expected, ident
        else:
            assert item.kind == "exact" and item.answer == expected, ident
    assert DATES["dates-01"] == "Sunday"  # the Moon landing, for a reader's sanity


# The reading items' number answers, computed from the figures their passage gives.
READING_NUMBERS: dict[str, int] = {
    "reading-01": 980,
    "reading-02": 1240 + 980 + 1105,
    "reading-06": 2 * 6 + 2 * 6 // 2,  # two adults at 6 crowns, two children at half price
    "reading-07": 90,
    "reading-08": 230,
    "reading-10": 57,
}


def test_basic_reading_answers_come_from_the_context(basic: Suite) -> None:
    items = [item for item in basic.items if item.id.startswith("reading-")]
    numbers = {item.id for item in items if item.kind == "number"}
    assert numbers == set(READING_NUMBERS)
    for item in items:
        assert item.context and "According to the context" in item.question, item.id
        if item.kind == "exact":
            assert normalize(str(item.answer)) in normalize(item.context), item.id
            assert str(item.answer) not in item.question, item.id
        else:
            assert item.answer == READING_NUMBERS[item.id], item.id
    context = {item.id: item.context or "" for item in items}
    for figure in ("1,240 units", "980 units", "1,105 units"):
        assert figure in context["reading-02"]
    assert "6 crowns" in context["reading-06"] and "half price" in context["reading-06"]
    assert "rises for 90 minutes" in context["reading-07"] and "230 degrees" in context["reading-08"]
    assert "fixed 57 bugs" in context["reading-10"]


# The multiple-choice answers that can be computed; the rest are checked for shape.
COMPUTED_CHOICES: dict[str, str] = {
    "mc-03": str(6),  # a hexagon's sides
    "mc-06": str(min(n for n in range(10) if n > 1 and all(n % d for d in range(2, n)))),
    "mc-09": str(int("1011", 2)),
    "mc-10": next(str(n) for n in (29, 31, 33, 37) if any(n % d == 0 for d in range(2, n))),
    "mc-12": str(8),
    "mc-14": str(0),
}


def test_basic_multiple_choice(basic: Suite) -> None:
    items = [item for item in basic.items if item.id.startswith("mc-")]
    for item in items:
        assert item.kind == "choice" and len(item.choices) == 4, item.id
        assert len({normalize(c) for c in item.choices}) == 4, item.id
        assert item.answer in letters(4), item.id
    spread = Counter(str(item.answer) for item in items)
    assert set(spread) == {"A", "B", "C", "D"} and max(spread.values()) <= 5
    chosen = {item.id: item.choices[letters(4).index(str(item.answer))] for item in items}
    for ident, expected in COMPUTED_CHOICES.items():
        assert chosen[ident] == expected, ident
    assert chosen["mc-01"] == "Au" and chosen["mc-08"] == "Carbon dioxide" and chosen["mc-13"] == "1969"
