"""A finished worker turn as an `Answer`, and the answers made for providers never asked."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

from conclave.core.errors import BreakerOpen, DeadlineExceeded, MissingApiKey, ProviderError, ProviderTimeout
from conclave.core.messages import Message
from conclave.deliberation.results import Answer, Totals
from conclave.obs.redact import Redactor
from conclave.schema.config import Config
from conclave.worker.loop import WorkerOutcome


def answer_from(outcome: WorkerOutcome, name: str, config: Config, redactor: Redactor) -> Answer:
    """The turn's answer; a provider failure, an empty reply or a bug becomes a status."""
    model = outcome.model or config.providers[name].model
    if outcome.failure is not None:  # a bug must cost one answer, not the whole call
        exc = outcome.failure
        message = redactor.text(f"{type(exc).__name__}: {exc}")
        failed = _error("internal_error", message)
        configured = config.providers[name].model
        return Answer(name, configured, "error", error=failed, tool_mode=outcome.tool_mode)
    status: str = "ok"
    text: str | None = outcome.text
    error: dict[str, Any] | None = None
    if outcome.error is not None:
        status, text, error = status_of(outcome.error), None, outcome.error.to_dict()
    elif not outcome.text.strip():
        message = f"the model returned no text (finish_reason: {outcome.finish_reason})"
        status, text, error = "error", None, _error("empty_completion", message)
    return Answer(
        provider=name,
        model=model,
        status=status,
        text=text,
        error=error,
        finish_reason=outcome.finish_reason if outcome.hops else None,
        usage=outcome.usage,
        latency_ms=outcome.latency_ms,
        ttft_ms=outcome.ttft_ms,
        hops=outcome.hops,
        warnings=tuple(outcome.warnings),
        inner_tool_calls=tuple(outcome.inner_tool_calls),
        cost_cap=outcome.cost_cap,
        tool_mode=outcome.tool_mode,
        exchanges=tuple(outcome.exchanges),
    )


def combined(first: Answer, second: Answer) -> Answer:
    """Two attempts at one answer (a reply, then the reply to a re-prompt) as one: the second's
    outcome, both attempts' costs."""
    spent = [a for a in (first, second) if a.hops > 0]
    return replace(
        second,
        usage=Totals.of(spent).usage,
        hops=first.hops + second.hops,
        latency_ms=first.latency_ms + second.latency_ms,
        ttft_ms=first.ttft_ms if first.ttft_ms is not None else second.ttft_ms,
        inner_tool_calls=first.inner_tool_calls + second.inner_tool_calls,
        cost_cap=first.cost_cap,
        exchanges=first.exchanges + second.exchanges,
        warnings=tuple(dict.fromkeys(first.warnings + second.warnings)),
        text=second.text if second.ok else None,
    )


MAX_ECHO_CHARS = 20_000  # of an invalid reply, quoted back in the re-prompt
A = TypeVar("A", bound=Answer)
Found = tuple[dict[str, Any] | None, str | None]  # (the object a reply holds, or None with why)


async def asked_twice(
    first: A,
    messages: tuple[Message, ...],
    *,
    parse: Callable[[str], Found],
    reprompt: Callable[[str], str],
    again: Callable[[tuple[Message, ...]], Awaitable[Answer]],
    merge: Callable[[A, Answer], A],
    invalid: Callable[[A, int, str, bool], None],
) -> tuple[A, dict[str, Any] | None, str]:
    """The object `parse` finds in `first`'s reply, else in the reply to one re-prompt quoting the
    reply and its error (`again`, given the conversation): (the answer, both attempts merged when
    there were two; the object or None; the last error). `invalid` hears of each invalid reply
    (its answer, the attempt, the error, whether it was the last)."""
    found, error = parse(first.text or "")
    if found is not None:
        return first, found, ""
    error = error or "invalid reply"
    invalid(first, 1, error, False)
    echoed = (first.text or "")[:MAX_ECHO_CHARS]  # a huge bad reply is not worth paying for twice
    retry = (*messages, Message("assistant", echoed), Message("user", reprompt(error)))
    second = merge(first, await again(retry))
    if not second.ok:
        return second, None, error
    found, error = parse(second.text or "")
    if found is not None:
        return second, found, ""
    error = error or "invalid reply"
    invalid(second, 2, error, True)
    return second, None, error


# A call that failed for good: asking again cannot cure it, another provider may
# (docs/tools.md#member-fallbacks). The errors a retry may fix (server errors, timeouts, rate
# limits that refill) are retried by the client and carry none of these codes.
FAILED_FOR_GOOD = frozenset(
    {
        "auth_error",  # 401, or a key the provider calls invalid (Gemini answers 400)
        "permission_denied",  # 403: the key may not use this model
        "insufficient_quota",  # 402 (Anthropic's billing_error), OpenAI's 429 insufficient_quota
        "quota_exhausted",  # a 429 whose quota does not refill soon (Gemini's per-day quota)
        "not_found",  # 404: no such model
        "breaker_open",  # the provider failed too often, moments ago
        "missing_api_key",  # its key is not set
    }
)


def failed_for_good(answer: Answer) -> bool:
    return answer.status != "ok" and answer.error_code in FAILED_FOR_GOOD


def status_of(exc: ProviderError) -> str:
    if isinstance(exc, MissingApiKey):
        return "skipped"
    if isinstance(exc, BreakerOpen):
        return "breaker_open"
    if isinstance(exc, DeadlineExceeded | ProviderTimeout):
        return "timeout"
    return "error"


def skipped(name: str, code: str, message: str) -> Answer:
    return Answer(name, None, "skipped", error=_error(code, message))


def timed_out(name: str, model: str | None, elapsed_ms: float) -> Answer:
    error = _error("deadline_exceeded", "no answer before the call's deadline")
    return Answer(name, model, "timeout", error=error, latency_ms=elapsed_ms)


def late(name: str, model: str | None, elapsed_ms: float) -> Answer:
    """A member stopped once the call's quorum had answered and its grace period ran out."""
    error = _error("late", "stopped: the quorum had answered and the grace period ran out")
    return Answer(name, model, "late", error=error, latency_ms=elapsed_ms)


def unknown_provider(name: str, config: Config) -> Answer:
    known = ", ".join(config.providers)
    return skipped(name, "unknown_provider", f"provider {name!r} is not configured; known: {known}")


def _error(code: str, message: str) -> dict[str, str]:
    return {"code": code, "message": message}
