"""Native tool calls on the Anthropic Messages wire (docs/providers.md#native-tool-calling), through
ProviderClient.complete() over the in-memory transport: the declarations, the final round's
`tool_choice`, the assistant turn repeated block for block (thinking signatures included), the
tool_result turn, and what the adapter reads out of `tool_use` responses."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

from conclave.core.messages import (
    Completion,
    CompletionRequest,
    Message,
    ToolDeclaration,
    ToolReturn,
    ToolUse,
)
from conclave.providers.anthropic import AnthropicAdapter
from conclave.schema.config import Config
from conclave.schema.strictjson import MAX_ARGUMENT_DEPTH
from tests.support import ScriptedTransport, open_pool, provider_entry

pytestmark = pytest.mark.anyio

KEY = "sk-ant-test-0123456789abcdef"
FIXTURES: dict[str, Any] = json.loads(
    (Path(__file__).parent / "fixtures" / "native_tools_anthropic.json").read_text(encoding="utf-8")
)
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "location": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["location"],
    "additionalProperties": False,
}
FETCH_SCHEMA = {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}
TOOLS = (
    ToolDeclaration("get_weather", "The current weather at a place.", WEATHER_SCHEMA),
    ToolDeclaration("fetch_url", "Fetch a public web page.", FETCH_SCHEMA),
)
DECLARED = [
    {"name": "get_weather", "description": "The current weather at a place.", "input_schema": WEATHER_SCHEMA},
    {"name": "fetch_url", "description": "Fetch a public web page.", "input_schema": FETCH_SCHEMA},
]
QUESTION = Message("user", "What is the weather in Paris?")


def answer(name: str, body: dict[str, Any] | None = None) -> Callable[[httpx.Request], httpx.Response]:
    sample = FIXTURES[name]
    return lambda _request: httpx.Response(
        sample["status"], headers=sample["headers"], json=body if body is not None else sample["body"]
    )


def content_of(name: str) -> list[dict[str, Any]]:
    return copy.deepcopy(FIXTURES[name]["body"]["content"])


async def exchange(
    make_config: Callable[..., Config],
    requests: list[CompletionRequest | Callable[[Completion], CompletionRequest]],
    *steps: Callable[[httpx.Request], httpx.Response],
) -> tuple[ScriptedTransport, list[Completion]]:
    """Send the requests in turn (a callable builds the next one from the last completion) and
    return what was sent and what came back."""
    # Plain calls: the fixtures are recorded whole bodies (streams: tests/test_stream_assembly.py).
    entry = provider_entry(
        "anthropic", "claude-sonnet-4-5", "https://api.anthropic.com", api_key_env="K", stream=False
    )
    config = make_config({"p": entry}, env={"K": KEY})
    transport = ScriptedTransport(*(steps or (answer("final_answer"),)))
    completions: list[Completion] = []
    async with open_pool(config, transport) as pool:
        for request in requests:
            if not isinstance(request, CompletionRequest):
                request = request(completions[-1])
            completions.append(await pool.get("p").complete(request, deadline=anyio.current_time() + 5))
    return transport, completions


async def ask_with_tools(
    make_config: Callable[..., Config], step: Callable[[httpx.Request], httpx.Response]
) -> Completion:
    _, [completion] = await exchange(
        make_config, [CompletionRequest(messages=(QUESTION,), tools=TOOLS)], step
    )
    return completion


async def test_a_request_without_tools_is_sent_byte_for_byte_as_before(
    make_config: Callable[..., Config],
) -> None:
    request = CompletionRequest(
        messages=(QUESTION, Message("assistant", "Let me think."), Message("user", "Go on.")),
        system="Be brief.",
        max_tokens=64,
        temperature=0.2,
    )
    transport, _ = await exchange(make_config, [request])

    assert transport.requests[0].content == orjson.dumps(
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 64,
            "messages": [
                {"role": "user", "content": "What is the weather in Paris?"},
                {"role": "assistant", "content": "Let me think."},
                {"role": "user", "content": "Go on."},
            ],
            "system": "Be brief.",
            "temperature": 0.2,
        }
    )


async def test_tools_are_declared_with_input_schema_and_auto_sends_no_tool_choice(
    make_config: Callable[..., Config],
) -> None:
    transport, _ = await exchange(
        make_config,
        [CompletionRequest(messages=(QUESTION,), system="Use tools.", max_tokens=512, tools=TOOLS)],
    )

    assert transport.bodies()[0] == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 512,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "system": "Use tools.",
        "tools": DECLARED,
    }


async def test_a_final_round_keeps_the_declarations_and_forbids_calls_with_tool_choice_none(
    make_config: Callable[..., Config],
) -> None:
    request = CompletionRequest(messages=(QUESTION,), max_tokens=512, tools=TOOLS, tool_choice="none")
    transport, _ = await exchange(make_config, [request])

    body = transport.bodies()[0]
    assert body["tools"] == DECLARED
    assert body["tool_choice"] == {"type": "none"}


async def test_tool_choice_none_without_tools_sends_neither(make_config: Callable[..., Config]) -> None:
    transport, _ = await exchange(make_config, [CompletionRequest(messages=(QUESTION,), tool_choice="none")])

    assert "tools" not in transport.bodies()[0]
    assert "tool_choice" not in transport.bodies()[0]


async def test_a_tool_use_after_thinking_is_read_with_its_id_and_input_and_the_thinking_stays_hidden(
    make_config: Callable[..., Config],
) -> None:
    completion = await ask_with_tools(make_config, answer("tool_use_with_thinking"))

    assert completion.tool_uses == (
        ToolUse("toolu_01CswdEQBMshySk6Y9DFKrfq", "get_weather", {"location": "Paris", "unit": "celsius"}),
    )
    assert completion.text == "I can check the current weather in Paris for you."
    assert completion.echo == content_of("tool_use_with_thinking")
    assert completion.echo[0]["signature"].startswith("EuYBCkQYAiJA")
    assert completion.finish_reason == "tool_calls"  # stop_reason "tool_use", normalised as before
    assert (completion.usage.input_tokens, completion.usage.output_tokens) == (412, 147)
    assert completion.request_id == "req_011CTool1ThinkingAbCdEf"


async def test_parallel_tool_uses_keep_their_order_and_the_redacted_thinking_is_echoed(
    make_config: Callable[..., Config],
) -> None:
    completion = await ask_with_tools(make_config, answer("parallel_tool_use_redacted_thinking"))

    assert completion.tool_uses == (
        ToolUse(
            "toolu_01A09q90qw90lq917835lq9", "fetch_url", {"url": "https://example.org/a", "max_bytes": 4096}
        ),
        ToolUse("toolu_01B19r01rx01mr028946mr0", "fetch_url", {"url": "https://example.org/b"}),
        ToolUse("toolu_01C2As12sy12ns139057ns1", "list_providers", {}),
    )
    assert completion.text == ""
    assert completion.echo == content_of("parallel_tool_use_redacted_thinking")
    assert completion.echo[0]["type"] == "redacted_thinking"


async def test_inputs_that_break_the_strict_rules_become_tool_use_errors_not_exceptions(
    make_config: Callable[..., Config],
) -> None:
    body = copy.deepcopy(FIXTURES["tool_use_bad_inputs"]["body"])
    deep: dict[str, Any] = {"leaf": 1}
    for _ in range(MAX_ARGUMENT_DEPTH + 5):
        deep = {"a": deep}
    body["content"][1]["input"]["note"] = "x" * 20_000
    body["content"][2]["input"] = deep
    completion = await ask_with_tools(make_config, answer("tool_use_bad_inputs", body))

    huge, nested, fine = completion.tool_uses
    assert (huge.id, huge.name, huge.arguments) == ("toolu_01D3Bt23tz23ot240168ot2", "fetch_url", None)
    assert huge.error is not None and "larger than" in huge.error
    assert (nested.id, nested.arguments) == ("toolu_01E4Cu34ua34pu351279pu3", None)
    assert nested.error is not None and "nested deeper" in nested.error
    assert fine == ToolUse("toolu_01F5Dv45vb45qv462380qv4", "fetch_url", {"url": "https://example.org/d"})
    assert completion.text == "Fetching both."
    assert completion.echo == body["content"]  # the provider's blocks as sent, whatever we made of them


async def test_a_plain_answer_has_no_tool_uses_and_nothing_to_echo(
    make_config: Callable[..., Config],
) -> None:
    completion = await ask_with_tools(make_config, answer("final_answer"))

    assert (completion.text, completion.tool_uses, completion.echo) == (
        "It is 14 °C and cloudy in Paris.",
        (),
        None,
    )
    assert completion.finish_reason == "stop"


def test_the_echo_is_a_copy_the_response_body_cannot_change(make_config: Callable[..., Config]) -> None:
    """The one check below the client: its decoded body never leaves it, so only the adapter
    itself can show that the echo shares nothing with it."""
    entry = make_config({"p": provider_entry("anthropic", "claude-sonnet-4-5", "https://api.anthropic.com")})
    body = copy.deepcopy(FIXTURES["tool_use_with_thinking"]["body"])
    parsed = AnthropicAdapter().parse(body, httpx.Headers(), entry.providers["p"])

    body["content"][0]["signature"] = "tampered"
    body["content"][2]["input"]["location"] = "Lyon"
    assert parsed.echo == content_of("tool_use_with_thinking")
    assert parsed.tool_uses[0].arguments == {"location": "Paris", "unit": "celsius"}


async def test_an_assistant_turn_with_echo_is_sent_unchanged_and_the_results_follow_as_tool_result_blocks(
    make_config: Callable[..., Config],
) -> None:
    echo = content_of("parallel_tool_use_redacted_thinking")
    uses = (
        ToolUse(
            "toolu_01A09q90qw90lq917835lq9", "fetch_url", {"url": "https://example.org/a", "max_bytes": 4096}
        ),
        ToolUse("toolu_01B19r01rx01mr028946mr0", "fetch_url", {"url": "https://example.org/b"}),
        ToolUse("toolu_01C2As12sy12ns139057ns1", "list_providers", {}),
    )
    returns = (
        ToolReturn(
            "toolu_01A09q90qw90lq917835lq9", "fetch_url", '<tool_result name="fetch_url">A</tool_result>'
        ),
        ToolReturn(
            "toolu_01B19r01rx01mr028946mr0", "fetch_url", '<tool_result name="fetch_url">B</tool_result>'
        ),
        ToolReturn(
            "toolu_01C2As12sy12ns139057ns1",
            "list_providers",
            '<tool_result name="list_providers" error="not_allowlisted">refused</tool_result>',
            is_error=True,
        ),
    )
    request = CompletionRequest(
        messages=(
            QUESTION,
            Message("assistant", "", tool_uses=uses, echo=echo),
            Message("user", "", tool_returns=returns),
        ),
        tools=TOOLS,
    )
    transport, _ = await exchange(make_config, [request])

    assert transport.bodies()[0]["messages"][1:] == [
        {"role": "assistant", "content": content_of("parallel_tool_use_redacted_thinking")},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01A09q90qw90lq917835lq9",
                    "content": returns[0].content,
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01B19r01rx01mr028946mr0",
                    "content": returns[1].content,
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01C2As12sy12ns139057ns1",
                    "content": returns[2].content,
                    "is_error": True,
                },
            ],
        },
    ]


async def test_text_beside_tool_results_comes_after_them(make_config: Callable[..., Config]) -> None:
    returns = (ToolReturn("toolu_1", "fetch_url", "page"),)
    request = CompletionRequest(
        messages=(
            QUESTION,
            Message("assistant", "", tool_uses=(ToolUse("toolu_1", "fetch_url", {"url": "u"}),)),
            Message("user", "Now answer.", tool_returns=returns),
        ),
        tools=TOOLS,
    )
    transport, _ = await exchange(make_config, [request])

    assert transport.bodies()[0]["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "page"},
        {"type": "text", "text": "Now answer."},
    ]


async def test_an_assistant_turn_without_echo_is_rebuilt_from_its_calls(
    make_config: Callable[..., Config],
) -> None:
    uses = (
        ToolUse("toolu_1", "fetch_url", {"url": "https://example.org"}),
        ToolUse("toolu_2", "fetch_url", None, error="invalid tool call arguments"),
    )
    request = CompletionRequest(
        messages=(
            QUESTION,
            Message("assistant", "Looking.", tool_uses=uses),
            Message("assistant", "", tool_uses=uses[:1]),
        ),
        tools=TOOLS,
    )
    transport, _ = await exchange(make_config, [request])

    assistant, bare = transport.bodies()[0]["messages"][1:]
    assert assistant["content"] == [
        {"type": "text", "text": "Looking."},
        {"type": "tool_use", "id": "toolu_1", "name": "fetch_url", "input": {"url": "https://example.org"}},
        {"type": "tool_use", "id": "toolu_2", "name": "fetch_url", "input": {}},
    ]
    assert bare["content"] == [assistant["content"][1]]  # no empty text block: the API rejects those


def assert_anthropic_accepts(body: dict[str, Any]) -> None:
    """The documented rules a tool loop's request must meet: every tool_use is answered by a
    tool_result in the very next (user) message, the results open that message, and no text
    block is empty."""
    messages = body["messages"]
    declared = {tool["name"] for tool in body.get("tools", [])}
    for i, message in enumerate(messages):
        blocks = message["content"] if isinstance(message["content"], list) else []
        assert all(b.get("text") for b in blocks if b["type"] == "text"), "empty text block"
        called = [b["id"] for b in blocks if b["type"] == "tool_use"]
        if message["role"] == "assistant" and called:
            assert {b["name"] for b in blocks if b["type"] == "tool_use"} <= declared
            following = messages[i + 1]
            assert following["role"] == "user"
            results = [b for b in following["content"] if b["type"] == "tool_result"]
            assert following["content"][: len(results)] == results, "tool_result blocks must come first"
            assert [b["tool_use_id"] for b in results] == called


async def test_a_parsed_tool_turn_round_trips_into_a_request_the_api_accepts(
    make_config: Callable[..., Config],
) -> None:
    first = CompletionRequest(messages=(QUESTION,), system="Use tools.", max_tokens=1024, tools=TOOLS)

    def next_request(c: Completion) -> CompletionRequest:
        call = c.tool_uses[0]
        result = ToolReturn(call.id, call.name, '<tool_result name="get_weather">14 °C, cloudy</tool_result>')
        turn = (
            Message("assistant", c.text, tool_uses=c.tool_uses, echo=c.echo),
            Message("user", "", tool_returns=(result,)),
        )
        return CompletionRequest(
            messages=(*first.messages, *turn), system=first.system, max_tokens=1024, tools=TOOLS
        )

    transport, [_, final] = await exchange(
        make_config, [first, next_request], answer("tool_use_with_thinking"), answer("final_answer")
    )

    second = transport.bodies()[1]
    assert second == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": content_of("tool_use_with_thinking")},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01CswdEQBMshySk6Y9DFKrfq",
                        "content": '<tool_result name="get_weather">14 °C, cloudy</tool_result>',
                    }
                ],
            },
        ],
        "system": "Use tools.",
        "tools": DECLARED,
    }
    assert_anthropic_accepts(second)
    assert final.text == "It is 14 °C and cloudy in Paris."
