"""JSON Schemas from `schemas/`, the single source of truth, compiled once.

A missing or invalid schema fails at first load with the file named, never at a request.
The installed wheel carries the schemas under `conclave/_data/schemas`; a source checkout
reads them from the repository's top-level `schemas/`.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:  # jsonschema itself is imported where an instance needs it (see acceptor)
    import jsonschema
    from jsonschema.protocols import Validator

_PACKAGE_DIR = Path(__file__).resolve().parent


def data_path(name: str) -> Path:
    """Locate a shipped data file (`schemas`, `config.yaml`) in a wheel or a checkout."""
    for candidate in (_PACKAGE_DIR / "_data" / name, _PACKAGE_DIR.parent / name):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"conclave data file {name!r} is missing from the installation")


def schema_dir() -> Path:
    return data_path("schemas")


@cache
def load_schema(relative: str) -> dict[str, Any]:
    path = schema_dir() / relative
    try:
        schema: dict[str, Any] = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise RuntimeError(f"schema {path} cannot be loaded: {exc}") from exc
    # Meta-validating every schema cost ~0.5 s of `conclave serve` start-up; the test suite
    # checks each file in schemas/ against its metaschema instead (tests/test_schemas.py).
    return schema


def _is_json_number(_checker: Any, value: Any) -> bool:
    """JSON has no NaN or Infinity: from Python or YAML (`.nan`) they would pass every `minimum`
    and `maximum` (each comparison is false) and reach a deadline or a cost cap."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return not isinstance(value, float) or math.isfinite(value)


@cache
def validator(relative: str) -> Validator:
    """A compiled validator for `schemas/<relative>`, built once per process."""
    import jsonschema

    schema = load_schema(relative)
    base = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    checker = base.TYPE_CHECKER.redefine("number", _is_json_number)
    cls: type[Validator] = jsonschema.validators.extend(base, type_checker=checker)  # type: ignore[no-untyped-call]
    return cls(schema, format_checker=jsonschema.FormatChecker())


def json_path(error: jsonschema.ValidationError) -> str:
    """`$.providers.openai.kind` style path of the failing element."""
    parts = ["$"]
    for part in error.absolute_path:
        parts.append(f"[{part}]" if isinstance(part, int) else f".{part}")
    return "".join(parts)


# A validator message quotes the failing value whole: a 10 MB string would come back 10 MB long in
# the error, the event log and the terminal. Longer messages keep their head and tail.
MAX_MESSAGE_CHARS = 400
_KEPT_HEAD, _KEPT_TAIL = 240, 120
_PATH_PARTS_SHOWN = 3  # of a value nested too deeply to validate: enough to name the argument


def first_error(relative: str, instance: Any) -> jsonschema.ValidationError | None:
    """The most relevant validation error, or None when the instance is valid.

    Its message is at most about MAX_MESSAGE_CHARS long (the middle of a long quoted value is cut,
    so the verdict at the end stays readable). A value nested deeper than the validator can recurse
    is an error too, at the path of the argument that holds it, never a RecursionError.
    """
    accept = acceptor(relative)
    if accept is not None and accept(instance):
        return None
    try:
        errors = list(validator(relative).iter_errors(instance))
    except RecursionError:
        return _too_deep(instance)
    if not errors:
        return None
    from jsonschema.exceptions import best_match

    best: jsonschema.ValidationError = best_match(errors)
    best.message = clip_message(best.message)
    return best


def clip_message(message: str) -> str:
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    cut = len(message) - _KEPT_HEAD - _KEPT_TAIL
    return f"{message[:_KEPT_HEAD]}… [{cut} characters cut] …{message[-_KEPT_TAIL:]}"


def _too_deep(instance: Any) -> jsonschema.ValidationError:
    """The error for a value too deep to validate (or even to quote), at the argument that holds
    it: the path of its deepest point, cut after the last object key among its first parts.
    Iterative, since recursion is what failed."""
    nodes: list[tuple[Any, int]] = [(None, -1)]  # (key or index, parent node), node 0 is the root
    deepest, deepest_depth = 0, 0
    seen: set[int] = set()  # containers already walked: a shared or cyclic value is walked once
    stack: list[tuple[Any, int, int]] = [(instance, 0, 0)]  # (value, node, depth)
    while stack:
        value, node, depth = stack.pop()
        if isinstance(value, dict | list | tuple):
            if id(value) in seen:
                continue
            seen.add(id(value))
        if depth > deepest_depth:
            deepest, deepest_depth = node, depth
        for key, child in _children(value):
            nodes.append((key, node))
            stack.append((child, len(nodes) - 1, depth + 1))
    path: list[Any] = []
    while deepest != 0:
        key, deepest = nodes[deepest]
        path.append(key)
    path.reverse()
    keys = [i + 1 for i, part in enumerate(path[:_PATH_PARTS_SHOWN]) if isinstance(part, str)]
    shown = path[: keys[-1] if keys else 0]
    from jsonschema import ValidationError

    return ValidationError(
        f"value nested too deeply to validate ({len(path) - len(shown)} levels below this point); flatten it",
        path=shown,
        validator="nesting",
    )


def _children(value: Any) -> Iterable[tuple[Any, Any]]:
    if isinstance(value, dict):
        return value.items()
    if isinstance(value, list | tuple):
        return enumerate(value)
    return ()


# --------------------------------------------------------------------------- fast acceptance
#
# jsonschema spends ~70 us on a two-key confer argument object: most of it walking keywords
# generically. Schemas built only from the simple keywords below also get a checker compiled
# from the same file, which can only say "certainly valid": anything it is unsure of (a
# subclass, a non-finite float, a uniqueItems list of non-strings) and every invalid instance
# go to jsonschema, which alone decides rejections and writes every message. A schema using
# any other keyword (`if`, `allOf`, `format`, a remote `$ref`, ...) has no acceptor at all.
# So a process that only sees valid input never imports jsonschema (~2.6 MB resident).
# tests/test_schemas.py holds every acceptor to jsonschema's verdicts on generated instances.

Accept = Callable[[Any], bool]
_ANNOTATIONS = frozenset(
    {"$schema", "$id", "$comment", "$defs", "title", "description", "default", "examples"}
)
_LOCAL_REF = "#/$defs/"


class _Unsupported(Exception):
    """A keyword the acceptor does not handle: the schema is left to jsonschema."""


@cache
def acceptor(relative: str) -> Accept | None:
    """A compiled "certainly valid" check for `schemas/<relative>`, or None if it has none."""
    try:
        return compile_acceptor(load_schema(relative))
    except _Unsupported:
        return None


def compile_acceptor(schema: Any, root: Any = None) -> Accept:
    """The acceptor of a schema, or of a part of `root` (whose `$defs` its `$ref`s name);
    `_Unsupported` if it uses a keyword not handled here."""
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
            raise _Unsupported(repr(schema))
        checks: list[Accept] = []
        for keyword, value in schema.items():
            if keyword in _ANNOTATIONS:
                continue
            make = _KEYWORDS.get(keyword)
            if make is None:
                raise _Unsupported(keyword)
            check = make(self, value, schema)
            if check is not None:
                checks.append(check)
        return _all_of(tuple(checks))

    def ref(self, ref: Any) -> Accept:
        name = ref[len(_LOCAL_REF) :] if isinstance(ref, str) and ref.startswith(_LOCAL_REF) else ""
        target = self._root.get("$defs", {}).get(name) if isinstance(self._root, dict) else None
        if not name or "/" in name or "~" in name or target is None or ref in self._open:
            raise _Unsupported(f"$ref {ref!r}")
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
        raise _Unsupported(f"type {names!r}") from exc
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


def check_arguments(relative: str, instance: Any, *, tool: str = "") -> None:
    """Raise InvalidArguments (validator message + failing JSON path) unless `instance` is valid."""
    from conclave.errors import InvalidArguments

    error = first_error(relative, instance)
    if error is not None:
        raise InvalidArguments(error.message, path=json_path(error), tool=tool)
