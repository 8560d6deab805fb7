"""The adapters read every response shape of docs/providers.md correctly, through the real
HTTP client stack (httpx over the in-memory transport), priced by the rate card."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from conclave.core.errors import MalformedResponse, PermanentProviderError, ProviderError
from conclave.core.messages import Completion, CompletionRequest
from conclave.schema.config import Config
from tests.support import ScriptedTransport, open_pool, provider_entry

pytestmark = pytest.mark.anyio

BASES = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
    "gemini": "https://generativelanguage.googleapis.com",
}
PRICE = {
    "input_per_mtok": 1.0,
    "output_per_mtok": 10.0,
    "cached_input_per_mtok": 0.1,
    "cache_write_per_mtok": 2.0,
}


async def ask(
    make_config: Callable[..., Config], kind: str, model: str, sample: str, **entry: Any
) -> Completion:
    config = make_config(
        {"p": provider_entry(kind, model, entry.pop("base_url", BASES[kind]), price=PRICE, **entry)},
        retry={"max_attempts": 1},
    )
    async with open_pool(config, ScriptedTransport(sample)) as pool:
        return await pool.get("p").complete(CompletionRequest.ask("q"), deadline=anyio.current_time() + 10)


def expected_cost(uncached: int, cached: int, written: int, output: int) -> float:
    return round((uncached * 1.0 + cached * 0.1 + written * 2.0 + output * 10.0) / 1e6, 10)


async def test_openai_basic_answer_text_usage_model_and_request_id(
    make_config: Callable[..., Config],
) -> None:
    c = await ask(make_config, "openai", "gpt-4o-mini", "openai_basic")
    assert c.text == "Paris."
    assert c.finish_reason == "stop"
    assert c.model == "gpt-4o-mini-2024-07-18"
    assert c.request_id == "req_0123456789abcdef0123456789abcdef"
    assert (c.usage.input_tokens, c.usage.output_tokens, c.usage.total_tokens) == (14, 2, 16)
    assert c.usage.cost_usd == expected_cost(14, 0, 0, 2)


async def test_openai_reasoning_tokens_are_a_part_of_output_not_added_again(
    make_config: Callable[..., Config],
) -> None:
    c = await ask(make_config, "openai", "gpt-5-nano", "openai_reasoning_usage")
    assert c.usage.output_tokens == 267
    assert c.usage.reasoning_tokens == 192
    assert c.usage.total_tokens == 294


async def test_openai_cached_tokens_are_priced_at_the_cached_rate(make_config: Callable[..., Config]) -> None:
    c = await ask(make_config, "openai", "gpt-4.1-mini", "openai_cached_usage")
    assert c.usage.input_tokens == 2006
    assert c.usage.cached_input_tokens == 1920
    assert c.usage.cost_usd == expected_cost(86, 1920, 0, 300)


async def test_openai_2024_response_without_details_objects_parses(
    make_config: Callable[..., Config],
) -> None:
    c = await ask(make_config, "openai", "gpt-4o", "openai_2024_no_details")
    assert c.text == "Hello!"
    assert c.usage.cached_input_tokens is None
    assert c.usage.reasoning_tokens is None


async def test_openai_reasoning_model_spending_the_budget_on_thought_gives_empty_text_with_length(
    make_config: Callable[..., Config],
) -> None:
    c = await ask(make_config, "openai", "gpt-5", "openai_reasoning_length_empty")
    assert (c.text, c.finish_reason, c.usage.output_tokens) == ("", "length", 64)


async def test_xai_reasoning_reported_apart_is_added_to_output(make_config: Callable[..., Config]) -> None:
    c = await ask(make_config, "openai", "grok-4", "xai_reasoning_excluded", base_url="https://api.x.ai/v1")
    assert c.usage.input_tokens == 26
    assert c.usage.output_tokens == 168 + 304
    assert c.usage.total_tokens == 498
    assert c.usage.cached_input_tokens == 6
    assert c.usage.cost_usd == expected_cost(20, 6, 0, 472)


async def test_mistral_magistral_content_blocks_keep_only_the_text(
    make_config: Callable[..., Config],
) -> None:
    c = await ask(
        make_config,
        "openai",
        "magistral-medium-latest",
        "mistral_magistral_blocks",
        base_url="https://api.mistral.ai/v1",
    )
    assert c.text == "Four."
    assert c.request_id == "0198c3a1-mistral"


async def test_mistral_top_level_error_keeps_the_providers_message(
    make_config: Callable[..., Config],
) -> None:
    with pytest.raises(PermanentProviderError) as info:
        await ask(
            make_config,
            "openai",
            "mistral-large-latest",
            "mistral_error_top_level",
            base_url="https://api.mistral.ai/v1",
        )
    assert info.value.status == 400
    assert "must be a-z, A-Z, 0-9" in info.value.message


async def test_groq_request_id_comes_from_x_groq(make_config: Callable[..., Config]) -> None:
    c = await ask(
        make_config,
        "openai",
        "llama-3.3-70b-versatile",
        "groq_chat",
        base_url="https://api.groq.com/openai/v1",
    )
    assert c.request_id == "req_01jxyzgroq"
    assert (c.usage.input_tokens, c.usage.output_tokens) == (40, 4)


@pytest.mark.parametrize("sample", ["deepseek_cache", "deepseek_cache_hit_only"])
async def test_deepseek_cache_hits_count_as_cached_input(
    make_config: Callable[..., Config], sample: str
) -> None:
    c = await ask(make_config, "openai", "deepseek-chat", sample, base_url="https://api.deepseek.com")
    assert c.usage.input_tokens == 1000
    assert c.usage.cached_input_tokens == 768
    assert c.usage.cost_usd == expected_cost(232, 768, 0, 50)


async def test_ollama_three_count_usage_parses(make_config: Callable[..., Config]) -> None:
    c = await ask(make_config, "openai", "llama3.2", "ollama_chat", base_url="http://127.0.0.1:11434/v1")
    assert c.text == "Hello from llama."
    assert (c.usage.input_tokens, c.usage.output_tokens, c.usage.total_tokens) == (30, 5, 35)


async def test_ollama_missing_model_is_not_found_with_the_pull_hint(
    make_config: Callable[..., Config],
) -> None:
    with pytest.raises(PermanentProviderError) as info:
        await ask(
            make_config, "openai", "llama9", "ollama_model_missing", base_url="http://127.0.0.1:11434/v1"
        )
    assert info.value.code == "not_found"
    assert "try pulling it first" in info.value.message


async def test_openrouter_answer_parses(make_config: Callable[..., Config]) -> None:
    c = await ask(
        make_config,
        "openai",
        "openai/gpt-4o-mini",
        "openrouter_chat",
        base_url="https://openrouter.ai/api/v1",
    )
    assert c.text == "Routed answer."
    assert c.request_id == "gen-1750000000-abc"


async def test_openrouter_in_band_error_with_status_200_is_an_error_with_upstream_text(
    make_config: Callable[..., Config],
) -> None:
    with pytest.raises(ProviderError) as info:
        await ask(
            make_config,
            "openai",
            "openai/gpt-4o-mini",
            "openrouter_inband_error",
            base_url="https://openrouter.ai/api/v1",
        )
    assert info.value.status == 502
    assert "upstream overloaded" in info.value.message


async def test_anthropic_input_tokens_include_cache_reads_and_writes(
    make_config: Callable[..., Config],
) -> None:
    c = await ask(make_config, "anthropic", "claude-sonnet-4-5", "anthropic_cached")
    assert c.usage.input_tokens == 3 + 1111 + 418
    assert c.usage.cached_input_tokens == 1111
    assert c.usage.cache_write_tokens == 418
    assert c.usage.output_tokens == 92
    assert c.usage.cost_usd == expected_cost(3, 1111, 418, 92)
    assert c.request_id == "req_011CRanthropic"
    assert c.model == "claude-sonnet-4-5-20250929"


async def test_anthropic_max_tokens_maps_to_length_and_skips_thinking(
    make_config: Callable[..., Config],
) -> None:
    c = await ask(make_config, "anthropic", "claude-haiku-4-5", "anthropic_max_tokens")
    assert (c.text, c.finish_reason) == ("Partial", "length")


async def test_gemini_thoughts_are_output_and_thought_parts_are_not_text(
    make_config: Callable[..., Config],
) -> None:
    c = await ask(make_config, "gemini", "gemini-2.5-flash", "gemini_thoughts")
    assert c.text == "Blue."
    assert c.usage.output_tokens == 2 + 126
    assert c.usage.reasoning_tokens == 126
    assert c.usage.total_tokens == 137
    assert c.request_id == "XbZraN2oNpSQ1dkP"


async def test_gemini_cached_content_is_part_of_prompt_and_model_prefix_is_dropped(
    make_config: Callable[..., Config],
) -> None:
    c = await ask(make_config, "gemini", "gemini-2.5-pro", "gemini_cached")
    assert c.usage.input_tokens == 5000
    assert c.usage.cached_input_tokens == 4096
    assert c.usage.cost_usd == expected_cost(904, 4096, 0, 10)
    assert c.model == "gemini-2.5-pro"


@pytest.mark.parametrize(
    ("sample", "finish"),
    [
        ("gemini_safety_blocked", "content_filter"),
        ("gemini_prompt_blocked", "content_filter"),
        ("gemini_max_tokens_no_parts", "length"),
    ],
)
async def test_gemini_blocked_or_exhausted_answers_are_empty_with_a_reason(
    make_config: Callable[..., Config], sample: str, finish: str
) -> None:
    c = await ask(make_config, "gemini", "gemini-2.5-flash", sample)
    assert (c.text, c.finish_reason) == ("", finish)


async def test_gemini_bad_key_is_an_auth_error_even_though_google_says_400(
    make_config: Callable[..., Config],
) -> None:
    with pytest.raises(PermanentProviderError) as info:
        await ask(make_config, "gemini", "gemini-2.5-flash", "gemini_error_400_api_key_invalid")
    assert info.value.code == "auth_error"


async def test_a_200_without_the_expected_fields_is_a_malformed_response(
    make_config: Callable[..., Config],
) -> None:
    with pytest.raises(MalformedResponse):
        await ask(make_config, "anthropic", "claude-haiku-4-5", "openai_basic")


async def test_no_price_means_cost_is_null_and_a_price_unknown_warning(
    make_config: Callable[..., Config],
) -> None:
    config = make_config({"p": provider_entry("openai", "llama3.2", "http://127.0.0.1:11434/v1")})
    async with open_pool(config, ScriptedTransport("ollama_chat")) as pool:
        c = await pool.get("p").complete(CompletionRequest.ask("q"), deadline=anyio.current_time() + 5)
    assert c.usage.cost_usd is None
    assert c.warnings == ("price_unknown",)
