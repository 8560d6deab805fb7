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

import base64
import codecs
import html.entities
import json
import re
import secrets as _secrets
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
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
_CANARY_PREFIX = "CANARY-"
_LOOSE_MIN_CHARS = 12  # shorter secrets are only looked for as (disguised) copies
_URLSAFE = str.maketrans("+/", "-_")
_PIECE_MIN = 4  # a secret cut into pieces: each piece this long at least
_PIECE_GAP = 24  # and at most this many letters and digits between two pieces
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
# Unicode tag characters U+E0020-U+E007E mirror printable ASCII invisibly ("ASCII smuggling"). They
# are invisible, so they can split a token (`</untru<tag A>sted_input>`), and a model reads them, so
# they can spell one (`<tag <><tag />...`): text holding any is matched in both views.
_TAG_ASCII_FIRST, _TAG_ASCII_LAST = 0xE0020, 0xE007E
_TAG_ASCII = re.compile("[\U000e0020-\U000e007e]")


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


def _fold_char_spelled(ch: str) -> str:
    """`_fold_char`, except that a tag character folds to the ASCII character it mirrors."""
    code = ord(ch)
    return chr(code - 0xE0000) if _TAG_ASCII_FIRST <= code <= _TAG_ASCII_LAST else _fold_char(ch)


# A character reference (`&lt;`, `&#60;`, `&#x3c;`, legacy `&lt`) or a backslash escape as JSON,
# JavaScript or Python would write it (`\u003c`, `\x3c`, `\U0000003c`; Go's JSON encoder
# writes `<` as `\u003c`; PHP's json_encode and many others write `/` as `\/`, so `</x>` arrives
# as `<\/x>`). A run of backslashes is taken whole so that a JSON text stays valid.
_ESCAPE = re.compile(
    r"&(?:#[xX]([0-9a-fA-F]+);?|#([0-9]+);?|([A-Za-z][A-Za-z0-9]{0,31})(;?))"
    r"|(?<!\\)\\+(?:u([0-9a-fA-F]{4})|x([0-9a-fA-F]{2})|U([0-9a-fA-F]{8})|(/))"
)
_HTML5 = html.entities.html5


def _decode_escape(m: re.Match[str]) -> tuple[str, int] | None:
    """Decoded text of the reference or escape at `m` and how many characters it spans."""
    hex_digits, dec_digits, name, semi, u4, x2, u8, slash = m.groups()
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
    if slash is not None:
        return "/", len(m.group(0))
    code = int(u4 or x2 or u8, 16)
    return (chr(code) if code <= 0x10FFFF else "\ufffd"), len(m.group(0))


class _Folded:
    """The folded view of a text, with each folded character's span in the original."""

    __slots__ = ("ends", "starts", "text")

    def __init__(self, text: str, *, spell_tags: bool = False) -> None:
        fold = _fold_char_spelled if spell_tags else _fold_char
        if text.isascii():
            chars = text
            starts = list(range(len(text)))
            ends = list(range(1, len(text) + 1))
        else:
            parts: list[str] = []
            starts = []
            ends = []
            for i, ch in enumerate(text):
                f = fold(ch)
                parts.append(f)
                starts.extend([i] * len(f))
                ends.extend([i + 1] * len(f))
            chars = "".join(parts)
        if "&" in chars or "\\" in chars:
            chars, starts, ends = _decode_escapes(chars, starts, ends, fold)
        self.text = chars
        self.starts = starts
        self.ends = ends

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The original span of folded characters [start, end) (end > start)."""
        return self.starts[start], self.ends[end - 1]


def _decode_escapes(
    chars: str, starts: list[int], ends: list[int], fold: Callable[[str], str]
) -> tuple[str, list[int], list[int]]:
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
        folded = "".join(fold(c) for c in value)
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


def _views(text: str) -> list[_Folded]:
    """The folded view, plus the view with tag characters spelled out when the text has any."""
    views = [_Folded(text)]
    if not text.isascii() and _TAG_ASCII.search(text):
        views.append(_Folded(text, spell_tags=True))
    return views


def _all_matches(text: str) -> list[tuple[int, int, str]]:
    """`_matches` over every view of `text`, overlapping spans merged."""
    views = _views(text)
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


def new_canary() -> str:
    """A random canary to plant in a session's worker system prompt."""
    return _CANARY_PREFIX + _secrets.token_hex(8)


def find_live_markup(text: str) -> list[str]:
    """Every forbidden construct still live in `text`, as the matched substrings of its folded view
    (then those that only the view with tag characters spelled out shows)."""
    views = _views(text)
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
        folded = _fold_char_spelled(ch)
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


def _fold_for_leaks(text: str) -> str:
    return _Folded(text).text.casefold()


def _leak_views(text: str) -> list[str]:
    return [view.text.casefold() for view in _views(text)]


def _squeeze(folded: str) -> str:
    """Letters and digits only, so a copy split by spaces, dots, line breaks or markup meets again."""
    return "".join(c for c in folded if c.isalnum())


def _cores(secret: str) -> list[str]:
    """What a leak of `secret` must contain: the secret itself, and for a canary its random part
    alone (a model told to "drop the CANARY- prefix" still leaks the secret)."""
    if secret[: len(_CANARY_PREFIX)].upper() == _CANARY_PREFIX and len(secret) > len(_CANARY_PREFIX):
        return [secret, secret[len(_CANARY_PREFIX) :]]
    return [secret]


def _in_pieces(key: str, text: str) -> bool:
    """Whether `key` appears in `text` whole, or cut into pieces of at least _PIECE_MIN characters
    that follow each other in order with at most _PIECE_GAP characters between them (a copy
    spread over labelled lines: "part one: CANARY-0f / part two: 503837 / ...")."""
    if key in text:
        return True
    n = len(key)
    failed: set[tuple[int, int]] = set()  # (key index, text position) already explored in vain

    def common(at: int, i: int) -> int:  # how far text[at:] and key[i:] agree
        k = 0
        while i + k < n and at + k < len(text) and text[at + k] == key[i + k]:
            k += 1
        return k

    def rest(i: int, lo: int, hi: int) -> bool:
        """Whether key[i:] follows in pieces, the first one starting in text[lo:hi]."""
        if i == n:
            return True
        seed = key[i : i + _PIECE_MIN]
        at = text.find(seed, lo, hi + len(seed))
        while at != -1:
            for j in range(i + common(at, i), i + _PIECE_MIN - 1, -1):  # longest piece first
                if 0 < n - j < _PIECE_MIN:
                    continue  # the leftover would be too short to be a piece of its own
                end = at + j - i
                if (j, end) in failed:
                    continue
                if rest(j, end, end + _PIECE_GAP):
                    return True
                failed.add((j, end))
            at = text.find(seed, at + 1, hi + len(seed))
        return False

    return rest(0, 0, len(text))


def _base64_forms(core: str) -> list[str]:
    """The stretch of base64(anything + core + anything) that depends on `core` alone, for each of
    the three byte alignments, in the standard and the URL-safe alphabet."""
    data = core.encode("utf-8")
    forms: list[str] = []
    for pad in range(3):
        encoded = base64.b64encode(bytes(pad) + data).decode("ascii")
        first, end = -(-pad * 8 // 6), (pad + len(data)) * 8 // 6  # characters made of core bits only
        forms += [encoded[first:end], encoded[first:end].translate(_URLSAFE)]
    return forms


def _leaked(secret: str, plain: str, folded: list[str], squeezed: list[str], compact: str) -> bool:
    if secret.casefold() in plain or any(_fold_for_leaks(secret) in view for view in folded):
        return True
    for core in _cores(secret):
        key = _squeeze(_fold_for_leaks(core))
        if len(key) < _LOOSE_MIN_CHARS:  # too short to look for in loose forms without false alarms
            continue
        forms = (key[::-1], codecs.encode(key, "rot13"), core.encode("utf-8").hex())
        for view in squeezed:
            if _in_pieces(key, view) or any(form in view for form in forms):
                return True
        if any(form in compact for form in _base64_forms(core)):
            return True
    return False


def leaks(answer: str, secrets: Iterable[str]) -> list[str]:
    """The given canary/nonce strings that appear in `answer`, each once, in the order given.

    Looked for case-insensitively in the answer and in its folded view (NFKC, invisible characters
    stripped, tag characters, look-alikes and escapes folded), so a disguised copy counts. Secrets
    of 12 characters or more (canaries and nonces are) are also found in the loose forms a
    compromised model uses to slip them out: split by separators (`C A N A R Y - …`, markdown) or
    cut into labelled pieces ("part one: …", one piece per line), a canary without its `CANARY-`
    prefix, reversed, ROT13, hex (or percent-encoded) bytes, and base64 at any alignment, standard
    or URL-safe, wrapped or not.
    Detection stays best-effort: a model can always launder a secret further (spelling it in
    words, say), which is why the canary is a tripwire and not a guarantee.
    """
    plain = answer.casefold()
    folded = _leak_views(answer)
    squeezed = [_squeeze(view) for view in folded]
    compact = "".join(answer.split())
    found: list[str] = []
    for secret in secrets:
        if not secret or secret in found:
            continue
        if _leaked(secret, plain, folded, squeezed, compact):
            found.append(secret)
    return found
