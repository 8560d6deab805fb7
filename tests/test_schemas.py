"""Every file in schemas/ is a valid JSON Schema (the runtime no longer re-checks them at start-up),
and the compiled acceptors never accept what jsonschema rejects."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conclave._schema_accept import compile_acceptor
from conclave.schemas import (
    acceptor,
    first_error,
    load_schema,
    schema_dir,
    validator,
)

SCHEMAS = sorted(p for p in Path(schema_dir()).rglob("*.json"))


def test_there_are_schemas_to_check() -> None:
    assert len(SCHEMAS) >= 30


@pytest.mark.parametrize("path", SCHEMAS, ids=lambda p: str(p.relative_to(schema_dir())))
def test_each_schema_is_valid_against_its_metaschema(path: Path) -> None:
    schema = orjson.loads(path.read_bytes())
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)


# ------------------------------------------------------------------ the compiled acceptors


class Text(str):
    """A str subclass: jsonschema checks it as a string; the acceptor must leave it to it."""


CONFUSERS: list[Any] = [
    True, False, None, 0, 1, -1, 1.0, 0.5, -0.0, math.nan, math.inf, -math.inf, 2**70, -(2**70),
    "", "x", "é" * 3, "\U0001f600" * 2, Text("ok"), [], ["a", "a"], [1, 1.0], [True, 1], ("a",),
    {}, {"a": 1}, Decimal("1"), Fraction(1, 3),
]  # fmt: skip
ACCEPTED = [
    ("confer.input.json", {"question": "Which queue?", "providers": ["a", "b"], "max_tokens": 64}),
    ("confer.input.json", {"question": "q", "temperature": 0.5, "dry_run": True, "timeout_seconds": 1.5}),
    ("coordinate.input.json", {"task": "t", "proposer": "a", "critics": ["b", "c"], "synthesizer": "a"}),
    ("fetch.input.json", {"url": "https://example.com/"}),
    ("list_providers.input.json", {}),
]


def sized(low: int, high: float, *, tame: bool) -> list[int]:
    """Sizes on a bound and (unless tame) one past it."""
    sizes = {low, int(min(high, low + 3))} if tame else {max(low - 1, 0), low, low + 1}
    if high != math.inf:
        sizes |= {int(high)} if tame else {int(high) - 1, int(high), int(high) + 1}
    return sorted(n for n in sizes if n >= 0)


def near(schema: Any, depth: int = 0, *, tame: bool = False, root: Any = None) -> st.SearchStrategy[Any]:
    """Values around a schema's edges: each bound, and (unless `tame`) just past it, the wrong
    types jsonschema is particular about, missing, extra and duplicated members. `tame` keeps
    inside the bounds, so that objects with many members are often valid too."""
    confusers = st.sampled_from(CONFUSERS)
    if schema is True or depth > 4:
        return confusers
    root = schema if root is None else root
    if "$ref" in schema:  # the acceptors resolve local refs only: so does this
        target = root["$defs"][schema["$ref"].removeprefix("#/$defs/")]
        return near(
            {**target, **{k: v for k, v in schema.items() if k != "$ref"}}, depth, tame=tame, root=root
        )
    options: list[st.SearchStrategy[Any]] = [] if tame else [confusers]
    if "enum" in schema:
        options.append(st.sampled_from(schema["enum"]))
        if tame:
            return st.sampled_from(schema["enum"])
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else list(types)
    if "boolean" in types:
        options.append(st.booleans())
    if "null" in types:
        options.append(st.none())
    if "string" in types or {"minLength", "maxLength", "pattern"} & set(schema):
        low, high = schema.get("minLength", 0), schema.get("maxLength", math.inf)
        if "pattern" in schema:
            slack = 0 if tame else 1
            pattern = st.from_regex(schema["pattern"])
            options.append(pattern.filter(lambda s: low - slack <= len(s) <= high + slack))
        else:
            lengths = sized(low, high, tame=tame)
            # code points, not bytes or UTF-16 units, are what lengths count
            options.append(st.sampled_from([c * n for n in lengths for c in ("a", "é", "\U0001f600")]))
            options.append(st.text(min_size=low, max_size=int(min(high, low + 12))))
    numeric = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
    if {"integer", "number"} & set(types) or numeric & set(schema):
        edges = [schema[k] for k in sorted(numeric) if k in schema]
        if tame:
            low = math.floor(schema.get("minimum", schema.get("exclusiveMinimum", -11) + 1))
            high = math.ceil(schema.get("maximum", schema.get("exclusiveMaximum", low + 11) - 1))
            options.append(st.integers(low, high))
            if "number" in types:
                options.append(st.floats(low, high))
        else:
            around = [e + d for e in edges for d in (-1, -0.5, 0, 0.5, 1)]
            options += [st.sampled_from(around or [0]), st.integers(-5, 5), st.floats(allow_nan=True)]
            options.append(st.sampled_from([float(e) for e in edges] or [1.0]))
    if "array" in types or {"items", "minItems", "maxItems", "uniqueItems"} & set(schema):
        item = near(schema.get("items", True), depth + 1, tame=True, root=root)
        for count in sized(schema.get("minItems", 0), schema.get("maxItems", math.inf), tame=tame):
            if schema.get("uniqueItems"):  # at most `count`: an enum may have fewer distinct values
                options.append(st.lists(item, max_size=count, unique_by=repr))
            options.append(st.lists(item, min_size=count, max_size=count))
        options.append(st.lists(near(schema.get("items", True), depth + 1, tame=tame, root=root), max_size=4))
        options.append(item.map(lambda x: [x, x]))  # duplicates, for uniqueItems
    if "object" in types or "properties" in schema:
        properties = schema.get("properties", {})
        required = set(schema.get("required", []))
        extra = schema.get("additionalProperties", True)
        for gentle in {True, tame}:
            members = {name: near(sub, depth + 1, tame=gentle, root=root) for name, sub in properties.items()}
            if isinstance(extra, dict):  # members beyond `properties`, held to their own schema
                members["extra-1"] = members["extra-2"] = near(extra, depth + 1, tame=gentle, root=root)
            options.append(
                st.fixed_dictionaries(
                    {name: s for name, s in members.items() if name in required},
                    optional={name: s for name, s in members.items() if name not in required},
                )
            )
            if members and not tame:  # a required member left out, or one member too many
                options.append(st.fixed_dictionaries({}, optional={**members, "unexpected": confusers}))
    return st.one_of(options or [confusers])


def subschemas(schema: Any, path: str = "$") -> list[tuple[str, Any]]:
    """The schema and every schema under `properties`, `items`, `additionalProperties` and
    `$defs`, with where it sits."""
    found = [(path, schema)]
    if isinstance(schema, dict):
        for name, sub in schema.get("properties", {}).items():
            found += subschemas(sub, f"{path}.{name}")
        for name, sub in schema.get("$defs", {}).items():
            found += subschemas(sub, f"{path}.$defs.{name}")
        if "items" in schema:
            found += subschemas(schema["items"], f"{path}[]")
        if isinstance(schema.get("additionalProperties"), dict):
            found += subschemas(schema["additionalProperties"], f"{path}.*")
    return found


WITH_ACCEPTORS = [p for p in SCHEMAS if acceptor(str(p.relative_to(schema_dir()))) is not None]


def test_the_tool_inputs_and_simple_envelopes_have_acceptors() -> None:
    names = {str(p.relative_to(schema_dir())) for p in WITH_ACCEPTORS}
    assert {"confer.input.json", "coordinate.input.json", "fetch.input.json"} <= names
    assert "config.schema.json" in names  # local $refs, enums, additionalProperties schemas
    assert acceptor("verify.input.json") is None  # if/then, const, allOf: left to jsonschema


@pytest.mark.parametrize(("relative", "instance"), ACCEPTED)
def test_a_valid_call_takes_the_fast_path(relative: str, instance: Any) -> None:
    accept = acceptor(relative)
    assert accept is not None and accept(instance)
    assert validator(relative).is_valid(instance)


@pytest.mark.parametrize("path", WITH_ACCEPTORS, ids=lambda p: str(p.relative_to(schema_dir())))
def test_an_acceptor_never_accepts_what_jsonschema_rejects(path: Path) -> None:
    relative = str(path.relative_to(schema_dir()))
    accept, full = acceptor(relative), validator(relative)
    assert accept is not None
    seen = {True: 0, False: 0}

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
    @given(near(load_schema(relative)))
    def check(instance: Any) -> None:
        verdict = accept(instance)
        seen[verdict] += 1
        if verdict:
            assert full.is_valid(instance), (
                f"accepted, but jsonschema says: {first_error(relative, instance)}"
            )

    check()
    assert seen[True] > 0 and seen[False] > 0, seen  # both sides of the fast path were exercised


SUBSCHEMAS = [
    (str(p.relative_to(schema_dir())), where, sub)
    for p in WITH_ACCEPTORS
    for where, sub in subschemas(load_schema(str(p.relative_to(schema_dir()))))
    if sub is not True
]


@pytest.mark.parametrize(
    ("relative", "where", "schema"), SUBSCHEMAS, ids=[f"{r}:{w}" for r, w, _ in SUBSCHEMAS]
)
def test_each_part_of_an_acceptor_agrees_with_jsonschema_at_its_edges(
    relative: str, where: str, schema: Any
) -> None:
    """Each property's and item's schema on its own, so every bound and every type confusion
    is met directly (inside a whole object most of them would hide behind another error)."""
    root = load_schema(relative)
    accept = compile_acceptor(schema, root)
    # the part, with the file's $defs beside it so that its local $refs resolve
    full = type(validator(relative))({**schema, "$defs": root.get("$defs", {})})

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(near(schema, root=root))
    def check(instance: Any) -> None:
        if accept(instance):
            assert full.is_valid(instance), f"{where}: accepted {instance!r}"

    check()


def test_a_rejected_instance_still_gets_jsonschemas_message_and_path() -> None:
    error = first_error("confer.input.json", {"question": "q", "providers": ["a", "a"]})

    assert error is not None
    assert "non-unique" in error.message
    assert list(error.absolute_path) == ["providers"]


def test_confers_synthesis_block_is_coordinates_and_the_review_roles_are_known_everywhere() -> None:
    """A tool's outputSchema must stand alone (MCP clients get it whole), so confer's synthesis
    block is a copy of coordinate's: the copy may not drift."""
    ours = dict(load_schema("confer.output.json")["properties"]["synthesis"])
    theirs = load_schema("coordinate.output.json")["properties"]["synthesis"]["anyOf"][0]
    assert ours.pop("type") == ["object", "null"] and ours.pop("description")
    assert ours == {k: v for k, v in theirs.items() if k != "type"}
    for name in ("confer.output.json", "coordinate.output.json"):
        reasons = load_schema(name)["properties"]["degraded_reasons"]["items"]["properties"]["role"]["enum"]
        assert "reviewer" in reasons
