"""The session pages as HTML: the list of recent sessions, and one session as the deliberation it
was (the eval runs' pages are `evalpages`, in the same frame: `document`).

Pure functions of the records in `sessions` and `model`; every piece of text goes through
`markup` (see its rule). The live parts are marked with `data-*` attributes that `static/app.js`
reads: where to stream events from, and where to fetch the refreshed part of the page.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from conclave.app.labels import (
    THREAD_GAP_LABELS,
    degraded_label,
    field_label,
    humanize,
    plural,
    status_label,
    warning_label,
)
from conclave.app.render import fmt_cost, fmt_ms, fmt_tokens
from conclave.app.ui.markup import Safe, el, join, void
from conclave.app.ui.model import CostPart, Hop, Reason, Review, Round, SessionView, Turn, Vote, VotedField
from conclave.app.ui.sessions import SessionSummary
from conclave.app.ui.threads import Excerpt, Thread, ThreadTurn

TITLE = "Conclave"


def document(title: str, body: Safe, prefix: str, section: str = "sessions") -> Safe:
    """A whole page: `body` under the header, whose links lead to the sessions and the eval runs
    (`section` is the one this page belongs to)."""
    head = el(
        "head",
        void("meta", charset="utf-8"),
        void("meta", name="viewport", content="width=device-width, initial-scale=1"),
        el("title", title),
        void("link", rel="stylesheet", href=f"{prefix}/static/style.css"),
        el("script", src=f"{prefix}/static/app.js", defer=True),
    )
    top = el(
        "header",
        el("a", TITLE, href=f"{prefix}/", class_="brand"),
        el("nav", [_nav(name, href, section) for name, href in _sections(prefix)], class_="sections"),
        el("span", "read-only: this page starts nothing", class_="aside"),
    )
    return Safe("<!doctype html>\n" + el("html", head, el("body", top, body), lang="en"))


def _sections(prefix: str) -> tuple[tuple[str, str], ...]:
    return (("sessions", f"{prefix}/"), ("evals", f"{prefix}/evals"))


def _nav(name: str, href: str, section: str) -> Safe:
    here = name == section
    return el(
        "a", name, href=href, class_="crumb here" if here else "crumb", aria_current="page" if here else None
    )


# -- the list ---------------------------------------------------------------------------------


def sessions_page(rows: Sequence[SessionSummary], prefix: str, offset: int) -> Safe:
    live = el(
        "main",
        sessions_table(rows, prefix),
        id="live",
        data_fragment=f"{prefix}/?fragment=1",
        data_events=f"{prefix}/events?{urlencode({'from': offset})}",
    )
    return document(f"{TITLE} · sessions", live, prefix)


def sessions_table(rows: Sequence[SessionSummary], prefix: str) -> Safe:
    if not rows:
        empty = "No sessions yet. Run `conclave demo`, or a confer or coordinate, and they appear here."
        return el("p", empty, class_="empty")
    head = el(
        "tr", [el("th", h) for h in ("started", "tool", "question", "status", "cost", "duration", "answers")]
    )
    body = [_session_row(row, prefix) for row in rows]
    return join(
        [el("h1", "Recent sessions"), el("table", el("thead", head), el("tbody", body), class_="sessions")]
    )


def _session_row(row: SessionSummary, prefix: str) -> Safe:
    shown = row.question or el("span", _unrecorded(row), class_="muted")
    link = el("a", shown, href=session_href(prefix, row.session_id))
    question = el(
        "td", link, el("div", row.session_id, class_="sid"), _follows(row, prefix), class_="question"
    )
    return el(
        "tr",
        el("td", _when(row.started), class_="when"),
        el("td", el("span", row.tool, class_="tool")),
        question,
        el("td", status_badge(row.status), _degraded_mark(row)),
        el("td", _row_cost(row), class_="num"),
        el("td", fmt_ms(row.duration_ms), class_="num"),
        el("td", _row_answers(row), class_="num"),
        data_session=row.session_id,
        data_status=row.status,
        data_thread=row.thread_id,
    )


def _follows(row: SessionSummary, prefix: str) -> Safe | None:
    """A follow-up names the session it continued, so a thread's turns read as one in the list."""
    if row.parent is None:
        return None
    link = el("a", row.parent, href=session_href(prefix, row.parent))
    return el("div", "↳ follow-up of ", link, class_="thread-mark")


def _unrecorded(row: SessionSummary) -> str:
    """What the list shows where a session's question is not known (the event log keeps it only
    with telemetry.include_content; the transcript, which always has it, is written at the end,
    and never for a dry run)."""
    if row.status == "dry_run":
        return "(dry run: question not recorded)"
    if row.running:
        return "(running: the question shows when it ends)"
    return "(question not recorded)"


def _row_cost(row: SessionSummary) -> str:
    if row.running:
        return "-"
    if row.status == "dry_run":  # nothing was called; $0.00 would read as a cheap call
        return f"dry run: {_bound(row.max_cost_usd)}"
    return fmt_cost(row.cost_usd)


def _bound(max_cost_usd: float | None) -> str:
    return "no bound (a price is unknown)" if max_cost_usd is None else f"at most {fmt_cost(max_cost_usd)}"


def _row_answers(row: SessionSummary) -> str:
    if row.answers is None or row.status == "dry_run":
        return "-"
    return f"{plural(row.answers, 'answer')}, {row.ok or 0} ok"


def _degraded_mark(row: SessionSummary) -> Safe | None:
    if not row.degraded_reasons:
        return None
    return el("span", f"{plural(len(row.degraded_reasons), 'part')} missing", class_="note bad")


def session_href(prefix: str, session_id: str) -> str:
    return f"{prefix}/session?{urlencode({'id': session_id})}"


# -- one session ------------------------------------------------------------------------------


def session_page(
    view: SessionView, prefix: str, offset: int, *, streaming: bool = False, thread: Thread | None = None
) -> Safe:
    """`streaming`: the session runs in the process serving this page, whose `/live` streams its
    answers' text as it comes (`data-live`, which `app.js` follows into `#streaming`); `thread`:
    the one it belongs to, whose earlier turns come first."""
    sid = view.summary.session_id
    live: dict[str, object] = {}
    if view.summary.running:
        live = {
            "data_fragment": session_href(prefix, sid) + "&fragment=1",
            "data_events": f"{prefix}/events?{urlencode({'session': sid, 'from': offset})}",
            "data_live": f"{prefix}/live?{urlencode({'session': sid})}" if streaming else None,
        }
    main = el("main", session_body(view, thread, prefix), id="live", **live)
    return document(f"{TITLE} · {view.summary.tool} {sid}", main, prefix)


def session_body(view: SessionView, thread: Thread | None = None, prefix: str = "") -> Safe:
    summary = view.summary
    title = el(
        "h1",
        el("span", summary.tool, class_="tool"),
        " ",
        summary.session_id,
        " ",
        status_badge(summary.status),
    )
    parts: list[Safe | None] = [_earlier(thread, prefix), title, _thread_mark(thread, prefix)]
    parts += [_dry_run_banner(view), _degraded_banner(view)]
    parts += [_warnings(view.warnings), _question(view), _totals(view), _costs(view)]
    if summary.running:
        parts += [_activity(view), _streaming()]
    parts += [_answers(view.answers), _vote(view.vote), *(_round(r) for r in view.rounds)]
    parts.append(_review(view.review))
    parts.append(_synthesis(view.synthesis))
    if not summary.running and view.activity:
        parts.append(_activity(view))
    return join(parts)


def _dry_run_banner(view: SessionView) -> Safe | None:
    """A dry run called nothing: the page says so, with the bound its plan put on the cost
    (kept by `session_end`), rather than show a cost of $0.00."""
    if not view.dry_run:
        return None
    who = f" It would have asked {', '.join(view.planned)}." if view.planned else ""
    text = (
        f"nothing was called and nothing was spent.{who} Its plan bounds the cost: "
        f"{_bound(view.summary.max_cost_usd)}. The whole plan went back to the caller."
    )
    return el("section", el("strong", "Dry run: "), text, class_="banner info")


def _degraded_banner(view: SessionView) -> Safe | None:
    if not view.degraded and view.summary.status != "degraded":
        return None
    items = [el("li", _reason(r)) for r in view.degraded] or [el("li", "(no reason recorded)")]
    head = el("strong", "Degraded: this result is missing parts.")
    return el("section", head, el("ul", items), class_="banner degraded", role="alert")


def _reason(reason: Reason) -> Safe:
    """`sim-gemini (critic): timed out (no answer before the call's deadline)`, its codes small."""
    return join([f"{reason.who}: {reason.label} ", _code(*reason.codes)])


def _warnings(warnings: Sequence[str]) -> Safe | None:
    if not warnings:
        return None
    items = [el("li", warning_label(w), " ", _code(w)) for w in warnings]
    return el("section", el("strong", "Warnings"), el("ul", items), class_="banner warn")


def _question(view: SessionView) -> Safe:
    label = "Task" if view.summary.tool == "coordinate" else "Question"
    if view.question is None:
        missing = el("p", _question_missing(view), class_="muted")
        return el("section", el("h2", label), missing, class_="question")
    context = el("details", el("summary", "Context"), el("pre", view.context)) if view.context else None
    return el("section", el("h2", label), el("p", view.question, class_="prose"), context, class_="question")


def _question_missing(view: SessionView) -> str:
    kept = "the event log keeps it only when telemetry.include_content is on"
    if view.dry_run:
        return f"Not recorded: a dry run writes no transcript, and {kept}."
    if view.summary.running:
        return "The question is in the transcript, written when the call ends."
    return f"Not recorded: this session has no transcript (turned off, or removed), and {kept}."


def _totals(view: SessionView) -> Safe:
    usage = view.usage
    cost = fmt_cost(usage.get("cost_usd")) if usage else "-"
    cells = [
        ("cost", f"dry run: {_bound(view.summary.max_cost_usd)}" if view.dry_run else cost),
        ("tokens", fmt_tokens(usage) if usage and not view.dry_run else "-"),
        ("duration", fmt_ms(view.latency_ms if view.latency_ms is not None else view.summary.duration_ms)),
        ("started", _when(view.summary.started)),
    ]
    if view.rounds_asked is not None:
        cells.append(("rounds", _rounds(view, view.rounds_asked)))
    if view.stop_reason is not None:
        cells.append(("stopped", view.stop_reason))
    items = [el("div", el("dt", name), el("dd", value)) for name, value in cells]
    return el("dl", items, class_="totals")


def _rounds(view: SessionView, asked: int) -> str:
    if view.dry_run:
        return f"{asked} asked, none run"
    if view.rounds_run is None:  # still running
        return f"{asked} asked"
    return f"{view.rounds_run} of {asked} asked"


def _costs(view: SessionView) -> Safe | None:
    """Where the cost went, each part with its cost as a number too (`data-cost`), adding up to
    the total: a confer's answers, review and synthesis; a coordinate's roles."""
    if not view.costs:
        return None
    coordinate = view.summary.tool == "coordinate"
    head = el("tr", [el("th", h) for h in ("role" if coordinate else "part", "", "tokens", "cost")])
    rows = [_cost_row(part) for part in view.costs]
    total = view.usage.get("cost_usd")
    foot = el(
        "tr",
        el("th", "total"),
        el("td"),
        el("td", fmt_tokens(view.usage)),
        el("td", fmt_cost(total), class_="num", data_cost=_data_cost(total)),
    )
    title = "Per role" if coordinate else "Where the cost went"
    table = el("table", el("thead", head), el("tbody", rows), el("tfoot", foot), class_="costs")
    return el("section", el("h2", title), table)


def _cost_row(part: CostPart) -> Safe:
    return el(
        "tr",
        el("th", part.name),
        el("td", part.detail, class_="muted"),
        el("td", fmt_tokens(part.usage) if part.usage else "-"),
        el("td", fmt_cost(part.cost_usd), class_="num", data_cost=_data_cost(part.cost_usd)),
        data_part=part.name,
    )


def _data_cost(cost: object) -> str:
    return repr(float(cost)) if isinstance(cost, int | float) else "unknown"


def _activity(view: SessionView) -> Safe:
    """The session's events as `conclave tail` shows them; `app.js` appends new ones live."""
    live = el("span", "live", class_="pulse") if view.summary.running else None
    lines = [el("li", line) for line in view.activity]
    return el("section", el("h2", "Events ", live), el("ol", lines, id="activity", class_="activity"))


def _streaming() -> Safe:
    """Where `app.js` shows the answers' text as it streams in, a card per member and role, when
    the page hears the session live (hidden until then); the session's end replaces it with the
    whole deliberation."""
    head = el("h2", "Streaming… ", el("span", "live", class_="pulse"))
    note = el(
        "p",
        "The answers as they come in, before they are checked; the final ones replace them.",
        class_="muted",
    )
    return el("section", head, note, el("div", class_="columns"), id="streaming", hidden=True)


# -- the thread -------------------------------------------------------------------------------


def _earlier(thread: Thread | None, prefix: str) -> Safe | None:
    """The thread's turns before this one, oldest first, as one conversation: each question, the
    first lines of each member's answer and the synthesis, each turn linking to its own page."""
    if thread is None or not (thread.earlier or thread.stopped):
        return None
    gap = None
    if thread.stopped is not None:
        words = THREAD_GAP_LABELS.get(thread.stopped) or humanize(thread.stopped)
        gap = el("p", words[:1].upper() + words[1:] + ".", class_="banner info thread-gap")
    numbered = thread.number is not None  # a turn's number is known only from the thread's start
    turns = [_thread_turn(t, i + 1 if numbered else None, prefix) for i, t in enumerate(thread.earlier)]
    head = el("h2", "Thread ", el("span", thread.thread_id, class_="sid"), ": the turns before this one")
    return el("section", head, gap, turns, class_="thread", data_thread=thread.thread_id)


def _thread_turn(turn: ThreadTurn, number: int | None, prefix: str) -> Safe:
    href = session_href(prefix, turn.session_id)
    head = el("h3", f"Turn {number} · " if number else None, el("a", turn.session_id, href=href))
    label = "Task" if turn.tool == "coordinate" else "Question"
    asked = turn.question if turn.question is not None else el("span", "(not recorded)", class_="muted")
    question = el("p", el("strong", f"{label}: "), asked, class_="prose")
    answers = [_excerpt(a, href) for a in turn.answers]
    said = el("div", answers, class_="columns") if answers else el("p", "No answer.", class_="muted")
    synthesis = None
    if turn.synthesis is not None:
        synthesis = el("div", el("h4", "Synthesis"), _excerpt(turn.synthesis, href), class_="synthesis")
    return el("article", head, question, said, synthesis, class_="thread-turn", data_session=turn.session_id)


def _excerpt(said: Excerpt, href: str) -> Safe:
    """A member's earlier answer, its first lines; the whole is on its turn's page."""
    who = f"{said.provider} ({said.role})" if said.role else said.provider
    head = el("header", el("span", who, class_="provider"), status_badge(said.status))
    text = el("div", said.text, class_="text") if said.text else el("p", "(no answer)", class_="muted")
    more = el("a", "the whole answer →" if said.cut else "the whole turn →", href=href, class_="more")
    return el("article", head, text, more, class_=f"card excerpt {_tone(said.status)}")


def _thread_mark(thread: Thread | None, prefix: str) -> Safe | None:
    """Which turn of its thread this session is, and the sessions that followed it up."""
    if thread is None:
        return None
    where = f"Turn {thread.number}" if thread.number is not None else "A later turn"
    if not thread.follow_ups:
        return el("p", f"{where} of thread {thread.thread_id}: the latest turn.", class_="thread-mark")
    links = [
        [", " if i else None, el("a", s, href=session_href(prefix, s))]
        for i, s in enumerate(thread.follow_ups)
    ]
    return el("p", f"{where} of thread {thread.thread_id}. Followed up by ", links, ".", class_="thread-mark")


# -- answers, rounds, review, synthesis -------------------------------------------------------


def _answers(answers: Sequence[Turn]) -> Safe | None:
    if not answers:
        return None
    return el("section", el("h2", "Answers"), el("div", [_card(a) for a in answers], class_="columns"))


def _card(turn: Turn, body: Safe | None = None) -> Safe:
    """One member's turn: who, how it went, what it said, and its tool calls (collapsed)."""
    head = el(
        "header",
        el("span", turn.provider, class_="provider"),
        status_badge(turn.status),
        el("div", _facts(turn), class_="facts"),
    )
    said = body if body is not None else _said(turn)
    return el("article", head, _error(turn), said, _calls(turn.calls), class_=f"card {_tone(turn.status)}")


def _error(turn: Turn) -> Safe | None:
    """What went wrong in words, then the provider's own message (its words: escaped)."""
    if turn.error_code is None and turn.error is None:
        return None
    code = turn.error_code or "error"
    message = f": {turn.error}" if turn.error else ""
    return el("p", degraded_label(code), message, " ", _code(code), class_="error")


def _facts(turn: Turn) -> str:
    parts = [
        turn.model,
        fmt_ms(turn.latency_ms),
        fmt_cost(turn.cost_usd),
        plural(turn.hops, "hop"),
    ]
    if turn.tool_mode:
        parts.append(f"tools: {turn.tool_mode}")
    if turn.fallback_from:
        parts.append(f"instead of {turn.fallback_from.who}: {turn.fallback_from.label}")
    return " · ".join(parts)


def _said(turn: Turn) -> Safe | None:
    if turn.value is not None:  # a structured answer: its fields, not its JSON text
        return _value(turn.value)
    if turn.envelope is not None:
        return _envelope(turn.envelope)
    if turn.status == "invalid_answer" and turn.text:
        note = "Its last reply, not valid against the answer schema (so not counted in the vote):"
        return join([el("p", note, class_="muted"), el("pre", turn.text, class_="invalid")])
    return el("div", turn.text, class_="text") if turn.text else None


def _value(value: Mapping[str, Any]) -> Safe:
    """A structured answer's object, a field a line: its name as the schema spells it (as the
    vote names it), then its value (a string as it is, anything else as one line of JSON)."""
    fields = [
        el("div", el("span", key, class_="key"), " ", el("span", _shown(v), class_="text"), class_="field")
        for key, v in value.items()
    ]
    return el("div", fields, class_="envelope value")


def _envelope(envelope: Mapping[str, Any]) -> Safe:
    """A role's JSON envelope, its main field first, as prose and lists rather than JSON."""
    parts: list[Safe] = []
    for key, value in envelope.items():
        if key in ("verdict", "confidence"):
            continue
        parts.append(_field(key, value))
    return el("div", parts, class_="envelope")


def _field(key: str, value: Any) -> Safe:
    name = el("span", field_label(key), class_="key", title=key)  # the envelope's own name on hover
    if isinstance(value, list):
        if not value:
            return el("div", name, " none", class_="field")
        return el("div", name, el("ul", [el("li", _item(v)) for v in value]), class_="field")
    if key in ("answer", "proposal"):
        return el("div", str(value), class_="text")
    return el("div", name, " ", str(value), class_="field")


def _item(value: Any) -> Safe:
    """A list item of an envelope: a critic's issue reads `major: what (suggestion)`."""
    if isinstance(value, dict) and "description" in value:
        severity = el("span", str(value.get("severity", "")), class_=f"sev {value.get('severity', '')}")
        hint = el("div", "→ ", str(value["suggestion"]), class_="hint") if value.get("suggestion") else None
        return join([severity, " ", str(value["description"]), hint])
    return el("span", str(value))


def _calls(calls: Sequence[Hop]) -> Safe | None:
    if not calls:
        return None
    return el("div", [_hop(h) for h in calls], class_="hops")


def _hop(hop: Hop) -> Safe:
    reason = [f" · {humanize(hop.reason)} ", _code(hop.reason)] if hop.reason else None
    summary = el("summary", f"hop {hop.number} · {hop.tool} · ", status_badge(hop.status), reason)
    if hop.said:  # the tag the model wrote
        call = el("pre", hop.said, class_="call")
    elif hop.arguments is not None:  # a native call: its name and arguments
        call = el("pre", f"{hop.tool} {hop.arguments}", class_="call")
    else:
        call = el("p", "(a native tool call; its arguments were not kept)", class_="muted")
    result = el("pre", hop.result, class_="result") if hop.result is not None else None
    return el(
        "details", summary, el("h4", "call"), call, el("h4", "result, as fed back (neutralized)"), result
    )


def _round(round_: Round) -> Safe:
    proposal = _card(round_.proposal, _with_confidence(round_.proposal)) if round_.proposal else None
    critiques = [_card(c, _with_confidence(c, verdict=True)) for c in round_.critiques]
    return el(
        "section",
        el("h2", f"Round {round_.number}"),
        el("h3", "Proposal"),
        proposal,
        el("h3", "Critiques"),
        el("div", critiques, class_="columns") if critiques else el("p", "No critique.", class_="muted"),
        class_="round",
    )


def _with_confidence(turn: Turn, verdict: bool = False) -> Safe | None:
    if turn.envelope is None:
        return el("div", turn.text, class_="text raw") if turn.text else None
    tags = []
    if verdict and "verdict" in turn.envelope:
        value = str(turn.envelope["verdict"])
        tags.append(el("span", value, class_=f"verdict {value}"))
    if "confidence" in turn.envelope:
        tags.append(el("span", f"confidence {turn.envelope['confidence']}", class_="note"))
    return join([el("div", tags, class_="tags") if tags else None, _envelope(turn.envelope)])


def _review(review: Review | None) -> Safe | None:
    if review is None:
        return None
    width = max((len(r.ranking) for r in review.rankings), default=0)
    head = el("tr", el("th", "reviewer"), [el("th", f"#{i + 1}") for i in range(width)])
    rows = [
        el(
            "tr",
            el("th", r.reviewer),
            [el("td", p, el("div", r.notes.get(p), class_="hint")) for p in r.ranking],
        )
        for r in review.rankings
    ]
    agreement = "not measured (it needs two complete rankings)"
    if review.agreement is not None:
        agreement = f"{review.agreement:.2f} (0: none, 1: complete)"
    return el(
        "section",
        el("h2", "Review"),
        el(
            "p",
            f"Each member ranked the others' answers, blind ({plural(len(review.rankings), 'ranking')} "
            f"came back). Agreement (Kendall's W): {agreement}.",
            class_="muted",
        ),
        el("table", el("thead", head), el("tbody", rows), class_="ranking"),
        _aggregate(review),
    )


def _aggregate(review: Review) -> Safe:
    head = el("tr", [el("th", h) for h in ("", "provider", "Borda", "mean rank", "reviews")])
    rows = [
        el(
            "tr",
            el("td", str(i + 1)),
            el("td", str(row.get("provider")), " ★" if row.get("provider") == review.top else None),
            el("td", _num(row.get("borda")), class_="num"),
            el("td", _num(row.get("mean_rank")), class_="num"),
            el("td", str(row.get("reviews", "-")), class_="num"),
            class_="top" if row.get("provider") == review.top else None,
        )
        for i, row in enumerate(review.aggregate)
    ]
    return el("table", el("caption", "Aggregate"), el("thead", head), el("tbody", rows), class_="aggregate")


def _vote(vote: Vote | None) -> Safe | None:
    """The vote over the structured answers, as a table a voted field a row, under the consensus
    (or why there is none); the members it did not count are named below it."""
    if vote is None:
        return None
    if vote.consensus is not None:
        agreed = ", ".join(f"{key} = {_shown(value)}" for key, value in vote.consensus.items())
        verdict = el("span", "consensus: ", agreed, class_="consensus good")
    else:
        verdict = el("span", "no consensus: ", vote.reason or "(no reason recorded)", class_="consensus bad")
    head = el("tr", [el("th", h) for h in ("field", "winner", "votes", "share", "unanimous", "dissent")])
    rows = [_voted_row(f) for f in vote.fields]
    table = el("table", el("thead", head), el("tbody", rows), class_="vote") if rows else None
    counted = None
    if vote.not_counted:
        counted = el(
            "p",
            el("strong", "Not counted"),
            f" (no answer valid against the schema): {', '.join(vote.not_counted)}",
            class_="not-counted",
        )
    about = (
        "Each voted field's most-given value among the valid answers; a consensus needs a strict "
        "majority (more than half) on every voted field."
    )
    return el("section", el("h2", "Vote · ", verdict), el("p", about, class_="muted"), table, counted)


def _voted_row(field: VotedField) -> Safe:
    if field.won:
        winner: Safe = el("td", _shown(field.winner), class_="winner")
    else:
        missing = "a tie" if field.votes else "none: no valid answer gives it"
        winner = el("td", el("span", missing, class_="muted"), class_="winner")
    count = f"{_count(field.votes)} of {_count(field.of)}"
    share = f"{field.share:.0%}" if field.share is not None else "-"
    dissent = (
        el("ul", [el("li", el("strong", d.provider), ": ", _shown(d.value)) for d in field.dissent])
        if field.dissent
        else el("span", "none", class_="muted")
    )
    return el(
        "tr",
        el("th", field.field),
        winner,
        el("td", count, class_="num"),
        el("td", share, class_="num"),
        el("td", "yes" if field.unanimous else "no"),
        el("td", dissent, class_="dissent"),
        data_field=field.field,
    )


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _shown(value: Any) -> str:
    """A JSON value on one line, a string as it is (as the CLI shows a structured answer)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def _synthesis(turn: Turn | None) -> Safe | None:
    if turn is None:
        return None
    return el("section", el("h2", "Synthesis"), _card(turn, _with_confidence(turn)), class_="synthesis")


# -- small pieces -----------------------------------------------------------------------------


def status_badge(status: str) -> Safe:
    """A status in words (`dry run`, `timed out`); the code itself on hover."""
    return el("span", status_label(status), class_=f"badge {_tone(status)}", title=status)


def _code(*codes: str) -> Safe:
    """The codes behind words, small: what to search the docs and the event log for."""
    return el("small", ", ".join(codes), class_="code")


def _tone(status: str) -> str:
    if status in ("ok", "accept"):
        return "good"
    if status in ("running", "dry_run", "ended", "revise"):
        return "info"
    return "bad"


def _when(ts: str) -> str:
    try:
        stamp = datetime.fromisoformat(ts)
    except ValueError:
        return ts
    return stamp.strftime("%Y-%m-%d %H:%M:%S UTC")


def _num(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, int | float) else "-"


def not_found(prefix: str, what: str, section: str = "sessions") -> Safe:
    main = el("main", el("h1", "Not found"), el("p", what))
    return document(f"{TITLE} · not found", main, prefix, section)
