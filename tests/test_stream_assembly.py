"""Streamed answers rebuilt into the plain body (docs/providers.md#reading-streams): each wire's
real event stream, read through `streaming.events()` from chunks cut at awkward places, gives the
body whose `parse()` is the plain twin's, with its deltas in order; a stream cut short is not
complete, and an error inside a stream fails it as the error response it stands for."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from conclave.core.errors import MalformedResponse, PermanentProviderError, TransientProviderError
from conclave.core.messages import CompletionRequest
from conclave.providers import ADAPTERS
from conclave.providers.base import ErrorDetails, ParsedCompletion, status_error
from conclave.providers.kinds import KINDS
from conclave.providers.streaming import Assembler, Delta, StreamFailed, events
from conclave.schema.config import Config, ProviderConfig
from tests.support import provider_entry

pytestmark = pytest.mark.anyio

SAMPLES: dict[str, Any] = {
    name: sample
    for name, sample in json.loads(
        (Path(__file__).parent / "fixtures" / "stream_samples.json").read_text(encoding="utf-8")
    ).items()
    if not name.startswith("_")
}
ANSWERS = sorted(name for name, sample in SAMPLES.items() if "plain" in sample)
FAILURES = sorted(name for name, sample in SAMPLES.items() if "fails" in sample)
# How the bytes arrive: one at a time (every multi-byte character and every CRLF split), in small
# odd pieces, in a cycle of sizes, and in network-sized segments.
SPLITS = {"bytes": [1], "threes": [3], "cycle": [1, 2, 3, 5, 8, 13, 21, 34], "segments": [1400]}


def wire(sample: dict[str, Any], events_: list[dict[str, Any]] | None = None) -> bytes:
    """The stream as its server writes it: each event's lines, then the blank line (CRLF for
    Gemini), the data as one line of JSON in the wire's own spacing."""
    separator = sample.get("separator", "\n\n")
    newline = separator[: len(separator) // 2]
    item, key = sample.get("json", [",", ":"])
    out: list[str] = []
    for event in sample["events"] if events_ is None else events_:
        lines = []
        if "comment" in event:
            lines.append(f": {event['comment']}")
        if "event" in event:
            lines.append(f"event: {event['event']}")
        if "data" in event:
            data = event["data"]
            text = (
                data
                if isinstance(data, str)
                else json.dumps(data, separators=(item, key), ensure_ascii=False)
            )
            lines.append(f"data: {text}")
        out.append(newline.join(lines) + separator)
    return "".join(out).encode("utf-8")


def pieces(payload: bytes, sizes: list[int]) -> list[bytes]:
    out, at, turn = [], 0, 0
    while at < len(payload):
        size = sizes[turn % len(sizes)]
        out.append(payload[at : at + size])
        at, turn = at + size, turn + 1
    return out


class FakeStreamed:
    """A `net.http.Streamed`: a status, headers, and the body in the pieces given."""

    def __init__(self, headers: dict[str, str], chunks: list[bytes], status: int = 200) -> None:
        self.status = status
        self.headers: Mapping[str, str] = httpx.Headers(headers)
        self._chunks = chunks

    async def chunks(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk


def entry_for(make_config: Callable[..., Config], sample: dict[str, Any]) -> ProviderConfig:
    config = make_config({"p": provider_entry(sample["kind"], sample["model"], sample["base_url"])})
    return config.providers["p"]


async def read(
    sample: dict[str, Any], entry: ProviderConfig, chunks: list[bytes], deltas: list[Delta] | None = None
) -> Assembler:
    """Feed the stream event by event, as the client does: every event, to the stream's end (what
    comes after the answer is complete must not change it)."""
    assembler = ADAPTERS[sample["kind"]].assembler(entry)
    seen = [] if deltas is None else deltas
    async for event in events(FakeStreamed(sample["headers"], chunks)):
        seen += assembler.feed(event.event, event.data)
    return assembler


def comparable(parsed: ParsedCompletion, kind: str) -> ParsedCompletion:
    """An OpenAI-wire echo without its calls' `index`. A stream numbers every call, and cannot
    tell whether the server's plain body would have too (DeepSeek, Mistral and OpenRouter number
    them there, OpenAI does not): the rebuilt body writes its calls as OpenAI does, the shape a
    request carries them back in."""
    if kind != "openai" or not isinstance(parsed.echo, dict) or "tool_calls" not in parsed.echo:
        return parsed
    calls = [{k: v for k, v in call.items() if k != "index"} for call in parsed.echo["tool_calls"]]
    return dataclasses.replace(parsed, echo={**parsed.echo, "tool_calls": calls})


def delta_of(row: list[Any]) -> Delta:
    kind, text, *rest = row
    return Delta(kind, text, *rest)


@pytest.mark.parametrize("split", sorted(SPLITS))
@pytest.mark.parametrize("name", ANSWERS)
async def test_a_streamed_answer_parses_as_its_plain_twin(
    make_config: Callable[..., Config], name: str, split: str
) -> None:
    sample = SAMPLES[name]
    entry = entry_for(make_config, sample)
    adapter = ADAPTERS[sample["kind"]]
    deltas: list[Delta] = []
    assembler = await read(sample, entry, pieces(wire(sample), SPLITS[split]), deltas)
    assert assembler.complete

    streamed = adapter.parse(assembler.body(), httpx.Headers(sample["headers"]), entry)
    plain = sample["plain"]
    expected = adapter.parse(copy.deepcopy(plain["body"]), httpx.Headers(plain["headers"]), entry)
    assert comparable(streamed, sample["kind"]) == comparable(expected, sample["kind"])

    expect = sample["expect"]
    usage = streamed.usage
    assert (streamed.text, streamed.finish_reason) == (expect["text"], expect["finish_reason"])
    assert [
        usage.input_tokens,
        usage.output_tokens,
        usage.cached_input_tokens,
        usage.cache_write_tokens,
        usage.reasoning_tokens,
    ] == expect["usage"]
    if "request_id" in expect:
        assert streamed.request_id == expect["request_id"]
    if "model" in expect:
        assert streamed.model == expect["model"]
    assert [[u.id, u.name, u.arguments] for u in streamed.tool_uses] == expect.get("tool_uses", [])
    assert deltas == [delta_of(row) for row in expect["deltas"]]


@pytest.mark.parametrize("name", ANSWERS)
async def test_the_deltas_add_up_to_the_answer(make_config: Callable[..., Config], name: str) -> None:
    """Whatever the wire: the text deltas are the text, each call's fragments its arguments, and
    a call's first delta names it."""
    sample = SAMPLES[name]
    entry = entry_for(make_config, sample)
    deltas: list[Delta] = []
    assembler = await read(sample, entry, [wire(sample)], deltas)
    parsed = ADAPTERS[sample["kind"]].parse(assembler.body(), httpx.Headers(sample["headers"]), entry)

    assert "".join(d.text for d in deltas if d.kind == "text") == parsed.text
    calls: dict[int, list[Delta]] = {}
    for d in deltas:
        if d.kind == "tool_call":
            calls.setdefault(d.index, []).append(d)
    assert len(calls) == len(parsed.tool_uses)
    for (_, fragments), use in zip(sorted(calls.items()), parsed.tool_uses, strict=True):
        assert fragments[0].name == use.name
        assert all(f.name is None for f in fragments[1:])
        text = "".join(f.text for f in fragments)
        assert (json.loads(text) if text else {}) == use.arguments


@pytest.mark.parametrize("name", ANSWERS)
async def test_the_rebuilt_body_is_the_plain_body_where_it_is_read(
    make_config: Callable[..., Config], name: str
) -> None:
    """More than `parse()` looks at on a turn without calls: what a plain body would repeat on the
    next request (the message, the content blocks, the parts) is rebuilt too."""
    sample = SAMPLES[name]
    assembler = await read(sample, entry_for(make_config, sample), [wire(sample)])
    body, plain = assembler.body(), sample["plain"]["body"]
    if sample["kind"] == "openai":
        message, twin = body["choices"][0]["message"], plain["choices"][0]["message"]
        for field in ("role", "content", "refusal", "reasoning_content", "reasoning", "reasoning_details"):
            assert message.get(field) == twin.get(field), field
        assert ("content" in message) == ("content" in twin)
        no_index = [{k: v for k, v in c.items() if k != "index"} for c in twin.get("tool_calls") or []]
        assert message.get("tool_calls", []) == no_index
        assert body["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]
        assert (body.get("usage"), body.get("id"), body.get("model")) == (
            plain.get("usage"),
            plain.get("id"),
            plain.get("model"),
        )
    elif sample["kind"] == "anthropic":
        assert body == plain
    else:
        assert body == plain


@pytest.mark.parametrize("name", ANSWERS)
async def test_a_stream_cut_before_its_end_is_not_complete(
    make_config: Callable[..., Config], name: str
) -> None:
    sample = SAMPLES[name]
    entry = entry_for(make_config, sample)
    whole = wire(sample)
    without_last = wire(sample, sample["events"][:-1])
    # The last event without the blank line that ends it (a lone CR of CRLF CRLF would end it).
    unterminated = whole[: -len(sample.get("separator", "\n\n"))]
    for cut in (without_last, whole[: len(whole) // 2], unterminated):
        assembler = await read(sample, entry, pieces(cut, [7]))
        assert not assembler.complete
        assert isinstance(assembler.body(), dict)


@pytest.mark.parametrize("split", sorted(SPLITS))
@pytest.mark.parametrize("name", FAILURES)
async def test_an_error_inside_the_stream_fails_it_as_that_error_response(
    make_config: Callable[..., Config], name: str, split: str
) -> None:
    sample = SAMPLES[name]
    entry = entry_for(make_config, sample)
    adapter = ADAPTERS[sample["kind"]]
    deltas: list[Delta] = []
    with pytest.raises(StreamFailed) as info:
        await read(sample, entry, pieces(wire(sample), SPLITS[split]), deltas)
    fails = sample["fails"]
    assert info.value.status == fails["status"]
    assert any(d.kind == "text" for d in deltas)  # what came before the error was heard

    headers = httpx.Headers(sample["headers"])
    details = adapter.error_details(info.value.body, headers)
    assert details.message == fails["message"]
    if "code" in fails:
        assert details.code == fails["code"]
    error = status_error(info.value.status, details, headers)
    assert (error.status, error.code, error.message) == (fails["status"], fails["error"], fails["message"])
    assert isinstance(error, TransientProviderError if fails["status"] >= 500 else PermanentProviderError)


async def test_sse_comments_never_reach_the_assembler() -> None:
    sample = SAMPLES["openrouter_reasoning_tool_call"]
    payload = wire(sample)
    assert b": OPENROUTER PROCESSING\n\n" in payload
    seen = [event async for event in events(FakeStreamed(sample["headers"], pieces(payload, [5])))]
    assert len(seen) == sum(1 for e in sample["events"] if "data" in e)
    assert not any("OPENROUTER" in event.data for event in seen)


async def test_the_body_can_be_taken_twice_and_shares_nothing(make_config: Callable[..., Config]) -> None:
    for name in ("openai_parallel_tool_calls", "anthropic_thinking_tool_use", "gemini3_parallel_calls"):
        sample = SAMPLES[name]
        assembler = await read(sample, entry_for(make_config, sample), [wire(sample)])
        first = assembler.body()
        snapshot = copy.deepcopy(first)
        for value in (first.get("choices"), first.get("content"), first.get("candidates")):
            if isinstance(value, list):
                value.clear()
        assert assembler.body() == snapshot, name


# ---------------------------------------------------------------- details the samples do not show


def anthropic_events(*payloads: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["type"], orjson.dumps(p).decode()) for p in payloads]


def test_anthropic_usage_repeated_in_message_delta_takes_the_last_value_and_skips_nulls() -> None:
    assembler = ADAPTERS["anthropic"].assembler(None)  # type: ignore[arg-type]
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [],
    }
    usage = {"input_tokens": 10, "cache_read_input_tokens": 0, "output_tokens": 1}
    for event, data in anthropic_events(
        {"type": "message_start", "message": {**message, "usage": usage}},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {
                "output_tokens": 7,
                "input_tokens": 2048,
                "cache_read_input_tokens": None,
                "server_tool_use": None,
            },
        },
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 9},
        },
        {"type": "message_stop"},
    ):
        assert assembler.feed(event, data) == []
    body = assembler.body()
    assert body["usage"] == {"input_tokens": 2048, "cache_read_input_tokens": 0, "output_tokens": 9}
    assert body["content"] == [] and body["stop_reason"] == "end_turn" and assembler.complete


def test_anthropic_tool_input_that_is_not_json_is_left_for_the_strict_check_to_refuse(
    make_config: Callable[..., Config],
) -> None:
    entry = make_config({"p": provider_entry("anthropic", "claude-sonnet-4-5", "https://api.anthropic.com")})
    adapter = ADAPTERS["anthropic"]
    assembler = adapter.assembler(entry.providers["p"])
    block = {"type": "tool_use", "id": "toolu_1", "name": "fetch", "input": {}}
    for event, data in anthropic_events(
        {"type": "content_block_start", "index": 0, "content_block": block},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": '{"url": '},
        },
        {"type": "content_block_stop", "index": 0},
    ):
        assembler.feed(event, data)
    (use,) = adapter.parse(assembler.body(), httpx.Headers(), entry.providers["p"]).tool_uses
    assert use.arguments is None and use.error and "invalid" in use.error


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_an_event_that_is_not_a_json_object_is_a_malformed_answer(kind: str) -> None:
    """As a plain body that is not a JSON object is: not retried, and no text of it in the error."""
    assembler = ADAPTERS[kind].assembler(None)  # type: ignore[arg-type]
    for data in ('{"choices": [{"delta": {"content": "sk-secret', "[1, 2]"):
        with pytest.raises(MalformedResponse) as info:
            assembler.feed("message_start" if kind == "anthropic" else "message", data)
        assert info.value.status == 200 and "not a JSON object" in info.value.message
        assert "secret" not in info.value.message


@pytest.mark.parametrize("name", ["openai_text_cached", "anthropic_text_cached"])
async def test_a_complete_stream_without_the_answer_field_rebuilds_a_body_without_it(
    make_config: Callable[..., Config], name: str
) -> None:
    """As a plain body without `choices` or `content` is malformed, so is the body of a stream
    that never carried them."""
    sample = SAMPLES[name]
    entry = entry_for(make_config, sample)
    field = KINDS[sample["kind"]].answer_field
    answerless = copy.deepcopy(sample["events"])
    for event in answerless:
        data = event.get("data")
        if isinstance(data, dict):
            data.pop(field, None)
            data.get("message", {}).pop(field, None)
    answerless = [
        e for e in answerless if e.get("event") not in ("content_block_start", "content_block_delta")
    ]
    assembler = await read(sample, entry, [wire(sample, answerless)])
    assert assembler.complete
    body = assembler.body()
    assert field not in body
    with pytest.raises(KeyError):
        ADAPTERS[sample["kind"]].parse(body, httpx.Headers(), entry)


def test_an_openai_stream_numbering_parallel_calls_alike_keeps_them_apart() -> None:
    """Some servers number every call 0; a new id is a new call."""
    assembler = ADAPTERS["openai"].assembler(None)  # type: ignore[arg-type]
    for call_id, url in (("call_a", "https://a.example"), ("call_b", "https://b.example")):
        call = {
            "index": 0,
            "id": call_id,
            "type": "function",
            "function": {"name": "fetch", "arguments": json.dumps({"url": url})},
        }
        chunk = {"id": "x", "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]}
        assembler.feed("message", json.dumps(chunk))
    calls = assembler.body()["choices"][0]["message"]["tool_calls"]
    assert [c["id"] for c in calls] == ["call_a", "call_b"]


def test_groq_error_event_fails_the_stream_with_its_status_code() -> None:
    assembler = ADAPTERS["openai"].assembler(None)  # type: ignore[arg-type]
    error = {
        "error": {
            "message": "Failed to call a function.",
            "type": "invalid_request_error",
            "code": "tool_use_failed",
            "status_code": 400,
        }
    }
    with pytest.raises(StreamFailed) as info:
        assembler.feed("error", json.dumps(error))
    assert (info.value.status, info.value.body) == (400, error)


# ---------------------------------------------------------------- the streamed request


@pytest.mark.parametrize(
    ("kind", "base_url", "url"),
    [
        ("openai", "https://api.openai.com/v1", "https://api.openai.com/v1/chat/completions"),
        ("anthropic", "https://api.anthropic.com", "https://api.anthropic.com/v1/messages"),
        (
            "gemini",
            "https://generativelanguage.googleapis.com",
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        ),
    ],
)
def test_a_streamed_request_asks_for_events_with_the_plain_requests_headers_and_body(
    make_config: Callable[..., Config], kind: str, base_url: str, url: str
) -> None:
    entry = make_config({"p": provider_entry(kind, "gemini-2.5-flash", base_url)}).providers["p"]
    adapter = ADAPTERS[kind]
    plain, streamed = adapter.endpoint(entry, "k-123"), adapter.stream_endpoint(entry, "k-123")
    assert streamed.url == url
    assert dict(streamed.headers) == {**plain.headers, "accept": "text/event-stream"}
    request = CompletionRequest.ask("Which queue?")
    every: dict[str, dict[str, Any]] = {
        "openai": {"stream": True, "stream_options": {"include_usage": True}},
        "anthropic": {"stream": True},
        "gemini": {},
    }
    flags = every[kind]
    assert adapter.stream_body(request, entry) == {**adapter.body(request, entry), **flags}
    assert KINDS[kind].streaming


def test_an_accept_header_the_entry_sets_is_kept(make_config: Callable[..., Config]) -> None:
    entry = make_config(
        {
            "p": provider_entry(
                "openai", "m", "http://127.0.0.1:9/v1", headers={"Accept": "application/x-ndjson"}
            )
        }
    ).providers["p"]
    headers = ADAPTERS["openai"].stream_endpoint(entry, None).headers
    assert headers["Accept"] == "application/x-ndjson" and "accept" not in headers


@pytest.mark.parametrize(
    ("kind", "status", "message", "refused"),
    [
        ("openai", 400, "Unsupported value: 'stream' does not support true with this model.", True),
        ("openai", 400, "Your organization must be verified to stream this model.", True),
        ("openai", 422, "stream_options: Extra inputs are not permitted", True),
        ("anthropic", 400, "Streaming is not supported for this model", True),
        ("openai", 400, "Invalid schema for response_format 'answer'", False),
        ("openai", 502, "upstream stream broke", False),  # a server error, retried as one
        ("openai", 429, "Rate limit reached while streaming", False),  # waiting cures a 429
        ("openai", 400, "upstream error from the provider", False),  # "upstream" is not streaming
        ("anthropic", 404, "model: claude-x not found", False),
        ("gemini", 404, "", True),  # no streamGenerateContent at that path
        ("gemini", 400, "API key not valid. Please pass a valid API key.", False),
    ],
)
def test_an_error_answer_to_a_stream_says_whether_the_server_cannot_stream(
    kind: str, status: int, message: str, refused: bool
) -> None:
    assert ADAPTERS[kind].refuses_stream(status, ErrorDetails(message=message)) is refused
