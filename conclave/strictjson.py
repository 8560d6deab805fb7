"""Strict decoding for JSON that models write (tool-call tags, role envelopes).

Python's default decoder keeps the last of duplicate keys (how `{"url": "https://ok", "url":
"http://169.254.169.254"}` would smuggle a second target past whoever reads the first),
accepts NaN/Infinity, and turns `1e999` into inf. Here each of those is a StrictJSONError.
"""

from __future__ import annotations

import json
import math
from typing import Any, NoReturn


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
