"""Terminal rendering for the CLI: `confer` and `coordinate` results as readable text on stdout, and
live per-provider (or per-role) progress on stderr while a call runs.

Rendering is pure (result dict in, text out) so the CLI, the demo and tests share it. Progress is a
small redraw loop that only ever writes to the stream it is given (stderr), never to stdout, so
`--json` output stays clean even on a terminal.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

import anyio
import orjson

from conclave.app.beside import running_beside
from conclave.app.labels import plural, reason_codes, unique, warning_label
from conclave.core.messages import Delta
from conclave.schema.config import Config

Deliberation = Literal["confer", "coordinate"]  # the tools whose results this module draws
REDRAW_SECONDS = 0.1
_UP_AND_CLEAR = "\x1b[F\x1b[K"  # cursor to the start of the previous line, then clear it
_HEARD_CHARS = 200  # of a streaming answer's text, kept to show its end
_TAIL_SHOWN = 48  # of which a progress line shows this much


# ---------------------------------------------------------------- styles and small formatters


class Style:
    """ANSI colour when asked for (stdout is a terminal), plain text otherwise."""

    def __init__(self, colour: bool) -> None:
        self.colour = colour

    def paint(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.colour else text

    def bold(self, text: str) -> str:
        return self.paint(text, "1")

    def dim(self, text: str) -> str:
        return self.paint(text, "2")

    def bad(self, text: str) -> str:
        return self.paint(text, "1;31")

    def good(self, text: str) -> str:
        return self.paint(text, "32")

    def warn(self, text: str) -> str:
        return self.paint(text, "33")

    def status(self, status: str) -> str:
        return self.good(status) if status == "ok" else self.bad(status)


def wants_colour(stream: TextIO) -> bool:
    """Colour only on a terminal, and never when the user opted out (https://no-color.org)."""
    return _is_tty(stream) and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def _is_tty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def fmt_ms(ms: Any) -> str:
    if not isinstance(ms, int | float):
        return "-"
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.2f} s"


def fmt_cost(usd: Any) -> str:
    if not isinstance(usd, int | float):
        return "cost unknown"
    if usd == 0:
        return "$0.00"
    return f"${usd:.6f}" if usd < 0.01 else f"${usd:.4f}"


def fmt_tokens(usage: Mapping[str, Any] | None) -> str:
    usage = usage or {}
    text = f"{usage.get('input_tokens') or 0} in / {usage.get('output_tokens') or 0} out tokens"
    extras = [f"{usage[k]} {label}" for k, label in _TOKEN_EXTRAS if usage.get(k)]
    return f"{text} ({', '.join(extras)})" if extras else text


_TOKEN_EXTRAS = (("cached_input_tokens", "cached"), ("reasoning_tokens", "reasoning"))


def _indent(text: str, prefix: str = "  ") -> list[str]:
    return [f"{prefix}{line}" if line else "" for line in text.splitlines()] or [prefix.rstrip()]


def _bullets(title: str, items: Sequence[Any] | None, prefix: str = "  ") -> list[str]:
    if not items:
        return []
    return [f"{prefix}{title}:", *(f"{prefix}  - {item}" for item in items)]


def _reason(reason: Mapping[str, Any]) -> str:
    """`alpha (proposer): error, server_error`: the codes, each once, that programs and the docs use."""
    role = f" ({reason['role']})" if reason.get("role") else ""
    when = f" (stopped at {fmt_ms(reason['elapsed_ms'])})" if reason.get("elapsed_ms") is not None else ""
    return f"{reason.get('provider')}{role}: {', '.join(reason_codes(reason))}{when}"


def nobody_answered(result: Mapping[str, Any]) -> bool:
    """No model produced anything: every answer (confer) or every role turn (coordinate) failed.
    A dry run calls nobody by design."""
    if result.get("dry_run"):
        return False
    turns = list(result.get("answers") or [])
    for entry in result.get("rounds") or []:
        turns += [entry.get("proposal") or {}, *(entry.get("critiques") or [])]
    turns.append(result.get("synthesis") or {})
    return not any(turn.get("status") == "ok" for turn in turns)


def _missing_keys_hint(result: Mapping[str, Any]) -> list[str]:
    """When nobody answered because no key is set, say how to see Conclave work without one."""
    reasons = result.get("degraded_reasons") or []
    if not reasons or any(r.get("code") != "missing_api_key" for r in reasons):
        return []
    return [
        "  no API key is set: put keys in the environment or ./.env (conclave doctor says which), "
        "or try `conclave demo`, which needs none"
    ]


# ---------------------------------------------------------------- confer


def render_confer(result: Mapping[str, Any], *, colour: bool = False) -> str:
    """A readable confer result: the verdict, one block per provider, then totals and warnings."""
    style = Style(colour)
    answers = result.get("answers") or []
    lines = [style.bold(f"confer · session {result.get('session_id')}"), *_verdict(result, style)]
    if result.get("dry_run"):
        return "\n".join(lines + _plan(result.get("plan") or {}, style))
    for answer in answers:
        lines += ["", *_answer_block(answer, style)]
    if result.get("vote"):
        lines += ["", *_vote_block(result["vote"], style)]
    if result.get("review"):
        lines += ["", *_review_block(result["review"], style)]
    if result.get("synthesis"):
        lines += ["", *_synthesis_block(result["synthesis"], style)]
    ok = sum(a.get("status") == "ok" for a in answers)
    lines += ["", f"totals: {plural(len(answers), 'answer')}, {ok} ok · {_totals(result)}"]
    lines += _tail_notes(result, style)
    return "\n".join(lines)


def _verdict(result: Mapping[str, Any], style: Style) -> list[str]:
    if result.get("dry_run"):
        return [style.warn("DRY RUN: nothing was called; this is the plan.")]
    reasons = result.get("degraded_reasons") or []
    if not result.get("degraded"):
        return [style.good("complete: every answer arrived")]
    if nobody_answered(result):
        head = style.bad(f"FAILED: no model answered ({len(reasons)} missing)")
    else:
        head = style.bad(f"DEGRADED: {len(reasons)} missing - this result is partial")
    lines = [head, *(style.bad(f"  ✗ {_reason(r)}") for r in reasons)]
    return lines + [style.warn(line) for line in _missing_keys_hint(result)]


def _answer_block(answer: Mapping[str, Any], style: Style) -> list[str]:
    head = [
        style.bold(f"━━ {answer.get('provider')}"),
        str(answer.get("model") or "-"),
        style.status(str(answer.get("status"))),
        fmt_ms(answer.get("latency_ms")),
        fmt_cost((answer.get("usage") or {}).get("cost_usd")),
        f"{answer.get('hops', 0)} hop{'s' if answer.get('hops') != 1 else ''}",
    ]
    lines = [" · ".join(head + _tool_mode(answer))]
    if answer.get("fallback_from"):  # a member failed for good; this fallback answered for it
        lines.append(style.warn(f"  stood in for {_reason(answer['fallback_from'])}"))
    if answer.get("value") is not None:  # a structured answer: its fields, not its JSON text
        lines += [f"  {key}: {_shown(value)}" for key, value in answer["value"].items()]
    elif answer.get("text"):
        lines += _indent(str(answer["text"]))
    lines += _problem_lines(answer, style)
    lines += _tool_call_lines(answer.get("inner_tool_calls"))
    return lines


def _problem_lines(answer: Mapping[str, Any], style: Style) -> list[str]:
    lines: list[str] = []
    error = answer.get("error")
    if error:
        http = f" (HTTP {error['status']})" if error.get("status") else ""
        lines.append(style.bad(f"  error {error.get('code')}{http}: {error.get('message')}"))
    if answer.get("finish_reason") == "length":
        lines.append(style.warn("  cut at the token limit (finish_reason: length)"))
    if answer.get("warnings"):
        lines.append(style.warn(f"  warnings: {', '.join(answer['warnings'])}"))
    return lines


def _tool_call_lines(calls: Sequence[Mapping[str, Any]] | None) -> list[str]:
    if not calls:
        return []
    shown = [
        f"hop {c.get('hop')} {c.get('name')} {c.get('status')}"
        + (f" ({c['reason']})" if c.get("reason") else "")
        for c in calls
    ]
    return [f"  tools used: {'; '.join(shown)}"]


def _totals(result: Mapping[str, Any]) -> str:
    usage = result.get("usage") or {}
    return f"{fmt_tokens(usage)} · {fmt_cost(usage.get('cost_usd'))} · {fmt_ms(result.get('latency_ms'))}"


def _tail_notes(result: Mapping[str, Any], style: Style) -> list[str]:
    """Warnings, the worker_tools block, and the verdict again (long answers push the top away)."""
    lines: list[str] = []
    for code in unique(result.get("warnings") or ()):
        lines.append(style.warn(f"warning: {warning_label(code)} ({code})"))
    lines += _worker_tools(result.get("worker_tools"), style)
    if result.get("degraded"):
        missing = "; ".join(_reason(r) for r in result.get("degraded_reasons") or [])
        lines.append(style.bad(f"result: DEGRADED ({missing})"))
    return lines


def _worker_tools(block: Mapping[str, Any] | None, style: Style) -> list[str]:
    if not block:
        return []
    parts = [
        f"accepted {', '.join(block.get('accepted') or []) or 'none'}",
        f"rejected {', '.join(block.get('rejected') or []) or 'none'}",
        f"hop budget {block.get('hop_budget')}",
    ]
    if block.get("applies_to"):
        parts.append(f"for {', '.join(block['applies_to'])}")
    lines = [f"worker tools: {' · '.join(parts)}"]
    cap = block.get("cost_cap")
    if cap:
        lines.append(f"  cost cap: {_cap(cap)}")
        if cap.get("operator_prompt"):
            lines.append(style.warn(f"  ! {cap['operator_prompt']}"))
    return lines


def _cap(cap: Mapping[str, Any]) -> str:
    state = "blocked" if cap.get("blocked") else ("exceeded" if cap.get("exceeded") else "within")
    text = f"{fmt_cost(cap.get('cap_usd'))} {cap.get('mode')}, observed {fmt_cost(cap.get('observed_usd'))}"
    return f"{text} ({state})"


def _plan(plan: Mapping[str, Any], style: Style) -> list[str]:
    cost = plan.get("max_cost_usd")
    bound = fmt_cost(cost) if cost is not None else "unknown (a price is missing)"
    lines = ["", f"at most {plan.get('max_calls')} model calls, costing at most {bound}"]
    if plan.get("max_cost_usd_cached") is not None:
        cached = fmt_cost(plan["max_cost_usd_cached"])
        lines.append(f"  or at most {cached} when later calls read the task from the cache")
    for call in plan.get("calls") or []:
        role = f" as {call['role']}" if call.get("role") else ""
        if call.get("fallback_for"):
            role += f" (if {call['fallback_for']} fails for good)"
        limits = (
            f"≤ {call.get('max_calls')} calls, ≤ {call.get('max_input_tokens')} in / "
            f"{call.get('max_output_tokens')} out tokens, ≤ {fmt_cost(call.get('max_cost_usd'))}"
        )
        note = f" [{call.get('status')}: {call.get('reason')}]" if call.get("reason") else ""
        lines.append(f"  {call.get('provider')} ({call.get('model')}){role}: {limits}{note}")
    lines += [style.dim(f"  {reason}") for reason in plan.get("reasons") or []]
    if plan.get("note"):
        lines.append(style.dim(f"  note: {plan['note']}"))
    return lines


def _vote_block(vote: Mapping[str, Any], style: Style) -> list[str]:
    """Per voted field: the winner, its votes, who dissented and with what; then the consensus."""
    consensus = vote.get("consensus")
    if consensus is not None:
        verdict = style.good("consensus: " + ", ".join(f"{k} = {_shown(v)}" for k, v in consensus.items()))
    else:
        verdict = style.warn(f"no consensus: {vote.get('reason')}")
    lines = [style.bold("═══ Vote · ") + verdict]
    fields = vote.get("fields") or []
    if fields:
        width = max(len(str(f["field"])) for f in [*fields, {"field": "field"}]) + 2
        lines.append("  " + "field".ljust(width) + "winner · votes · dissent")
    for entry in fields:
        winner = "(a tie)" if entry.get("winner") is None else _shown(entry["winner"])
        dissent = ", ".join(f"{d['provider']}: {_shown(d['value'])}" for d in entry.get("dissent") or [])
        count = f"{entry.get('votes')} of {entry.get('of')}"
        lines.append("  " + str(entry["field"]).ljust(width) + " · ".join([winner, count, dissent or "none"]))
    if vote.get("not_counted"):
        lines.append(style.warn(f"  not counted (no valid answer): {', '.join(vote['not_counted'])}"))
    return lines


def _shown(value: Any) -> str:
    """A JSON value on one line, strings without quotes."""
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def _review_block(review: Mapping[str, Any], style: Style) -> list[str]:
    """Who ranked whom (rows: reviewers; columns: the answers ranked; cells: the place given),
    then the aggregate."""
    rankings = review.get("rankings") or []
    aggregate = review.get("aggregate") or []
    agreement = review.get("agreement")
    said = "n/a" if agreement is None else f"{agreement:.2f}"
    count = f"{len(rankings)} reviewer{'s' * (len(rankings) != 1)}"
    lines = [style.bold(f"═══ Review · {count} · agreement (Kendall's W) {said}")]
    if not rankings:
        return [*lines, style.warn("  no rankings: fewer than two answers to compare, or no valid review")]
    ranked = [a["provider"] for a in aggregate]
    width = max(len(name) for name in [*ranked, "reviewer"]) + 2
    lines.append("  " + "reviewer".ljust(width) + "".join(name.ljust(width) for name in ranked))
    for entry in rankings:
        order = list(entry.get("ranking") or [])
        cells = [str(order.index(name) + 1) if name in order else "-" for name in ranked]
        lines.append("  " + str(entry.get("reviewer")).ljust(width) + "".join(c.ljust(width) for c in cells))
    lines.append("  aggregate (best first, normalized Borda · mean rank · reviews):")
    for place, entry in enumerate(aggregate, 1):
        mean = entry.get("mean_rank")
        mean_text = "-" if mean is None else f"{mean:.2f}"
        line = f"    {place}. {entry['provider']}  {entry['borda']:.2f} · {mean_text} · {entry['reviews']}"
        lines.append(style.good(line) if entry["provider"] == review.get("top") else line)
    return lines


# ---------------------------------------------------------------- coordinate


def render_coordinate(result: Mapping[str, Any], *, colour: bool = False) -> str:
    """A readable debate: each round's proposal and critiques, the synthesis, totals per role."""
    style = Style(colour)
    rounds = result.get("rounds") or []
    count = (result.get("plan") or {}).get("rounds", 1) if result.get("dry_run") else len(rounds)
    title = f"coordinate · session {result.get('session_id')} · {count} round{'s' * (count != 1)}"
    if result.get("converged"):
        title += " · converged: every critic accepted"
    lines = [style.bold(title), *_verdict(result, style)]
    if result.get("dry_run"):
        return "\n".join(lines + _plan(result.get("plan") or {}, style))
    for entry in rounds:
        lines += _round_block(entry, style)
    lines += ["", *_synthesis_block(result.get("synthesis"), style)]
    lines += ["", f"totals: {_totals(result)}", *_per_role(result.get("per_role") or {})]
    lines += _tail_notes(result, style)
    return "\n".join(lines)


def _round_block(entry: Mapping[str, Any], style: Style) -> list[str]:
    lines = ["", style.bold(f"═══ Round {entry.get('round')}")]
    proposal = entry.get("proposal")
    if proposal:
        lines += _role_head("Proposal", proposal, style) + _proposal_body(proposal.get("envelope"))
        lines += _role_problems(proposal, style)
    for critique in entry.get("critiques") or []:
        lines += ["", *_role_head("Critique", critique, style), *_critique_body(critique.get("envelope"))]
        lines += _role_problems(critique, style)
    return lines


def _role_head(title: str, answer: Mapping[str, Any], style: Style) -> list[str]:
    parts = [
        style.bold(f"{title} by {answer.get('provider')}"),
        str(answer.get("model") or "-"),
        style.status(str(answer.get("status"))),
        fmt_ms(answer.get("latency_ms")),
        fmt_cost((answer.get("usage") or {}).get("cost_usd")),
    ]
    if (answer.get("attempts") or 0) > 1:
        parts.append("re-prompted once")
    return [" · ".join(parts + _tool_mode(answer))]


def _tool_mode(answer: Mapping[str, Any]) -> list[str]:
    """How the answer's worker tools were encoded (docs/worker-loop.md#native-tool-calling), when
    it had any."""
    return [f"tools: {answer['tool_mode']}"] if answer.get("tool_mode") else []


def _role_problems(answer: Mapping[str, Any], style: Style) -> list[str]:
    lines = _problem_lines(answer, style) + _tool_call_lines(answer.get("inner_tool_calls"))
    if answer.get("status") == "invalid_envelope" and answer.get("text"):
        lines += ["  raw reply:", *_indent(str(answer["text"]), "    ")]
    return lines


def _proposal_body(envelope: Mapping[str, Any] | None) -> list[str]:
    if not envelope:
        return []
    lines = _indent(str(envelope.get("proposal", "")))
    if envelope.get("rationale"):
        lines += ["  rationale:", *_indent(str(envelope["rationale"]), "    ")]
    lines += _bullets("assumptions", envelope.get("assumptions"))
    lines += _confidence(envelope)
    if envelope.get("revision_notes"):
        lines += ["  revision notes:", *_indent(str(envelope["revision_notes"]), "    ")]
    return lines


def _critique_body(envelope: Mapping[str, Any] | None) -> list[str]:
    if not envelope:
        return []
    lines = [f"  verdict: {str(envelope.get('verdict', '?')).upper()}", *_confidence(envelope)]
    if envelope.get("summary"):
        lines += _indent(str(envelope["summary"]))
    issues = envelope.get("issues") or []
    lines.append("  issues:" if issues else "  issues: none")
    for issue in issues:
        lines.append(f"    [{issue.get('severity')}] {issue.get('description')}")
        if issue.get("suggestion"):
            lines.append(f"      fix: {issue['suggestion']}")
    return lines + _bullets("suggestions", envelope.get("suggestions"))


def _confidence(envelope: Mapping[str, Any]) -> list[str]:
    value = envelope.get("confidence")
    return [f"  confidence: {value:.2f}"] if isinstance(value, int | float) else []


def _synthesis_block(synthesis: Mapping[str, Any] | None, style: Style) -> list[str]:
    if not synthesis:
        return [style.bad("═══ Synthesis: none (no valid proposal to synthesize)")]
    lines = [style.bold("═══ Synthesis"), *_role_head("Synthesized", synthesis, style)]
    if synthesis.get("fallback_from"):
        lines.append(style.warn(f"  stood in for {_reason(synthesis['fallback_from'])}"))
    envelope = synthesis.get("envelope")
    if envelope:
        lines += _indent(str(envelope.get("answer", "")))
        if synthesis.get("value") is not None:  # the decision, as the answer schema asked
            lines += ["  decided:", *(f"    {key}: {_shown(v)}" for key, v in synthesis["value"].items())]
        lines += _bullets("resolved", envelope.get("resolved")) + _bullets("dissent", envelope.get("dissent"))
        lines += _confidence(envelope)
        if envelope.get("rationale"):
            lines += ["  rationale:", *_indent(str(envelope["rationale"]), "    ")]
    return lines + _role_problems(synthesis, style)


def _per_role(per_role: Mapping[str, Any]) -> list[str]:
    lines = ["per role:"]
    for role, entry in per_role.items():
        usage = entry.get("usage") or {}
        calls = entry.get("calls", 0)
        spent = f"{fmt_tokens(usage)} · {fmt_cost(usage.get('cost_usd'))}"
        lines.append(f"  {role}: {calls} call{'s' * (calls != 1)} · {spent}")
    return lines if len(lines) > 1 else []


def render(tool: Deliberation, result: Mapping[str, Any], *, colour: bool = False) -> str:
    return (
        render_confer(result, colour=colour) if tool == "confer" else render_coordinate(result, colour=colour)
    )


# ---------------------------------------------------------------- live progress


@dataclass(slots=True)
class _Row:
    label: str
    provider: str
    role: str | None
    state: str = "waiting"  # waiting, running, then the answer's status
    started: float | None = None
    elapsed: float | None = None
    heard: str = ""  # the end of the text streamed so far (a synthesis's: all of it)
    chars: int = 0  # of everything streamed (text, thinking, tool-call arguments)

    def hear(self, delta: Delta) -> None:
        self.chars += len(delta.text)
        if delta.kind == "start":  # a new model call (a tool hop, a re-prompt): its text replaces
            self.heard = ""
        elif delta.kind == "text":
            heard = self.heard + delta.text
            # A synthesis is an envelope whose `answer` is shown as it is written: keep it whole.
            self.heard = heard if self.role == "synthesizer" else heard[-_HEARD_CHARS:]

    @property
    def shown(self) -> str:
        """What a running row shows of its text: the synthesis's answer so far, else the text."""
        answer = envelope_answer(self.heard) if self.role == "synthesizer" else None
        return answer if answer is not None else self.heard

    @property
    def finished(self) -> bool:
        return self.state not in ("waiting", "running")


@dataclass
class LiveProgress:
    """Rows of providers (confer) or roles (coordinate), grouped in stages that run one after the
    other; each stage starts when the previous one is done. Redrawn in place on `stream`."""

    stages: list[list[_Row]]
    stream: TextIO
    clock: Callable[[], float] = time.monotonic
    _stage: int = field(default=0, init=False)  # index of the stage now running
    _drawn: int = field(default=0, init=False)  # lines on screen from the last draw, to move back over
    _mark: float = field(default=0.0, init=False)  # when the last answer (or the start) came in

    @classmethod
    def for_confer(cls, providers: Sequence[str], stream: TextIO) -> LiveProgress:
        return cls([[_Row(name, name, None) for name in providers]], stream)

    @classmethod
    def for_coordinate(
        cls, proposer: str, critics: Sequence[str], synthesizer: str, rounds: int, stream: TextIO
    ) -> LiveProgress:
        stages: list[list[_Row]] = []
        for number in range(1, rounds + 1):
            stages.append([_Row(f"round {number} proposer {proposer}", proposer, "proposer")])
            stages.append([_Row(f"round {number} critic {name}", name, "critic") for name in critics])
        stages.append([_Row(f"synthesizer {synthesizer}", synthesizer, "synthesizer")])
        return cls(stages, stream)

    def start(self) -> None:
        self._mark = self.clock()
        self._start_stage()

    def heard(self, provider: str, role: str | None, delta: Delta) -> None:
        """The DeltaSink handed to confer/coordinate: a running row's text grows as it streams
        (a role nobody planned, a confer's reviewer or chair, gets its row as it starts)."""
        row = self._running_row(provider, role)
        if row is None:
            label = _event_label({"provider": provider, "role": role}, planned=self._planned(role))
            row = _Row(label, provider, role, state="running", started=self.clock())
            self._current().append(row)
        row.hear(delta)

    async def sink(self, event: Mapping[str, Any]) -> None:
        """The ProgressSink handed to confer/coordinate: one call per finished provider or role
        (and heartbeats naming who is awaited, which the live rows already show)."""
        if "waiting" not in event:
            self.record(event)

    def record(self, event: Mapping[str, Any]) -> None:
        now = self.clock()
        row = self._running_row(str(event.get("provider")), event.get("role"))
        if row is None:  # a confer's review and chair, a synthesizer fallback: shown as they come
            label = _event_label(event, planned=self._planned(event.get("role")))
            row = _Row(label, str(event.get("provider")), event.get("role"), started=self._mark)
            self._current().append(row)
        row.state, row.elapsed = str(event.get("status")), now - (row.started or self._mark)
        self._mark = now
        if all(r.finished for r in self._current()) and self._stage + 1 < len(self.stages):
            self._stage += 1
            self._start_stage()

    def _planned(self, role: Any) -> bool:
        return any(row.role == role for stage in self.stages for row in stage)

    def lines(self) -> list[str]:
        now = self.clock()
        rows = [row for stage in self.stages for row in stage]
        width = max((len(r.label) for r in rows), default=0)
        return [_progress_line(row, width, now) for row in rows]

    def draw(self) -> None:
        lines = self.lines()
        self.stream.write(_UP_AND_CLEAR * self._drawn + "".join(f"{line}\x1b[K\n" for line in lines))
        self.stream.flush()
        self._drawn = len(lines)

    @contextlib.asynccontextmanager
    async def shown(self) -> AsyncIterator[LiveProgress]:
        """Redraw every REDRAW_SECONDS while the body runs, then draw the final state once. The
        body's own exception comes out as it is, not wrapped in the task group's ExceptionGroup
        (the CLI maps a ConfigError or an OSError to one line)."""
        self.start()
        try:
            async with running_beside(self._redraw_forever):
                yield self
        finally:
            self.draw()

    async def _redraw_forever(self) -> None:
        while True:
            self.draw()
            await anyio.sleep(REDRAW_SECONDS)

    def _current(self) -> list[_Row]:
        return self.stages[self._stage]

    def _start_stage(self) -> None:
        for row in self._current():
            if row.state == "waiting":
                row.state, row.started = "running", self.clock()

    def _running_row(self, provider: str, role: Any) -> _Row | None:
        for row in self._current():
            if row.state == "running" and row.provider == provider and row.role == role:
                return row
        return None


def _event_label(event: Mapping[str, Any], *, planned: bool) -> str:
    """A row nobody planned: a role of a stage shown as it comes (a confer's reviewers and
    chair), or a stand-in for a planned one (a synthesizer fallback)."""
    role, provider = event.get("role"), event.get("provider")
    if role == "synthesizer":
        return f"synthesizer {provider} (fallback)" if planned else f"synthesizer {provider}"
    if role == "reviewer":
        return f"reviewer {provider}"
    prefix = f"round {event.get('round')} {role} " if role else ""
    return f"{prefix}{provider}"


def _progress_line(row: _Row, width: int, now: float) -> str:
    if row.state == "waiting":
        return f"  · {row.label.ljust(width)}  waiting"
    if row.state == "running":
        line = f"  … {row.label.ljust(width)}  running  {now - (row.started or now):5.1f}s"
        if row.chars:  # streaming: how far it is, and the end of what it says
            tail = " ".join(row.shown.split())[-_TAIL_SHOWN:]
            line += f"  ~{-(-row.chars // 4)} tok" + (f"  …{tail}" if tail else "")
        return line
    mark = "✓" if row.state == "ok" else "✗"
    return f"  {mark} {row.label.ljust(width)}  {row.state.ljust(7)}  {row.elapsed or 0.0:5.1f}s"


_ANSWER_STARTS = re.compile(r'"answer"\s*:\s*"')
_STRING_SO_FAR = re.compile(r'(?:[^"\\]|\\.)*')  # up to the closing quote, or all there is
_CUT_ESCAPE = re.compile(r"\\u[0-9a-fA-F]{0,3}$")  # a \u escape whose digits have not all come


def envelope_answer(partial: str) -> str | None:
    """The `answer` of a role envelope still being written, as far as it has come, its JSON
    escapes decoded; None before it starts (or when what came is not JSON text)."""
    start = _ANSWER_STARTS.search(partial)
    if start is None:
        return None
    written = _STRING_SO_FAR.match(partial, start.end())
    raw = _CUT_ESCAPE.sub("", written.group() if written else "")
    try:
        answer = orjson.loads(f'"{raw}"')
    except ValueError:
        return None
    return answer if isinstance(answer, str) else None


def progress_for(
    tool: Deliberation, args: Mapping[str, Any], config: Config, stream: TextIO
) -> LiveProgress | None:
    """Live progress on `stream` when it is a terminal that understands cursor moves; else None."""
    if not _is_tty(stream) or os.environ.get("TERM") == "dumb" or args.get("dry_run"):
        return None
    if tool == "confer":
        return LiveProgress.for_confer(args.get("providers") or config.panel, stream)
    roles = config.roles
    return LiveProgress.for_coordinate(
        args.get("proposer") or roles.proposer,
        args.get("critics") or roles.critics,
        args.get("synthesizer") or roles.synthesizer,
        int(args.get("rounds") or 1),
        stream,
    )
