"""The OpenAI-compatible chat endpoint of `serve --http` (docs/openai-endpoint.md), driven by the
official `openai` client over real loopback HTTP against the simulated panel; raw httpx where
the client would refuse to send what is tested (a malformed body) or hides the framing."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import orjson
import pytest

from conclave.app.runtime import open_runtime
from conclave.app.server.core import Server
from conclave.app.server.openai_compat import MAX_BODY_BYTES
from conclave.app.server.openai_stream import REPLACED, Prose
from conclave.app.sim import Reply, Rule, Scenario, SimPanel
from conclave.core.messages import Delta
from conclave.schema.config import load_config
from tests.server_support import panel_config
from tests.support import read_events
from tests.test_server_http import serving

pytestmark = pytest.mark.anyio

CHAIR_ASK = "Write the final answer to the question"  # a confer chair's prompt ends with it
SYNTH_ASK = "Write the final answer to the task"  # coordinate's synthesizer's
CHAIR_ANSWER = (
    "Pick option 2: it is the simplest choice that fits the facts, and the panel's best-ranked "
    'answers agree on it. Quotes stay "quoted" and lines\nbreak where they should.'
)
MEMBERS = ("m-alpha", "m-beta", "m-gamma")


def envelope(answer: str, **extra: Any) -> str:
    return json.dumps({"answer": answer, "confidence": 0.8, "resolved": [], "dissent": [], **extra})


@dataclass
class Stack:
    panel: SimPanel
    url: str  # the server's base URL, without /v1
    events: Path

    def client(self, key: str = "unused-on-loopback") -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0)

    def session_ends(self) -> list[dict[str, Any]]:
        return [e for e in read_events(self.events) if e["event"] == "session_end"]


@contextlib.asynccontextmanager
async def stack_on(tmp_path: Path, *, bound_host: str = "127.0.0.1", **sim: Any) -> AsyncIterator[Stack]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    async with SimPanel(role_answers=True, **sim) as panel:
        config = load_config(str(panel_config(panel, tmp_path)), env={}, dotenv=None)
        async with open_runtime(config) as runtime, serving(Server(runtime), bound_host=bound_host) as url:
            yield Stack(panel, url, tmp_path / "events.ndjson")


@pytest.fixture
async def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Stack]:
    monkeypatch.delenv("CONCLAVE_API_KEY", raising=False)
    async with stack_on(tmp_path) as built:
        yield built


def script_chair(panel: SimPanel, answer: str = CHAIR_ANSWER, model: str = "m-beta", **extra: Any) -> None:
    """The chair (beta, the configured synthesizer) writes `answer`; members and reviewers get
    the panel's default answers and role envelopes."""
    rules = (
        Rule(CHAIR_ASK, Reply(text=envelope(answer, **extra))),
        Rule(SYNTH_ASK, Reply(text=envelope(answer, **extra))),
    )
    panel.set_scenario(model, Scenario(rules=rules))


def bodies(panel: SimPanel, model: str) -> list[str]:
    return [orjson.dumps(r.body).decode() for r in panel.received if r.model == model]


CONVERSATION: list[Any] = [
    {"role": "system", "content": "Answer like a pirate."},
    {"role": "user", "content": "Which queue did we pick last time?"},
    {"role": "assistant", "content": "We picked the Postgres-backed one."},
    {"role": "user", "content": "Which option should the team choose now?"},
]


# -- models -----------------------------------------------------------------------------------------


async def test_the_models_are_listed_with_their_panels(stack: Stack) -> None:
    async with stack.client() as client:
        models = await client.models.list()
        one = await client.models.retrieve("conclave-coordinate")
    listed = {m.id: m for m in models.data}
    assert list(listed) == ["conclave-confer", "conclave-council", "conclave-coordinate"]
    assert all(m.object == "model" and m.owned_by == "conclave" for m in models.data)
    council = listed["conclave-council"].model_extra["conclave"]  # type: ignore[index]
    assert council["panel"] == ["alpha", "beta", "gamma"] and council["chair"] == ["beta", "gamma"]
    roles = one.model_extra["conclave"]  # type: ignore[index]
    assert (roles["proposer"], roles["critics"], roles["synthesizer"]) == (
        "alpha",
        ["beta", "gamma"],
        ["beta", "gamma"],
    )


# -- plain replies -------------------------------------------------------------------------------------


async def test_confer_replies_with_a_digest_and_maps_the_conversation(stack: Stack) -> None:
    async with stack.client() as client:
        reply = await client.chat.completions.create(
            model="conclave-confer",
            messages=CONVERSATION,
            max_tokens=321,
            temperature=0.25,
        )
    content = reply.choices[0].message.content or ""
    for name in ("alpha", "beta", "gamma"):
        assert f"## {name} (m-{name})" in content
        sent = bodies(stack.panel, f"m-{name}")
        assert len(sent) == 1
        assert "Which option should the team choose now?" in sent[0], "the last user turn is the question"
        assert "Assistant: We picked the Postgres-backed one." in sent[0], "earlier turns are the context"
        assert "Answer like a pirate." in sent[0], "the system message is the system prompt"
    alpha = stack.panel.received[[r.model for r in stack.panel.received].index("m-alpha")].body
    assert alpha["temperature"] == 0.25 and 321 in (
        alpha.get("max_tokens"),
        alpha.get("max_completion_tokens"),
    )
    assert reply.choices[0].finish_reason == "stop" and reply.object == "chat.completion"
    [end] = stack.session_ends()
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == end["usage"]["input_tokens"] > 0
    assert reply.usage.completion_tokens == end["usage"]["output_tokens"] > 0
    extra = reply.model_extra or {}
    assert extra["conclave"]["session_id"] == end["session_id"] and extra["conclave"]["degraded"] is False


async def test_council_replies_with_the_chairs_prose_and_sums_the_whole_panel(stack: Stack) -> None:
    script_chair(stack.panel)
    async with stack.client() as client:
        reply = await client.chat.completions.create(model="conclave-council", messages=CONVERSATION)
    assert reply.choices[0].message.content == CHAIR_ANSWER
    [end] = stack.session_ends()
    assert end["answers"] >= 3 + 3 + 1, "members, reviewers and the chair"
    assert reply.usage is not None and reply.usage.total_tokens == end["usage"]["total_tokens"]
    assert (reply.model_extra or {})["conclave"]["degraded"] is False


async def test_coordinate_replies_with_the_synthesis_and_takes_the_system_message_as_context(
    stack: Stack,
) -> None:
    script_chair(stack.panel)
    async with stack.client() as client:
        reply = await client.chat.completions.create(model="conclave-coordinate", messages=CONVERSATION)
    assert reply.choices[0].message.content == CHAIR_ANSWER
    proposer = bodies(stack.panel, "m-alpha")[0]
    # coordinate takes no system prompt: the caller's leads the context, before the earlier turns
    assert '"context\\": \\"Instructions:' in proposer
    assert proposer.index("Instructions:") < proposer.index("pirate") < proposer.index("Assistant: We picked")
    assert "Which option should the team choose now?" in proposer


async def test_a_degraded_council_is_still_a_200_that_says_who_is_missing(stack: Stack) -> None:
    script_chair(stack.panel)
    stack.panel.set_scenario("m-gamma", Scenario(replies=(Reply(status=500),)))
    async with stack.client() as client:
        reply = await client.chat.completions.create(model="conclave-council", messages=CONVERSATION)
    assert reply.choices[0].message.content == CHAIR_ANSWER
    conclave = (reply.model_extra or {})["conclave"]
    assert conclave["degraded"] is True
    assert {"provider": "gamma", "role": None, "status": "error"}.items() <= conclave["degraded_reasons"][
        0
    ].items()


async def test_a_council_nobody_answered_is_a_502_with_the_reasons(stack: Stack) -> None:
    for model in MEMBERS:
        stack.panel.set_scenario(model, Scenario(replies=(Reply(status=500),)))
    async with stack.client() as client:
        with pytest.raises(openai.APIStatusError) as raised:
            await client.chat.completions.create(model="conclave-confer", messages=CONVERSATION)
    assert raised.value.status_code == 502
    body: Any = raised.value.body
    assert body["code"] == "no_usable_answer"
    assert "alpha: [simulated] The server had an error" in body["message"], "each member's own words"


# -- structured answers -----------------------------------------------------------------------------

CHOICE = {
    "type": "object",
    "properties": {"choice": {"enum": ["a", "b"]}},
    "required": ["choice"],
    "additionalProperties": False,
}
JSON_SCHEMA: Any = {
    "type": "json_schema",
    "json_schema": {"name": "choice", "schema": CHOICE, "strict": True},
}


async def test_a_json_schema_response_format_is_the_votes_consensus(stack: Stack) -> None:
    for model in MEMBERS:
        stack.panel.set_scenario(model, Scenario(replies=(Reply(value={"choice": "b"}),)))
    async with stack.client() as client:
        reply = await client.chat.completions.create(
            model="conclave-confer",
            messages=CONVERSATION,
            response_format=JSON_SCHEMA,
        )
    assert json.loads(reply.choices[0].message.content or "") == {"choice": "b"}
    assert '"choice"' in bodies(stack.panel, "m-alpha")[0], "the schema went to the members"


async def test_no_consensus_is_a_refusal_not_an_invented_value(stack: Stack) -> None:
    for model, value in zip(MEMBERS, ("a", "b", "a"), strict=True):
        stack.panel.set_scenario(model, Scenario(replies=(Reply(value={"choice": value}),)))
    stack.panel.set_scenario("m-gamma", Scenario(replies=(Reply(status=500),)))
    async with stack.client() as client:
        reply = await client.chat.completions.create(
            model="conclave-confer",
            messages=CONVERSATION,
            response_format=JSON_SCHEMA,
        )
    message = reply.choices[0].message
    assert message.content is None and "no consensus" in (message.refusal or "")


async def test_a_json_schema_response_format_is_the_synthesis_value_for_coordinate(stack: Stack) -> None:
    script_chair(stack.panel, value={"choice": "a"})
    async with stack.client() as client:
        reply = await client.chat.completions.create(
            model="conclave-coordinate",
            messages=CONVERSATION,
            response_format=JSON_SCHEMA,
        )
    assert json.loads(reply.choices[0].message.content or "") == {"choice": "a"}


# -- streaming ----------------------------------------------------------------------------------------


async def test_a_streamed_council_sends_the_chairs_prose_as_it_is_written(tmp_path: Path) -> None:
    # Paced: each simulated token takes 5 ms, so the chair's answer takes a while to write.
    async with stack_on(tmp_path, stream_tokens_per_s=200) as stack:
        script_chair(stack.panel)
        async with stack.client() as client:
            whole = await client.chat.completions.create(model="conclave-council", messages=CONVERSATION)
            stream = await client.chat.completions.create(
                model="conclave-council",
                messages=CONVERSATION,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = []
            async for chunk in stream:
                chunks.append((time.perf_counter(), chunk))
    first = chunks[0][1]
    assert first.choices[0].delta.role == "assistant"
    content = [
        (at, c.choices[0].delta.content) for at, c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert len(content) >= 5, "the prose arrives in many deltas, not at once"
    finals = [(at, c) for at, c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0][1].choices[0].finish_reason == "stop"
    assert finals[0][0] - content[0][0] > 0.1, "the first words came well before the end"
    assert "".join(text for _, text in content) == whole.choices[0].message.content == CHAIR_ANSWER
    assert (finals[0][1].model_extra or {})["conclave"]["degraded"] is False
    usage = chunks[-1][1]
    assert usage.choices == [] and usage.usage is not None and usage.usage.total_tokens > 0


async def test_the_stream_is_framed_as_openai_frames_it(stack: Stack) -> None:
    body = {"model": "conclave-confer", "messages": CONVERSATION, "stream": True}
    async with httpx.AsyncClient(base_url=stack.url) as client:
        reply = await client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in reply.text.split("\n\n") if f and not f.startswith(":")]
    assert frames[-1] == "data: [DONE]"
    chunks = [orjson.loads(f.removeprefix("data: ")) for f in frames[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    digest = [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]]
    assert len(digest) == 3 and digest[0].startswith("## alpha"), "the confer digest goes one member a chunk"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and "usage" not in chunks[-1]
    assert chunks[-1]["conclave"]["session_id"].startswith("s-")


async def test_a_client_that_hangs_up_mid_stream_cancels_the_council(stack: Stack) -> None:
    for model in MEMBERS:
        stack.panel.set_scenario(model, Scenario(latency_ms=30_000))
    body = {"model": "conclave-council", "messages": CONVERSATION, "stream": True}

    async def ask() -> None:
        async with (
            httpx.AsyncClient(base_url=stack.url, timeout=60) as client,
            client.stream("POST", "/v1/chat/completions", json=body) as reply,
        ):
            async for _ in reply.aiter_bytes():
                pass

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(ask)
            while len(stack.panel.received) < 3:
                await anyio.sleep(0.02)
            group.cancel_scope.cancel()  # the client goes away mid-call
        while len(stack.panel.aborted) < 3 or not stack.session_ends():
            await anyio.sleep(0.02)
    assert sorted(stack.panel.aborted) == list(MEMBERS), "every upstream request was cancelled"
    assert [e["status"] for e in stack.session_ends()] == ["cancelled"]


def test_prose_never_sends_a_replaced_draft_twice() -> None:
    """A fallback that writes something else stops the prose; the final answer then follows a
    marked break instead of being appended as if it continued the draft."""
    prose = Prose()
    prose.hear("beta", "synthesizer", Delta("text", '{"answer": "Option 1 is'))
    assert prose.take() == "Option 1 is"
    prose.hear("beta", "critic", Delta("text", "ignored"))
    prose.hear("gamma", "synthesizer", Delta("text", '{"answer": "Option 1'))
    assert prose.take() == "", "a fallback repeating what was sent adds nothing"
    prose.hear("gamma", "synthesizer", Delta("text", ' is not it"}'))
    assert prose.take() == " not it"
    prose.hear("gamma", "synthesizer", Delta("text", ""))
    assert prose.close("Option 1 is not it, option 2 is.") == (", option 2 is.", False)
    other = Prose()
    other.hear("beta", "synthesizer", Delta("text", '{"answer": "Draft'))
    assert other.take() == "Draft"
    other.hear("gamma", "synthesizer", Delta("text", '{"answer": "Final'))
    assert other.take() == "" and other.diverged
    assert other.close("Final answer.") == (REPLACED + "Final answer.", True)


def test_a_re_prompted_synthesizer_starts_its_prose_again() -> None:
    """The same synthesizer asked again (its envelope was invalid) opens a new model call: what it
    writes then is read on its own, not appended to the first reply."""
    prose = Prose()
    prose.hear("beta", "synthesizer", Delta("start", ""))
    prose.hear("beta", "synthesizer", Delta("text", '{"answer": "Option 2 is'))
    assert prose.take() == "Option 2 is"
    prose.hear("beta", "synthesizer", Delta("text", ' best", "confidence": "high"}'))  # invalid
    prose.hear("beta", "synthesizer", Delta("start", ""))
    prose.hear("beta", "synthesizer", Delta("text", '{"answer": "Option 2 is best, because'))
    assert prose.take() == " best, because", "the new reply, read from its own start"
    assert not prose.diverged


# -- errors ---------------------------------------------------------------------------------------------


async def test_an_unknown_model_is_a_404(stack: Stack) -> None:
    async with stack.client() as client:
        with pytest.raises(openai.NotFoundError) as raised:
            await client.chat.completions.create(model="gpt-4o", messages=CONVERSATION)
    assert raised.value.code == "model_not_found"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "conclave-confer"}, "messages"),
        ({"model": "conclave-confer", "messages": CONVERSATION, "temprature": 1}, "temprature"),
        ({"model": "conclave-confer", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"model": "conclave-confer", "messages": CONVERSATION, "n": 2}, "n"),
        ({"model": "conclave-confer", "messages": CONVERSATION, "tools": [{"type": "function"}]}, "tools"),
        ({"model": "conclave-confer", "messages": CONVERSATION, "stop": ["\n"]}, "stop"),
        (
            {
                "model": "conclave-confer",
                "messages": CONVERSATION,
                "response_format": {"type": "json_object"},
            },
            "response_format",
        ),
        (
            {
                "model": "conclave-confer",
                "messages": [*CONVERSATION[:-1], {"role": "assistant", "content": "x"}],
            },
            "messages",
        ),
        (
            {
                "model": "conclave-confer",
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            },
            "messages[0].content[0]",
        ),
        ({"model": "conclave-confer", "messages": CONVERSATION, "max_tokens": 10**9}, "max_tokens"),
    ],
)
async def test_a_request_that_cannot_be_honoured_is_a_400_naming_the_parameter(
    stack: Stack, body: dict[str, Any], param: str
) -> None:
    async with httpx.AsyncClient(base_url=stack.url) as client:
        reply = await client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]
    assert stack.panel.received == [], "nothing was asked"


async def test_a_body_that_is_not_json_or_too_large_is_refused(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.url) as client:
        broken = await client.post("/v1/chat/completions", content=b"{nope")
        huge = await client.post("/v1/chat/completions", content=b" " * (MAX_BODY_BYTES + 1))
    assert broken.status_code == 400 and broken.json()["error"]["code"] == "invalid_json"
    assert huge.status_code == 413 and huge.json()["error"]["code"] == "request_too_large"


async def test_conclaves_own_refusal_of_an_argument_is_a_400(stack: Stack) -> None:
    schema: Any = {**JSON_SCHEMA, "json_schema": {"name": "x", "schema": {"type": "array"}}}
    async with stack.client() as client:
        with pytest.raises(openai.BadRequestError) as raised:
            await client.chat.completions.create(
                model="conclave-confer",
                messages=CONVERSATION,
                response_format=schema,
            )
    assert raised.value.param == "response_format"


async def test_the_deadline_extension_reaches_the_session(stack: Stack) -> None:
    async with stack.client() as client:
        await client.chat.completions.create(
            model="conclave-confer",
            messages=CONVERSATION,
            extra_body={"conclave": {"timeout_seconds": 7.5, "session_id": "chat-1"}},
        )
    [start] = [e for e in read_events(stack.events) if e["event"] == "session_start"]
    assert start["timeout_seconds"] == 7.5 and start["session_id"] == "chat-1"


# -- the guard ----------------------------------------------------------------------------------------


async def test_beyond_loopback_every_request_needs_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CONCLAVE_API_KEY", raising=False)
    async with (
        stack_on(tmp_path / "unset", bound_host="0.0.0.0") as stack,
        stack.client("anything") as client,
    ):
        with pytest.raises(openai.AuthenticationError) as raised:
            await client.models.list()
        assert "CONCLAVE_API_KEY" in raised.value.message
    monkeypatch.setenv("CONCLAVE_API_KEY", "sk-conclave-right")
    async with stack_on(tmp_path / "set", bound_host="0.0.0.0") as stack:
        async with stack.client("sk-conclave-wrong") as wrong, stack.client("sk-conclave-right") as right:
            with pytest.raises(openai.AuthenticationError):
                await wrong.chat.completions.create(model="conclave-confer", messages=CONVERSATION)
            assert len((await right.models.list()).data) == 3
        async with httpx.AsyncClient(base_url=stack.url) as raw:
            missing = await raw.get("/v1/models")
        assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
        assert stack.panel.received == []
    assert "sk-conclave-right" not in (tmp_path / "set" / "events.ndjson").read_text(encoding="utf-8")


async def test_on_loopback_the_key_is_optional_but_a_wrong_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONCLAVE_API_KEY", "sk-conclave-right")
    async with stack_on(tmp_path) as stack, httpx.AsyncClient(base_url=stack.url) as client:
        assert (await client.get("/v1/models")).status_code == 200
        wrong = await client.get("/v1/models", headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401
        right = await client.get("/v1/models", headers={"authorization": "Bearer sk-conclave-right"})
        assert right.status_code == 200


async def test_the_origin_and_host_checks_guard_v1_too(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.url) as client:
        evil = await client.get("/v1/models", headers={"origin": "https://evil.example"})
        rebound = await client.get("/v1/models", headers={"host": "rebound.attacker.example"})
        index = (await client.get("/", headers={"accept": "application/json"})).json()
    assert evil.status_code == 403 and evil.json()["error"]["code"] == "origin_not_allowed"
    assert rebound.status_code == 403
    assert index["endpoints"]["openai_chat"]["path"] == "/v1/chat/completions"
    assert index["endpoints"]["openai_models"]["path"] == "/v1/models"


async def test_a_bug_is_a_500_that_names_its_traceback_and_nothing_else(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("kaboom with sk-internal-detail")

    monkeypatch.setattr(Server, "run_tool", broken)
    body = {"model": "conclave-council", "messages": CONVERSATION}
    async with httpx.AsyncClient(base_url=stack.url) as client:
        plain = await client.post("/v1/chat/completions", json=body)
        streamed = await client.post("/v1/chat/completions", json={**body, "stream": True})
    for reply in (plain, streamed):
        assert reply.status_code == 500, "nothing was under way: the headers still carry the status"
        error = reply.json()["error"]
        assert (
            error["code"] == "internal_error"
            and "kaboom" not in reply.text
            and "sk-internal" not in reply.text
        )
    logged = [e for e in read_events(stack.events) if e["event"] == "rpc_error"]
    assert len(logged) == 2 and logged[0]["error_id"] in plain.json()["error"]["message"]
    assert "kaboom" in logged[0]["traceback"]


async def test_a_streamed_request_conclave_refuses_at_once_keeps_its_status(stack: Stack) -> None:
    body = {"model": "conclave-council", "messages": CONVERSATION, "stream": True, "max_tokens": 10**9}
    async with httpx.AsyncClient(base_url=stack.url) as client:
        reply = await client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "max_tokens"
