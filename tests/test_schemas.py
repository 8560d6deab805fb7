"""Every file in schemas/ is a valid JSON Schema (the runtime no longer re-checks them at start-up)
whose `$ref`s resolve, each shape is written once (in schemas/defs/ when several files share it),
what a client is handed whole stands alone, and the compiled acceptors never accept what
jsonschema rejects."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urljoin

import jsonschema
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conclave.app.catalog import TOOLS
from conclave.app.server.surface import describe
from conclave.schema._schema_accept import Unsupported, compile_acceptor
from conclave.schema.schemas import (
    _merge,
    acceptor,
    dereferenced,
    first_error,
    load_schema,
    relative_path,
    resolve,
    schema_dir,
    schema_uri,
    validator,
)

SCHEMAS = sorted(p for p in Path(schema_dir()).rglob("*.json"))


def rel(path: Path) -> str:
    return path.relative_to(schema_dir()).as_posix()


def test_there_are_schemas_to_check() -> None:
    assert len(SCHEMAS) >= 30


@pytest.mark.parametrize("path", SCHEMAS, ids=rel)
def test_each_schema_is_valid_against_its_metaschema(path: Path) -> None:
    schema = orjson.loads(path.read_bytes())
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)


# ------------------------------------------------------------------ references between files


def refs(node: Any, base: str) -> Iterator[tuple[str, str]]:
    """(`$ref` as written, the absolute URI it names) for every `$ref` under `node`."""
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"], urljoin(base, node["$ref"])
        for value in node.values():
            yield from refs(value, base)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item, base)


@pytest.mark.parametrize("path", SCHEMAS, ids=rel)
def test_each_schema_is_named_by_its_path_and_each_of_its_refs_resolves(path: Path) -> None:
    """A `$ref` is resolved against the file's `$id`: the two must agree, for the validators'
    registry, the acceptors and a reader alike."""
    schema = load_schema(rel(path))
    assert schema["$id"] == schema_uri(rel(path))
    for written, uri in refs(schema, schema["$id"]):
        assert not written.startswith(("http:", "https:")), f"{written}: name a file by its relative path"
        assert isinstance(resolve(uri), dict), f"{written} resolves to a non-schema"


def test_what_is_used_whole_elsewhere_names_no_other_file() -> None:
    """A role envelope schema is embedded whole in its role's prompt (deliberation/roles.py): it
    may not lean on another file. (A tool's schemas are published with every `$ref` inlined.)"""
    for path in SCHEMAS:
        if rel(path).startswith("roles/"):
            leaving = [
                w for w, uri in refs(load_schema(rel(path)), schema_uri(rel(path))) if not w.startswith("#")
            ]
            assert leaving == [], f"{rel(path)} names other files: {leaving}"


def test_every_shared_definition_is_used() -> None:
    named = {relative_path(uri) for p in SCHEMAS for _, uri in refs(load_schema(rel(p)), schema_uri(rel(p)))}
    unused = [rel(p) for p in SCHEMAS if rel(p).startswith("defs/") and rel(p) not in named]
    assert unused == []


def shapes(node: Any, where: str) -> Iterator[tuple[str, str]]:
    """(canonical JSON, where) of every object shape under `node`: a schema listing properties."""
    if isinstance(node, dict):
        if isinstance(node.get("properties"), dict) and len(node["properties"]) >= 3:
            annotations = {"description", "title", "$comment", "$id", "$schema", "$defs"}
            shape = {k: v for k, v in node.items() if k not in annotations}
            yield orjson.dumps(shape, option=orjson.OPT_SORT_KEYS).decode(), where
        for key, value in node.items():
            yield from shapes(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from shapes(item, f"{where}/{i}")


def test_no_shape_is_written_twice() -> None:
    """An object shape needed in several places is defined once and named by `$ref`: a copy
    would drift from its original."""
    seen = Counter[str]()
    places: dict[str, list[str]] = {}
    for path in SCHEMAS:
        for shape, where in shapes(load_schema(rel(path)), f"{rel(path)}#"):
            seen[shape] += 1
            places.setdefault(shape, []).append(where)
    assert [places[shape] for shape, count in seen.items() if count > 1] == []


# ------------------------------------------------------------------ what clients are handed whole


@pytest.mark.parametrize("tool", TOOLS, ids=lambda t: t.name)
def test_tools_list_publishes_self_contained_schemas(tool: Any) -> None:
    """MCP clients get each tool's schemas in `tools/list` and resolve nothing: the output schema
    comes with every `$ref` inlined, and no schema there names another file."""
    listed = describe(tool)
    output = orjson.dumps(listed["outputSchema"]).decode()
    assert '"$ref"' not in output and '"$defs"' not in output
    assert [w for w, _ in refs(listed["inputSchema"], "") if not w.startswith("#")] == []
    jsonschema.Draft202012Validator.check_schema(listed["outputSchema"])


def test_confer_and_coordinate_share_one_answer_schema() -> None:
    """Written once in defs/, named by both tools' inputs, published inlined in each."""
    for tool in ("confer", "coordinate"):
        assert load_schema(f"{tool}.input.json")["properties"]["answer_schema"] == {
            "$ref": "defs/answer_schema.json"
        }
        published = describe(next(t for t in TOOLS if t.name == tool))["inputSchema"]
        assert published["properties"]["answer_schema"]["type"] == "object"
        assert "portable keywords" in published["properties"]["answer_schema"]["description"]


def test_inlining_keeps_what_a_schema_accepts() -> None:
    """A refinement beside a `$ref` is merged into its target: coordinate's plan names only
    debate roles, a fallback only a debate role or none; a usage requires every count."""
    plan = dereferenced("coordinate.output.json")["properties"]["plan"]
    assert plan["properties"]["calls"]["items"]["properties"]["role"]["enum"] == [
        "proposer",
        "critic",
        "synthesizer",
    ]
    confer = dereferenced("confer.output.json")["properties"]
    assert "reviewer" in confer["plan"]["properties"]["calls"]["items"]["properties"]["role"]["enum"]
    synthesis = confer["synthesis"]["anyOf"][0]["properties"]
    assert synthesis["fallback_from"]["properties"]["role"]["enum"] == [
        "proposer",
        "critic",
        "synthesizer",
        None,
    ]
    assert confer["usage"]["required"] == load_schema("defs/usage.json")["required"]
    assert "allOf" not in orjson.dumps(confer).decode()


def test_a_refinement_is_merged_only_where_that_is_exact() -> None:
    closed = {"type": "object", "additionalProperties": False, "properties": {"a": {"enum": [1, True, "x"]}}}
    # a member the target's additionalProperties forbids would become allowed: kept apart (allOf)
    assert _merge(closed, {"properties": {"b": {}}}) is None
    assert _merge(closed, {"properties": {"a": {"enum": [1.0, "y"]}}, "description": "d"}) == {
        **closed,
        "properties": {"a": {"enum": [1]}},  # 1 == 1.0 as JSON, true is not 1
        "description": "d",
    }
    assert _merge({"required": ["a"]}, {"required": ["b", "a"]}) == {"required": ["b", "a"]}
    assert _merge({"minimum": 0}, {"minimum": 1}) is None


@pytest.mark.parametrize(
    "relative", [rel(p) for p in SCHEMAS if rel(p).endswith((".output.json", ".input.json"))]
)
def test_the_published_form_accepts_what_the_file_accepts(relative: str) -> None:
    """`tools/list`'s self-contained schema and the file with its `$ref`s, on the same values."""
    published = type(validator(relative))(dereferenced(relative))

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(near(load_schema(relative), base=schema_uri(relative)))
    def check(instance: Any) -> None:
        assert published.is_valid(instance) == validator(relative).is_valid(instance)

    check()


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


DATE_TIMES = ["2024-02-29T23:59:59Z", "2026-11-27T06:20:15.383467+00:00", "1999-12-31T00:00:00-05:30"]
NOT_DATE_TIMES = ["2023-02-29T00:00:00Z", "2024-01-01t00:00:00z", "2024-01-01 00:00:00Z", "2024-01-01", ""]


def sized(low: int, high: float, *, tame: bool) -> list[int]:
    """Sizes on a bound and (unless tame) one past it."""
    sizes = {low, int(min(high, low + 3))} if tame else {max(low - 1, 0), low, low + 1}
    if high != math.inf:
        sizes |= {int(high)} if tame else {int(high) - 1, int(high), int(high) + 1}
    return sorted(n for n in sizes if n >= 0)


def near(schema: Any, depth: int = 0, *, tame: bool = False, base: str = "") -> st.SearchStrategy[Any]:
    """Values around a schema's edges: each bound, and (unless `tame`) just past it, the wrong
    types jsonschema is particular about, missing, extra and duplicated members. `tame` keeps
    inside the bounds, so that objects with many members are often valid too. `base` is the URI
    the schema's `$ref`s are relative to (its file's `$id`)."""
    confusers = st.sampled_from(CONFUSERS)
    if schema is True or depth > 5:  # deep enough for a debate's rounds of role answers
        return confusers
    if "$ref" in schema:  # its target, in the file it is in, with what is beside it where it merges
        uri = urljoin(base, schema["$ref"])
        document = ("$ref", "$schema", "$id", "$defs")
        target, beside = resolve(uri), {k: v for k, v in schema.items() if k not in document}
        if urldefrag(uri)[0] == urldefrag(base)[0]:  # both in one file: one base for their $refs
            target = _merge(target, beside) or target
        elif "required" in beside:
            target = {**target, "required": [*target.get("required", []), *beside["required"]]}
        return near(target, depth, tame=tame, base=urldefrag(uri)[0])
    if "anyOf" in schema or "allOf" in schema:
        branches = [near(b, depth, tame=tame, base=base) for b in schema.get("anyOf", schema.get("allOf"))]
        return st.one_of(branches if tame else [*branches, confusers])
    if "const" in schema:
        return st.just(schema["const"]) if tame else st.sampled_from([schema["const"], *CONFUSERS])
    if schema.get("format") == "date-time":
        return st.sampled_from(DATE_TIMES if tame else [*DATE_TIMES, *NOT_DATE_TIMES, *CONFUSERS])
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
        item = near(schema.get("items", True), depth + 1, tame=True, base=base)
        for count in sized(schema.get("minItems", 0), schema.get("maxItems", math.inf), tame=tame):
            if schema.get("uniqueItems"):  # at most `count`: an enum may have fewer distinct values
                options.append(st.lists(item, max_size=count, unique_by=repr))
            options.append(st.lists(item, min_size=count, max_size=count))
        options.append(st.lists(near(schema.get("items", True), depth + 1, tame=tame, base=base), max_size=4))
        options.append(item.map(lambda x: [x, x]))  # duplicates, for uniqueItems
    if "object" in types or "properties" in schema:
        properties = schema.get("properties", {})
        required = set(schema.get("required", []))
        extra = schema.get("additionalProperties", True)
        for gentle in {True, tame}:
            members = {name: near(sub, depth + 1, tame=gentle, base=base) for name, sub in properties.items()}
            if isinstance(extra, dict):  # members beyond `properties`, held to their own schema
                members["extra-1"] = members["extra-2"] = near(extra, depth + 1, tame=gentle, base=base)
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
    """The schema and every schema under `properties`, `items`, `additionalProperties`,
    `anyOf`, `allOf` and `$defs`, with where it sits."""
    found = [(path, schema)]
    if isinstance(schema, dict):
        for name, sub in schema.get("properties", {}).items():
            found += subschemas(sub, f"{path}.{name}")
        for name, sub in schema.get("$defs", {}).items():
            found += subschemas(sub, f"{path}.$defs.{name}")
        for keyword in ("anyOf", "allOf"):
            for i, sub in enumerate(schema.get(keyword, [])):
                found += subschemas(sub, f"{path}.{keyword}[{i}]")
        if "items" in schema:
            found += subschemas(schema["items"], f"{path}[]")
        if isinstance(schema.get("additionalProperties"), dict):
            found += subschemas(schema["additionalProperties"], f"{path}.*")
    return found


WITH_ACCEPTORS = [p for p in SCHEMAS if acceptor(rel(p)) is not None]
_NOT_ASSERTIONS = {"$schema", "$id", "$comment", "$defs", "title", "description"}
# A file that only holds definitions (defs/names.json) accepts anything as a whole: its parts are
# checked below.
WHOLE = [p for p in WITH_ACCEPTORS if set(load_schema(rel(p))) - _NOT_ASSERTIONS]


def test_the_tool_inputs_and_simple_envelopes_have_acceptors() -> None:
    names = {rel(p) for p in WITH_ACCEPTORS}
    assert {"confer.input.json", "coordinate.input.json", "fetch.input.json"} <= names
    assert "config.schema.json" in names  # $refs, enums, additionalProperties schemas
    # the results, their shared shapes resolved as they are compiled (and anyOf: coordinate's)
    assert {rel(p) for p in SCHEMAS if rel(p).endswith(".output.json") or rel(p).startswith("defs/")} <= names
    assert acceptor("verify.input.json") is None  # if/then: left to jsonschema


@pytest.mark.parametrize(("relative", "instance"), ACCEPTED)
def test_a_valid_call_takes_the_fast_path(relative: str, instance: Any) -> None:
    accept = acceptor(relative)
    assert accept is not None and accept(instance)
    assert validator(relative).is_valid(instance)


@pytest.mark.parametrize("path", WHOLE, ids=rel)
def test_an_acceptor_never_accepts_what_jsonschema_rejects(path: Path) -> None:
    relative = rel(path)
    accept, full = acceptor(relative), validator(relative)
    assert accept is not None
    seen = {True: 0, False: 0}

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
    @given(near(load_schema(relative), base=schema_uri(relative)))
    def check(instance: Any) -> None:
        verdict = accept(instance)
        seen[verdict] += 1
        if verdict:
            assert full.is_valid(instance), (
                f"accepted, but jsonschema says: {first_error(relative, instance)}"
            )

    check()
    assert seen[True] > 0 and seen[False] > 0, seen  # both sides of the fast path were exercised


def _load(uri: str) -> Any:
    return load_schema(relative_path(uri))


def _distinct_parts() -> list[tuple[str, str, Any]]:
    """Each part of each file with an acceptor, a part met in several places (an inlined copy,
    a property named alike) checked once."""
    parts: dict[bytes, tuple[str, str, Any]] = {}
    for path in WITH_ACCEPTORS:
        for where, sub in subschemas(load_schema(rel(path))):
            if sub is not True and _compiles(sub, load_schema(rel(path))):
                parts.setdefault(orjson.dumps(_absolute(sub, schema_uri(rel(path)))), (rel(path), where, sub))
    return list(parts.values())


def _absolute(node: Any, base: str) -> Any:
    """`node` with each `$ref` made absolute: what a part means wherever it is written."""
    if isinstance(node, dict):
        return {k: urljoin(base, v) if k == "$ref" else _absolute(v, base) for k, v in node.items()}
    if isinstance(node, list):
        return [_absolute(item, base) for item in node]
    return node


def _compiles(schema: Any, root: Any) -> bool:
    """Whether a part has an acceptor: one only a `$ref` reaches (defs/event.json's `ts`, with its
    `format`) may have none, and is left to jsonschema wherever it is used."""
    try:
        compile_acceptor(schema, root, documents=_load)
    except Unsupported:
        return False
    return True


SUBSCHEMAS = _distinct_parts()


@pytest.mark.parametrize(
    ("relative", "where", "schema"), SUBSCHEMAS, ids=[f"{r}:{w}" for r, w, _ in SUBSCHEMAS]
)
def test_each_part_of_an_acceptor_agrees_with_jsonschema_at_its_edges(
    relative: str, where: str, schema: Any
) -> None:
    """Each property's and item's schema on its own, so every bound and every type confusion
    is met directly (inside a whole object most of them would hide behind another error)."""
    root = load_schema(relative)
    accept = compile_acceptor(schema, root, documents=_load)
    full = validator(relative).evolve(schema=schema)  # the part, its $refs resolved in its file

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(near(schema, base=schema_uri(relative)))
    def check(instance: Any) -> None:
        if accept(instance):
            assert full.is_valid(instance), f"{where}: accepted {instance!r}"

    check()


# RFC 3339's date-time, its letters in either case and a leap second allowed
RFC3339 = re.compile(
    r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])[Tt]([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?"
    r"([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)",
    re.ASCII,
)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(st.sampled_from(DATE_TIMES + NOT_DATE_TIMES), st.from_regex(RFC3339, fullmatch=True), st.text())
)
def test_the_date_time_acceptor_accepts_only_rfc3339_date_times(text: str) -> None:
    """`format: date-time` is checked by jsonschema only with rfc3339-validator installed: what the
    acceptor certifies must be a date-time either way."""
    accept = compile_acceptor({"type": "string", "format": "date-time"})
    if accept(text):
        assert RFC3339.fullmatch(text) and datetime.fromisoformat(text)


def test_a_rejected_instance_still_gets_jsonschemas_message_and_path() -> None:
    error = first_error("confer.input.json", {"question": "q", "providers": ["a", "a"]})

    assert error is not None
    assert "non-unique" in error.message
    assert list(error.absolute_path) == ["providers"]


def test_a_number_is_a_json_number_in_every_file_a_ref_leads_to() -> None:
    """jsonschema validates what a `$ref` names with the class its `$schema` names: the shared
    files must still refuse NaN and Infinity, as every schema here does."""
    usage = dict.fromkeys(load_schema("defs/usage.json")["required"], 0)
    event = {"ts": "2024-01-01T00:00:00Z", "event": "session_end", "session_id": "s", "tool": "confer"}
    event |= {"status": "ok", "duration_ms": 1, "usage": usage}
    assert validator("events/session_end.json").is_valid(event)
    for bad in (math.nan, math.inf, Decimal("1")):
        assert not validator("events/session_end.json").is_valid(
            {**event, "usage": {**usage, "cost_usd": bad}}
        )
        assert not validator("defs/usage.json").is_valid({**usage, "cost_usd": bad})


def test_the_review_role_is_known_wherever_a_degraded_reason_is() -> None:
    for name in ("confer.output.json", "coordinate.output.json"):
        reasons = dereferenced(name)["properties"]["degraded_reasons"]["items"]["properties"]["role"]["enum"]
        assert "reviewer" in reasons
