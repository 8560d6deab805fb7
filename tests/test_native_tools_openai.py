"""Native tool calls over the OpenAI Chat Completions wire, through ProviderClient.complete()
over the in-memory transport: the declarations and tool_choice sent, the calls read back (ids, names,
strict arguments, echo), and the next request built from them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from conclave.core.messages import (
    Completion,
    CompletionRequest,
    Message,
    ToolDeclaration,
    ToolReturn,
    ToolUse,
)
from conclave.schema.config import Config
from tests.support import ScriptedTransport, open_pool, provider_entry

pytestmark = pytest.mark.anyio

FIXTURES: dict[str, Any] = json.loads(
    (Path(__file__).parent / "fixtures" / "native_tools_openai.json").read_text(encoding="utf-8")
)
FETCH_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["url"],
    "properties": {"url": {"type": "string"}, "max_bytes": {"type": "integer"}},
}
FETCH = ToolDeclaration("fetch", "Fetch one http(s) URL under the session's policies.", FETCH_SCHEMA)
LIST = ToolDeclaration("list_providers", "The panel's providers.", {"type": "object", "properties": {}})
ASK = CompletionRequest.ask("Compare pages a and b.", system="Be brief.", max_tokens=300, tools=(FETCH, LIST))
OPENAI = provider_entry("openai", "gpt-4.1", "https://api.openai.com/v1")


def fixture(name: str) -> Callable[[httpx.Request], httpx.Response]:
    sample = FIXTURES[name]
    return lambda _request: httpx.Response(sample["status"], headers=sample["headers"], json=sample["body"])


def message_of(name: str) -> dict[str, Any]:
    message: dict[str, Any] = FIXTURES[name]["body"]["choices"][0]["message"]
    return message


async def exchange(
    make_config: Callable[..., Config],
    entry: dict[str, Any],
    *turns: tuple[CompletionRequest, str],
) -> tuple[list[Completion], list[Any]]:
    """Each request answered by its named fixture; the completions and the bodies sent. Plain calls:
    the fixtures are recorded whole bodies (streams: tests/test_stream_assembly.py)."""
    config = make_config(
        {"p": {**entry, "api_key_env": "TEST_KEY", "stream": False}}, env={"TEST_KEY": "sk-test"}
    )
    transport = ScriptedTransport(*(fixture(name) for _, name in turns))
    async with open_pool(config, transport) as pool:
        completions = [
            await pool.get("p").complete(request, deadline=anyio.current_time() + 5) for request, _ in turns
        ]
    return completions, transport.bodies()


async def test_tools_are_declared_as_functions_with_their_schema_and_auto_is_left_to_the_default(
    make_config: Callable[..., Config],
) -> None:
    _, [body] = await exchange(make_config, OPENAI, (ASK, "openai_parallel_tool_calls"))
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "fetch",
                "description": "Fetch one http(s) URL under the session's policies.",
                "parameters": FETCH_SCHEMA,
            },
        },
        {
            "type": "function",
            "function": {
                "name": "list_providers",
                "description": "The panel's providers.",
                "parameters": {"type": "object", "properties": {}},
            },
        },
    ]
    assert "tool_choice" not in body


async def test_a_final_round_keeps_the_declarations_and_forbids_calls_with_tool_choice_none(
    make_config: Callable[..., Config],
) -> None:
    final = CompletionRequest.ask("Answer now.", tools=(FETCH,), tool_choice="none")
    _, [body] = await exchange(make_config, OPENAI, (final, "openai_final_answer"))
    assert [t["function"]["name"] for t in body["tools"]] == ["fetch"]
    assert body["tool_choice"] == "none"


async def test_without_tools_the_body_is_exactly_what_it_was(make_config: Callable[..., Config]) -> None:
    plain = CompletionRequest.ask("Hi?", system="Be brief.", max_tokens=50, temperature=0.2)
    _, [body] = await exchange(make_config, OPENAI, (plain, "openai_final_answer"))
    assert body == {
        "model": "gpt-4.1",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}],
        "max_completion_tokens": 50,
        "temperature": 0.2,
    }


async def test_reasoning_models_keep_their_quirks_when_tools_are_declared(
    make_config: Callable[..., Config],
) -> None:
    request = CompletionRequest.ask("Q", system="S", temperature=0.5, tools=(FETCH,), tool_choice="none")
    entry = provider_entry("openai", "o1-mini", "https://api.openai.com/v1")
    _, [body] = await exchange(make_config, entry, (request, "openai_final_answer"))
    assert body["messages"][0] == {"role": "user", "content": "S"}
    assert "temperature" not in body and "max_tokens" not in body
    assert (body["max_completion_tokens"], body["tool_choice"]) == (1024, "none")


async def test_parallel_tool_calls_are_read_in_order_with_their_ids_and_the_message_as_echo(
    make_config: Callable[..., Config],
) -> None:
    [c], _ = await exchange(make_config, OPENAI, (ASK, "openai_parallel_tool_calls"))
    assert c.tool_uses == (
        ToolUse("call_Qw3rTy7uIoP1aSdFgH2jKl9z", "fetch", {"url": "https://example.org/a"}),
        ToolUse(
            "call_Zx8cVb5nMl4kJh3gFd2sAq1w", "fetch", {"url": "https://example.org/b", "max_bytes": 4096}
        ),
    )
    message = message_of("openai_parallel_tool_calls")
    # Response-only fields (refusal, annotations) are not sent back.
    assert c.echo == {"role": "assistant", "content": None, "tool_calls": message["tool_calls"]}
    assert c.echo["tool_calls"] is not message["tool_calls"]  # a copy, not the parsed body
    assert (c.text, c.finish_reason) == ("", "tool_calls")
    assert c.request_id == "req_5d2f0c1e9a8b47c6b3e1f0a2d4c6e8f0"


async def test_an_argument_string_with_a_duplicate_key_becomes_a_tool_use_error_not_an_exception(
    make_config: Callable[..., Config],
) -> None:
    [c], _ = await exchange(make_config, OPENAI, (ASK, "openai_duplicate_key_arguments"))
    bad, no_args = c.tool_uses
    assert (bad.id, bad.name, bad.arguments) == ("call_Dup1cAt3KeY0000000000001", "fetch", None)
    assert bad.error is not None and "duplicate key 'url'" in bad.error
    assert no_args == ToolUse("call_NoArgs000000000000000002", "list_providers", {})
    assert c.text == "Checking both sources."  # text beside the calls is kept


async def test_a_plain_answer_has_no_tool_uses_and_no_echo(make_config: Callable[..., Config]) -> None:
    [c], _ = await exchange(make_config, OPENAI, (ASK, "openai_final_answer"))
    assert (c.text, c.tool_uses, c.echo, c.finish_reason) == (
        "Both pages agree: the answer is 42.",
        (),
        None,
        "stop",
    )


async def test_round_trip_repeats_the_assistant_message_unchanged_and_answers_each_call_in_order(
    make_config: Callable[..., Config],
) -> None:
    config = make_config({"p": {**OPENAI, "api_key_env": "TEST_KEY"}}, env={"TEST_KEY": "sk-test"})
    transport = ScriptedTransport(fixture("openai_parallel_tool_calls"), fixture("openai_final_answer"))
    async with open_pool(config, transport) as pool:
        client = pool.get("p")
        first = await client.complete(ASK, deadline=anyio.current_time() + 5)
        a, b = first.tool_uses
        returns = (
            ToolReturn(a.id, a.name, "<tool_result>page a</tool_result>"),
            ToolReturn(
                b.id, b.name, "<tool_result>refused: hop_budget_exhausted</tool_result>", is_error=True
            ),
        )
        follow_up = CompletionRequest(
            messages=(
                *ASK.messages,
                Message("assistant", first.text, tool_uses=first.tool_uses, echo=first.echo),
                Message("user", "", tool_returns=returns),
            ),
            system=ASK.system,
            max_tokens=ASK.max_tokens,
            tools=ASK.tools,
            tool_choice="none",
        )
        final = await client.complete(follow_up, deadline=anyio.current_time() + 5)
    sent = transport.bodies()[1]
    original = message_of("openai_parallel_tool_calls")
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Compare pages a and b."},
        {"role": "assistant", "content": None, "tool_calls": original["tool_calls"]},
        {
            "role": "tool",
            "tool_call_id": "call_Qw3rTy7uIoP1aSdFgH2jKl9z",
            "content": "<tool_result>page a</tool_result>",
        },
        {
            "role": "tool",
            "tool_call_id": "call_Zx8cVb5nMl4kJh3gFd2sAq1w",
            "content": "<tool_result>refused: hop_budget_exhausted</tool_result>",
        },
    ]
    assert (sent["tool_choice"], len(sent["tools"])) == ("none", 2)
    assert (final.text, final.tool_uses) == ("Both pages agree: the answer is 42.", ())


async def test_an_assistant_turn_without_echo_is_rebuilt_from_its_tool_uses(
    make_config: Callable[..., Config],
) -> None:
    uses = (
        ToolUse("call_1", "fetch", {"url": "https://example.org/a"}),
        ToolUse("call_2", "fetch", None, "bad"),
    )
    request = CompletionRequest(
        messages=(
            Message("user", "Q"),
            Message("assistant", "", tool_uses=uses),
            Message(
                "user",
                "And now?",
                tool_returns=(ToolReturn("call_1", "fetch", "A"), ToolReturn("call_2", "fetch", "R", True)),
            ),
        ),
        tools=(FETCH,),
    )
    _, [body] = await exchange(make_config, OPENAI, (request, "openai_final_answer"))
    assert body["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "fetch", "arguments": '{"url":"https://example.org/a"}'},
                },
                {"id": "call_2", "type": "function", "function": {"name": "fetch", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "A"},
        {"role": "tool", "tool_call_id": "call_2", "content": "R"},
        {"role": "user", "content": "And now?"},  # the user's own words come after every result
    ]


@pytest.mark.parametrize(
    ("model", "base_url", "name", "echoed"),
    [
        # DeepSeek 400s unless its thinking comes back within a tool-call turn.
        ("deepseek-reasoner", "https://api.deepseek.com", "deepseek_reasoner_tool_call", "reasoning_content"),
        # OpenRouter carries upstream signatures in reasoning_details; its plain `reasoning` stays out.
        (
            "anthropic/claude-sonnet-4.5",
            "https://openrouter.ai/api/v1",
            "openrouter_reasoning_details_tool_call",
            "reasoning_details",
        ),
        # Groq 400s on the `reasoning` it sends itself (karthink/gptel#774).
        ("openai/gpt-oss-120b", "https://api.groq.com/openai/v1", "groq_reasoning_tool_call", None),
    ],
)
async def test_thinking_a_server_needs_back_is_echoed_and_never_becomes_text(
    make_config: Callable[..., Config], model: str, base_url: str, name: str, echoed: str | None
) -> None:
    [c], _ = await exchange(make_config, provider_entry("openai", model, base_url), (ASK, name))
    message = message_of(name)
    kept = ("role", "content", "tool_calls", *((echoed,) if echoed else ()))
    assert c.echo == {k: message[k] for k in kept}
    assert (c.text, c.finish_reason) == ("", "tool_calls")
    assert [u.id for u in c.tool_uses] == [call["id"] for call in message["tool_calls"]]


def answering(c: Completion, result: str) -> CompletionRequest:
    """The request after a one-call turn: the turn as the worker keeps it, then the call's result."""
    [use] = c.tool_uses
    return CompletionRequest(
        messages=(
            Message("assistant", c.text, tool_uses=c.tool_uses, echo=c.echo),
            Message("user", "", tool_returns=(ToolReturn(use.id, use.name, result),)),
        ),
        tools=(FETCH,),
    )


async def test_mistral_nine_character_ids_go_back_exactly_as_sent(make_config: Callable[..., Config]) -> None:
    entry = provider_entry("openai", "mistral-large-latest", "https://api.mistral.ai/v1")
    [c], _ = await exchange(make_config, entry, (ASK, "mistral_tool_call"))
    _, [body] = await exchange(make_config, entry, (answering(c, "ok"), "openai_final_answer"))
    # Mistral's calls lack "type"; the echo keeps them as Mistral wrote them.
    assert body["messages"] == [
        {"role": "assistant", "content": "", "tool_calls": message_of("mistral_tool_call")["tool_calls"]},
        {"role": "tool", "tool_call_id": "D681PevKs", "content": "ok"},
    ]


async def test_gemini_thought_signatures_on_its_openai_endpoint_ride_back_inside_the_echoed_calls(
    make_config: Callable[..., Config],
) -> None:
    entry = provider_entry(
        "openai", "gemini-3-pro-preview", "https://generativelanguage.googleapis.com/v1beta/openai"
    )
    [c], _ = await exchange(make_config, entry, (ASK, "gemini_openai_compat_thought_signature"))
    _, [body] = await exchange(make_config, entry, (answering(c, "ok"), "openai_final_answer"))
    [call] = body["messages"][0]["tool_calls"]
    assert call["extra_content"] == {
        "google": {"thought_signature": "CpcCAdHtim9Qx3oYyzQ0EXAMPLEsignatureA=="}
    }
    assert body["messages"][1] == {
        "role": "tool",
        "tool_call_id": "function-call-5765239519440315476",
        "content": "ok",
    }


async def test_calls_without_ids_get_stable_positional_ones(make_config: Callable[..., Config]) -> None:
    entry = provider_entry("openai", "llama3.2", "http://127.0.0.1:11434/v1")
    [c], _ = await exchange(make_config, entry, (ASK, "local_server_tool_calls_without_ids"))
    assert [(u.id, u.arguments) for u in c.tool_uses] == [
        ("call-0", {"url": "https://example.org/a"}),
        ("call-1", {"url": "https://example.org/b"}),
    ]
