"""JSON Schemas from `schemas/`, the single source of truth, compiled once.

A missing or invalid schema fails at first load with the file named, never at a request.
The installed wheel carries the schemas under `conclave/_data/schemas`; a source checkout
reads them from the repository's top-level `schemas/`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import orjson
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
    try:
        errors = list(validator(relative).iter_errors(instance))
    except RecursionError:
        return _too_deep(instance)
    if not errors:
        return None
    best: jsonschema.ValidationError = jsonschema.exceptions.best_match(errors)
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
    return jsonschema.ValidationError(
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


def check_arguments(relative: str, instance: Any, *, tool: str = "") -> None:
    """Raise InvalidArguments (validator message + failing JSON path) unless `instance` is valid."""
    from conclave.errors import InvalidArguments

    error = first_error(relative, instance)
    if error is not None:
        raise InvalidArguments(error.message, path=json_path(error), tool=tool)
