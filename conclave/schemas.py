"""JSON Schemas from `schemas/`, the single source of truth, compiled once.

A missing or invalid schema fails at first load with the file named, never at a request.
The installed wheel carries the schemas under `conclave/_data/schemas`; a source checkout
reads them from the repository's top-level `schemas/`.
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from conclave._schema_accept import Accept, Unsupported, compile_acceptor
from conclave.jsonshape import deepest_path

if TYPE_CHECKING:  # jsonschema itself is imported only for an instance the acceptor cannot accept
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
    # Not meta-validated here, which would slow start-up: tests/test_schemas.py checks each file.
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


# A validator message quotes the failing value whole: a huge string would come back whole in the
# error, the event log and the terminal. Longer messages keep their head and tail.
MAX_MESSAGE_CHARS = 400
_KEPT_HEAD, _KEPT_TAIL = 240, 120
_PATH_PARTS_SHOWN = 3  # of a value nested too deeply to validate: enough to name the argument


def first_error(relative: str, instance: Any) -> jsonschema.ValidationError | None:
    """The most relevant validation error, or None when the instance is valid.

    Its message is at most about MAX_MESSAGE_CHARS long (the middle of a long quoted value is cut,
    so the verdict at the end stays readable). A value nested deeper than the validator can recurse
    is an error too, at the path of the argument that holds it, never a RecursionError.
    """
    if _certainly_valid(relative, instance):  # the fast path, without jsonschema
        return None
    try:
        errors = list(validator(relative).iter_errors(instance))
    except RecursionError:
        return _too_deep(instance)
    if not errors:
        return None
    from jsonschema.exceptions import best_match

    best: jsonschema.ValidationError = best_match(errors)
    if best.validator == "pattern":
        best.message = _PATTERN_MEANINGS.get(str(best.validator_value), best.message)
    best.message = clip_message(best.message)
    return best


# What a pattern means, where quoting the regex would tell a person nothing.
_PATTERN_MEANINGS = {r"\S": "is blank: it must contain at least one character other than whitespace"}


def clip_message(message: str) -> str:
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    cut = len(message) - _KEPT_HEAD - _KEPT_TAIL
    return f"{message[:_KEPT_HEAD]}… [{cut} characters cut] …{message[-_KEPT_TAIL:]}"


def _too_deep(instance: Any) -> jsonschema.ValidationError:
    """The error for a value too deep to validate (or even to quote), at the argument that holds
    it: the path of its deepest point, cut after the last object key among its first parts."""
    path = deepest_path(instance)
    keys = [i + 1 for i, part in enumerate(path[:_PATH_PARTS_SHOWN]) if isinstance(part, str)]
    shown = path[: keys[-1] if keys else 0]
    from jsonschema import ValidationError

    return ValidationError(
        f"value nested too deeply to validate ({len(path) - len(shown)} levels below this point); flatten it",
        path=shown,
        validator="nesting",
    )


def _certainly_valid(relative: str, instance: Any) -> bool:
    accept = acceptor(relative)
    return accept is not None and accept(instance)


@cache
def acceptor(relative: str) -> Accept | None:
    """A compiled "certainly valid" check for `schemas/<relative>` (see `_schema_accept`), or None
    if the schema uses a keyword it does not handle."""
    try:
        return compile_acceptor(load_schema(relative))
    except Unsupported:
        return None


def check_arguments(relative: str, instance: Any, *, tool: str = "") -> None:
    """Raise InvalidArguments (validator message + failing JSON path) unless `instance` is valid."""
    from conclave.errors import InvalidArguments

    error = first_error(relative, instance)
    if error is not None:
        raise InvalidArguments(error.message, path=json_path(error), tool=tool)
