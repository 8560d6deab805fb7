"""Fast "may occur" scans behind redaction: cheap checks that rule text out before a regex or a
replace runs on it. Each may answer yes wrongly (the exact search that follows decides), never no.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import AnyStr

# Bytes that event lines and most prose seldom hold. A needle with one of them is searched for
# only where that byte occurs: finding one byte is a memchr, much cheaper than a substring search.
_RARE_BYTES = b"zx="

_GRAM = 8  # bytes per word: the widest unsigned integer a memoryview casts to (format "Q")


def contains_any(haystack: AnyStr, needles: Iterable[AnyStr]) -> bool:
    """Whether any needle occurs in `haystack`.

    `find`, not `in`: on bytes, `needle in haystack` first tries the needle as an integer (for
    `65 in b"A"`) and builds and discards a formatted TypeError each time.
    """
    for needle in needles:  # noqa: SIM110 -- a loop, not any(<generator>): no object per event
        if haystack.find(needle) != -1:
            return True
    return False


class Needles:
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
        if contains_any(lowered, self._ungated):
            return True
        for gate, needles in self._gated:
            if lowered.find(gate) != -1 and contains_any(lowered, needles):
                return True
        return False


class SecretSieve:
    """Whether any of many secret spellings may occur in some bytes, in one sampled pass.

    Every key has many spellings, and asking `needle in data` for each was a pass over every
    event line and transcript per spelling. Instead: an occurrence of a spelling at least `reach`
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
        return contains_any(data, self._short)
