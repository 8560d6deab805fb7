"""The answers of running sessions, as they stream in, for listeners in this same process (the
session page when `conclave serve --http` serves it): one hub per runtime, never the event log.

Every `Session` publishes each delta of its members' answers here, besides handing it to the
delta sink its caller gave. A listener subscribes to one session's deltas, and hears them until
the session ends or it leaves:

    async with runtime.live.subscribe(session_id) as heard:
        async for item in heard:
            ...  # a `Heard(provider, role, delta)`, or a `Gap(dropped)`

Publishing never waits and never grows memory: each subscriber has a bounded buffer, and what
does not fit in it is dropped and counted, then announced by one `Gap` in the place of the items
it stands for (ahead of the next item that fits, or last). With nobody subscribed to a session,
publishing costs one dict lookup. Subscribing to a session that is not running here ends at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import anyio

from conclave.core.messages import Delta

__all__ = ["BUFFER", "Gap", "Heard", "LiveDeltas", "LiveItem"]

BUFFER = 1024  # items a subscriber may fall behind by before what follows is dropped


class Heard(NamedTuple):
    """One delta of a member's answer: who said it (role None: a panel member's answer)."""

    provider: str
    role: str | None
    delta: Delta


@dataclass(frozen=True, slots=True)
class Gap:
    """`dropped` items did not fit in the subscriber's buffer and are missing here."""

    dropped: int


LiveItem = Heard | Gap


class _Subscriber:
    __slots__ = ("dropped", "receive", "send")

    def __init__(self, buffer: int) -> None:
        # One slot beyond the buffer, so that a Gap can always be announced, even last.
        self.send, self.receive = anyio.create_memory_object_stream[LiveItem](buffer + 1)
        self.dropped = 0

    def offer(self, item: Heard, buffer: int) -> None:
        """Send without waiting, or count the item dropped; a pending Gap goes first."""
        used = self.send.statistics().current_buffer_used
        if used + (2 if self.dropped else 1) > buffer:
            self.dropped += 1
            return
        with contextlib.suppress(anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
            if self.dropped:
                self.send.send_nowait(Gap(self.dropped))
                self.dropped = 0
            self.send.send_nowait(item)

    def close(self) -> None:
        """The end of the stream, after the Gap of what was dropped last (the spare slot's)."""
        with contextlib.suppress(anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
            if self.dropped:
                self.send.send_nowait(Gap(self.dropped))
                self.dropped = 0
        self.send.close()


class LiveDeltas:
    """The hub: `publish` from the sessions, `subscribe` from the listeners; `running` says which
    sessions are running here, so a listener to another is told at once there is nothing to hear."""

    def __init__(self, *, buffer: int = BUFFER) -> None:
        if buffer < 1:
            raise ValueError(f"buffer must be >= 1, got {buffer}")
        self._buffer = buffer
        self._subscribers: dict[str, list[_Subscriber]] = {}
        self._running: dict[str, int] = {}

    def publish(self, session_id: str, provider: str, role: str | None, delta: Delta) -> None:
        """Hand `delta` to every subscriber of `session_id`, never waiting."""
        subscribers = self._subscribers.get(session_id)
        if not subscribers:
            return
        item = Heard(provider, role, delta)
        for subscriber in subscribers:
            subscriber.offer(item, self._buffer)

    def is_running(self, session_id: str) -> bool:
        return session_id in self._running

    @contextlib.contextmanager
    def running(self, session_id: str) -> Iterator[None]:
        """While `session_id` runs here; when it ends, each of its subscribers' streams ends."""
        self._running[session_id] = self._running.get(session_id, 0) + 1
        try:
            yield
        finally:
            left = self._running.pop(session_id) - 1
            if left:
                self._running[session_id] = left
            else:
                for subscriber in self._subscribers.pop(session_id, ()):
                    subscriber.close()

    @contextlib.asynccontextmanager
    async def subscribe(self, session_id: str) -> AsyncIterator[AsyncIterator[LiveItem]]:
        """`session_id`'s deltas from now on, in order, until it ends (at once, when it is not
        running here); unsubscribed on leaving."""
        subscriber = _Subscriber(self._buffer)
        if session_id in self._running:
            self._subscribers.setdefault(session_id, []).append(subscriber)
        else:
            subscriber.close()
        try:
            with subscriber.receive:
                yield subscriber.receive
        finally:
            self._unsubscribe(session_id, subscriber)

    def subscribers(self, session_id: str) -> int:
        """How many listen to `session_id` (for tests and diagnostics)."""
        return len(self._subscribers.get(session_id, ()))

    def _unsubscribe(self, session_id: str, subscriber: _Subscriber) -> None:
        subscribers = self._subscribers.get(session_id)
        if subscribers is not None and subscriber in subscribers:
            subscribers.remove(subscriber)
            if not subscribers:
                del self._subscribers[session_id]
        subscriber.send.close()
