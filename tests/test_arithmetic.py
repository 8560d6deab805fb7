"""The `math` check's interpreter on its own: plain arithmetic evaluates, anything else is refused
before it runs (tests/test_verify.py checks it through the tool)."""

from __future__ import annotations

import pytest

from conclave.tools.arithmetic import ExpressionRefused, evaluate, show_number


@pytest.mark.parametrize(
    ("expression", "value"),
    [("1 + 2 * 3", 7), ("(1 + 2) * 3", 9), ("7 // 2", 3), ("7 % 4", 3), ("2 ** 10", 1024), ("-3 / 2", -1.5)],
)
def test_plain_arithmetic_evaluates(expression: str, value: float) -> None:
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("__import__('os')", "function calls are not allowed"),
        ("2 ** 100000", "over the limit"),
        ("10 ** 999 * 10 ** 999 * 10 ** 999 * 10 ** 999", "integer product over the 10000-bit limit"),
        ("1 / 0", "division by zero"),
        ("1 +", "invalid expression"),
    ],
)
def test_anything_else_is_refused_saying_why(expression: str, words: str) -> None:
    with pytest.raises(ExpressionRefused, match=words):
        evaluate(expression)


def test_a_huge_integer_is_shown_by_its_ends_and_its_digit_count() -> None:
    assert show_number(10**100) == f"1{'0' * 29}…{'0' * 30} (101 digits)"
    assert show_number(0.5) == "0.5"
