"""The structured answer a caller asks `confer` for: its JSON Schema, checked at the door.

A caller who wants a decision gives an `answer_schema`: a JSON Schema whose root is an object,
at most 16 KiB as compact JSON, written in the portable subset (PORTABLE_KEYWORDS): what the
providers' structured outputs take, Anthropic's after its adapter closes every object and moves
numeric and item-count bounds into descriptions (docs/providers.md#structured-output).
`check_answer_schema` refuses anything else with InvalidArguments (-32602 over MCP), naming
the keyword or the problem and the JSON path of the schema that holds it. The CLI's shorthands
build their schemas here (`choices_schema`, `number_schema`); each member's reply is checked
with `answer_errors`, whose short messages are what the member is shown when it is asked once
more.

`portable` cuts a wider schema (a role's envelope) down to the subset, for a provider to hold a
reply to it natively while the reply is still checked against the whole schema.

Beyond the keyword list, a checked schema is one every provider takes:
- one `type` per schema, a name, never a list (providers differ on union types);
- a keyword that applies to one type (`properties`, `required`, `additionalProperties` to
  object; `items`, `minItems`, `maxItems` to array; `minimum`, `maximum` to number and
  integer) only in a schema that declares that type;
- `additionalProperties` only as false;
- `enum` a non-empty list of distinct scalars of one JSON type, which the declared type admits;
- at most 5 levels of objects and arrays, and at most 100 properties in all.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any

import orjson

from conclave.core.errors import InvalidArguments
from conclave.schema.jsonshape import a_json_type, json_type, nests_deeper_than
from conclave.schema.schemas import clip_message, json_path

if TYPE_CHECKING:  # jsonschema itself is imported when a schema is compiled or meta-checked
    from jsonschema.protocols import Validator

MAX_ANSWER_SCHEMA_BYTES = 16 * 1024
MAX_DEPTH = 5  # levels of objects and arrays, the root object the first
MAX_PROPERTIES = 100  # in the whole schema
# As JSON, a schema within MAX_DEPTH nests about a dozen levels deep (an object level is two: the
# schema and its `properties`); one far deeper is refused before anything recurses into it.
_MAX_JSON_DEPTH = 64

# In the order the product spec lists them, which is the order the refusal names them in.
_PORTABLE_ORDER = (
    "type", "properties", "required", "enum", "items", "minimum", "maximum", "minItems",
    "maxItems", "description", "additionalProperties",
)  # fmt: skip
PORTABLE_KEYWORDS: frozenset[str] = frozenset(_PORTABLE_ORDER)

_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
# The keywords that apply to one kind of value, by the types that kind is declared as.
_KEYWORD_TYPES: dict[str, tuple[str, ...]] = {
    "properties": ("object",),
    "required": ("object",),
    "additionalProperties": ("object",),
    "items": ("array",),
    "minItems": ("array",),
    "maxItems": ("array",),
    "minimum": ("number", "integer"),
    "maximum": ("number", "integer"),
}


def check_answer_schema(schema: Any, *, path: str = "$.answer_schema", tool: str = "confer") -> None:
    """Raise InvalidArguments unless `schema` is an answer schema every provider accepts.

    The error's path is that of the schema (or the keyword's value) at fault, under `path`;
    its message names the keyword or the limit. The first problem found is the one reported.
    """
    if not isinstance(schema, dict):
        raise InvalidArguments(
            f"must be a JSON Schema object, not {a_json_type(schema)}", path=path, tool=tool
        )
    if nests_deeper_than(schema, _MAX_JSON_DEPTH):  # before anything recurses into it
        raise InvalidArguments(
            f"nests more than {_MAX_JSON_DEPTH} JSON levels deep; providers allow at most {MAX_DEPTH} levels "
            "of objects and arrays",
            path=path,
            tool=tool,
        )
    try:
        size = len(orjson.dumps(schema))
    except orjson.JSONEncodeError as exc:
        raise InvalidArguments(f"is not JSON: {exc}", path=path, tool=tool) from None
    if size > MAX_ANSWER_SCHEMA_BYTES:
        raise InvalidArguments(
            f"is {size} bytes as compact JSON, over the limit of {MAX_ANSWER_SCHEMA_BYTES} bytes (16 KiB)",
            path=path,
            tool=tool,
        )
    if schema.get("type") != "object":
        shown = "no type" if "type" not in schema else f"type {_show(schema['type'])}"
        raise InvalidArguments(
            f"the root must be a schema of type 'object', not one with {shown}", path=path, tool=tool
        )
    _Walk(tool).node(schema, path, 1)
    _meta_check(schema, path, tool)


class _Walk:
    """One pass over a schema, top-down, raising at the first problem."""

    def __init__(self, tool: str) -> None:
        self.tool = tool
        self.properties = 0

    def fail(self, message: str, path: str) -> InvalidArguments:
        return InvalidArguments(message, path=path, tool=self.tool)

    def node(self, schema: Any, path: str, level: int) -> None:
        """Check the schema at `path`, `level` the count of objects and arrays down to it, itself
        included if it is one."""
        if not isinstance(schema, dict):
            raise self.fail(f"must be a schema (a JSON object), not {a_json_type(schema)}", path)
        for keyword in schema:
            if keyword not in PORTABLE_KEYWORDS:
                raise self.fail(
                    f"keyword {keyword!r} is not in the portable subset ({', '.join(_PORTABLE_ORDER)})",
                    path,
                )
        declared = self.type_of(schema, path)
        for keyword, types in _KEYWORD_TYPES.items():
            if keyword in schema and declared not in types:
                wanted = " or ".join(types)
                if declared is None:
                    raise self.fail(f"keyword {keyword!r} needs the schema to declare type {wanted}", path)
                raise self.fail(f"keyword {keyword!r} applies to type {wanted}, not {declared!r}", path)
        if "description" in schema and not isinstance(schema["description"], str):
            raise self.fail(
                f"must be a string, not {a_json_type(schema['description'])}", f"{path}.description"
            )
        if "enum" in schema:
            self.enum(schema["enum"], declared, f"{path}.enum")
        self.bounds(schema, path, ("minimum", "maximum"), _is_number, "a number")
        self.bounds(schema, path, ("minItems", "maxItems"), _is_count, "a non-negative integer")
        if "additionalProperties" in schema and schema["additionalProperties"] is not False:
            raise self.fail(
                "must be false, the only form every provider accepts, not "
                + _show(schema["additionalProperties"]),
                f"{path}.additionalProperties",
            )
        if declared in ("object", "array"):
            if level > MAX_DEPTH:
                raise self.fail(
                    f"nests objects and arrays {level} levels deep; providers allow at most {MAX_DEPTH}",
                    path,
                )
            level += 1
        if "properties" in schema:
            self.object(schema, path, level)
        elif "required" in schema:
            self.required(schema["required"], {}, f"{path}.required")
        if "items" in schema:
            items = schema["items"]
            if isinstance(items, list):
                raise self.fail(
                    "must be one schema (a JSON object): a list of schemas is not in the portable subset",
                    f"{path}.items",
                )
            self.node(items, f"{path}.items", level)

    def type_of(self, schema: dict[str, Any], path: str) -> str | None:
        if "type" not in schema:
            return None
        declared = schema["type"]
        if isinstance(declared, list):
            raise self.fail(
                "must be one type name: a list of types is not in the portable subset", f"{path}.type"
            )
        if declared not in _TYPES:
            raise self.fail(f"must be one of {', '.join(_TYPES)}, not {_show(declared)}", f"{path}.type")
        return str(declared)

    def object(self, schema: dict[str, Any], path: str, level: int) -> None:
        properties = schema["properties"]
        where = f"{path}.properties"
        if not isinstance(properties, dict):
            raise self.fail(f"must be an object of schemas, not {a_json_type(properties)}", where)
        if "required" in schema:
            self.required(schema["required"], properties, f"{path}.required")
        for name, subschema in properties.items():
            self.properties += 1
            if self.properties > MAX_PROPERTIES:
                raise self.fail(
                    f"is property {self.properties} of the schema; providers allow at most "
                    f"{MAX_PROPERTIES} in all",
                    f"{where}.{name}",
                )
            self.node(subschema, f"{where}.{name}", level)

    def required(self, required: Any, properties: Mapping[str, Any], path: str) -> None:
        if not isinstance(required, list):
            raise self.fail(f"must be a list of property names, not {a_json_type(required)}", path)
        seen: set[str] = set()
        for index, name in enumerate(required):
            where = f"{path}[{index}]"
            if not isinstance(name, str):
                raise self.fail(f"must be a property name (a string), not {a_json_type(name)}", where)
            if name in seen:
                raise self.fail(f"{name!r} is listed twice", where)
            seen.add(name)
            if name not in properties:
                names = [repr(key) for key in properties]
                declared = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
                raise self.fail(
                    f"{name!r} is not a declared property (declared: {declared or 'none'})", where
                )

    def enum(self, values: Any, declared: str | None, path: str) -> None:
        if not isinstance(values, list) or not values:
            shown = "an empty list" if values == [] else a_json_type(values)
            raise self.fail(
                f"must be a non-empty list of strings, numbers, booleans or null, not {shown}", path
            )
        first = json_type(values[0])
        seen: list[Any] = []
        for index, value in enumerate(values):
            where = f"{path}[{index}]"
            kind = json_type(value)
            if kind not in ("string", "number", "boolean", "null"):
                raise self.fail(f"must be a string, number, boolean or null, not {a_json_type(value)}", where)
            if kind != first:
                raise self.fail(
                    f"is {a_json_type(value)}, but the first value is {a_json_type(values[0])}: "
                    "the values must all be of one type",
                    where,
                )
            if kind == "number" and not math.isfinite(value):
                raise self.fail(f"must be a finite number, not {value!r}", where)
            if declared is not None and not _admits(declared, value):
                raise self.fail(f"{_show(value)} is not of the schema's type {declared!r}", where)
            if value in seen:  # one JSON type throughout, so == is JSON equality here
                raise self.fail(f"{_show(value)} is listed twice", where)
            seen.append(value)

    def bounds(
        self, schema: dict[str, Any], path: str, pair: tuple[str, str], ok: Callable[[Any], bool], what: str
    ) -> None:
        low, high = pair
        for keyword in pair:
            if keyword in schema and not ok(schema[keyword]):
                raise self.fail(f"must be {what}, not {_show(schema[keyword])}", f"{path}.{keyword}")
        if low in schema and high in schema and schema[low] > schema[high]:
            raise self.fail(f"is greater than {high} ({schema[low]} > {schema[high]})", f"{path}.{low}")


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _is_count(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 0


def _admits(declared: str, value: Any) -> bool:
    """Whether a value of the JSON type `declared` can be `value` (a scalar)."""
    kind = json_type(value)
    if declared == "integer":
        return kind == "number" and (isinstance(value, int) or float(value).is_integer())
    return declared == kind


def _show(value: Any) -> str:
    """A value as a message quotes it: JSON, cut short when long."""
    try:
        text = orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        text = a_json_type(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _meta_check(schema: dict[str, Any], path: str, tool: str) -> None:
    """Draft 2020-12's own rules, as a last guard: what passes the walk above always keeps them."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:  # pragma: no cover - the walk refuses everything this would
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in exc.absolute_path)
        raise InvalidArguments(
            f"is not a valid JSON Schema: {clip_message(exc.message)}", path=path + where, tool=tool
        ) from None


# ------------------------------------------------------------------ what strict mode takes


def portable(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """`schema` cut down to the portable subset, for a provider to hold a reply to natively
    (a role's envelope): the keywords outside it are dropped, and the reply is still checked
    against the whole schema. None when dropping them would change which objects fit rather
    than only loosen a bound: an object used as a map (`additionalProperties` a schema, or
    `propertyNames`), or a list of types."""
    if "propertyNames" in schema or isinstance(schema.get("additionalProperties"), Mapping):
        return None
    if isinstance(schema.get("type"), list):
        return None
    out: dict[str, Any] = {}
    for keyword, value in schema.items():
        if keyword not in PORTABLE_KEYWORDS or (keyword == "additionalProperties" and value is not False):
            continue
        if keyword == "properties":
            kept = {name: portable(sub) for name, sub in value.items()}
            if any(sub is None for sub in kept.values()):
                return None
            out[keyword] = kept
        elif keyword == "items":
            item = portable(value) if isinstance(value, Mapping) else None
            if item is None:
                return None
            out[keyword] = item
        else:
            out[keyword] = value
    return out


def strict_compatible(schema: Mapping[str, Any]) -> bool:
    """Whether OpenAI's strict `json_schema` mode accepts `schema` (a checked answer schema) as it
    is: every object schema, the root and each nested one, has `additionalProperties: false`
    and lists all its properties in `required`."""
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, Mapping):
            return False
        properties = node.get("properties", {})
        if not isinstance(properties, Mapping):
            return False
        if node.get("type") == "object" or "properties" in node:
            required = node.get("required", [])
            if node.get("additionalProperties") is not False or not isinstance(required, list):
                return False
            if not set(properties) <= set(required):
                return False
        stack.extend(properties.values())
        if "items" in node:
            stack.append(node["items"])
    return True


# ------------------------------------------------------------------ the CLI's shorthands


def choices_schema(choices: Sequence[str]) -> dict[str, Any]:
    """`--choices "A,B,C"`: an object with `choice`, one of `choices` (each stripped), and a
    `reason`. ValueError for fewer than two choices, a blank one, or one given twice."""
    if isinstance(choices, str):
        raise ValueError('choices must be a list of strings, not one string (split "A,B,C" at the commas)')
    stripped: list[str] = []
    for index, choice in enumerate(choices, 1):
        if not isinstance(choice, str):
            raise ValueError(f"choice {index} must be a string, not {a_json_type(choice)}")
        text = choice.strip()
        if not text:
            raise ValueError(f"choice {index} is blank")
        if text in stripped:
            raise ValueError(f"choice {text!r} is given twice")
        stripped.append(text)
    if len(stripped) < 2:
        raise ValueError(f"give at least 2 choices, not {len(stripped)}")
    return {
        "type": "object",
        "properties": {
            "choice": {"type": "string", "enum": stripped, "description": "The option chosen."},
            "reason": {"type": "string", "description": "Why this option: the deciding reasons, briefly."},
        },
        "required": ["choice", "reason"],
        "additionalProperties": False,
    }


def number_schema() -> dict[str, Any]:
    """`--number`: an object with the `value` asked for and a `reason`."""
    return {
        "type": "object",
        "properties": {
            "value": {"type": "number", "description": "The number asked for."},
            "reason": {"type": "string", "description": "How the number was reached, briefly."},
        },
        "required": ["value", "reason"],
        "additionalProperties": False,
    }


# ------------------------------------------------------------------ a reply checked


def answer_errors(schema: Mapping[str, Any], value: Any, *, limit: int = 5) -> list[str]:
    """Why `value` does not fit `schema` (a checked answer schema): [] when it does, else at most
    `limit` messages such as "$.choice: 'D' is not one of ['A', 'B', 'C']", the shallowest
    first, each short enough to show a model when it is asked again."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    validator = _compile(orjson.dumps(dict(schema), option=orjson.OPT_SORT_KEYS))
    try:
        errors = sorted(validator.iter_errors(value), key=lambda error: len(error.absolute_path))
    except RecursionError:
        return ["$: the value nests too deeply to check; give a flatter answer"]
    return [f"{json_path(error)}: {clip_message(error.message)}" for error in errors[:limit]]


@lru_cache(maxsize=32)
def _compile(key: bytes) -> Validator:
    """The validator of the schema whose sorted-key JSON is `key`, compiled once per schema."""
    return _validator_class()(orjson.loads(key))


@cache
def _validator_class() -> type[Validator]:
    """Draft 2020-12 whose `number` is a JSON number: NaN and infinities are none, though they
    would pass every `minimum` and `maximum`."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine("number", lambda _checker, value: _is_number(value))
    cls: type[Validator] = jsonschema.validators.extend(base, type_checker=checker)  # type: ignore[no-untyped-call]
    return cls
