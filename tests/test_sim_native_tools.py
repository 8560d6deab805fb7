"""The simulated panel as a native tool-calling model (docs/providers.md#native-tool-calling),
driven through the real adapters and ProviderClient over loopback HTTP: scripted calls come back
as `Completion.tool_uses`, the follow-up carrying the native history is accepted (or refused as
the service would refuse it), rules react to tool results, and a model without tool support
refuses declarations."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx
import pytest

from conclave.app.sim import NativeCall, Reply, Rule, Scenario, SimPanel
from conclave.core.errors import PermanentProviderError
from conclave.core.messages import Completion, CompletionRequest, Message, ToolDeclaration, ToolReturn
from conclave.schema.config import Config
from tests.support import open_pool

pytestmark = pytest.mark.anyio

KINDS = ["openai", "anthropic", "gemini"]
KEY = "sk-sim-key-0123456789abcdef"
FETCH = ToolDeclaration(
    "fetch_url", "Fetch a public web page.", {"type": "object", "properties": {"url": {"type": "string"}}}
)
QUESTION = Message("user", "What do the pages say?")
TWO_CALLS = Reply(
    text="Reading both.",
    thinking="Both pages matter; fetch them.",
    tool_calls=(
        NativeCall("fetch_url", {"url": "https://example.org/a"}),
        NativeCall("fetch_url", {"url": "https://example.org/b"}),
    ),
)
SCRIPT = Scenario(replies=(TWO_CALLS,), rules=(Rule("page a says 42", Reply(text="Page a says 42.")),))
FIRST_ID = {"openai": "call_", "anthropic": "toolu_", "gemini": "call-0"}


class Sim:
    def __init__(self, panel: SimPanel, make_config: Callable[..., Config]) -> None:
        self.panel = panel
        self.make_config = make_config

    async def ask(self, kind: str, request: CompletionRequest) -> Completion:
        entry = {"kind": kind, "model": "m1", "base_url": self.panel.base_url(kind), "api_key_env": "SIM_KEY"}
        config = self.make_config({"p": entry}, env={"SIM_KEY": KEY})
        async with open_pool(config) as pool:
            return await pool.get("p").complete(request, deadline=anyio.current_time() + 10)

    async def refused(self, kind: str, request: CompletionRequest) -> PermanentProviderError:
        with pytest.raises(PermanentProviderError) as info:
            await self.ask(kind, request)
        assert info.value.status == 400
        return info.value


@pytest.fixture
async def sim(make_config: Callable[..., Config]) -> AsyncIterator[Sim]:
    async with SimPanel() as panel:
        yield Sim(panel, make_config)


def ask_with_tools(*messages: Message, tool_choice: Any = "auto") -> CompletionRequest:
    return CompletionRequest(messages=(QUESTION, *messages), tools=(FETCH,), tool_choice=tool_choice)


def returns_for(c: Completion, *texts: str) -> Message:
    results = tuple(ToolReturn(use.id, use.name, text) for use, text in zip(c.tool_uses, texts, strict=False))
    return Message("user", "", tool_returns=results)


def called(c: Completion, echo: Any = None) -> Message:
    return Message("assistant", c.text, tool_uses=c.tool_uses, echo=c.echo if echo is None else echo)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_scripted_call_comes_back_and_a_rule_reacts_to_its_result(sim: Sim, kind: str) -> None:
    sim.panel.set_scenario("m1", SCRIPT)

    first = await sim.ask(kind, ask_with_tools())
    follow_up = ask_with_tools(
        called(first),
        returns_for(first, "<tool_result>page a says 42</tool_result>", "page b: nothing"),
        tool_choice="none",
    )
    final = await sim.ask(kind, follow_up)

    assert [u.name for u in first.tool_uses] == ["fetch_url", "fetch_url"]
    assert [u.arguments for u in first.tool_uses] == [
        {"url": "https://example.org/a"},
        {"url": "https://example.org/b"},
    ]
    assert first.tool_uses[0].id.startswith(FIRST_ID[kind])
    assert len({u.id for u in first.tool_uses}) == 2, "every call has its own id"
    assert first.text == "Reading both."
    assert first.finish_reason == ("stop" if kind == "gemini" else "tool_calls")
    assert first.echo is not None
    assert final.text == "Page a says 42."
    assert not final.tool_uses
    assert sim.panel.calls("m1") == 2


async def test_ids_are_deterministic_and_a_scripted_id_is_kept(sim: Sim) -> None:
    call = NativeCall("fetch_url", {"url": "https://example.org/a"}, id="fc-7")
    sim.panel.set_scenario("m1", Scenario(replies=(Reply(tool_calls=(call,)), TWO_CALLS)))

    scripted = await sim.ask("gemini", ask_with_tools())
    unscripted = await sim.ask("gemini", ask_with_tools())

    assert [u.id for u in scripted.tool_uses] == ["fc-7"]
    assert [u.id for u in unscripted.tool_uses] == ["call-0", "call-1"], "Gemini gives no id of its own"


async def test_responses_have_the_services_own_shapes(sim: Sim) -> None:
    sim.panel.set_scenario("m1", Scenario(replies=(TWO_CALLS,)))
    calls_only = Reply(tool_calls=(NativeCall("fetch_url", '{"url":"a"}'),))
    sim.panel.set_scenario("m2", Scenario(replies=(calls_only,)))
    async with httpx.AsyncClient(trust_env=False) as client:
        openai = (await post(client, sim.panel, "openai", "m2")).json()
        anthropic = (await post(client, sim.panel, "anthropic", "m1")).json()
        gemini = (await post(client, sim.panel, "gemini", "m1")).json()

    choice = openai["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None, "a calls-only turn has content null"
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "fetch_url", "arguments": '{"url":"a"}'}
    assert choice["message"]["tool_calls"][0]["type"] == "function"
    assert anthropic["stop_reason"] == "tool_use"
    assert [b["type"] for b in anthropic["content"]] == ["thinking", "text", "tool_use", "tool_use"]
    assert anthropic["content"][0]["signature"]
    assert anthropic["content"][2]["input"] == {"url": "https://example.org/a"}
    candidate = gemini["candidates"][0]
    parts = candidate["content"]["parts"]
    assert candidate["finishReason"] == "STOP"
    assert parts[0] == {"text": "Both pages matter; fetch them.", "thought": True}
    assert parts[1] == {"text": "Reading both."}
    assert "thoughtSignature" in parts[2] and "thoughtSignature" not in parts[3]
    assert parts[2]["functionCall"] == {"name": "fetch_url", "args": {"url": "https://example.org/a"}}


async def post(
    client: httpx.AsyncClient, panel: SimPanel, kind: str, model: str, **extra: Any
) -> httpx.Response:
    question = {"role": "user", "content": "Which?"}
    if kind == "openai":
        body: dict[str, Any] = {"model": model, "messages": [question], **extra}
        return await client.post(f"{panel.base_url(kind)}/chat/completions", json=body)
    if kind == "anthropic":
        body = {"model": model, "max_tokens": 100, "messages": [question], **extra}
        headers = {"anthropic-version": "2023-06-01"}
        return await client.post(f"{panel.base_url(kind)}/v1/messages", json=body, headers=headers)
    body = {"contents": [{"role": "user", "parts": [{"text": "Which?"}]}], **extra}
    return await client.post(f"{panel.base_url(kind)}/v1beta/models/{model}:generateContent", json=body)


@pytest.mark.parametrize(
    ("kind", "extra", "says"),
    [
        ("openai", {"tool_choice": "auto"}, "only allowed when 'tools' are specified"),
        ("openai", {"tools": []}, "Invalid 'tools': empty array"),
        ("openai", {"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
        ("anthropic", {"tools": [{"name": "f"}]}, "tools.0.custom.input_schema: Field required"),
        ("anthropic", {"tool_choice": {"type": "never"}}, "Input tag 'never'"),
        (
            "gemini",
            {"toolConfig": {"functionCallingConfig": {"mode": "NEVER"}}},
            "function_calling_config.mode",
        ),
        ("gemini", {"tools": [{"functionDeclarations": [{"description": "x"}]}]}, "Name cannot be empty"),
    ],
)
async def test_malformed_declarations_are_the_services_400(
    sim: Sim, kind: str, extra: dict[str, Any], says: str
) -> None:
    async with httpx.AsyncClient(trust_env=False) as client:
        response = await post(client, sim.panel, kind, "m1", **extra)

    assert response.status_code == 400
    assert says in response.text


UNANSWERED = {
    "openai": "did not have response messages",
    "anthropic": "`tool_use` ids were found without `tool_result` blocks",
    "gemini": "number of function response parts is equal to the number of function call parts",
}
STRAY = {
    "openai": "must be a response to a preceeding message with 'tool_calls'",
    "anthropic": "unexpected `tool_use_id` found in `tool_result` blocks",
    "gemini": "number of function response parts is equal to the number of function call parts",
}


@pytest.mark.parametrize("kind", KINDS)
async def test_a_call_left_unanswered_is_the_services_400(sim: Sim, kind: str) -> None:
    sim.panel.set_scenario("m1", SCRIPT)
    first = await sim.ask(kind, ask_with_tools())

    error = await sim.refused(kind, ask_with_tools(called(first), returns_for(first, "only the first")))

    assert UNANSWERED[kind] in error.message
    if kind != "gemini":
        assert first.tool_uses[1].id in error.message, "the unanswered id is named"
    assert sim.panel.calls("m1") == 1, "a refused request reaches no model"


@pytest.mark.parametrize("kind", KINDS)
async def test_a_result_that_answers_no_call_is_the_services_400(sim: Sim, kind: str) -> None:
    stray = Message("user", "", tool_returns=(ToolReturn("call_nope", "fetch_url", "text"),))
    history = (Message("assistant", "I will not call anything."), stray)

    error = await sim.refused(kind, ask_with_tools(*history))

    assert STRAY[kind] in error.message


async def test_anthropic_refuses_an_altered_thinking_block(sim: Sim) -> None:
    sim.panel.set_scenario("m1", SCRIPT)
    first = await sim.ask("anthropic", ask_with_tools())
    echo = copy.deepcopy(first.echo)
    echo[0]["thinking"] += " (edited)"
    unsigned = copy.deepcopy(first.echo)
    del unsigned[0]["signature"]
    results = returns_for(first, "page a says 42", "b")

    altered = await sim.refused("anthropic", ask_with_tools(called(first, echo), results))
    missing = await sim.refused("anthropic", ask_with_tools(called(first, unsigned), results))

    assert "messages.1.content.0: Invalid `signature` in `thinking` block" in altered.message
    assert "messages.1.content.0.thinking.signature: Field required" in missing.message


async def test_anthropic_refuses_a_tool_history_without_declared_tools(sim: Sim) -> None:
    sim.panel.set_scenario("m1", SCRIPT)
    first = await sim.ask("anthropic", ask_with_tools())
    history = (QUESTION, called(first), returns_for(first, "a", "b"))

    error = await sim.refused("anthropic", CompletionRequest(messages=history))

    assert "must define tools" in error.message


async def test_gemini_refuses_a_moved_or_missing_thought_signature(sim: Sim) -> None:
    sim.panel.set_scenario("m1", SCRIPT)
    first = await sim.ask("gemini", ask_with_tools())
    parts = first.echo["parts"]
    moved = copy.deepcopy(first.echo)
    moved["parts"][3]["thoughtSignature"] = moved["parts"][2].pop("thoughtSignature")
    dropped = copy.deepcopy(first.echo)
    del dropped["parts"][2]["thoughtSignature"]
    results = returns_for(first, "page a says 42", "b")

    moved_error = await sim.refused("gemini", ask_with_tools(called(first, moved), results))
    dropped_error = await sim.refused("gemini", ask_with_tools(called(first, dropped), results))

    assert "thoughtSignature" in parts[2]
    assert "Thought signature is not valid" in moved_error.message
    assert "missing a thought_signature" in dropped_error.message


async def test_openai_raw_arguments_reach_the_adapter_as_written(sim: Sim) -> None:
    duplicate = NativeCall("fetch_url", '{"url":"https://example.org/a","url":"https://evil.example/"}')
    sim.panel.set_scenario("m1", Scenario(replies=(Reply(tool_calls=(duplicate,)),)))

    c = await sim.ask("openai", ask_with_tools())

    assert c.tool_uses[0].arguments is None
    assert c.tool_uses[0].error and "duplicate" in c.tool_uses[0].error.lower()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_model_without_tool_support_refuses_declarations(sim: Sim, kind: str) -> None:
    sim.panel.set_scenario("m1", Scenario(replies=(Reply(text="plain answer"),), rejects_tools=True))

    error = await sim.refused(kind, ask_with_tools())
    plain = await sim.ask(kind, CompletionRequest(messages=(QUESTION,)))

    assert "does not support tools" in error.message
    assert plain.text == "plain answer"
    assert sim.panel.calls("m1") == 1, "the refusal consumed no step of the script"


def test_native_calls_survive_a_round_trip_through_a_dict() -> None:
    scenario = Scenario(
        replies=(TWO_CALLS, Reply(tool_calls=(NativeCall("f", '{"a":1,"a":2}', id="call_x"),))),
        rejects_tools=True,
    )

    assert Scenario.from_dict(json.loads(json.dumps(scenario.to_dict()))) == scenario


@pytest.mark.parametrize(
    "bad",
    [
        {"replies": [{"tool_calls": [{"arguments": {}}]}]},
        {"replies": [{"tool_calls": [{"name": "f", "arguments": [1]}]}]},
        {"replies": [{"tool_calls": [{"name": "f", "args": {}}]}]},
        {"replies": [{"tool_calls": [{"name": ""}]}]},
        {"replies": [{"tool_calls": {"name": "f"}}]},
        {"replies": [{"thinking": 3}]},
        {"rejects_tools": "yes"},
    ],
)
def test_scenario_from_dict_refuses_a_tool_call_it_cannot_mean(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"."):
        Scenario.from_dict(bad)
