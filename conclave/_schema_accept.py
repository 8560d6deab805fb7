"""Fast acceptance: a "certainly valid" check compiled from a JSON Schema built only of simple keywords.

jsonschema walks keywords generically, which is slow for the small argument objects every call
brings. An acceptor can only say "certainly valid": anything it is unsure of (a subclass, a
non-finite float, a uniqueItems list of non-strings) and every invalid instance go to jsonschema,
which alone decides rejections and writes every message. A schema using any other keyword (`if`,
`allOf`, `format`, a remote `$ref`, ...) has no acceptor at all, so a process that only sees valid
input never imports jsonschema. tests/test_schemas.py holds every acceptor to jsonschema's
verdicts on generated instances.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable
from typing import Any

Accept = Callable[[Any], bool]
_ANNOTATIONS = frozenset(
    {"$schema", "$id", "$comment", "$defs", "title", "description", "default", "examples"}
)
_LOCAL_REF = "#/$defs/"


class Unsupported(Exception):
    """A keyword the acceptor does not handle: the schema is left to jsonschema."""


def compile_acceptor(schema: Any, root: Any = None) -> Accept:
    """The acceptor of a schema, or of a part of `root` (whose `$defs` its `$ref`s name);
    `Unsupported` if it uses a keyword not handled here."""
    return _Compiler(schema if root is None else root).compile(schema)


class _Compiler:
    def __init__(self, root: Any) -> None:
        self._root = root
        self._refs: dict[str, Accept] = {}
        self._open: set[str] = set()  # refs being compiled: a recursive one is unsupported

    def compile(self, schema: Any) -> Accept:
        if schema is True:
            return _always
        if not isinstance(schema, dict):
            raise Unsupported(repr(schema))
        checks: list[Accept] = []
        for keyword, value in schema.items():
            if keyword in _ANNOTATIONS:
                continue
            make = _KEYWORDS.get(keyword)
            if make is None:
                raise Unsupported(keyword)
            check = make(self, value, schema)
            if check is not None:
                checks.append(check)
        return _all_of(tuple(checks))

    def ref(self, ref: Any) -> Accept:
        name = ref[len(_LOCAL_REF) :] if isinstance(ref, str) and ref.startswith(_LOCAL_REF) else ""
        target = self._root.get("$defs", {}).get(name) if isinstance(self._root, dict) else None
        if not name or "/" in name or "~" in name or target is None or ref in self._open:
            raise Unsupported(f"$ref {ref!r}")
        if ref not in self._refs:
            self._open.add(ref)
            self._refs[ref] = self.compile(target)
            self._open.discard(ref)
        return self._refs[ref]


def _always(_instance: Any) -> bool:
    return True


def _all_of(checks: tuple[Accept, ...]) -> Accept:
    if not checks:
        return _always
    if len(checks) == 1:
        return checks[0]

    def accept(instance: Any) -> bool:
        for check in checks:  # noqa: SIM110 -- no generator object per check
            if not check(instance):
                return False
        return True

    return accept


def _is_number(value: Any) -> bool:
    kind = type(value)
    return kind is int or (kind is float and math.isfinite(value))


_TYPES: dict[str, Accept] = {
    "string": lambda value: type(value) is str,
    "integer": lambda value: type(value) is int,
    "number": _is_number,
    "boolean": lambda value: value is True or value is False,
    "array": lambda value: type(value) is list,
    "object": lambda value: type(value) is dict,
    "null": lambda value: value is None,
}


def _type(_c: _Compiler, names: Any, _schema: Any) -> Accept:
    try:
        tests = tuple(_TYPES[name] for name in ([names] if isinstance(names, str) else names))
    except (KeyError, TypeError) as exc:
        raise Unsupported(f"type {names!r}") from exc
    if len(tests) == 1:
        return tests[0]
    return lambda value: any(test(value) for test in tests)


# Each rule applies to one JSON type only, as in jsonschema; a value of another type passes it,
# and a subclass of the type (which jsonschema would check) is left to jsonschema.
def _on_strings(rule: Accept) -> Accept:
    return lambda value: rule(value) if type(value) is str else not isinstance(value, str)


def _on_numbers(rule: Accept) -> Accept:
    def accept(value: Any) -> bool:
        if _is_number(value):
            return rule(value)
        return type(value) is bool or not isinstance(value, int | float | numbers.Number)

    return accept


def _on_arrays(rule: Accept) -> Accept:
    return lambda value: rule(value) if type(value) is list else not isinstance(value, list)


def _on_objects(rule: Accept) -> Accept:
    return lambda value: rule(value) if type(value) is dict else not isinstance(value, dict)


def _unique_strings(values: list[Any]) -> bool:
    for value in values:
        if type(value) is not str:
            return False  # jsonschema's equality rules (1 vs 1.0 vs True): its call
    return len(set(values)) == len(values)


def _items(c: _Compiler, items: Any, _schema: Any) -> Accept | None:
    each = c.compile(items)
    if each is _always:
        return None

    def rule(values: list[Any]) -> bool:
        for value in values:  # noqa: SIM110 -- no generator object per item
            if not each(value):
                return False
        return True

    return _on_arrays(rule)


def _properties(c: _Compiler, properties: Any, _schema: Any) -> Accept:
    compiled = tuple((name, c.compile(sub)) for name, sub in properties.items())

    def rule(value: dict[str, Any]) -> bool:
        for name, accept in compiled:  # noqa: SIM110 -- no generator object per member
            if name in value and not accept(value[name]):
                return False
        return True

    return _on_objects(rule)


def _additional_properties(c: _Compiler, allowed: Any, schema: Any) -> Accept | None:
    if allowed is True:
        return None
    known = frozenset(schema.get("properties", ()))  # patternProperties is unsupported
    if allowed is False:
        return _on_objects(lambda value: known.issuperset(value))
    each = c.compile(allowed)

    def rule(value: dict[str, Any]) -> bool:
        for name, member in value.items():  # noqa: SIM110 -- no generator object per member
            if name not in known and not each(member):
                return False
        return True

    return _on_objects(rule)


def _required(_c: _Compiler, names: Any, _schema: Any) -> Accept:
    wanted = frozenset(names)
    return _on_objects(lambda value: value.keys() >= wanted)


def _pattern(_c: _Compiler, pattern: Any, _schema: Any) -> Accept:
    search = re.compile(pattern).search  # jsonschema uses re.search, unanchored
    return _on_strings(lambda value: search(value) is not None)


def _unique_items(_c: _Compiler, unique: Any, _schema: Any) -> Accept | None:
    return _on_arrays(_unique_strings) if unique else None


_ENUM_TYPES = (str, int, float, bool, type(None))


def _enum(_c: _Compiler, options: Any, _schema: Any) -> Accept:
    """Only a member of exactly an option's type: jsonschema's own equality (1 == 1.0, but
    1 != True) decides anything else."""
    allowed = tuple((type(option), option) for option in options if type(option) in _ENUM_TYPES)

    def accept(value: Any) -> bool:
        kind = type(value)
        for option_kind, option in allowed:  # noqa: SIM110 -- no generator object per value
            if kind is option_kind and value == option:
                return True
        return False

    return accept


def _bound(applies: Callable[[Accept], Accept], test: Callable[[Any, Any], bool]) -> Any:
    return lambda _c, limit, _s: applies(lambda value: test(value, limit))


_KEYWORDS: dict[str, Callable[[_Compiler, Any, Any], Accept | None]] = {
    "$ref": lambda c, ref, _schema: c.ref(ref),
    "type": _type,
    "enum": _enum,
    "properties": _properties,
    "additionalProperties": _additional_properties,
    "required": _required,
    "items": _items,
    "pattern": _pattern,
    "uniqueItems": _unique_items,
    "minLength": _bound(_on_strings, lambda value, n: len(value) >= n),
    "maxLength": _bound(_on_strings, lambda value, n: len(value) <= n),
    "minItems": _bound(_on_arrays, lambda value, n: len(value) >= n),
    "maxItems": _bound(_on_arrays, lambda value, n: len(value) <= n),
    "minimum": _bound(_on_numbers, lambda value, n: value >= n),
    "maximum": _bound(_on_numbers, lambda value, n: value <= n),
    "exclusiveMinimum": _bound(_on_numbers, lambda value, n: value > n),
    "exclusiveMaximum": _bound(_on_numbers, lambda value, n: value < n),
}
