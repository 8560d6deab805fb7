"""The answer schema a caller gives `confer`: checked at the door, and the helpers around it."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from conclave.core.errors import InvalidArguments
from conclave.schema import answer_schema
from conclave.schema.answer_schema import (
    MAX_ANSWER_SCHEMA_BYTES,
    PORTABLE_KEYWORDS,
    answer_errors,
    check_answer_schema,
    choices_schema,
    number_schema,
    strict_compatible,
)


def obj(properties: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", **extra}
    if properties is not None:
        schema["properties"] = properties
    return schema


NESTED: dict[str, Any] = {
    "type": "object",
    "description": "A release decision.",
    "properties": {
        "decision": {"type": "string", "enum": ["ship", "hold"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "votes": {"type": "integer", "minimum": 0},
        "blocking": {"type": "boolean"},
        "nothing": {"type": "null"},
        "risks": {
            "type": "array",
            "minItems": 1,
            "maxItems": 5,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "The risk."},
                    "severity": {"type": "integer", "enum": [1, 2, 3]},
                    "owners": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["name", "severity", "owners"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["decision", "confidence", "votes", "blocking", "nothing", "risks"],
    "additionalProperties": False,
}


def refusal(schema: Any) -> InvalidArguments:
    with pytest.raises(InvalidArguments) as info:
        check_answer_schema(schema)
    error = info.value
    assert error.tool == "confer"
    assert str(error) == f"{error.path}: {error.message}"
    return error


# ------------------------------------------------------------------ accepted


def test_the_portable_keywords_are_the_product_specs() -> None:
    spec = {
        *("type", "properties", "required", "enum", "items", "minimum", "maximum"),
        *("minItems", "maxItems", "description", "additionalProperties"),
    }
    assert spec == PORTABLE_KEYWORDS
    assert MAX_ANSWER_SCHEMA_BYTES == 16384


@pytest.mark.parametrize(
    "schema",
    [
        choices_schema(["A", "B", "C"]),
        number_schema(),
        NESTED,
        {"type": "object"},
        obj({"free": {}, "labelled": {"description": "anything"}, "pick": {"enum": [None]}}),
    ],
    ids=["choices", "number", "nested", "bare-object", "typeless-leaves"],
)
def test_accepts_portable_schemas(schema: dict[str, Any]) -> None:
    before = copy.deepcopy(schema)
    check_answer_schema(schema)
    assert schema == before


def test_accepts_five_levels_of_objects_and_arrays_and_a_hundred_properties() -> None:
    leaf: dict[str, Any] = {"type": "string"}
    for _ in range(2):
        leaf = obj({"x": {"type": "array", "items": leaf}})
    check_answer_schema(obj({"x": leaf}))  # object, object, array, object, array; string leaf
    check_answer_schema(obj({f"p{i}": {"type": "string"} for i in range(100)}))


def test_path_and_tool_are_the_callers() -> None:
    with pytest.raises(InvalidArguments) as info:
        check_answer_schema(obj({"a": {"type": "string", "pattern": "x"}}), path="$.schema", tool="cli")
    assert info.value.path == "$.schema.properties.a"
    assert info.value.tool == "cli"


# ------------------------------------------------------------------ keywords outside the subset


@pytest.mark.parametrize(
    ("keyword", "value"),
    [
        ("pattern", "^[a-z]+$"),
        ("format", "date-time"),
        ("oneOf", [{"type": "string"}, {"type": "number"}]),
        ("anyOf", [{"type": "string"}, {"type": "number"}]),
        ("$ref", "#/$defs/name"),
        ("$defs", {"name": {"type": "string"}}),
        ("const", "x"),
        ("default", "x"),
        ("minLength", 1),
        ("title", "Name"),
    ],
)
@pytest.mark.parametrize(
    ("where", "place"),
    [
        ("root", "$.answer_schema"),
        ("property", "$.answer_schema.properties.name"),
        ("items", "$.answer_schema.properties.tags.items"),
    ],
)
def test_refuses_each_keyword_outside_the_subset(keyword: str, value: Any, where: str, place: str) -> None:
    schema = obj(
        {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
        required=["name"],
    )
    target = {
        "root": schema,
        "property": schema["properties"]["name"],
        "items": schema["properties"]["tags"]["items"],
    }[where]
    target[keyword] = value
    error = refusal(schema)
    assert error.path == place
    assert error.message == (
        f"keyword {keyword!r} is not in the portable subset (type, properties, required, enum, items, "
        "minimum, maximum, minItems, maxItems, description, additionalProperties)"
    )
    assert keyword in str(error) and place in str(error)


# ------------------------------------------------------------------ the root, its size


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (["type", "object"], "must be a JSON Schema object, not an array"),
        ("{}", "must be a JSON Schema object, not a string"),
        (None, "must be a JSON Schema object, not null"),
        ({}, "the root must be a schema of type 'object', not one with no type"),
        (
            {"type": "array", "items": {"type": "string"}},
            "the root must be a schema of type 'object', not one with type \"array\"",
        ),
        (
            {"type": ["object", "null"]},
            'the root must be a schema of type \'object\', not one with type ["object","null"]',
        ),
    ],
)
def test_refuses_a_root_that_is_not_an_object_schema(schema: Any, message: str) -> None:
    error = refusal(schema)
    assert (error.path, error.message) == ("$.answer_schema", message)


def test_refuses_a_schema_over_16_kib_naming_its_size_and_the_limit() -> None:
    schema = obj({"a": {"type": "string", "description": "x" * MAX_ANSWER_SCHEMA_BYTES}})
    size = len(orjson.dumps(schema))
    error = refusal(schema)
    assert error.path == "$.answer_schema"
    assert error.message == f"is {size} bytes as compact JSON, over the limit of 16384 bytes (16 KiB)"


def test_a_schema_of_exactly_16_kib_is_accepted() -> None:
    schema = obj({"a": {"type": "string", "description": ""}})
    schema["properties"]["a"]["description"] = "x" * (MAX_ANSWER_SCHEMA_BYTES - len(orjson.dumps(schema)))
    assert len(orjson.dumps(schema)) == MAX_ANSWER_SCHEMA_BYTES
    check_answer_schema(schema)


def test_refuses_a_value_that_is_not_json() -> None:
    error = refusal(obj({"a": {"type": "string", "description": {1, 2}}}))
    assert error.path == "$.answer_schema" and error.message.startswith("is not JSON: ")


# ------------------------------------------------------------------ allowed keywords, misused


@pytest.mark.parametrize(
    ("additional", "shown"),
    [(True, "true"), ({"type": "string"}, '{"type":"string"}'), ({}, "{}")],
)
def test_refuses_additional_properties_other_than_false(additional: Any, shown: str) -> None:
    error = refusal(obj({"inner": obj({}, additionalProperties=additional)}))
    assert error.path == "$.answer_schema.properties.inner.additionalProperties"
    assert error.message == f"must be false, the only form every provider accepts, not {shown}"


@pytest.mark.parametrize(
    ("required", "path", "message"),
    [
        (
            ["a", "ghost"],
            "$.answer_schema.required[1]",
            "'ghost' is not a declared property (declared: 'a', 'b')",
        ),
        (["a", "b", "a"], "$.answer_schema.required[2]", "'a' is listed twice"),
        (["a", 1], "$.answer_schema.required[1]", "must be a property name (a string), not a number"),
        ("a", "$.answer_schema.required", "must be a list of property names, not a string"),
    ],
)
def test_refuses_a_bad_required(required: Any, path: str, message: str) -> None:
    error = refusal(obj({"a": {"type": "string"}, "b": {"type": "string"}}, required=required))
    assert (error.path, error.message) == (path, message)


def test_refuses_required_without_properties() -> None:
    error = refusal(obj(required=["a"]))
    assert (error.path, error.message) == (
        "$.answer_schema.required[0]",
        "'a' is not a declared property (declared: none)",
    )


@pytest.mark.parametrize(
    ("enum", "path", "message"),
    [
        ([], "$.enum", "must be a non-empty list of strings, numbers, booleans or null, not an empty list"),
        ("A", "$.enum", "must be a non-empty list of strings, numbers, booleans or null, not a string"),
        (
            ["A", 1],
            "$.enum[1]",
            "is a number, but the first value is a string: the values must all be of one type",
        ),
        (
            [True, None],
            "$.enum[1]",
            "is null, but the first value is a boolean: the values must all be of one type",
        ),
        (
            [1, True],
            "$.enum[1]",
            "is a boolean, but the first value is a number: the values must all be of one type",
        ),
        (["A", {"b": 1}], "$.enum[1]", "must be a string, number, boolean or null, not an object"),
        ([{"b": 1}], "$.enum[0]", "must be a string, number, boolean or null, not an object"),
        ([["A"]], "$.enum[0]", "must be a string, number, boolean or null, not an array"),
        (["A", "B", "A"], "$.enum[2]", '"A" is listed twice'),
        ([1, 1.0], "$.enum[1]", "1.0 is listed twice"),
        ([1, float("nan")], "$.enum[1]", "must be a finite number, not nan"),
    ],
)
def test_refuses_a_bad_enum(enum: Any, path: str, message: str) -> None:
    error = refusal(obj({"pick": {"enum": enum}}))
    assert error.path == "$.answer_schema.properties.pick" + path[1:]
    assert error.message == message


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "string", "enum": [1, 2]}, "1 is not of the schema's type 'string'"),
        ({"type": "integer", "enum": [1, 2.5]}, "2.5 is not of the schema's type 'integer'"),
    ],
)
def test_refuses_an_enum_its_type_cannot_hold(schema: dict[str, Any], message: str) -> None:
    error = refusal(obj({"pick": schema}))
    assert error.message == message and error.path.startswith("$.answer_schema.properties.pick.enum[")


@pytest.mark.parametrize(
    ("schema", "path", "message"),
    [
        (
            {"type": ["string", "null"]},
            ".type",
            "must be one type name: a list of types is not in the portable subset",
        ),
        (
            {"type": "float"},
            ".type",
            'must be one of object, array, string, number, integer, boolean, null, not "float"',
        ),
        (
            {"type": "object", "properties": ["a"]},
            ".properties",
            "must be an object of schemas, not an array",
        ),
        (
            {"type": "object", "properties": {"a": True}},
            ".properties.a",
            "must be a schema (a JSON object), not a boolean",
        ),
        (
            {"type": "array", "items": [{"type": "string"}]},
            ".items",
            "must be one schema (a JSON object): a list of schemas is not in the portable subset",
        ),
        ({"type": "array", "items": True}, ".items", "must be a schema (a JSON object), not a boolean"),
        ({"type": "number", "minimum": "0"}, ".minimum", 'must be a number, not "0"'),
        ({"type": "number", "maximum": True}, ".maximum", "must be a number, not true"),
        ({"type": "number", "minimum": float("inf")}, ".minimum", "must be a number, not null"),
        ({"type": "number", "minimum": 2, "maximum": 1}, ".minimum", "is greater than maximum (2 > 1)"),
        ({"type": "array", "minItems": -1}, ".minItems", "must be a non-negative integer, not -1"),
        ({"type": "array", "maxItems": 1.5}, ".maxItems", "must be a non-negative integer, not 1.5"),
        ({"type": "array", "minItems": 3, "maxItems": 2}, ".minItems", "is greater than maxItems (3 > 2)"),
        ({"type": "string", "description": 5}, ".description", "must be a string, not a number"),
        (
            {"type": "string", "items": {"type": "string"}},
            "",
            "keyword 'items' applies to type array, not 'string'",
        ),
        (
            {"type": "string", "minimum": 1},
            "",
            "keyword 'minimum' applies to type number or integer, not 'string'",
        ),
        (
            {"properties": {"a": {"type": "string"}}},
            "",
            "keyword 'properties' needs the schema to declare type object",
        ),
    ],
)
def test_refuses_an_allowed_keyword_used_wrongly(schema: dict[str, Any], path: str, message: str) -> None:
    error = refusal(obj({"field": schema}))
    assert (error.path, error.message) == ("$.answer_schema.properties.field" + path, message)


def test_refuses_nesting_deeper_than_five_levels() -> None:
    leaf: dict[str, Any] = {"type": "string"}
    for _ in range(5):
        leaf = obj({"x": leaf})
    error = refusal(obj({"x": leaf}))  # the root and five objects below it
    assert error.path == "$.answer_schema" + ".properties.x" * 5
    assert error.message == "nests objects and arrays 6 levels deep; providers allow at most 5"


def test_arrays_count_towards_the_depth() -> None:
    leaf: dict[str, Any] = {"type": "array", "items": {"type": "string"}}
    for _ in range(4):
        leaf = {"type": "array", "items": leaf}
    error = refusal(obj({"x": leaf}))
    assert error.path == "$.answer_schema.properties.x" + ".items" * 4
    assert "6 levels deep" in error.message


def test_refuses_a_schema_nested_far_too_deep_before_walking_it() -> None:
    schema: dict[str, Any] = {"type": "object"}
    node = schema
    for _ in range(2000):  # past orjson's and the interpreter's recursion limits
        node["properties"] = {"a": {"type": "object"}}
        node = node["properties"]["a"]
    error = refusal(schema)
    assert error.path == "$.answer_schema"
    assert error.message == (
        "nests more than 64 JSON levels deep; providers allow at most 5 levels of objects and arrays"
    )


def test_refuses_more_than_a_hundred_properties_in_all() -> None:
    schema = obj(
        {
            "a": obj({f"p{i}": {"type": "string"} for i in range(60)}),
            "b": obj({f"q{i}": {"type": "string"} for i in range(60)}),
        }
    )
    error = refusal(schema)
    assert error.path == "$.answer_schema.properties.b.properties.q38"  # a, 60 p's, b, then q0..q38
    assert error.message == "is property 101 of the schema; providers allow at most 100 in all"


# ------------------------------------------------------------------ strict mode


def test_strict_compatible() -> None:
    assert strict_compatible(choices_schema(["A", "B"]))
    assert strict_compatible(number_schema())
    assert strict_compatible(NESTED)
    assert strict_compatible({"type": "object", "additionalProperties": False})
    assert not strict_compatible({"type": "object"})
    assert not strict_compatible(obj({"a": {"type": "string"}}, additionalProperties=False))  # a not required
    assert not strict_compatible(obj({"a": {"type": "string"}}, required=["a"]))  # open to extra properties


def test_strict_compatible_looks_into_nested_objects() -> None:
    nested = copy.deepcopy(NESTED)
    del nested["properties"]["risks"]["items"]["additionalProperties"]
    assert not strict_compatible(nested)
    nested = copy.deepcopy(NESTED)
    nested["properties"]["risks"]["items"]["required"].remove("owners")
    assert not strict_compatible(nested)
    inner = obj({"x": {"type": "string"}}, required=["x"])  # an object in a property, not closed
    assert not strict_compatible(obj({"inner": inner}, required=["inner"], additionalProperties=False))
    inner["additionalProperties"] = False
    assert strict_compatible(obj({"inner": inner}, required=["inner"], additionalProperties=False))


# ------------------------------------------------------------------ the CLI's shorthands


def test_choices_schema() -> None:
    schema = choices_schema([" A ", "B", "C"])
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert schema["required"] == ["choice", "reason"]
    assert schema["properties"]["choice"]["type"] == "string"
    assert schema["properties"]["choice"]["enum"] == ["A", "B", "C"]
    assert schema["properties"]["reason"]["type"] == "string"
    assert isinstance(schema["properties"]["reason"]["description"], str)


@pytest.mark.parametrize(
    ("choices", "message"),
    [
        ([], "give at least 2 choices, not 0"),
        (["A"], "give at least 2 choices, not 1"),
        (["A", " "], "choice 2 is blank"),
        (["", "B"], "choice 1 is blank"),
        (["A", "B", " A"], "choice 'A' is given twice"),
        ("A,B", "choices must be a list of strings, not one string"),
        (["A", 2], "choice 2 must be a string, not a number"),
    ],
)
def test_choices_schema_refuses(choices: Any, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message):
        choices_schema(choices)


def test_number_schema() -> None:
    schema = number_schema()
    assert schema["properties"]["value"]["type"] == "number"
    assert schema["properties"]["reason"]["type"] == "string"
    assert schema["required"] == ["value", "reason"] and schema["additionalProperties"] is False


# ------------------------------------------------------------------ a reply checked


def test_answer_errors_empty_for_a_valid_value() -> None:
    assert answer_errors(choices_schema(["A", "B", "C"]), {"choice": "B", "reason": "cheaper"}) == []
    assert answer_errors(number_schema(), {"value": 3, "reason": "sum"}) == []
    answer = {
        "decision": "ship",
        "confidence": 0.8,
        "votes": 3,
        "blocking": False,
        "nothing": None,
        "risks": [{"name": "load", "severity": 2, "owners": ["ops"]}],
    }
    assert answer_errors(NESTED, answer) == []


def test_answer_errors_messages() -> None:
    choices = choices_schema(["A", "B", "C"])
    assert answer_errors(choices, {"choice": "D", "reason": "x"}) == [
        "$.choice: 'D' is not one of ['A', 'B', 'C']"
    ]
    assert answer_errors(choices, {"choice": "A"}) == ["$: 'reason' is a required property"]
    assert answer_errors(choices, ["A"]) == ["$: ['A'] is not of type 'object'"]
    assert answer_errors(choices, {"choice": "A", "reason": "x", "extra": 1}) == [
        "$: Additional properties are not allowed ('extra' was unexpected)"
    ]
    assert answer_errors(number_schema(), {"value": "3", "reason": "x"}) == [
        "$.value: '3' is not of type 'number'"
    ]
    assert answer_errors(number_schema(), {"value": float("nan"), "reason": "x"}) == [
        "$.value: nan is not of type 'number'"
    ]
    risky = {
        "decision": "ship",
        "confidence": 2,
        "votes": 1,
        "blocking": True,
        "nothing": None,
        "risks": [{"name": "x", "severity": 9, "owners": [1]}],
    }
    assert answer_errors(NESTED, risky) == [
        "$.confidence: 2 is greater than the maximum of 1",
        "$.risks[0].severity: 9 is not one of [1, 2, 3]",
        "$.risks[0].owners[0]: 1 is not of type 'string'",
    ]


def test_answer_errors_shallowest_first_and_at_most_limit() -> None:
    schema = obj({f"p{i}": {"type": "integer"} for i in range(8)}, required=[f"p{i}" for i in range(8)])
    value = {f"p{i}": "x" for i in range(7)}
    errors = answer_errors(schema, value)
    assert len(errors) == 5
    assert errors[0] == "$: 'p7' is a required property"
    assert all(e.endswith("is not of type 'integer'") for e in errors[1:])
    assert len(answer_errors(schema, value, limit=2)) == 2
    assert len(answer_errors(schema, value, limit=100)) == 8
    with pytest.raises(ValueError, match="limit"):
        answer_errors(schema, value, limit=0)


def test_answer_errors_clips_a_long_quoted_value() -> None:
    (message,) = answer_errors(number_schema(), {"value": "9" * 5000, "reason": "x"})
    assert len(message) < 600 and message.startswith("$.value: '999") and "characters cut" in message


def test_the_validator_is_compiled_once_per_distinct_schema() -> None:
    compiled = answer_schema._compile
    compiled.cache_clear()
    first, second = choices_schema(["A", "B"]), choices_schema(["A", "B"])
    assert first == second and first is not second
    answer_errors(first, {"choice": "A", "reason": "x"})
    answer_errors(second, {"choice": "C", "reason": "x"})
    reordered = dict(reversed(list(first.items())))  # equal, keys in another order
    answer_errors(reordered, {"choice": "B"})
    info = compiled.cache_info()
    assert (info.misses, info.hits) == (1, 2)
    answer_errors(number_schema(), {"value": 1, "reason": "x"})
    assert compiled.cache_info().misses == 2
    assert compiled.cache_info().maxsize is not None and compiled.cache_info().maxsize <= 256
