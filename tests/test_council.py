"""The full council (docs/tools.md#confer): `confer` with blind peer review and a chair's
synthesis, and `coordinate` that stops once its critics agree, over the simulated panel.

Reviewers are scripted from the session: the labels each reviewer sees are shuffled
reproducibly from the session id (`review.shuffled`), so a test that knows the session id
knows which label hides which answer, and scripts each reviewer's ranking by provider."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from conclave.app.runtime import Runtime, open_runtime
from conclave.app.sim import Reply, Rule, Scenario, SimPanel
from conclave.deliberation import review
from conclave.deliberation.confer import confer
from conclave.deliberation.coordinate import coordinate
from conclave.deliberation.results import Ranking
from conclave.schema.config import Config
from conclave.schema.schemas import first_error
from tests.support import read_events

pytestmark = pytest.mark.anyio

PRICE = {"input_per_mtok": 1.0, "output_per_mtok": 4.0}
MEMBERS = {"alpha": "openai", "beta": "anthropic", "gamma": "gemini", "delta": "openai"}
REVIEW_ASK = "Rank every one of these labels"
CHAIR_ASK = "Write the final answer to the question"
SYNTHESIS = {"answer": "Use Kafka.", "confidence": 0.8, "resolved": [], "dissent": []}
# Every member's answer names it, so a test can see whose answer reached whom.
ANSWERS = {name: f"ANSWER-OF-{name.upper()}: pick option {i}" for i, name in enumerate(MEMBERS, 1)}



@pytest.fixture
def open_rt(make_config: Callable[..., Config], panel: SimPanel, tmp_path: Path) -> Callable[..., Any]:
    def open_for(**sections: Any) -> Any:
        providers = {
            name: {"kind": kind, "model": f"m-{name}", "base_url": panel.base_url(kind), "price": PRICE}  # type: ignore[arg-type]
            for name, kind in MEMBERS.items()
        }
        roles = {"proposer": "alpha", "critics": ["beta", "gamma"], "synthesizer": "delta"}
        roles["synthesizer_fallbacks"] = ["alpha"]  # type: ignore[assignment]
        sections.setdefault("transcripts", {"dir": str(tmp_path / "transcripts")})
        config = make_config(providers, retry={"max_attempts": 1}, roles=roles, **sections)
        return open_runtime(config)

    return open_for


def reviewer_reply(session_id: str, reviewer: str, preference: list[str]) -> str:
    """`reviewer`'s envelope ranking the others by `preference` (providers, best first), in the
    labels this session shows it."""
    others = [name for name in MEMBERS if name != reviewer]
    label_of = {provider: label for label, provider in review.shuffled(session_id, reviewer, others)}
    ranking = [label_of[p] for p in preference if p != reviewer]
    notes = {label: f"reason for {label}" for label in ranking}
    return json.dumps({"ranking": ranking, "notes": notes, "confidence": 0.7})


def script(panel: SimPanel, session_id: str, preference: list[str], *, chair: Reply | None = None) -> None:
    for name in MEMBERS:
        rules = [Rule(REVIEW_ASK, Reply(text=reviewer_reply(session_id, name, preference)))]
        rules.append(Rule(CHAIR_ASK, chair or Reply(text=json.dumps(SYNTHESIS))))
        panel.set_scenario(f"m-{name}", Scenario(replies=(Reply(text=ANSWERS[name]),), rules=tuple(rules)))


async def run(rt: Runtime, **args: Any) -> dict[str, Any]:
    result = (await confer(rt, {"question": "Which queue?", **args})).to_dict()
    error = first_error("confer.output.json", result)
    assert error is None, f"{error.message} at {list(error.absolute_path)}" if error else ""
    return result


def sent_to(panel: SimPanel, model: str, marker: str) -> list[str]:
    bodies = [json.dumps(r.body) for r in panel.received if r.model == model]
    return [b for b in bodies if marker in b]


# -- review ---------------------------------------------------------------------------------------


async def test_every_member_reviews_the_others_blind_and_the_rankings_come_back_by_name(
    open_rt: Callable[..., Any], panel: SimPanel, events_path: Path
) -> None:
    preference = ["gamma", "alpha", "delta", "beta"]
    script(panel, "council-1", preference)
    async with open_rt() as rt:
        result = await run(rt, session_id="council-1", review=True)
    block = result["review"]
    assert result["degraded"] is False and "synthesis" not in result
    rankings = {r["reviewer"]: r["ranking"] for r in block["rankings"]}
    assert rankings == {name: [p for p in preference if p != name] for name in MEMBERS}
    assert {r["reviewer"]: sorted(r["notes"]) for r in block["rankings"]}["alpha"] == [
        "beta",
        "delta",
        "gamma",
    ]
    assert [a["provider"] for a in block["aggregate"]] == preference
    assert block["top"] == "gamma" and block["agreement"] == 1.0
    for name in MEMBERS:
        (request,) = sent_to(panel, f"m-{name}", REVIEW_ASK)
        assert ANSWERS[name].split(":")[0] not in request, "a reviewer never sees its own answer"
        assert all(ANSWERS[o].split(":")[0] in request for o in MEMBERS if o != name)
        strangers = [o for o in MEMBERS if o != name]
        assert all(f"m-{o}" not in request and f'"{o}"' not in request for o in strangers), "labels only"
    events = [e for e in read_events(events_path) if e["event"] == "review"]
    assert sorted(e["reviewer"] for e in events) == sorted(MEMBERS)
    for event in events:
        assert first_error("events/review.json", event) is None
        assert sorted(event["labels"].values()) == sorted(o for o in MEMBERS if o != event["reviewer"])


def test_labels_read_back_to_the_right_providers_under_every_permutation() -> None:
    providers = ["alpha", "beta", "gamma", "delta"]
    for order in itertools.permutations(providers):
        seating = list(zip(review.LABELS, order, strict=False))
        shown_best_first = [label for label, _ in reversed(seating)]
        envelope = {"ranking": shown_best_first, "notes": {seating[0][0]: "last"}, "confidence": 0.5}
        assert review.ranking_problem(envelope, [label for label, _ in seating]) is None
        ranking = review.read_back("epsilon", envelope, seating)
        assert ranking.ranking == tuple(reversed(order))
        assert ranking.notes == {order[0]: "last"}


def test_the_shuffle_is_reproducible_per_session_and_differs_between_reviewers() -> None:
    others = ["alpha", "beta", "gamma", "delta", "epsilon"]
    first = review.shuffled("s-1", "zeta", others)
    assert first == review.shuffled("s-1", "zeta", others)
    assert sorted(p for _, p in first) == sorted(others)
    seats = {tuple(p for _, p in review.shuffled("s-1", f"reviewer-{i}", others)) for i in range(20)}
    assert len(seats) > 5, "each reviewer sees its own order"


def test_the_aggregate_and_agreement_match_hand_computed_values() -> None:
    rankings = [
        Ranking("a", ("b", "c", "d"), {}, None),
        Ranking("b", ("c", "a", "d"), {}, None),
        Ranking("c", ("b", "a", "d"), {}, None),
        Ranking("d", ("b", "a", "c"), {}, None),
    ]
    # Borda per ranking of 3: 1, 0.5, 0. b: 1, 1, 1 (3 reviews) -> 1.0; a: 0.5, 0.5, 0.5 -> 0.5;
    # c: 0.5, 1, 0 -> 0.5; d: 0, 0, 0 -> 0.0. Mean ranks: b 1, a 2, c 2, d 3; a and c tie on
    # both, so the name decides.
    aggregate = review.aggregate(rankings, ["a", "b", "c", "d"])
    assert [(s.provider, s.borda, s.mean_rank, s.reviews) for s in aggregate] == [
        ("b", 1.0, 1.0, 3),
        ("a", 0.5, 2.0, 3),
        ("c", 0.5, 2.0, 3),
        ("d", 0.0, 3.0, 3),
    ]
    # Pairs sharing two answers, Spearman over them: (a,b) on {c,d}: 1; (a,c) {b,d}: 1; (a,d) {b,c}: 1;
    # (b,c) {a,d}: 1; (b,d) {c,a}: -1; (c,d) {b,a}: 1. Mean 4/6; W = (3 * 2/3 + 1) / 4 = 0.75.
    assert review.agreement(rankings) == 0.75


def test_ties_go_to_the_better_mean_rank_then_the_name_and_missing_reviews_count_as_none() -> None:
    rankings = [Ranking("x", ("a", "b"), {}, None), Ranking("y", ("b", "a"), {}, None)]
    aggregate = review.aggregate(rankings, ["b", "a", "z"])
    assert [(s.provider, s.borda, s.reviews) for s in aggregate] == [
        ("a", 0.5, 2),
        ("b", 0.5, 2),
        ("z", 0.0, 0),
    ]
    assert aggregate[2].mean_rank is None
    assert review.agreement(rankings[:1]) is None, "one ranking agrees with nobody"
    assert review.agreement(rankings) == 0.0, "two opposite rankings"


async def test_an_invalid_ranking_is_reprompted_once_and_a_second_one_is_degraded(
    open_rt: Callable[..., Any], panel: SimPanel
) -> None:
    script(panel, "council-2", ["alpha", "beta", "gamma", "delta"])
    wrong = json.dumps({"ranking": ["Response A"], "notes": {}, "confidence": 0.5})  # labels missing
    fixed = reviewer_reply("council-2", "beta", ["alpha", "gamma", "delta"])
    panel.set_scenario(
        "m-beta",
        Scenario(
            replies=(Reply(text=ANSWERS["beta"]), Reply(text=wrong), Reply(text=fixed)),
        ),
    )
    panel.set_scenario("m-gamma", Scenario(replies=(Reply(text=ANSWERS["gamma"]), Reply(text=wrong))))
    async with open_rt() as rt:
        result = await run(rt, session_id="council-2", review=True)
    reviewers = {r["reviewer"] for r in result["review"]["rankings"]}
    assert reviewers == {"alpha", "beta", "delta"}, "beta fixed its ranking; gamma did not"
    assert result["degraded"] is True
    assert result["degraded_reasons"] == [
        {"provider": "gamma", "role": "reviewer", "status": "invalid_envelope", "code": "invalid_envelope"}
    ]
    reprompt = sent_to(panel, "m-beta", "are missing; rank every label exactly once")
    assert len(reprompt) == 1, "the validator's error goes back to the reviewer once"


async def test_a_position_biased_reviewer_does_not_favour_one_answer_across_sessions(
    open_rt: Callable[..., Any], panel: SimPanel
) -> None:
    tops = set()
    async with open_rt() as rt:
        for i in range(6):
            session_id = f"biased-{i}"
            script(panel, session_id, ["alpha", "beta", "gamma", "delta"])
            biased = json.dumps(
                {"ranking": ["Response A", "Response B", "Response C"], "notes": {}, "confidence": 1}
            )
            rules = (Rule(REVIEW_ASK, Reply(text=biased)),)
            panel.set_scenario("m-delta", Scenario(replies=(Reply(text=ANSWERS["delta"]),), rules=rules))
            result = await run(rt, session_id=session_id, review=True)
            (mine,) = [r for r in result["review"]["rankings"] if r["reviewer"] == "delta"]
            tops.add(mine["ranking"][0])
    assert len(tops) > 1, "whatever sits under Response A changes from session to session"


# -- synthesis ----------------------------------------------------------------------------------------


async def test_the_chair_writes_the_final_answer_from_the_anonymized_answers_and_the_ranking(
    open_rt: Callable[..., Any], panel: SimPanel, events_path: Path, tmp_path: Path
) -> None:
    script(panel, "council-3", ["beta", "alpha", "gamma", "delta"])
    async with open_rt() as rt:
        result = await run(rt, session_id="council-3", review=True, synthesize=True)
    synthesis = result["synthesis"]
    assert (synthesis["provider"], synthesis["role"], synthesis["status"]) == ("delta", "synthesizer", "ok")
    assert synthesis["envelope"]["answer"] == "Use Kafka." and "inner_tool_calls" not in synthesis
    (request,) = sent_to(panel, "m-delta", CHAIR_ASK)
    assert all(ANSWERS[name].split(":")[0] in request for name in MEMBERS)
    assert "borda" in request and '"beta"' not in request, "the aggregate by label, never by name"
    (event,) = [e for e in read_events(events_path) if e["event"] == "synthesis"]
    assert (event["provider"], event["status"], event["reviewed"]) == ("delta", "ok", True)
    assert first_error("events/synthesis.json", event) is None
    (path,) = (tmp_path / "transcripts").rglob("*.json")
    transcript = json.loads(path.read_text(encoding="utf-8"))
    stages = [(s["role"], s["provider"]) for s in transcript["stages"]]
    assert sorted(stages) == sorted([("reviewer", name) for name in MEMBERS] + [("synthesizer", "delta")])
    assert all(s["exchanges"] for s in transcript["stages"]), "every stage's exchanges are kept"
    assert transcript["result"]["review"]["top"] == "beta"


async def test_a_failing_chair_is_replaced_and_the_result_says_so(
    open_rt: Callable[..., Any], panel: SimPanel
) -> None:
    script(panel, "council-4", ["alpha", "beta", "gamma", "delta"], chair=Reply(status=500))
    panel.set_scenario(
        "m-alpha",
        Scenario(
            replies=(Reply(text=ANSWERS["alpha"]),),
            rules=(Rule(CHAIR_ASK, Reply(text=json.dumps(SYNTHESIS))),),
        ),
    )
    async with open_rt() as rt:
        result = await run(rt, session_id="council-4", synthesize=True)
    synthesis = result["synthesis"]
    assert synthesis["provider"] == "alpha" and synthesis["envelope"]["answer"] == "Use Kafka."
    assert (
        synthesis["fallback_from"]["provider"] == "delta"
        and synthesis["fallback_from"]["code"] == "server_error"
    )
    assert "synthesizer_fallback" in result["warnings"] and result["degraded"] is False
    assert "review" not in result


async def test_a_synthesis_nobody_delivers_is_a_degraded_reason(
    open_rt: Callable[..., Any], panel: SimPanel
) -> None:
    script(panel, "council-5", ["alpha", "beta", "gamma", "delta"], chair=Reply(status=500))
    async with open_rt() as rt:
        result = await run(rt, session_id="council-5", synthesize=True)
    assert result["degraded"] is True
    assert [(r["provider"], r["role"]) for r in result["degraded_reasons"]] == [
        ("delta", "synthesizer"),
        ("alpha", "synthesizer"),
    ]


async def test_a_dry_run_prices_the_review_and_the_synthesis(
    open_rt: Callable[..., Any], panel: SimPanel
) -> None:
    async with open_rt() as rt:
        plain = (await run(rt, dry_run=True))["plan"]
        council = (await run(rt, dry_run=True, review=True, synthesize=True))["plan"]
    assert panel.received == []
    assert council["max_calls"] == plain["max_calls"] + 4 * 2 + 2 * 2, "each reviewer and chair, re-prompted"
    assert council["max_cost_usd"] > plain["max_cost_usd"]
    assert {c.get("role") for c in council["calls"]} >= {"reviewer", "synthesizer"}


# -- convergence ---------------------------------------------------------------------------------------

PROPOSAL = {"proposal": "Use PostgreSQL.", "rationale": "Transactions.", "confidence": 0.7}
REVISED = {**PROPOSAL, "proposal": "Use PostgreSQL with read replicas.", "revision_notes": "Replicas."}


def critique(verdict: str) -> Reply:
    return Reply(text=json.dumps({"verdict": verdict, "issues": []}))


@pytest.mark.parametrize(
    ("verdicts", "stop", "rounds_run", "converged"),
    [
        (("accept", "accept"), True, 1, True),
        (("accept", "revise"), True, 3, False),
        (("accept", "accept"), False, 3, True),
    ],
)
async def test_a_debate_stops_once_every_critic_accepts(
    open_rt: Callable[..., Any],
    panel: SimPanel,
    verdicts: tuple[str, str],
    stop: bool,
    rounds_run: int,
    converged: bool,
) -> None:
    panel.set_scenario(
        "m-alpha", Scenario(replies=(Reply(text=json.dumps(PROPOSAL)), Reply(text=json.dumps(REVISED))))
    )
    panel.set_scenario("m-beta", Scenario(replies=(critique(verdicts[0]),)))
    panel.set_scenario("m-gamma", Scenario(replies=(critique(verdicts[1]),)))
    panel.set_scenario(
        "m-delta", Scenario(replies=(Reply(text=json.dumps({"answer": "PostgreSQL.", "confidence": 0.9})),))
    )
    async with open_rt() as rt:
        result = (
            await coordinate(rt, {"task": "Pick a database.", "rounds": 3, "stop_when_converged": stop})
        ).to_dict()
    assert first_error("coordinate.output.json", result) is None
    assert (result["rounds_run"], result["converged"], len(result["rounds"])) == (
        rounds_run,
        converged,
        rounds_run,
    )
    assert panel.calls("m-alpha") == rounds_run, "no proposal after the critics converged"
    assert result["synthesis"]["envelope"]["answer"] == "PostgreSQL."


async def test_a_reviewer_still_out_at_the_deadline_is_missing_and_the_call_returns(
    open_rt: Callable[..., Any], panel: SimPanel
) -> None:
    script(panel, "council-6", ["alpha", "beta", "gamma", "delta"])
    slow = Reply(text=reviewer_reply("council-6", "gamma", ["alpha", "beta", "delta"]), latency_ms=5000)
    panel.set_scenario(
        "m-gamma", Scenario(replies=(Reply(text=ANSWERS["gamma"]),), rules=(Rule(REVIEW_ASK, slow),))
    )
    async with open_rt() as rt:
        with anyio.fail_after(4):
            result = await run(rt, session_id="council-6", review=True, timeout_seconds=1.0)
    assert {r["reviewer"] for r in result["review"]["rankings"]} == {"alpha", "beta", "delta"}
    assert result["degraded_reasons"] == [
        {"provider": "gamma", "role": "reviewer", "status": "timeout", "code": "deadline_exceeded"}
    ]
