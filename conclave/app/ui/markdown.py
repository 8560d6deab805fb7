"""One finished session as Markdown: what an MCP client reads at `conclave://sessions/{id}/summary`
(docs/server.md#resources). It renders the page's records (`model.SessionView`), so the page and
the summary read a transcript the same way, and says codes in the page's words (`labels`).

The text is written for a model as much as a person: whole answers (quoted, as what the models
wrote), plain sentences for what went wrong, no tables."""

from __future__ import annotations

from typing import Any

import orjson

from conclave.app.labels import degraded_label, plural, status_label
from conclave.app.render import fmt_cost, fmt_ms, fmt_tokens
from conclave.app.ui.model import Review, SessionView, Turn


def session_markdown(view: SessionView) -> str:
    summary = view.summary
    asked = "Task" if summary.tool == "coordinate" else "Question"
    follows = f" It follows up session {summary.parent}." if summary.parent else ""
    opening = f"Status: {status_label(summary.status)}. Started {summary.started}.{follows}"
    lines = [f"# {summary.tool} session {summary.session_id}", "", opening]
    lines += ["", f"## {asked}", "", view.question or "(not recorded)"]
    if view.context:
        lines += ["", "## Context", "", view.context]
    if summary.tool == "coordinate":
        lines += _debate(view)
    else:
        lines += _section("Answers", [block for turn in view.answers for block in _turn(turn)])
        lines += _review(view.review)
        vote = view.vote
        if vote is not None:
            agreed = vote.consensus is not None
            said = f"Consensus: {_json(vote.consensus)}" if agreed else f"No consensus: {vote.reason}"
            lines += _section("Vote", [said])
    if view.synthesis is not None:
        lines += _section("Synthesis", _turn(view.synthesis, body=_synthesis_text(view.synthesis)))
    lines += _section("Totals", _totals(view))
    return "\n".join(_single_blanks(lines)).strip() + "\n"


def _debate(view: SessionView) -> list[str]:
    lines: list[str] = []
    for round_ in view.rounds:
        blocks: list[str] = []
        if round_.proposal is not None:
            blocks += _turn(round_.proposal, body=_field(round_.proposal, "proposal"))
        for critique in round_.critiques:
            verdict = (critique.envelope or {}).get("verdict")
            head = f"verdict: {verdict}" if verdict else None
            blocks += _turn(critique, body=_field(critique, "summary"), note=head)
        lines += _section(f"Round {round_.number}", blocks)
    if view.stop_reason:
        lines += ["", f"The debate stopped: {view.stop_reason}."]
    return lines


def _turn(turn: Turn, *, body: str | None = None, note: str | None = None) -> list[str]:
    """A member's heading (who, in which role, how it went), then its text or its error."""
    role = f" as {turn.role}" if turn.role else ""
    head = f"### {turn.provider}{role} ({turn.model}): {status_label(turn.status)}"
    lines = ["", head]
    if turn.fallback_from is not None:
        lines.append(f"Answered for {turn.fallback_from.who} ({turn.fallback_from.label}).")
    if turn.status == "late":
        lines.append(f"Late ({degraded_label('late')}).")
    if note:
        lines.append(note)
    text = body if body is not None else turn.text
    if text:
        lines += ["", *_quoted(text)]
    elif turn.error or turn.error_code:
        lines += ["", f"Error ({turn.error_code or 'error'}): {turn.error or 'no message'}"]
    return lines


def _review(review: Review | None) -> list[str]:
    if review is None:
        return []
    ranked = [
        f"{i}. {row.get('provider')}: Borda {row.get('borda')}, mean rank {row.get('mean_rank')}, "
        f"{plural(int(row.get('reviews') or 0), 'review')}"
        for i, row in enumerate(review.aggregate, 1)
    ]
    agreement = f" (agreement {review.agreement:.2f})" if review.agreement is not None else ""
    return _section("Review", [f"Top: {review.top or 'none'}{agreement}", "", *ranked])


def _synthesis_text(turn: Turn) -> str | None:
    """The synthesis's answer prose (its envelope's `answer`), and its decided value when asked."""
    answer = _field(turn, "answer") or turn.text
    decided = f"\n\nDecided: {_json(turn.value)}" if turn.value is not None else ""
    return f"{answer or ''}{decided}" or None


def _field(turn: Turn, key: str) -> str | None:
    value = (turn.envelope or {}).get(key)
    return value if isinstance(value, str) else None


def _totals(view: SessionView) -> list[str]:
    lines = [
        f"- usage: {fmt_tokens(view.usage)}",
        f"- cost: {fmt_cost(view.usage.get('cost_usd'))}",
        f"- latency: {fmt_ms(view.latency_ms)}",
    ]
    if view.degraded:
        lines.append("- degraded:")
        lines += [f"  - {reason.who}: {reason.label}" for reason in view.degraded]
    return lines


def _quoted(text: str) -> list[str]:
    """A model's words as a block quote: a heading it wrote cannot pass for one of the summary's."""
    return [f"> {line}" if line else ">" for line in text.splitlines()]


def _section(title: str, body: list[str]) -> list[str]:
    return ["", f"## {title}", "", *body] if body else []


def _single_blanks(lines: list[str]) -> list[str]:
    """Blocks are joined with a blank line before each; where two meet, one is enough."""
    return [line for i, line in enumerate(lines) if line or (i > 0 and lines[i - 1])]


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()
