"""The simulated panel, driven over real loopback HTTP like a provider adapter would."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any, Literal

import anyio
import httpx
import pytest

from conclave.app.sim import ReceivedRequest, Reply, Rule, Scenario, SimPanel, mask_secret

pytestmark = pytest.mark.anyio

Kind = Literal["openai", "anthropic", "gemini"]
ANTHROPIC_HEADERS = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"



@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    # Plain HTTP on loopback: no TLS context to build, no proxy from the environment.
    async with httpx.AsyncClient(timeout=5.0, verify=False, trust_env=False) as c:
        yield c


def openai_body(model: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], **extra}


async def ask_openai(
    client: httpx.AsyncClient, panel: SimPanel, model: str, text: str = "hi", **extra: Any
) -> httpx.Response:
    url = panel.base_url("openai") + "/chat/completions"
    return await client.post(url, json=openai_body(model, text, **extra))


async def ask_anthropic(
    client: httpx.AsyncClient,
    panel: SimPanel,
    model: str,
    text: str = "hi",
    *,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> httpx.Response:
    body = {"model": model, "max_tokens": 256, **openai_body(model, text), **extra}
    url = panel.base_url("anthropic") + "/v1/messages"
    return await client.post(url, json=body, headers=ANTHROPIC_HEADERS if headers is None else headers)


async def ask_gemini(
    client: httpx.AsyncClient, panel: SimPanel, model: str, text: str = "hi", **extra: Any
) -> httpx.Response:
    body = {"contents": [{"role": "user", "parts": [{"text": text}]}], **extra}
    url = f"{panel.base_url('gemini')}/v1beta/models/{model}:generateContent"
    return await client.post(url, json=body, headers={"x-goog-api-key": "g-test"})


async def ask(client: httpx.AsyncClient, panel: SimPanel, kind: Kind, model: str) -> httpx.Response:
    ask_fn = {"openai": ask_openai, "anthropic": ask_anthropic, "gemini": ask_gemini}[kind]
    return await ask_fn(client, panel, model)


def answer_text(kind: Kind, body: dict[str, Any]) -> str:
    if kind == "openai":
        return str(body["choices"][0]["message"]["content"])
    if kind == "anthropic":
        return "".join(block["text"] for block in body["content"])
    return "".join(part["text"] for part in body["candidates"][0]["content"].get("parts", []))


def script(panel: SimPanel, model: str, *replies: Reply, **kwargs: Any) -> None:
    panel.set_scenario(model, Scenario(replies=replies, **kwargs))


# ------------------------------------------------------------------------- success bodies


async def test_openai_answer_has_the_chat_completion_shape_with_cached_and_reasoning_subsets(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    script(panel, "gpt-4o", Reply(text="x" * 40, cached_tokens=10, reasoning_tokens=5))
    body = {
        "model": "gpt-4o",
        "messages": [{"role": "system", "content": "s" * 40}, {"role": "user", "content": "u" * 40}],
    }
    r = await client.post(panel.base_url("openai") + "/chat/completions", json=body)

    assert r.status_code == 200
    assert r.headers["server"] == "conclave-sim"
    assert re.fullmatch(r"req_[0-9a-f]{32}", r.headers["x-request-id"])
    data = r.json()
    assert data["id"].startswith("chatcmpl-sim")
    assert data["object"] == "chat.completion"
    assert isinstance(data["created"], int)
    assert data["model"] == "gpt-4o"
    assert data["system_fingerprint"] is None
    assert data["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "x" * 40, "refusal": None, "annotations": []},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ]
    usage = data["usage"]
    assert usage["prompt_tokens"] == 20 + 10  # 80 input chars / 4, cached on top
    assert usage["prompt_tokens_details"]["cached_tokens"] == 10
    assert usage["completion_tokens"] == 10 + 5  # 40 chars / 4, reasoning on top
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 5
    assert usage["total_tokens"] == 45


async def test_anthropic_answer_reports_input_tokens_without_the_cached_ones(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    script(panel, "claude-x", Reply(text="y" * 8, cached_tokens=100, reasoning_tokens=50))

    r = await ask_anthropic(client, panel, "claude-x", "u" * 40, system="s" * 40)

    assert r.status_code == 200
    assert r.headers["request-id"].startswith("req_sim")
    data = r.json()
    assert data["id"].startswith("msg_sim")
    assert (data["type"], data["role"], data["model"]) == ("message", "assistant", "claude-x")
    assert data["content"] == [{"type": "text", "text": "y" * 8}]
    assert (data["stop_reason"], data["stop_sequence"]) == ("end_turn", None)
    usage = data["usage"]
    assert usage["input_tokens"] == 20
    assert usage["cache_read_input_tokens"] == 100
    assert usage["cache_creation_input_tokens"] == 0
    assert usage["output_tokens"] == 2  # reasoning tokens are not reported by Anthropic


async def test_gemini_answer_counts_thoughts_apart_and_includes_cached_in_the_prompt(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    script(panel, "gemini-x", Reply(text="z" * 20, cached_tokens=3, reasoning_tokens=7))

    data = (await ask_gemini(client, panel, "gemini-x", "u" * 40)).json()

    assert data["candidates"] == [
        {
            "content": {"parts": [{"text": "z" * 20}], "role": "model"},
            "finishReason": "STOP",
            "index": 0,
        }
    ]
    assert data["usageMetadata"] == {
        "promptTokenCount": 10 + 3,
        "candidatesTokenCount": 5,
        "totalTokenCount": 13 + 5 + 7,
        "cachedContentTokenCount": 3,
        "thoughtsTokenCount": 7,
    }
    assert data["modelVersion"] == "gemini-x"
    assert data["responseId"].startswith("sim")


async def test_gemini_leaves_out_zero_token_fields(panel: SimPanel, client: httpx.AsyncClient) -> None:
    data = (await ask_gemini(client, panel, "gemini-x", "u" * 40)).json()

    usage = data["usageMetadata"]
    assert set(usage) == {"promptTokenCount", "candidatesTokenCount", "totalTokenCount"}
    assert usage["totalTokenCount"] == usage["promptTokenCount"] + usage["candidatesTokenCount"]


async def test_reported_model_can_differ_from_the_requested_one(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    script(panel, "gpt-4o", Reply(model="gpt-4o-2024-08-06"))

    data = (await ask_openai(client, panel, "gpt-4o")).json()

    assert data["model"] == "gpt-4o-2024-08-06"
    assert data["choices"][0]["message"]["content"].startswith("[simulated gpt-4o] ")


# ------------------------------------------------------------------------- scripts


async def test_scripted_replies_come_in_call_order_and_the_last_one_repeats(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    script(panel, "m1", Reply(text="first"), Reply(status=500), Reply(text="last"))

    statuses_and_texts = []
    for _ in range(5):
        r = await ask_openai(client, panel, "m1")
        text = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else None
        statuses_and_texts.append((r.status_code, text))

    assert statuses_and_texts == [
        (200, "first"),
        (500, None),
        (200, "last"),
        (200, "last"),
        (200, "last"),
    ]
    assert panel.calls("m1") == 5
    assert panel.calls("someone-else") == 0


async def test_a_rule_on_the_last_message_wins_and_still_advances_the_call_counter(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    panel.set_scenario(
        "m1",
        Scenario(
            replies=(Reply(text="one"), Reply(text="two"), Reply(text="three")),
            rules=(Rule(contains="VERIFY", reply=Reply(text="rule hit")),),
        ),
    )
    earlier_turns = [
        {"role": "user", "content": "VERIFY this earlier turn"},
        {"role": "assistant", "content": "ok"},
    ]
    url = panel.base_url("openai") + "/chat/completions"

    first = await ask_openai(client, panel, "m1", "please VERIFY")
    second = await client.post(
        url, json={"model": "m1", "messages": [*earlier_turns, {"role": "user", "content": "go"}]}
    )

    assert first.json()["choices"][0]["message"]["content"] == "rule hit"
    assert second.json()["choices"][0]["message"]["content"] == "two"


async def test_reply_text_fills_last_model_and_call_but_leaves_other_braces_alone(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    template = '{"model": "{model}", "call": {call}, "echo": "{last}", "other": "{x}"}'
    script(panel, "m1", Reply(text=template))
    question = "q" * 250

    await ask_openai(client, panel, "m1")
    r = await ask_openai(client, panel, "m1", question)

    reply = json.loads(r.json()["choices"][0]["message"]["content"])
    assert reply == {"model": "m1", "call": 2, "echo": "q" * 200, "other": "{x}"}


async def test_default_answer_is_labelled_and_deterministic(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    texts = [
        answer_text("openai", (await ask_openai(client, panel, "m1", "same question")).json())
        for _ in range(2)
    ]
    other = answer_text("openai", (await ask_openai(client, panel, "m1", "another one")).json())
    elsewhere = answer_text("gemini", (await ask_gemini(client, panel, "g1", "same question")).json())

    assert texts[0] == texts[1]
    assert texts[0].startswith("[simulated m1] ")
    assert other != texts[0]
    assert elsewhere == texts[0].replace("[simulated m1]", "[simulated g1]")


async def test_default_answer_is_cut_at_the_requested_token_limit(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    r = await ask_openai(client, panel, "m1", max_completion_tokens=3)

    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] == "[simulated m1] "[:12]


async def test_a_reply_latency_delays_the_answer_but_it_still_arrives(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    script(panel, "slow", Reply(text="eventually", latency_ms=20))

    r = await ask_anthropic(client, panel, "slow")

    assert r.json()["content"][0]["text"] == "eventually"


async def test_a_client_that_hangs_up_while_the_model_thinks_is_recorded_as_aborted_at_once(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    script(panel, "slow", Reply(text="never sent", latency_ms=30_000))

    with anyio.move_on_after(0.2):  # the caller gives up; httpx closes the connection
        await ask_openai(client, panel, "slow")
    with anyio.fail_after(5):  # long before the 30 s "thinking" time is over
        while not panel.aborted:
            await anyio.sleep(0.01)
    answered = await ask_openai(client, panel, "quick")

    assert answered.status_code == 200
    assert panel.aborted == ["slow"]
    assert panel.calls("slow") == 1


# ------------------------------------------------------------------------- faults


async def test_malformed_fault_sends_http_200_with_invalid_json(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    script(panel, "m1", Reply(fault="malformed"))

    r = await ask_openai(client, panel, "m1")

    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    with pytest.raises(json.JSONDecodeError):
        r.json()


async def test_drop_fault_reaches_the_client_as_a_transport_error(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    script(panel, "m1", Reply(fault="drop"), Reply(text="back"))

    with pytest.raises(httpx.TransportError):
        await ask_openai(client, panel, "m1")
    after = await ask_openai(client, panel, "m1")

    assert after.json()["choices"][0]["message"]["content"] == "back"


@pytest.mark.parametrize(
    ("kind", "answer_key", "kept_key"),
    [
        ("openai", "choices", "usage"),
        ("anthropic", "content", "usage"),
        ("gemini", "candidates", "usageMetadata"),
    ],
)
async def test_missing_fields_fault_keeps_the_envelope_without_the_answer(
    panel: SimPanel, client: httpx.AsyncClient, kind: Kind, answer_key: str, kept_key: str
) -> None:
    script(panel, "m1", Reply(fault="missing_fields"))

    r = await ask(client, panel, kind, "m1")

    assert r.status_code == 200
    assert answer_key not in r.json()
    assert kept_key in r.json()


@pytest.mark.parametrize(
    ("kind", "reason_path", "length_reason"),
    [
        ("openai", ("choices", 0, "finish_reason"), "length"),
        ("anthropic", ("stop_reason",), "max_tokens"),
        ("gemini", ("candidates", 0, "finishReason"), "MAX_TOKENS"),
    ],
)
async def test_empty_fault_is_a_well_formed_answer_with_no_text_cut_by_the_limit(
    panel: SimPanel,
    client: httpx.AsyncClient,
    kind: Kind,
    reason_path: tuple[str | int, ...],
    length_reason: str,
) -> None:
    script(panel, "m1", Reply(fault="empty", reasoning_tokens=64))

    body = (await ask(client, panel, kind, "m1")).json()

    reason: Any = body
    for key in reason_path:
        reason = reason[key]
    assert reason == length_reason
    assert answer_text(kind, body) == ""


async def test_gemini_empty_answer_has_no_parts_and_no_candidate_token_count(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    script(panel, "g1", Reply(fault="empty", reasoning_tokens=64))

    body = (await ask_gemini(client, panel, "g1")).json()

    assert body["candidates"][0]["content"] == {"role": "model"}
    assert "candidatesTokenCount" not in body["usageMetadata"]
    assert body["usageMetadata"]["thoughtsTokenCount"] == 64


# ------------------------------------------------------------------------- errors


async def test_openai_429_is_a_rate_limit_error_with_the_scripted_retry_after(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    script(panel, "m1", Reply(status=429, headers={"Retry-After": "1", "retry-after-ms": "5"}))

    r = await ask_openai(client, panel, "m1")

    assert r.status_code == 429
    assert (r.headers["retry-after"], r.headers["retry-after-ms"]) == ("1", "5")
    assert r.headers["content-type"] == "application/json; charset=utf-8"
    assert r.text.endswith("}\n")
    assert r.text.startswith('{\n    "error": {\n        "message"')  # 4-space layout
    error = r.json()["error"]
    assert list(error) == ["message", "type", "param", "code"]
    assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")


async def test_openai_insufficient_quota_names_itself_in_type_and_code(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    script(panel, "m1", Reply(status=429, error_type="insufficient_quota"))

    error = (await ask_openai(client, panel, "m1")).json()["error"]

    assert (error["type"], error["code"]) == ("insufficient_quota", "insufficient_quota")
    assert "quota" in error["message"]


async def test_anthropic_529_is_overloaded_and_tells_the_client_to_retry(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    script(panel, "claude-x", Reply(status=529))

    r = await ask_anthropic(client, panel, "claude-x")

    assert r.status_code == 529
    assert r.headers["x-should-retry"] == "true"
    assert "\n" not in r.text  # Anthropic errors are compact one-line JSON
    body = r.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "overloaded_error"
    assert body["request_id"] == r.headers["request-id"]


async def test_gemini_429_carries_retry_info_in_the_error_details(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    script(panel, "g1", Reply(status=429, retry_delay="7s"))

    r = await ask_gemini(client, panel, "g1")

    assert r.status_code == 429
    assert r.text.startswith('{\n  "error"')  # Google errors are 2-space pretty JSON
    error = r.json()["error"]
    assert (error["code"], error["status"]) == (429, "RESOURCE_EXHAUSTED")
    assert error["details"] == [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7s"}]


async def test_scripted_error_type_and_message_are_sent_as_written(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    script(panel, "g1", Reply(status=503, error_type="UNAVAILABLE", error_message="busy"))

    error = (await ask_gemini(client, panel, "g1")).json()["error"]

    assert (error["code"], error["status"], error["message"]) == (503, "UNAVAILABLE", "busy")


@pytest.mark.parametrize("model", ["o3-mini", "openai/gpt-5-mini", "gpt-5", "gpt-5-2025-08-07"])
async def test_openai_reasoning_models_reject_max_tokens_and_non_default_temperature(
    panel: SimPanel, client: httpx.AsyncClient, model: str
) -> None:
    with_max_tokens = await ask_openai(client, panel, model, max_tokens=100)
    with_temperature = await ask_openai(client, panel, model, temperature=0.2)
    with_defaults = await ask_openai(client, panel, model, temperature=1, max_completion_tokens=9)

    assert with_max_tokens.status_code == 400
    assert with_max_tokens.json()["error"]["type"] == "invalid_request_error"
    assert with_max_tokens.json()["error"]["code"] == "unsupported_parameter"
    assert with_max_tokens.json()["error"]["param"] == "max_tokens"
    assert with_temperature.status_code == 400
    assert with_temperature.json()["error"]["code"] == "unsupported_value"
    assert with_temperature.json()["error"]["param"] == "temperature"
    assert "Only the default (1) value is supported." in with_temperature.json()["error"]["message"]
    assert with_defaults.status_code == 200
    assert panel.calls(model) == 1  # rejected requests never reach the script


@pytest.mark.parametrize("model", ["gpt-4o", "gpt-5.1", "gpt-5-chat-latest"])
async def test_openai_sampling_models_accept_max_tokens_and_temperature(
    panel: SimPanel, client: httpx.AsyncClient, model: str
) -> None:
    r = await ask_openai(client, panel, model, max_tokens=100, temperature=0.2)

    assert r.status_code == 200


async def test_openai_rejects_an_empty_message_list(panel: SimPanel, client: httpx.AsyncClient) -> None:
    url = panel.base_url("openai") + "/chat/completions"

    r = await client.post(url, json={"model": "gpt-4o", "messages": []})

    assert r.status_code == 400
    assert r.json()["error"]["code"] == "empty_array"


async def test_anthropic_rejects_a_system_role_message(panel: SimPanel, client: httpx.AsyncClient) -> None:
    messages = [{"role": "system", "content": "be nice"}, {"role": "user", "content": "hi"}]

    r = await ask_anthropic(client, panel, "claude-x", messages=messages)

    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert "top-level `system`" in r.json()["error"]["message"]


async def test_anthropic_requires_the_version_header_and_max_tokens(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    url = panel.base_url("anthropic") + "/v1/messages"
    no_version = await ask_anthropic(client, panel, "claude-x", headers={"x-api-key": "k"})
    no_max_tokens = await client.post(url, json=openai_body("claude-x", "hi"), headers=ANTHROPIC_HEADERS)

    assert no_version.status_code == 400
    assert "anthropic-version" in no_version.json()["error"]["message"]
    assert no_max_tokens.status_code == 400
    assert "max_tokens" in no_max_tokens.json()["error"]["message"]


async def test_gemini_rejects_a_role_other_than_user_or_model(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    contents = [{"role": "assistant", "parts": [{"text": "hi"}]}]

    r = await ask_gemini(client, panel, "g1", contents=contents)

    assert r.status_code == 400
    assert r.json()["error"]["status"] == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("kind", "suffix"),
    [
        ("openai", "/chat/completions"),
        ("anthropic", "/v1/messages"),
        ("gemini", "/v1beta/models/g1:generateContent"),
    ],
)
async def test_a_body_that_is_not_json_is_a_400_in_the_format_of_the_request(
    panel: SimPanel, client: httpx.AsyncClient, kind: Kind, suffix: str
) -> None:
    r = await client.post(panel.base_url(kind) + suffix, content=b"{not json", headers=ANTHROPIC_HEADERS)

    assert r.status_code == 400
    body = r.json()
    if kind == "anthropic":
        assert body["type"] == "error"
    else:
        assert "message" in body["error"]
    assert panel.received[-1].body is None


async def test_an_unknown_path_is_a_json_404(panel: SimPanel, client: httpx.AsyncClient) -> None:
    r = await client.post(f"http://127.0.0.1:{panel.port}/nowhere", json={})

    assert r.status_code == 404
    assert r.json()["error"]["code"] == 404
    assert panel.received == []


async def test_an_api_path_answers_only_post(panel: SimPanel, client: httpx.AsyncClient) -> None:
    r = await client.get(panel.base_url("openai") + "/chat/completions")

    assert r.status_code == 404
    assert "no route for GET" in r.json()["error"]["message"]


# ------------------------------------------------------------------------- recording and control


async def test_recording_keeps_requests_in_order_with_every_key_masked(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    openai_key, anthropic_key, gemini_key = "sk-raw-openai-1", "sk-ant-raw-2", "AIza-raw-3"
    await client.post(
        panel.base_url("openai") + "/chat/completions",
        json=openai_body("m1", "hi"),
        headers={"Authorization": f"Bearer {openai_key}", "api-key": openai_key},
    )
    await ask_anthropic(client, panel, "claude-x", headers={**ANTHROPIC_HEADERS, "x-api-key": anthropic_key})
    url = f"{panel.base_url('gemini')}/v1beta/models/g1:generateContent?key={gemini_key}"
    await client.post(url, json={"contents": [{"parts": [{"text": "hi"}]}]})
    listing = (await client.get(f"http://127.0.0.1:{panel.port}/_sim/requests")).text

    first, second, third = panel.received
    assert isinstance(first, ReceivedRequest)
    assert [r.kind for r in panel.received] == ["openai", "anthropic", "gemini"]
    assert [r.model for r in panel.received] == ["m1", "claude-x", "g1"]
    assert first.headers["authorization"] == mask_secret(f"Bearer {openai_key}")
    assert first.headers["api-key"] == mask_secret(openai_key)
    assert first.body == openai_body("m1", "hi")
    assert second.headers["x-api-key"] == mask_secret(anthropic_key)
    assert second.headers["anthropic-version"] == "2023-06-01"
    assert third.path.endswith(f":generateContent?key={mask_secret(gemini_key)}")
    for raw in (openai_key, anthropic_key, gemini_key):
        assert raw not in repr(panel.received)
        assert raw not in listing
    assert json.loads(listing)[2]["path"] == third.path


async def test_control_endpoints_report_health_and_calls_and_reset_everything(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    control = f"http://127.0.0.1:{panel.port}/_sim"
    script(panel, "m1", Reply(text="scripted"))
    await ask_openai(client, panel, "m1")

    health = await client.get(f"{control}/health")
    calls = await client.get(f"{control}/calls")
    reset = await client.post(f"{control}/reset")
    after = await ask_openai(client, panel, "m1")

    assert health.json() == {"ok": True, "simulated": True}
    assert health.headers["server"] == "conclave-sim"
    assert calls.json() == {"m1": 1}
    assert reset.status_code == 200
    assert after.json()["choices"][0]["message"]["content"].startswith("[simulated m1]")
    assert panel.calls("m1") == 1
    assert len(panel.received) == 1


async def test_put_scenario_scripts_a_model_over_http_and_refuses_a_bad_one(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    control = f"http://127.0.0.1:{panel.port}/_sim/scenarios"
    scenario = {
        "replies": [{"status": 429, "headers": {"retry-after": "1"}}, {"text": "ok {call}"}],
        "rules": [{"contains": "magic", "reply": {"text": "ruled"}}],
        "latency_ms": 0,
    }

    put = await client.put(f"{control}/vendor/model-1", json=scenario)
    bad_field = await client.put(f"{control}/m2", json={"replies": [{"txt": "typo"}]})
    bad_fault = await client.put(f"{control}/m2", json={"replies": [{"fault": "explode"}]})
    not_json = await client.put(f"{control}/m2", content=b"{")
    listing = (await client.get(control)).json()
    answers = [await ask_openai(client, panel, "vendor/model-1") for _ in range(2)]

    assert put.json() == {"ok": True, "model": "vendor/model-1"}
    assert [r.status_code for r in (bad_field, bad_fault, not_json)] == [400, 400, 400]
    assert "txt" in bad_field.json()["error"]
    assert list(listing) == ["vendor/model-1"]
    assert [a.status_code for a in answers] == [429, 200]
    assert answers[1].json()["choices"][0]["message"]["content"] == "ok 2"


def test_scenario_survives_a_round_trip_through_a_dict() -> None:
    scenario = Scenario(
        replies=(Reply(text="a", headers={"retry-after": "2"}, fault="empty"), Reply(status=503)),
        rules=(Rule(contains="x", reply=Reply(cached_tokens=4, latency_ms=1.5)),),
        latency_ms=3,
    )

    assert Scenario.from_dict(json.loads(json.dumps(scenario.to_dict()))) == scenario


@pytest.mark.parametrize(
    "bad",
    [
        {"replies": [{"status": "429"}]},
        {"replies": [{"status": 42}]},
        {"replies": [{"reasoning_tokens": True}]},
        {"replies": [{"finish_reason": "tool_calls"}]},
        {"replies": [{"headers": {"retry-after": 1}}]},
        {"rules": [{"contains": "x"}]},
        {"latency_ms": -1},
        {"replies": "not a list"},
        ["not an object"],
    ],
)
def test_scenario_from_dict_refuses_what_a_script_cannot_mean(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"."):
        Scenario.from_dict(bad)


def test_running_the_module_prints_the_three_base_urls_and_stops_on_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "conclave.app.sim", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline().split() for _ in range(3)]
        urls = dict(lines)
        port = int(urls["openai"].rsplit(":", 1)[1].split("/")[0])
        health = httpx.get(f"http://127.0.0.1:{port}/_sim/health", timeout=5.0, trust_env=False)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=5)

    assert [name for name, _ in lines] == ["openai", "anthropic", "gemini"]
    assert urls["openai"] == f"http://127.0.0.1:{port}/openai/v1"
    assert urls["anthropic"] == f"http://127.0.0.1:{port}/anthropic"
    assert urls["gemini"] == f"http://127.0.0.1:{port}/gemini"
    assert health.json()["simulated"] is True
    assert code == 0
