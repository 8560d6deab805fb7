"""A native tool call's arguments obey the rules of a `<tool_call>` tag's JSON
(docs/worker-loop.md#native-tool-calling)."""

from __future__ import annotations

import pytest

from conclave.schema.strictjson import MAX_ARGUMENT_BYTES, MAX_ARGUMENT_DEPTH, tool_arguments


def test_an_object_string_is_decoded() -> None:
    assert tool_arguments('{"url": "https://example.org/", "max_bytes": 10}') == (
        {"url": "https://example.org/", "max_bytes": 10},
        None,
    )


def test_an_already_decoded_object_is_kept_and_copied() -> None:
    given = {"checks": [{"type": "math", "expression": "1+1", "expected": 2}]}
    arguments, error = tool_arguments(given)
    assert (arguments, error) == (given, None) and arguments is not given


@pytest.mark.parametrize("empty", ["", None])
def test_no_arguments_are_an_empty_object(empty: str | None) -> None:
    assert tool_arguments(empty) == ({}, None)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ('{"url": "https://ok", "url": "http://169.254.169.254"}', "duplicate key 'url'"),
        ('{"expected": NaN}', "NaN is not allowed"),
        ('{"expected": 1e999}', "out of range"),
        ('["not", "an", "object"]', "must be a JSON object, not an array"),
        ('{"a": ', "invalid tool call arguments"),
        ('{"a": ' + "[" * (MAX_ARGUMENT_DEPTH + 1) + "]" * (MAX_ARGUMENT_DEPTH + 1) + "}", "nested deeper"),
        ('{"a": ' + "[" * 5000 + "]" * 5000 + "}", "nested deeper"),
        ('{"a": "' + "x" * MAX_ARGUMENT_BYTES + '"}', "larger than 16 KiB"),
    ],
)
def test_what_a_tag_refuses_is_a_parse_error_here_too(raw: str, why: str) -> None:
    arguments, error = tool_arguments(raw)
    assert arguments is None and error is not None and why in error


def test_a_decoded_object_too_deep_or_too_large_is_refused_as_well() -> None:
    deep: dict[str, object] = {}
    node = deep
    for _ in range(MAX_ARGUMENT_DEPTH + 1):
        node["k"] = {}
        node = node["k"]  # type: ignore[assignment]
    assert tool_arguments(deep)[1] == f"tool call arguments nested deeper than {MAX_ARGUMENT_DEPTH} levels"
    assert "larger than" in (tool_arguments({"a": "x" * MAX_ARGUMENT_BYTES})[1] or "")
