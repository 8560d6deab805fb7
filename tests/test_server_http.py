"""The HTTP transport with a real client: MCP Streamable HTTP on /mcp, plain JSON-RPC on /rpc."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web

from conclave.config import load_config
from conclave.runtime import open_runtime
from conclave.schemas import validator
from conclave.server.core import Server
from conclave.server.http import build_app
from conclave.sim import SimPanel
from tests.server_support import panel_config

pytestmark = pytest.mark.anyio
ACCEPT = {"accept": "application/json, text/event-stream"}


@pytest.fixture
async def base_url(tmp_path: Path) -> AsyncIterator[str]:
    async with SimPanel() as panel:
        config = load_config(str(panel_config(panel, tmp_path)), env={}, dotenv=None)
        async with open_runtime(config) as runtime:
            runner = web.AppRunner(build_app(Server(runtime)), access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            try:
                yield f"http://127.0.0.1:{port}"
            finally:
                await runner.cleanup()


def rpc(method: str, params: Any = None, id: Any = 1) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
    if params is not None:
        message["params"] = params
    return message


async def test_mcp_initialize_and_tools_list_over_http(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url, headers=ACCEPT) as client:
        init = await client.post(
            "/mcp", json=rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {}})
        )
        assert init.status_code == 200 and init.headers["content-type"].startswith("application/json")
        assert init.json()["result"]["protocolVersion"] == "2025-11-25"
        note = await client.post(
            "/mcp",
            json={"jsonrpc": "2.0", "method": "notifications/initialized"},
            headers={"mcp-protocol-version": "2025-11-25"},
        )
        assert note.status_code == 202 and note.content == b""
        tools = (await client.post("/mcp", json=rpc("tools/list", id=2))).json()["result"]["tools"]
    assert len(tools) == 5


async def test_a_tool_call_with_a_progress_token_streams_progress_then_the_result_as_sse(
    base_url: str,
) -> None:
    params = {"name": "confer", "arguments": {"question": "Which?"}, "_meta": {"progressToken": 7}}
    async with httpx.AsyncClient(base_url=base_url, headers=ACCEPT) as client:
        reply = await client.post("/mcp", json=rpc("tools/call", params, id="s"))
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = [
        orjson.loads(line[len("data: ") :]) for line in reply.text.splitlines() if line.startswith("data: ")
    ]
    assert [e.get("method") for e in events[:-1]] == ["notifications/progress"] * 3
    final = events[-1]
    assert final["id"] == "s"
    assert list(validator("confer.output.json").iter_errors(final["result"]["structuredContent"])) == []


async def test_a_foreign_origin_is_refused_and_a_local_one_allowed(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url) as client:
        evil = await client.post("/mcp", json=rpc("ping"), headers={"origin": "https://evil.example"})
        local = await client.post("/mcp", json=rpc("ping"), headers={"origin": "http://localhost:6274"})
        rpc_evil = await client.post("/rpc", json=rpc("ping"), headers={"origin": "http://attacker.test"})
    assert evil.status_code == 403 and evil.json()["error"]["code"] == -32600
    assert local.status_code == 200 and local.json()["result"] == {}
    assert rpc_evil.status_code == 403


async def test_an_unsupported_protocol_version_header_is_a_400_that_names_the_request(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url) as client:
        reply = await client.post(
            "/mcp", json=rpc("ping", id="v-1"), headers={"mcp-protocol-version": "1999-01-01"}
        )
    assert reply.status_code == 400
    assert reply.json()["id"] == "v-1"
    error = reply.json()["error"]
    assert error["code"] == -32022, "UnsupportedProtocolVersion, in both eras"
    assert error["data"]["requested"] == "1999-01-01" and "2026-07-28" in error["data"]["supported"]


async def test_a_refused_origin_names_the_request_it_refuses(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url) as client:
        reply = await client.post("/rpc", json=rpc("ping", id=41), headers={"origin": "http://attacker.test"})
        garbage = await client.post("/mcp", content=b"{nope", headers={"origin": "http://attacker.test"})
    assert (reply.status_code, reply.json()["id"]) == (403, 41)
    assert (garbage.status_code, garbage.json()["id"]) == (403, None)


async def test_a_failure_outside_any_request_still_names_the_request(
    base_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transport's safety net (a bug below it) answers with the request's id, in JSON
    and in an SSE stream alike."""

    async def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("kaboom")

    monkeypatch.setattr(Server, "handle_message", broken)
    streamed = rpc("tools/call", {"name": "verify", "arguments": {}, "_meta": {"progressToken": 1}}, id=8)
    async with httpx.AsyncClient(base_url=base_url, headers=ACCEPT) as client:
        plain = await client.post("/rpc", json=rpc("ping", id=7))
        stream = await client.post("/mcp", json=streamed)
    assert (plain.status_code, plain.json()["id"], plain.json()["error"]["code"]) == (500, 7, -32603)
    events = [orjson.loads(line[6:]) for line in stream.text.splitlines() if line.startswith("data: ")]
    assert [(e["id"], e["error"]["code"]) for e in events] == [(8, -32603)]


async def test_get_on_mcp_is_405(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url) as client:
        assert (await client.get("/mcp")).status_code == 405


async def test_plain_json_rpc_on_rpc_with_batches_and_notifications(base_url: str) -> None:
    checks = {"checks": [{"type": "equals", "actual": [1, 2], "expected": [1, 2]}]}
    async with httpx.AsyncClient(base_url=base_url) as client:
        single = await client.post("/rpc", json=rpc("verify", checks))
        batch = await client.post(
            "/rpc",
            json=[rpc("ping", id=1), rpc("list_providers", id=2), {"jsonrpc": "2.0", "method": "ping"}],
        )
        only_note = await client.post("/rpc", json={"jsonrpc": "2.0", "method": "ping"})
        garbage = await client.post("/rpc", content=b"{nope")
        confer = await client.post("/rpc", json=rpc("confer", {"question": "Which?", "providers": ["alpha"]}))
    assert single.json()["result"]["passed"] is True
    assert sorted(r["id"] for r in batch.json()) == [1, 2]
    assert only_note.status_code == 204
    assert garbage.status_code == 400 and garbage.json()["error"]["code"] == -32700
    assert confer.json()["result"]["answers"][0]["status"] == "ok"
