"""`confer`'s `quorum`, `grace_seconds` and `on_partial` over the simulated panel: once the quorum
has answered, the members still out get the grace period, then are stopped (their requests cancelled
upstream) as `late`; review and synthesis run on what arrived; `on_partial: "error"` makes a short
result an error carrying its answers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

import conclave
from conclave.app.render import render_confer
from conclave.app.runtime import open_runtime
from conclave.app.sim import Reply, Scenario, SimPanel
from conclave.core.errors import InvalidArguments, PartialResult
from conclave.deliberation.confer import confer
from conclave.deliberation.coordinate import coordinate
from conclave.deliberation.results import ConferResult
from conclave.schema.config import Config
from conclave.schema.schemas import first_error
from tests.server_support import StdioServer, panel_config, panel_providers, start_server
from tests.support import read_events

pytestmark = pytest.mark.anyio

SLOW_MS = 5000


@pytest.fixture
def config(make_config: Callable[..., Config], panel: SimPanel) -> Config:
    made = make_config(
        panel_providers(panel),
        retry={"max_attempts": 1},
        roles={"proposer": "alpha", "critics": ["beta", "gamma"], "synthesizer": "alpha"},
    )
    return replace(made, panel=("alpha", "beta", "gamma"))


async def run(config: Config, **args: Any) -> dict[str, Any]:
    async with open_runtime(config) as rt:
        result = (await confer(rt, {"question": "Which option?", **args})).to_dict()
    error = first_error("confer.output.json", result)
    assert error is None, f"{error.message} at {list(error.absolute_path)}" if error else ""
    return result


async def aborted(panel: SimPanel, model: str) -> bool:
    """Whether the panel saw `model`'s caller hang up (it notices a moment after the cancel)."""
    with anyio.move_on_after(3):
        while model not in panel.aborted:
            await anyio.sleep(0.02)
    return model in panel.aborted


def statuses(result: dict[str, Any]) -> dict[str, str]:
    return {a["provider"]: a["status"] for a in result["answers"]}


async def test_a_member_still_out_after_the_quorum_and_its_grace_is_stopped_as_late(
    config: Config, panel: SimPanel, events_path: Path
) -> None:
    panel.set_scenario("m-gamma", Scenario(latency_ms=SLOW_MS))
    result = await run(config, quorum=2, grace_seconds=0.2, timeout_seconds=30)
    assert statuses(result) == {"alpha": "ok", "beta": "ok", "gamma": "late"}
    gamma = result["answers"][2]
    assert gamma["error"]["code"] == "late" and gamma["text"] is None
    [reason] = result["degraded_reasons"]
    assert {k: reason[k] for k in ("provider", "role", "status", "code")} == {
        "provider": "gamma",
        "role": None,
        "status": "late",
        "code": "late",
    }
    assert 0 < reason["elapsed_ms"] < SLOW_MS, "stopped when the grace ran out, not when it would answer"
    assert result["degraded"] is True
    assert await aborted(panel, "m-gamma"), "the late member's request was cancelled upstream"
    [event] = [e for e in read_events(events_path) if e["event"] == "member_late"]
    assert event["provider"] == "gamma" and event["elapsed_ms"] == reason["elapsed_ms"]
    [end] = [e for e in read_events(events_path) if e["event"] == "session_end"]
    assert end["degraded_reasons"][0]["status"] == "late"


async def test_grace_without_a_quorum_changes_nothing(config: Config, panel: SimPanel) -> None:
    panel.set_scenario("m-gamma", Scenario(latency_ms=400))
    result = await run(config, grace_seconds=0.05)
    assert statuses(result) == {"alpha": "ok", "beta": "ok", "gamma": "ok"}
    assert panel.aborted == []


async def test_with_every_member_fast_nobody_is_late(config: Config, panel: SimPanel) -> None:
    result = await run(config, quorum=2, grace_seconds=30)
    assert statuses(result) == {"alpha": "ok", "beta": "ok", "gamma": "ok"}
    assert result["degraded"] is False and result["degraded_reasons"] == []
    assert panel.aborted == []
    assert result["latency_ms"] < 30_000, "every member answered: the call returns without the grace"


async def test_without_a_quorum_ok_the_call_waits_for_everyone_as_before(
    config: Config, panel: SimPanel
) -> None:
    panel.set_scenario("m-alpha", Scenario(replies=[Reply(status=500)]))
    panel.set_scenario("m-beta", Scenario(replies=[Reply(status=500)]))
    panel.set_scenario("m-gamma", Scenario(latency_ms=300))
    result = await run(config, quorum=2, grace_seconds=0.05)
    assert statuses(result) == {"alpha": "error", "beta": "error", "gamma": "ok"}
    assert panel.aborted == []


async def test_review_and_synthesis_run_on_the_members_that_arrived(config: Config, panel: SimPanel) -> None:
    panel.set_scenario("m-gamma", Scenario(latency_ms=SLOW_MS))
    result = await run(config, quorum=2, grace_seconds=0.2, review=True, synthesize=True, timeout_seconds=30)
    assert statuses(result)["gamma"] == "late"
    assert {r["reviewer"] for r in result["review"]["rankings"]} == {"alpha", "beta"}
    assert {s["provider"] for s in result["review"]["aggregate"]} == {"alpha", "beta"}
    assert result["synthesis"]["status"] == "ok"
    assert [r["status"] for r in result["degraded_reasons"]] == ["late"], "only gamma is missing"


async def test_a_quorum_larger_than_the_members_is_invalid(config: Config) -> None:
    with pytest.raises(InvalidArguments) as info:
        await run(config, quorum=3, providers=["alpha", "beta"])
    assert info.value.path == "$.quorum"


async def test_on_partial_error_raises_from_the_python_api_with_the_partial_answers(
    config: Config, panel: SimPanel
) -> None:
    panel.set_scenario("m-beta", Scenario(replies=[Reply(status=500)]))
    async with conclave.Conclave(config) as client:
        with pytest.raises(PartialResult) as info:
            await client.confer("Which option?", on_partial="error")
        assert info.value.reason == "partial"
        assert [a["status"] for a in info.value.answers] == ["ok", "error", "ok"]
        assert isinstance(info.value.result, ConferResult) and info.value.result.degraded
        # A quorum met is not partial, whoever else is missing.
        met = await client.confer("Which option?", on_partial="error", quorum=2)
        assert [a.status for a in met.answers] == ["ok", "error", "ok"]


async def test_late_reads_plainly_in_the_cli_rendering(config: Config, panel: SimPanel) -> None:
    panel.set_scenario("m-gamma", Scenario(latency_ms=SLOW_MS))
    result = await run(config, quorum=2, grace_seconds=0.1, timeout_seconds=30)
    shown = render_confer(result)
    assert "━━ gamma · m-gamma · late" in shown
    assert "gamma: late (stopped at" in shown


async def test_on_partial_error_over_stdio_is_an_mcp_error_and_a_plain_method_error(
    panel: SimPanel, tmp_path: Path
) -> None:
    panel.set_scenario("m-gamma", Scenario(replies=[Reply(status=500)]))
    server: StdioServer = await start_server(panel_config(panel, tmp_path), tmp_path)
    try:
        await server.initialize()
        arguments = {"question": "Which?", "on_partial": "error"}
        called = await server.request("tools/call", {"name": "confer", "arguments": arguments}, id=1)
        result = called["result"]
        assert result["isError"] is True
        content = result["structuredContent"]
        assert content["reason"] == "partial" and "partial" in content["message"]
        assert [a["status"] for a in content["answers"]] == ["ok", "ok", "error"]

        plain = await server.request("confer", arguments, id=2)
        assert plain["error"]["code"] == -32000
        assert plain["error"]["data"]["reason"] == "partial"
        assert [a["provider"] for a in plain["error"]["data"]["answers"]] == ["alpha", "beta", "gamma"]

        too_many = await server.request("confer", {"question": "Which?", "quorum": 4}, id=3)
        assert too_many["error"]["code"] == -32602 and "$.quorum" in too_many["error"]["message"]
    finally:
        server.process.kill()
        await server.process.wait()


# ---------------------------------------------------------------- coordinate's critics


async def test_a_critic_still_out_after_the_quorum_and_its_grace_is_late_and_the_debate_goes_on(
    config: Config, panel: SimPanel, events_path: Path
) -> None:
    panel.set_scenario("m-gamma", Scenario(latency_ms=SLOW_MS))
    async with open_runtime(config) as rt:
        debate = await coordinate(
            rt, {"task": "Pick a cache policy.", "quorum": 1, "grace_seconds": 0.2, "timeout_seconds": 30}
        )
    result = debate.to_dict()
    assert first_error("coordinate.output.json", result) is None
    critiques = {c["provider"]: c for c in result["critiques"]}
    assert critiques["beta"]["status"] == "ok" and critiques["beta"]["envelope"] is not None
    late_one = critiques["gamma"]
    assert (late_one["status"], late_one["error"]["code"], late_one["round"]) == ("late", "late", 1)
    [reason] = result["degraded_reasons"]
    assert (reason["provider"], reason["role"], reason["status"]) == ("gamma", "critic", "late")
    assert 0 < reason["elapsed_ms"] < SLOW_MS
    assert result["synthesis"]["status"] == "ok", "the synthesizer wrote from the critique that arrived"
    assert await aborted(panel, "m-gamma"), "the late critic's request was cancelled upstream"
    [event] = [e for e in read_events(events_path) if e["event"] == "member_late"]
    assert (event["provider"], event["role"]) == ("gamma", "critic")


async def test_a_critics_quorum_larger_than_the_critics_is_invalid(config: Config) -> None:
    async with open_runtime(config) as rt:
        with pytest.raises(InvalidArguments) as info:
            await coordinate(rt, {"task": "Pick a cache policy.", "quorum": 3})
    assert info.value.path == "$.quorum" and "critic" in info.value.message
