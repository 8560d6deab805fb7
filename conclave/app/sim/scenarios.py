"""Scripts for the simulated panel: what each model answers, call by call.

A `Scenario` belongs to one model name. Its `rules` are checked first against the
last message of the request; otherwise the n-th call gets `replies[n-1]`, and the
last reply repeats once the list runs out. Everything here is pure and
deterministic, so the same script and the same requests always give the same answers.

`from_dict` / `to_dict` carry scenarios over the panel's HTTP control API; they
validate strictly (unknown keys, wrong types and impossible values are `ValueError`)
because a typo in a benchmark script should fail loudly, not silently fall back to
the default answer.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

Fault = Literal["malformed", "drop", "missing_fields", "empty", "stream_error", "truncated"]
FinishReason = Literal["stop", "length"]

FAULTS: frozenset[str] = frozenset(
    {"malformed", "drop", "missing_fields", "empty", "stream_error", "truncated"}
)
FINISH_REASONS: frozenset[str] = frozenset({"stop", "length"})
LAST_CHARS = 200  # how much of the last user message `{last}` quotes

_PHRASINGS = (
    "Having weighed the question, I would choose option {n}; the trade-offs favour it.",
    "On balance the evidence points to option {n}, with moderate confidence.",
    "Short answer: option {n}. The alternatives carry risks that are hard to justify.",
    "I lean towards option {n}, though a careful reviewer may reasonably disagree.",
    "My assessment favours option {n}; it is the simplest choice that fits the facts.",
)


@dataclass(frozen=True)
class NativeCall:
    """One native tool call a scripted reply makes.

    `arguments` is a JSON object, or a raw string sent as OpenAI's `function.arguments` as
    written (so a test can send a duplicate key or broken JSON); the other wires send a string
    decoded, as their own decoders would. `id` is generated where the service generates one.
    """

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    id: str | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a tool call needs a non-empty name")

    @classmethod
    def from_dict(cls, d: Any) -> NativeCall:
        _check_keys(d, "tool call", _CALL_TYPES)
        if "name" not in d:
            raise ValueError("tool call is missing field(s) ['name']")
        for key, value in d.items():
            _check_type(f"tool_call.{key}", value, _CALL_TYPES[key])
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        arguments = self.arguments if isinstance(self.arguments, str) else dict(self.arguments)
        return {"name": self.name, "arguments": arguments, "id": self.id}


@dataclass(frozen=True)
class Reply:
    """One scripted answer. The defaults give the deterministic default answer.

    `tool_calls` makes it a native tool-calling turn (with no `text`, it only calls);
    `thinking` adds the reasoning the service shows (an Anthropic thinking block with its
    signature, a Gemini thought part and a thoughtSignature), which the panel then checks comes
    back unchanged. OpenAI's Chat Completions shows no reasoning, so there it is not sent.

    `value` is the answer as a JSON object, sent as the reply's text (serialized): what the
    model answers a request for structured output, or a prompt asking for JSON. A reply gives
    `text` or `value`, not both; with neither, a request for structured output gets an object
    built from its schema (`conclave/app/sim/structured.py`).

    A `fault` breaks the answer (docs/development.md#faults): `malformed` (a body, or one frame
    of a stream, that is not JSON), `drop` (the connection cut mid-answer), `missing_fields` (a
    body or a stream without the part that carries the answer), `empty` (no text, cut by the
    limit), `truncated` (half the answer, then a clean end: a plain body cut as `malformed` cuts
    it, a stream without its closing frames), `stream_error` (half a stream, then the wire's
    in-stream error; a plain call gets that error as its response). With `stream_error`, a
    `status` other than 200 picks the error (`error_type` and `error_message` as for any
    error).
    """

    text: str | None = None
    status: int = 200
    error_type: str | None = None
    error_message: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    retry_delay: str | None = None
    quota_id: str | None = None  # Gemini: a QuotaFailure violation (`...PerDay...` is sticky)
    fault: Fault | None = None
    finish_reason: FinishReason = "stop"
    latency_ms: float | None = None
    reasoning_tokens: int = 0
    cached_tokens: int = 0
    model: str | None = None
    tool_calls: tuple[NativeCall, ...] = ()
    thinking: str | None = None
    value: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
        if self.value is not None:
            if not isinstance(self.value, Mapping):
                raise ValueError(f"reply value must be a JSON object, got {type(self.value).__name__}")
            if self.text is not None:
                raise ValueError("a reply gives text or value, not both")
            try:
                json.dumps(self.value, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"reply value must be JSON: {exc}") from None
        if not 100 <= self.status <= 599:
            raise ValueError(f"reply status must be an HTTP status (100-599), got {self.status}")
        if self.fault is not None and self.fault not in FAULTS:
            raise ValueError(f"reply fault must be one of {sorted(FAULTS)}, got {self.fault!r}")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be 'stop' or 'length', got {self.finish_reason!r}")
        for name in ("reasoning_tokens", "cached_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.latency_ms is not None and self.latency_ms < 0:
            raise ValueError(f"latency_ms must be >= 0, got {self.latency_ms}")

    @classmethod
    def from_dict(cls, d: Any) -> Reply:
        _check_keys(d, "reply", _REPLY_TYPES)
        for key, value in d.items():
            _check_type(f"reply.{key}", value, _REPLY_TYPES[key])
        headers = d.get("headers", {})
        for name, value in headers.items():
            _check_type(f"reply.headers[{name!r}]", value, (str,))
        calls = tuple(NativeCall.from_dict(c) for c in d.get("tool_calls", []))
        return cls(**{**d, "headers": dict(headers), "tool_calls": calls})

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["headers"] = dict(self.headers)
        out["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        out["value"] = None if self.value is None else json.loads(json.dumps(self.value))
        return out


@dataclass(frozen=True)
class Rule:
    """Answer `reply` whenever the last message contains `contains`."""

    contains: str
    reply: Reply

    @classmethod
    def from_dict(cls, d: Any) -> Rule:
        _check_keys(d, "rule", {"contains": (str,), "reply": (dict,)}, required=True)
        _check_type("rule.contains", d["contains"], (str,))
        return cls(contains=d["contains"], reply=Reply.from_dict(d["reply"]))

    def to_dict(self) -> dict[str, Any]:
        return {"contains": self.contains, "reply": self.reply.to_dict()}


@dataclass(frozen=True)
class Scenario:
    """The script of one model: rules first, then replies in call order.

    `rejects_tools` plays a model served without tool support: any request declaring tools is
    a 400 saying so, as OpenAI-compatible servers answer, and consumes no step of the script.
    `rejects_stream` plays a server without streaming in the same way: a streamed request is
    refused (a 400 saying streaming is not supported; Gemini: a 404 for `streamGenerateContent`),
    and a plain one is answered.
    """

    replies: tuple[Reply, ...] = ()
    rules: tuple[Rule, ...] = ()
    latency_ms: float | None = None
    rejects_tools: bool = False
    rejects_stream: bool = False

    def __post_init__(self) -> None:
        # Accept lists from callers but store tuples, so a script cannot change under the panel.
        object.__setattr__(self, "replies", tuple(self.replies))
        object.__setattr__(self, "rules", tuple(self.rules))
        if self.latency_ms is not None and self.latency_ms < 0:
            raise ValueError(f"latency_ms must be >= 0, got {self.latency_ms}")

    @classmethod
    def from_dict(cls, d: Any) -> Scenario:
        types = {
            "replies": (list,),
            "rules": (list,),
            "latency_ms": _NUMBER_OR_NONE,
            "rejects_tools": (bool,),
            "rejects_stream": (bool,),
        }
        _check_keys(d, "scenario", types)
        for key, value in d.items():
            _check_type(f"scenario.{key}", value, types[key])
        return cls(
            replies=tuple(Reply.from_dict(r) for r in d.get("replies", [])),
            rules=tuple(Rule.from_dict(r) for r in d.get("rules", [])),
            latency_ms=d.get("latency_ms"),
            rejects_tools=d.get("rejects_tools", False),
            rejects_stream=d.get("rejects_stream", False),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "replies": [r.to_dict() for r in self.replies],
            "rules": [r.to_dict() for r in self.rules],
            "latency_ms": self.latency_ms,
            "rejects_tools": self.rejects_tools,
            "rejects_stream": self.rejects_stream,
        }


def choose_reply(scenario: Scenario | None, call: int, last_text: str) -> Reply | None:
    """The scripted reply for the `call`-th call (1-based), or None for the default answer."""
    if scenario is None:
        return None
    for rule in scenario.rules:
        if rule.contains in last_text:
            return rule.reply
    if not scenario.replies:
        return None
    return scenario.replies[min(call, len(scenario.replies)) - 1]


def resolve_latency_ms(reply: Reply | None, scenario: Scenario | None, panel_ms: float) -> float:
    """The most specific latency wins: reply, then scenario, then the panel's."""
    if reply is not None and reply.latency_ms is not None:
        return reply.latency_ms
    if scenario is not None and scenario.latency_ms is not None:
        return scenario.latency_ms
    return panel_ms


def render_text(template: str, *, model: str, call: int, last_user_text: str) -> str:
    """Fill `{last}`, `{model}` and `{call}`.

    Plain replacement rather than `str.format`: scripted replies are often JSON
    envelopes or `<tool_call>` tags whose braces must pass through untouched.
    """
    return (
        template.replace("{last}", last_user_text[:LAST_CHARS])
        .replace("{model}", model)
        .replace("{call}", str(call))
    )


def default_answer(model: str, last_user_text: str) -> str:
    """A labelled, deterministic answer: the same message always gets the same sentence."""
    digest = hashlib.sha256(last_user_text.encode("utf-8")).digest()
    phrasing = _PHRASINGS[digest[0] % len(_PHRASINGS)]
    sentence = phrasing.format(n=digest[1] % 4 + 1)
    return f"[simulated {model}] {sentence} (ref {digest[2:5].hex()})"


_NUMBER_OR_NONE: tuple[type, ...] = (int, float, type(None))
_STR_OR_NONE: tuple[type, ...] = (str, type(None))
_REPLY_TYPES: dict[str, tuple[type, ...]] = {
    "text": _STR_OR_NONE,
    "status": (int,),
    "error_type": _STR_OR_NONE,
    "error_message": _STR_OR_NONE,
    "headers": (dict,),
    "retry_delay": _STR_OR_NONE,
    "quota_id": _STR_OR_NONE,
    "fault": _STR_OR_NONE,
    "finish_reason": (str,),
    "latency_ms": _NUMBER_OR_NONE,
    "reasoning_tokens": (int,),
    "cached_tokens": (int,),
    "model": _STR_OR_NONE,
    "tool_calls": (list,),
    "thinking": _STR_OR_NONE,
    "value": (dict, type(None)),
}
_CALL_TYPES: dict[str, tuple[type, ...]] = {"name": (str,), "arguments": (dict, str), "id": _STR_OR_NONE}


def _check_keys(d: Any, what: str, allowed: Mapping[str, object], *, required: bool = False) -> None:
    if not isinstance(d, dict):
        raise ValueError(f"{what} must be a JSON object, got {type(d).__name__}")
    unknown = sorted(set(d) - set(allowed))
    if unknown:
        raise ValueError(f"unknown {what} field(s) {unknown}; allowed: {sorted(allowed)}")
    missing = sorted(set(allowed) - set(d)) if required else []
    if missing:
        raise ValueError(f"{what} is missing field(s) {missing}")


def _check_type(where: str, value: Any, types: tuple[type, ...]) -> None:
    # bool is an int to Python but never a valid count or status in a script.
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
        names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        raise ValueError(f"{where} must be {names}, got {value!r}")
