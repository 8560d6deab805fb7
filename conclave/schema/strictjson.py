"""Strict decoding for JSON that models write (tool-call tags, role envelopes).

Python's default decoder keeps the last of duplicate keys (how `{"url": "https://ok", "url":
"http://169.254.169.254"}` would smuggle a second target past whoever reads the first),
accepts NaN/Infinity, and turns `1e999` into inf. Here each of those is a StrictJSONError.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, NoReturn

import orjson

from conclave.schema.jsonshape import a_json_type, nests_deeper_than


class StrictJSONError(ValueError):
    """JSON that parses, but not strictly; the message says what and where."""


def strict_decoder(where: str) -> json.JSONDecoder:
    """A decoder whose errors end with `in <where>`, e.g. "in tool call JSON"."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        # The hook sees every object at every depth, so nested duplicates are caught too.
        obj: dict[str, Any] = {}
        for key, value in items:
            if key in obj:
                raise StrictJSONError(f"duplicate key {quote_key(key)} in {where}")
            obj[key] = value
        return obj

    def constant(token: str) -> NoReturn:
        raise StrictJSONError(f"{token} is not allowed in {where}: numbers must be finite")

    def number(token: str) -> float:
        value = float(token)
        if not math.isfinite(value):
            raise StrictJSONError(f"number {token[:40]} is out of range in {where}: numbers must be finite")
        return value

    return json.JSONDecoder(object_pairs_hook=pairs, parse_constant=constant, parse_float=number)


def quote_key(key: str) -> str:
    # repr escapes control characters; the cap keeps a huge key from bloating the message.
    return repr(key) if len(key) <= 60 else repr(key[:60]) + "..."


MAX_ARGUMENT_BYTES = 16 * 1024  # a tool call's arguments, as a `<tool_call>` tag bounds them
MAX_ARGUMENT_DEPTH = 20  # JSON nesting (objects + arrays)
_ARGUMENTS = strict_decoder("tool call arguments")


def tool_arguments(raw: str | Mapping[str, Any] | None) -> tuple[dict[str, Any] | None, str | None]:
    """A native tool call's arguments under the rules a `<tool_call>` tag's JSON obeys: a JSON
    object (a string from OpenAI-style providers, already decoded from the others) of at most
    MAX_ARGUMENT_BYTES, nested at most MAX_ARGUMENT_DEPTH deep, with no duplicate keys and only
    finite numbers. Returns (arguments, None), or (None, why) for a parse_error refusal."""
    if raw is None or raw == "":
        return {}, None  # a call with no arguments (OpenAI sends "", Gemini may omit them)
    text = raw if isinstance(raw, str) else orjson.dumps(raw).decode()
    if len(text.encode("utf-8")) > MAX_ARGUMENT_BYTES:
        return None, f"tool call arguments larger than {MAX_ARGUMENT_BYTES // 1024} KiB"
    try:
        value = _ARGUMENTS.decode(text) if isinstance(raw, str) else raw
    except RecursionError:
        return None, f"tool call arguments nested deeper than {MAX_ARGUMENT_DEPTH} levels"
    except ValueError as exc:  # StrictJSONError and JSONDecodeError included
        return None, f"invalid tool call arguments: {str(exc)[:160]}"
    if not isinstance(value, dict):
        return None, f"tool call arguments must be a JSON object, not {a_json_type(value)}"
    if nests_deeper_than(value, MAX_ARGUMENT_DEPTH):
        return None, f"tool call arguments nested deeper than {MAX_ARGUMENT_DEPTH} levels"
    return dict(value), None
