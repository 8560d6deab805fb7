"""Structured answers (docs/tools.md#structured-answers-and-the-vote): a member asked with an
`answer_schema` gives its final answer as a JSON object valid against it. Its provider holds the
reply to the schema natively where its kind can (the worker loop puts the schema on the request);
the member is told the schema in its prompt either way. Then the reply is validated here, and
re-prompted once, without tools, with the validator's errors; a second invalid reply makes the
answer `invalid_answer`, its raw text kept. Either way each invalid reply is an `answer_invalid`
event.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from conclave.core.messages import Message
from conclave.deliberation.answers import asked_twice, combined
from conclave.deliberation.results import Answer
from conclave.deliberation.roles import answer_reprompt, parse_object
from conclave.obs.telemetry import Telemetry
from conclave.schema.answer_schema import answer_errors

# Ask the member again: the conversation so far, and the tools this attempt may use.
Ask = Callable[[tuple[Message, ...], tuple[str, ...]], Awaitable[Answer]]


def parse_answer(text: str, schema: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """(value, None) when the reply holds an object valid against `schema`, else (None, error)."""

    def problem(candidate: dict[str, Any]) -> str | None:
        errors = answer_errors(schema, candidate)
        return "; ".join(errors) if errors else None

    return parse_object(text, problem)


async def structured_answer(
    ask: Ask,
    messages: tuple[Message, ...],
    tools: tuple[str, ...],
    schema: Mapping[str, Any],
    telemetry: Telemetry,
) -> Answer:
    """The member's answer with its `value`, asking once more when the first reply is not valid."""
    first = await ask(messages, tools)
    if not first.ok:
        return first
    answer, value, error = await asked_twice(
        first,
        messages,
        parse=lambda text: parse_answer(text, schema),
        reprompt=answer_reprompt,
        again=lambda retry: ask(retry, ()),
        merge=combined,
        invalid=lambda invalid, attempt, why, final: _invalid(telemetry, invalid, attempt, why, final),
    )
    if value is not None:
        return replace(answer, value=value)
    if not answer.ok:
        return answer
    message = f"no valid answer after a re-prompt: {error}"
    return replace(answer, status="invalid_answer", error={"code": "invalid_answer", "message": message})


def _invalid(telemetry: Telemetry, answer: Answer, attempt: int, error: str, final: bool) -> None:
    fields: dict[str, Any] = {"provider": answer.provider, "attempt": attempt, "error": error}
    if final:
        fields["final"] = True
    if telemetry.include_content and answer.text is not None:
        fields["text"] = answer.text
    telemetry.emit("answer_invalid", **fields)
