"""Strict parser for the `<tool_call>` tag a worker model writes mid-turn
(docs/worker-loop.md#tags-tagspy).

Nothing is ever repaired: a tag that is not exactly right becomes a TagError, which the caller turns
into a `parse_error` refusal so the worker can correct itself on its next hop. A guessed-at repair
could dispatch something the model never asked for (e.g. the second of two duplicate `url` keys).
"""

from __future__ import annotations

import json
import re
from typing import Any

from conclave.core.records import record
from conclave.schema.jsonshape import a_json_type
from conclave.schema.strictjson import StrictJSONError, quote_key, strict_decoder

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
MAX_TAG_BYTES = 16 * 1024  # from the start of OPEN to the end of CLOSE, UTF-8 bytes
MAX_DEPTH = 20  # JSON nesting bound (objects + arrays)
MAX_NAME_CHARS = 64
_EXCERPT_CHARS = 200


@record
class ToolCall:
    name: str
    args: dict[str, Any]
    start: int  # index of OPEN in the text
    end: int  # index just past CLOSE
    raw: str  # text[start:end]


@record
class TagError:
    detail: str  # what was wrong, worded for the model that has to fix it
    start: int
    excerpt: str  # at most 200 chars of the offending tag text


# The next OPEN (exact: `<TOOL_CALL>` is prose, not a tag) or the start of an echoed tool result (any
# case, since the echo is copied from text we do not control). `(?![\w-])` keeps `<tool_resultx` out.
_NEXT = re.compile(r"(?P<call><tool_call>)|(?i:<(?P<echo>tool_result|untrusted_input))(?![\w-])")
# Per echo kind: its openers and closers, counted so a nested echo does not end the region early.
_ECHO = {
    kind: re.compile(rf"(?i)(?P<close></{kind}\s*>)|<{kind}(?![\w-])")
    for kind in ("tool_result", "untrusted_input")
}
_JSON_WS = re.compile(r"[ \t\n\r]*")  # JSON's own whitespace; str.isspace() would admit more
# What is left after a decode error when the input simply stopped mid-token: `tru`, `12e`, `u12` ...
_PARTIAL_TOKEN = re.compile(r"[\w.+\-\\]*")


_DECODER = strict_decoder("tool call JSON")


def find_tool_call(text: str, *, truncated: bool = False) -> ToolCall | TagError | None:
    """None: no tag (the response is final). ToolCall: a well-formed first tag. TagError: a tag is
    present but unusable. `truncated=True` means the model's output was cut by its token limit: a tag
    that is not complete is then reported as cut off by the token limit (never executed)."""
    start = _find_open(text)
    if start is None:
        return None
    return _parse_tag(text, start, truncated)


def _find_open(text: str) -> int | None:
    pos = 0
    while (m := _NEXT.search(text, pos)) is not None:
        if m.group("call") is not None:
            return m.start()
        pos = _skip_echo(text, m.end(), m.group("echo").lower())
    return None


def _skip_echo(text: str, pos: int, kind: str) -> int:
    # An unclosed echo runs to the end of the text: whatever follows it may still be tool output.
    depth = 1
    for m in _ECHO[kind].finditer(text, pos):
        depth += -1 if m.group("close") is not None else 1
        if depth == 0:
            return m.end()
    return len(text)


def _parse_tag(text: str, start: int, truncated: bool) -> ToolCall | TagError:
    # Everything below works on a window of at most MAX_TAG_BYTES: the decoder never sees more, so a
    # huge response cannot make the parse expensive, and a tag that does not fit fails as too large.
    window = text[start : start + _chars_within(text, start, MAX_TAG_BYTES)]
    capped = start + len(window) < len(text)  # the window stopped at the byte cap, not the text's end
    first_close = window.find(CLOSE, len(OPEN))
    excerpt_end = len(window) if first_close < 0 else first_close + len(CLOSE)
    excerpt = window[: min(excerpt_end, _EXCERPT_CHARS)]

    def error(detail: str) -> TagError:
        return TagError(detail=detail, start=start, excerpt=excerpt)

    def ran_out(detail: str) -> TagError:
        # The tag reached the end of the window without being complete: say why, in the order
        # that explains it (too large beats cut off, since a cut past 16 KiB did not cause it).
        if capped:
            return error(
                f"tool call larger than 16 KiB: no complete tag within {MAX_TAG_BYTES} bytes of {OPEN}"
            )
        if truncated:
            return error("tool call cut off by the token limit; it was not executed")
        return error(detail)

    if first_close < 0:
        return ran_out(f"missing {CLOSE}: the tag is never closed")

    pos = _skip_ws(window, len(OPEN))
    if _too_deep(window, pos):
        return error(f"tool call JSON nested deeper than {MAX_DEPTH} levels")
    try:
        value, pos = _DECODER.raw_decode(window, pos)
    except json.JSONDecodeError as e:
        rest = window[e.pos :]
        detail = f"invalid JSON in tool call: {e.msg} (at char {e.pos - len(OPEN)} after {OPEN})"
        if e.msg.startswith("Unterminated string") or _PARTIAL_TOKEN.fullmatch(rest):
            return ran_out(detail)
        return error(detail)
    except StrictJSONError as e:
        return error(str(e))
    except RecursionError:
        # The depth pre-scan should make this unreachable; kept so no input can ever raise.
        return error("tool call JSON nested too deeply")
    except ValueError as e:  # e.g. an integer literal over Python's digit limit
        return error(f"invalid JSON in tool call: {str(e)[:120]}")

    pos = _skip_ws(window, pos)
    if not window.startswith(CLOSE, pos):
        if CLOSE.startswith(window[pos:]):  # e.g. `...}}</tool_ca` at the end: the closer was cut
            return ran_out(f"expected {CLOSE} right after the JSON, found the end of the text")
        return error(f"expected {CLOSE} right after the JSON")
    end = pos + len(CLOSE)

    shape_error = _shape_error(value)
    if shape_error is not None:
        return error(shape_error)
    try:
        # JSON lets `"\ud800"` decode to a lone surrogate, a str that no UTF-8 encoder downstream
        # (the fetch URL, orjson telemetry, transcripts) will accept: refuse it here, not crash there.
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return error("tool call JSON contains an unpaired surrogate such as \\ud800 (not valid Unicode)")
    return ToolCall(name=value["name"], args=value["args"], start=start, end=start + end, raw=window[:end])


def _skip_ws(s: str, pos: int) -> int:
    m = _JSON_WS.match(s, pos)
    return pos if m is None else m.end()


def _chars_within(text: str, start: int, limit: int) -> int:
    """How many chars from `start` fit in `limit` UTF-8 bytes."""
    chunk = text[start : start + limit]  # a char is at least one byte, so this is enough
    # surrogatepass: a lone surrogate is legal in a str and must not make us raise.
    data = chunk.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return len(chunk)
    cut = limit
    while data[cut] & 0xC0 == 0x80:  # back off to a char boundary (a byte that is not a continuation)
        cut -= 1
    return len(data[:cut].decode("utf-8", "surrogatepass"))


def _too_deep(s: str, pos: int) -> bool:
    """Whether the JSON value at `pos` nests deeper than MAX_DEPTH, checked before the recursive
    decoder ever sees it. Brackets inside strings do not count; the scan stops once the value closes,
    so brackets in prose after the tag cannot trip it."""
    depth = 0
    in_string = escaped = False
    for i in range(pos, len(s)):
        c = s[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif c in "]}":
            depth -= 1
            if depth <= 0:
                return False
        elif depth == 0:
            return False  # a scalar at the top: no nesting at all
    return False


def _shape_error(value: Any) -> str | None:
    if not isinstance(value, dict):
        return f'tool call JSON must be an object {{"name": ..., "args": {{...}}}}, got {a_json_type(value)}'
    for key in ("name", "args"):
        if key not in value:
            return f"tool call JSON is missing key {key!r}"
    extra = [key for key in value if key not in ("name", "args")]
    if extra:
        return f"unexpected key {quote_key(extra[0])} in tool call JSON (only 'name' and 'args' are allowed)"
    name = value["name"]
    if not isinstance(name, str):
        return f"tool call 'name' must be a string, got {a_json_type(name)}"
    if not name:
        return "tool call 'name' is empty"
    if len(name) > MAX_NAME_CHARS:
        return f"tool call 'name' is longer than {MAX_NAME_CHARS} characters"
    if not name.isprintable() or any(c.isspace() for c in name):
        return f"tool call 'name' {quote_key(name)} contains whitespace or unprintable characters"
    if not isinstance(value["args"], dict):
        return f"tool call 'args' must be an object, got {a_json_type(value['args'])}"
    return None
