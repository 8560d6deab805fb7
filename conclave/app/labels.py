"""Plain words for the codes a result carries, so people read "timed out", not `timeout`.

A result names what went wrong in codes (`degraded_reasons[].status` and `.code`, an answer's
`warnings`, a result's `warnings`): stable strings for programs. Whoever shows them to a person
(the page of `conclave ui`; the CLI renderer can import the same) turns them into words here,
in one table, and keeps the code itself beside the words for whoever searches the docs or the
event log for it. A code this table does not know still reads as words (its underscores as
spaces), never as nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# An answer's status and the error code beside it (`degraded_reasons[]`, `fallback_from`,
# `error.code`); the codes come from conclave/core/errors.py and conclave/deliberation/.
DEGRADED_LABELS: Mapping[str, str] = {
    "timeout": "timed out",
    "late": "stopped: no answer within the grace period after the quorum answered",
    "deadline_exceeded": "no answer before the call's deadline",
    "error": "failed",
    "skipped": "skipped",
    "breaker_open": "skipped: its circuit breaker is open after repeated failures",
    "invalid_envelope": "answered in the wrong format, even when asked again",
    "invalid_answer": "gave no answer valid against the answer schema, even when asked again",
    "missing_api_key": "no API key is configured for it",
    "unknown_provider": "not a configured provider",
    "no_answers": "nothing to synthesize: no member answered",
    "no_proposal": "nothing to synthesize: no valid proposal",
    "rate_limited": "rate-limited by the provider",
    "server_error": "the provider's server failed",
    "connection_error": "the provider could not be reached",
    "bad_request": "the provider refused the request",
    "malformed_response": "the provider's reply could not be read",
    "empty_completion": "the model returned no text",
    "provider_error": "the provider failed",
    "internal_error": "an internal error in Conclave",
    "cancelled": "cancelled",
    "forged_tool_output": "answered only with imitated tool output",
    "auth_error": "its API key was refused",
    "permission_denied": "its API key may not use this model",
    "insufficient_quota": "its account is out of credit or quota",
    "quota_exhausted": "its quota is used up for now",
    "not_found": "the provider does not know this model",
}

# `warnings` of an answer or a result.
WARNING_LABELS: Mapping[str, str] = {
    "price_unknown": "cost unknown: a provider has no price configured",
    "synthesizer_fallback": "a fallback synthesizer stood in for the one asked",
    "member_fallback": "a member failed for good and one of its fallbacks answered in its place",
    "history_truncated": "the oldest turns of the thread were left out of this member's history",
    "canary_leak": "a model's output carried the session's canary (a sign of prompt injection)",
    "forged_tool_output": "the answer imitated tool output instead of calling the tool; it was defanged",
    "native_tools_unsupported": "the provider refused native tool calls, so tags were used",
    "tool_call_not_executed": "a tool call made after the budget ran out was not executed",
}

# Statuses as a badge shows them: short.
STATUS_LABELS: Mapping[str, str] = {
    "dry_run": "dry run",
    "breaker_open": "breaker open",
    "invalid_envelope": "wrong format",
    "invalid_answer": "invalid answer",
    "timeout": "timed out",
    "late": "late",
    "error": "failed",
}

# Why a session's page shows its thread only from some turn on (`Sessions.earlier`'s `stopped`).
THREAD_GAP_LABELS: Mapping[str, str] = {
    "missing": "earlier turns are no longer available: a transcript of the thread is gone",
    "cycle": "earlier turns are no longer available: the thread's links loop back on themselves",
    "limit": "earlier turns are not shown: a page reads back 100 turns of a thread at most",
}


def humanize(code: str) -> str:
    """A code no table knows, as words: `hop_budget_exhausted` -> `hop budget exhausted`."""
    return code.replace("_", " ").strip()


def degraded_label(code: str) -> str:
    """A degraded reason's status or code in plain words."""
    return DEGRADED_LABELS.get(code) or humanize(code)


def warning_label(code: str) -> str:
    return WARNING_LABELS.get(code) or humanize(code)


def status_label(status: str) -> str:
    return STATUS_LABELS.get(status) or humanize(status)


def field_label(key: str) -> str:
    """An envelope field's name as a heading: `revision_notes` -> `Revision notes`."""
    words = humanize(key)
    return words[:1].upper() + words[1:]


def reason_codes(reason: Mapping[str, Any]) -> tuple[str, ...]:
    """A degraded reason's status and code, each once (`invalid_envelope` is often both)."""
    found = (reason.get("status"), reason.get("code"))
    return tuple(dict.fromkeys(str(c) for c in found if c))


def reason_label(reason: Mapping[str, Any]) -> str:
    """What a degraded reason's codes say, in words: `timed out (no answer before the call's
    deadline)`; a bare `failed` gives way to the code that says how."""
    labels = list(dict.fromkeys(degraded_label(code) for code in reason_codes(reason)))
    if len(labels) == 2 and labels[0] == DEGRADED_LABELS["error"]:
        return labels[1]  # "failed (the provider's server failed)" says it twice
    if len(labels) == 2:
        return f"{labels[0]} ({labels[1]})"
    return labels[0] if labels else "missing"


def plural(count: int, word: str, words: str | None = None) -> str:
    """`1 answer`, `3 answers` (`words` when the plural is not `word` + s)."""
    return f"{count} {word if count == 1 else (words or word + 's')}"


def unique(codes: Iterable[str]) -> tuple[str, ...]:
    """Codes in order, each once: a repeated warning is said once."""
    return tuple(dict.fromkeys(codes))
