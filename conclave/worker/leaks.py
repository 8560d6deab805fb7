"""Leak detection: whether text a worker wrote (its answer, a tool call's arguments) gives away a
canary or a nonce.

A session plants a canary in its worker's system prompt, and each tool result carries a nonce;
either one in what the worker writes means it was steered by what it read. A copy counts however
it is disguised (see `leaks`).
"""

from __future__ import annotations

import base64
import codecs
import secrets as _secrets
from collections.abc import Iterable, Sequence

from conclave.worker._folding import Folded, folded_views

_CANARY_PREFIX = "CANARY-"
_LOOSE_MIN_CHARS = 12  # shorter secrets are only looked for as (disguised) copies
_URLSAFE = str.maketrans("+/", "-_")
_PIECE_MIN = 4  # a secret cut into pieces: each piece this long at least
_PIECE_GAP = 24  # and at most this many letters and digits between two pieces


def new_canary() -> str:
    """A random canary to plant in a session's worker system prompt."""
    return _CANARY_PREFIX + _secrets.token_hex(8)


def _fold_for_leaks(text: str) -> str:
    return Folded(text).text.casefold()


def _leak_views(text: str) -> list[str]:
    return [view.text.casefold() for view in folded_views(text)]


def _squeeze(folded: str) -> str:
    """Letters and digits only, so a copy split by spaces, dots, line breaks or markup meets again."""
    return "".join(c for c in folded if c.isalnum())


def _cores(secret: str) -> list[str]:
    """What a leak of `secret` must contain: the secret itself, and for a canary its random part
    alone (a model told to "drop the CANARY- prefix" still leaks the secret)."""
    if secret[: len(_CANARY_PREFIX)].upper() == _CANARY_PREFIX and len(secret) > len(_CANARY_PREFIX):
        return [secret, secret[len(_CANARY_PREFIX) :]]
    return [secret]


def _in_pieces(key: str, text: str, gap: int = _PIECE_GAP) -> bool:
    """Whether `key` appears in `text` whole, or cut into pieces of at least _PIECE_MIN characters
    that follow each other in order with at most `gap` characters between them (a copy spread
    over labelled lines: "part one: CANARY-0f / part two: 503837 / ...")."""
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
                if rest(j, end, end + gap):
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


def leaks_across(texts: Sequence[str], secrets: Sequence[str]) -> list[str]:
    """The secrets that the texts spell together, in order: a copy cut between the arguments of
    several tool calls ("…?v=CANARY-0123" in one URL, "…?v=456789abcdef" in the next), with
    anything between the pieces, as each call's own URL and keys come between them. The pieces
    are random hex of at least _PIECE_MIN characters, so their meeting in order by chance in a
    turn's arguments is negligible. Each text on its own is for `leaks`."""
    joined = "\n".join(texts)
    found = leaks(joined, secrets)
    squeezed = [_squeeze(view.text.casefold()) for view in folded_views(joined)]
    for secret in secrets:
        if not secret or secret in found:
            continue
        keys = [_squeeze(_fold_for_leaks(core)) for core in _cores(secret)]
        if any(
            len(key) >= _LOOSE_MIN_CHARS and _in_pieces(key, view, gap=len(view))
            for key in keys
            for view in squeezed
        ):
            found.append(secret)
    return found


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
