"""Requests the providers can cache, asserted on what was sent: every turn of a deliberation
(a `confer`'s answers too, when a review or a synthesis follows) starts its system prompt with the
same bytes (the preamble, the task and its context); Anthropic gets one cache breakpoint right
after them when the provider is called again with them, never on its only call; and a provider
whose API takes a cache key (`prompt_cache_key` in its entry) gets the session's."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

import conclave
from conclave.app.runtime import open_runtime
from conclave.app.sim import Reply, Rule, Scenario, SimPanel
from conclave.deliberation import review
from conclave.deliberation.coordinate import coordinate
from conclave.deliberation.roles import member_prompt, shared_system
from conclave.net.http import MemoryTransport
from conclave.schema.config import Config
from conclave.schema.schemas import data_path

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


async def test_every_role_and_round_starts_with_the_same_bytes_and_anthropic_caches_what_is_read_again(
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
        assert "CONTEXT-MARK" not in json.dumps(body["messages"]), "the context is sent once, in the system"
        if model == "m-synth":  # its only call: a cache write would never be read
            assert "cache_control" not in json.dumps(body)
            continue
        marked = [block for block in body["system"] if "cache_control" in block]
        assert [b["text"] for b in marked] == [shared], "one breakpoint, right after the shared part"
        assert marked[0]["cache_control"] == {"type": "ephemeral"}
        assert json.dumps(body).count("cache_control") <= 4, "Anthropic allows four breakpoints"


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


async def test_a_provider_that_takes_a_cache_key_gets_one_per_session(
    make_config: Callable[..., Config],
) -> None:
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
            "prompt_cache_key": True,
        }
        for name in ("p", "c", "s")
    }
    config = make_config(
        providers, env={"K": "sk-test"}, roles={"proposer": "p", "critics": ["c"], "synthesizer": "s"}
    )
    async with conclave.Conclave(config, transport=MemoryTransport(handler)) as client:
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


# -- a confer's answers laid out like its stages, over a panel that plays each provider's caching --

QUESTION = "Which queue should the ledger use?"
COUNCIL = {"anth": "anthropic", "open": "openai", "gem": "gemini"}
RATES = {
    "input_per_mtok": 3.0,
    "output_per_mtok": 15.0,
    "cached_input_per_mtok": 0.3,
    "cache_write_per_mtok": 3.75,
}


def asked(kind: str, body: dict[str, Any]) -> str:
    """The last user message of a request, whatever the wire: what the turn asks."""
    if kind == "gemini":
        return "".join(part["text"] for part in body["contents"][-1]["parts"])
    return str(body["messages"][-1]["content"])


def council_config(
    make_config: Callable[..., Config], panel: SimPanel, members: dict[str, str], chair: str
) -> Config:
    labels = list(review.LABELS[: len(members) - 1])  # each reviewer sees the others'
    ranking = {"ranking": labels, "notes": {labels[0]: "Clear."}, "confidence": 0.6}
    for name in members:
        rules = (
            Rule("Rank every one of these labels", Reply(text=json.dumps(ranking))),
            Rule("Write the final answer to the question", Reply(text=json.dumps(SYNTHESIS))),
        )
        panel.set_scenario(f"m-{name}", Scenario(replies=(Reply(text=f"{name}: use Kafka."),), rules=rules))
    providers = {
        name: {"kind": kind, "model": f"m-{name}", "base_url": panel.base_url(kind), "price": RATES}  # type: ignore[arg-type]
        for name, kind in members.items()
    }
    critics = [name for name in members if name != chair]
    return make_config(providers, roles={"proposer": chair, "critics": critics, "synthesizer": chair})


async def test_a_confer_with_review_lays_out_its_answers_so_reviews_and_chair_read_them_cached(
    make_config: Callable[..., Config],
) -> None:
    async with SimPanel(caching=True) as panel:
        config = council_config(make_config, panel, COUNCIL, chair="anth")
        result = await conclave.confer(
            QUESTION, config=config, context=CONTEXT, review=True, synthesize=True, session_id="layout-1"
        )
        sent = [(r.kind, r.model, r.body) for r in panel.received]
    assert result.degraded is False and result.synthesis is not None
    shared = shared_system(QUESTION, CONTEXT)
    stages = {member_prompt(): "answer", "Rank every one": "review", "Write the final answer": "chair"}
    calls: dict[tuple[str, str], dict[str, Any]] = {}
    for kind, model, body in sent:
        (stage,) = [name for ask, name in stages.items() if ask in asked(kind, body)]
        calls[(model, stage)] = body
        assert system_of(kind, body).startswith(shared), f"{model}'s {stage} call starts elsewhere"
        assert "CONTEXT-MARK" not in asked(kind, body), "the question and context only in the system prompt"
    assert sorted(calls) == sorted(
        [(f"m-{n}", s) for n in COUNCIL for s in ("answer", "review")] + [("m-anth", "chair")]
    )
    for stage in ("answer", "review", "chair"):
        (first, *rest) = calls[("m-anth", stage)]["system"]
        assert first == {"type": "text", "text": shared, "cache_control": {"type": "ephemeral"}}
        assert all("cache_control" not in block for block in rest)

    answers = {a.provider: a.usage for a in result.answers}
    reviews = {r.provider: r.usage for r in result.reviewers}
    written = answers["anth"].cache_write_tokens or 0
    assert written > 1024 and not answers["anth"].cached_input_tokens, "the answer writes the cache"
    assert reviews["anth"].cached_input_tokens == written and not reviews["anth"].cache_write_tokens
    assert result.synthesis.usage.cached_input_tokens == written, "the chair reads it too"
    assert reviews["anth"].cost_usd is not None and answers["anth"].cost_usd is not None
    assert reviews["anth"].cost_usd < answers["anth"].cost_usd / 3, "read at the cached price"
    opened, gemini = reviews["open"].cached_input_tokens or 0, reviews["gem"].cached_input_tokens or 0
    assert opened >= 1024 and opened % 128 == 0 and not answers["open"].cached_input_tokens
    assert gemini >= 1024 and not answers["gem"].cached_input_tokens
    assert (result.usage.cached_input_tokens or 0) >= 2 * written + opened + gemini


async def test_a_plain_confer_marks_nothing_even_with_a_long_context(
    make_config: Callable[..., Config],
) -> None:
    async with SimPanel(caching=True) as panel:
        config = council_config(make_config, panel, {"anth": "anthropic", "other": "anthropic"}, "anth")
        result = await conclave.confer(QUESTION, config=config, context=CONTEXT)
        bodies = [r.body for r in panel.received]
    assert len(bodies) == 2 and all(a.ok for a in result.answers)
    assert all("cache_control" not in json.dumps(b) for b in bodies), "each member is asked once"
    assert all(QUESTION in b["messages"][-1]["content"] for b in bodies), "asked as the caller asked"
    assert not result.usage.cache_write_tokens


async def test_anthropic_marks_a_members_prefix_only_when_the_member_is_asked_again(
    make_config: Callable[..., Config],
) -> None:
    async with SimPanel(caching=True) as panel:
        members = {"anth": "anthropic", "other": "anthropic"}
        config = council_config(make_config, panel, members, chair="anth")
        result = await conclave.confer(QUESTION, config=config, context=CONTEXT, synthesize=True)
        sent = [(r.model, asked("anthropic", r.body), r.body) for r in panel.received]
    shared = shared_system(QUESTION, CONTEXT)
    (other,) = [body for model, _, body in sent if model == "m-other"]
    assert other["system"].startswith(shared), "laid out like the others: the chair may be anyone"
    assert "cache_control" not in json.dumps(other), "its only call: a write nobody would read"
    chair = [body for model, _, body in sent if model == "m-anth"]
    assert len(chair) == 2 and all(b["system"][0]["cache_control"] == {"type": "ephemeral"} for b in chair)
    answers = {a.provider: a.usage for a in result.answers}
    assert not answers["other"].cache_write_tokens
    assert result.synthesis is not None
    assert result.synthesis.usage.cached_input_tokens == answers["anth"].cache_write_tokens
    assert (answers["anth"].cache_write_tokens or 0) > 1024


@pytest.mark.parametrize(("mode", "chair_marked"), [("native", False), ("tags", True)])
async def test_a_chair_without_the_members_tool_declarations_marks_nothing(
    make_config: Callable[..., Config], mode: str, chair_marked: bool
) -> None:
    """Native declarations come before the system prompt, so the chair (never given tools) sends
    a prefix of its own; the tags hint follows the shared part, which the chair then reads."""
    async with SimPanel(caching=True) as panel:
        members = {"anth": "anthropic", "other": "anthropic"}
        config = council_config(make_config, panel, members, chair="anth")
        result = await conclave.confer(
            QUESTION,
            config=config,
            context=CONTEXT,
            review=True,
            synthesize=True,
            worker_tools=["verify"],
            worker_tool_mode=mode,
        )
        sent = [(asked("anthropic", r.body), r.body) for r in panel.received if r.model == "m-anth"]
    assert result.synthesis is not None and result.synthesis.ok
    (chair,) = [body for ask, body in sent if "Write the final answer" in ask]
    members_calls = [body for ask, body in sent if "Write the final answer" not in ask]
    assert len(members_calls) == 2 and all(b["system"][0].get("cache_control") for b in members_calls)
    assert ("cache_control" in json.dumps(chair)) is chair_marked and "tools" not in chair
    assert all(("tools" in b) is (mode == "native") for b in members_calls)
    read = result.synthesis.usage.cached_input_tokens or 0
    assert (read > 1024) is chair_marked and not result.synthesis.usage.cache_write_tokens


async def test_a_one_round_debate_marks_only_the_provider_that_plays_two_roles(
    make_config: Callable[..., Config],
) -> None:
    async with SimPanel(caching=True) as panel:
        panel.set_scenario(
            "m-p",
            Scenario(
                replies=(Reply(text=json.dumps(PROPOSAL)),),
                rules=(Rule("final answer", Reply(text=json.dumps(SYNTHESIS))),),
            ),
        )
        panel.set_scenario("m-c", Scenario(replies=(Reply(text=json.dumps(REVISE)),)))
        providers = {
            name: {"kind": "anthropic", "model": f"m-{name}", "base_url": panel.base_url("anthropic")}
            for name in ("p", "c")
        }
        config = make_config(providers, roles={"proposer": "p", "critics": ["c"], "synthesizer": "p"})
        async with open_runtime(config) as rt:
            result = await coordinate(rt, {"task": TASK, "context": CONTEXT, "rounds": 1})
        sent = [(r.model, r.body) for r in panel.received]
    assert [model for model, _ in sent] == ["m-p", "m-c", "m-p"]
    assert all(isinstance(body["system"], list) for model, body in sent if model == "m-p")
    assert all("cache_control" not in json.dumps(body) for model, body in sent if model == "m-c")
    assert result.synthesis is not None and result.proposal is not None
    assert result.synthesis.usage.cached_input_tokens == result.proposal.usage.cache_write_tokens
    assert not result.critiques[0].usage.cache_write_tokens


# -- which providers get a cache key: the ones whose entry says their API takes it --------------------


def test_only_the_openai_preset_says_its_api_takes_a_cache_key() -> None:
    shipped = yaml.safe_load(data_path("config.yaml").read_text(encoding="utf-8"))
    takes = {name for name, entry in shipped["providers"].items() if entry.get("prompt_cache_key")}
    assert takes == {"openai"}


async def test_the_openai_preset_gets_the_cache_key_and_other_openai_servers_only_when_configured(
    make_config: Callable[..., Config],
) -> None:
    sent: dict[str, list[dict[str, Any]]] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.setdefault(body["model"], []).append(body)
        return openai_reply(request)

    def compatible(name: str, host: str, **extra: Any) -> dict[str, Any]:
        return {
            "kind": "openai",
            "model": f"m-{name}",
            "base_url": f"https://{host}/v1",
            "api_key_env": "K",
        } | extra

    providers = {
        "compat": compatible("compat", "llm.example"),
        "keyed": compatible("keyed", "proxy.example", prompt_cache_key=True),
        "bare": compatible("bare", "api.openai.com"),  # OpenAI's host alone decides nothing
    }
    roles = {"proposer": "openai", "critics": ["compat", "keyed", "bare"], "synthesizer": "openai"}
    env = {"K": "sk-test", "OPENAI_API_KEY": "sk-test"}
    config = make_config(providers, env=env, panel=["openai"], roles=roles)
    preset = config.providers["openai"]
    assert preset.prompt_cache_key and preset.base_url == "https://api.openai.com/v1", "the shipped preset"
    async with conclave.Conclave(config, transport=MemoryTransport(handler)) as client:
        await client.coordinate(TASK, session_id="keyed-1")
    keys = {model: [b.get("prompt_cache_key") for b in bodies] for model, bodies in sent.items()}
    assert keys == {
        preset.model: ["keyed-1", "keyed-1"],  # proposer and synthesizer
        "m-keyed": ["keyed-1"],
        "m-compat": [None],
        "m-bare": [None],
    }
