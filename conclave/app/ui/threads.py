"""A session's thread as its page shows it: the turns before it, oldest first, as one
conversation (each turn's question, the first lines of each member's answer, the synthesis),
and the sessions that followed it up (docs/tools.md#follow-ups).

The turns are read back along the transcripts' `parent` links (`Sessions.earlier`, at most
MAX_DEPTH turns); each earlier turn is only a summary here, its whole deliberation is on its
own page. Like `model`, this reads defensively and renders nothing: `pages` does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from conclave.app.ui.model import SessionView, Turn, from_transcript
from conclave.app.ui.sessions import Earlier, Sessions, SessionSummary
from conclave.deliberation.threads import link_of

EXCERPT_LINES = 4  # of an earlier answer: enough to recall it, the whole is a link away
EXCERPT_CHARS = 400
_MAIN_FIELDS = ("answer", "proposal", "summary")  # an envelope's main text, by role


@dataclass(frozen=True, slots=True)
class Excerpt:
    """The first lines of one member's answer in an earlier turn (`cut` when there is more)."""

    provider: str
    role: str | None
    status: str
    text: str | None
    cut: bool = False


@dataclass(frozen=True, slots=True)
class ThreadTurn:
    """One earlier turn: what was asked, what each member said, and the synthesis if any."""

    session_id: str
    tool: str
    question: str | None
    answers: tuple[Excerpt, ...]
    synthesis: Excerpt | None


@dataclass(frozen=True, slots=True)
class Thread:
    """The thread around one session: the turns before it, why they stop short of the thread's
    first turn (None when they reach it; see `Earlier`), and its follow-ups, oldest first."""

    thread_id: str
    earlier: tuple[ThreadTurn, ...]
    stopped: str | None
    follow_ups: tuple[str, ...]

    @property
    def number(self) -> int | None:
        """This session's turn in the thread, when every earlier turn is known."""
        return len(self.earlier) + 1 if self.stopped is None else None


def thread_of(sessions: Sessions, transcript: Mapping[str, Any]) -> Thread | None:
    """The thread of the session of `transcript`; None for a session nobody followed up that
    followed up nothing."""
    link = link_of(transcript)
    follow_ups = tuple(sessions.follow_ups(str(transcript.get("session_id"))))
    if link.parent is None and not follow_ups:
        return None
    earlier = sessions.earlier(transcript) if link.parent is not None else Earlier()
    turns = tuple(thread_turn(summary, body) for summary, body in earlier.turns)
    return Thread(link.thread_id, turns, earlier.stopped, follow_ups)


def thread_turn(summary: SessionSummary, transcript: Mapping[str, Any]) -> ThreadTurn:
    view = from_transcript(summary, transcript)
    return ThreadTurn(
        session_id=summary.session_id,
        tool=summary.tool,
        question=view.question,
        answers=tuple(excerpt(t) for t in _members(view)),
        synthesis=excerpt(view.synthesis) if view.synthesis is not None else None,
    )


def _members(view: SessionView) -> tuple[Turn, ...]:
    """A confer's answers; a debate's last round, its proposal then its critiques."""
    if view.answers or not view.rounds:
        return view.answers
    last = view.rounds[-1]
    return (last.proposal, *last.critiques) if last.proposal is not None else last.critiques


def excerpt(turn: Turn) -> Excerpt:
    text = _words(turn)
    if text is None:
        return Excerpt(turn.provider, turn.role, turn.status, None)
    head, cut = first_lines(text)
    return Excerpt(turn.provider, turn.role, turn.status, head, cut)


def _words(turn: Turn) -> str | None:
    """What a turn said, as text: a structured answer's object, a role's main field (or its
    whole envelope), else its text."""
    if turn.value is not None:
        return json.dumps(turn.value, ensure_ascii=False, default=str)
    if turn.envelope is not None:
        main = next((v for k in _MAIN_FIELDS if isinstance(v := turn.envelope.get(k), str)), None)
        return main if main is not None else json.dumps(turn.envelope, ensure_ascii=False, default=str)
    return turn.text or None


def first_lines(text: str, lines: int = EXCERPT_LINES, chars: int = EXCERPT_CHARS) -> tuple[str, bool]:
    """The first `lines` lines of `text`, at most `chars` characters, marked `…` when cut."""
    kept = text.strip().splitlines()
    head = "\n".join(kept[:lines])
    cut = len(kept) > lines or len(head) > chars
    head = head[:chars].rstrip()
    return (head + "…", True) if cut else (head, False)
