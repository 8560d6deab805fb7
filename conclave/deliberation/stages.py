"""Asking a role (docs/tools.md#coordinate): one turn whose reply must be a valid envelope,
re-prompted once with the validator's error, and the synthesizer's chain of fallbacks. Every stage
that asks a role goes through here: `coordinate`'s proposer, critics and synthesizer, `confer`'s
reviewers and chair."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import anyio

from conclave.core.messages import Message
from conclave.deliberation.answers import asked_twice, combined, late, timed_out
from conclave.deliberation.results import Answer, DegradedReason, RoleAnswer, Totals
from conclave.deliberation.roles import (
    Role,
    member_prompt,
    member_system,
    parse_envelope,
    reprompt,
    role_wire_schema,
    synthesizer_wire_schema,
    turn_system,
)
from conclave.deliberation.session import Session
from conclave.schema.answer_schema import answer_errors
from conclave.schema.config import RolesConfig

# A check beyond the schema (a reviewer's ranking must hold exactly the labels it was shown):
# the error to hand back to the role, or None.
EnvelopeCheck = Callable[[Mapping[str, Any]], str | None]
# The calls of a session that start with its shared part, by provider and the worker tools they
# carry, as many as each is planned to make.
PlannedCalls = Counter[tuple[str, tuple[str, ...]]]


def synthesizer_chain(chosen: str | None, roles: RolesConfig) -> tuple[str, ...]:
    """Who synthesizes: the one chosen (else `roles.synthesizer`), then the configured fallbacks."""
    first = chosen or roles.synthesizer
    return (first, *dict.fromkeys(n for n in roles.synthesizer_fallbacks if n != first))


class RoleTurns:
    """The role turns of one session, in the order they ended (`answers`).

    Every turn's system prompt starts with `shared`. A turn marks it for the provider's cache
    only when `planned` (the calls the deliberation will make when all goes to plan, by provider
    and tools) has the provider called again with the same prefix: a cache write is billed
    above the input price, and one nobody reads is only dearer.
    """

    def __init__(
        self, session: Session, shared: str, planned: PlannedCalls | None = None, *, history: bool = False
    ) -> None:
        self.session = session
        self.shared = shared  # the start of every role turn's system prompt (`shared_system`)
        self.history = history  # a follow-up's role turns get the thread's history (coordinate's do)
        self.planned: PlannedCalls = planned if planned is not None else Counter()
        self.answers: list[RoleAnswer] = []

    async def ask(
        self,
        role: Role,
        name: str,
        prompt: str,
        number: int,
        *,
        tools: tuple[str, ...] = (),
        check: EnvelopeCheck | None = None,
        schema: Mapping[str, Any] | None = None,
    ) -> RoleAnswer:
        """`name`'s turn as `role`: its envelope, or why there is none. The provider holds the
        reply to the envelope's schema natively where it can (`schema`: one narrower than the
        role's, e.g. a reviewer's own labels), so a re-prompt is rare."""
        messages = (Message("user", prompt),)
        schema = schema if schema is not None else role_wire_schema(role)
        first = await self._turn(role, name, messages, tools, schema)
        asked = first.error_code != "unknown_provider"
        answer = RoleAnswer(**_fields(first), role=role, round=number, attempts=1 if asked else 0)
        if first.ok:
            answer = await self._envelope_of(answer, messages, check, schema)
        self.answers.append(answer)
        if self.session.progress is not None:
            await self.session.progress(self._step(answer))
        return answer

    async def synthesize(
        self,
        names: Sequence[str],
        prompt: str,
        number: int,
        *,
        answer_schema: Mapping[str, Any] | None = None,
    ) -> RoleAnswer:
        """The first of `names` to deliver a synthesizer envelope, saying whom it replaced; the
        last failure when none does. Never tools: the synthesizer reads, it does not fetch.

        With an `answer_schema` (a structured `confer`'s chair, a structured `coordinate`'s
        synthesizer), the envelope must also hold a `value` valid against it, held natively
        where the provider can: a reply without one is re-prompted like any invalid envelope,
        with the validator's errors, then the next of `names` is tried. The synthesis carries
        its `value`."""
        check: EnvelopeCheck | None = None
        schema: Mapping[str, Any] | None = None
        if answer_schema is not None:
            check = partial(_value_problem, schema=answer_schema)
            schema = synthesizer_wire_schema(answer_schema)
        failed: list[RoleAnswer] = []
        with anyio.CancelScope(deadline=self.session.deadline):
            for name in names:
                answer = await self.ask("synthesizer", name, prompt, number, check=check, schema=schema)
                if answer.envelope is not None:
                    if answer_schema is not None:
                        answer = replace(answer, value=answer.envelope["value"])
                    return _with_fallback(answer, failed)
                failed.append(answer)
        if not failed:  # out of time before any synthesizer answered
            return self.timed_out("synthesizer", names[0])
        return _with_fallback(failed[-1], failed[:-1])

    def member_messages(self, instruction: str | None = None) -> tuple[Message, ...]:
        """A `confer` member's own turn, after the shared part: what it is asked (and, for a
        structured answer, the schema's instruction)."""
        ask = member_prompt() if instruction is None else f"{member_prompt()}\n\n{instruction}"
        return (Message("user", ask),)

    async def answer(
        self,
        name: str,
        messages: tuple[Message, ...],
        system: str | None,
        tools: tuple[str, ...],
        answer_schema: Mapping[str, Any] | None = None,
    ) -> Answer:
        """A `confer` member's own answer, laid out like its role turns (`member_system`), with
        the caller's `system` after the shared part. Not a role turn: no envelope."""
        marked = self.marks(name, tools)
        return await self.session.ask(
            name,
            messages,
            system=member_system(self.shared, system),
            tools=tools,
            shared=len(self.shared),
            marked=marked,
            answer_schema=answer_schema,
            history=True,
        )

    def marks(self, name: str, tools: tuple[str, ...]) -> bool:
        """Whether `name`'s turn with `tools` ends a cache breakpoint after the shared part: when
        at least two planned calls send the provider that prefix (the first writes, the others
        read). Decided when the turn is sent, as the tools a provider declares may change."""
        prefix = self._prefix(name, tools)
        same = (n for (who, carried), n in self.planned.items() if self._prefix(who, carried) == prefix)
        return sum(same) >= 2

    def _prefix(self, name: str, tools: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
        """What of a turn's prefix differs between a provider's turns: tools declared natively
        come before the system prompt; in tags mode they follow the shared part."""
        return name, tools if self.session.declares_tools(name, tools) else ()

    def timed_out(self, role: Role, name: str) -> RoleAnswer:
        return RoleAnswer(**_fields(timed_out(name, None, self.session.elapsed_ms())), role=role)

    def late(self, role: Role, name: str, number: int) -> RoleAnswer:
        """A turn stopped once its quorum had answered and the grace period ran out."""
        elapsed = self.session.elapsed_ms()
        self.session.runtime.telemetry.emit(
            "member_late", provider=name, role=role, elapsed_ms=round(elapsed, 3)
        )
        return RoleAnswer(**_fields(late(name, None, elapsed)), role=role, round=number)

    def totals(self, role: Role) -> Totals:
        return Totals.of([a for a in self.answers if a.role == role])

    def _step(self, answer: RoleAnswer) -> dict[str, Any]:
        """A progress step: one role has answered."""
        return {
            "role": answer.role,
            "provider": answer.provider,
            "status": answer.status,
            "round": answer.round,
            "done": len(self.answers),
        }

    async def _envelope_of(
        self,
        first: RoleAnswer,
        messages: tuple[Message, ...],
        check: EnvelopeCheck | None,
        schema: Mapping[str, Any] | None,
    ) -> RoleAnswer:
        """The envelope in the first reply, or in the reply to one re-prompt with the errors."""
        role = first.role
        answer, envelope, error = await asked_twice(
            first,
            messages,
            parse=lambda text: _parsed(role, text, check),
            reprompt=lambda why: reprompt(role, why),
            again=lambda retry: self._turn(role, first.provider, retry, (), schema),
            merge=_merged,
            invalid=self._invalid,
        )
        if envelope is not None:
            return replace(answer, envelope=envelope)
        if not answer.ok:
            return answer
        message = f"no valid {role} envelope after a re-prompt: {error}"
        return replace(
            answer, status="invalid_envelope", error={"code": "invalid_envelope", "message": message}
        )

    async def _turn(
        self,
        role: Role,
        name: str,
        messages: tuple[Message, ...],
        tools: tuple[str, ...],
        schema: Mapping[str, Any] | None,
    ) -> Answer:
        marked = self.marks(name, tools)
        return await self.session.ask(
            name,
            messages,
            system=turn_system(self.shared, role),
            tools=tools,
            role=role,
            shared=len(self.shared),
            marked=marked,
            answer_schema=schema,
            history=self.history,
        )

    def _invalid(self, answer: RoleAnswer, attempt: int, error: str, final: bool) -> None:
        self.session.runtime.telemetry.emit(
            "role_envelope_invalid",
            provider=answer.provider,
            role=answer.role,
            attempt=attempt,
            round=answer.round,
            error=error,
            final=final,
            text=answer.text,  # kept only when telemetry.include_content is on
        )


def _value_problem(envelope: Mapping[str, Any], schema: Mapping[str, Any]) -> str | None:
    """What is wrong with a synthesis's `value`, which a structured call's synthesis must hold."""
    if "value" not in envelope:
        return "$.value: the final answer as an object valid against the answer schema is missing"
    errors = answer_errors(schema, envelope["value"])
    return "; ".join(f"$.value{e[1:]}" for e in errors) if errors else None


def _parsed(role: Role, text: str, check: EnvelopeCheck | None) -> tuple[dict[str, Any] | None, str | None]:
    envelope, error = parse_envelope(role, text)
    if envelope is not None and check is not None:
        error = check(envelope)
        if error is not None:
            return None, error
    return envelope, error


def _fields(answer: Answer) -> dict[str, Any]:
    """An Answer's fields, to make the RoleAnswer that carries them."""
    return {name: getattr(answer, name) for name in Answer.__dataclass_fields__}


def _merged(first: RoleAnswer, second: Answer) -> RoleAnswer:
    """A role's two attempts as one answer: the second's outcome, both attempts' costs."""
    return RoleAnswer(**_fields(combined(first, second)), role=first.role, round=first.round, attempts=2)


def _with_fallback(answer: RoleAnswer, failed: Sequence[RoleAnswer]) -> RoleAnswer:
    if not failed:
        return answer
    replaced = DegradedReason.replaced(failed[0], failed[0].role)
    return replace(answer, fallback_from=replaced, fallbacks_tried=tuple(f.reason for f in failed))
