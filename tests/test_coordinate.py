"""`coordinate` end to end against the simulated panel: envelopes, re-prompts, independence,
rounds, synthesizer fallback, degraded results, cost caps and dry runs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from conclave.app.runtime import Runtime, open_runtime
from conclave.app.sim import Reply, Scenario, SimPanel
from conclave.deliberation.coordinate import coordinate
from conclave.schema.answer_schema import answer_errors, choices_schema
from conclave.schema.config import Config
from conclave.schema.schemas import first_error
from tests.support import read_events

pytestmark = pytest.mark.anyio

PRICE = {"input_per_mtok": 1.0, "output_per_mtok": 4.0}
PROPOSAL_V1 = {
    "proposal": "Use PostgreSQL for the ledger (V1-TEXT).",
    "rationale": "Transactions.",
    "confidence": 0.7,
}
PROPOSAL_V2 = {
    "proposal": "Use PostgreSQL with connection pooling (V2-TEXT).",
    "rationale": "Load.",
    "revision_notes": "Added pooling after BETA-ISSUE.",
}
CRITIQUE_BETA = {
    "verdict": "revise",
    "issues": [{"severity": "major", "description": "BETA-ISSUE: load spikes."}],
}
CRITIQUE_GAMMA = {
    "verdict": "accept",
    "issues": [{"severity": "minor", "description": "GAMMA-ISSUE: naming."}],
}
SYNTHESIS = {"answer": "PostgreSQL with pooling.", "confidence": 0.8, "resolved": ["load"], "dissent": []}


def reply(envelope: dict[str, Any]) -> Reply:
    return Reply(text=json.dumps(envelope))


def debate_scenarios() -> dict[str, Scenario]:
    return {
        "m-prop": Scenario(replies=(reply(PROPOSAL_V1), reply(PROPOSAL_V2))),
        "m-beta": Scenario(replies=(reply(CRITIQUE_BETA),)),
        "m-gamma": Scenario(
            replies=(Reply(text="Here is my review:\n```json\n" + json.dumps(CRITIQUE_GAMMA) + "\n```"),)
        ),
        "m-synth": Scenario(replies=(reply(SYNTHESIS),)),
        "m-synth2": Scenario(replies=(reply({**SYNTHESIS, "answer": "Fallback synthesis."}),)),
    }


@pytest.fixture
async def panel() -> AsyncIterator[SimPanel]:
    async with SimPanel(scenarios=debate_scenarios()) as sim:
        yield sim


@pytest.fixture
def open_rt(make_config: Callable[..., Config], panel: SimPanel, tmp_path: Path) -> Callable[..., Any]:
    def open_for(**sections: Any) -> Any:
        def entry(kind: str, model: str) -> dict[str, Any]:
            return {"kind": kind, "model": model, "base_url": panel.base_url(kind), "price": PRICE}

        providers = {
            "prop": entry("openai", "m-prop"),
            "beta": entry("anthropic", "m-beta"),
            "gamma": entry("gemini", "m-gamma"),
            "synth": entry("openai", "m-synth"),
            "synth2": entry("gemini", "m-synth2"),
        }
        config = make_config(
            providers,
            retry={"max_attempts": 1},
            roles={
                "proposer": "prop",
                "critics": ["beta", "gamma"],
                "synthesizer": "synth",
                "synthesizer_fallbacks": ["synth2"],
            },
            transcripts={"dir": str(tmp_path / "transcripts")},
            **sections,
        )
        return open_runtime(config)

    return open_for


async def run(rt: Runtime, **args: Any) -> dict[str, Any]:
    result = (await coordinate(rt, {"task": "Pick a database for the ledger.", **args})).to_dict()
    error = first_error("coordinate.output.json", result)
    assert error is None, f"{error.message} at {list(error.absolute_path)}" if error else ""
    return result


def requests_to(panel: SimPanel, model: str) -> list[str]:
    return [json.dumps(r.body) for r in panel.received if r.model == model]


def _declared_names(body: dict[str, Any]) -> list[str]:
    """The tool names a request declares natively, in any of the three wires."""
    names: list[str] = []
    for tool in body.get("tools", []):
        if "functionDeclarations" in tool:
            names += [d["name"] for d in tool["functionDeclarations"]]
        else:
            names.append(tool["function"]["name"] if "function" in tool else tool["name"])
    return names


async def test_a_debate_produces_valid_envelopes_for_every_role(
    open_rt: Callable[..., Any], panel: SimPanel, events_path: Path
) -> None:
    async with open_rt() as rt:
        result = await run(rt, session_id="debate-1")
    assert result["degraded"] is False
    assert result["proposal"]["envelope"] == PROPOSAL_V1
    assert result["proposal"]["text"] is None, "raw text is kept only for invalid envelopes"
    assert [c["envelope"] for c in result["critiques"]] == [CRITIQUE_BETA, CRITIQUE_GAMMA]
    assert result["synthesis"]["envelope"] == SYNTHESIS
    assert result["synthesis"]["provider"] == "synth" and "fallback_from" not in result["synthesis"]
    assert len(result["rounds"]) == 1 and result["rounds"][0]["proposal"]["envelope"] == PROPOSAL_V1
    assert result["per_role"]["critic"]["calls"] == 2 and result["per_role"]["synthesizer"]["calls"] == 1
    assert result["usage"]["input_tokens"] == sum(
        r["usage"]["input_tokens"] for r in result["per_role"].values()
    )
    assert "worker_tools" not in result
    sessions = {e.get("session_id") for e in read_events(events_path) if e["event"] != "breaker_closed"}
    assert sessions == {"debate-1"}


async def test_critics_never_see_each_others_critique_and_the_synthesizer_sees_both(
    open_rt: Callable[..., Any], panel: SimPanel
) -> None:
    async with open_rt() as rt:
        await run(rt)
    beta, gamma, synth = (
        requests_to(panel, "m-beta"),
        requests_to(panel, "m-gamma"),
        requests_to(panel, "m-synth"),
    )
    assert "V1-TEXT" in beta[0] and "V1-TEXT" in gamma[0]
    assert "GAMMA-ISSUE" not in beta[0] and "BETA-ISSUE" not in gamma[0]
    assert "BETA-ISSUE" in synth[0] and "GAMMA-ISSUE" in synth[0]


async def test_an_envelope_invalid_once_is_re_prompted_with_the_validators_message(
    open_rt: Callable[..., Any], panel: SimPanel, events_path: Path
) -> None:
    bad = {"verdict": "maybe", "issues": []}
    panel.set_scenario("m-beta", Scenario(replies=(reply(bad), reply(CRITIQUE_BETA))))
    async with open_rt() as rt:
        result = await run(rt)
    beta = result["critiques"][0]
    assert (beta["status"], beta["attempts"], beta["envelope"]) == ("ok", 2, CRITIQUE_BETA)
    assert beta["hops"] == 2
    retry = requests_to(panel, "m-beta")[1]
    assert "maybe" in retry and "verdict" in retry
    invalid = [e for e in read_events(events_path) if e["event"] == "role_envelope_invalid"]
    assert [(e["provider"], e["role"], e["attempt"], e["final"]) for e in invalid] == [
        ("beta", "critic", 1, False)
    ]
    assert result["degraded"] is False


@pytest.mark.parametrize("include_content", [True, False])
async def test_an_invalid_envelope_event_carries_the_reply_only_when_content_is_included(
    open_rt: Callable[..., Any], panel: SimPanel, events_path: Path, include_content: bool
) -> None:
    bad = {"verdict": "maybe-NOT-A-VERDICT", "issues": []}
    panel.set_scenario("m-beta", Scenario(replies=(reply(bad), reply(CRITIQUE_BETA))))
    telemetry = {"path": str(events_path), "include_content": include_content}
    async with open_rt(telemetry=telemetry) as rt:
        await run(rt)
    (invalid,) = [e for e in read_events(events_path) if e["event"] == "role_envelope_invalid"]
    if include_content:
        assert "maybe-NOT-A-VERDICT" in invalid["text"]
    else:
        assert "text" not in invalid


async def test_an_envelope_invalid_twice_is_kept_raw_and_the_debate_goes_on(
    open_rt: Callable[..., Any], panel: SimPanel
) -> None:
    panel.set_scenario("m-gamma", Scenario(replies=(Reply(text="I refuse to use JSON."),)))
    async with open_rt() as rt:
        result = await run(rt)
    gamma = result["critiques"][1]
    assert (gamma["status"], gamma["attempts"], gamma["envelope"]) == ("invalid_envelope", 2, None)
    assert gamma["text"] == "I refuse to use JSON."
    assert gamma["error"]["code"] == "invalid_envelope"
    assert result["synthesis"]["envelope"] == SYNTHESIS
    assert result["degraded"] is True
    assert result["degraded_reasons"] == [
        {"provider": "gamma", "role": "critic", "status": "invalid_envelope", "code": "invalid_envelope"}
    ]


@pytest.mark.parametrize("mode", ["auto", "tags"])
async def test_tool_hints_reach_proposer_and_critics_but_never_the_synthesizer(
    open_rt: Callable[..., Any], panel: SimPanel, mode: str
) -> None:
    async with open_rt() as rt:
        result = await run(rt, worker_tools=["verify", "fetch", "delegate"], worker_tool_mode=mode)
    for model in ("m-prop", "m-beta", "m-gamma"):
        sent = json.loads(requests_to(panel, model)[0])
        if mode == "tags":
            assert "<tool_call>" in json.dumps(sent) and "tools" not in sent
        else:  # auto: the three kinds declare the tools natively
            assert sorted(_declared_names(sent)) == ["fetch", "verify"]
    synth = requests_to(panel, "m-synth")[0]
    assert "<tool_call>" not in synth and "tool" not in synth.lower()
    block = result["worker_tools"]
    assert block["applies_to"] == ["proposer", "critic"]
    assert (block["accepted"], block["rejected"]) == (["verify", "fetch"], ["delegate"])
    assert "inner_tool_calls" not in result["synthesis"]
    assert "inner_tool_calls" in result["proposal"]


async def test_two_rounds_have_the_critics_review_the_revision(
    open_rt: Callable[..., Any], panel: SimPanel
) -> None:
    async with open_rt() as rt:
        result = await run(rt, rounds=2)
    assert [r["proposal"]["envelope"] for r in result["rounds"]] == [PROPOSAL_V1, PROPOSAL_V2]
    assert result["proposal"]["envelope"] == PROPOSAL_V2
    revision_request = requests_to(panel, "m-prop")[1]
    assert "BETA-ISSUE" in revision_request and "GAMMA-ISSUE" in revision_request
    second_reviews = [requests_to(panel, m)[1] for m in ("m-beta", "m-gamma")]
    assert all("V2-TEXT" in r for r in second_reviews)
    assert len(requests_to(panel, "m-synth")) == 1, "the synthesizer runs once, at the end"
    assert "V2-TEXT" in requests_to(panel, "m-synth")[0]


async def test_a_failing_synthesizer_is_replaced_and_the_result_names_who_and_why(
    open_rt: Callable[..., Any], panel: SimPanel
) -> None:
    panel.set_scenario("m-synth", Scenario(replies=(Reply(status=500),)))
    async with open_rt() as rt:
        result = await run(rt)
    synthesis = result["synthesis"]
    assert synthesis["provider"] == "synth2"
    assert synthesis["envelope"]["answer"] == "Fallback synthesis."
    assert synthesis["fallback_from"] == {
        "provider": "synth",
        "role": "synthesizer",
        "status": "error",
        "code": "server_error",
        "message": "[simulated] The server had an error while processing your request. Sorry about that!",
    }
    assert "synthesizer_fallback" in result["warnings"]
    assert result["degraded"] is False


async def test_when_every_synthesizer_fails_the_result_is_degraded_with_proposal_and_critiques_intact(
    open_rt: Callable[..., Any], panel: SimPanel
) -> None:
    panel.set_scenario("m-synth", Scenario(replies=(Reply(status=503),)))
    panel.set_scenario("m-synth2", Scenario(replies=(Reply(text="no json"),)))
    async with open_rt() as rt:
        result = await run(rt)
    assert result["degraded"] is True
    assert result["proposal"]["envelope"] == PROPOSAL_V1
    assert len(result["critiques"]) == 2
    reasons = {(r["provider"], r["status"]) for r in result["degraded_reasons"]}
    assert reasons == {("synth", "error"), ("synth2", "invalid_envelope")}
    assert result["synthesis"]["envelope"] is None


async def test_a_failed_proposer_stops_the_debate_and_says_so(
    open_rt: Callable[..., Any], panel: SimPanel
) -> None:
    panel.set_scenario("m-prop", Scenario(replies=(Reply(status=401),)))
    async with open_rt() as rt:
        result = await run(rt)
    assert result["proposal"]["status"] == "error"
    assert result["critiques"] == [] and result["synthesis"] is None
    assert {r["role"] for r in result["degraded_reasons"]} == {"proposer", "synthesizer"}
    assert requests_to(panel, "m-beta") == []


async def test_cost_caps_break_down_per_role_without_a_synthesizer_entry(open_rt: Callable[..., Any]) -> None:
    async with open_rt() as rt:
        result = await run(rt, worker_tools=["verify"], worker_tool_cost_cap_usd=1e-9)
    cap = result["worker_tools"]["cost_cap"]
    assert set(cap["per_role"]) == {"proposer", "critic"}
    assert cap["exceeded"] is True and "operator_prompt" in cap


async def test_dry_run_calls_nothing_and_bounds_the_real_cost(
    open_rt: Callable[..., Any], panel: SimPanel
) -> None:
    async with open_rt() as rt:
        planned = await run(rt, dry_run=True, rounds=2, max_tokens=256)
        assert panel.received == []
        real = await run(rt, rounds=2, max_tokens=256)
    plan = planned["plan"]
    roles = {(c["role"], c["provider"]) for c in plan["calls"]}
    assert roles == {
        ("proposer", "prop"),
        ("critic", "beta"),
        ("critic", "gamma"),
        ("synthesizer", "synth"),
        ("synthesizer", "synth2"),
    }
    assert plan["rounds"] == 2
    assert plan["max_cost_usd"] >= real["usage"]["cost_usd"] > 0


async def test_the_transcript_holds_every_role_and_hop(
    open_rt: Callable[..., Any], events_path: Path
) -> None:
    async with open_rt() as rt:
        result = await run(rt)
    end = next(e for e in read_events(events_path) if e["event"] == "session_end")
    transcript = json.loads(Path(end["transcript"]).read_text())
    assert transcript["result"] == result
    hops = sorted((h["role"], h["provider"]) for h in transcript["hops"])
    assert hops == [("critic", "beta"), ("critic", "gamma"), ("proposer", "prop"), ("synthesizer", "synth")]


def native_schema(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """The schema a request asks its wire to hold the reply to, where each wire puts it."""
    if kind == "openai":
        return body["response_format"]["json_schema"]["schema"]  # type: ignore[no-any-return]
    if kind == "anthropic":
        return body["output_config"]["format"]["schema"]  # type: ignore[no-any-return]
    return body["generationConfig"]["responseJsonSchema"]  # type: ignore[no-any-return]


async def test_with_an_answer_schema_each_wires_synthesizer_is_held_to_it_and_decides_a_value(
    make_config: Callable[..., Config], panel: SimPanel, tmp_path: Path
) -> None:
    """Unscripted simulated models on every wire: the synthesizer's request carries its envelope
    with a required `value` that is the answer schema, natively, and the value it returns is valid."""
    kinds = ("openai", "anthropic", "gemini")
    providers = {
        f"{role}-{kind}": {"kind": kind, "model": f"m-{role}-{kind}", "base_url": panel.base_url(kind)}
        for role in ("u", "s")
        for kind in kinds
    }
    roles = {"proposer": "u-openai", "critics": ["u-anthropic", "u-gemini"], "synthesizer": "s-openai"}
    config = make_config(providers, retry={"max_attempts": 1}, roles=roles)
    schema = choices_schema(["SQS", "Kafka"])
    async with open_runtime(config) as rt:
        for kind in kinds:
            result = await run(rt, answer_schema=schema, synthesizer=f"s-{kind}")
            (asked,) = [r for r in panel.received if r.model == f"m-s-{kind}"]
            held = native_schema(kind, asked.body)
            assert "value" in held["required"] and {"answer", "confidence"} <= set(held["required"]), kind
            assert held["properties"]["value"]["properties"]["choice"]["enum"] == ["SQS", "Kafka"], kind
            synthesis = result["synthesis"]
            assert synthesis["provider"] == f"s-{kind}" and synthesis["attempts"] == 1, kind
            assert answer_errors(schema, synthesis["value"]) == [], kind
            assert not result["degraded"], kind
