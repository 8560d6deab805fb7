"""A Conclave result as an OpenAI chat completion's message, usage and `conclave` field
(docs/openai-endpoint.md#what-maps-to-what).

The content is the synthesis (a council's chair, coordinate's synthesizer: the prose `answer` of
its envelope), or a confer's digest of its members' answers; with a `json_schema`
response_format, the decided value as JSON (confer: the vote's consensus; a council and
coordinate: the synthesis's `value`), or, when none was decided, a `refusal` saying why. A call in
which nobody produced anything usable is a 502. Pure: it reads the tool's JSON result only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from conclave.app.labels import reason_label
from conclave.app.server.openai_request import ChatCall, OpenAIError

NO_SYNTHESIS = "*No synthesis was written ({why}); the panel's answers follow.*\n\n"
PROPOSAL_ONLY = "*No synthesis was written ({why}); the final proposal follows.*\n\n"


@dataclass(frozen=True, slots=True)
class Reply:
    """The assistant message (its content, or its refusal) and how it ended."""

    content: str | None
    refusal: str | None = None
    finish_reason: str = "stop"
    synthesized: bool = False  # the content is the synthesizer's prose, as it streamed


def reply_of(call: ChatCall, result: Mapping[str, Any]) -> Reply:
    """What the completion says; OpenAIError 502 when no member answered anything usable."""
    if not _usable(call, result):
        raise OpenAIError(
            502,
            "no panel member produced a usable answer: " + _reasons(result),
            type="server_error",
            code="no_usable_answer",
            extra={"conclave": conclave_field(result)},
        )
    if call.structured:
        return _structured(call, result)
    if not call.model.synthesizes:
        return Reply(digest(result))
    return _synthesis(call, result)


def _usable(call: ChatCall, result: Mapping[str, Any]) -> bool:
    if call.model.tool == "confer":
        return any(answer["status"] == "ok" for answer in result.get("answers", []))
    return _envelope(result, "synthesis") is not None or _envelope(result, "proposal") is not None


def _envelope(result: Mapping[str, Any], part: str) -> Mapping[str, Any] | None:
    answer = result.get(part) or {}
    envelope = answer.get("envelope")
    return envelope if isinstance(envelope, Mapping) else None


def _synthesis(call: ChatCall, result: Mapping[str, Any]) -> Reply:
    """The synthesizer's prose; when none came, what there is instead, said so."""
    envelope = _envelope(result, "synthesis")
    if envelope is not None:
        finish = "length" if (result["synthesis"].get("finish_reason") == "length") else "stop"
        return Reply(str(envelope.get("answer", "")), finish_reason=finish, synthesized=True)
    why = _missing(result.get("synthesis"))
    if call.model.tool == "confer":
        return Reply(NO_SYNTHESIS.format(why=why) + digest(result))
    proposal = _envelope(result, "proposal") or {}
    return Reply(PROPOSAL_ONLY.format(why=why) + str(proposal.get("proposal", "")))


def _structured(call: ChatCall, result: Mapping[str, Any]) -> Reply:
    if call.model.synthesizes:
        synthesis = result.get("synthesis") or {}
        value = synthesis.get("value")
        why = f"the synthesizer decided no value ({_missing(synthesis)})"
    else:
        vote = result.get("vote") or {}
        value = vote.get("consensus")
        why = f"the panel reached no consensus: {vote.get('reason') or 'no valid answers'}"
    if value is None:
        return Reply(None, refusal=why)
    return Reply(orjson.dumps(value).decode())


def _missing(answer: Mapping[str, Any] | None) -> str:
    if not answer:
        return "nobody was asked"
    error = answer.get("error") or {}
    return f"{answer.get('provider')} {answer.get('status')}" + (
        f": {error['message']}" if error.get("message") else ""
    )


def digest(result: Mapping[str, Any]) -> str:
    """A confer's answers in Markdown: one section per member, its status when it has no answer."""
    return "".join(digest_sections(result))


def digest_sections(result: Mapping[str, Any]) -> list[str]:
    """The digest in the pieces a stream sends it in: one member at a time."""
    sections = [_section(answer) for answer in result.get("answers", [])]
    return [section if i == 0 else "\n\n" + section for i, section in enumerate(sections)]


def _section(answer: Mapping[str, Any]) -> str:
    head = f"## {answer['provider']}" + (f" ({answer['model']})" if answer.get("model") else "")
    if answer["status"] == "ok":
        return f"{head}\n\n{answer.get('text') or ''}"
    error = answer.get("error") or {}
    said = f": {error['message']}" if error.get("message") else ""
    return f"{head}: {answer['status']}\n\n*No answer ({error.get('code') or answer['status']}{said}).*"


def _reasons(result: Mapping[str, Any]) -> str:
    """Who is missing and why, in words: a member's own error message where there is one (a
    missing key's names the variable to set), else the reason's code as the page words it."""
    said = {
        (turn.get("provider"), turn.get("role")): (turn.get("error") or {}).get("message")
        for turn in _turns(result)
    }
    named = []
    for reason in result.get("degraded_reasons") or []:
        who = f"{reason['role']} {reason['provider']}" if reason.get("role") else str(reason["provider"])
        why = said.get((reason["provider"], reason.get("role"))) or reason_label(reason)
        named.append(f"{who}: {why}")
    return "; ".join(named) or "no answers"


def _turns(result: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every answer of a confer or a debate that may carry an error."""
    turns = [*(result.get("answers") or []), *(result.get("critiques") or [])]
    return turns + [t for t in (result.get("proposal"), result.get("synthesis")) if isinstance(t, Mapping)]


def usage_of(result: Mapping[str, Any]) -> dict[str, Any]:
    """The whole panel's usage in OpenAI's shape (a count a provider did not report is 0 there,
    as OpenAI's fields are integers; `conclave.usage` keeps the nulls)."""
    usage = result.get("usage") or {}
    prompt = usage.get("input_tokens") or 0
    completion = usage.get("output_tokens") or 0
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": usage.get("total_tokens") or prompt + completion,
    }
    if usage.get("cached_input_tokens") is not None:
        out["prompt_tokens_details"] = {"cached_tokens": usage["cached_input_tokens"]}
    if usage.get("reasoning_tokens") is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": usage["reasoning_tokens"]}
    return out


def conclave_field(result: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level `conclave` member: which session, and whether the answer is whole."""
    out: dict[str, Any] = {
        "session_id": result.get("session_id"),
        "degraded": bool(result.get("degraded")),
        "degraded_reasons": list(result.get("degraded_reasons") or []),
    }
    cost = (result.get("usage") or {}).get("cost_usd")
    if cost is not None:
        out["cost_usd"] = cost
    return out
