"""The simulated panel's streams. Each wire's frames, put back together the way the providers'
SDKs put them together (the small reference assemblers below, which live here and not in
`conclave/`), give exactly the body the plain call renders; over loopback HTTP: routing, the
stream's headers, pacing, a caller hanging up, and the faults."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import anyio
import httpx
import pytest
from httpx_sse import EventSource

from conclave.app.sim import NativeCall, Reply, Scenario, SimPanel
from conclave.app.sim.kinds import WIRES
from conclave.app.sim.kinds.base import TOKEN_CHARS, Answer, StreamAsk

pytestmark = pytest.mark.anyio

Kind = Literal["openai", "anthropic", "gemini"]
KINDS: tuple[Kind, ...] = ("openai", "anthropic", "gemini")
ANTHROPIC_HEADERS = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01"}
Event = tuple[str | None, str]  # a server-sent event: its name (None: unnamed) and its data


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10.0, verify=False, trust_env=False) as c:
        yield c


# ------------------------------------------------------------------------- reading frames


def separator(kind: Kind) -> bytes:
    return b"\r\n\r\n" if kind == "gemini" else b"\n\n"


def parse_frame(frame: bytes, kind: Kind) -> Event:
    """One frame, strictly: an optional `event:` line, one `data:` line, the wire's blank line."""
    end = separator(kind)
    assert frame.endswith(end), frame
    lines = frame[: -len(end)].decode("utf-8").split(end[: len(end) // 2].decode())
    name = None
    if lines[0].startswith("event: "):
        name = lines.pop(0).removeprefix("event: ")
    assert len(lines) == 1 and lines[0].startswith("data: "), frame
    return name, lines[0].removeprefix("data: ")


def split_body(body: bytes, kind: Kind) -> list[bytes]:
    """A streamed body back into its frames (no JSON holds a raw blank line)."""
    end = separator(kind)
    assert body.endswith(end), body[-80:]
    return [piece + end for piece in body[: -len(end)].split(end)]


def events_of(frames: list[bytes], kind: Kind) -> list[Event]:
    return [parse_frame(frame, kind) for frame in frames]


# ------------------------------------------------------------------------- reference assemblers


def assemble_openai(events: list[Event]) -> dict[str, Any]:
    """As openai-python's ChatCompletionStreamState: the first chunk opens the completion, each
    delta's strings are appended, tool calls merged by `index` (`id`, `type`, `name` from their
    first delta, `arguments` concatenated), the finish reason and the usage chunk kept; a chunk
    holding `error` raises; the stream must end with `[DONE]`. What a stream never carries is
    filled in as a plain body has it: `object` and the message's empty `annotations`."""
    body: dict[str, Any] | None = None
    messages: dict[int, dict[str, Any]] = {}
    choices: dict[int, dict[str, Any]] = {}
    calls: dict[int, dict[int, dict[str, Any]]] = {}
    done = False
    for name, data in events:
        assert name is None and not done
        if data == "[DONE]":
            done = True
            continue
        chunk = json.loads(data)
        assert chunk.get("error") is None, chunk
        assert chunk["object"] == "chat.completion.chunk"
        if body is None:
            keep = ("id", "created", "model", "service_tier", "system_fingerprint")
            body = {"object": "chat.completion", **{k: chunk[k] for k in keep}}
        assert all(chunk[k] == body[k] for k in ("id", "created", "model"))
        for choice in chunk["choices"]:
            index = choice["index"]
            message = messages.setdefault(index, {})
            for key, value in choice["delta"].items():
                if key == "tool_calls":
                    for part in value:
                        call = calls.setdefault(index, {}).get(part["index"])
                        if call is None:
                            call = {
                                "id": part["id"],
                                "type": part["type"],
                                "function": dict(part["function"]),
                            }
                            calls[index][part["index"]] = call
                        else:
                            assert "id" not in part and "name" not in part["function"]
                            call["function"]["arguments"] += part["function"]["arguments"]
                elif isinstance(value, str) and isinstance(message.get(key), str):
                    message[key] += value
                else:
                    message[key] = value
            choices[index] = {"index": index, "finish_reason": choice["finish_reason"], "logprobs": None}
        if chunk.get("usage") is not None:
            body["usage"] = chunk["usage"]
    assert done and body is not None
    for index, message in messages.items():
        message["annotations"] = []
        if index in calls:
            message["tool_calls"] = [calls[index][i] for i in sorted(calls[index])]
        choices[index]["message"] = message
    body["choices"] = [choices[i] for i in sorted(choices)]
    return body


class InStreamError(Exception):
    def __init__(self, payload: Any) -> None:
        super().__init__(payload)
        self.payload = payload


def assemble_anthropic(events: list[Event]) -> dict[str, Any]:
    """As anthropic-sdk-python's accumulate_event: `message_start` is the snapshot, each block is
    appended at its index and grown by its deltas (text and thinking appended, the signature
    set, `partial_json` gathered and parsed), `message_delta` sets the stop reason and the
    usage it carries; `ping` is skipped, `error` raises; the stream must end with
    `message_stop`."""
    message: dict[str, Any] | None = None
    buffers: dict[int, str] = {}
    stopped = False
    for name, data in events:
        assert not stopped
        payload = json.loads(data)
        assert payload["type"] == name, (name, payload)
        if name == "ping":
            continue
        if name == "error":
            raise InStreamError(payload)
        if name == "message_start":
            assert message is None
            message = copy.deepcopy(payload["message"])
            continue
        assert message is not None
        content = message.get("content", [])  # the missing_fields fault leaves it out
        if name == "content_block_start":
            assert payload["index"] == len(content)
            content.append(copy.deepcopy(payload["content_block"]))
        elif name == "content_block_delta":
            block, delta = content[payload["index"]], payload["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            else:
                assert delta["type"] == "input_json_delta"
                buffers[payload["index"]] = buffers.get(payload["index"], "") + delta["partial_json"]
        elif name == "content_block_stop":
            assert payload["index"] == len(content) - 1
            if buffers.get(payload["index"]):  # the SDK parses as it goes; the end is the same
                content[-1]["input"] = json.loads(buffers[payload["index"]])
        elif name == "message_delta":
            message["stop_reason"] = payload["delta"]["stop_reason"]
            message["stop_sequence"] = payload["delta"]["stop_sequence"]
            message["usage"].update(payload["usage"])
        else:
            assert name == "message_stop"
            stopped = True
    assert stopped and message is not None
    return message


def assemble_gemini(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """What clients of python-genai do with the chunks: the parts in order, consecutive text
    parts of one kind (thought or not) joined with the thoughtSignature a piece carries, empty
    unsigned text left out; the finish reason and usage of the last chunk (usage is cumulative,
    not summed)."""
    parts: list[dict[str, Any]] = []
    for i, chunk in enumerate(chunks):
        assert "error" not in chunk, chunk
        (candidate,) = chunk["candidates"]
        assert ("finishReason" in candidate) == (i == len(chunks) - 1)
        assert (chunk["responseId"], chunk["modelVersion"]) == (
            chunks[0]["responseId"],
            chunks[0]["modelVersion"],
        )
        for part in candidate["content"].get("parts", []):
            last = parts[-1] if parts else {}
            same_kind = bool(part.get("thought")) == bool(last.get("thought"))
            if "text" in part and "text" in last and same_kind and "thoughtSignature" not in last:
                last["text"] += part["text"]
                if "thoughtSignature" in part:
                    last["thoughtSignature"] = part["thoughtSignature"]
            else:
                parts.append(dict(part))
    parts = [p for p in parts if p != {"text": ""}]
    final = copy.deepcopy(chunks[-1])
    content = final["candidates"][0]["content"]
    if parts:
        content["parts"] = parts
    else:
        content.pop("parts", None)
    return final


def gemini_chunks(events: list[Event]) -> list[dict[str, Any]]:
    assert all(name is None for name, _ in events)
    return [json.loads(data) for _, data in events]


def assemble(kind: Kind, frames: list[bytes]) -> dict[str, Any]:
    events = events_of(frames, kind)
    if kind == "openai":
        return assemble_openai(events)
    if kind == "anthropic":
        return assemble_anthropic(events)
    return assemble_gemini(gemini_chunks(events))


# ------------------------------------------------------------------------- many answers


def turn(**overrides: Any) -> Answer:
    fields: dict[str, Any] = {
        "model": "sim-model",
        "text": "Hello, world: a plain answer.",
        "finish_reason": "stop",
        "input_tokens": 40,
        "cached_tokens": 0,
        "output_tokens": 7,
        "reasoning_tokens": 0,
        "seq": 3,
        "created": 1_760_000_000,
    }
    return Answer(**{**fields, **overrides})


LONG_ARGS = {"url": "https://example.org/a?b=c", "limit": 5, "tags": ["x", "y"], "deep": {"k": None}}
ANSWERS: dict[str, Answer] = {
    "text": turn(),
    "empty_text": turn(text="", output_tokens=0),
    "empty_fault": turn(text="", output_tokens=0, finish_reason="length"),
    "one_token": turn(text="Hi", output_tokens=1),
    "unicode": turn(text='Ünïcødé — 日本語 🚀 done.\nline two "quoted" \\ and\ttab', output_tokens=12),
    "max_tokens": turn(text="cut off in the mid", finish_reason="length", output_tokens=4),
    "structured": turn(
        text=json.dumps({"choice": "A", "confidence": 0.75, "nested": {"list": [1, 2, 3]}, "ok": True}),
        output_tokens=20,
    ),
    "cached": turn(cached_tokens=1200, cache_write_tokens=300, input_tokens=50),
    "reasoning": turn(reasoning_tokens=40),
    "one_call": turn(text="", calls=(NativeCall("fetch", LONG_ARGS),), output_tokens=20),
    "parallel_calls_with_text": turn(
        text="Let me check both.",
        calls=(NativeCall("fetch", {"url": "https://a.example"}), NativeCall("verify", {"claim": "2+2=4"})),
        output_tokens=25,
    ),
    "call_without_arguments": turn(text="", calls=(NativeCall("ping"),), output_tokens=1),
    "call_with_its_id": turn(text="", calls=(NativeCall("f", {"a": 1}, id="call_given_1"),)),
    "raw_arguments": turn(text="", calls=(NativeCall("f", '{"a": 1, "a": 2}'), NativeCall("g", "not json"))),
    "thinking_and_text": turn(thinking="Weighing the options, one by one.", reasoning_tokens=9),
    "thinking_and_calls": turn(
        text="", thinking="I should look.", calls=(NativeCall("fetch", {"url": "u"}), NativeCall("fetch", {}))
    ),
    "thinking_only": turn(text="", thinking="Nothing to say.", output_tokens=0, finish_reason="length"),
    "empty_thinking": turn(thinking=""),
    "long": turn(text="word " * 200, output_tokens=250),
}


@pytest.mark.parametrize("name", list(ANSWERS))
@pytest.mark.parametrize("kind", KINDS)
def test_the_frames_put_back_together_are_the_plain_body(kind: Kind, name: str) -> None:
    answer = ANSWERS[name]
    wire = WIRES[kind]

    frames = wire.stream(answer, StreamAsk())

    assert assemble(kind, frames) == wire.success(answer)


@pytest.mark.parametrize("name", ["text", "unicode", "long", "thinking_and_text", "parallel_calls_with_text"])
@pytest.mark.parametrize("kind", KINDS)
def test_text_goes_out_one_simulated_token_per_frame(kind: Kind, name: str) -> None:
    answer = ANSWERS[name]

    pieces = visible_text_pieces(kind, WIRES[kind].stream(answer, StreamAsk()))

    assert "".join(pieces) == answer.text
    assert all(0 < len(piece) <= TOKEN_CHARS for piece in pieces)
    assert len(pieces) == -(-len(answer.text) // TOKEN_CHARS)


def visible_text_pieces(kind: Kind, frames: list[bytes]) -> list[str]:
    out: list[str] = []
    for name, data in events_of(frames, kind):
        if data == "[DONE]":
            continue
        payload = json.loads(data)
        if kind == "openai":
            out.extend(c["delta"]["content"] for c in payload["choices"] if c["delta"].get("content"))
        elif (
            kind == "anthropic" and name == "content_block_delta" and payload["delta"]["type"] == "text_delta"
        ):
            out.append(payload["delta"]["text"])
        elif kind == "gemini":
            parts = payload["candidates"][0]["content"].get("parts", [])
            out.extend(p["text"] for p in parts if p.get("text") and not p.get("thought"))
    return out


def test_openai_tool_calls_start_whole_then_send_their_arguments_in_several_deltas() -> None:
    answer = ANSWERS["parallel_calls_with_text"]
    deltas = [
        call
        for _, data in events_of(WIRES["openai"].stream(answer, StreamAsk()), "openai")[:-1]
        for choice in json.loads(data)["choices"]
        for call in choice["delta"].get("tool_calls", [])
    ]

    starts = [d for d in deltas if "id" in d]
    fragments = {
        i: [d["function"]["arguments"] for d in deltas if d["index"] == i and "id" not in d] for i in (0, 1)
    }

    assert [(s["index"], s["type"], s["function"]) for s in starts] == [
        (0, "function", {"name": "fetch", "arguments": ""}),
        (1, "function", {"name": "verify", "arguments": ""}),
    ]
    assert all(len(f) > 1 for f in fragments.values())
    assert json.loads("".join(fragments[1])) == {"claim": "2+2=4"}
    # Calls come after the text, one call's deltas before the next call starts.
    assert [d["index"] for d in deltas] == sorted(d["index"] for d in deltas)


def test_openai_a_turn_that_only_calls_opens_with_null_content_and_its_first_call() -> None:
    events = events_of(WIRES["openai"].stream(ANSWERS["one_call"], StreamAsk()), "openai")

    opening = json.loads(events[0][1])["choices"][0]["delta"]

    assert opening["role"] == "assistant" and opening["content"] is None and opening["refusal"] is None
    assert opening["tool_calls"][0]["function"] == {"name": "fetch", "arguments": ""}


def test_openai_stream_has_usage_only_when_include_usage_asks_for_it() -> None:
    answer = ANSWERS["cached"]
    plain = WIRES["openai"].success(answer)

    with_usage = events_of(WIRES["openai"].stream(answer, StreamAsk(usage=True)), "openai")
    without = events_of(WIRES["openai"].stream(answer, StreamAsk(usage=False)), "openai")

    chunks = [json.loads(d) for _, d in with_usage[:-1]]
    assert [c["usage"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == plain["usage"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert all("usage" not in json.loads(d) for _, d in without[:-1])
    assert assemble_openai(without) == {k: v for k, v in plain.items() if k != "usage"}
    assert with_usage[-1] == without[-1] == (None, "[DONE]")


def test_openai_obfuscation_pads_each_chunk_unless_turned_off() -> None:
    answer = ANSWERS["text"]

    padded = events_of(WIRES["openai"].stream(answer, StreamAsk()), "openai")[:-1]
    bare = events_of(WIRES["openai"].stream(answer, StreamAsk(obfuscation=False)), "openai")[:-1]

    assert all(isinstance(json.loads(d)["obfuscation"], str) for _, d in padded)
    assert all("obfuscation" not in json.loads(d) for _, d in bare)


def test_anthropic_stream_follows_the_event_order_with_ping_after_the_first_block() -> None:
    events = events_of(WIRES["anthropic"].stream(ANSWERS["thinking_and_calls"], StreamAsk()), "anthropic")
    names = [name for name, _ in events]
    start = json.loads(events[0][1])["message"]

    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 1
    deltas = [json.loads(d)["delta"] for n, d in events if n == "content_block_delta"]
    kinds = [d["type"] for d in deltas]
    assert kinds.index("signature_delta") == kinds.count("thinking_delta")  # after the whole thought
    json_pieces = [d["partial_json"] for d in deltas if d["type"] == "input_json_delta"]
    assert json_pieces[0] == ""  # the first piece of each input is empty, as the API sends it
    assert [json.loads(d)["delta"] for n, d in events if n == "message_delta"] == [
        {"stop_reason": "tool_use", "stop_sequence": None}
    ]


def test_anthropic_a_call_without_arguments_sends_one_empty_input_delta() -> None:
    events = events_of(WIRES["anthropic"].stream(ANSWERS["call_without_arguments"], StreamAsk()), "anthropic")

    deltas = [json.loads(d)["delta"] for n, d in events if n == "content_block_delta"]

    assert deltas == [{"type": "input_json_delta", "partial_json": ""}]


def test_anthropic_turn_without_blocks_still_pings() -> None:
    events = events_of(WIRES["anthropic"].stream(ANSWERS["empty_fault"], StreamAsk()), "anthropic")

    assert [name for name, _ in events] == ["message_start", "ping", "message_delta", "message_stop"]


def test_gemini_chunks_carry_cumulative_usage_and_the_signature_comes_last() -> None:
    answer = ANSWERS["thinking_and_text"]
    chunks = gemini_chunks(events_of(WIRES["gemini"].stream(answer, StreamAsk()), "gemini"))
    plain = WIRES["gemini"].success(answer)

    counts = [c["usageMetadata"].get("candidatesTokenCount", 0) for c in chunks]

    assert counts == sorted(counts) and counts[-1] == answer.output_tokens
    assert chunks[-1]["usageMetadata"] == plain["usageMetadata"]
    assert chunks[-1]["candidates"][0]["content"]["parts"] == [
        {"text": "", "thoughtSignature": plain["candidates"][0]["content"]["parts"][-1]["thoughtSignature"]}
    ]
    assert all(c["candidates"][0]["index"] == 0 for c in chunks)


def test_gemini_function_calls_arrive_whole_with_their_signature() -> None:
    answer = ANSWERS["thinking_and_calls"]
    chunks = gemini_chunks(events_of(WIRES["gemini"].stream(answer, StreamAsk()), "gemini"))

    calls = [p for c in chunks for p in c["candidates"][0]["content"].get("parts", []) if "functionCall" in p]

    assert calls == [
        p for p in WIRES["gemini"].success(answer)["candidates"][0]["content"]["parts"] if "functionCall" in p
    ]
    assert "thoughtSignature" in calls[0] and "thoughtSignature" not in calls[1]


@pytest.mark.parametrize("name", ["text", "empty_fault", "thinking_and_calls"])
def test_gemini_without_alt_sse_is_one_json_array_of_the_same_chunks(name: str) -> None:
    answer = ANSWERS[name]
    wire = WIRES["gemini"]

    pieces = wire.stream(answer, StreamAsk(sse=False))

    assert len(pieces) >= 2 and pieces[0].startswith(b"[") and pieces[-1] == b"]"
    assert json.loads(b"".join(pieces)) == gemini_chunks(
        events_of(wire.stream(answer, StreamAsk()), "gemini")
    )


# ------------------------------------------------------------------------- over HTTP


def request_for(
    panel: SimPanel, kind: Kind, model: str, *, streamed: bool, text: str = "hi", **extra: Any
) -> dict[str, Any]:
    """The URL, body and headers of one call on `kind`'s wire, asking for a stream or not
    (OpenAI's streamed calls ask for the usage chunk, as Conclave's do)."""
    if kind == "openai":
        body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": text}]}
        if streamed:
            body.update(stream=True, stream_options={"include_usage": True})
        return {"url": panel.base_url("openai") + "/chat/completions", "json": {**body, **extra}}
    if kind == "anthropic":
        body = {"model": model, "max_tokens": 256, "messages": [{"role": "user", "content": text}], **extra}
        if streamed:
            body["stream"] = True
        return {
            "url": panel.base_url("anthropic") + "/v1/messages",
            "json": body,
            "headers": ANTHROPIC_HEADERS,
        }
    method = "streamGenerateContent?alt=sse" if streamed else "generateContent"
    body = {"contents": [{"role": "user", "parts": [{"text": text}]}], **extra}
    url = f"{panel.base_url('gemini')}/v1beta/models/{model}:{method}"
    return {"url": url, "json": body, "headers": {"x-goog-api-key": "g-test"}}


async def call(
    client: httpx.AsyncClient, panel: SimPanel, kind: Kind, model: str, *, streamed: bool, **extra: Any
) -> httpx.Response:
    return await client.post(**request_for(panel, kind, model, streamed=streamed, **extra))


def script(panel: SimPanel, model: str, *replies: Reply, **kwargs: Any) -> None:
    panel.set_scenario(model, Scenario(replies=replies, **kwargs))


SCRIPTED = Reply(
    text="Both checked; here is the answer.",
    tool_calls=(NativeCall("fetch", {"url": "https://a.example/x"}), NativeCall("verify", {"claim": "1<2"})),
    thinking="First fetch, then verify.",
    cached_tokens=64,
    reasoning_tokens=12,
)


@pytest.mark.parametrize(
    "reply", [Reply(), SCRIPTED, Reply(value={"choice": "B", "n": 3}), Reply(fault="empty")]
)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_streamed_call_answers_what_the_plain_call_answers(
    panel: SimPanel, client: httpx.AsyncClient, kind: Kind, reply: Reply
) -> None:
    script(panel, "m1", reply)
    plain = await call(client, panel, kind, "m1", streamed=False)
    panel.reset()  # the same sequence number, so the same ids
    script(panel, "m1", reply)

    streamed = await call(client, panel, kind, "m1", streamed=True)

    assert streamed.status_code == 200
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.headers["server"] == "conclave-sim"
    body = assemble(kind, split_body(streamed.content, kind))
    expected = plain.json()
    if kind == "openai":
        body["created"] = expected["created"]  # a clock second may have passed
    assert body == expected


@pytest.mark.parametrize(
    ("kind", "headers"),
    [
        ("openai", {"content-type": "text/event-stream; charset=utf-8", "x-request-id": f"req_{1:032x}"}),
        (
            "anthropic",
            {
                "content-type": "text/event-stream; charset=utf-8",
                "cache-control": "no-cache",
                "request-id": "req_sim" + "0" * 19 + "1",
            },
        ),
        ("gemini", {"content-type": "text/event-stream", "content-disposition": "attachment"}),
    ],
)
async def test_a_stream_carries_the_services_own_headers_and_parses_as_server_sent_events(
    panel: SimPanel, client: httpx.AsyncClient, kind: Kind, headers: dict[str, str]
) -> None:
    response = await call(client, panel, kind, "m1", streamed=True)

    # httpx-sse (what Conclave's client parses with) reads the events the strict split reads.
    replay = httpx.Response(200, headers=response.headers, content=response.content)
    parsed = [(sse.event, sse.data) async for sse in EventSource(replay).aiter_sse()]
    strict = [(name or "message", data) for name, data in events_of(split_body(response.content, kind), kind)]
    assert {k: response.headers[k] for k in headers} == headers
    assert response.headers["transfer-encoding"] == "chunked"  # written as it goes, no length
    assert parsed == strict and len(parsed) >= 3


async def test_openai_streams_only_on_stream_true_and_sends_usage_only_when_asked(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    bare = await call(client, panel, "openai", "m1", streamed=True, stream_options={"include_usage": False})
    off = await call(client, panel, "openai", "m1", streamed=False, stream=False)

    chunks = [json.loads(d) for _, d in events_of(split_body(bare.content, "openai"), "openai")[:-1]]

    assert all("usage" not in c and c["choices"] for c in chunks)
    assert bare.content.endswith(b"data: [DONE]\n\n")
    assert off.headers["content-type"].startswith("application/json")
    assert off.json()["object"] == "chat.completion"


async def test_openai_refuses_stream_options_without_stream_and_a_stream_that_is_not_a_boolean(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    url = panel.base_url("openai") + "/chat/completions"
    messages = [{"role": "user", "content": "hi"}]

    options = await client.post(
        url, json={"model": "m", "messages": messages, "stream_options": {"include_usage": True}}
    )
    wrong = await client.post(url, json={"model": "m", "messages": messages, "stream": "yes"})

    assert options.status_code == 400
    assert options.json()["error"]["param"] == "stream_options"
    assert "only allowed when 'stream' is enabled" in options.json()["error"]["message"]
    assert (wrong.status_code, wrong.json()["error"]["param"]) == (400, "stream")
    assert panel.calls("m") == 0


async def test_gemini_stream_path_without_alt_sse_answers_one_json_array(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    url = f"{panel.base_url('gemini')}/v1beta/models/m1:streamGenerateContent"
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}

    r = await client.post(url, json=body, headers={"x-goog-api-key": "g"})

    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json; charset=UTF-8"
    chunks = r.json()
    assert isinstance(chunks, list) and len(chunks) > 1
    assert assemble_gemini(chunks)["candidates"][0]["content"]["parts"][0]["text"].startswith(
        "[simulated m1]"
    )


async def test_a_streamed_request_is_recorded_as_such(panel: SimPanel, client: httpx.AsyncClient) -> None:
    for kind in KINDS:
        await call(client, panel, kind, "m1", streamed=True)
        await call(client, panel, kind, "m1", streamed=False)

    openai_s, openai_p, anthropic_s, anthropic_p, gemini_s, gemini_p = panel.received

    assert openai_s.body["stream"] is True and "stream" not in openai_p.body
    assert anthropic_s.body["stream"] is True and "stream" not in anthropic_p.body
    assert gemini_s.path.endswith("/models/m1:streamGenerateContent?alt=sse")
    assert gemini_p.path.endswith("/models/m1:generateContent")
    assert [r.model for r in panel.received] == ["m1"] * 6


@pytest.mark.parametrize("kind", KINDS)
async def test_a_server_without_streaming_refuses_a_stream_and_answers_a_plain_call(
    panel: SimPanel, client: httpx.AsyncClient, kind: Kind
) -> None:
    script(panel, "local", Reply(text="plain works"), rejects_stream=True)

    refused = await call(client, panel, kind, "local", streamed=True)
    plain = await call(client, panel, kind, "local", streamed=False)

    assert plain.status_code == 200
    assert panel.calls("local") == 1  # the refusal took no step of the script
    if kind == "gemini":
        assert refused.status_code == 404
        assert refused.json()["error"]["status"] == "NOT_FOUND"
        assert "not supported for streamGenerateContent" in refused.json()["error"]["message"]
    else:
        assert refused.status_code == 400
        assert "Streaming is not supported" in json.dumps(refused.json())


# ------------------------------------------------------------------------- faults


FINAL: dict[Kind, bytes] = {
    "openai": b"data: [DONE]",
    "anthropic": b"event: message_stop",
    "gemini": b'"finishReason"',
}


async def read_raw(
    client: httpx.AsyncClient, request: dict[str, Any]
) -> tuple[httpx.Response, bytes, BaseException | None]:
    """Read a stream's bytes as they come, and the error that ended the reading, if any."""
    received = b""
    error: BaseException | None = None
    async with client.stream("POST", **request) as response:
        try:
            async for chunk in response.aiter_raw():
                received += chunk
        except httpx.TransportError as exc:
            error = exc
    return response, received, error


@pytest.mark.parametrize("kind", KINDS)
async def test_drop_cuts_the_stream_halfway_and_the_connection_with_it(
    panel: SimPanel, client: httpx.AsyncClient, kind: Kind
) -> None:
    script(panel, "m1", Reply(fault="drop"), Reply())

    response, received, error = await read_raw(client, request_for(panel, kind, "m1", streamed=True))
    after = await call(client, panel, kind, "m1", streamed=True)

    assert response.status_code == 200
    assert isinstance(error, httpx.RemoteProtocolError)  # the chunked body never ended
    whole = split_body(after.content, kind)
    sent = received.split(separator(kind))
    assert sent[-1] == b""  # whole frames only
    assert 0 < len(sent) - 1 <= len(whole) // 2
    assert FINAL[kind] not in received and FINAL[kind] in after.content


@pytest.mark.parametrize(
    ("kind", "check"),
    [
        ("openai", lambda e: e[-1][0] is None and json.loads(e[-1][1])["error"]["type"] == "server_error"),
        (
            "anthropic",
            lambda e: (
                e[-1][0] == "error"
                and json.loads(e[-1][1])
                == {
                    "type": "error",
                    "error": {
                        "details": None,
                        "type": "overloaded_error",
                        "message": "[simulated] Overloaded",
                    },
                }
            ),
        ),
        ("gemini", lambda e: json.loads(e[-1][1])["error"]["status"] == "UNAVAILABLE"),
    ],
)
async def test_stream_error_sends_half_the_stream_then_the_wires_in_stream_error(
    panel: SimPanel, client: httpx.AsyncClient, kind: Kind, check: Callable[[list[Event]], bool]
) -> None:
    script(panel, "m1", Reply(fault="stream_error"))

    response, received, error = await read_raw(client, request_for(panel, kind, "m1", streamed=True))

    assert response.status_code == 200 and error is None  # a clean end: the error is in the body
    events = events_of(split_body(received, kind), kind)
    assert check(events)
    assert FINAL[kind] not in received
    with pytest.raises((InStreamError, AssertionError)):
        assemble(kind, split_body(received, kind))


async def test_stream_error_takes_a_scripted_status_and_message(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    script(panel, "m1", Reply(fault="stream_error", status=429, error_message="slow down"))

    r = await call(client, panel, "anthropic", "m1", streamed=True)

    name, data = events_of(split_body(r.content, "anthropic"), "anthropic")[-1]
    assert name == "error"
    assert json.loads(data)["error"] == {"details": None, "type": "rate_limit_error", "message": "slow down"}


@pytest.mark.parametrize(("kind", "status"), [("openai", 500), ("anthropic", 529), ("gemini", 503)])
async def test_stream_error_on_a_plain_call_is_that_error_as_the_response(
    panel: SimPanel, client: httpx.AsyncClient, kind: Kind, status: int
) -> None:
    script(panel, "m1", Reply(fault="stream_error"))

    r = await call(client, panel, kind, "m1", streamed=False)

    assert r.status_code == status
    assert "error" in r.json()


@pytest.mark.parametrize("kind", KINDS)
async def test_malformed_cuts_the_json_of_one_frame_and_sends_the_rest(
    panel: SimPanel, client: httpx.AsyncClient, kind: Kind
) -> None:
    script(panel, "m1", Reply(fault="malformed"))

    r = await call(client, panel, kind, "m1", streamed=True)

    events = events_of(split_body(r.content, kind), kind)
    broken = []
    for _, data in events:
        try:
            json.loads(data) if data != "[DONE]" else None
        except json.JSONDecodeError:
            broken.append(data)
    assert len(broken) == 1 and len(broken[0]) > 0
    assert FINAL[kind] in r.content


@pytest.mark.parametrize("kind", KINDS)
async def test_truncated_ends_the_stream_cleanly_before_its_closing_frames(
    panel: SimPanel, client: httpx.AsyncClient, kind: Kind
) -> None:
    script(panel, "m1", Reply(fault="truncated"))

    response, received, error = await read_raw(client, request_for(panel, kind, "m1", streamed=True))
    plain = await call(client, panel, kind, "m1", streamed=False)

    assert response.status_code == 200 and error is None  # a complete body, the stream unfinished
    assert len(split_body(received, kind)) >= 1
    assert FINAL[kind] not in received
    with pytest.raises(AssertionError):
        assemble(kind, split_body(received, kind))
    assert plain.status_code == 200  # a plain body is cut as `malformed` cuts it
    with pytest.raises(json.JSONDecodeError):
        plain.json()


@pytest.mark.parametrize("kind", KINDS)
def test_missing_fields_streams_every_frame_without_what_carries_the_answer(kind: Kind) -> None:
    answer = ANSWERS["parallel_calls_with_text"]
    wire = WIRES[kind]
    field = wire.answer_field

    events = events_of(wire.stream(answer, StreamAsk(), answerless=True), kind)

    payloads = [json.loads(data) for _, data in events if data != "[DONE]"]
    plain = wire.success(answer)
    if kind == "anthropic":
        assert [name for name, _ in events] == ["message_start", "ping", "message_delta", "message_stop"]
        assert assemble_anthropic(events) == {k: v for k, v in plain.items() if k != field}
    else:
        assert all(field not in payload for payload in payloads)
        usage_key = "usage" if kind == "openai" else "usageMetadata"
        assert payloads[-1][usage_key] == plain[usage_key]
    if kind == "openai":
        assert events[-1][1] == "[DONE]"


@pytest.mark.parametrize("kind", KINDS)
async def test_missing_fields_over_http_is_a_whole_stream_without_the_answer(
    panel: SimPanel, client: httpx.AsyncClient, kind: Kind
) -> None:
    script(panel, "m1", Reply(fault="missing_fields"))

    r = await call(client, panel, kind, "m1", streamed=True)

    events = events_of(split_body(r.content, kind), kind)
    assert r.status_code == 200 and len(events) >= 2
    assert b"[simulated m1]" not in r.content  # the default answer's text is nowhere
    payloads = [json.loads(d) for _, d in events if d != "[DONE]"]
    if kind == "anthropic":
        payloads = [p["message"] for p in payloads if p["type"] == "message_start"]
    assert payloads and all(WIRES[kind].answer_field not in payload for payload in payloads)


# ------------------------------------------------------------------------- pace and hang-ups


def test_the_pace_must_be_positive() -> None:
    with pytest.raises(ValueError, match="stream_tokens_per_s"):
        SimPanel(stream_tokens_per_s=0)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_paced_stream_arrives_frame_by_frame_and_a_hang_up_stops_it(
    client: httpx.AsyncClient, kind: Kind
) -> None:
    async with SimPanel(stream_tokens_per_s=4) as panel:  # a frame every 250 ms: far slower than reading
        script(panel, "slow", Reply(text="word " * 400))
        async with client.stream("POST", **request_for(panel, kind, "slow", streamed=True)) as response:
            chunks = response.aiter_raw()
            first = await chunks.__anext__()
        # Out of the block: httpx closed the connection with the stream far from over.
        with anyio.fail_after(5):  # long before the 100 s the whole stream would take
            while not panel.aborted:
                await anyio.sleep(0.01)
        after = await call(client, panel, kind, "slow", streamed=False)

    assert first.endswith(separator(kind)) and first.count(separator(kind)) <= 2
    assert FINAL[kind] not in first
    assert panel.aborted == ["slow"]
    assert after.status_code == 200


async def test_a_caller_that_hangs_up_before_the_first_byte_is_recorded_as_aborted(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    script(panel, "slow", Reply(latency_ms=30_000))

    with anyio.move_on_after(0.2):
        await call(client, panel, "anthropic", "slow", streamed=True)
    with anyio.fail_after(5):
        while not panel.aborted:
            await anyio.sleep(0.01)

    assert panel.aborted == ["slow"]


# ------------------------------------------------------------------------- scripts


def test_a_scenario_that_rejects_streams_survives_a_round_trip_through_a_dict() -> None:
    scenario = Scenario(replies=(Reply(fault="stream_error", status=529),), rejects_stream=True)

    assert Scenario.from_dict(json.loads(json.dumps(scenario.to_dict()))) == scenario
    assert scenario.to_dict()["rejects_stream"] is True


@pytest.mark.parametrize("bad", [{"rejects_stream": "yes"}, {"replies": [{"fault": "stream_eror"}]}])
def test_scenario_from_dict_refuses_a_bad_stream_field(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"."):
        Scenario.from_dict(bad)


async def test_the_control_route_scripts_rejects_stream_and_stream_error(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    control = f"http://127.0.0.1:{panel.port}/_sim/scenarios"

    put = await client.put(f"{control}/m1", json={"rejects_stream": True})
    put2 = await client.put(f"{control}/m2", json={"replies": [{"fault": "stream_error"}]})
    listing = (await client.get(control)).json()
    refused = await call(client, panel, "openai", "m1", streamed=True)
    errored = await call(client, panel, "openai", "m2", streamed=True)

    assert put.json()["ok"] and put2.json()["ok"]
    assert listing["m1"]["rejects_stream"] is True and listing["m2"]["replies"][0]["fault"] == "stream_error"
    assert refused.status_code == 400
    assert b'"error"' in errored.content and FINAL["openai"] not in errored.content
