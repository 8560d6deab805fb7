"""The `verify` tool: deterministic checks, each bounded so that no input can hang or exhaust the server.

Six kinds of check: `regex`, `json_schema`, `math`, `equals`, `contains`, `json_parse`. Nothing here
evaluates code or touches the network: arithmetic is interpreted from a whitelisted syntax tree with
size limits checked *before* each operation (see `arithmetic`), and JSON Schema `$ref`s resolve only
against the bundled metaschemas. The two checks whose running time the caller controls (regex
backtracking, schema validation) run in a worker process that is killed at its deadline, because
CPython's `re` cannot be interrupted in-process.

A failed check, including a refused one (over a limit, invalid pattern, timeout), is a normal result
with `passed: false` and a `detail` saying why; `run_verify` never raises for anything in the checks.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from collections.abc import Awaitable, Callable, Mapping
from fractions import Fraction
from typing import TYPE_CHECKING, Any, TypeVar, TypeVarTuple

import anyio
import anyio.lowlevel
import anyio.to_process
import anyio.to_thread

from conclave.core.errors import CallerError
from conclave.schema.jsonshape import json_type, nests_deeper_than
from conclave.schema.schemas import json_path
from conclave.tools.arithmetic import ExpressionRefused, Number, evaluate, show_number

if TYPE_CHECKING:
    import jsonschema

MAX_CHECKS = 32
REGEX_TIMEOUT_SECONDS = 1.0
JSON_SCHEMA_TIMEOUT_SECONDS = 2.0

_MAX_DETAIL = 1000  # matches `detail.maxLength` in schemas/verify.output.json
_SNIPPET = 80  # how much of a match, value or message a detail quotes
_WORKER_START_SECONDS = 30.0
_WORKERS = max(2, min(8, os.cpu_count() or 2))

_MAX_JSON_BYTES = 256 * 1024
_MAX_JSON_DEPTH = 100

_REGEX_FLAGS = {"IGNORECASE": re.IGNORECASE, "MULTILINE": re.MULTILINE, "DOTALL": re.DOTALL}

Outcome = tuple[bool, str]
T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class _Fail(Exception):
    """A check failed or was refused; `detail` says why. Never leaves this module."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


# ---------------------------------------------------------------------------------------------------
# The tool


async def run_verify(args: Mapping[str, Any]) -> dict[str, Any]:
    """Run every check (concurrently) and report each in input order.

    `args` is already valid against schemas/verify.input.json; `session_id` is ignored (no state).
    """
    checks = list(args["checks"])
    if not 1 <= len(checks) <= MAX_CHECKS:  # the schema already says so; a bypass must not run 10 000
        raise CallerError(f"verify takes 1 to {MAX_CHECKS} checks, got {len(checks)}")
    results: list[dict[str, Any]] = [{} for _ in checks]
    async with anyio.create_task_group() as group:
        for index, check in enumerate(checks):
            group.start_soon(_run_check, index, check, results)
    return {"passed": all(result["passed"] for result in results), "results": results}


def render_verify(result: Mapping[str, Any]) -> str:
    """One line per check (`✓ [0] math: 4`), then a summary line."""
    results = result["results"]
    lines = [
        f"{'✓' if item['passed'] else '✗'} [{item['index']}] {item['type']}: {_one_line(item['detail'])}"
        for item in results
    ]
    passed = sum(1 for item in results if item["passed"])
    verdict = "PASSED" if result["passed"] else "FAILED"
    lines.append(f"{verdict}: {passed}/{len(results)} checks passed")
    return "\n".join(lines)


async def _run_check(index: int, check: Mapping[str, Any], results: list[dict[str, Any]]) -> None:
    kind = check["type"]
    try:
        passed, detail = await _CHECKS[kind](check)
    except _Fail as refused:
        passed, detail = False, refused.detail
    results[index] = {"index": index, "type": kind, "passed": passed, "detail": _clip(detail, _MAX_DETAIL)}


# ---------------------------------------------------------------------------------------------------
# regex


async def _check_regex(check: Mapping[str, Any]) -> Outcome:
    pattern, text = check["pattern"], check["text"]
    flags = 0
    for name in check.get("flags", ()):
        flags |= _REGEX_FLAGS[name]
    # Compiling is cheap and bounded by the pattern's length: a bad pattern fails without a process.
    try:
        with warnings.catch_warnings():  # e.g. FutureWarning on "[[": the caller gets a verdict, not noise
            warnings.simplefilter("ignore")
            re.compile(pattern, flags)
    except (re.error, OverflowError, RecursionError, ValueError) as exc:
        return False, f"invalid regex: {exc}"
    found = await _in_worker(
        _search,
        pattern,
        flags,
        text,
        seconds=REGEX_TIMEOUT_SECONDS,
        on_timeout=f"regex timed out after {REGEX_TIMEOUT_SECONDS}s (possible catastrophic backtracking)",
    )
    expected = bool(check.get("expect_match", True))
    if found is None:
        return not expected, "no match"
    start, end, snippet = found
    return expected, f"match at [{start}:{end}]: {snippet}"


def _search(pattern: str, flags: int, text: str) -> tuple[int, int, str] | None:
    """Worker-process side of a regex check. Module-level so that it pickles by reference.

    Returns the first match's span and a quoted, clipped copy of it (a `re.Match` does not pickle).
    """
    match = re.search(pattern, text, flags)
    if match is None:
        return None
    return match.start(), match.end(), _clip(repr(match.group()), _SNIPPET)


# ---------------------------------------------------------------------------------------------------
# json_schema


async def _check_json_schema(check: Mapping[str, Any]) -> Outcome:
    schema, instance = check["schema"], check["instance"]
    _require_small_json(schema, "schema")
    _require_small_json(instance, "instance")
    return await _in_worker(
        _validate,
        schema,
        instance,
        seconds=JSON_SCHEMA_TIMEOUT_SECONDS,
        on_timeout=f"schema validation timed out after {JSON_SCHEMA_TIMEOUT_SECONDS}s",
    )


def _validate(schema: Any, instance: Any) -> Outcome:
    """Worker-process side of a json_schema check: a `pattern` keyword can backtrack as badly as a regex
    check, and `uniqueItems` on a large array is quadratic. jsonschema is imported here, in the
    worker, so the serving process loads it only when it must explain a rejected argument."""
    import jsonschema
    import referencing
    import referencing.exceptions

    cls = _dialect(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return False, _clip(f"invalid schema: {exc.message}", _MAX_DETAIL)
    # An empty registry has no retrieval: a remote `$ref` is unresolvable instead of fetched.
    validator = cls(schema, registry=referencing.Registry(), format_checker=cls.FORMAT_CHECKER)
    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(instance))
    except referencing.exceptions.Unresolvable as exc:
        return False, _clip(f"unresolvable $ref (remote references are never fetched): {exc}", _MAX_DETAIL)
    except RecursionError:
        return False, "schema recursion too deep (a $ref cycle?)"
    if error is None:
        return True, "valid"
    return False, _clip(f"{json_path(error)}: {error.message}", _MAX_DETAIL)


def _dialect(schema: Any) -> type[jsonschema.protocols.Validator]:
    """Honour a known `$schema` (draft 7 schemas are common); anything else is draft 2020-12."""
    import jsonschema

    dialect = schema.get("$schema") if isinstance(schema, dict) else None
    if not isinstance(dialect, str):
        return jsonschema.Draft202012Validator
    cls: type[jsonschema.protocols.Validator] = jsonschema.validators.validator_for(
        schema, default=jsonschema.Draft202012Validator
    )
    return cls


def _require_small_json(value: Any, name: str) -> None:
    """Refuse values too deep or too large to hand to a worker (pickling recurses like validation)."""
    _require_shallow_json(value, name)
    try:
        encoded = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise _Fail(f"{name} is not plain JSON: {exc}") from exc
    size = len(encoded.encode("utf-8", "surrogatepass"))
    if size > _MAX_JSON_BYTES:
        raise _Fail(f"{name} is {size} bytes serialized, over the {_MAX_JSON_BYTES}-byte limit")


def _require_shallow_json(value: Any, name: str) -> None:
    if nests_deeper_than(value, _MAX_JSON_DEPTH):
        raise _Fail(f"{name} is nested deeper than {_MAX_JSON_DEPTH} levels")


# ---------------------------------------------------------------------------------------------------
# Worker processes


async def _in_worker(func: Callable[[*Ts], T], *args: *Ts, seconds: float, on_timeout: str) -> T:
    """`func(*args)` in a worker process, killed (SIGKILL) when `seconds` run out.

    The clock starts only once a slot is held and a worker is warm: waiting behind other checks or
    starting a cold interpreter must not be mistaken for a runaway pattern. The warm worker goes
    back to anyio's pool, whose most recently used worker the timed call then takes.
    """
    pool = _limiter(_POOL_TOKENS)
    try:
        async with _limiter(_SLOTS):
            with anyio.move_on_after(_WORKER_START_SECONDS) as start:
                await anyio.to_process.run_sync(_ready, cancellable=True, limiter=pool)
            if start.cancelled_caught:
                raise _Fail("verify worker process did not start")
            with anyio.move_on_after(seconds):
                return await anyio.to_process.run_sync(func, *args, cancellable=True, limiter=pool)
    # The process boundary: a crashed or unstartable worker fails the check, not the call.
    except (anyio.BrokenWorkerProcess, OSError, MemoryError, RecursionError) as exc:
        raise _Fail(f"verify worker process failed: {type(exc).__name__}") from exc
    raise _Fail(on_timeout)


def _ready() -> bool:
    return True


# Per event loop, as anyio's own pool is: a limiter is bound to the loop that first uses it.
_SLOTS: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar("conclave_verify_slots")
_POOL_TOKENS: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar("conclave_verify_pool")


def _limiter(var: anyio.lowlevel.RunVar[anyio.CapacityLimiter]) -> anyio.CapacityLimiter:
    try:
        return var.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(_WORKERS)
        var.set(limiter)
        return limiter


# ---------------------------------------------------------------------------------------------------
# math


async def _check_math(check: Mapping[str, Any]) -> Outcome:
    try:
        value = evaluate(check["expression"])
    except ExpressionRefused as refused:
        return False, str(refused)
    if "expected" not in check:
        return True, show_number(value)
    expected, tolerance = check["expected"], check.get("tolerance", 1e-9)
    if _within(value, expected, tolerance):
        return True, show_number(value)
    return False, f"got {show_number(value)}, expected {expected!r} (tolerance {tolerance!r})"


def _within(value: Number, expected: Number, tolerance: Number) -> bool:
    """|value - expected| <= tolerance, exactly: a huge int minus a float would overflow a float."""
    if any(isinstance(number, float) and not math.isfinite(number) for number in (expected, tolerance)):
        raise _Fail("expected and tolerance must be finite numbers")
    return abs(Fraction(value) - Fraction(expected)) <= Fraction(tolerance)


# ---------------------------------------------------------------------------------------------------
# equals


async def _check_equals(check: Mapping[str, Any]) -> Outcome:
    actual, expected = check["actual"], check["expected"]
    for name, value in (("actual", actual), ("expected", expected)):
        _require_shallow_json(value, name)
    difference = _first_difference(actual, expected, "$")
    if difference is None:
        return True, "equal"
    return False, f"first difference at {difference}"


def _first_difference(actual: Any, expected: Any, path: str) -> str | None:
    """Where two JSON values first differ, in document order; None when equal. Depth is bounded by
    the caller, so recursion is safe."""
    kind, expected_kind = json_type(actual), json_type(expected)
    if kind != expected_kind:
        shown = f"actual is {kind} {_show_json(actual)}, expected {expected_kind} {_show_json(expected)}"
        return f"{path}: {shown}"
    if kind == "object":
        return _object_difference(actual, expected, path)
    if kind == "array":
        return _array_difference(actual, expected, path)
    if actual != expected:
        return f"{path}: {_show_json(actual)} != {_show_json(expected)}"
    return None


def _object_difference(actual: Mapping[str, Any], expected: Mapping[str, Any], path: str) -> str | None:
    for key in expected:
        if key not in actual:
            return f"{path}: missing key {key!r}"
    for key in actual:
        if key not in expected:
            return f"{path}: unexpected key {key!r}"
    for key in expected:
        difference = _first_difference(actual[key], expected[key], f"{path}.{key}")
        if difference is not None:
            return difference
    return None


def _array_difference(actual: list[Any], expected: list[Any], path: str) -> str | None:
    for index, (left, right) in enumerate(zip(actual, expected, strict=False)):
        difference = _first_difference(left, right, f"{path}[{index}]")
        if difference is not None:
            return difference
    if len(actual) != len(expected):
        return f"{path}: array of {len(actual)} items, expected {len(expected)}"
    return None


def _show_json(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):  # ValueError: an int over the digit limit, NaN
        text = f"<{json_type(value)}>"
    return _clip(text, _SNIPPET)


# ---------------------------------------------------------------------------------------------------
# contains


async def _check_contains(check: Mapping[str, Any]) -> Outcome:
    text, substring = check["text"], check["substring"]
    if check.get("case_sensitive", True):
        at = text.find(substring)
        return (True, f"found at index {at}") if at >= 0 else (False, "not found")
    # casefold can change lengths (ß -> ss), so an index into the folded text would mislead.
    if substring.casefold() in text.casefold():
        return True, "found (ignoring case)"
    return False, "not found (ignoring case)"


# ---------------------------------------------------------------------------------------------------
# json_parse


async def _check_json_parse(check: Mapping[str, Any]) -> Outcome:
    # A long text with a Python hook per object: off the event loop so pings are still answered.
    return await anyio.to_thread.run_sync(_parse_strict, check["text"])


def _parse_strict(text: str) -> Outcome:
    try:
        value = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except _Fail as refused:
        return False, refused.detail
    except json.JSONDecodeError as exc:
        return False, f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} (char {exc.pos})"
    except RecursionError:
        return False, "invalid JSON: nested too deeply to parse"
    except ValueError as exc:  # e.g. an integer over the interpreter's digit limit
        return False, f"invalid JSON: {exc}"
    return True, f"valid JSON: {json_type(value)}"


def _reject_constant(name: str) -> Any:
    raise _Fail(f"invalid JSON: {name} is not a JSON value")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _Fail(f"invalid JSON: duplicate key {_clip(repr(key), _SNIPPET)} in an object")
        result[key] = value
    return result


# ---------------------------------------------------------------------------------------------------
# Shared


_CHECKS: dict[str, Callable[[Mapping[str, Any]], Awaitable[Outcome]]] = {
    "regex": _check_regex,
    "json_schema": _check_json_schema,
    "math": _check_math,
    "equals": _check_equals,
    "contains": _check_contains,
    "json_parse": _check_json_parse,
}


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _one_line(text: str) -> str:
    return " ".join(text.splitlines())
