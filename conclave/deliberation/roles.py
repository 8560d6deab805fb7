"""The role envelopes (docs/tools.md#coordinate, docs/tools.md#confer): `coordinate`'s proposer,
critics and synthesizer, and `confer`'s reviewers and chair (a synthesizer given the panel's
answers).

Each role answers with ONE JSON object valid against `schemas/roles/<role>.json`. The wording of every
prompt is data (`conclave/prompts/roles/*.txt`, filled with `string.Template`); this module embeds the
schemas, puts every piece of untrusted text (task, context, proposals, critiques) in a fenced JSON block
so none of it can pass for instructions, and parses a reply into its envelope: tolerant about where the
object sits in the reply, strict about the object itself (strict JSON, then the schema).

No prompt here mentions tools: the tool hint is added by the worker for the proposer and the critics
only, and the synthesizer never gets one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path
from string import Template
from typing import Any, Literal, get_args

from conclave.schema.answer_schema import portable
from conclave.schema.jsonshape import a_json_type
from conclave.schema.schemas import first_error, json_path, load_schema
from conclave.schema.strictjson import StrictJSONError, strict_decoder
from conclave.worker.untrusted import neutralize

Role = Literal["proposer", "critic", "synthesizer", "reviewer"]
ROLES: tuple[Role, ...] = get_args(Role)

MAX_REPLY_CHARS = 200_000  # a longer reply is refused before any parsing
MAX_SCAN_ATTEMPTS = 256  # "{" positions tried when the object is embedded in prose
MAX_SCAN_CHARS = 1_000_000  # characters the failed attempts among those may read, all together
MAX_CANDIDATES = 8  # objects (fenced or embedded) validated before giving up
MAX_ERROR_CHARS = 500  # a validator message quotes the instance; keep it short

_PROMPTS = Path(__file__).resolve().parent.parent / "prompts" / "roles"
# Markdown fence with `json` or no language; the body is decoded whole or not at all.
_FENCE = re.compile(r"```(?:json)?[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)
# Line breaks json.dumps(ensure_ascii=False) leaves raw; escaped so a string can never start a line
# (and so never close the fence it sits in).
_LINE_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


class _EnvelopeError(Exception):
    """A reply that cannot hold an envelope; the message is the error handed back to the role."""


# ---------------------------------------------------------------- prompts


@cache
def _template(name: str) -> Template:
    return Template((_PROMPTS / f"{name}.txt").read_text(encoding="utf-8"))


def _fill(name: str, **values: str) -> str:
    return _template(name).substitute(values).strip()


def _schema_name(role: Role) -> str:
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; expected one of {list(ROLES)}")
    return f"roles/{role}.json"


def _dumps(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, indent=2, default=_plain)
    return text.translate(_LINE_BREAKS)


def _plain(value: Any) -> Any:
    """json.dumps fallback for the read-only containers a caller may pass (MappingProxy, tuples...)."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return list(value)
    return str(value)


def _fenced(value: Any) -> str:
    return f"```json\n{_dumps(value)}\n```"


def _fenced_model_output(value: Any) -> str:
    """Another model's envelope, quoted: a critic steered by a hostile page must not pass
    forged markup or chat-template tokens on to the synthesizer (defanged, still valid JSON)."""
    return f"```json\n{neutralize(_dumps(value))}\n```"


def _task_block(task: str, context: str | None) -> str:
    data = {"task": task} if not context else {"task": task, "context": context}
    return _fenced(data)


def _critiques(critiques: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each critique as {"critic", "envelope"} plus "error" when there is no envelope; nothing else."""
    shaped: list[dict[str, Any]] = []
    for critique in critiques:
        item: dict[str, Any] = {"critic": critique.get("critic"), "envelope": critique.get("envelope")}
        if item["envelope"] is None or critique.get("error") is not None:
            item["error"] = critique.get("error") or "no valid review"
        shaped.append(item)
    return shaped


def shared_system(task: str, context: str | None) -> str:
    """What every role turn of a deliberation starts its system prompt with: the same preamble and
    the task (and context), byte for byte, so that providers can cache it
    (docs/providers.md#prompt-caching). The role's own instructions follow it (`turn_system`)."""
    return _fill("deliberation", task=_task_block(task, context))


def turn_system(shared: str, role: Role) -> str:
    """A role turn's system prompt: the shared part, then the role's instructions."""
    return f"{shared}\n\n{role_system(role)}"


def member_system(shared: str, system: str | None) -> str:
    """A `confer` member's answer turn when a review or a synthesis follows: the shared part
    first, as in the member's role turns, so that they read the question and context from the
    cache this turn wrote; then what this turn asks, and the caller's own system prompt."""
    own = f"\n\n{system}" if system else ""
    return f"{shared}\n\n{_MEMBER_SYSTEM}{own}"


def member_prompt() -> str:
    """The ask of a member's answer turn (the question is in the system prompt)."""
    return _MEMBER_ASK


# The wording of a member's answer turn. A free-text answer, unlike every other turn the shared
# preamble announces: it says so, or the model would reply with an envelope.
_MEMBER_SYSTEM = (
    "This turn has no role and needs no JSON object: you are one member of a panel of AI models, "
    "each answering the task on its own. Answer the task yourself, completely, in plain text, as "
    "the caller asked it."
)
_MEMBER_ASK = "Answer the task."


def role_system(role: Role) -> str:
    """The role's instructions, its envelope schema embedded (without `$schema` and `$id`)."""
    return _role_system(role)


@cache  # kept apart from role_system so that callers still see its typed signature
def _role_system(role: Role) -> str:
    schema = {k: v for k, v in load_schema(_schema_name(role)).items() if k not in ("$schema", "$id")}
    envelope = _fill("envelope", role=role, schema=_dumps(schema))
    return _fill(role, envelope=envelope)


def proposer_prompt(
    *,
    previous: Mapping[str, Any] | None = None,
    critiques: Sequence[Mapping[str, Any]] = (),
    answer_schema: Mapping[str, Any] | None = None,
) -> str:
    """Round 1 (no `previous`): the ask alone (the task is in the system prompt). Later rounds:
    the previous proposal envelope and the critiques of it, asking for a complete revised
    proposal with `revision_notes`. With an `answer_schema`, before the ask, the shape the
    synthesizer's final answer will take, so that the proposal decides what it asks for."""
    shape = "" if answer_schema is None else _fill("proposer_shape", schema=_fenced(dict(answer_schema)))
    if previous is None:
        return _fill("proposer.user", shape=f"{shape}\n\n" if shape else "")
    return _fill(
        "proposer_revision.user",
        proposal=_fenced_model_output(previous),
        critiques=_fenced_model_output(_critiques(critiques)),
        shape=f"\n{shape}\n" if shape else "",
    )


def critic_prompt(proposal: Mapping[str, Any], *, round_number: int) -> str:
    """The proposal only (the task is in the system prompt): a critic never sees another
    critic's review."""
    if round_number < 1:
        raise ValueError(f"round_number must be 1 or more, not {round_number}")
    return _fill("critic.user", round_number=str(round_number), proposal=_fenced_model_output(proposal))


def synthesizer_prompt(
    proposal: Mapping[str, Any] | None,
    critiques: Sequence[Mapping[str, Any]],
    answer_schema: Mapping[str, Any] | None = None,
) -> str:
    """The final proposal (or a note that the proposer failed) and every final-round critique;
    with an `answer_schema`, what the synthesis's `value` must be."""
    structured = ""
    if answer_schema is not None:
        structured = f"\n{_value_asked(answer_schema, 'the proposal, the critiques')}\n"
    return _fill(
        "synthesizer.user",
        proposal=_fill("no_proposal") if proposal is None else _fenced_model_output(proposal),
        critiques=_fenced_model_output(_critiques(critiques)),
        structured=structured,
    )


def _value_asked(answer_schema: Mapping[str, Any], basis: str) -> str:
    """What a synthesis asked for a `value` is told: the schema, and what to decide it from."""
    return _fill("synthesis_value", basis=basis, schema=_fenced(dict(answer_schema)))


def reviewer_prompt(answers: Sequence[tuple[str, str]]) -> str:
    """The other members' answers, as (label, text) in the order shown (the question is in the
    system prompt)."""
    return _fill(
        "reviewer.user",
        answers=_fenced_model_output([{"label": label, "answer": text} for label, text in answers]),
        labels=", ".join(label for label, _ in answers),
    )


def chair_prompt(
    answers: Sequence[tuple[str, str]],
    aggregate: Sequence[Mapping[str, Any]] | None,
    structured: tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]] | None = None,
) -> str:
    """The panel's answers as (label, text), the review's aggregate by label, and for structured
    answers (the answer schema, the vote's counts with no provider named) what `value` must be."""
    ranking = "" if aggregate is None else _fill("chair_ranking", aggregate=_fenced(list(aggregate)))
    asked = ""
    if structured is not None:
        schema, counts = structured
        value = _value_asked(schema, "the answers, the vote")
        filled = _fill("chair_structured", vote=_fenced_model_output(list(counts)), value=value)
        asked = f"\n\n{filled}"
    return _fill(
        "chair.user",
        answers=_fenced_model_output([{"label": label, "answer": text} for label, text in answers]),
        ranking=ranking,
        structured=asked,
    )


def synthesizer_wire_schema(schema: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The synthesizer's envelope with a required `value` held to the call's answer schema (a
    `confer` chair's or a `coordinate` synthesizer's), for its provider to hold natively."""
    envelope, value = role_wire_schema("synthesizer"), portable(schema)
    if envelope is None or value is None:
        return None
    required = [*envelope.get("required", ()), "value"]
    return {**envelope, "properties": {**envelope["properties"], "value": value}, "required": required}


@cache
def role_wire_schema(role: Role) -> Mapping[str, Any] | None:
    """The role's envelope schema in the portable subset, for a provider to hold the reply to
    natively (None when it cannot be cut down faithfully, as the reviewer's map of notes)."""
    return portable(load_schema(_schema_name(role)))


def answer_instruction(schema: Mapping[str, Any]) -> str:
    """What a member asked for a structured answer is told after the question, whether or not its
    provider also holds the reply to the schema natively."""
    return _fill("answer_schema", schema=_fenced(dict(schema)))


def answer_reprompt(error: str) -> str:
    """The single re-prompt after a reply that is not a valid structured answer."""
    return _fill("answer_reprompt", error=_fenced_model_output(_clip(error, 4 * MAX_ERROR_CHARS)))


def reprompt(role: Role, error: str) -> str:
    """The single re-prompt after an invalid reply, quoting the validator's error (as a JSON string)."""
    _schema_name(role)
    return _fill("reprompt", role=role, error=_fenced_model_output(_clip(error, 4 * MAX_ERROR_CHARS)))


# ---------------------------------------------------------------- parsing


def parse_envelope(role: Role, text: str) -> tuple[dict[str, Any] | None, str | None]:
    """(envelope, None) for a valid reply, else (None, error), as `parse_object` finds it."""
    schema = _schema_name(role)

    def problem(candidate: dict[str, Any]) -> str | None:
        error = first_error(schema, candidate)
        return None if error is None else f"{json_path(error)}: {_clip(error.message, MAX_ERROR_CHARS)}"

    return parse_object(text, problem)


def parse_object(
    text: str, problem: Callable[[dict[str, Any]], str | None]
) -> tuple[dict[str, Any] | None, str | None]:
    """(object, None) for a reply holding a JSON object `problem` finds nothing wrong with, else
    (None, error). The object is looked for as the whole reply, else in ```json (or bare ```)
    fenced blocks, else embedded in prose; the first candidate without a problem wins, and when
    none is, the error is the first candidate's. Duplicate keys, NaN/Infinity and over-deep
    nesting fail the reply outright: nothing is repaired."""
    if len(text) > MAX_REPLY_CHARS:
        return None, f"reply too long: {len(text)} characters (limit {MAX_REPLY_CHARS})"
    try:
        candidates = _candidates(text)
    except _EnvelopeError as exc:
        return None, str(exc)
    first: str | None = None
    for candidate in candidates:
        error = problem(candidate)
        if error is None:
            return candidate, None
        first = first or error
    return None, first


def _candidates(text: str) -> list[dict[str, Any]]:
    """The objects to validate, from the first stage that finds any: whole reply, fences, prose."""
    syntax: list[str] = []  # the first JSON syntax error met, to explain "no JSON object found"
    whole = _decode_whole(text.removeprefix("\ufeff").strip())
    if whole is not None:
        return [_require_object(whole[0], "the reply")]
    fenced = [_require_object(value, "a fenced JSON block") for value in _fenced_values(text, syntax)]
    if fenced:
        return fenced[:MAX_CANDIDATES]
    embedded = _embedded_objects(text, syntax)
    if embedded:
        return embedded
    detail = f" (invalid JSON: {syntax[0]})" if syntax else ""
    raise _EnvelopeError(f"no JSON object found{detail}")


def _decode_whole(text: str, syntax: list[str] | None = None) -> tuple[Any] | None:
    """(value,) when `text` is exactly one JSON value, else None (the syntax error noted in `syntax`)."""
    if not text:
        return None
    try:
        value, end = _decode_at(text, 0)
    except json.JSONDecodeError as exc:
        if syntax is not None:
            _note(syntax, exc)
        return None
    if end != len(text):
        return None
    return (value,)


def _fenced_values(text: str, syntax: list[str]) -> list[Any]:
    values: list[Any] = []
    for match in _FENCE.finditer(text):
        whole = _decode_whole(match.group(1).strip(), syntax)
        if whole is not None:
            values.append(whole[0])
            if len(values) >= MAX_CANDIDATES:
                break
    return values


def _embedded_objects(text: str, syntax: list[str]) -> list[dict[str, Any]]:
    """Balanced objects in prose, in order. After an object, the scan resumes past its end, so the
    objects nested inside one are never candidates of their own."""
    found: list[dict[str, Any]] = []
    pos = text.find("{")
    budget = MAX_SCAN_CHARS
    for _ in range(MAX_SCAN_ATTEMPTS):
        if pos < 0 or budget <= 0 or len(found) >= MAX_CANDIDATES:
            break
        try:
            value, end = _decode_at(text, pos)
        except json.JSONDecodeError as exc:
            _note(syntax, exc)
            budget -= exc.pos - pos + 1
            pos = text.find("{", pos + 1)
            continue
        found.append(value)  # it starts with "{", so it is a dict
        pos = text.find("{", end)
    return found


def _require_object(value: Any, where: str) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    kind = a_json_type(value)
    raise _EnvelopeError(f"{where} is {kind}, not a JSON object: reply with one JSON object")


def _note(syntax: list[str], exc: json.JSONDecodeError) -> None:
    if not syntax:
        syntax.append(f"{exc.msg} at char {exc.pos}")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} chars)"


_DECODER = strict_decoder("the JSON object")


def _decode_at(text: str, pos: int) -> tuple[Any, int]:
    """Decode one JSON value at `pos`. JSON syntax errors propagate (the caller may look elsewhere);
    strictness failures become _EnvelopeError (the reply is refused)."""
    try:
        return _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError:
        raise
    except StrictJSONError as exc:
        raise _EnvelopeError(_clip(str(exc), 200)) from None
    except RecursionError:
        raise _EnvelopeError("JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer literal over Python's digit limit
        raise _EnvelopeError(f"invalid JSON number: {_clip(str(exc), 120)}") from None
