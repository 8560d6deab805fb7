"""JSON Schemas from `schemas/`, the single source of truth, compiled once.

A missing or invalid schema fails at first load with the file named, never at a request.
The installed wheel carries the schemas under `conclave/_data/schemas`; a source checkout
reads them from the repository's top-level `schemas/`.

A shape that several schemas share is written once, in `schemas/defs/`, and named by a `$ref`
relative to the naming file's `$id` (`https://conclave.dev/schemas/<path>`, its path under
`schemas/`). The validators resolve them through a `referencing` registry of every file; the
acceptors resolve them once, when compiled; `dereferenced` inlines them, for a client that is
handed a schema whole (a tool's `outputSchema` in `tools/list`).
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urldefrag, urljoin

import orjson

from conclave.schema._schema_accept import Accept, Unsupported, compile_acceptor
from conclave.schema.jsonshape import deepest_path

if TYPE_CHECKING:  # jsonschema itself is imported only for an instance the acceptor cannot accept
    import jsonschema
    from jsonschema.protocols import Validator
    from referencing import Registry

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # conclave/ (this file is in conclave/schema/)


def data_path(name: str) -> Path:
    """Locate a shipped data file (`schemas`, `config.yaml`) in a wheel or a checkout."""
    for candidate in (_PACKAGE_DIR / "_data" / name, _PACKAGE_DIR.parent / name):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"conclave data file {name!r} is missing from the installation")


def schema_dir() -> Path:
    return data_path("schemas")


SCHEMA_BASE = "https://conclave.dev/schemas/"  # + a file's path under schemas/: its `$id`


def schema_uri(relative: str) -> str:
    return SCHEMA_BASE + relative


def relative_path(uri: str) -> str:
    """The path under `schemas/` of a schema's URI; LookupError for a URI outside them."""
    address = urldefrag(uri)[0]
    relative = address.removeprefix(SCHEMA_BASE)
    if relative == address or not relative.endswith(".json") or ".." in relative.split("/"):
        raise LookupError(f"{uri!r} names no file of schemas/ (their URIs start {SCHEMA_BASE})")
    return relative


@cache
def load_schema(relative: str) -> dict[str, Any]:
    """`schemas/<relative>` as written: its `$ref`s to other files unresolved."""
    path = schema_dir() / relative
    try:
        schema: dict[str, Any] = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise RuntimeError(f"schema {path} cannot be loaded: {exc}") from exc
    # Not meta-validated here, which would slow start-up: tests/test_schemas.py checks each file.
    return schema


def schema_files() -> list[str]:
    """Every schema file, by its path under `schemas/`."""
    root = schema_dir()
    return sorted(path.relative_to(root).as_posix() for path in root.rglob("*.json"))


def _document(uri: str) -> dict[str, Any]:
    return load_schema(relative_path(uri))


def resolve(uri: str) -> Any:
    """The schema at an absolute URI: a file of `schemas/`, and in it a JSON Pointer fragment."""
    address, fragment = urldefrag(uri)
    node: Any = _document(address)
    for raw in fragment.split("/")[1:] if fragment else ():
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise LookupError(f"{uri!r} does not resolve: no {part!r} there") from None
    return node


@cache
def registry() -> Registry:
    """Every file of `schemas/`, by its `$id`: where the validators resolve a `$ref`."""
    from referencing import Registry
    from referencing.jsonschema import DRAFT202012

    resources = [
        (schema_uri(relative), DRAFT202012.create_resource(_without_dialect(load_schema(relative))))
        for relative in schema_files()  # each file's $id is this URI (tests/test_schemas.py)
    ]
    registry: Registry = Registry().with_resources(resources)
    return registry.crawl()


# ------------------------------------------------------------------ the self-contained form

# Keywords whose value is a schema, a name -> schema map, or a list of schemas: where a $ref may be.
_SUBSCHEMA = frozenset(
    {"items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
     "unevaluatedItems", "unevaluatedProperties"}
)  # fmt: skip
_SUBSCHEMA_MAP = frozenset({"properties", "patternProperties", "dependentSchemas", "$defs"})
_SUBSCHEMA_LIST = frozenset({"anyOf", "allOf", "oneOf", "prefixItems"})
_ANNOTATIONS = frozenset({"title", "description", "$comment", "default", "examples"})
_DOCUMENT_ONLY = ("$schema", "$id", "$defs")
# Assertions a merge may add to a schema that lacks them: none depends on another keyword.
_INDEPENDENT = frozenset(
    {"type", "enum", "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
     "maxLength", "pattern", "minItems", "maxItems", "uniqueItems", "required", "format"}
)  # fmt: skip


@cache
def dereferenced(relative: str) -> dict[str, Any]:
    """`schemas/<relative>` self-contained: every `$ref` replaced by what it names, and no `$defs`.
    What it accepts is what the file accepts. A `$ref` with assertions beside it (a refinement,
    such as coordinate's plan naming only debate roles) is merged into its target where that is
    exact, else kept as `allOf`. Cached: callers must not change it."""
    root = load_schema(relative)
    schema = _inline(root, schema_uri(relative), (), {})
    return {**{k: root[k] for k in ("$schema", "$id") if k in root}, **schema}


def _inline(node: Any, base: str, seen: tuple[str, ...], done: dict[str, Any]) -> Any:
    """`node` (in the document at `base`) with its `$ref`s inlined; `seen`: the refs being
    inlined around it, `done`: each target inlined so far (a shape named twice is built once)."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DOCUMENT_ONLY or key == "$ref":
            continue
        if key in _SUBSCHEMA:
            out[key] = _inline(value, base, seen, done)
        elif key in _SUBSCHEMA_MAP and isinstance(value, dict):
            out[key] = {name: _inline(sub, base, seen, done) for name, sub in value.items()}
        elif key in _SUBSCHEMA_LIST and isinstance(value, list):
            out[key] = [_inline(sub, base, seen, done) for sub in value]
        else:
            out[key] = value
    ref = node.get("$ref")
    if not isinstance(ref, str):
        return out
    uri = urljoin(base, ref)
    if uri in seen:
        raise RuntimeError(f"$ref {ref!r} in {base} is recursive: it cannot be inlined")
    if uri not in done:
        done[uri] = _inline(resolve(uri), urldefrag(uri)[0], (*seen, uri), done)
    target = done[uri]
    merged = _merge(target, out)
    if merged is not None:
        return merged
    annotations = {k: v for k, v in out.items() if k in _ANNOTATIONS}
    return {**annotations, "allOf": [target, {k: v for k, v in out.items() if k not in _ANNOTATIONS}]}


def _merge(target: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any] | None:
    """One schema accepting exactly what both `target` and `extra` accept (annotations from
    `extra`), or None where that takes more than these exact rules."""
    out = dict(target)
    for key, value in extra.items():
        if key in _ANNOTATIONS or out.get(key) == value:
            out[key] = value
        elif key not in out:
            if key not in _INDEPENDENT:
                return None
            out[key] = value
        elif key == "required":
            out[key] = list(dict.fromkeys([*value, *out[key]]))
        elif key == "enum":
            if not all(isinstance(v, str | int | float | None) for v in [*value, *out[key]]):
                return None  # containers: jsonschema's equality inside them is its own
            out[key] = [v for v in out[key] if any(_json_equal(v, w) for w in value)]
        elif key == "items" and isinstance(value, dict) and isinstance(out[key], dict):
            items = _merge(out[key], value)
            if items is None:
                return None
            out[key] = items
        elif key == "properties" and isinstance(value, dict):
            properties = dict(out[key])
            for name, sub in value.items():
                if name not in properties:
                    return None  # beside additionalProperties it would change what is allowed
                merged = _merge(properties[name], sub) if isinstance(properties[name], dict) else None
                if merged is None:
                    return None
                properties[name] = merged
            out[key] = properties
        else:
            return None
    return out


def _json_equal(a: Any, b: Any) -> bool:
    """Scalars equal as JSON values: 1 and 1.0 are, true and 1 are not."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


def _without_dialect(schema: dict[str, Any]) -> dict[str, Any]:
    """A document without its `$schema`. jsonschema validates what a `$ref` names with the
    validator class its `$schema` names, which would be the stock class, without the JSON number
    check below; without `$schema` it keeps the class it was validating with."""
    return {k: v for k, v in schema.items() if k != "$schema"}


def _is_json_number(_checker: Any, value: Any) -> bool:
    """JSON has no NaN or Infinity: from Python or YAML (`.nan`) they would pass every `minimum`
    and `maximum` (each comparison is false) and reach a deadline or a cost cap."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return not isinstance(value, float) or math.isfinite(value)


@cache
def validator(relative: str) -> Validator:
    """A compiled validator for `schemas/<relative>`, built once per process; its `$ref`s to
    other files resolve through `registry()`."""
    import jsonschema

    schema = load_schema(relative)
    base = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    checker = base.TYPE_CHECKER.redefine("number", _is_json_number)
    cls: type[Validator] = jsonschema.validators.extend(base, type_checker=checker)  # type: ignore[no-untyped-call]
    return cls(_without_dialect(schema), format_checker=jsonschema.FormatChecker(), registry=registry())


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
    """A compiled "certainly valid" check for `schemas/<relative>` (see `_schema_accept`), its
    `$ref`s resolved as it is compiled, or None if the schema uses a keyword it does not handle."""
    try:
        return compile_acceptor(load_schema(relative), documents=_document)
    except Unsupported:
        return None


def check_arguments(relative: str, instance: Any, *, tool: str = "") -> None:
    """Raise InvalidArguments (validator message + failing JSON path) unless `instance` is valid."""
    from conclave.core.errors import InvalidArguments

    error = first_error(relative, instance)
    if error is not None:
        raise InvalidArguments(error.message, path=json_path(error), tool=tool)
