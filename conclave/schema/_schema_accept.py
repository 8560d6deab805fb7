"""Fast acceptance: a "certainly valid" check compiled from a JSON Schema built only of simple keywords.

jsonschema walks keywords generically, which is slow for the small argument objects every call
brings. An acceptor can only say "certainly valid": anything it is unsure of (a subclass, a
non-finite float, a uniqueItems list of non-strings) and every invalid instance go to jsonschema,
which alone decides rejections and writes every message. A schema using any other keyword (`if`,
`oneOf`, a `format` other than date-time, a recursive `$ref`, ...) has no acceptor at all, so a
process that only sees valid input never imports jsonschema. A `$ref` is resolved once, when the
acceptor is compiled: into the schema's own document, or (given `documents`) into another file
of `schemas/` named relative to the schema's `$id`. tests/test_schemas.py holds every acceptor
to jsonschema's verdicts on generated instances.
"""

from __future__ import annotations

import datetime
import math
import numbers
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin

Accept = Callable[[Any], bool]
Documents = Callable[[str], Any]  # a document's URI (no fragment) -> the schema document there
_ANNOTATIONS = frozenset(
    {"$schema", "$id", "$comment", "$defs", "title", "description", "default", "examples"}
)


class Unsupported(Exception):
    """A keyword the acceptor does not handle: the schema is left to jsonschema."""


def compile_acceptor(schema: Any, root: Any = None, *, documents: Documents | None = None) -> Accept:
    """The acceptor of a schema, or of a part of `root` (the document its `$ref`s resolve in,
    against the root's `$id`); `documents` loads the other documents a `$ref` may name.
    `Unsupported` if it uses a keyword not handled here, or a `$ref` it cannot resolve."""
    document = schema if root is None else root
    base = document.get("$id", "") if isinstance(document, dict) else ""
    return _Compiler(document, base if isinstance(base, str) else "", documents, {}, set()).compile(schema)


class _Compiler:
    """Compiles the parts of one document; a `$ref` into another hands over to a compiler of that
    document, sharing what every compiler of this acceptor has compiled."""

    def __init__(
        self, root: Any, base: str, documents: Documents | None, refs: dict[str, Accept], open_: set[str]
    ) -> None:
        self._root = root
        self._base = base
        self._documents = documents
        self._refs = refs  # absolute URI -> its acceptor
        self._open = open_  # refs being compiled: a recursive one is unsupported

    def compile(self, schema: Any) -> Accept:
        if schema is True:
            return _always
        if not isinstance(schema, dict):
            raise Unsupported(repr(schema))
        if "$id" in schema and schema is not self._root:
            raise Unsupported("$id below a document's root")  # it would move the base of its $refs
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
        if not isinstance(ref, str):
            raise Unsupported(f"$ref {ref!r}")
        uri = urljoin(self._base, ref) if self._base else ref
        if uri in self._refs:
            return self._refs[uri]
        if uri in self._open:
            raise Unsupported(f"recursive $ref {ref!r}")
        address, fragment = urldefrag(uri)
        compiler = self if address == urldefrag(self._base)[0] else self._other(address, ref)
        target = _pointer(compiler._root, fragment, ref)
        self._open.add(uri)
        try:
            self._refs[uri] = compiler.compile(target)
        finally:
            self._open.discard(uri)
        return self._refs[uri]

    def _other(self, address: str, ref: str) -> _Compiler:
        if self._documents is None or not address:
            raise Unsupported(f"$ref {ref!r} names another document")
        try:
            document = self._documents(address)
        except LookupError as exc:
            raise Unsupported(f"$ref {ref!r}: {exc}") from exc
        return _Compiler(document, address, self._documents, self._refs, self._open)


def _pointer(document: Any, fragment: str, ref: str) -> Any:
    """The part of `document` a JSON Pointer fragment (`/$defs/usage`, or empty: the whole) names."""
    if fragment and not fragment.startswith("/"):
        raise Unsupported(f"$ref {ref!r}: only JSON Pointer fragments are resolved")  # no $anchor
    node = document
    for raw in fragment.split("/")[1:] if fragment else ():
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise Unsupported(f"$ref {ref!r} does not resolve")
    return node


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


def _const(_c: _Compiler, value: Any, schema: Any) -> Accept:
    return _enum(_c, [value], schema)


def _any_of(c: _Compiler, branches: Any, _schema: Any) -> Accept:
    """Certainly valid when one branch certainly accepts: sound, though jsonschema may accept
    through a branch the acceptor is unsure of (then it decides)."""
    if not isinstance(branches, list) or not branches:
        raise Unsupported("anyOf")
    accepts = tuple(c.compile(branch) for branch in branches)

    def accept(value: Any) -> bool:
        for branch in accepts:  # noqa: SIM110 -- no generator object per branch
            if branch(value):
                return True
        return False

    return accept


def _all_branches(c: _Compiler, branches: Any, _schema: Any) -> Accept:
    if not isinstance(branches, list) or not branches:
        raise Unsupported("allOf")
    return _all_of(tuple(c.compile(branch) for branch in branches))


# RFC 3339 date-times of the strictest spelling (upper-case T and Z, no leap second): valid
# whether or not jsonschema checks the format (it does with rfc3339-validator installed).
_DATE_TIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d+)?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)",
    re.ASCII,  # \d: 0-9 only
)


def _is_date_time(value: str) -> bool:
    match = _DATE_TIME.fullmatch(value)
    if match is None:
        return False
    try:
        datetime.date(int(match[1]), int(match[2]), int(match[3]))
    except ValueError:
        return False
    return True


def _format(_c: _Compiler, name: Any, _schema: Any) -> Accept:
    """Only `date-time` (the events' `ts`); another format is left to jsonschema."""
    if name != "date-time":
        raise Unsupported(f"format {name!r}")
    return _on_strings(_is_date_time)


def _bound(applies: Callable[[Accept], Accept], test: Callable[[Any, Any], bool]) -> Any:
    return lambda _c, limit, _s: applies(lambda value: test(value, limit))


_KEYWORDS: dict[str, Callable[[_Compiler, Any, Any], Accept | None]] = {
    "$ref": lambda c, ref, _schema: c.ref(ref),
    "type": _type,
    "enum": _enum,
    "const": _const,
    "anyOf": _any_of,
    "allOf": _all_branches,
    "properties": _properties,
    "additionalProperties": _additional_properties,
    "required": _required,
    "items": _items,
    "pattern": _pattern,
    "format": _format,
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
