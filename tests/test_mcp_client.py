"""The official MCP Python SDK, as a real client nobody here wrote, drives `conclave serve`
over stdio: initialize, list tools, call every tool (the SDK validates structuredContent
against each tool's outputSchema itself), progress, errors, ping and cancellation."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

mcp = pytest.importorskip("mcp")
from mcp import ClientSession, StdioServerParameters, types  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402
from mcp.shared.exceptions import McpError  # noqa: E402

from conclave.app.sim import Reply, Scenario, SimPanel  # noqa: E402
from tests.server_support import SERVE, panel_config  # noqa: E402

pytestmark = pytest.mark.anyio


@pytest.fixture
async def session(panel: SimPanel, tmp_path: Path) -> AsyncIterator[ClientSession]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "conclave", *SERVE, "--config", str(panel_config(panel, tmp_path))],
        env=env,
        cwd=str(tmp_path),
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
        init = await client.initialize()
        assert init.serverInfo.name == "conclave"
        assert init.capabilities.tools is not None
        yield client


async def test_the_sdk_lists_every_tool_with_input_and_output_schemas(session: ClientSession) -> None:
    tools = {t.name: t for t in (await session.list_tools()).tools}
    assert set(tools) == {"confer", "coordinate", "fetch", "verify", "list_providers"}
    for tool in tools.values():
        assert tool.inputSchema["type"] == "object"
        assert tool.outputSchema is not None and tool.outputSchema["type"] == "object"
    assert tools["fetch"].annotations is not None and tools["fetch"].annotations.openWorldHint is True
    assert tools["verify"].annotations is not None and tools["verify"].annotations.readOnlyHint is True


async def test_the_sdk_calls_confer_and_receives_progress(session: ClientSession) -> None:
    await session.list_tools()  # the SDK validates outputs against the schemas it listed
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    result = await session.call_tool("confer", {"question": "Which?"}, progress_callback=on_progress)
    assert result.isError is False
    assert result.structuredContent is not None
    assert [a["status"] for a in result.structuredContent["answers"]] == ["ok", "ok", "ok"]
    assert isinstance(result.content[0], types.TextContent)
    with anyio.fail_after(5):
        while len(seen) < 3:
            await anyio.sleep(0.01)
    assert seen == [1, 2, 3]


async def test_the_sdk_calls_coordinate_fetch_verify_and_list_providers(
    session: ClientSession, panel: SimPanel
) -> None:
    await session.list_tools()
    proposal = '{"proposal": "Do X.", "rationale": "Because."}'
    critique = '{"verdict": "accept", "issues": []}'
    synthesis = '{"answer": "X.", "confidence": 0.9}'
    panel.set_scenario("m-alpha", Scenario(replies=(Reply(text=proposal),)))
    panel.set_scenario("m-gamma", Scenario(replies=(Reply(text=critique),)))
    panel.set_scenario("m-beta", Scenario(replies=(Reply(text=critique), Reply(text=synthesis))))
    debate = await session.call_tool("coordinate", {"task": "Decide."})
    assert debate.isError is False and debate.structuredContent is not None
    assert debate.structuredContent["synthesis"]["envelope"]["answer"] == "X."
    checks = await session.call_tool(
        "verify", {"checks": [{"type": "math", "expression": "3*3", "expected": 9}]}
    )
    assert checks.structuredContent == {
        "passed": True,
        "results": [
            {
                "index": 0,
                "type": "math",
                "passed": True,
                "detail": checks.structuredContent["results"][0]["detail"],
            }
        ],
    }
    refused = await session.call_tool("fetch", {"url": "http://169.254.169.254/latest/meta-data/"})
    assert refused.isError is True
    providers = await session.call_tool("list_providers", {})
    assert providers.structuredContent is not None
    listed = {p["name"]: p for p in providers.structuredContent["providers"]}
    assert [name for name, p in listed.items() if p["in_panel"]] == ["alpha", "beta", "gamma"]
    assert "openai" in listed, "the presets stay defined under a config of one's own"


async def test_the_sdk_calls_coordinate_with_an_answer_schema_and_reads_the_decided_value(
    session: ClientSession, panel: SimPanel
) -> None:
    """The SDK checks structuredContent against the published outputSchema; the text content, what
    a model reading the result sees, shows the value the synthesizer decided."""
    tools = {t.name: t for t in (await session.list_tools()).tools}
    assert tools["coordinate"].inputSchema["properties"]["answer_schema"]["type"] == "object"
    proposal = '{"proposal": "Kafka.", "rationale": "Replay."}'
    critique = '{"verdict": "accept", "issues": []}'
    synthesis = '{"answer": "Kafka.", "confidence": 0.9, "value": {"choice": "Kafka", "reason": "replay"}}'
    panel.set_scenario("m-alpha", Scenario(replies=(Reply(text=proposal),)))
    panel.set_scenario("m-gamma", Scenario(replies=(Reply(text=critique),)))
    panel.set_scenario("m-beta", Scenario(replies=(Reply(text=critique), Reply(text=synthesis))))
    schema = {
        "type": "object",
        "properties": {"choice": {"type": "string", "enum": ["SQS", "Kafka"]}, "reason": {"type": "string"}},
        "required": ["choice", "reason"],
        "additionalProperties": False,
    }
    debate = await session.call_tool("coordinate", {"task": "Which queue?", "answer_schema": schema})
    assert debate.isError is False and debate.structuredContent is not None
    assert debate.structuredContent["synthesis"]["value"] == {"choice": "Kafka", "reason": "replay"}
    text = debate.content[0]
    assert isinstance(text, types.TextContent)
    assert 'decided: {"choice":"Kafka","reason":"replay"}' in text.text


async def test_bad_arguments_are_is_error_and_an_unknown_tool_is_an_error(session: ClientSession) -> None:
    bad = await session.call_tool("confer", {"question": 42})
    assert bad.isError is True
    text = bad.content[0]
    assert isinstance(text, types.TextContent) and "$.question" in text.text
    with pytest.raises(McpError) as info:
        await session.call_tool("rm_rf", {})
    assert info.value.error.code == -32602


async def test_ping_during_a_long_call_and_cancelling_it_aborts_the_upstream_request(
    session: ClientSession, panel: SimPanel
) -> None:
    panel.set_scenario("m-alpha", Scenario(replies=(Reply(latency_ms=15_000),)))
    outcome: dict[str, Any] = {}

    async def slow_call() -> None:
        try:
            outcome["result"] = await session.call_tool("confer", {"question": "q", "providers": ["alpha"]})
        except anyio.get_cancelled_exc_class():
            outcome["cancelled"] = True
            raise

    async with anyio.create_task_group() as group:
        group.start_soon(slow_call)
        with anyio.fail_after(10):
            while not panel.received:
                await anyio.sleep(0.02)
        request_id = session._request_id - 1  # the id the SDK gave the call (1.x sends no cancel itself)
        await session.send_ping()
        await session.send_notification(
            types.ClientNotification(
                types.CancelledNotification(
                    params=types.CancelledNotificationParams(requestId=request_id, reason="test")
                )
            )
        )
        with anyio.fail_after(10):
            while not panel.aborted:
                await anyio.sleep(0.02)
        group.cancel_scope.cancel()
    assert panel.aborted == ["m-alpha"]
    assert "result" not in outcome
    await session.send_ping()
