"""Final answers that imitate the tool protocol (docs/worker-loop.md#answers-that-imitate-tool-output).

A worker that has read wrapped results, or only the hint describing them, may write a result
instead of calling the tool: a local model asked to check "17 × 23 = 391" answered with a
``<tool_result name="verify" nonce="…"><untrusted_input>…`` block of its own making, and made no
call. To whoever reads the answer next, such a block looks like a result the server vouched for.

What counts as imitation, for the three names ``tool_result``, ``untrusted_input`` and
``tool_call`` (any case; ``_``, ``-`` or spaces between the words, as neutralization matches them),
read on the folded view neutralization reads (so ``＜tool_result`` and ``&lt;tool_result`` count):

1. an opening tag with an attribute (``<tool_result name="verify" nonce="…">``), anywhere, inline
   code included: that is the envelope itself, which no explanation needs to write out;
2. a block outside inline code: an opening tag and, later, its own closing tag
   (``<untrusted_input>{"ok": true}</untrusted_input>``, ``<tool_call>{…}</tool_call>``);
3. a bare tag, opening or closing, that starts its line outside inline code (``<untrusted_input>``
   and then the data, ``</tool_result>`` on a line of its own): markup laid out as markup.

A mention is not: a lone tag inside a line of prose (``use <tool_call> tags``, ``close it with
</tool_call>``), any bare tag in inline code (`` `</untrusted_input>` ``), ``Vec<ToolCall>``. So an
answer that explains the protocol passes, and one that writes the protocol out does not.

Each imitated block runs from its opening tag to its own closing tag (nested ones counted), or to
the end of the text when it is never closed, as an unclosed echo does in `tags`; a lone closing
tag is a block of its own. A block carrying a nonce the server issued this turn is an *echo* of a
real result (the model did call the tool); any other block is *forged*.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Sequence

from conclave.core.errors import ProviderError
from conclave.core.records import record
from conclave.worker._folding import folded_views

__all__ = ["FORGED_TOOL_OUTPUT", "ForgedToolOutput", "Imitation", "find_imitation", "usable"]

FORGED_TOOL_OUTPUT = "forged_tool_output"  # the answer's warning, and the error code of one with nothing else

_KINDS = ("tool_call", "tool_result", "untrusted_input")
_TAG = re.compile(
    r"<\s*(?P<close>/\s*)?(?P<name>untrusted[\s_-]{0,4}input|tool[\s_-]{1,4}(?:result|call))(?![\w-])"
    r"(?P<rest>[^<>\n]{0,256})",
    re.IGNORECASE,
)
_ATTRIBUTE = re.compile(r"\s+[\w-]+\s*=")
_GT = re.compile(r"\s*>")
_INLINE_CODE = re.compile(r"`[^`\n]+`")  # one backtick each side, on one line: a fence never matches


class ForgedToolOutput(ProviderError):
    """The model's answer was imitated tool output and nothing else: no answer, like an empty
    completion. A ProviderError so the answer becomes an `error` with this code, as a provider
    failure does (deliberation/answers.py)."""

    code = FORGED_TOOL_OUTPUT


@record
class Imitation:
    """The imitated blocks of an answer, as spans of the original text, merged, in order."""

    spans: tuple[tuple[int, int], ...]
    kinds: tuple[str, ...]  # the tag names seen, sorted
    forged: bool  # some block carries no nonce of this turn: the model wrote it, not copied it

    def remainder(self, text: str) -> str:
        """`text` without the blocks: what is left of the answer."""
        parts, pos = [], 0
        for start, end in self.spans:
            parts.append(text[pos:start])
            pos = end
        parts.append(text[pos:])
        return "".join(parts)


@record
class _Tag:
    kind: str
    closing: bool
    attributed: bool
    start: int  # in the folded view
    end: int
    in_code: bool
    alone: bool  # imitation by itself (rules 1 and 3 of the module docstring)


def find_imitation(text: str, nonces: Sequence[str] = ()) -> Imitation | None:
    """The answer's imitated tool markup, or None when it only mentions the tags, or has none."""
    issued = [n.casefold() for n in nonces if n]

    def echoed(piece: str) -> bool:
        return any(n in piece.casefold() for n in issued)

    spans: list[tuple[int, int]] = []
    kinds: set[str] = set()
    forged = False
    for view in folded_views(text):  # the second view spells out tag characters, if any
        tags = _tags(view.text)
        for start, end, kind in _blocks(tags, len(view.text)):
            spans.append(view.span(start, end))
            kinds.add(kind)
        # An envelope whose own tag carries no nonce of the turn is forged, even inside an echo.
        forged = forged or any(not echoed(view.text[t.start : t.end]) for t in tags if t.attributed)
    if not spans:
        return None
    merged = _merged(spans)
    forged = forged or any(not echoed(text[start:end]) for start, end in merged)
    return Imitation(tuple(merged), tuple(sorted(kinds)), forged)


def usable(text: str) -> bool:
    """Whether what is left of an answer says anything: a letter or a digit."""
    return any(c.isalnum() for c in text)


def _tags(view: str) -> list[_Tag]:
    code = [m.span() for m in _INLINE_CODE.finditer(view)]  # in order, never overlapping
    code_starts = [start for start, _ in code]

    def in_code(at: int) -> bool:
        i = bisect_right(code_starts, at) - 1
        return i >= 0 and at < code[i][1]

    found = []
    for m in _TAG.finditer(view):
        closing = m.group("close") is not None
        attributed = not closing and _ATTRIBUTE.match(m.group("rest")) is not None
        # The tag runs through its attributes, or else ends with its name; then its `>`, if any.
        stop = m.end() if attributed else m.end("name")
        gt = _GT.match(view, stop)
        coded = in_code(m.start())
        line_start = view[view.rfind("\n", 0, m.start()) + 1 : m.start()].strip() == ""
        alone = attributed or (line_start and not coded)
        end = gt.end() if gt else stop
        found.append(_Tag(_kind(m.group("name")), closing, attributed, m.start(), end, coded, alone))
    return found


def _kind(name: str) -> str:
    folded = name.lower()
    if folded.startswith("untrusted"):
        return "untrusted_input"
    return "tool_result" if folded.endswith("result") else "tool_call"


def _blocks(tags: list[_Tag], length: int) -> list[tuple[int, int, str]]:
    """(start, end, kind) of each imitated block, in the folded view: an opening tag to its own
    closing tag, nested ones counted, or to the end when an opening tag that counts alone is
    never closed; a closing tag that counts alone and closes nothing is a block of its own."""
    open_: dict[str, list[_Tag]] = {kind: [] for kind in _KINDS}
    blocks: list[tuple[int, int, str]] = []
    for tag in tags:
        if not tag.closing:
            open_[tag.kind].append(tag)
        elif open_[tag.kind]:
            opener = open_[tag.kind].pop()
            if opener.alone or tag.alone or not (opener.in_code or tag.in_code):
                blocks.append((opener.start, tag.end, tag.kind))
        elif tag.alone:
            blocks.append((tag.start, tag.end, tag.kind))
    blocks += [(tag.start, length, tag.kind) for stack in open_.values() for tag in stack if tag.alone]
    return blocks


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
