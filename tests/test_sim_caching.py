"""The simulated panel's prompt caching (`SimPanel(caching=True)`), each provider's rule on its own
wire, and what Conclave makes of it: cached reads and cache writes in usage, priced apart."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from conclave.app.runtime import open_runtime
from conclave.app.sim import Reply, Scenario, SimPanel
from conclave.deliberation.coordinate import coordinate
from conclave.schema.config import Config

pytestmark = pytest.mark.anyio

LONG = "The ledger records every payment. " * 800  # about 6,800 tokens
SHORT = "Be brief."


def openai_body(system: str, question: str) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
    }


def anthropic_body(system: str, question: str, *, marked: bool = True) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": system}
    if marked:
        block["cache_control"] = {"type": "ephemeral"}
    return {
        "model": "m",
        "max_tokens": 64,
        "system": [block],
        "messages": [{"role": "user", "content": question}],
    }


async def post(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = await client.post(url, json=body, headers={"anthropic-version": "2023-06-01"})
    assert reply.status_code == 200, reply.text
    answer: dict[str, Any] = reply.json()
    return answer


async def test_openai_reads_a_long_repeated_prefix_in_steps_of_128_tokens() -> None:
    async with SimPanel(caching=True) as panel, httpx.AsyncClient() as client:
        url = f"{panel.base_url('openai')}/chat/completions"
        first = (await post(client, url, openai_body(LONG, "one?")))["usage"]
        second = (await post(client, url, openai_body(LONG, "two?")))["usage"]
        short = [(await post(client, url, openai_body(SHORT, q)))["usage"] for q in ("a?", "b?")]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 1024 and cached % 128 == 0 and cached <= second["prompt_tokens"]
    assert second["prompt_tokens"] == first["prompt_tokens"], "the same prompt, part of it cached"
    assert [u["prompt_tokens_details"]["cached_tokens"] for u in short] == [0, 0], "under 1,024 tokens"


async def test_anthropic_writes_at_the_breakpoint_then_reads_it_and_nothing_without_one() -> None:
    async with SimPanel(caching=True) as panel, httpx.AsyncClient() as client:
        url = f"{panel.base_url('anthropic')}/v1/messages"
        first = (await post(client, url, anthropic_body(LONG, "one?")))["usage"]
        second = (await post(client, url, anthropic_body(LONG, "two?")))["usage"]
        unmarked = (await post(client, url, anthropic_body(LONG, "three?", marked=False)))["usage"]
    assert first["cache_creation_input_tokens"] > 1024 and first["cache_read_input_tokens"] == 0
    assert second["cache_read_input_tokens"] == first["cache_creation_input_tokens"]
    assert second["cache_creation_input_tokens"] == 0
    assert (unmarked["cache_read_input_tokens"], unmarked["cache_creation_input_tokens"]) == (0, 0)


async def test_gemini_reads_implicitly_and_the_panel_caches_nothing_unless_asked() -> None:
    body = {
        "systemInstruction": {"parts": [{"text": LONG}]},
        "contents": [{"role": "user", "parts": [{"text": "one?"}]}],
    }
    async with SimPanel(caching=True) as panel, httpx.AsyncClient() as client:
        url = f"{panel.base_url('gemini')}/v1beta/models/m:generateContent"
        await post(client, url, body)
        second = (await post(client, url, body))["usageMetadata"]
    async with SimPanel() as plain, httpx.AsyncClient() as client:
        url = f"{plain.base_url('gemini')}/v1beta/models/m:generateContent"
        await post(client, url, body)
        uncached = (await post(client, url, body))["usageMetadata"]
    assert second["cachedContentTokenCount"] >= 1024
    assert "cachedContentTokenCount" not in uncached


async def test_a_debate_on_a_caching_panel_reports_cached_reads_and_writes_priced_apart(
    make_config: Callable[..., Config], tmp_path: Path
) -> None:
    price = {
        "input_per_mtok": 3.0,
        "output_per_mtok": 15.0,
        "cached_input_per_mtok": 0.3,
        "cache_write_per_mtok": 3.75,
    }
    envelopes = {
        "m-prop": {"proposal": "PostgreSQL.", "rationale": "Transactions.", "confidence": 0.7},
        "m-crit": {"verdict": "revise", "issues": []},
        "m-synth": {"answer": "PostgreSQL.", "confidence": 0.8},
    }
    async with SimPanel(caching=True) as panel:
        for model, envelope in envelopes.items():
            panel.set_scenario(model, Scenario(replies=(Reply(text=json.dumps(envelope)),)))
        providers = {
            name: {
                "kind": "anthropic",
                "model": f"m-{name}",
                "base_url": panel.base_url("anthropic"),
                "price": price,
            }
            for name in ("prop", "crit", "synth")
        }
        config = make_config(
            providers, roles={"proposer": "prop", "critics": ["crit"], "synthesizer": "synth"}
        )
        async with open_runtime(config) as rt:
            result = await coordinate(rt, {"task": "Pick a database.", "context": LONG, "rounds": 2})
    proposals = [r.proposal for r in result.rounds]
    first, second = (p.usage for p in proposals)
    assert (first.cache_write_tokens or 0) > 1024 and not first.cached_input_tokens
    assert second.cached_input_tokens == first.cache_write_tokens and not second.cache_write_tokens
    assert second.cost_usd is not None and first.cost_usd is not None and second.cost_usd < first.cost_usd / 3
    assert (result.usage.cached_input_tokens or 0) >= 2 * (first.cache_write_tokens or 0), (
        "proposer and critic"
    )
