"""A scripted in-process provider for unit tests of the layers above the adapters (the worker
loop, deliberation). It answers from a script, records every request, and prices each call
like a real adapter would. Adapters, end-to-end tests and the demo use the simulated panel."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from conclave.core.messages import Completion, CompletionRequest, Delta, DeltaListener, ToolUse, Usage


@dataclass(frozen=True, slots=True)
class ScriptedReply:
    """`tool_uses` plays a model calling tools natively (the worker loop's native mode)."""

    text: str
    finish_reason: str = "stop"
    tool_uses: tuple[ToolUse, ...] = ()


Script = str | ScriptedReply | Callable[[CompletionRequest], "str | ScriptedReply"]


class ScriptedProvider:
    """The n-th call gets `script[n-1]` (the last entry repeats). A callable entry sees the request."""

    def __init__(
        self,
        name: str,
        script: Sequence[Script],
        *,
        cost_per_call: float | None = 0.001,
        model: str = "scripted-model",
    ) -> None:
        self._name = name
        self._script = list(script)
        self._cost = cost_per_call
        self._model = model
        self.requests: list[CompletionRequest] = []

    @property
    def name(self) -> str:
        return self._name

    async def complete(
        self, request: CompletionRequest, *, deadline: float, listener: DeltaListener | None = None
    ) -> Completion:
        self.requests.append(request)
        entry = self._script[min(len(self.requests), len(self._script)) - 1]
        reply = entry(request) if callable(entry) else entry
        if isinstance(reply, str):
            reply = ScriptedReply(reply)
        if listener is not None and reply.text:
            listener(Delta("text", reply.text))  # the whole answer as one delta, as a plain call's
        prompt = sum(len(m.content) for m in request.messages) + len(request.system or "")
        usage = Usage(
            input_tokens=max(prompt // 4, 1), output_tokens=max(len(reply.text) // 4, 1), cost_usd=self._cost
        )
        return Completion(
            text=reply.text,
            finish_reason=reply.finish_reason,
            usage=usage,
            model=self._model,
            provider=self._name,
            latency_ms=1.0,
            warnings=() if self._cost is not None else ("price_unknown",),
            tool_uses=reply.tool_uses,
        )
