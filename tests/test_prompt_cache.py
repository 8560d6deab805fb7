"""Requests the providers can cache (SPEC §11), asserted on what was sent: every role turn of a
deliberation starts its system prompt with the same bytes (the preamble and the task), Anthropic
gets one cache breakpoint right after them, and OpenAI a cache key per session."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import conclave
from conclave.config import Config
from conclave.deliberation.coordinate import coordinate
from conclave.deliberation.roles import shared_system
from conclave.runtime import open_runtime
from conclave.sim import Reply, Rule, Scenario, SimPanel

pytestmark = pytest.mark.anyio

TASK = "Pick a database for the ledger."
CONTEXT = "CONTEXT-MARK " + "The ledger keeps every payment. " * 400
PROPOSAL = {"proposal": "Use PostgreSQL.", "rationale": "Transactions.", "confidence": 0.7}
REVISE = {"verdict": "revise", "issues": [{"severity": "minor", "description": "Say why."}]}
SYNTHESIS = {"answer": "PostgreSQL.", "confidence": 0.8}
MEMBERS = {"prop": "openai", "crit-a": "anthropic", "crit-b": "gemini", "synth": "anthropic"}


@pytest.fixture
async def panel() -> AsyncIterator[SimPanel]:
    async with SimPanel() as sim:
        sim.set_scenario("m-prop", Scenario(replies=(Reply(text=json.dumps(PROPOSAL)),)))
        for critic in ("crit-a", "crit-b"):
            sim.set_scenario(f"m-{critic}", Scenario(replies=(Reply(text=json.dumps(REVISE)),)))
        sim.set_scenario("m-synth", Scenario(replies=(Reply(text=json.dumps(SYNTHESIS)),)))
        yield sim


@pytest.fixture
def config(make_config: Callable[..., Config], panel: SimPanel, tmp_path: Path) -> Config:
    providers = {
        name: {"kind": kind, "model": f"m-{name}", "base_url": panel.base_url(kind)}  # type: ignore[arg-type]
        for name, kind in MEMBERS.items()
    }
    roles = {"proposer": "prop", "critics": ["crit-a", "crit-b"], "synthesizer": "synth"}
    return make_config(providers, roles=roles, transcripts={"dir": str(tmp_path / "t")})


def system_of(kind: str, body: dict[str, Any]) -> str:
    if kind == "anthropic":
        system = body["system"]
        return system if isinstance(system, str) else "".join(block["text"] for block in system)
    if kind == "gemini":
        return "".join(part["text"] for part in body["systemInstruction"]["parts"])
    first = body["messages"][0]
    assert first["role"] == "system"
    return str(first["content"])


async def test_every_role_and_round_starts_with_the_same_bytes_and_anthropic_caches_them(
    config: Config, panel: SimPanel
) -> None:
    async with open_runtime(config) as rt:
        result = await coordinate(
            rt, {"task": TASK, "context": CONTEXT, "rounds": 2, "worker_tools": ["verify"]}
        )
    assert result.degraded is False and len(result.rounds) == 2
    shared = shared_system(TASK, CONTEXT)
    kinds = {f"m-{name}": kind for name, kind in MEMBERS.items()}
    sent = [(r.model, r.body) for r in panel.received]
    assert len(sent) == 2 + 2 + 2 + 1
    systems: dict[str, list[str]] = {}
    for model, body in sent:
        system = system_of(kinds[model], body)
        assert system.startswith(shared), f"{model}'s system prompt does not start with the shared part"
        systems.setdefault(model, []).append(system)
    for model, seen in systems.items():
        assert len(set(seen)) == 1, f"{model}'s system prompt changed between rounds"
    for model, body in sent:
        if kinds[model] != "anthropic":
            continue
        marked = [block for block in body["system"] if "cache_control" in block]
        assert [b["text"] for b in marked] == [shared], "one breakpoint, right after the shared part"
        assert marked[0]["cache_control"] == {"type": "ephemeral"}
        assert json.dumps(body).count("cache_control") <= 4, "Anthropic allows four breakpoints"
        assert "CONTEXT-MARK" not in json.dumps(body["messages"]), "the context is sent once, in the system"


async def test_a_plain_confer_sends_exactly_what_it_always_did(config: Config, panel: SimPanel) -> None:
    panel.set_scenario("m-crit-a", Scenario(replies=(Reply(text="Fine."),)))
    result = await conclave.confer("Which?", config=config, providers=["crit-a"], system="Be brief.")
    assert result.answers[0].ok
    (body,) = [r.body for r in panel.received]
    assert body["system"] == "Be brief.", "no breakpoint outside a deliberation's role turns"


def openai_reply(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    asked = body["messages"][-1]["content"]
    text = json.dumps(SYNTHESIS if "final answer" in asked else REVISE if "Review" in asked else PROPOSAL)
    return httpx.Response(
        200,
        json={
            "id": "chatcmpl-1",
            "model": body["model"],
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        },
    )


async def test_openais_own_api_gets_one_cache_key_per_session(make_config: Callable[..., Config]) -> None:
    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return openai_reply(request)

    providers = {
        name: {
            "kind": "openai",
            "model": f"gpt-{name}",
            "base_url": "https://api.openai.com/v1",
            "api_key_env": "K",
        }
        for name in ("p", "c", "s")
    }
    config = make_config(
        providers, env={"K": "sk-test"}, roles={"proposer": "p", "critics": ["c"], "synthesizer": "s"}
    )
    async with conclave.Conclave(config, transport=httpx.MockTransport(handler)) as client:
        await client.coordinate(TASK, session_id="cache-1")
        first = list(sent)
        await client.coordinate(TASK, session_id="cache-2")
        second = sent[len(first) :]
        sent.clear()
        await client.confer("Which?", session_id="cache-3")
    assert {b["prompt_cache_key"] for b in first} == {"cache-1"}, "every call of the session"
    assert {b["prompt_cache_key"] for b in second} == {"cache-2"}
    assert all("prompt_cache_key" not in b for b in sent), "a plain confer sends no key"


async def test_a_compatible_server_never_gets_the_cache_key(config: Config, panel: SimPanel) -> None:
    async with open_runtime(config) as rt:
        await coordinate(rt, {"task": TASK, "session_id": "cache-4"})
    openai_bodies = [r.body for r in panel.received if r.model == "m-prop"]
    assert openai_bodies and all("prompt_cache_key" not in b for b in openai_bodies)


async def test_the_reviewers_and_the_chair_share_the_question_the_same_way(
    make_config: Callable[..., Config], panel: SimPanel
) -> None:
    rules = (
        Rule("Rank every one of these labels", Reply(text="not json")),
        Rule("Write the final answer to the question", Reply(text=json.dumps(SYNTHESIS))),
    )
    for name in ("crit-a", "synth"):
        panel.set_scenario(f"m-{name}", Scenario(replies=(Reply(text=f"{name} answers."),), rules=rules))
    providers = {
        name: {"kind": "anthropic", "model": f"m-{name}", "base_url": panel.base_url("anthropic")}
        for name in ("crit-a", "synth")
    }
    config = make_config(
        providers, roles={"proposer": "synth", "critics": ["crit-a"], "synthesizer": "synth"}
    )
    async with conclave.Conclave(config) as client:
        await client.confer("Which queue?", context="CTX", review=True, synthesize=True)
    shared = shared_system("Which queue?", "CTX")
    staged = [r.body for r in panel.received if isinstance(r.body.get("system"), list)]
    assert len(staged) >= 3, "two reviewers (each re-prompted) and the chair"
    assert all(b["system"][0]["text"] == shared for b in staged)


async def test_a_dry_run_prices_the_debate_with_and_without_cache_hits(
    make_config: Callable[..., Config], panel: SimPanel
) -> None:
    price = {"input_per_mtok": 3.0, "output_per_mtok": 15.0, "cached_input_per_mtok": 0.3}
    providers = {
        name: {"kind": kind, "model": f"m-{name}", "base_url": panel.base_url(kind), "price": price}  # type: ignore[arg-type]
        for name, kind in MEMBERS.items()
    }
    roles = {"proposer": "prop", "critics": ["crit-a", "crit-b"], "synthesizer": "synth"}
    config = make_config(providers, roles=roles)
    async with open_runtime(config) as rt:
        plan = (await coordinate(rt, {"task": TASK, "context": CONTEXT, "rounds": 2, "dry_run": True})).plan
    assert plan is not None and panel.received == []
    assert plan["max_cost_usd_cached"] < plan["max_cost_usd"]
    for call in plan["calls"]:
        assert call["max_cost_usd_cached"] < call["max_cost_usd"], "each role re-reads the task"
    result = await conclave.confer("Which?", config=config, dry_run=True)
    assert "max_cost_usd_cached" not in (result.plan or {}), "a plain confer shares no prompt"
