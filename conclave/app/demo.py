"""`conclave demo`: `confer` and `coordinate` with worker tools, then a `confer` whose members give
structured answers and vote, end to end, against the built-in SIMULATED panel, so a new user sees
the whole thing work with no API key and no network.

Everything real runs: the provider adapters over loopback HTTP, the worker tool loop, the SSRF-guarded
`fetch` (reaching a tiny local page, allowed through `fetch.allow_private`), `verify`, role envelopes,
telemetry and transcripts. Only the models are fake: each simulated member is scripted below with
`Rule`s keyed on what its last message contains, so the same script serves every call it gets.
Two members call their tools natively (structured calls, docs/worker-loop.md#native-tool-calling);
the third is set to the `<tool_call>` tag protocol, the fallback for servers without tool support,
so both encodings show.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import anyio

from conclave.app.command import conclave_command
from conclave.app.render import Deliberation, progress_for, render, wants_colour
from conclave.app.runner import run_tool
from conclave.app.runtime import Runtime, open_runtime
from conclave.app.sim import NativeCall, Reply, Rule, Scenario, SimPanel
from conclave.app.sim.page import page_server
from conclave.app.sim.simulated import SIMULATED_MEMBERS, allow_local_page, simulated_config
from conclave.app.tail import Filters, backlog, format_event
from conclave.deliberation import review
from conclave.schema.answer_schema import choices_schema
from conclave.schema.config import Config, ProviderConfig, RolesConfig

FETCHER, CHECKER, TAGGER = "sim-openai", "sim-anthropic", "sim-gemini"  # their confer parts
TOOL_MODES = {FETCHER: "native", CHECKER: "native", TAGGER: "tags"}  # TAGGER is set to tags below
# Best first: who settles most of the question (height and arithmetic, height, arithmetic only).
CONFER_PREFERENCE = (TAGGER, FETCHER, CHECKER)
REVIEW_NOTES = {
    TAGGER: "Answers both parts: the height from the page, and the product.",
    FETCHER: "The height, from the page it fetched; says nothing of 17 x 23.",
    CHECKER: "Checks 17 x 23 exactly, but leaves the height unanswered.",
}
CHAIR = Rule(
    "Write the final answer to the question",
    Reply(
        text=json.dumps(
            {
                "answer": "The Exampleville lighthouse is 47 metres tall (its own page says so), and "
                "17 x 23 = 391 is right (checked with verify).",
                "resolved": ["Height: 47 m, from the page two members fetched; 391 checked exactly."],
                "dissent": [],
                "confidence": 0.9,
                "rationale": "Combines the best-ranked answer with the exact arithmetic check.",
            }
        )
    ),
)
CHECKER_THINKING = "The user wants 17 x 23 checked; the verify tool settles arithmetic exactly."
TAIL_EVENTS = 14
UI_COMMAND = "conclave ui"  # the CLI adds the --config and --set options the demo ran with
UI_URL = "http://127.0.0.1:8780/"  # where `conclave ui` serves by default

# Phrases that appear only in one role's prompt (conclave/prompts/roles/*.user.txt), so one scripted
# model can answer as critic and as synthesizer. A fed-back result opens with its tool's marker.
TOOL_RESULT = "<tool_result"
FETCH_RESULT, VERIFY_RESULT = '<tool_result name="fetch"', '<tool_result name="verify"'
PROPOSER_ASK = "Write your proposal for this task"
REVIEW_ASK = "Rank every one of these labels"  # confer's review (reviewer.user.txt)
CHAIR_ASK = "Write the final answer to the question"  # confer's synthesis (chair.user.txt)
CRITIC_ASK = "Review this proposal on your own"
REVISION_ASK = "Revise your proposal in the light of these critiques"  # proposer_revision.user.txt
SECOND_ROUND = "Review round 2."  # what critic.user.txt says in round 2
SYNTHESIZER_ASK = "Write the final answer to the task"
REVISED_BYTES = 25_600_000  # the revised budget: 10,000 entries of 2 KiB plus 512 bytes of overhead

# The vote: a confer with `--choices`, each member answering {choice, reason}; two pick the same
# queue and the third dissents, so the vote has a consensus and names the dissent.
VOTE_QUESTION = "Which message queue should a three-person team start with for its background jobs?"
VOTE_CHOICES = ("SQS", "Kafka", "RabbitMQ")
VOTE_WINNER, VOTE_DISSENT = "SQS", "Kafka"
VOTES = {
    FETCHER: {"choice": VOTE_WINNER, "reason": "Managed: no brokers for three people to run or patch."},
    CHECKER: {
        "choice": VOTE_WINNER,
        "reason": "Cheapest to operate at this size, and enough for background jobs.",
    },
    TAGGER: {"choice": VOTE_DISSENT, "reason": "Replayable history is worth having from the start."},
}

COORDINATE_TASK = (
    "Choose an eviction policy for an in-process cache of up to 10,000 API responses "
    "(about 2 KiB each) in a web service."
)


def _model(member: str) -> str:
    return SIMULATED_MEMBERS[member][1]


def _tag(name: str, args: Mapping[str, Any]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'args': args})}</tool_call>"


def _reply(payload: Mapping[str, Any] | str) -> Reply:
    return Reply(text=payload if isinstance(payload, str) else json.dumps(payload))


# ---------------------------------------------------------------- the scripts


def fetcher_script(page_url: str) -> Scenario:
    """sim-openai (native): in confer, fetches the page, then answers from it; in coordinate, proposes,
    then revises in round 2 after sim-anthropic's critique."""
    proposal = {
        "proposal": "Use LRU eviction with a 10-minute TTL, capped at 10,000 entries (about 20 MB).",
        "rationale": "Recent responses are the likeliest to be asked again; the TTL bounds staleness.",
        "assumptions": ["Responses may be up to 10 minutes stale."],
        "confidence": 0.75,
    }
    revised = {
        "proposal": "Use LRU eviction capped at 10,000 entries. Invalidate an entry when its resource is "
        "written, and keep a 10-minute TTL only as a safety net for missed invalidations. Budget about "
        "25 MB: 2 KiB per response plus about 512 bytes of per-entry overhead.",
        "rationale": "Recent responses are the likeliest to be asked again; invalidating on writes keeps "
        "hot entries cached while they are valid, and the TTL still bounds staleness.",
        "assumptions": ["Every write goes through this service, so it can invalidate what it changes."],
        "confidence": 0.85,
        "revision_notes": "Took up sim-anthropic's major issue: entries are now invalidated on writes "
        "and the TTL is only a safety net, so hot entries are no longer evicted while valid. Took up its "
        "minor one too: the budget counts about 512 bytes of overhead per entry (25 MB, not 20 MB). "
        "sim-gemini's cold start: the cache starts empty and fills on demand; no warm-up is needed.",
    }
    return Scenario(
        replies=(Reply(tool_calls=(NativeCall("fetch", {"url": page_url}),)),),
        rules=(
            Rule(
                TOOL_RESULT, _reply("The Exampleville page I fetched says the lighthouse is 47 metres tall.")
            ),
            Rule(REVISION_ASK, _reply(revised)),
            Rule(PROPOSER_ASK, _reply(proposal)),
        ),
    )


def checker_script() -> Scenario:
    """sim-anthropic (native, thinking first): in confer, checks the arithmetic with verify; in
    coordinate, critic (REVISE in round 1, ACCEPT of the revision in round 2) and synthesizer."""
    check = {"checks": [{"type": "math", "expression": "17 * 23", "expected": 391}]}
    critique = {
        "verdict": "revise",
        "issues": [
            {
                "severity": "major",
                "description": "A fixed TTL evicts hot entries that are still valid.",
                "suggestion": "Refresh the TTL on hits, or invalidate on writes instead.",
            },
            {"severity": "minor", "description": "The memory estimate ignores per-entry overhead."},
        ],
        "summary": "Sound choice; the TTL policy needs a second look.",
        "confidence": 0.7,
    }
    accepted = {
        "verdict": "accept",
        "issues": [],
        "summary": "The revision answers both issues: write invalidation keeps hot entries, and the "
        "budget now counts per-entry overhead.",
        "confidence": 0.85,
    }
    synthesis = {
        "answer": "Use LRU eviction capped at 10,000 entries, invalidated on writes, with a 10-minute TTL "
        "as a safety net for missed invalidations. Budget about 25 MB including per-entry overhead.",
        "resolved": [
            "TTL vs invalidation (round 1): invalidate on writes, keep the TTL only as a safety net; "
            "both critics accept the revision."
        ],
        "dissent": [],
        "confidence": 0.85,
        "rationale": "The revised proposal took up the critic's issues; both critics accepted it in round 2.",
    }
    return Scenario(
        replies=(Reply(tool_calls=(NativeCall("verify", check),), thinking=CHECKER_THINKING),),
        rules=(
            Rule(TOOL_RESULT, _reply("17 × 23 = 391 is right: I checked it with the verify tool.")),
            Rule(SYNTHESIZER_ASK, _reply(synthesis)),
            Rule(SECOND_ROUND, _reply(accepted)),
            Rule(CRITIC_ASK, _reply(critique)),
        ),
    )


def tagger_script(page_url: str) -> Scenario:
    """sim-gemini (tag protocol): in confer, fetches the page too; in coordinate, checks the memory
    estimate with verify, then reviews (in round 2, the revised budget)."""
    check = {"checks": [{"type": "math", "expression": "10000 * 2048", "expected": 20480000}]}
    critique = {
        "verdict": "accept",
        "issues": [{"severity": "minor", "description": "Say how the cache behaves on a cold start."}],
        "summary": "Checked: 10,000 entries of 2 KiB are 20,480,000 bytes, so the 20 MB estimate holds.",
        "confidence": 0.85,
    }
    revised_check = {
        "checks": [{"type": "math", "expression": "10000 * (2048 + 512)", "expected": REVISED_BYTES}]
    }
    accepted = {
        "verdict": "accept",
        "issues": [],
        "summary": "Checked: 10,000 entries of 2.5 KiB are 25,600,000 bytes, so the 25 MB budget holds.",
        "confidence": 0.9,
    }
    answer = "The page says 47 metres, first lit in 1893; and 17 × 23 is 391, worked by hand."
    return Scenario(
        replies=(_reply(_tag("fetch", {"url": page_url})),),
        rules=(
            Rule(FETCH_RESULT, _reply(answer)),
            Rule(str(REVISED_BYTES), _reply(accepted)),  # the round-2 check's result says the figure
            Rule(VERIFY_RESULT, _reply(critique)),
            Rule(SECOND_ROUND, _reply(_tag("verify", revised_check))),
            Rule(CRITIC_ASK, _reply(_tag("verify", check))),
        ),
    )


def script_panel(panel: SimPanel, page_url: str, confer_session: str) -> None:
    for member, scenario in (
        (FETCHER, fetcher_script(page_url)),
        (CHECKER, checker_script()),
        (TAGGER, tagger_script(page_url)),
    ):
        review = Rule(REVIEW_ASK, _reply(reviewer_envelope(confer_session, member)))
        rules = (review, *scenario.rules) if member != CHECKER else (review, CHAIR, *scenario.rules)
        panel.set_scenario(_model(member), dataclasses.replace(scenario, rules=(vote_rule(member), *rules)))


def vote_rule(member: str) -> Rule:
    """`member`'s structured answer to the vote's question: its `VOTES` object, sent as the reply
    to the request for structured output."""
    return Rule(VOTE_QUESTION, Reply(value=VOTES[member]))


def reviewer_envelope(session_id: str, reviewer: str) -> dict[str, Any]:
    """`reviewer`'s blind ranking in the confer: the answers by how much of the question they
    settle, in the labels this session shows it (a real model reads them; the script knows)."""
    shown = [m for m in SIMULATED_MEMBERS if m != reviewer]  # in the order confer asked them
    label_of = {member: label for label, member in review.shuffled(session_id, reviewer, shown)}
    best_first = [m for m in CONFER_PREFERENCE if m != reviewer]
    notes = {label_of[m]: REVIEW_NOTES[m] for m in best_first}
    return {"ranking": [label_of[m] for m in best_first], "notes": notes, "confidence": 0.7}


# ---------------------------------------------------------------- the run


def demo_config(base: Config, panel: SimPanel, page_port: int) -> Config:
    """The simulated members (TAGGER on the tag protocol), plus a fetch policy that lets them reach
    the local page (and nothing else private: only 127.0.0.1 and only the page's port are added)."""
    config = simulated_config(base, panel.base_urls())
    tagger = dataclasses.replace(config.providers[TAGGER], tool_mode="tags")
    return allow_local_page(
        dataclasses.replace(config, providers={**config.providers, TAGGER: tagger}), page_port
    )


@dataclasses.dataclass
class DemoRun:
    config: Config
    page_url: str
    confer: dict[str, Any]
    coordinate: dict[str, Any]
    vote: dict[str, Any]

    @property
    def sessions(self) -> tuple[str, str]:
        """The confer with tools and the coordinate."""
        return self.confer["session_id"], self.coordinate["session_id"]

    @property
    def all_sessions(self) -> tuple[str, str, str]:
        """Those two, and the confer that voted."""
        return (*self.sessions, self.vote["session_id"])


async def run_demo(base: Config, *, latency_ms: float, progress: TextIO | None) -> DemoRun:
    """The three calls through the real stack; `progress` (a terminal) shows them live."""
    tag = uuid.uuid4().hex[:6]  # short: `tail` shows session ids of up to 20 characters whole
    async with SimPanel(latency_ms=latency_ms, caching=True) as panel, page_server() as page_port:
        page_url = f"http://127.0.0.1:{page_port}/lighthouse"
        script_panel(panel, page_url, f"demo-confer-{tag}")
        config = demo_config(base, panel, page_port)
        async with open_runtime(config) as runtime:
            confer_args = _confer_args(page_url, f"demo-confer-{tag}")
            conferred = await _call(runtime, "confer", confer_args, progress)
            debated = await _call(runtime, "coordinate", _coordinate_args(f"demo-coord-{tag}"), progress)
            voted = await _call(runtime, "confer", _vote_args(f"demo-vote-{tag}"), progress)
    return DemoRun(config, page_url, conferred, debated, voted)


def _confer_args(page_url: str, session_id: str) -> dict[str, Any]:
    question = f"How tall is the Exampleville lighthouse? Its page is {page_url}. And is 17 × 23 = 391?"
    return {
        "question": question,
        "worker_tools": ["fetch", "verify"],
        "session_id": session_id,
        "review": True,
        "synthesize": True,
    }


def _vote_args(session_id: str) -> dict[str, Any]:
    """`conclave confer --choices SQS,Kafka,RabbitMQ`: no tools, no review, no synthesis; the
    vote over the answers is the point."""
    return {
        "question": VOTE_QUESTION,
        "answer_schema": choices_schema(VOTE_CHOICES),
        "session_id": session_id,
    }


def _coordinate_args(session_id: str) -> dict[str, Any]:
    # Two rounds: round 1's critique asks for a revision, round 2 reviews it (and stops there,
    # converged, once both critics accept).
    return {
        "task": COORDINATE_TASK,
        "context": TRAFFIC,
        "worker_tools": ["fetch", "verify"],
        "session_id": session_id,
        "rounds": 2,
    }


def _traffic() -> str:
    """The coordinate's context: a week of traffic per endpoint, the kind of table such a decision
    is made from (deterministic, so every run sends the same bytes). It is long enough for a
    provider to cache: sim-anthropic reads it from its cache when it turns from critic to
    synthesizer."""
    rows = ["Traffic over the last 7 days, per endpoint (requests/day, median response KiB, writes/day):"]
    for i in range(90):
        resource = ("accounts", "invoices", "payments", "customers", "reports", "plans")[i % 6]
        rows.append(
            f"GET /api/v1/{resource}/{i:03d}: {1200 + 37 * i} req/day, {1 + i % 4} KiB, {i % 7} writes/day"
        )
    return "\n".join(rows)


TRAFFIC = _traffic()


async def _call(
    runtime: Runtime, tool: Deliberation, args: dict[str, Any], stream: TextIO | None
) -> dict[str, Any]:
    live = progress_for(tool, args, runtime.config, stream) if stream is not None else None
    return await run_tool(runtime, tool, args, live)


# ---------------------------------------------------------------- checking and showing it


def problems(run: DemoRun) -> list[str]:
    """What did not work as scripted; empty when the demo shows what it promises."""
    found = [f"confer is degraded: {run.confer['degraded_reasons']}"] if run.confer["degraded"] else []
    if run.coordinate["degraded"]:
        found.append(f"coordinate is degraded: {run.coordinate['degraded_reasons']}")
    answers = {a["provider"]: a for a in run.confer["answers"]}
    found += _tool_problem(answers.get(FETCHER), "fetch") + _tool_problem(answers.get(CHECKER), "verify")
    found += _tool_problem(answers.get(TAGGER), "fetch")
    critics = {c["provider"]: c for c in run.coordinate["critiques"]}
    found += _tool_problem(critics.get(TAGGER), "verify")
    if not (run.coordinate.get("synthesis") or {}).get("envelope"):
        found.append("coordinate has no synthesis")
    found += _revision_problems(run.coordinate)
    peer_review = run.confer.get("review") or {}
    if peer_review.get("top") != CONFER_PREFERENCE[0] or len(peer_review.get("rankings") or []) != 3:
        found.append(f"confer's review is not what the reviewers said: {peer_review}")
    if not (run.confer.get("synthesis") or {}).get("envelope"):
        found.append("confer has no synthesis")
    if not (run.coordinate.get("usage") or {}).get("cached_input_tokens"):
        found.append("coordinate read nothing from a prompt cache")
    return found + vote_problems(run.vote)


def vote_problems(voted: Mapping[str, Any]) -> list[str]:
    """The vote came out as scripted: every member's answer valid and as it gave it, `choice`
    won by VOTE_WINNER 2 of 3 with TAGGER the one dissent, and the consensus says so."""
    if voted.get("degraded"):
        return [f"the vote's confer is degraded: {voted.get('degraded_reasons')}"]
    given = {a.get("provider"): a.get("value") for a in voted.get("answers") or []}
    found = [
        f"{who} did not answer {meant}: {given.get(who)}"
        for who, meant in VOTES.items()
        if given.get(who) != meant
    ]
    vote = voted.get("vote")
    if not isinstance(vote, dict):
        return [*found, "the vote's confer has no vote"]
    if vote.get("consensus") != {"choice": VOTE_WINNER}:
        found.append(
            f"the vote has no consensus on {VOTE_WINNER}: {vote.get('consensus')} ({vote.get('reason')})"
        )
    choice: Mapping[str, Any] = next((f for f in vote.get("fields") or [] if f.get("field") == "choice"), {})
    counted = (choice.get("winner"), choice.get("votes"), choice.get("of"))
    if counted != (VOTE_WINNER, 2, 3):
        found.append(f"the vote on choice is not {VOTE_WINNER} 2 of 3: {counted}")
    if choice.get("dissent") != [{"provider": TAGGER, "value": VOTE_DISSENT}]:
        found.append(f"the vote does not name {TAGGER}'s dissent for {VOTE_DISSENT}: {choice.get('dissent')}")
    if vote.get("not_counted"):
        found.append(f"the vote did not count {vote['not_counted']}")
    return found


def _revision_problems(debate: Mapping[str, Any]) -> list[str]:
    """The debate shows a revision: round 1 asks for one, round 2's proposal answers it in its
    revision notes, and its critics accept."""
    rounds = debate.get("rounds") or []
    if len(rounds) != 2:
        return [f"coordinate ran {len(rounds)} round(s), not 2"]
    verdicts = [[(c.get("envelope") or {}).get("verdict") for c in r.get("critiques") or []] for r in rounds]
    found = [] if "revise" in verdicts[0] else [f"no critic asked for a revision in round 1: {verdicts[0]}"]
    if not ((rounds[1].get("proposal") or {}).get("envelope") or {}).get("revision_notes"):
        found.append("round 2's proposal has no revision notes")
    if set(verdicts[1]) != {"accept"} or not debate.get("converged"):
        found.append(f"round 2's critics did not all accept the revision: {verdicts[1]}")
    return found


def _tool_problem(answer: Mapping[str, Any] | None, tool: str) -> list[str]:
    calls = (answer or {}).get("inner_tool_calls") or []
    who = (answer or {}).get("provider", "?")
    if not any(c["name"] == tool and c["status"] == "ok" for c in calls):
        return [f"{who} did not use {tool} successfully (tool calls: {calls})"]
    used, meant = (answer or {}).get("tool_mode"), TOOL_MODES.get(who)
    return [] if used == meant else [f"{who} called its tools as {used}, not {meant}"]


def report(run: DemoRun, out: TextIO, colour: bool, ui_command: str = UI_COMMAND) -> int:
    """Print the whole story; 0 when everything worked, 1 otherwise."""
    confer_id, coordinate_id, vote_id = run.all_sessions
    _section(
        out, "1/3  confer: three members in parallel with fetch and verify; blind review; a chair's synthesis"
    )
    print(ENCODINGS_NOTE, file=out)
    print(render("confer", run.confer, colour=colour), file=out)
    _section(
        out, "2/3  coordinate: proposer -> critics (with tools) -> revised proposal -> critics -> synthesizer"
    )
    print(render("coordinate", run.coordinate, colour=colour), file=out)
    _section(
        out, f"3/3  confer --choices {','.join(VOTE_CHOICES)}: structured answers, and the council's vote"
    )
    print(VOTE_NOTE, file=out)
    print(render("confer", run.vote, colour=colour), file=out)
    _section(out, f"telemetry: the last events of these three sessions, from {run.config.telemetry.path}")
    _print_events(Path(run.config.telemetry.path), run.all_sessions, out, colour)
    command = conclave_command()
    print(f"\nsessions: confer {confer_id}  coordinate {coordinate_id}  vote {vote_id}", file=out)
    print(f"  see every event of one:  {command} tail --session {confer_id} --lines all", file=out)
    print(f"  transcripts are under {run.config.transcripts.dir}/", file=out)
    status = _verdict(problems(run), out, command)
    _print_ui(run, ui_command, out)
    return status


def _print_ui(run: DemoRun, ui_command: str, out: TextIO) -> None:
    """The last thing to do: look at the sessions on the page."""
    confer_id, coordinate_id, vote_id = run.all_sessions
    print(
        f"\nsee the three sessions in your browser, on a read-only local page:\n  {ui_command}",
        file=out,
    )
    print(
        f"  then open {UI_URL}  (the list: {confer_id}, {coordinate_id} and {vote_id} are at the top)",
        file=out,
    )
    print(f"  or one of them directly: {UI_URL}session?id={confer_id}", file=out)


def _section(out: TextIO, title: str) -> None:
    print(f"\n{'=' * 100}\n{title}\n{'=' * 100}", file=out)


def _print_events(path: Path, sessions: Sequence[str], out: TextIO, colour: bool) -> None:
    if not path.exists():
        print("(no event log: telemetry.path points nowhere writable?)", file=out)
        return
    events, _ = backlog(path, Filters(sessions=tuple(sessions)), TAIL_EVENTS)
    for _raw, event in events:
        print(format_event(event, colour), file=out)


def _verdict(found: list[str], out: TextIO, command: str) -> int:
    print(f"\n{SIMULATED_NOTE}\n{real_keys(command)}", file=out)
    if found:
        print("\ndemo: FAILED", file=out)
        for problem in found:
            print(f"  - {problem}", file=out)
        return 1
    print("\ndemo: ok - confer, coordinate and a vote ran end to end against the simulated panel", file=out)
    return 0


SIMULATED_BANNER = (
    "Conclave demo - SIMULATED PANEL. Three scripted models (sim-openai, sim-anthropic, sim-gemini) answer\n"
    "from a local loopback server: no real provider is called and no API key is needed. Everything\n"
    "else is real: the adapters, the worker tool loop, fetch and verify, telemetry and transcripts."
)
ENCODINGS_NOTE = (
    f"{FETCHER} and {CHECKER} call tools natively (structured tool calls); {TAGGER} is set to\n"
    "the <tool_call> tag protocol (tool_mode: tags), the fallback for servers without tool support.\n"
    "Each answer's header says which encoding it used; the policy is the same for both."
)
VOTE_NOTE = (
    f"Each member answers {{choice, reason}} (the --choices schema): choice is one of\n"
    f"{', '.join(VOTE_CHOICES)}, and the vote counts it. The free-text reason is not voted on, so it\n"
    "never blocks a consensus."
)
SIMULATED_NOTE = "Every answer above came from the simulated panel (scripted in conclave/app/demo.py)."


def real_keys(command: str = "conclave") -> str:
    """How to go on with real models; `command` is what runs conclave here (`conclave_command`)."""
    doctor, confer = f"{command} doctor", f'{command} confer "your question"'
    width = max(len(doctor), len(confer)) + 3
    return (
        "To ask real models:\n"
        "  export OPENAI_API_KEY=... ANTHROPIC_API_KEY=... GEMINI_API_KEY=...   # or put them in ./.env\n"
        f"  {doctor:<{width}}# checks the config and the keys, one tiny call each\n"
        f'  {confer:<{width}}# or: {command} coordinate "your task"'
    )


def main(base: Config, *, latency_ms: float, out: TextIO, err: TextIO, ui_command: str = UI_COMMAND) -> int:
    """The `conclave demo` command (the CLI parses arguments and loads `base`; `ui_command` is the
    `conclave ui` that reads the same configuration, so the same event log and transcripts)."""
    print(SIMULATED_BANNER, file=out, flush=True)
    run = anyio.run(functools.partial(run_demo, base, latency_ms=latency_ms, progress=err))
    return report(run, out, wants_colour(out), ui_command)


# ---------------------------------------------------------------- `conclave demo --local`: a real model

# One llama.cpp server, three members: each names its model after itself, and PersonaTransport adds
# its own system prompt (conclave/app/local.py says why it takes a transport).
LOCAL_PERSONAS = {
    "local-brief": "Answer in at most two short sentences.",
    "local-careful": "You are a careful engineer: name one risk first, then answer.",
    "local-contrarian": "Argue briefly for the option most people would not pick first.",
}
LOCAL_QUESTION = "Should a three-person team run its own message queue, or use a managed one?"
LOCAL_MAX_TOKENS = 120
LOCAL_TIMEOUT_SECONDS = 120  # a slow or busy CPU still finishes; the answers are capped anyway
LOCAL_BANNER = (
    "Conclave demo - LOCAL MODEL. llama.cpp's server runs SmolLM2-135M-Instruct on this machine, on\n"
    "loopback: nothing leaves it and no API key is needed. Three members share the one server, each\n"
    "with its own system prompt. A 135M-parameter model answers fast and often wrongly: the point is\n"
    "a real model's text, usage and speed through the whole stack."
)


def local_config(base: Config, openai_base_url: str) -> Config:
    """`base` with its providers, panel and roles replaced by the members on the local server."""
    providers = {
        name: ProviderConfig(
            name=name, kind="openai", model=name, base_url=openai_base_url, api_key_env=None, tool_mode="tags"
        )
        for name in LOCAL_PERSONAS
    }
    names = tuple(providers)
    roles = RolesConfig(
        proposer=names[0], critics=names[1:], synthesizer=names[1], synthesizer_fallbacks=(names[0], names[2])
    )
    source = f"{base.source} (providers replaced by the local model)"
    return dataclasses.replace(base, providers=providers, panel=names, roles=roles, source=source)


async def run_local_demo(base: Config, *, progress: TextIO | None, out: TextIO) -> dict[str, Any]:
    """The confer on the local model; the server is stopped before this returns."""
    from conclave.app.local import PersonaTransport, local_server  # the simulated demo never needs it

    async with local_server() as server:
        print(f"llama.cpp listens on {server.openai_base_url} (pid {server.pid})", file=out, flush=True)
        config = local_config(base, server.openai_base_url)
        async with open_runtime(config, transport=PersonaTransport(LOCAL_PERSONAS)) as runtime:
            args = {
                "question": LOCAL_QUESTION,
                "max_tokens": LOCAL_MAX_TOKENS,
                "timeout_seconds": LOCAL_TIMEOUT_SECONDS,
                "session_id": f"demo-local-{uuid.uuid4().hex[:6]}",
            }
            return await _call(runtime, "confer", args, progress)


def speed_lines(result: Mapping[str, Any]) -> list[str]:
    """Tokens per second: each member's output over its own latency, and the panel's over the call's
    (the server generates the three answers at once)."""
    lines = []
    for answer in result.get("answers") or []:
        tokens, seconds = answer["usage"]["output_tokens"], answer["latency_ms"] / 1000
        lines.append(f"  {answer['provider']:<18}{_speed(tokens, seconds)}")
    total, seconds = result["usage"]["output_tokens"], result["latency_ms"] / 1000
    lines.append(f"  {'the panel':<18}{_speed(total, seconds)}")
    return lines


def _speed(tokens: int, seconds: float) -> str:
    rate = tokens / seconds if seconds > 0 else 0.0
    return f"{tokens:>5} output tokens in {seconds:5.1f} s: {rate:6.1f} tokens/s"


def report_local(result: Mapping[str, Any], out: TextIO, colour: bool, ui_command: str) -> int:
    """The answers, their speed and where to look next; 0 when every member answered."""
    _section(out, "confer: three members on the local model")
    print(render("confer", result, colour=colour), file=out)
    _section(out, "speed, from each answer's usage and latency")
    print("\n".join(speed_lines(result)), file=out)
    print(f"\nsession {result['session_id']}: see it with  {ui_command}", file=out)
    missing = [a["provider"] for a in result.get("answers") or [] if a["status"] != "ok"]
    if missing:
        print(f"\ndemo --local: FAILED - no answer from {', '.join(missing)}", file=out)
        return 1
    print("\ndemo --local: ok - three real answers from the local model", file=out)
    return 0


def main_local(base: Config, *, out: TextIO, err: TextIO, ui_command: str = UI_COMMAND) -> int:
    """`conclave demo --local`: 2 when the local model is not installed (the message says how)."""
    from conclave.app.local import LocalModelUnavailable, LocalServerFailed, model_path

    try:
        model_path()  # missing packages are said first, with how to install them
        print(LOCAL_BANNER, file=out, flush=True)
        result = anyio.run(functools.partial(run_local_demo, base, progress=err, out=out))
    except (LocalModelUnavailable, LocalServerFailed) as exc:
        print(f"conclave demo --local: {exc}", file=err)
        return 2 if isinstance(exc, LocalModelUnavailable) else 1
    return report_local(result, out, wants_colour(out), ui_command)
