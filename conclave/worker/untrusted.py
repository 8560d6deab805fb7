"""Wrapping tool results as untrusted data for a worker model
(docs/worker-loop.md#untrusted-wrapping-untrustedpy-_foldingpy).

A tool result (a fetched page, a verify result, a refusal) goes back to the worker as

    <tool_result name="fetch" nonce="…"><untrusted_input>…</untrusted_input></tool_result>

and its content is hostile: it may try to close the envelope early, forge a new one, forge a
``<tool_call>``, or inject chat-template control tokens. Every such construct is *defanged*:
rewritten so that it stays readable but no longer matches anything a parser, a tokenizer or a
model would take for markup. Nothing is deleted.

Detection runs on a *folded view* of the text (built in `_folding`), character by character so
that every folded character maps back to exactly one original character (or one escape):

- NFKC (fullwidth ``＜／ｕｎｔｒｕｓｔｅｄ＿ｉｎｐｕｔ＞`` becomes ASCII), with combining marks dropped
  (``≮`` is ``<`` plus a mark; ``<tóol_call>`` is ``<tool_call>``);
- invisible characters dropped: every format character (category ``Cf``: zero-width space and
  joiners, word joiner, BOM, soft hyphen, bidi controls, tag characters…), every combining mark
  (``Mn``/``Me``: the grapheme joiner U+034F, variation selectors…), Hangul fillers, U+180E;
- look-alikes folded to ASCII: ``‹ 〈 ⟨ ˂ ᐸ ❮ ❬ ❰ ⧼ ⦑`` → ``<`` (``« ⟪ ≪`` → ``<<``) and mirrors,
  ``⁅ ⟦ 〚 【 〔 ❲`` → ``[`` and mirrors, ``¦ │ ∣ ǀ`` → ``|``, ``⁄ ∕ ⧸`` → ``/``, and the Cyrillic
  and Greek letters that look Latin (``</untrusted_іnput>`` with a Cyrillic ``і``);
- Unicode tag characters (U+E0020–U+E007E) are invisible mirrors of ASCII, used to smuggle text past
  people; a model reads them. Text holding any is matched a second time, on a view where each one
  is the ASCII character it spells, so a token spelled in them is caught as well as one they split;
- escapes decoded once, since a model reads them as the characters: HTML character references
  (``&lt;``, ``&#60;``, ``&#x3c;``, ``&lsaquo;``, legacy ``&lt`` without the semicolon…) and
  backslash escapes (``\\u003c`` as Go's JSON encoder writes ``<``, ``\\x3c``, ``\\U0000003c``,
  and ``\\/`` as PHP's ``json_encode`` writes ``/``).

Matching is case-insensitive. Each match in the folded view is mapped back to the span of the
original text it came from, and that span is replaced by ``⚠`` followed by the *folded* match
with brackets turned into parentheses (``<`` ``[`` → ``(``, ``>`` ``]`` → ``)``), whitespace
into plain spaces, ``"`` into ``'`` and ``\\`` into ``/``:

    </untrusted_input>          -> ⚠(/untrusted_input)
    &lt;/Untrusted_Input&gt;    -> ⚠(/Untrusted_Input)
    <|im_start|>                -> ⚠(|im_start|)
    [INST]  <<SYS>>  <s>        -> ⚠(INST)  ⚠((SYS))  ⚠(s)
    "\\n\\nHuman:"                -> "\\n\\n⚠Human:"   (only the word is rewritten)

The replacement contains no bracket, no look-alike, no ``&`` and no invisible character, and
starts with ``⚠``, which no pattern accepts after ``<``, ``[`` or a newline: it can neither
match by itself nor complete a construct with its neighbours. It also keeps a JSON string
valid (no quote, backslash or raw control character), so a refusal body stays parseable.
``neutralize`` still re-scans until a pass finds nothing (bounded), and falls back to a blunt
escape of every bracket-like character if the bound were ever reached.

HTML's strikethrough ``<s>``/``</s>`` is defanged like any other ``<s>``: tokenizers of the
Llama/Mistral family read ``<s>``/``</s>`` as BOS/EOS, and a visible ``⚠(s)`` costs little.
Upper-case ``<S>`` is left alone (it is a type parameter in ``Foo<S>``, and no tokenizer reads it
as BOS). So is ``<ToolCall>`` without a separator (``Vec<ToolCall>`` in SDK docs).
"""

from __future__ import annotations

import json
import re
import secrets as _secrets
from collections import Counter
from collections.abc import Mapping
from typing import Any

from conclave.worker._folding import Folded, fold_char_spelled, folded_views

__all__ = [
    "DEFANG_MARK",
    "find_live_markup",
    "neutralize",
    "new_nonce",
    "wrap_refusal",
    "wrap_result",
]

DEFANG_MARK = "⚠"
TRUNCATION_MARKER = "\n[conclave: result truncated — {full} bytes in full, first {kept} bytes shown]"

_MAX_PASSES = 8
_MAX_DETAIL_CHARS = 2048
# Content far larger than the cut is trimmed before neutralization (which is linear but done in
# Python); neutralizing a prefix is always safe, it only bounds the work.
_PRECUT_FACTOR = 4
_PRECUT_SLACK = 4096

# --------------------------------------------------------------------------------------------
# Forbidden constructs (matched on the folded view, case-insensitively)
# --------------------------------------------------------------------------------------------

# `tool` and `call`/`result` need a separator so that code such as `Vec<ToolCall>` or
# `Promise<ToolResult>` passes untouched; `<TOOL_CALL>`, `<tool call>`, `<tool-call>` do not.
_TAG_NAMES = r"(?:untrusted[\s_-]{0,4}input|tool[\s_-]{1,4}(?:result|call))"
_FORBIDDEN = re.compile(
    "|".join(
        [
            # Envelope and call markup, opening or closing, any spacing, any attributes. The tag
            # runs to its `>` when one follows on the same line without another `<`, `>` or `&`.
            rf"<\s*(?:/\s*)?{_TAG_NAMES}(?:[^<>&\n]{{0,256}}>)?",
            # <|im_start|>, <|eot_id|>, <|channel|>, <｜User｜>, <｜begin▁of▁sentence｜>…
            r"<\|[\w▁.\-]{1,64}\|>",
            # Llama 2 system block.
            r"<\s*<\s*(?:/\s*)?sys\s*>\s*>",
            # BOS/EOS and Gemma turns. `<s>` only in lower case, as tokenizers write it: `Foo<S>`
            # is a type parameter.
            r"<\s*(?:/\s*)?(?:(?-i:s)|bos|eos|start_of_turn|end_of_turn)\s*>",
            # Llama 2 / Mistral instruction brackets.
            r"\[\s*(?:/\s*)?(?:inst|system_prompt|available_tools|tool_calls|tool_results)\s*\]",
            # Anthropic-style turn prefixes; only the word and colon are rewritten.
            r"\n[^\S\n]*\n[^\S\n]*(?P<turn>(?:human|assistant)[^\S\n]*:)",
        ]
    ),
    re.IGNORECASE,
)

_RENDER = str.maketrans({"<": "(", "[": "(", ">": ")", "]": ")", '"': "'", "\\": "/"})


def _render(folded_match: str) -> str:
    text = folded_match.translate(_RENDER)
    return DEFANG_MARK + "".join(" " if c.isspace() or not c.isprintable() else c for c in text)


def _matches(folded: Folded) -> list[tuple[int, int, str]]:
    """(original start, original end, replacement) for each live construct, in order."""
    found: list[tuple[int, int, str]] = []
    for m in _FORBIDDEN.finditer(folded.text):
        fs, fe = m.span("turn") if m.group("turn") is not None else m.span()
        start, end = folded.span(fs, fe)
        replacement = _render(folded.text[fs:fe])
        if found and start < found[-1][1]:
            # Two matches sharing one original character (a multi-character entity): merge.
            prev_start, prev_end, prev_repl = found[-1]
            found[-1] = (prev_start, max(prev_end, end), prev_repl + replacement)
        else:
            found.append((start, end, replacement))
    return found


def _all_matches(text: str) -> list[tuple[int, int, str]]:
    """`_matches` over every view of `text`, overlapping spans merged."""
    views = folded_views(text)
    found = _matches(views[0])
    if len(views) == 1:
        return found
    merged: list[tuple[int, int, str]] = []
    for start, end, replacement in sorted(found + _matches(views[1])):
        if merged and start < merged[-1][1]:
            prev_start, prev_end, prev_repl = merged[-1]
            repl = prev_repl if replacement in prev_repl else prev_repl + replacement
            merged[-1] = (prev_start, max(prev_end, end), repl)
        else:
            merged.append((start, end, replacement))
    return merged


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def new_nonce() -> str:
    """A random nonce for one untrusted wrapper."""
    return _secrets.token_hex(8)


def find_live_markup(text: str) -> list[str]:
    """Every forbidden construct still live in `text`, as the matched substrings of its folded view
    (then those that only the view with tag characters spelled out shows)."""
    views = folded_views(text)
    found = [m.group(0) for m in _FORBIDDEN.finditer(views[0].text)]
    if len(views) > 1:
        unseen = Counter(found)
        for m in _FORBIDDEN.finditer(views[1].text):
            if unseen[m.group(0)] > 0:
                unseen[m.group(0)] -= 1
            else:
                found.append(m.group(0))
    return found


def _apply(text: str, found: list[tuple[int, int, str]]) -> str:
    parts: list[str] = []
    pos = 0
    for start, end, replacement in found:
        parts.append(text[pos:start])
        parts.append(replacement)
        pos = end
    parts.append(text[pos:])
    return "".join(parts)


def neutralize(text: str) -> str:
    """Defang every forbidden construct in `text`; text without any is returned unchanged."""
    for _ in range(_MAX_PASSES):
        found = _all_matches(text)
        if not found:
            return text
        text = _apply(text, found)
    return _blunt(text)


def _blunt(text: str) -> str:
    """Last resort if the passes never settle (not seen in testing): every character that folds to
    a bracket, an ampersand or a backslash becomes `(`, `)`, `+` or `/`, then turn prefixes are
    defanged."""
    out = []
    for ch in text:
        folded = fold_char_spelled(ch)
        if "<" in folded or "[" in folded:
            out.append("(")
        elif ">" in folded or "]" in folded:
            out.append(")")
        elif "&" in folded:
            out.append("+")
        elif "\\" in folded:
            out.append("/")
        else:
            out.append(ch)
    text = "".join(out)
    return _apply(text, _all_matches(text))


def _sanitize_name(name: str) -> str:
    cleaned = "".join(c.lower() if c.isascii() and (c.isalnum() or c == "_") else "_" for c in name[:32])
    return cleaned or "_"


def _sanitize_nonce(nonce: str) -> str:
    cleaned = "".join(c for c in nonce.lower() if c in "0123456789abcdef")[:64]
    if not cleaned:
        raise ValueError("nonce must contain hex digits")
    return cleaned


def _scrub_surrogates(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)
    return text


def _cut_utf8(text: str, max_bytes: int) -> str:
    return text.encode("utf-8")[:max_bytes].decode("utf-8", "ignore")


def wrap_result(name: str, content: str, *, nonce: str, max_bytes: int = 65536) -> str:
    """Neutralize `content`, cut it to `max_bytes` (UTF-8) if needed, and wrap it.

    A cut result ends, inside the untrusted block, with a marker giving the size in bytes of the
    content as given (before neutralization) and of what is shown.
    """
    if max_bytes < 0:
        raise ValueError("max_bytes must be >= 0")
    safe_name = _sanitize_name(name)
    safe_nonce = _sanitize_nonce(nonce)
    content = _scrub_surrogates(content)
    full = len(content.encode("utf-8"))
    precut = _PRECUT_FACTOR * max_bytes + _PRECUT_SLACK
    body = neutralize(_cut_utf8(content, precut) if full > precut else content)
    if full > max_bytes or len(body.encode("utf-8")) > max_bytes:
        kept = _cut_utf8(body, max_bytes)
        # A cut can complete a reference that the full text did not have: `<s&gtdot;` is inert,
        # `<s&gt` is `<s>`. Defang again and re-cut; the loop settles at once in practice.
        for _ in range(_MAX_PASSES):
            if not find_live_markup(kept):
                break
            kept = _cut_utf8(neutralize(kept), max_bytes)
        else:
            kept = ""
        marker = TRUNCATION_MARKER.format(full=full, kept=len(kept.encode("utf-8")))
        body = kept + marker
    return (
        f'<tool_result name="{safe_name}" nonce="{safe_nonce}">'
        f"<untrusted_input>{body}</untrusted_input></tool_result>"
    )


def wrap_refusal(
    name: str,
    reason: str,
    *,
    nonce: str,
    detail: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """A refusal in the same envelope: compact JSON ``{"refused": true, "reason": …, "detail": …}``.

    `detail` is omitted when None, and shortened (ending in ``…``) past 2,048 characters so the
    body never reaches the result cut and stays valid JSON. Keys of `extra` follow, and never
    override ``refused``, ``reason`` or a given ``detail``. Values JSON cannot encode are
    rendered with ``str``.
    """
    body: dict[str, Any] = {"refused": True, "reason": reason}
    if detail is not None:
        body["detail"] = detail if len(detail) <= _MAX_DETAIL_CHARS else detail[:_MAX_DETAIL_CHARS] + "…"
    for key, value in (extra or {}).items():
        body.setdefault(str(key), value)
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=str)
    return wrap_result(name, text, nonce=nonce)
