"""JSON Schemas from `schemas/`, the single source of truth, compiled once.

A missing or invalid schema fails at first load with the file named, never at a request.
The installed wheel carries the schemas under `conclave/_data/schemas`; a source checkout
reads them from the repository's top-level `schemas/`.
"""

from __future__ import annotations

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
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


@cache
def validator(relative: str) -> Validator:
    """A compiled validator for `schemas/<relative>`, built once per process."""
    schema = load_schema(relative)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=jsonschema.FormatChecker())


def json_path(error: jsonschema.ValidationError) -> str:
    """`$.providers.openai.kind` style path of the failing element."""
    parts = ["$"]
    for part in error.absolute_path:
        parts.append(f"[{part}]" if isinstance(part, int) else f".{part}")
    return "".join(parts)


def first_error(relative: str, instance: Any) -> jsonschema.ValidationError | None:
    """The most relevant validation error, or None when the instance is valid."""
    errors = list(validator(relative).iter_errors(instance))
    if not errors:
        return None
    best: jsonschema.ValidationError | None = jsonschema.exceptions.best_match(errors)
    return best


def check_arguments(relative: str, instance: Any, *, tool: str = "") -> None:
    """Raise InvalidArguments (validator message + failing JSON path) unless `instance` is valid."""
    from conclave.errors import InvalidArguments

    error = first_error(relative, instance)
    if error is not None:
        raise InvalidArguments(error.message, path=json_path(error), tool=tool)
