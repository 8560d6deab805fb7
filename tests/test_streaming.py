"""Streamed answers over real loopback HTTP against the simulated panel, through the same client
real providers get: a streamed answer equals the plain one on every wire (text, tools, thinking,
structured output, length), deltas arrive in order, a cut stream is retried and never a half
answer, an in-stream error is the provider's error, a refusal falls back to plain calls for good,
and cancelling a call stops the stream upstream."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conclave.app.sim import Reply, Scenario, SimPanel
from conclave.app.sim.scenarios import NativeCall
from conclave.core.errors import ProviderError
from conclave.core.messages import Completion, CompletionRequest, Delta, ToolDeclaration
from conclave.schema.answer_schema import choices_schema
from conclave.schema.config import Config
from tests.support import open_pool, read_events

pytestmark = pytest.mark.anyio

KINDS = ["openai", "anthropic", "gemini"]
TOOL = ToolDeclaration(
    "verify", "Run a check", {"type": "object", "properties": {"expression": {"type": "string"}}}
)


async def ask(
    panel: SimPanel,
    make_config: Callable[..., Config],
    kind: str,
    request: CompletionRequest,
    *,
    stream: bool = True,
    heard: list[Delta] | None = None,
    deadline_in: float = 10.0,
    retry: dict[str, Any] | None = None,
) -> Completion:
    providers = {"p": {"kind": kind, "model": "m1", "base_url": panel.base_url(kind), "stream": stream}}
    async with open_pool(make_config(providers, retry=retry)) as pool:
        listener = heard.append if heard is not None else None
        return await pool.get("p").complete(
            request, deadline=anyio.current_time() + deadline_in, listener=listener
        )


def same(plain: Completion, streamed: Completion) -> None:
    """Everything but the timings."""
    for field in ("text", "finish_reason", "usage", "model", "request_id", "tool_uses", "echo", "attempts"):
        if field == "request_id":
            continue  # each response has its own id
        assert getattr(streamed, field) == getattr(plain, field), field


def sent_streamed(panel: SimPanel) -> list[bool]:
    """Whether each request the panel got asked for a stream."""
    out = []
    for request in panel.received:
        body = request.body if isinstance(request.body, dict) else {}
        out.append(bool(body.get("stream")) or "streamGenerateContent" in request.path)
    return out


REPLIES: dict[str, Reply] = {
    "text": Reply(text="The answer is 42, because six times seven is forty-two."),
    "empty": Reply(text=""),
    "length": Reply(text="A long answer cut short", finish_reason="length"),
    "tool": Reply(tool_calls=(NativeCall("verify", {"expression": "6*7"}),)),
    "parallel tools": Reply(
        text="Checking both.",
        tool_calls=(NativeCall("verify", {"expression": "6*7"}), NativeCall("verify", {"expression": "2+2"})),
    ),
    "thinking": Reply(text="Forty-two.", thinking="Six sevens are forty-two; check: 7*6=42."),
    "structured": Reply(value={"choice": "B", "reason": "it fits"}),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", list(REPLIES))
async def test_a_streamed_answer_equals_the_plain_one(
    panel: SimPanel, make_config: Callable[..., Config], kind: str, case: str
) -> None:
    panel.set_scenario("m1", Scenario(replies=(REPLIES[case],)))
    request = CompletionRequest.ask("Which option?")
    if "tool" in case:
        request = CompletionRequest.ask("Check it", tools=(TOOL,))
    if case == "structured":
        request = CompletionRequest.ask("Pick one", answer_schema=choices_schema(["A", "B"]))
    plain = await ask(panel, make_config, kind, request, stream=False)
    panel.reset()
    panel.set_scenario("m1", Scenario(replies=(REPLIES[case],)))
    heard: list[Delta] = []
    streamed = await ask(panel, make_config, kind, request, heard=heard)
    assert sent_streamed(panel) == [True]
    same(plain, streamed)
    assert "".join(d.text for d in heard if d.kind == "text") == streamed.text
    if case == "thinking" and kind != "openai":
        assert "".join(d.text for d in heard if d.kind == "thinking")
    if "tool" in case:
        calls = {d.index for d in heard if d.kind == "tool_call"}
        assert len(calls) == len(streamed.tool_uses)
    assert streamed.ttft_ms is not None and 0 <= streamed.ttft_ms <= streamed.latency_ms


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kind=st.sampled_from(KINDS),
    text=st.text(min_size=0, max_size=300),
    thinking=st.none() | st.text(min_size=1, max_size=100),
    calls=st.lists(
        st.dictionaries(st.sampled_from(["expression", "note"]), st.text(max_size=40)), max_size=3
    ),
)
async def test_streamed_equals_plain_for_any_text_thinking_and_calls(
    panel: SimPanel,
    make_config: Callable[..., Config],
    kind: str,
    text: str,
    thinking: str | None,
    calls: list[Any],
) -> None:
    reply = Reply(text=text, thinking=thinking, tool_calls=tuple(NativeCall("verify", c) for c in calls))
    request = CompletionRequest.ask("Go", tools=(TOOL,) if calls else ())
    answers = []
    for stream in (False, True):
        panel.reset()
        panel.set_scenario("m1", Scenario(replies=(reply,)))
        try:
            answers.append(await ask(panel, make_config, kind, request, stream=stream))
        except ProviderError as exc:  # an empty turn is an error either way, the same one
            answers.append(exc.code)  # type: ignore[arg-type]
    plain, streamed = answers
    if isinstance(plain, str) or isinstance(streamed, str):
        assert plain == streamed
    else:
        same(plain, streamed)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_stream_cut_midway_is_retried_never_a_half_answer(
    panel: SimPanel, make_config: Callable[..., Config], kind: str, events_path: Any
) -> None:
    whole = "A complete answer, which must never arrive in halves."
    panel.set_scenario("m1", Scenario(replies=(Reply(text=whole, fault="drop"), Reply(text=whole))))
    heard: list[Delta] = []
    completion = await ask(panel, make_config, kind, CompletionRequest.ask("Go"), heard=heard)
    assert completion.text == whole and completion.attempts == 2
    # A listener hears both attempts, each opened by a start: the text after the last is the answer.
    assert [d.kind for d in heard].count("start") == 2 and heard[0].kind == "start"
    last = max(i for i, d in enumerate(heard) if d.kind == "start")
    assert "".join(d.text for d in heard[last:] if d.kind == "text") == whole
    panel.reset()
    panel.set_scenario("m1", Scenario(replies=(Reply(text=whole, fault="drop"),)))
    with pytest.raises(ProviderError) as caught:
        await ask(panel, make_config, kind, CompletionRequest.ask("Go"))
    assert caught.value.code in ("stream_cut", "connection_dropped")
    assert any(e["event"] == "provider_retry" for e in read_events(events_path))


@pytest.mark.parametrize("kind", KINDS)
async def test_an_error_inside_the_stream_is_the_providers_error(
    panel: SimPanel, make_config: Callable[..., Config], kind: str
) -> None:
    panel.set_scenario("m1", Scenario(replies=(Reply(text="Half of this", fault="stream_error"),)))
    with pytest.raises(ProviderError) as caught:
        await ask(panel, make_config, kind, CompletionRequest.ask("Go"), retry={"max_attempts": 1})
    # each wire's own in-stream error: Anthropic's overload (529), Gemini's 503; OpenAI's names no
    # status, so it counts as a bad gateway (502), retryable as a server error
    expected = {
        "openai": (502, "server_error"),
        "anthropic": (529, "overloaded"),
        "gemini": (503, "unavailable"),
    }
    assert (caught.value.status, caught.value.code) == expected[kind]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_server_that_refuses_streams_is_called_plainly_from_then_on(
    panel: SimPanel, make_config: Callable[..., Config], kind: str, events_path: Any
) -> None:
    panel.set_scenario("m1", Scenario(rejects_stream=True))
    providers = {"p": {"kind": kind, "model": "m1", "base_url": panel.base_url(kind)}}
    async with open_pool(make_config(providers)) as pool:
        client = pool.get("p")
        first = await client.complete(CompletionRequest.ask("One"), deadline=anyio.current_time() + 10)
        second = await client.complete(CompletionRequest.ask("Two"), deadline=anyio.current_time() + 10)
    assert first.text and second.text and first.attempts == 1
    assert sent_streamed(panel) == [True, False, False]
    refused = [e for e in read_events(events_path) if e["event"] == "provider_stream_refused"]
    assert [e["provider"] for e in refused] == ["p"]


@pytest.mark.parametrize("kind", KINDS)
async def test_cancelling_a_streamed_call_stops_the_stream_upstream(
    make_config: Callable[..., Config], kind: str
) -> None:
    async with SimPanel(stream_tokens_per_s=20) as slow:
        slow.set_scenario("m1", Scenario(replies=(Reply(text="word " * 200),)))
        heard: list[Delta] = []
        with anyio.move_on_after(1.0):
            await ask(slow, make_config, kind, CompletionRequest.ask("Go"), heard=heard)
        assert heard, "the answer had begun to stream"
        with anyio.fail_after(5):
            while "m1" not in slow.aborted:
                await anyio.sleep(0.02)


@pytest.mark.parametrize("kind", KINDS)
async def test_plain_calls_when_the_entry_says_stream_false(
    panel: SimPanel, make_config: Callable[..., Config], kind: str
) -> None:
    heard: list[Delta] = []
    completion = await ask(panel, make_config, kind, CompletionRequest.ask("Go"), stream=False, heard=heard)
    assert sent_streamed(panel) == [False]
    assert completion.ttft_ms is not None and completion.ttft_ms <= completion.latency_ms
    assert heard == [], "a plain call has nothing to stream"
