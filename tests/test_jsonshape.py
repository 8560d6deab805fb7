"""The one JSON type-name helper and the one depth walk that schemas, verify and tags share."""

from __future__ import annotations

from typing import Any

import pytest

from conclave.schema.jsonshape import a_json_type, deepest_path, json_type, nests_deeper_than


@pytest.mark.parametrize(
    ("value", "name", "phrase"),
    [
        ({}, "object", "an object"),
        ([], "array", "an array"),
        ("", "string", "a string"),
        (1, "number", "a number"),
        (1.5, "number", "a number"),
        (True, "boolean", "a boolean"),
        (None, "null", "null"),
    ],
)
def test_each_json_value_is_named_as_json_names_it(value: Any, name: str, phrase: str) -> None:
    assert json_type(value) == name
    assert a_json_type(value) == phrase


def test_a_value_json_has_no_name_for_is_named_by_its_python_type() -> None:
    assert json_type(b"x") == "bytes"
    assert json_type((1, 2)) == "array"


def test_the_deepest_path_names_each_key_and_index_on_the_way_down() -> None:
    assert deepest_path({"a": 1, "b": [0, {"c": [[]]}]}) == ["b", 1, "c", 0]
    assert deepest_path(7) == [] and deepest_path({}) == []


def test_a_value_deeper_than_the_recursion_limit_is_walked_without_recursion() -> None:
    value: Any = 0
    for _ in range(100_000):
        value = [value]
    assert len(deepest_path(value)) == 100_000
    assert nests_deeper_than(value, 100)


def test_a_value_inside_itself_is_walked_once() -> None:
    loop: list[Any] = []
    loop.append(loop)
    assert deepest_path({"a": loop}) == ["a"]


@pytest.mark.parametrize(("value", "levels"), [(1, 1), ([], 1), ([1], 2), ([[1]], 3), ({"k": {"k": 0}}, 3)])
def test_a_scalar_is_one_level_and_each_container_around_it_one_more(value: Any, levels: int) -> None:
    assert not nests_deeper_than(value, levels)
    assert nests_deeper_than(value, levels - 1)
