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
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from conclave.core.errors import InvalidArguments
from conclave.core.messages import Message
from conclave.core.records import record

CHARS_PER_TOKEN = 4
HISTORY_TRUNCATED = "history_truncated"  # the warning of an answer whose history lost its oldest turns
MAX_DEPTH = 100  # turns read back along a thread's parents, at most (a cycle cannot loop forever)
_SYNTHESIS_NOTE = "The panel's synthesis of the answers to that question:\n\n{}"


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
        session_id = str(transcript.get("session_id"))
        coordinate = transcript.get("tool") == "coordinate"
        return cls(
            session_id=session_id,
            thread_id=str(result.get("thread_id") or session_id),
            parent=result.get("parent"),
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
    joined = _joined((*history, *messages))
    repeated = len(_joined(history))
    if messages and len(joined) < repeated + len(messages):  # the last of the history took the question in
        repeated -= 1
    return joined, repeated


def _joined(messages: Iterable[Message]) -> tuple[Message, ...]:
    joined: list[Message] = []
    for message in messages:
        last = joined[-1] if joined else None
        if last is not None and last.role == message.role and _plain(last) and _plain(message):
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
        path = self._newest_file(session_id)
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
        turns = [EarlierTurn.of(first)]
        seen = {session_id}
        while (parent := turns[-1].parent) and parent not in seen and len(turns) < MAX_DEPTH:
            seen.add(parent)
            earlier = self.find(parent)
            if earlier is None:  # an expired start of the thread: the turns still known remain
                break
            turns.append(EarlierTurn.of(earlier))
        return Thread(tuple(reversed(turns)), max_history_tokens * CHARS_PER_TOKEN)

    def _newest_file(self, session_id: str) -> Path | None:
        """`<dir>/<day>/<session>-<tool>-<time>-<n>.json`: the newest whose session part is the id."""
        if self.directory is None or not self.directory.is_dir():
            return None
        pattern = str(self.directory / "*" / f"{glob.escape(session_id)}-*.json")
        named = [Path(p) for p in glob.glob(pattern)]
        exact = [p for p in named if p.stem.rsplit("-", 3)[0] == session_id]
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


def _plain(message: Message) -> bool:
    return not (message.tool_uses or message.tool_returns or message.echo is not None)
