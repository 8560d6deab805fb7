"""What each adapter puts on the wire: auth headers, system placement, token-limit fields
and the sampling parameters reasoning models reject."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import anyio
import orjson
import pytest

from conclave.core.errors import MissingApiKey
from conclave.core.messages import CompletionRequest, Message
from conclave.providers.base import Endpoint
from conclave.providers.client import _Outgoing
from conclave.schema.config import Config
from tests.support import ScriptedTransport, open_pool, provider_entry

pytestmark = pytest.mark.anyio

KEY = "sk-test-0123456789abcdefghij"
REQUEST = CompletionRequest(
    messages=(Message("user", "What is 2+2?"), Message("assistant", "4"), Message("user", "Sure?")),
    system="Be brief.",
    max_tokens=77,
    temperature=0.3,
)


async def send(
    make_config: Callable[..., Config],
    entry: dict[str, Any],
    sample: str,
    request: CompletionRequest = REQUEST,
) -> ScriptedTransport:
    config = make_config({"p": {**entry, "api_key_env": "TEST_KEY"}}, env={"TEST_KEY": KEY})
    transport = ScriptedTransport(sample)
    async with open_pool(config, transport) as pool:
        await pool.get("p").complete(request, deadline=anyio.current_time() + 5)
    return transport


async def test_openai_sends_bearer_auth_system_first_and_temperature(
    make_config: Callable[..., Config],
) -> None:
    t = await send(
        make_config, provider_entry("openai", "gpt-4.1-mini", "https://api.openai.com/v1"), "openai_basic"
    )
    request = t.requests[0]
    assert str(request.url) == "https://api.openai.com/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    body = t.bodies()[0]
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert [m["role"] for m in body["messages"][1:]] == ["user", "assistant", "user"]
    assert body["temperature"] == 0.3
    assert body["max_completion_tokens"] == 77
    assert "max_tokens" not in body


@pytest.mark.parametrize("model", ["gpt-5", "gpt-5-mini", "o3", "o4-mini", "openai/gpt-5-nano"])
async def test_reasoning_models_get_max_completion_tokens_and_no_temperature(
    make_config: Callable[..., Config], model: str
) -> None:
    t = await send(
        make_config,
        provider_entry("openai", model, "https://openrouter.example/v1"),
        "openai_reasoning_usage",
    )
    body = t.bodies()[0]
    assert body["max_completion_tokens"] == 77
    assert "max_tokens" not in body
    assert "temperature" not in body


async def test_compatible_servers_get_max_tokens_and_keep_temperature(
    make_config: Callable[..., Config],
) -> None:
    t = await send(
        make_config, provider_entry("openai", "llama3.2", "http://127.0.0.1:11434/v1"), "ollama_chat"
    )
    body = t.bodies()[0]
    assert body["max_tokens"] == 77
    assert body["temperature"] == 0.3


async def test_configured_max_tokens_field_wins(make_config: Callable[..., Config]) -> None:
    entry = provider_entry("openai", "gpt-5", "https://openrouter.ai/api/v1", max_tokens_field="max_tokens")
    body = (await send(make_config, entry, "openrouter_chat")).bodies()[0]
    assert body["max_tokens"] == 77
    assert "max_completion_tokens" not in body


@pytest.mark.parametrize(
    ("base_url", "takes_key", "sent"),
    [
        ("https://api.openai.com/v1", True, True),
        ("https://api.openai.com/v1", False, False),  # the host alone decides nothing
        ("https://gateway.example/v1", False, False),
        ("https://gateway.example/v1", True, True),  # a proxy that says it passes the key on
    ],
)
async def test_openai_kind_sends_the_cache_key_only_where_the_entry_says_the_api_takes_one(
    make_config: Callable[..., Config], base_url: str, takes_key: bool, sent: bool
) -> None:
    entry = provider_entry("openai", "gpt-4.1-mini", base_url, prompt_cache_key=takes_key)
    request = replace(REQUEST, cache_key="s-cache")
    body = (await send(make_config, entry, "openai_basic", request)).bodies()[0]
    assert body.get("prompt_cache_key") == ("s-cache" if sent else None)


async def test_no_session_no_cache_key_whatever_the_entry(make_config: Callable[..., Config]) -> None:
    entry = provider_entry("openai", "gpt-4.1-mini", "https://api.openai.com/v1", prompt_cache_key=True)
    assert "prompt_cache_key" not in (await send(make_config, entry, "openai_basic")).bodies()[0]


@pytest.mark.parametrize("shared", [0, len("Be brief.")])
async def test_anthropic_marks_a_breakpoint_only_where_the_request_says_it_is_read_again(
    make_config: Callable[..., Config], shared: int
) -> None:
    entry = provider_entry("anthropic", "claude-sonnet-4-5", "https://api.anthropic.com")
    request = replace(REQUEST, cache_prefix=shared, cache_key="s-cache")
    body = (await send(make_config, entry, "anthropic_cached", request)).bodies()[0]
    marked = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    assert body["system"] == (marked if shared else "Be brief.")
    assert "prompt_cache_key" not in body, "an OpenAI field"


async def test_o1_mini_gets_its_system_prompt_as_a_user_message(make_config: Callable[..., Config]) -> None:
    t = await send(
        make_config, provider_entry("openai", "o1-mini", "https://api.openai.com/v1"), "openai_basic"
    )
    assert t.bodies()[0]["messages"][0] == {"role": "user", "content": "Be brief."}


async def test_anthropic_sends_x_api_key_version_and_top_level_system(
    make_config: Callable[..., Config],
) -> None:
    t = await send(
        make_config,
        provider_entry("anthropic", "claude-sonnet-4-5", "https://api.anthropic.com"),
        "anthropic_cached",
    )
    request = t.requests[0]
    assert str(request.url) == "https://api.anthropic.com/v1/messages"
    assert request.headers["x-api-key"] == KEY
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in request.headers
    body = t.bodies()[0]
    assert body["system"] == "Be brief."
    assert all(m["role"] in ("user", "assistant") for m in body["messages"])
    assert (body["max_tokens"], body["temperature"]) == (77, 0.3)


async def test_anthropic_opus_4_8_gets_no_sampling_settings(make_config: Callable[..., Config]) -> None:
    t = await send(
        make_config,
        provider_entry("anthropic", "claude-opus-4-8", "https://api.anthropic.com"),
        "anthropic_cached",
    )
    assert "temperature" not in t.bodies()[0]


@pytest.mark.parametrize(
    ("stream", "method"), [(True, "streamGenerateContent?alt=sse"), (False, "generateContent")]
)
async def test_gemini_key_goes_in_a_header_never_in_the_url(
    make_config: Callable[..., Config], stream: bool, method: str
) -> None:
    t = await send(
        make_config,
        provider_entry(
            "gemini", "gemini-2.5-flash", "https://generativelanguage.googleapis.com", stream=stream
        ),
        "gemini_thoughts",
    )
    request = t.requests[0]
    assert (
        str(request.url)
        == f"https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:{method}"
    )
    assert KEY not in str(request.url)
    assert request.headers["x-goog-api-key"] == KEY
    body = t.bodies()[0]
    assert body["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert [c["role"] for c in body["contents"]] == ["user", "model", "user"]
    assert body["generationConfig"] == {"maxOutputTokens": 77, "temperature": 0.3}


async def test_configured_extra_headers_are_sent(make_config: Callable[..., Config]) -> None:
    entry = provider_entry(
        "openai",
        "gpt-4o-mini",
        "https://openrouter.ai/api/v1",
        headers={"HTTP-Referer": "https://example.org", "X-Title": "conclave"},
    )
    t = await send(make_config, entry, "openrouter_chat")
    assert t.requests[0].headers["x-title"] == "conclave"


async def test_missing_key_fails_before_any_request_naming_the_variable(
    make_config: Callable[..., Config],
) -> None:
    config = make_config(
        {"p": provider_entry("openai", "gpt-4o", "https://api.openai.com/v1", api_key_env="MY_OPENAI_KEY")}
    )
    transport = ScriptedTransport("openai_basic")
    async with open_pool(config, transport) as pool:
        with pytest.raises(MissingApiKey) as info:
            await pool.get("p").complete(REQUEST, deadline=anyio.current_time() + 5)
    assert "MY_OPENAI_KEY" in str(info.value)
    assert info.value.code == "missing_api_key"
    assert transport.requests == []


async def test_provider_without_key_variable_sends_no_auth_header(make_config: Callable[..., Config]) -> None:
    config = make_config({"p": provider_entry("openai", "llama3.2", "http://127.0.0.1:11434/v1")})
    transport = ScriptedTransport("ollama_chat")
    async with open_pool(config, transport) as pool:
        await pool.get("p").complete(REQUEST, deadline=anyio.current_time() + 5)
    assert "authorization" not in transport.requests[0].headers


def test_a_waiting_request_body_holds_only_its_own_bytes() -> None:
    """The encoded body stays alive for the whole provider call: orjson's own result keeps its
    whole output buffer however short the JSON, and thousands of calls may be waiting."""
    endpoint = Endpoint("http://127.0.0.1:9/v1/chat/completions", {})
    body = {"model": "m", "messages": []}
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [_Outgoing.encode(endpoint, body) for _ in range(200)]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()

    assert kept[0].content == orjson.dumps(body)
    assert held < 200 * 1024  # well under 1 KiB a request: not orjson's whole buffer
