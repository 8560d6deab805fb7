"""Secret redaction, applied to everything that leaves the process: events, errors, transcripts.

Two nets: every configured key value is replaced wherever it appears, and well-known
credential shapes (bearer tokens, `sk-…`, Google `AIza…`) are replaced even when the key
was never configured here (a provider may echo back a key it was sent by someone else).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, quote_plus

from conclave.obs._secret_scan import Needles, SecretSieve, contains_any

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


# Every sensitive name ends in one of these (tests/test_secrets.py holds them to it), so a few
# substring checks of lowered JSON rule out a sensitive field before the regex runs.
_SENSITIVE_NAME_ENDS = Needles((b'key"', b'authorization"', b'cookie"'))

# The credential shapes' fixed parts: bearer, sk-, AIza, xai-, key=. Substring checks are far
# cheaper than the alternation regex, which runs only on a hit. Checked on ASCII-lowered bytes
# too: still a superset of the regex's matches, since its case-sensitive parts only match ASCII
# and no non-ASCII character matches a letter of `bearer` case-insensitively.
_CREDENTIAL_TRIGGERS = ("bearer", "sk-", "aiza", "xai-", "key=")
_CREDENTIAL_PARTS = Needles(trigger.encode("ascii") for trigger in _CREDENTIAL_TRIGGERS)


class Redactor:
    """Replaces known secret values and credential-shaped strings with a marker."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Each key in every spelling a provider may echo it back in (`spellings`), longest first
        # so a key that contains another is replaced whole; short values (< 8 chars) would
        # redact ordinary words and are not real keys anyway.
        forms = {form for s in secrets if len(s) >= 8 for form in spellings(s)}
        self._secrets = sorted(forms, key=len, reverse=True)
        # orjson writes non-ASCII text as UTF-8, unescaped: a key appears in JSON as these bytes.
        self._sieve = SecretSieve([form.encode("utf-8") for form in self._secrets])

    def text(self, value: str) -> str:
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, REDACTED)
        if not contains_any(value.lower(), _CREDENTIAL_TRIGGERS):
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
        or a credential is decoded for `text`, since every extra pass is paid on every line.
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
