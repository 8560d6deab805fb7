"""The `verify` tool: every check kind passes and fails, limits refuse instead of hanging or raising,
and arguments and results keep to schemas/verify.{input,output}.json."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conclave.core.errors import CallerError
from conclave.schema.schemas import first_error, json_path
from conclave.tools import verify as verify_module
from conclave.tools.verify import MAX_CHECKS, REGEX_TIMEOUT_SECONDS, render_verify, run_verify

pytestmark = pytest.mark.anyio

CATASTROPHIC = {"type": "regex", "pattern": "(a+)+$", "text": "a" * 30 + "b"}


def assert_valid_args(args: dict[str, Any]) -> None:
    error = first_error("verify.input.json", args)
    assert error is None, f"arguments break the input schema: {error.message}"


async def verify(*checks: dict[str, Any]) -> dict[str, Any]:
    """Run checks through the input schema, the tool and the output schema."""
    args = {"checks": list(checks)}
    assert_valid_args(args)
    result = await run_verify(args)
    error = first_error("verify.output.json", result)
    assert error is None, f"result breaks the output schema: {error.message}: {result}"
    return result


async def check(spec: dict[str, Any]) -> dict[str, Any]:
    result = await verify(spec)
    only: dict[str, Any]
    (only,) = result["results"]
    assert result["passed"] is only["passed"]
    return only


def math_check(expression: str, **extra: Any) -> dict[str, Any]:
    return {"type": "math", "expression": expression, **extra}


# --- the result as a whole ------------------------------------------------------------------------


async def test_all_checks_passing_makes_the_call_pass() -> None:
    result = await verify(
        math_check("1+1", expected=2), {"type": "contains", "text": "abc", "substring": "b"}
    )
    assert result["passed"] is True
    assert [item["index"] for item in result["results"]] == [0, 1]
    assert [item["type"] for item in result["results"]] == ["math", "contains"]


async def test_one_failing_check_fails_the_call_but_keeps_every_result_in_order() -> None:
    result = await verify(
        {"type": "json_parse", "text": "{"},
        math_check("2*3", expected=6),
        {"type": "regex", "pattern": "z", "text": "abc"},
    )
    assert result["passed"] is False
    assert [(item["index"], item["passed"]) for item in result["results"]] == [
        (0, False),
        (1, True),
        (2, False),
    ]


async def test_the_session_id_is_accepted_and_ignored() -> None:
    args = {"checks": [math_check("1")], "session_id": "s-1"}
    assert_valid_args(args)
    assert (await run_verify(args))["passed"] is True


async def test_more_checks_than_the_limit_are_refused_even_when_validation_was_skipped() -> None:
    with pytest.raises(CallerError):
        await run_verify({"checks": [math_check("1")] * (MAX_CHECKS + 1)})


async def test_the_rendering_has_one_line_per_check_and_a_summary() -> None:
    result = await verify(math_check("2+2"), {"type": "regex", "pattern": "x", "text": "abc"})
    assert render_verify(result).splitlines() == [
        "✓ [0] math: 4",
        "✗ [1] regex: no match",
        "FAILED: 1/2 checks passed",
    ]


def test_the_rendering_keeps_a_multi_line_detail_on_one_line() -> None:
    result = {"passed": True, "results": [{"index": 0, "type": "math", "passed": True, "detail": "a\nb"}]}
    assert render_verify(result) == "✓ [0] math: a b\nPASSED: 1/1 checks passed"


# --- math -----------------------------------------------------------------------------------------


async def test_arithmetic_equal_to_its_expected_value_passes() -> None:
    result = await check(math_check("(2 + 3) * 4 - 6 / 3 + 7 // 2 - 7 % 4 + 2 ** 10", expected=1042))
    assert result["passed"] is True
    assert result["detail"] == "1042.0"


async def test_arithmetic_without_an_expected_value_passes_and_reports_the_value() -> None:
    assert await check(math_check("-(3 - 10)")) == {"index": 0, "type": "math", "passed": True, "detail": "7"}


async def test_arithmetic_different_from_its_expected_value_fails() -> None:
    result = await check(math_check("2 + 2", expected=5))
    assert result["passed"] is False
    assert result["detail"] == "got 4, expected 5 (tolerance 1e-09)"


async def test_floats_pass_within_the_default_tolerance_and_fail_with_zero_tolerance() -> None:
    assert (await check(math_check("0.1 + 0.2", expected=0.3)))["passed"] is True
    assert (await check(math_check("0.1 + 0.2", expected=0.3, tolerance=0)))["passed"] is False
    assert (await check(math_check("1 / 3", expected=0.33, tolerance=0.01)))["passed"] is True


async def test_a_huge_integer_compares_exactly_against_a_float_without_overflowing() -> None:
    assert (await check(math_check("2 ** 1000", expected=float(2**1000))))["passed"] is True
    result = await check(math_check("10 ** 400", expected=1e300))
    assert result["passed"] is False
    assert "digits" in result["detail"]


@pytest.mark.parametrize(
    "expression",
    [
        "2**2**2**2**2",
        "9**9**9",
        "10**100000",
        "(10**1000)*(10**1000)*(10**1000)*(10**1000)*(10**1000)",
        "(10**1000)**10",
        "2**1000*2**1000*2**1000*2**1000*2**1000*2**1000*2**1000*2**1000*2**1000*2**1000*2**1000",
        "10.0**400",
        "1e308*10",
        "1e999",
        "(2**5000)/1.5",
    ],
)
async def test_results_beyond_the_size_limits_are_refused_not_computed(expression: str) -> None:
    result = await check(math_check(expression))
    assert result["passed"] is False
    assert "limit" in result["detail"] or "overflow" in result["detail"]


@pytest.mark.parametrize("expression", ["1/0", "1//0", "1%0", "1.5/0.0", "0**-1", "1/(2-2)"])
async def test_division_by_zero_fails_the_check(expression: str) -> None:
    assert await check(math_check(expression)) == {
        "index": 0,
        "type": "math",
        "passed": False,
        "detail": "division by zero",
    }


@pytest.mark.parametrize(
    ("expression", "detail"),
    [
        ("__import__('os')", "function calls are not allowed"),
        ("a+1", "names are not allowed"),
        ("(1).__class__", "attributes are not allowed"),
        ("[1][0]", "subscripts are not allowed"),
        ("[1, 2]", "List is not allowed"),
        ("'7'", "str constants are not allowed"),
        ("True + 1", "bool constants are not allowed"),
        ("2j * 2", "complex constants are not allowed"),
        ("1 < 2", "comparisons are not allowed"),
        ("1 << 2", "LShift is not allowed"),
        ("~1", "Invert is not allowed"),
        ("(lambda: 1)()", "function calls are not allowed"),
    ],
)
async def test_anything_but_numbers_and_arithmetic_is_refused(expression: str, detail: str) -> None:
    result = await check(math_check(expression))
    assert result["passed"] is False
    assert result["detail"].startswith(detail)


async def test_a_syntax_error_fails_the_check() -> None:
    result = await check(math_check("2 +* 3"))
    assert result["passed"] is False
    assert result["detail"].startswith("invalid expression:")


async def test_too_many_nodes_or_too_much_nesting_is_refused() -> None:
    shallow_but_big = "+".join(["(" + "+".join(["1"] * 8) + ")"] * 20)
    assert (await check(math_check(shallow_but_big)))["detail"] == "expression has more than 200 nodes"
    too_deep = await check(math_check("-" * 60 + "1"))
    assert too_deep["detail"].startswith("expression is nested deeper than 50 levels")
    assert (await check(math_check("+".join(["1"] * 50), expected=50)))["passed"] is True
    parser_limit = await check(math_check("(" * 300 + "1" + ")" * 300))
    assert parser_limit["detail"].startswith("invalid expression:")


async def test_a_negative_base_to_a_fractional_power_is_refused_as_complex() -> None:
    result = await check(math_check("(-8) ** 0.5"))
    assert result == {
        "index": 0,
        "type": "math",
        "passed": False,
        "detail": "complex result not allowed: only real numbers",
    }


async def test_negative_and_fractional_exponents_evaluate_to_floats() -> None:
    assert (await check(math_check("2 ** -2", expected=0.25)))["passed"] is True
    assert (await check(math_check("9 ** 0.5", expected=3)))["passed"] is True


async def test_a_long_integer_result_is_shown_shortened() -> None:
    result = await check(math_check("7 ** 1000"))
    assert result["passed"] is True
    assert "…" in result["detail"]
    assert result["detail"].endswith("(846 digits)")


@st.composite
def arithmetic(draw: st.DrawFn, depth: int = 0) -> str:
    if depth >= 4 or draw(st.booleans()):
        return str(draw(st.integers(min_value=-30, max_value=30)))
    if draw(st.integers(0, 5)) == 0:
        return draw(st.sampled_from(["-", "+"])) + "(" + draw(arithmetic(depth + 1)) + ")"
    left, right = draw(arithmetic(depth + 1)), draw(arithmetic(depth + 1))
    op = draw(st.sampled_from(["+", "-", "*", "/", "//", "%", "**"]))
    return f"({left}){op}({right})" if draw(st.booleans()) else f"{left}{op}{right}"


@settings(max_examples=200, deadline=None)
@given(
    expression=st.one_of(arithmetic(), st.text(alphabet="0123456789.+-*/%() e", min_size=1, max_size=40)),
    expected=st.one_of(st.none(), st.integers(-1000, 1000), st.floats(allow_nan=False, allow_infinity=False)),
)
async def test_random_arithmetic_never_raises(expression: str, expected: float | None) -> None:
    spec = math_check(expression) if expected is None else math_check(expression, expected=expected)
    result = await check(spec)
    assert isinstance(result["passed"], bool)
    assert result["detail"]


# --- regex ----------------------------------------------------------------------------------------


async def test_a_matching_regex_passes_and_names_the_first_match() -> None:
    result = await check({"type": "regex", "pattern": r"b+", "text": "aabbbcbb"})
    assert result == {"index": 0, "type": "regex", "passed": True, "detail": "match at [2:5]: 'bbb'"}


async def test_a_regex_without_a_match_fails() -> None:
    assert await check({"type": "regex", "pattern": r"\d", "text": "abc"}) == {
        "index": 0,
        "type": "regex",
        "passed": False,
        "detail": "no match",
    }


async def test_expect_match_false_inverts_the_outcome() -> None:
    absent = await check({"type": "regex", "pattern": r"\d", "text": "abc", "expect_match": False})
    assert absent["passed"] is True
    present = await check({"type": "regex", "pattern": r"b", "text": "abc", "expect_match": False})
    assert present["passed"] is False
    assert present["detail"] == "match at [1:2]: 'b'"


async def test_regex_flags_apply() -> None:
    spec = {"type": "regex", "pattern": "^B.C$", "text": "a\nb\nc", "flags": ["IGNORECASE", "MULTILINE"]}
    assert (await check(spec))["passed"] is False
    assert (await check({**spec, "flags": ["IGNORECASE", "MULTILINE", "DOTALL"]}))["passed"] is True


async def test_a_long_match_is_quoted_clipped() -> None:
    result = await check({"type": "regex", "pattern": "x+", "text": "x" * 5000})
    assert result["passed"] is True
    assert result["detail"].startswith("match at [0:5000]: 'xxx")
    assert len(result["detail"]) < 120


async def test_an_invalid_regex_fails_the_check_instead_of_raising() -> None:
    result = await check({"type": "regex", "pattern": "(unclosed", "text": "abc"})
    assert result["passed"] is False
    assert result["detail"].startswith("invalid regex: missing )")


async def test_catastrophic_backtracking_is_stopped_and_the_next_regex_still_runs() -> None:
    result = await verify(CATASTROPHIC, {"type": "regex", "pattern": "b$", "text": "a" * 30 + "b"})
    timed_out, after = result["results"]
    assert timed_out["passed"] is False
    assert timed_out["detail"] == (
        f"regex timed out after {REGEX_TIMEOUT_SECONDS}s (possible catastrophic backtracking)"
    )
    assert after["passed"] is True
    assert (await check({"type": "regex", "pattern": "a", "text": "a"}))["passed"] is True


async def test_the_full_number_of_regex_checks_do_not_time_out_waiting_for_each_other() -> None:
    spec = {"type": "regex", "pattern": r"(word\s)+$", "text": "word " * 10_000}
    result = await verify(*[spec] * MAX_CHECKS)
    assert result["passed"] is True, render_verify(result)


def _live_children() -> set[int]:
    """Live (non-zombie) child processes of this process, from /proc."""
    children = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == os.getpid() and state != "Z":
            children.add(int(entry))
    return children


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_no_worker_process_outlives_the_event_loop() -> None:
    before = _live_children()
    args = {"checks": [CATASTROPHIC, {"type": "regex", "pattern": "a", "text": "a"}]}
    result = anyio.run(run_verify, args, backend="asyncio")
    assert [item["passed"] for item in result["results"]] == [False, True]
    assert _live_children() - before == set()


# --- json_schema ----------------------------------------------------------------------------------

PERSON = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}}},
    "$defs": {"tag": {"type": "string", "maxLength": 3}},
}


async def test_an_instance_valid_against_its_schema_passes() -> None:
    result = await check({"type": "json_schema", "schema": PERSON, "instance": {"name": "x", "tags": ["a"]}})
    assert result == {"index": 0, "type": "json_schema", "passed": True, "detail": "valid"}


async def test_an_invalid_instance_fails_with_the_message_and_its_path() -> None:
    result = await check(
        {"type": "json_schema", "schema": PERSON, "instance": {"name": "x", "tags": ["long"]}}
    )
    assert result["passed"] is False
    assert result["detail"] == "$.tags[0]: 'long' is too long"


async def test_boolean_schemas_are_accepted() -> None:
    assert (await check({"type": "json_schema", "schema": True, "instance": 1}))["passed"] is True
    assert (await check({"type": "json_schema", "schema": False, "instance": 1}))["passed"] is False


async def test_an_invalid_schema_is_reported_not_raised() -> None:
    result = await check({"type": "json_schema", "schema": {"type": "integr"}, "instance": 1})
    assert result["passed"] is False
    assert result["detail"].startswith("invalid schema: ")


async def test_a_remote_ref_is_not_fetched_and_fails_the_check() -> None:
    schema = {"$ref": "https://example.com/schemas/thing.json"}
    result = await check({"type": "json_schema", "schema": schema, "instance": {}})
    assert result["passed"] is False
    assert result["detail"].startswith("unresolvable $ref (remote references are never fetched)")


def test_a_remote_ref_is_unresolvable_without_touching_the_network() -> None:
    # In this process the conftest network guard fails the test on any connection or lookup.
    schema = {"$id": "https://example.com/root.json", "$ref": "other.json"}
    passed, detail = verify_module._validate(schema, {})
    assert passed is False
    assert detail.startswith("unresolvable $ref")
    assert "other.json" in detail


async def test_the_bundled_metaschemas_resolve() -> None:
    schema = {"$ref": "https://json-schema.org/draft/2020-12/schema"}
    assert (await check({"type": "json_schema", "schema": schema, "instance": PERSON}))["passed"] is True
    broken = await check({"type": "json_schema", "schema": schema, "instance": {"type": 7}})
    assert broken["passed"] is False


async def test_a_schema_naming_draft_7_is_validated_as_draft_7() -> None:
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "items": [{"type": "string"}]}
    result = await check({"type": "json_schema", "schema": schema, "instance": [1]})
    assert result["detail"] == "$[0]: 1 is not of type 'string'"


async def test_formats_are_checked() -> None:
    schema = {"type": "string", "format": "date"}
    assert (await check({"type": "json_schema", "schema": schema, "instance": "2024-02-30"}))[
        "passed"
    ] is False
    assert (await check({"type": "json_schema", "schema": schema, "instance": "2024-02-29"}))[
        "passed"
    ] is True


async def test_a_ref_cycle_fails_the_check() -> None:
    result = await check({"type": "json_schema", "schema": {"$ref": "#"}, "instance": 1})
    assert result["passed"] is False
    assert "recursion" in result["detail"]


async def test_an_oversized_instance_is_refused() -> None:
    result = await check({"type": "json_schema", "schema": True, "instance": ["x" * 1000] * 300})
    assert result["passed"] is False
    assert "over the 262144-byte limit" in result["detail"]


async def test_an_over_deep_instance_is_refused() -> None:
    instance: Any = 1
    for _ in range(150):
        instance = [instance]
    result = await check({"type": "json_schema", "schema": True, "instance": instance})
    assert result["detail"] == "instance is nested deeper than 100 levels"


async def test_a_backtracking_pattern_keyword_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify_module, "JSON_SCHEMA_TIMEOUT_SECONDS", 0.5)
    schema = {"type": "string", "pattern": "(a+)+$"}
    result = await check({"type": "json_schema", "schema": schema, "instance": "a" * 30 + "b"})
    assert result["passed"] is False
    assert result["detail"] == "schema validation timed out after 0.5s"


# --- equals ---------------------------------------------------------------------------------------


async def test_equal_nested_structures_pass() -> None:
    value = {"a": [1, 2.5, {"b": None, "c": [True, "x"]}], "d": {}}
    result = await check({"type": "equals", "actual": value, "expected": {"d": {}, **value}})
    assert result == {"index": 0, "type": "equals", "passed": True, "detail": "equal"}


async def test_integers_equal_their_float_form() -> None:
    assert (await check({"type": "equals", "actual": [1, 2], "expected": [1.0, 2.0]}))["passed"] is True


@pytest.mark.parametrize(
    ("actual", "expected", "detail"),
    [
        (True, 1, "$: actual is boolean true, expected number 1"),
        (
            {"a": [1, {"b": 0}]},
            {"a": [1, {"b": False}]},
            "$.a[1].b: actual is number 0, expected boolean false",
        ),
        ({"a": 1}, {"a": 1, "b": 2}, "$: missing key 'b'"),
        ({"a": 1, "z": 0}, {"a": 1}, "$: unexpected key 'z'"),
        ([1, 2, 3], [1, 2], "$: array of 3 items, expected 2"),
        ([1, 5, 3], [1, 2], "$[1]: 5 != 2"),
        ({"s": "abc"}, {"s": "abd"}, '$.s: "abc" != "abd"'),
        (None, 0, "$: actual is null null, expected number 0"),
    ],
)
async def test_unequal_values_fail_naming_the_first_difference(
    actual: Any, expected: Any, detail: str
) -> None:
    result = await check({"type": "equals", "actual": actual, "expected": expected})
    assert result["passed"] is False
    assert result["detail"] == f"first difference at {detail}"


async def test_an_over_deep_value_is_refused_in_equals() -> None:
    value: Any = 0
    for _ in range(200):
        value = {"k": value}
    result = await check({"type": "equals", "actual": value, "expected": value})
    assert result["detail"] == "actual is nested deeper than 100 levels"


# --- contains -------------------------------------------------------------------------------------


async def test_contains_is_case_sensitive_by_default() -> None:
    found = await check({"type": "contains", "text": "Hello World", "substring": "World"})
    assert found == {"index": 0, "type": "contains", "passed": True, "detail": "found at index 6"}
    missing = await check({"type": "contains", "text": "Hello World", "substring": "world"})
    assert missing["passed"] is False
    assert missing["detail"] == "not found"


async def test_contains_can_ignore_case() -> None:
    spec = {"type": "contains", "text": "Straße", "substring": "STRASSE", "case_sensitive": False}
    assert await check(spec) == {
        "index": 0,
        "type": "contains",
        "passed": True,
        "detail": "found (ignoring case)",
    }
    assert (await check({**spec, "substring": "weg"}))["detail"] == "not found (ignoring case)"


# --- json_parse -----------------------------------------------------------------------------------


async def test_valid_json_passes_and_names_its_type() -> None:
    result = await check({"type": "json_parse", "text": ' {"a": [1, 2.5, null, "x"]} '})
    assert result == {"index": 0, "type": "json_parse", "passed": True, "detail": "valid JSON: object"}
    assert (await check({"type": "json_parse", "text": "[]"}))["detail"] == "valid JSON: array"


async def test_malformed_json_fails_with_the_position() -> None:
    result = await check({"type": "json_parse", "text": '{"a": 1,}'})
    assert result["passed"] is False
    assert (
        result["detail"]
        == "invalid JSON: Expecting property name enclosed in double quotes at line 1 column 9 (char 8)"
    )


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
async def test_nan_and_infinity_are_not_json(constant: str) -> None:
    result = await check({"type": "json_parse", "text": f'{{"x": [{constant}]}}'})
    assert result["passed"] is False
    assert result["detail"] == f"invalid JSON: {constant} is not a JSON value"


async def test_duplicate_keys_fail_the_parse() -> None:
    result = await check({"type": "json_parse", "text": '{"a": {"b": 1, "b": 2}}'})
    assert result["passed"] is False
    assert result["detail"] == "invalid JSON: duplicate key 'b' in an object"


async def test_absurdly_nested_json_fails_instead_of_crashing() -> None:
    result = await check({"type": "json_parse", "text": "[" * 100_000 + "]" * 100_000})
    assert result["passed"] is False
    assert result["detail"] == "invalid JSON: nested too deeply to parse"


# --- the input schema -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "path", "message"),
    [
        ({"checks": [{"type": "regex", "pattern": "a", "text": "b", "bogus": 1}]}, "$.checks[0]", "'bogus'"),
        ({"checks": [{"type": "math", "expression": "1", "text": "b"}]}, "$.checks[0]", "'text'"),
        ({"checks": [{"type": "shell", "command": "ls"}]}, "$.checks[0].type", "'shell' is not one of"),
        ({"checks": [{"pattern": "a", "text": "b"}]}, "$.checks[0]", "'type' is a required property"),
        ({"checks": [{"type": "regex", "pattern": "a"}]}, "$.checks[0]", "'text' is a required property"),
        ({"checks": [math_check("1")] * (MAX_CHECKS + 1)}, "$.checks", "is too long"),
        ({"checks": []}, "$.checks", "should be non-empty"),
        ({}, "$", "'checks' is a required property"),
        ({"checks": [math_check("1")], "extra": True}, "$", "'extra' was unexpected"),
        (
            {"checks": [{"type": "regex", "pattern": "a", "text": "x" * 100_001}]},
            "$.checks[0].text",
            "is too long",
        ),
        (
            {"checks": [{"type": "regex", "pattern": "a" * 1001, "text": "x"}]},
            "$.checks[0].pattern",
            "is too long",
        ),
        (
            {"checks": [{"type": "contains", "text": "x", "substring": "y" * 10_001}]},
            "$.checks[0].substring",
            "is too long",
        ),
        ({"checks": [{"type": "json_parse", "text": " " * 1_000_001}]}, "$.checks[0].text", "is too long"),
        ({"checks": [math_check("1" * 1001)]}, "$.checks[0].expression", "is too long"),
        ({"checks": [math_check("1", tolerance=-1)]}, "$.checks[0].tolerance", "less than the minimum"),
        ({"checks": [math_check("1", expected="1")]}, "$.checks[0].expected", "is not of type 'number'"),
        (
            {"checks": [{"type": "regex", "pattern": "a", "text": "b", "flags": ["VERBOSE"]}]},
            "$.checks[0].flags[0]",
            "is not one of",
        ),
        (
            {"checks": [{"type": "json_schema", "schema": [], "instance": 1}]},
            "$.checks[0].schema",
            "not of type",
        ),
        ({"checks": [{"type": "equals", "actual": 1}]}, "$.checks[0]", "'expected' is a required property"),
    ],
)
def test_the_input_schema_rejects_malformed_checks_with_a_clear_error(
    args: dict[str, Any], path: str, message: str
) -> None:
    error = first_error("verify.input.json", args)
    assert error is not None
    assert json_path(error) == path
    assert message in error.message
