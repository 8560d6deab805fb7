"""The folded view of a text: what a model reads in it, with each character's origin kept.

Forbidden markup (`untrusted`) is matched, and leaked secrets (`leaks`) are looked for, on this view,
so that a disguised copy counts as the plain one. Its rules are drawn in `untrusted`'s docstring:
NFKC with invisible characters and combining marks dropped, look-alikes folded to ASCII, tag
characters spelled out in a second view, HTML references and backslash escapes decoded once. Every
folded character maps back to exactly one original character (or one escape), so a match in the
view is a span of the original.
"""

from __future__ import annotations

import html.entities
import re
import unicodedata
from collections.abc import Callable
from functools import lru_cache

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


def fold_char_spelled(ch: str) -> str:
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


class Folded:
    """The folded view of a text, with each folded character's span in the original."""

    __slots__ = ("ends", "starts", "text")

    def __init__(self, text: str, *, spell_tags: bool = False) -> None:
        fold = fold_char_spelled if spell_tags else _fold_char
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


def folded_views(text: str) -> list[Folded]:
    """The folded view, plus the view with tag characters spelled out when the text has any."""
    views = [Folded(text)]
    if not text.isascii() and _TAG_ASCII.search(text):
        views.append(Folded(text, spell_tags=True))
    return views
