"""A `tools/call`'s progress notifications, when the client gave a `progressToken`
(docs/server.md#mcp-both-eras): one per finished answer ("critic beta: ok"), a heartbeat naming who
is still awaited, and, while answers stream in, how far each one is ("alpha: 180 tokens, critic
beta: 95 tokens") at most once every `interval` seconds for the whole call.

`progress` only grows: each finished answer adds 1, and each heartbeat or token report a
thousandth (never reaching the next whole number). Token counts (about four characters of text,
thinking or tool-call arguments each) never decrease: a member asked again keeps counting.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, TypeVar

import anyio

from conclave.app.beside import running_beside
from conclave.core.messages import Delta

Send = Callable[[Any], Awaitable[None]]
T = TypeVar("T")
INTERVAL_SECONDS: Final = 0.5


class CallProgress:
    """The notifications of one call: `step` is its ProgressSink, `heard` its DeltaSink, and
    `around(call)` runs the call while streamed counts are sent."""

    def __init__(self, token: str | int, send: Send, *, interval: float = INTERVAL_SECONDS) -> None:
        self._token = token
        self._send = send
        self._interval = interval
        self._answered = 0
        self._beats = 0
        self._chars: dict[str, int] = {}
        self._changed = False

    @classmethod
    def of(cls, params: Mapping[str, Any], send: Send) -> CallProgress | None:
        meta = params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        if not isinstance(token, str | int) or isinstance(token, bool):
            return None
        return cls(token, send)

    async def step(self, step: Mapping[str, Any]) -> None:
        if "waiting" in step:  # a heartbeat: progress must still grow, so by a thousandth
            await self._note(self._beat(), f"still waiting for {', '.join(step['waiting'])}")
            return
        self._answered, self._beats = self._answered + 1, 0
        who = step.get("role") or "answer"
        note = {"progress": self._answered, "message": f"{who} {step.get('provider')}: {step.get('status')}"}
        if step.get("total"):
            note["total"] = step["total"]
        await self._send_note(note)

    def heard(self, provider: str, role: str | None, delta: Delta) -> None:
        if not delta.text:  # a stream's start (or an empty piece) changes no count
            return
        label = f"{role} {provider}" if role else provider
        self._chars[label] = self._chars.get(label, 0) + len(delta.text)
        self._changed = True

    async def around(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call()`, with the streamed counts reported while it runs. Its own exception comes out
        as it is (an RpcError must stay one), not wrapped in the task group's ExceptionGroup."""
        async with running_beside(self._report_forever):
            return await call()

    async def _report_forever(self) -> None:
        while True:
            await anyio.sleep(self._interval)
            if self._changed:
                self._changed = False
                counts = ", ".join(
                    f"{label}: {-(-chars // 4)} tokens" for label, chars in self._chars.items()
                )
                await self._note(self._beat(), counts)

    def _beat(self) -> float:
        self._beats += 1
        return self._answered + min(self._beats, 999) / 1000

    async def _note(self, progress: float, message: str) -> None:
        await self._send_note({"progress": progress, "message": message})

    async def _send_note(self, note: dict[str, Any]) -> None:
        params = {"progressToken": self._token, **note}
        await self._send({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})
