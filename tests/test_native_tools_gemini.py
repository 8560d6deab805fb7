"""Native tool calls on the Gemini wire (docs/providers.md#native-tool-calling), through
ProviderClient.complete() over the in-memory transport: the declarations and the final round's mode NONE
as sent, functionCall parts read into ToolUses (parallel, with and without Gemini's ids,
arguments under the strict rules), the model turn repeated unchanged with its thoughtSignature,
and the functionResponse turn."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

from conclave.core.messages import (
    Completer,
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

KEY = "gm-test-0123456789abcdefghij"
FIXTURES: dict[str, Any] = json.loads(
    (Path(__file__).parent / "fixtures" / "native_tools_gemini.json").read_text(encoding="utf-8")
)
FETCH_SCHEMA = {
    "type": "object",
    "properties": {"url": {"type": "string", "format": "uri"}, "max_bytes": {"type": "integer"}},
    "required": ["url"],
    "additionalProperties": False,
}
TOOLS = (
    ToolDeclaration("fetch_url", "Fetch a public web page as text.", FETCH_SCHEMA),
    ToolDeclaration("list_sources", "List the sources fetched so far.", {"type": "object", "properties": {}}),
)
QUESTION = Message("user", "Do pages a and b agree?")


def reply(name: str) -> Callable[[httpx.Request], httpx.Response]:
    sample = FIXTURES[name]
    return lambda _request: httpx.Response(sample["status"], headers=sample["headers"], json=sample["body"])


def model_content(name: str) -> dict[str, Any]:
    content: dict[str, Any] = FIXTURES[name]["body"]["candidates"][0]["content"]
    return content


class Gemini:
    """A provider client and what it was sent."""

    def __init__(self, client: Completer, transport: ScriptedTransport) -> None:
        self.client = client
        self.transport = transport

    async def ask(self, request: CompletionRequest) -> Completion:
        return await self.client.complete(request, deadline=anyio.current_time() + 5)

    def sent(self) -> list[Any]:
        return self.transport.bodies()


@contextlib.asynccontextmanager
async def gemini(make_config: Callable[..., Config], *replies: str) -> AsyncIterator[Gemini]:
    """One Gemini provider, over the in-memory transport answering `replies` in turn."""
    entry = provider_entry("gemini", "gemini-3-pro-preview", "https://generativelanguage.googleapis.com")
    config = make_config({"p": {**entry, "api_key_env": "TEST_KEY"}}, env={"TEST_KEY": KEY})
    transport = ScriptedTransport(*(reply(name) for name in replies))
    async with open_pool(config, transport) as pool:
        yield Gemini(pool.get("p"), transport)


async def read(make_config: Callable[..., Config], name: str) -> Completion:
    """The completion read from the fixture `name`, answering a question with TOOLS declared."""
    async with gemini(make_config, name) as g:
        return await g.ask(CompletionRequest((QUESTION,), tools=TOOLS))


async def send(make_config: Callable[..., Config], request: CompletionRequest) -> Any:
    """The body `request` goes out as."""
    async with gemini(make_config, "gemini_final_answer") as g:
        await g.ask(request)
    return g.sent()[0]


async def test_declared_tools_are_sent_as_function_declarations_with_their_json_schema(
    make_config: Callable[..., Config],
) -> None:
    body = await send(make_config, CompletionRequest((QUESTION,), tools=TOOLS))

    assert body["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "fetch_url",
                    "description": "Fetch a public web page as text.",
                    "parametersJsonSchema": FETCH_SCHEMA,
                },
                {
                    "name": "list_sources",
                    "description": "List the sources fetched so far.",
                    "parametersJsonSchema": {"type": "object", "properties": {}},
                },
            ]
        }
    ]
    assert "toolConfig" not in body  # AUTO is Gemini's default


async def test_a_final_round_keeps_the_declarations_and_forbids_calls_with_mode_none(
    make_config: Callable[..., Config],
) -> None:
    body = await send(make_config, CompletionRequest((QUESTION,), tools=TOOLS, tool_choice="none"))

    assert [d["name"] for d in body["tools"][0]["functionDeclarations"]] == ["fetch_url", "list_sources"]
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": "NONE"}}


async def test_without_tools_the_body_is_exactly_what_it_was_before_native_tools(
    make_config: Callable[..., Config],
) -> None:
    request = CompletionRequest(
        (Message("user", "What is 2+2?"), Message("assistant", "4"), Message("user", "Sure?")),
        system="Be brief.",
        max_tokens=77,
        temperature=0.3,
        tool_choice="none",  # without declarations there is nothing to forbid
    )
    async with gemini(make_config, "gemini_final_answer") as g:
        await g.ask(request)

    assert g.transport.requests[0].content == orjson.dumps(
        {
            "contents": [
                {"role": "user", "parts": [{"text": "What is 2+2?"}]},
                {"role": "model", "parts": [{"text": "4"}]},
                {"role": "user", "parts": [{"text": "Sure?"}]},
            ],
            "generationConfig": {"maxOutputTokens": 77, "temperature": 0.3},
            "systemInstruction": {"parts": [{"text": "Be brief."}]},
        }
    )


async def test_parallel_calls_are_read_in_order_with_stable_ids_where_gemini_gives_none(
    make_config: Callable[..., Config],
) -> None:
    completion = await read(make_config, "gemini_parallel_calls")

    assert completion.tool_uses == (
        ToolUse("call-0", "fetch_url", {"url": "https://example.org/a", "max_bytes": 4096}),
        ToolUse("call-1", "fetch_url", {"url": "https://example.org/b"}),
        ToolUse("call-2", "list_sources", {}),  # Gemini leaves `args` out of a call without any
    )
    assert completion.text == ""
    assert completion.finish_reason == "stop"  # Gemini ends a call turn with STOP, read as today
    # The turn to repeat: every part as it came, the one signature on the first call included.
    assert completion.echo == model_content("gemini_parallel_calls")
    assert completion.echo["parts"][0]["thoughtSignature"].startswith("CtwBAdHtim9")
    assert completion.usage.reasoning_tokens == 138


async def test_a_call_id_gemini_gives_is_kept_and_thoughts_stay_out_of_the_text(
    make_config: Callable[..., Config],
) -> None:
    completion = await read(make_config, "gemini_call_with_thought_and_text")

    assert completion.tool_uses == (
        ToolUse("fc-3k9x2p7q", "fetch_url", {"url": "https://arxiv.org/abs/1706.03762"}),
    )
    assert completion.text == "Let me read the paper first."
    assert completion.echo == model_content("gemini_call_with_thought_and_text")
    assert completion.echo["parts"][0]["thought"] is True  # thought parts are repeated too


async def test_arguments_past_the_strict_limits_become_a_tool_use_error_not_an_exception(
    make_config: Callable[..., Config],
) -> None:
    bad, good = (await read(make_config, "gemini_call_with_bad_arguments")).tool_uses

    assert (bad.id, bad.name, bad.arguments) == ("call-0", "fetch_url", None)
    assert bad.error is not None and "nested deeper than" in bad.error
    assert good == ToolUse("call-1", "fetch_url", {"url": "https://example.org/ok"})


async def test_an_answer_without_calls_has_no_tool_uses_and_nothing_to_echo(
    make_config: Callable[..., Config],
) -> None:
    completion = await read(make_config, "gemini_final_answer")

    assert completion.tool_uses == ()
    assert completion.echo is None
    assert completion.text == "Both pages agree: the claim holds."


async def test_the_echo_is_plain_json_of_its_own_apart_from_the_calls_read(
    make_config: Callable[..., Config],
) -> None:
    completion = await read(make_config, "gemini_parallel_calls")

    assert orjson.loads(orjson.dumps(completion.echo)) == completion.echo
    completion.echo["parts"][0]["functionCall"]["args"]["url"] = "https://elsewhere.example"
    assert completion.tool_uses[0].arguments == {"url": "https://example.org/a", "max_bytes": 4096}


async def test_the_next_request_repeats_the_call_turn_unchanged_and_answers_every_call_in_order(
    make_config: Callable[..., Config],
) -> None:
    """The round trip: read the calls, then send the turn back with one functionResponse per
    call; with no ids from Gemini, none are sent and name and order pair them."""
    returns = (
        ToolReturn("call-0", "fetch_url", '<tool_result name="fetch_url">page a</tool_result>'),
        ToolReturn("call-1", "fetch_url", '<tool_result name="fetch_url">page b</tool_result>'),
        ToolReturn("call-2", "list_sources", "<tool_result>hop_budget_exhausted</tool_result>", True),
    )
    async with gemini(make_config, "gemini_parallel_calls", "gemini_final_answer") as g:
        calls = await g.ask(CompletionRequest((QUESTION,), system="Check sources.", tools=TOOLS))
        history = (
            QUESTION,
            Message("assistant", calls.text, tool_uses=calls.tool_uses, echo=calls.echo),
            Message("user", "", tool_returns=returns),
        )
        answer = await g.ask(
            CompletionRequest(history, system="Check sources.", tools=TOOLS, tool_choice="none")
        )

    first, second = g.sent()
    assert second["contents"] == [
        {"role": "user", "parts": [{"text": "Do pages a and b agree?"}]},
        model_content("gemini_parallel_calls"),
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "fetch_url", "response": {"output": returns[0].content}}},
                {"functionResponse": {"name": "fetch_url", "response": {"output": returns[1].content}}},
                {"functionResponse": {"name": "list_sources", "response": {"error": returns[2].content}}},
            ],
        },
    ]
    assert second["systemInstruction"] == {"parts": [{"text": "Check sources."}]}
    assert second["tools"] == first["tools"]
    assert second["toolConfig"] == {"functionCallingConfig": {"mode": "NONE"}}
    assert answer.text == "Both pages agree: the claim holds."


async def test_a_call_gemini_gave_an_id_is_answered_under_that_id_before_the_user_text(
    make_config: Callable[..., Config],
) -> None:
    calls = await read(make_config, "gemini_call_with_thought_and_text")
    (use,) = calls.tool_uses
    history = (
        QUESTION,
        Message("assistant", calls.text, tool_uses=calls.tool_uses, echo=calls.echo),
        Message("user", "Answer in one line.", tool_returns=(ToolReturn(use.id, use.name, "abstract"),)),
    )
    body = await send(make_config, CompletionRequest(history, tools=TOOLS))

    model_turn, results = body["contents"][1:]
    assert model_turn == model_content("gemini_call_with_thought_and_text")
    assert results == {
        "role": "user",
        "parts": [
            {
                "functionResponse": {
                    "name": "fetch_url",
                    "id": "fc-3k9x2p7q",
                    "response": {"output": "abstract"},
                }
            },
            {"text": "Answer in one line."},
        ],
    }


async def test_calls_without_an_echo_are_rebuilt_from_their_values(
    make_config: Callable[..., Config],
) -> None:
    """A call turn that did not come from a Gemini response (a scripted or foreign history) is
    built from its ToolUses: its text first, then one functionCall each; made-up ids stay off."""
    uses = (
        ToolUse("fc-given-1", "fetch_url", {"url": "https://example.org/a"}),
        ToolUse("call-1", "fetch_url", None, "invalid tool call arguments"),
    )
    history = (QUESTION, Message("assistant", "Checking both.", tool_uses=uses))
    body = await send(make_config, CompletionRequest(history, tools=TOOLS))

    assert body["contents"][1] == {
        "role": "model",
        "parts": [
            {"text": "Checking both."},
            {
                "functionCall": {
                    "name": "fetch_url",
                    "args": {"url": "https://example.org/a"},
                    "id": "fc-given-1",
                }
            },
            {"functionCall": {"name": "fetch_url", "args": {}}},
        ],
    }
