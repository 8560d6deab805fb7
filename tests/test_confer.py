"""`confer` end to end: three simulated providers of the three wire kinds, over loopback HTTP."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiohttp import web

import conclave
from conclave.app.runtime import Runtime, open_runtime
from conclave.app.sim import NativeCall, Reply, Rule, Scenario, SimPanel
from conclave.core.errors import InvalidArguments
from conclave.deliberation.confer import confer
from conclave.schema.config import Config
from conclave.schema.schemas import first_error
from tests.support import read_events

pytestmark = pytest.mark.anyio

PRICE = {"input_per_mtok": 1.0, "output_per_mtok": 4.0}



@pytest.fixture
def open_rt(make_config: Callable[..., Config], panel: SimPanel, tmp_path: Path) -> Callable[..., Any]:
    def open_for(
        *, env: dict[str, str] | None = None, extra: dict[str, Any] | None = None, **sections: Any
    ) -> Any:
        providers = {
            "alpha": {
                "kind": "openai",
                "model": "m-alpha",
                "base_url": panel.base_url("openai"),
                "price": PRICE,
            },
            "beta": {
                "kind": "anthropic",
                "model": "m-beta",
                "base_url": panel.base_url("anthropic"),
                "price": PRICE,
            },
            "gamma": {
                "kind": "gemini",
                "model": "m-gamma",
                "base_url": panel.base_url("gemini"),
                "price": PRICE,
            },
            **(extra or {}),
        }
        sections.setdefault("transcripts", {"dir": str(tmp_path / "transcripts")})
        config = make_config(providers, env=env, retry={"max_attempts": 2}, **sections)
        config = replace(config, panel=("alpha", "beta", "gamma"))
        return open_runtime(config)

    return open_for


async def run_confer(rt: Runtime, **args: Any) -> dict[str, Any]:
    result = (await confer(rt, {"question": "Which option should we pick?", **args})).to_dict()
    error = first_error("confer.output.json", result)
    assert error is None, f"{error.message} at {list(error.absolute_path)}" if error else ""
    return result


def by_provider(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["provider"]: a for a in result["answers"]}


async def test_every_panel_member_answers_in_parallel_with_totals(
    open_rt: Callable[..., Any], panel: SimPanel, events_path: Path, tmp_path: Path
) -> None:
    async with open_rt() as rt:
        result = await run_confer(rt, session_id="happy-1")
    answers = by_provider(result)
    assert [a["status"] for a in result["answers"]] == ["ok", "ok", "ok"]
    assert answers["alpha"]["text"].startswith("[simulated m-alpha]")
    assert answers["gamma"]["model"] == "m-gamma"
    assert all(a["hops"] == 1 for a in result["answers"])
    assert "inner_tool_calls" not in answers["alpha"] and "worker_tools" not in result
    assert result["degraded"] is False and result["degraded_reasons"] == []
    assert result["usage"]["input_tokens"] == sum(a["usage"]["input_tokens"] for a in result["answers"])
    assert result["usage"]["cost_usd"] == pytest.approx(
        sum(a["usage"]["cost_usd"] for a in result["answers"])
    )
    assert result["session_id"] == "happy-1"
    assert sorted(r.model for r in panel.received) == ["m-alpha", "m-beta", "m-gamma"]
    events = read_events(events_path)
    assert {e["session_id"] for e in events if e["event"] != "breaker_closed"} == {"happy-1"}
    assert [e["event"] for e in events if e["event"].startswith("session")] == [
        "session_start",
        "session_end",
    ]
    end = next(e for e in events if e["event"] == "session_end")
    assert (end["status"], end["ok"]) == ("ok", 3)
    transcript = json.loads(Path(end["transcript"]).read_text())
    assert transcript["result"] == result
    assert len(transcript["hops"]["beta"]) == 1
    assert "question" not in json.dumps([e for e in events if e["event"] == "session_start"])


async def test_one_provider_failing_after_retries_leaves_the_others_standing(
    open_rt: Callable[..., Any], panel: SimPanel
) -> None:
    panel.set_scenario("m-beta", Scenario(replies=(Reply(status=500),)))
    async with open_rt() as rt:
        result = await run_confer(rt)
    answers = by_provider(result)
    assert (answers["beta"]["status"], answers["beta"]["error"]["code"]) == ("error", "server_error")
    assert answers["beta"]["text"] is None
    assert answers["alpha"]["status"] == answers["gamma"]["status"] == "ok"
    assert result["degraded"] is True
    assert result["degraded_reasons"] == [
        {"provider": "beta", "role": None, "status": "error", "code": "server_error"}
    ]
    assert panel.calls("m-beta") == 2


async def test_a_provider_slower_than_the_deadline_is_timeout_and_the_call_returns(
    open_rt: Callable[..., Any], panel: SimPanel
) -> None:
    panel.set_scenario("m-gamma", Scenario(latency_ms=5000))
    async with open_rt() as rt:
        result = await run_confer(rt, timeout_seconds=0.5)
    answers = by_provider(result)
    assert answers["gamma"]["status"] == "timeout"
    assert answers["alpha"]["status"] == "ok"
    assert result["degraded_reasons"][0]["provider"] == "gamma"


async def test_unknown_and_keyless_providers_are_skipped_naming_the_fix(
    open_rt: Callable[..., Any], panel: SimPanel
) -> None:
    keyed = {
        "keyed": {
            "kind": "openai",
            "model": "m-k",
            "base_url": panel.base_url("openai"),
            "api_key_env": "KEYED_API_KEY",
        }
    }
    async with open_rt(extra=keyed) as rt:
        result = await run_confer(rt, providers=["alpha", "nobody", "keyed"])
    answers = by_provider(result)
    assert (
        answers["nobody"]["status"] == "skipped" and answers["nobody"]["error"]["code"] == "unknown_provider"
    )
    assert answers["keyed"]["status"] == "skipped"
    assert answers["keyed"]["error"]["code"] == "missing_api_key"
    assert "KEYED_API_KEY" in answers["keyed"]["error"]["message"]
    assert panel.calls("m-k") == 0
    assert result["degraded"] is True and len(result["degraded_reasons"]) == 2


async def test_an_empty_completion_is_an_error_keeping_the_finish_reason(
    open_rt: Callable[..., Any], panel: SimPanel
) -> None:
    panel.set_scenario("m-alpha", Scenario(replies=(Reply(fault="empty"),)))
    async with open_rt() as rt:
        answer = by_provider(await run_confer(rt))["alpha"]
    assert (answer["status"], answer["error"]["code"], answer["finish_reason"]) == (
        "error",
        "empty_completion",
        "length",
    )


async def test_an_open_breaker_is_reported_as_breaker_open(
    open_rt: Callable[..., Any], panel: SimPanel
) -> None:
    panel.set_scenario("m-alpha", Scenario(replies=(Reply(status=503),)))
    async with open_rt(breakers={"failure_threshold": 1}) as rt:
        await run_confer(rt, providers=["alpha"])
        result = await run_confer(rt, providers=["alpha"])
    assert result["answers"][0]["status"] == "breaker_open"
    assert result["degraded_reasons"][0]["status"] == "breaker_open"


async def test_worker_tools_split_is_echoed_and_rejected_names_are_not_an_error(
    open_rt: Callable[..., Any],
) -> None:
    async with open_rt() as rt:
        result = await run_confer(rt, worker_tools=["verify", "confer", "shell", "verify"])
    assert result["worker_tools"]["accepted"] == ["verify"]
    assert result["worker_tools"]["rejected"] == ["confer", "shell"]
    assert result["worker_tools"]["hop_budget"] == 2
    assert all(a["inner_tool_calls"] == [] for a in result["answers"])


async def test_only_rejected_worker_tools_means_a_plain_call_with_the_block(
    open_rt: Callable[..., Any], panel: SimPanel
) -> None:
    async with open_rt() as rt:
        result = await run_confer(rt, worker_tools=["coordinate"])
    assert result["worker_tools"]["accepted"] == []
    assert "<tool_call>" not in json.dumps([r.body for r in panel.received])


async def test_a_tripped_warn_cap_is_aggregated_per_provider_with_an_operator_prompt(
    open_rt: Callable[..., Any], panel: SimPanel
) -> None:
    async with open_rt() as rt:
        result = await run_confer(
            rt,
            worker_tools=["fetch", "verify"],
            worker_tool_cost_cap_usd=1e-9,
            worker_tool_cost_cap_mode="warn",
        )
    cap = result["worker_tools"]["cost_cap"]
    assert (cap["mode"], cap["exceeded"], cap["blocked"]) == ("warn", True, False)
    assert set(cap["per_provider"]) == {"alpha", "beta", "gamma"}
    assert cap["observed_usd"] == pytest.approx(sum(b["observed_usd"] for b in cap["per_provider"].values()))
    assert "enforce" in cap["operator_prompt"]
    assert all(a["cost_cap"]["exceeded"] for a in result["answers"])


async def test_an_unpriced_providers_cost_cap_reports_its_cost_as_unknown_never_zero(
    open_rt: Callable[..., Any], panel: SimPanel
) -> None:
    unpriced = {"free": {"kind": "openai", "model": "m-free", "base_url": panel.base_url("openai")}}
    async with open_rt(extra=unpriced) as rt:
        result = await run_confer(
            rt, providers=["alpha", "free"], worker_tools=["verify"], worker_tool_cost_cap_usd=1.0
        )
    cap = result["worker_tools"]["cost_cap"]
    free, priced = cap["per_provider"]["free"], cap["per_provider"]["alpha"]
    assert (free["observed_usd"], free["enforceable"]) == (None, False)
    assert priced["observed_usd"] > 0 and priced["enforceable"] is True
    assert (cap["observed_usd"], cap["enforceable"]) == (None, False)
    assert "cannot be enforced" in cap["note"]
    assert result["answers"][1]["cost_cap"]["observed_usd"] is None
    assert "price_unknown" in result["warnings"]


CONTAINS_CHECK = {"checks": [{"type": "contains", "text": "abc", "substring": "b"}]}


@pytest.mark.parametrize("mode", ["auto", "tags"])
async def test_worker_tools_run_inside_confer(
    open_rt: Callable[..., Any], panel: SimPanel, mode: str
) -> None:
    if mode == "tags":
        call = Reply(text=f"<tool_call>{json.dumps({'name': 'verify', 'args': CONTAINS_CHECK})}</tool_call>")
    else:  # auto is native for the openai kind: the call comes back structured
        call = Reply(tool_calls=(NativeCall("verify", CONTAINS_CHECK),))
    panel.set_scenario(
        "m-alpha", Scenario(replies=(call,), rules=(Rule("<tool_result", Reply(text="verified")),))
    )
    async with open_rt() as rt:
        result = await run_confer(rt, worker_tools=["verify"], worker_tool_mode=mode)
    alpha = by_provider(result)["alpha"]
    assert (alpha["text"], alpha["hops"], alpha["tool_mode"]) == (
        "verified",
        2,
        "native" if mode == "auto" else "tags",
    )
    assert alpha["inner_tool_calls"] == [{"hop": 1, "name": "verify", "status": "ok", "reason": None}]


async def test_dry_run_calls_nothing_and_bounds_the_real_cost(
    open_rt: Callable[..., Any], panel: SimPanel
) -> None:
    args = {"max_tokens": 300, "worker_tools": ["verify"]}
    async with open_rt() as rt:
        planned = await run_confer(rt, dry_run=True, **args)
        assert panel.received == []
        real = await run_confer(rt, **args)
    plan = planned["plan"]
    assert planned["dry_run"] is True and planned["answers"] == []
    assert [c["provider"] for c in plan["calls"]] == ["alpha", "beta", "gamma"]
    assert plan["max_calls"] == 3 * 4
    assert plan["max_cost_usd"] >= real["usage"]["cost_usd"] > 0
    for call in plan["calls"]:
        spent = by_provider(real)[call["provider"]]["usage"]
        assert call["max_input_tokens"] >= spent["input_tokens"]


async def test_dry_run_says_when_a_price_is_unknown(open_rt: Callable[..., Any], panel: SimPanel) -> None:
    unpriced = {"free": {"kind": "openai", "model": "m-free", "base_url": panel.base_url("openai")}}
    async with open_rt(extra=unpriced) as rt:
        plan = (await run_confer(rt, dry_run=True, providers=["alpha", "free"]))["plan"]
    assert plan["max_cost_usd"] is None
    assert any("free" in reason for reason in plan["reasons"])


async def test_invalid_arguments_name_the_failing_path(open_rt: Callable[..., Any]) -> None:
    async with open_rt() as rt, conclave.Conclave(rt.config) as client:
        with pytest.raises(InvalidArguments) as info:
            await client.confer("q", providers="alpha")  # type: ignore[arg-type]
    assert info.value.path == "$.providers"


async def test_progress_reports_one_step_per_provider(open_rt: Callable[..., Any]) -> None:
    steps: list[dict[str, Any]] = []

    async def sink(step: Any) -> None:
        steps.append(dict(step))

    async with open_rt() as rt:
        await confer(rt, {"question": "q"}, progress=sink)
    assert sorted(s["provider"] for s in steps) == ["alpha", "beta", "gamma"]
    assert [s["done"] for s in steps] == [1, 2, 3]


async def test_a_bug_in_one_providers_turn_costs_that_answer_only(
    open_rt: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a provider failure but a defect (here the adapter's parser raising something no
    provider error maps to): that member's answer is `internal_error`, with secrets redacted;
    the others answer, and the call returns."""
    secret = "sk-internal-bug-secret-0123456789abcdef"  # redacted by its shape
    async with open_rt() as rt:
        beta = rt.providers.get("beta")

        def broken(*_args: Any) -> Any:
            raise RuntimeError(f"parser bug near {secret}")

        monkeypatch.setattr(beta.adapter, "parse", broken)
        result = await run_confer(rt)
    answers = by_provider(result)
    assert answers["beta"]["status"] == "error"
    assert answers["beta"]["error"]["code"] == "internal_error"
    assert "RuntimeError: parser bug near" in answers["beta"]["error"]["message"]
    assert secret not in json.dumps(result)
    assert answers["alpha"]["status"] == answers["gamma"]["status"] == "ok"
    assert result["degraded"] is True


_ANSWER_OK = {  # an OpenAI-shaped 200 body, for the local provider servers below
    "choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    "model": "m",
}


class _CountingProvider:
    """A local OpenAI-shaped server that holds each request a moment and records how many it
    was holding at once."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.most_at_once = 0
        self.served = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.in_flight += 1
        self.most_at_once = max(self.most_at_once, self.in_flight)
        try:
            await request.read()
            await anyio.sleep(0.05)  # long enough for every unlimited call to arrive meanwhile
        finally:
            self.in_flight -= 1
        self.served += 1
        return web.json_response(_ANSWER_OK)


@pytest.mark.parametrize("max_concurrency", [1, 2])
async def test_max_concurrency_bounds_the_provider_calls_in_flight(
    make_config: Callable[..., Config], max_concurrency: int
) -> None:
    provider = _CountingProvider()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", provider.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        members = {
            f"m{i}": {"kind": "openai", "model": "m", "base_url": f"http://127.0.0.1:{port}/v1"}
            for i in range(5)
        }
        config = make_config(members, limits={"max_concurrency": max_concurrency})
        async with open_runtime(config) as runtime:
            result = (await confer(runtime, {"question": "Which?", "providers": list(members)})).to_dict()
    finally:
        await runner.cleanup()
    assert [a["status"] for a in result["answers"]] == ["ok"] * 5
    assert provider.served == 5
    assert provider.most_at_once == max_concurrency


async def test_a_request_id_in_any_case_and_any_bytes_reaches_the_event_log(
    make_config: Callable[..., Config], events_path: Path
) -> None:
    """aiohttp hands header bytes that are not UTF-8 over as lone surrogates, which no JSON
    encoder takes; the id must still be found (whatever the name's case) and be written."""
    body = json.dumps(_ANSWER_OK).encode()
    ids = {b"utf8": "req-é".encode(), b"latin1": b"req-\xe9\xff"}

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        request = await reader.readexactly(length)
        which = b"utf8" if b"utf8" in request else b"latin1"
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Request-ID: "
            + ids[which]
            + b"\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        member = {"kind": "openai", "model": "m", "base_url": f"http://127.0.0.1:{port}/v1"}
        config = make_config({"a": member})
        async with open_runtime(config) as runtime:
            for question in ("utf8", "latin1"):
                result = (await confer(runtime, {"question": question, "providers": ["a"]})).to_dict()
                assert result["answers"][0]["status"] == "ok"
    finally:
        server.close()
    calls = [e for e in read_events(events_path) if e["event"] == "provider_call"]
    assert [c["request_id"] for c in calls] == ["req-é", "req-éÿ"]
