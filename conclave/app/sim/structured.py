"""What the simulated wires share for structured output (docs/providers.md#structured-output):
walking a JSON Schema, and the answer a simulated model gives when a request asks for one.

Each wire reads its own structured-output field and refuses what its service refuses (in its
module under `conclave/app/sim/kinds/`); the answer is the same everywhere. A scripted reply's
`value` is sent as it is; otherwise `synthesize` builds a deterministic object valid against the
schema. Its choices (an enum value, a number, a boolean) come from a digest of the model's name,
the question and the field's place in the schema: the same request always gets the same object,
and two members asked the same question may well disagree, as a panel should.

Only the keywords a portable answer schema uses are honoured (types, properties, required,
items and their counts, enum, const, anyOf/oneOf/allOf, local $ref, string lengths and formats,
numeric bounds and multipleOf); a `pattern` is not, so a string held to one may not match it.
Limits a wire's adapter moved into a `description` because its service refuses them (Anthropic's
"(minimum: 0, maximum: 1)") are honoured as a model reading them would.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from conclave.app.sim.scenarios import default_answer

Path = tuple[str, ...]

_SCHEMA_MAPS = ("properties", "$defs", "definitions")  # keywords holding named subschemas
_SCHEMA_ONES = ("items", "additionalProperties", "contains", "not", "if", "then", "else")
_SCHEMA_LISTS = ("items", "prefixItems", "anyOf", "oneOf", "allOf")
_MAX_DEPTH = 32  # $ref cycles and absurd nesting end here
_LIMITS = frozenset(
    {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength"}
    | {"minItems", "maxItems", "format"}
)
_DESCRIBED = re.compile(r"\(((?:\w+: [^,()]+)(?:, \w+: [^,()]+)*)\)\s*$")
_FORMATS: Mapping[str, str] = {
    "date-time": "2025-01-01T12:00:00Z",
    "date": "2025-01-01",
    "time": "12:00:00Z",
    "duration": "P1D",
    "email": "sim@example.com",
    "hostname": "example.com",
    "uri": "https://example.com/",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
}


def is_object(node: Mapping[str, Any]) -> bool:
    kind = node.get("type")
    return kind == "object" or (isinstance(kind, list) and "object" in kind) or "properties" in node


def walk(schema: Mapping[str, Any], path: Path = ()) -> Iterator[tuple[Path, Mapping[str, Any]]]:
    """Every schema inside `schema`, itself first, in document order, each with its place as
    OpenAI names a context: ('properties', 'verdict'), ('properties', 'items', 'items')."""
    yield path, schema
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, Mapping):
            for name, sub in value.items():
                if isinstance(sub, Mapping):
                    yield from walk(sub, (*path, key, str(name)))
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                if isinstance(sub, Mapping):
                    yield from walk(sub, (*path, key, str(i)))
        elif key in _SCHEMA_ONES and isinstance(value, Mapping):
            yield from walk(value, (*path, key))


def synthesize(schema: Mapping[str, Any], *, model: str, question: str) -> Any:
    """A value valid against `schema` (see the module), the same for the same model and question."""
    return _Synthesis(schema, model, question).value(schema, (), 0)


class _Synthesis:
    def __init__(self, root: Mapping[str, Any], model: str, question: str) -> None:
        self.root = root
        self.model = model
        self.question = question

    def pick(self, path: Path, n: int) -> int:
        """A deterministic choice among `n`, for this model, question and place in the schema."""
        seed = "\0".join((self.model, self.question, *path)).encode("utf-8")
        return int.from_bytes(hashlib.sha256(seed).digest()[:8], "big") % max(n, 1)

    def value(self, node: Any, path: Path, depth: int) -> Any:
        if not isinstance(node, Mapping) or depth > _MAX_DEPTH:
            return None  # `true` (anything goes), or a cycle cut short
        node = _with_described_limits(node)
        if isinstance(node.get("$ref"), str):
            return self.value(self.resolve(node["$ref"]), path, depth + 1)
        if "const" in node:
            return node["const"]
        if isinstance(node.get("enum"), list) and node["enum"]:
            return node["enum"][self.pick(path, len(node["enum"]))]
        for key in ("anyOf", "oneOf"):
            options = [o for o in node.get(key) or [] if isinstance(o, Mapping)]
            if options:
                chosen = next((o for o in options if o.get("type") != "null"), options[0])
                return self.value(_merged(node, key, chosen), path, depth + 1)
        if isinstance(node.get("allOf"), list):
            merged = dict(node)
            for part in merged.pop("allOf"):
                if isinstance(part, Mapping):
                    merged = _merged(merged, "", part)
            return self.value(merged, path, depth + 1)
        kind = _type(node)
        if kind == "object":
            return self.object(node, path, depth)
        if kind == "array":
            return self.array(node, path, depth)
        if kind == "integer":
            return self.integer(node, path)
        if kind == "number":
            return self.number(node, path)
        if kind == "boolean":
            return self.pick(path, 2) == 0
        if kind == "null":
            return None
        return self.string(node, path)

    def resolve(self, ref: str) -> Any:
        """A local reference (`#`, `#/$defs/x`, `#/definitions/x`); anything else resolves to nothing."""
        if not ref.startswith("#"):
            return None
        target: Any = self.root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            target = target.get(part) if isinstance(target, Mapping) else None
        return target

    def object(self, node: Mapping[str, Any], path: Path, depth: int) -> dict[str, Any]:
        properties = node.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        out = {
            str(name): self.value(sub, (*path, "properties", str(name)), depth + 1)
            for name, sub in properties.items()
        }
        extra = node.get("additionalProperties")
        required = node.get("required")
        for name in required if isinstance(required, list) else []:
            if name not in out:  # required but not described: whatever additionalProperties allows
                schema = extra if isinstance(extra, Mapping) else {}
                out[str(name)] = self.value(schema, (*path, str(name)), depth + 1)
        if not out and extra is not False:  # a bare object (JSON mode): say something in it
            out["answer"] = self.string({}, (*path, "answer"))
        return out

    def array(self, node: Mapping[str, Any], path: Path, depth: int) -> list[Any]:
        prefix = node.get("prefixItems")
        items = node.get("items")
        if isinstance(items, list):  # draft 4's tuple form
            prefix, items = items, node.get("additionalItems")
        prefix = [p for p in prefix if isinstance(p, Mapping)] if isinstance(prefix, list) else []
        low = _int(node.get("minItems"), 0)
        high = _int(node.get("maxItems"), max(low, 1, len(prefix)))
        count = min(max(low, 1, len(prefix)), high)
        choices = items.get("enum") if isinstance(items, Mapping) and not prefix else None
        if isinstance(choices, list) and len(choices) >= count:
            # as a model would: a list drawn from a set (a ranking of labels) repeats none of them
            return self.distinct(choices, count, path)
        out: list[Any] = []
        for i in range(count):
            schema = prefix[i] if i < len(prefix) else items if isinstance(items, Mapping) else {}
            out.append(self.value(schema, (*path, "items", str(i)), depth + 1))
        return out

    def distinct(self, choices: list[Any], count: int, path: Path) -> list[Any]:
        left = list(choices)
        return [left.pop(self.pick((*path, "items", str(i)), len(left))) for i in range(count)]

    def integer(self, node: Mapping[str, Any], path: Path) -> int:
        low, high = _bounds(node)
        first: int | None = None
        last: int | None = None
        if low is not None:
            first = math.floor(low) + 1 if node.get("exclusiveMinimum") is not None else math.ceil(low)
        if high is not None:
            last = math.ceil(high) - 1 if node.get("exclusiveMaximum") is not None else math.floor(high)
        if first is not None and last is not None and first <= last:
            value = first + self.pick(path, last - first + 1)
        elif first is not None:
            value = first
        elif last is not None:
            value = last
        else:
            value = 1 + self.pick(path, 5)
        step = node.get("multipleOf")
        if isinstance(step, int) and not isinstance(step, bool) and step > 0:
            value = math.ceil(value / step) * step
        return value

    def number(self, node: Mapping[str, Any], path: Path) -> float:
        low, high = _bounds(node)
        share = 0.5 + self.pick(path, 5) / 10  # 0.5 to 0.9: a plausible confidence
        if low is not None and high is not None:
            value = low + (high - low) * share
        elif low is not None:
            value = low + share
        elif high is not None:
            value = high - share
        else:
            value = share
        step = node.get("multipleOf")
        if isinstance(step, int | float) and not isinstance(step, bool) and step > 0:
            value = math.ceil(value / step) * step
            if high is not None and value > high:
                value -= step
        return round(value, 6)

    def string(self, node: Mapping[str, Any], path: Path) -> str:
        fmt = node.get("format")
        if fmt == "uuid":
            text = str(uuid.UUID(bytes=hashlib.sha256("\0".join((self.model, *path)).encode()).digest()[:16]))
        elif isinstance(fmt, str) and fmt in _FORMATS:
            text = _FORMATS[fmt]
        else:
            text = default_answer(self.model, "\0".join((self.question, *path)))
        low = _int(node.get("minLength"), 0)
        high = node.get("maxLength")
        if len(text) < low:
            text += "." * (low - len(text))
        if isinstance(high, int) and not isinstance(high, bool) and len(text) > high:
            text = text[:high]
        return text


def _with_described_limits(node: Mapping[str, Any]) -> Mapping[str, Any]:
    """`node` with the limits its description states as "(minimum: 0, maxItems: 3)", where it
    does not hold them itself."""
    description = node.get("description")
    match = _DESCRIBED.search(description) if isinstance(description, str) else None
    if match is None:
        return node
    limits: dict[str, Any] = {}
    for item in match.group(1).split(", "):
        key, _, raw = item.partition(": ")
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if key in _LIMITS and key not in node:
            limits[key] = value
    return {**node, **limits} if limits else node


def _type(node: Mapping[str, Any]) -> str:
    kind = node.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if isinstance(kind, str):
        return kind
    if is_object(node) or "additionalProperties" in node or "required" in node:
        return "object"
    if "items" in node or "prefixItems" in node:
        return "array"
    return "string"


def _merged(node: Mapping[str, Any], drop: str, part: Mapping[str, Any]) -> dict[str, Any]:
    """`node` (less its `drop` keyword) with `part`'s keywords, properties and required joined."""
    merged = {k: v for k, v in node.items() if k != drop}
    for key, value in part.items():
        if key == "properties" and isinstance(merged.get(key), Mapping) and isinstance(value, Mapping):
            merged[key] = {**merged[key], **value}
        elif key == "required" and isinstance(merged.get(key), list) and isinstance(value, list):
            merged[key] = [*merged[key], *(v for v in value if v not in merged[key])]
        else:
            merged[key] = value
    return merged


def _bounds(node: Mapping[str, Any]) -> tuple[float | None, float | None]:
    def number(key: str) -> float | None:
        value = node.get(key)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    low = number("exclusiveMinimum")
    low = number("minimum") if low is None else low
    high = number("exclusiveMaximum")
    high = number("maximum") if high is None else high
    return low, high


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default
