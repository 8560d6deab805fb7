"""Wrapping tool results as untrusted data for a worker model (SPEC §4).

A tool result (a fetched page, a verify result, a refusal) goes back to the worker as

    <tool_result name="fetch" nonce="…"><untrusted_input>…</untrusted_input></tool_result>

and its content is hostile: it may try to close the envelope early, forge a new one, forge a
``<tool_call>``, or inject chat-template control tokens. Every such construct is *defanged*:
rewritten so that it stays readable but no longer matches anything a parser, a tokenizer or a
model would take for markup. Nothing is deleted.

Detection runs on a *folded view* of the text, built character by character so that every
folded character maps back to exactly one original character (or one escape):

- NFKC (fullwidth ``＜／ｕｎｔｒｕｓｔｅｄ＿ｉｎｐｕｔ＞`` becomes ASCII), with combining marks dropped
  (``≮`` is ``<`` plus a mark; ``<tóol_call>`` is ``<tool_call>``);
- invisible characters dropped: every format character (category ``Cf``: zero-width space and
  joiners, word joiner, BOM, soft hyphen, bidi controls, tag characters…), every combining mark
  (``Mn``/``Me``: the grapheme joiner U+034F, variation selectors…), Hangul fillers, U+180E;
- look-alikes folded to ASCII: ``‹ 〈 ⟨ ˂ ᐸ ❮ ❬ ❰ ⧼ ⦑`` → ``<`` (``« ⟪ ≪`` → ``<<``) and mirrors,
  ``⁅ ⟦ 〚 【 〔 ❲`` → ``[`` and mirrors, ``¦ │ ∣ ǀ`` → ``|``, ``⁄ ∕ ⧸`` → ``/``, and the Cyrillic
  and Greek letters that look Latin (``</untrusted_іnput>`` with a Cyrillic ``і``);
- escapes decoded once, since a model reads them as the characters: HTML character references
  (``&lt;``, ``&#60;``, ``&#x3c;``, ``&lsaquo;``, legacy ``&lt`` without the semicolon…) and
  backslash escapes (``\\u003c`` as Go's JSON encoder writes ``<``, ``\\x3c``, ``\\U0000003c``).

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

import html.entities
import json
import re
import secrets as _secrets
import unicodedata
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

__all__ = [
    "DEFANG_MARK",
    "find_live_markup",
    "leaks",
    "neutralize",
    "new_canary",
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
# Folding
# --------------------------------------------------------------------------------------------

_LOOKALIKES: dict[str, str] = {
    # angle brackets
    **dict.fromkeys("‹〈〈⟨˂˱ᐸ❮❬❰⧼⦑≺", "<"),
    **dict.fromkeys("›〉〉⟩˃˲ᐳ❯❭❱⧽⦒≻", ">"),
    **dict.fromkeys("«⟪≪", "<<"),
    **dict.fromkeys("»⟫≫", ">>"),
    # square brackets (the [INST] family)
    **dict.fromkeys("⁅⟦〚【〔❲〖⦋⦍⦏⟬", "["),
    **dict.fromkeys("⁆⟧〛】〕❳〗⦌⦎⦐⟭", "]"),
    # pipes of <|…|> tokens, slashes of closing tags
    **dict.fromkeys("¦│┃∣ǀ❘⏐", "|"),
    **dict.fromkeys("⁄∕⧸╱", "/"),
    # Cyrillic and Greek letters that look Latin (`</untrusted_іnput>` with a Cyrillic і)
    **dict(zip("аеорсухіјѕԁһӏ", "aeopcyxijsdhl", strict=True)),
    **dict(zip("АВЕКМНОРСТХІЈЅ", "ABEKMHOPCTXIJS", strict=True)),
    **dict(zip("οινΑΒΕΖΗΙΚΜΝΟΡΤΥΧ", "oivABEZHIKMNOPTYX", strict=True)),
    **dict(zip("ıȷɑɡ", "ijag", strict=True)),
}

# Invisible characters that are not format (Cf) or combining (Mn/Me) characters.
_EXTRA_INVISIBLE = frozenset("\u115f\u1160\u3164\uffa0\u180e\u2800")


def _is_invisible(ch: str) -> bool:
    return ch in _EXTRA_INVISIBLE or unicodedata.category(ch) in ("Cf", "Mn", "Me")


@lru_cache(maxsize=8192)
def _fold_char(ch: str) -> str:
    """The folded form of one character: NFKC with combining marks and invisibles dropped
    (`≮` is `<` plus a mark, so it folds to `<`), then look-alikes to ASCII."""
    if ch.isascii():
        return ch
    bare = "".join(c for c in unicodedata.normalize("NFKD", ch) if not _is_invisible(c))
    return "".join(_LOOKALIKES.get(c, c) for c in unicodedata.normalize("NFC", bare))


# A character reference (`&lt;`, `&#60;`, `&#x3c;`, legacy `&lt`) or a backslash escape as JSON,
# JavaScript or Python would write it (`\u003c`, `\x3c`, `\U0000003c`; Go's JSON encoder
# writes `<` as `\u003c`). A run of backslashes is taken whole so that a JSON text stays valid.
_ESCAPE = re.compile(
    r"&(?:#[xX]([0-9a-fA-F]+);?|#([0-9]+);?|([A-Za-z][A-Za-z0-9]{0,31})(;?))"
    r"|(?<!\\)\\+(?:u([0-9a-fA-F]{4})|x([0-9a-fA-F]{2})|U([0-9a-fA-F]{8}))"
)
_HTML5 = html.entities.html5


def _decode_escape(m: re.Match[str]) -> tuple[str, int] | None:
    """Decoded text of the reference or escape at `m` and how many characters it spans."""
    hex_digits, dec_digits, name, semi, u4, x2, u8 = m.groups()
    if hex_digits is not None or dec_digits is not None:
        # html.unescape applies the HTML5 rules for invalid, surrogate and out-of-range numbers.
        return html.unescape(m.group(0)), len(m.group(0))
    if name is not None:
        if semi and name + ";" in _HTML5:
            return _HTML5[name + ";"], len(m.group(0))
        # Legacy references without a semicolon (`&lt`, `&amp`): the longest known prefix.
        for k in range(len(name), 0, -1):
            if name[:k] in _HTML5:
                return _HTML5[name[:k]], 1 + k
        return None
    code = int(u4 or x2 or u8, 16)
    return (chr(code) if code <= 0x10FFFF else "\ufffd"), len(m.group(0))


class _Folded:
    """The folded view of a text, with each folded character's span in the original."""

    __slots__ = ("ends", "starts", "text")

    def __init__(self, text: str) -> None:
        if text.isascii():
            chars = text
            starts = list(range(len(text)))
            ends = list(range(1, len(text) + 1))
        else:
            parts: list[str] = []
            starts = []
            ends = []
            for i, ch in enumerate(text):
                f = _fold_char(ch)
                parts.append(f)
                starts.extend([i] * len(f))
                ends.extend([i + 1] * len(f))
            chars = "".join(parts)
        if "&" in chars or "\\" in chars:
            chars, starts, ends = _decode_escapes(chars, starts, ends)
        self.text = chars
        self.starts = starts
        self.ends = ends

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The original span of folded characters [start, end) (end > start)."""
        return self.starts[start], self.ends[end - 1]


def _decode_escapes(chars: str, starts: list[int], ends: list[int]) -> tuple[str, list[int], list[int]]:
    parts: list[str] = []
    new_starts: list[int] = []
    new_ends: list[int] = []
    pos = 0
    for m in _ESCAPE.finditer(chars):
        decoded = _decode_escape(m)
        if decoded is None:
            continue
        value, length = decoded
        a, b = m.start(), m.start() + length
        parts.append(chars[pos:a])
        new_starts.extend(starts[pos:a])
        new_ends.extend(ends[pos:a])
        folded = "".join(_fold_char(c) for c in value)
        parts.append(folded)
        new_starts.extend([starts[a]] * len(folded))
        new_ends.extend([ends[b - 1]] * len(folded))
        pos = b
    parts.append(chars[pos:])
    new_starts.extend(starts[pos:])
    new_ends.extend(ends[pos:])
    return "".join(parts), new_starts, new_ends


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


def _matches(folded: _Folded) -> list[tuple[int, int, str]]:
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


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def new_nonce() -> str:
    """A random nonce for one untrusted wrapper."""
    return _secrets.token_hex(8)


def new_canary() -> str:
    """A random canary to plant in a session's worker system prompt."""
    return "CANARY-" + _secrets.token_hex(8)


def find_live_markup(text: str) -> list[str]:
    """Every forbidden construct still live in `text`, as the matched substrings of its folded view."""
    return [m.group(0) for m in _FORBIDDEN.finditer(_Folded(text).text)]


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
        found = _matches(_Folded(text))
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
        folded = _fold_char(ch)
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
    return _apply(text, _matches(_Folded(text)))


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


def _fold_for_leaks(text: str) -> str:
    return _Folded(text).text.casefold()


def leaks(answer: str, secrets: Iterable[str]) -> list[str]:
    """The given canary/nonce strings that appear in `answer`, each once, in the order given.

    Case-insensitive, and also looked for in the folded view of the answer (NFKC, invisible
    characters stripped, look-alikes and escapes folded), so a split or disguised copy counts.
    """
    plain = answer.casefold()
    folded = _fold_for_leaks(answer)
    found: list[str] = []
    for secret in secrets:
        if not secret or secret in found:
            continue
        if secret.casefold() in plain or _fold_for_leaks(secret) in folded:
            found.append(secret)
    return found
