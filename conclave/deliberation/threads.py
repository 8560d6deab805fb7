"""Follow-ups (docs/tools.md#follow-ups): a call with `follow_up_of` continues that session's
thread, and each member is sent the thread's earlier turns as conversation history.

A thread is read back from the sessions' transcripts: each transcript names its `parent` (the
session it followed up) and its `thread_id` (the thread's first session). The store keeps the
newest transcripts of this process in memory too, so a follow-up finds a session that just ended
even while its transcript is still queued for the disk (`transcripts.fsync`), or when transcripts
are off. Replicas find each other's sessions only through a transcripts folder they share.

Each earlier turn gives a member the question as a user message, its own answer as an assistant
message (when it answered), and the synthesis, when there was one, as a user message after it:
the member reads the panel's conclusion as what the caller came back with. A member's history
keeps the newest turns that fit `follow_ups.max_history_tokens` (4 characters a token)."""

from __future__ import annotations

import glob
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from conclave.core.errors import InvalidArguments
from conclave.core.messages import Message
from conclave.core.records import record

# A session id, as every tool's `session_id` and `follow_up_of` take one (schemas/confer.input.json):
# what may name a session in a URL or a resource.
SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
CHARS_PER_TOKEN = 4
HISTORY_TRUNCATED = "history_truncated"  # the warning of an answer whose history lost its oldest turns
MAX_DEPTH = 100  # turns read back along a thread's parents, at most (a cycle cannot loop forever)
Find = Callable[[str], Mapping[str, Any] | None]  # a session's transcript by its id, if there is one
_SYNTHESIS_NOTE = "The panel's synthesis of the answers to that question:\n\n{}"


@record
class Link:
    """Where a session sits in its thread: the thread's first session, and the session it followed
    up (None for a thread's first turn, or a transcript from before threads)."""

    thread_id: str
    parent: str | None


def link_of(transcript: Mapping[str, Any]) -> Link:
    """From the transcript's own `thread_id` and `parent`, else its result's; a transcript from
    before threads is a thread of its own."""
    result = transcript.get("result")
    result = result if isinstance(result, dict) else {}
    thread = transcript.get("thread_id") or result.get("thread_id")
    parent = transcript.get("parent") or result.get("parent")
    sid = str(transcript.get("session_id"))
    return Link(thread if isinstance(thread, str) else sid, parent if isinstance(parent, str) else None)


@record
class Ancestry:
    """The transcripts a session follows up, oldest first, as far back as they can be read; and
    why they stop short of the thread's first turn: `missing` (a transcript is gone), `cycle` (the
    links loop), `limit` (MAX_DEPTH turns, the session's own included), or None."""

    transcripts: tuple[Mapping[str, Any], ...] = ()
    stopped: str | None = None


def ancestors(transcript: Mapping[str, Any], find: Find, limit: int = MAX_DEPTH) -> Ancestry:
    """Walk `transcript`'s `parent` links back, reading each with `find` (the one walk that both a
    follow-up and the page take)."""
    found: list[Mapping[str, Any]] = []
    seen = {str(transcript.get("session_id"))}
    parent = link_of(transcript).parent
    while parent is not None:
        if parent in seen or len(found) + 1 >= limit:
            return Ancestry(tuple(reversed(found)), "cycle" if parent in seen else "limit")
        seen.add(parent)
        earlier = find(parent)
        if earlier is None:
            return Ancestry(tuple(reversed(found)), "missing")
        found.append(earlier)
        parent = link_of(earlier).parent
    return Ancestry(tuple(reversed(found)))


@record
class EarlierTurn:
    """One earlier call of a thread, as its members are reminded of it."""

    session_id: str
    thread_id: str
    parent: str | None
    question: str
    answers: Mapping[str, str]  # provider -> what it said (those that answered)
    synthesis: str | None

    @classmethod
    def of(cls, transcript: Mapping[str, Any]) -> EarlierTurn:
        result = transcript.get("result") or {}
        arguments = transcript.get("arguments") or {}
        coordinate = transcript.get("tool") == "coordinate"
        link = link_of(transcript)
        return cls(
            session_id=str(transcript.get("session_id")),
            thread_id=link.thread_id,
            parent=link.parent,
            question=str(arguments.get("task" if coordinate else "question") or ""),
            answers=_role_answers(result) if coordinate else _member_answers(result),
            synthesis=_synthesis(result.get("synthesis")),
        )

    def messages_for(self, provider: str) -> list[Message]:
        said = self.answers.get(provider)
        messages = [Message("user", self.question)]
        if said is not None:
            messages.append(Message("assistant", said))
        if self.synthesis is not None:
            messages.append(Message("user", _SYNTHESIS_NOTE.format(self.synthesis)))
        return messages


@record
class Thread:
    """The thread a call follows up: its earlier turns, oldest first."""

    turns: tuple[EarlierTurn, ...]
    max_history_chars: int

    @property
    def parent(self) -> str:
        return self.turns[-1].session_id

    @property
    def thread_id(self) -> str:
        return self.turns[0].thread_id

    def history_for(self, provider: str) -> tuple[tuple[Message, ...], bool]:
        """The newest turns that fit the budget, as messages; and whether older ones were left out."""
        kept: list[list[Message]] = []
        size = 0
        for turn in reversed(self.turns):
            messages = turn.messages_for(provider)
            size += sum(len(m.content) for m in messages)
            if size > self.max_history_chars:
                break
            kept.append(messages)
        history = [m for messages in reversed(kept) for m in messages]
        return tuple(history), len(kept) < len(self.turns)


def with_history(history: Sequence[Message], messages: Sequence[Message]) -> tuple[tuple[Message, ...], int]:
    """The history, then the call's own messages, with two text messages of one speaker in a row
    made one (a synthesis note, then the next question): some wires refuse them apart. And how
    many of the messages are history alone: the prefix the thread's next call repeats."""
    earlier = _joined(history)
    # When the history's last message takes the call's first in, it is no longer history alone.
    taken_in = bool(earlier and messages) and _joinable(earlier[-1], messages[0])
    return _joined((*earlier, *messages)), len(earlier) - taken_in


def _joined(messages: Iterable[Message]) -> tuple[Message, ...]:
    joined: list[Message] = []
    for message in messages:
        last = joined[-1] if joined else None
        if last is not None and _joinable(last, message):
            joined[-1] = Message(last.role, f"{last.content}\n\n{message.content}")
        else:
            joined.append(message)
    return tuple(joined)


class ThreadStore:
    """Finds a session's transcript by id: this process's newest in memory, then the folder."""

    def __init__(self, directory: str | Path | None, *, remembered: int = 256) -> None:
        self.directory = None if directory is None else Path(directory)
        self.remembered = remembered
        self._recent: OrderedDict[str, Mapping[str, Any]] = OrderedDict()

    def remember(self, transcript: Mapping[str, Any]) -> None:
        self._recent[str(transcript["session_id"])] = transcript
        self._recent.move_to_end(str(transcript["session_id"]))
        while len(self._recent) > self.remembered:
            self._recent.popitem(last=False)

    def find(self, session_id: str) -> Mapping[str, Any] | None:
        if (found := self._recent.get(session_id)) is not None:
            return found
        path = None if self.directory is None else newest_transcript(self.directory, session_id)
        if path is None:
            return None
        try:
            loaded = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        return loaded if isinstance(loaded, dict) else None

    def thread(self, session_id: str, *, max_history_tokens: int, tool: str) -> Thread:
        """The thread `session_id` belongs to, up to it; invalid params naming the id when there is
        no such session (never asked, or its transcript is gone)."""
        first = self.find(session_id)
        if first is None:
            raise InvalidArguments(
                f"follow_up_of: no session {session_id!r} to follow up (unknown, still running, "
                "or its transcript is gone)",
                path="$.follow_up_of",
                tool=tool,
            )
        # An expired start of the thread (or a loop) ends the history there: what is known remains.
        earlier = ancestors(first, self.find).transcripts
        turns = tuple(EarlierTurn.of(transcript) for transcript in (*earlier, first))
        return Thread(turns, max_history_tokens * CHARS_PER_TOKEN)


def newest_transcript(directory: Path, session_id: str) -> Path | None:
    """`<dir>/<day>/<session>-<tool>-<time>-<n>.json`: the newest whose session part is the id,
    found by its own name (not by listing every transcript)."""
    pattern = str(directory / "*" / f"{glob.escape(session_id)}-*.json")
    exact = [p for p in map(Path, glob.glob(pattern)) if p.stem.rsplit("-", 3)[0] == session_id]
    return max(exact, key=lambda p: (p.parent.name, p.name), default=None)


def _member_answers(result: Mapping[str, Any]) -> dict[str, str]:
    answers = result.get("answers") or []
    return {a["provider"]: a["text"] for a in answers if a.get("status") == "ok" and a.get("text")}


def _role_answers(result: Mapping[str, Any]) -> dict[str, str]:
    """Each provider's last valid envelope in a debate, as the JSON it wrote."""
    said: dict[str, str] = {}
    for turn in _debate_turns(result):
        if turn.get("envelope") is not None and turn.get("role") != "synthesizer":
            said[turn["provider"]] = orjson.dumps(turn["envelope"]).decode()
    return said


def _debate_turns(result: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    for round_ in result.get("rounds") or []:
        yield round_.get("proposal") or {}
        yield from round_.get("critiques") or []


def _synthesis(synthesis: Any) -> str | None:
    envelope = synthesis.get("envelope") if isinstance(synthesis, Mapping) else None
    answer = envelope.get("answer") if isinstance(envelope, Mapping) else None
    return answer if isinstance(answer, str) and answer else None


def _joinable(first: Message, second: Message) -> bool:
    return first.role == second.role and _plain(first) and _plain(second)


def _plain(message: Message) -> bool:
    return not (message.tool_uses or message.tool_returns or message.echo is not None)
