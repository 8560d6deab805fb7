"""Secret redaction, applied to everything that leaves the process: events, errors, transcripts.

Two nets: every configured key value is replaced wherever it appears, and well-known
credential shapes (bearer tokens, `sk-…`, Google `AIza…`) are replaced even when the key
was never configured here (a provider may echo back a key it was sent by someone else).
"""

from __future__ import annotations

import base64
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, AnyStr
from urllib.parse import quote, quote_plus

REDACTED = "[REDACTED]"
SENSITIVE_KEYS = frozenset(
    {
        "authorization",
        "x-api-key",
        "x-goog-api-key",
        "api-key",
        "api_key",
        "apikey",
        "key",
        "proxy-authorization",
        "cookie",
        "set-cookie",
    }
)
_CREDENTIAL_SHAPES = re.compile(
    r"(?i:bearer)(?:\s|\\[ntr])+[A-Za-z0-9._~+/=-]{8,}"  # whitespace, raw or JSON-escaped
    r"|\bsk-[A-Za-z0-9_-]{16,}"
    r"|\bAIza[0-9A-Za-z_-]{30,}"
    r"|\bxai-[A-Za-z0-9]{20,}"
    r"|([?&]key=)[^&\s\"'\\]+"
)


_SENSITIVE_NAMES = b"|".join(re.escape(k.encode()) for k in sorted(SENSITIVE_KEYS))
_SENSITIVE_JSON_FIELD = re.compile(
    rb'"(' + _SENSITIVE_NAMES + rb')"(\s*:\s*)"(?:[^"\\]|\\.)+"', re.IGNORECASE
)


# Every sensitive name ends in one of these (tests/test_secrets.py holds them to it), so at most
# three substring checks of lowered JSON (two, where no `z` occurs) rule out a sensitive field
# before the regex runs (one check per name cost several times more, on every event).
_NAME_ENDINGS = (b'key"', b'authorization"', b'cookie"')

# The credential shapes' fixed parts: bearer, sk-, AIza, xai-, key=. Substring checks are far
# cheaper than the alternation regex, which runs only on a hit. Checked on ASCII-lowered bytes
# too: still a superset of the regex's matches, since its case-sensitive parts only match ASCII
# and no non-ASCII character matches a letter of `bearer` case-insensitively.
_CREDENTIAL_TRIGGERS = ("bearer", "sk-", "aiza", "xai-", "key=")
_CREDENTIAL_TRIGGER_BYTES = tuple(trigger.encode("ascii") for trigger in _CREDENTIAL_TRIGGERS)

# Bytes that event lines and most prose seldom hold. A needle with one of them is searched for
# only where that byte occurs, and finding one byte is a memchr, several times cheaper than a
# substring search: a batch of event lines usually takes four substring searches, not eight.
_RARE_BYTES = b"zx="


def _contains_any(haystack: AnyStr, needles: Iterable[AnyStr]) -> bool:
    """Whether any needle occurs in `haystack`: the one pre-check behind every redaction path.

    `find`, not `in`: on bytes, `needle in haystack` first tries the needle as an integer (for
    `65 in b"A"`) and builds and discards a formatted TypeError each time: ~1,800 instructions
    per check on CPython 3.11, 76 K of a K=5 confer's 3.4 M.
    """
    for needle in needles:  # noqa: SIM110 -- a loop, not any(<generator>): no object per event
        if haystack.find(needle) != -1:
            return True
    return False


class _Needles:
    """Whether any of some needles occurs in lowered bytes, each gated by its rarest byte."""

    __slots__ = ("_gated", "_ungated")

    def __init__(self, needles: Iterable[bytes]) -> None:
        gated: dict[bytes, list[bytes]] = {}
        ungated: list[bytes] = []
        for needle in needles:
            gate = next((bytes((rare,)) for rare in _RARE_BYTES if rare in needle), None)
            if gate is None:
                ungated.append(needle)
            else:
                gated.setdefault(gate, []).append(needle)
        self._ungated = tuple(ungated)
        self._gated = tuple((gate, tuple(group)) for gate, group in gated.items())

    def occur_in(self, lowered: bytes) -> bool:
        if _contains_any(lowered, self._ungated):
            return True
        for gate, needles in self._gated:
            if lowered.find(gate) != -1 and _contains_any(lowered, needles):
                return True
        return False


_SENSITIVE_NAME_ENDS = _Needles(_NAME_ENDINGS)
_CREDENTIAL_PARTS = _Needles(_CREDENTIAL_TRIGGER_BYTES)


_GRAM = 8  # bytes per word: the widest unsigned integer a memoryview casts to (format "Q")


class _SecretSieve:
    """Whether any of many secret spellings may occur in some bytes, in one sampled pass.

    Four keys make 28 spellings; asking `needle in data` for each was a pass over every event
    line and transcript per spelling. Instead: an occurrence of a spelling at least `reach`
    bytes long contains a whole 8-byte word starting at a multiple of `stride` (the multiples
    of `stride` are `stride` apart, and the positions where such a word fits inside the
    occurrence span `reach - 7 >= stride` of them). So reading only those words of the data
    (a strided memoryview, no copy) and looking each up among every 8-byte window of every
    spelling misses no occurrence; a hit is confirmed by the exact search. Spellings too short
    for a stride of 8 keep the plain per-spelling search.
    """

    __slots__ = ("_short", "_step", "_windows")

    def __init__(self, needles: Sequence[bytes]) -> None:
        long = [needle for needle in needles if len(needle) >= 2 * _GRAM - 1]
        self._short = tuple(needle for needle in needles if len(needle) < 2 * _GRAM - 1)
        reach = min((len(needle) for needle in long), default=2 * _GRAM - 1)
        self._step = (reach - _GRAM + 1) // _GRAM  # the stride, in words
        self._windows = frozenset(
            int.from_bytes(needle[start : start + _GRAM], sys.byteorder)
            for needle in long
            for start in range(len(needle) - _GRAM + 1)
        )

    def may_occur_in(self, data: bytes) -> bool:
        if self._windows:
            whole_words = len(data) - len(data) % _GRAM
            words = memoryview(data)[:whole_words].cast("Q")[:: self._step]
            if not self._windows.isdisjoint(words):
                return True
        return _contains_any(data, self._short)


class Redactor:
    """Replaces known secret values and credential-shaped strings with a marker."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Each key in every spelling a provider may echo it back in (`spellings`), longest first
        # so a key that contains another is replaced whole; short values (< 8 chars) would
        # redact ordinary words and are not real keys anyway.
        forms = {form for s in secrets if len(s) >= 8 for form in spellings(s)}
        self._secrets = sorted(forms, key=len, reverse=True)
        # orjson writes non-ASCII text as UTF-8, unescaped: a key appears in JSON as these bytes.
        self._sieve = _SecretSieve([form.encode("utf-8") for form in self._secrets])

    def text(self, value: str) -> str:
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, REDACTED)
        if not _contains_any(value.lower(), _CREDENTIAL_TRIGGERS):
            return value  # the common case: skip the regex scan
        return _CREDENTIAL_SHAPES.sub(_mask_match, value)

    def value(self, value: Any) -> Any:
        """Redact recursively through mappings and sequences."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {k: self._field(str(k), v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        return value

    def json_bytes(self, data: bytes) -> bytes:
        """Redact serialized JSON in one pass: sensitive fields, secrets, credential shapes.

        Much cheaper than walking the value before serializing (the hot path of every event
        and transcript). API keys need no JSON escaping, so they appear in the bytes as is.
        The bytes are lowered and searched once, as bytes: only a line that may hold a secret
        or a credential is decoded for `text` (each extra pass over a transcript cost ~4 us).
        """
        lowered = data.lower()
        if _SENSITIVE_NAME_ENDS.occur_in(lowered):
            data = _SENSITIVE_JSON_FIELD.sub(rb'"\1"\2"' + REDACTED.encode() + rb'"', data)
        if not self._sieve.may_occur_in(data) and not _CREDENTIAL_PARTS.occur_in(lowered):
            return data
        text = data.decode("utf-8")
        redacted = self.text(text)
        return data if redacted is text else redacted.encode("utf-8")

    def _field(self, key: str, value: Any) -> Any:
        if key.lower() in SENSITIVE_KEYS and isinstance(value, str) and value:
            return REDACTED
        return self.value(value)


def spellings(secret: str) -> set[str]:
    """`secret` as is, URL-encoded, hex, and base64 (standard and URL-safe, with and without
    padding). Base64 also at the key's other two byte alignments, as inside a longer encoded
    blob (`Basic base64(user:key)`): the part of the encoding that depends on the key alone."""
    raw = secret.encode("utf-8")
    forms = {secret, quote(secret, safe=""), quote_plus(secret), raw.hex(), raw.hex().upper()}
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        for offset in range(3):
            encoded = encode(b"\0" * offset + raw).decode("ascii")
            if not offset:
                forms.add(encoded.rstrip("="))
            # Skip the characters mixing in the bytes before the key and the last group,
            # which mixes in whatever follows it.
            forms.add(encoded[4 if offset else 0 : -4])
    return {form for form in forms if len(form) >= 8}


def _mask_match(match: re.Match[str]) -> str:
    prefix = match.group(1)
    return f"{prefix}{REDACTED}" if prefix else REDACTED
