"""What a streamed chat completion is made of (docs/openai-endpoint.md#streaming): the
synthesizer's prose as it is written, and the `chat.completion.chunk` events that carry it.

A synthesizer writes a JSON envelope; its `answer` is the prose the client wants. `Prose` keeps
each synthesizer's envelope text as it streams and, when asked, says what of the prose is new
since it was last asked (the CLI's own `envelope_answer` pulls the prose out of a partial
envelope). A fallback synthesizer starts a new envelope; while its prose only repeats what was
sent, nothing goes out, and once it says something else the stream of prose stops (`diverged`):
what was sent cannot be taken back. At the end, `Prose.close` reconciles it with the final
answer: the rest of it when what was sent is its beginning, else a marked replacement.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from conclave.app.render import envelope_answer
from conclave.core.messages import Delta

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keepalive\n\n"  # an SSE comment: clients ignore it, idle timers restart
REPLACED = "\n\n---\n\n*(Conclave: the draft above was replaced; the final answer follows.)*\n\n"


class Prose:
    """The synthesizer's prose, as far as it has streamed, handed out once."""

    def __init__(self) -> None:
        self._texts: dict[str, list[str]] = {}  # each synthesizer's envelope text so far, in pieces
        self._current: str | None = None  # the synthesizer heard last
        self.sent = ""
        self.diverged = False

    def hear(self, provider: str, role: str | None, delta: Delta) -> bool:
        """Keep a synthesizer's text delta; whether it was one (thinking and others' are not). A
        new model call of the synthesizer (a re-prompt) starts its text again."""
        if role != "synthesizer" or delta.kind not in ("start", "text"):
            return False
        if delta.kind == "start":
            self._texts[provider] = []
            return False
        self._texts.setdefault(provider, []).append(delta.text)
        self._current = provider
        return True

    def take(self) -> str:
        """The prose written since the last call. Joined and parsed here, once per send rather
        than once per delta: a stream's deltas arrive faster than they are sent."""
        if self.diverged or self._current is None:
            return ""
        pieces = self._texts[self._current]
        text = "".join(pieces)
        pieces[:] = [text]
        prose = envelope_answer(text)
        if prose is None or self.sent.startswith(prose):
            return ""  # not started, or (a fallback) repeating what was sent
        if not prose.startswith(self.sent):
            self.diverged = True
            return ""
        new, self.sent = prose[len(self.sent) :], prose
        return new

    def close(self, final: str) -> tuple[str, bool]:
        """What is still to send so the client ends with `final`, and whether what was streamed
        had to be replaced (the synthesizer was re-prompted, or a fallback took over, and wrote
        something else): then the final answer follows a marked break, never repeating the draft
        as if it were new."""
        if final.startswith(self.sent):
            return final[len(self.sent) :], False
        return REPLACED + final, True


@dataclass(frozen=True, slots=True)
class Chunks:
    """The `chat.completion.chunk` events of one completion, sharing its id, time and model."""

    model: str
    id: str = field(default_factory=lambda: completion_id())
    created: int = field(default_factory=lambda: int(time.time()))

    def event(self, delta: Mapping[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        return sse(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "delta": dict(delta), "logprobs": None, "finish_reason": finish}],
                **extra,
            }
        )

    def usage(self, usage: Mapping[str, Any]) -> bytes:
        """The last chunk when the client asked for `stream_options.include_usage`, as OpenAI
        sends it: no choices, the whole call's usage."""
        return sse(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": dict(usage),
            }
        )


def sse(payload: Mapping[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"
