"""The HTTP transport with a real client: MCP Streamable HTTP on /mcp, plain JSON-RPC on /rpc."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from aiohttp import web

from conclave.app.runtime import open_runtime
from conclave.app.server.core import Server
from conclave.app.server.http import build_app
from conclave.app.server.tasks import TaskStore
from conclave.app.sim import Reply, Scenario, SimPanel
from conclave.schema.config import TasksConfig, load_config
from conclave.schema.schemas import validator
from tests.server_support import panel_config
from tests.support import read_events

pytestmark = pytest.mark.anyio
ACCEPT = {"accept": "application/json, text/event-stream"}


@contextlib.asynccontextmanager
async def serving(server: Server, *, bound_host: str = "127.0.0.1") -> AsyncIterator[str]:
    """`server` behind the HTTP transport on a free loopback port, as `serve --http` runs it
    (handler_cancellation: a client that hangs up cancels its call); yields its base URL.
    `bound_host`: the address the app believes it is bound to."""
    runner = web.AppRunner(
        build_app(server, bound_host=bound_host), access_log=None, handler_cancellation=True
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def base_url(tmp_path: Path) -> AsyncIterator[str]:
    async with SimPanel() as panel:
        config = load_config(str(panel_config(panel, tmp_path)), env={}, dotenv=None)
        async with open_runtime(config) as runtime, serving(Server(runtime)) as url:
            yield url


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


async def test_the_root_says_where_mcp_and_rpc_are_behind_the_same_guard(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url) as client:
        index = await client.get("/")
        assert index.status_code == 200 and index.headers["content-type"].startswith("text/plain")
        assert "POST /mcp  MCP Streamable HTTP" in index.text and "POST /rpc  plain JSON-RPC" in index.text
        assert "server.ui: true" in index.text, "the page is off here, and the root says how to turn it on"
        described = (await client.get("/", headers={"Accept": "application/json"})).json()
        assert (
            described["endpoints"]["mcp"]["path"] == "/mcp"
            and described["endpoints"]["rpc"]["path"] == "/rpc"
        )
        assert described["endpoints"]["ui"] is None
        assert (await client.head("/")).status_code == 200
        assert (await client.get("/", headers={"Origin": "http://attacker.example"})).status_code == 403
        assert (await client.get("/", headers={"Host": "rebound.attacker.example"})).status_code == 403
        assert (await client.get("/", headers={"Origin": base_url})).status_code == 200
        assert (await client.post("/", content=b"{}")).status_code == 405


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


# ---------------------------------------------------------------- the stateless era (2026-07-28)

META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


def stateless(method: str, params: dict[str, Any] | None = None, id: Any = 1) -> dict[str, Any]:
    return rpc(method, {**(params or {}), "_meta": {**META, **(params or {}).get("_meta", {})}}, id)


def headers(method: str, name: str | None = None, version: str = "2026-07-28") -> dict[str, str]:
    sent = {**ACCEPT, "mcp-protocol-version": version, "mcp-method": method}
    return sent | ({"mcp-name": name} if name is not None else {})


async def test_a_stateless_client_discovers_lists_and_calls_without_a_session(base_url: str) -> None:
    verify = {
        "name": "verify",
        "arguments": {"checks": [{"type": "contains", "text": "abc", "substring": "b"}]},
    }
    async with httpx.AsyncClient(base_url=base_url) as client:
        found = await client.post(
            "/mcp", json=stateless("server/discover"), headers=headers("server/discover")
        )
        listed = await client.post("/mcp", json=stateless("tools/list", id=2), headers=headers("tools/list"))
        called = await client.post(
            "/mcp", json=stateless("tools/call", verify, id=3), headers=headers("tools/call", "verify")
        )
    discover = found.json()["result"]
    assert found.status_code == 200 and "mcp-session-id" not in found.headers
    assert discover["resultType"] == "complete" and discover["supportedVersions"][0] == "2026-07-28"
    assert "extensions" not in discover["capabilities"], "this server keeps no tasks, so offers none"
    tools = listed.json()["result"]
    assert (tools["resultType"], tools["cacheScope"]) == ("complete", "public") and tools["ttlMs"] > 0
    result = called.json()["result"]
    assert result["resultType"] == "complete" and result["structuredContent"]["passed"] is True
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "conclave"


@pytest.mark.parametrize(
    ("sent", "why"),
    [
        (headers("tools/call", "verify", version="2025-11-25"), "MCP-Protocol-Version"),
        (headers("tools/list", "verify"), "Mcp-Method"),
        (headers("tools/call", "fetch"), "Mcp-Name"),
        ({**ACCEPT, "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call"}, "Mcp-Name"),
        ({**ACCEPT, "mcp-protocol-version": "2026-07-28", "mcp-name": "verify"}, "Mcp-Method"),
    ],
)
async def test_headers_that_do_not_mirror_the_body_are_a_header_mismatch(
    base_url: str, sent: dict[str, str], why: str
) -> None:
    call = stateless("tools/call", {"name": "verify", "arguments": {"checks": []}}, id="h")
    async with httpx.AsyncClient(base_url=base_url) as client:
        reply = await client.post("/mcp", json=call, headers=sent)
    assert reply.status_code == 400
    body = reply.json()
    assert (body["id"], body["error"]["code"]) == ("h", -32020) and why in body["error"]["message"]


async def test_a_base64_encoded_name_header_is_decoded_before_it_is_compared(base_url: str) -> None:
    call = stateless("tools/call", {"name": "verify", "arguments": {"checks": []}}, id="b")
    encoded = "=?base64?dmVyaWZ5?="  # "verify"
    async with httpx.AsyncClient(base_url=base_url) as client:
        reply = await client.post("/mcp", json=call, headers=headers("tools/call", encoded))
    assert reply.status_code == 200 and reply.json()["result"]["resultType"] == "complete"


async def test_stateless_protocol_errors_have_their_own_status_and_keep_the_request_id(base_url: str) -> None:
    no_meta = rpc("tools/list", {}, id="m")
    future = {**META, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}
    async with httpx.AsyncClient(base_url=base_url) as client:
        missing = await client.post("/mcp", json=no_meta, headers=headers("tools/list"))
        unknown = await client.post(
            "/mcp",
            json=rpc("tools/list", {"_meta": future}, id="v"),
            headers=headers("tools/list", version="2099-01-01"),
        )
        removed = await client.post("/mcp", json=stateless("ping", id="p"), headers=headers("ping"))
        absent = await client.post(
            "/mcp", json=stateless("prompts/list", id="x"), headers=headers("prompts/list")
        )
        no_task = await client.post(
            "/mcp",
            json=stateless("tasks/get", {"taskId": "t-1"}, id="t"),
            headers=headers("tasks/get", "t-1"),
        )
    assert (missing.status_code, missing.json()["id"], missing.json()["error"]["code"]) == (400, "m", -32602)
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (400, -32022)
    assert unknown.json()["error"]["data"]["requested"] == "2099-01-01"
    for reply, request_id in ((removed, "p"), (absent, "x")):
        assert (reply.status_code, reply.json()["id"], reply.json()["error"]["code"]) == (
            404,
            request_id,
            -32601,
        )
    assert (no_task.status_code, no_task.json()["error"]["code"]) == (400, -32021), "tasks not declared"
    assert no_task.json()["error"]["data"] == {
        "requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}
    }


async def test_delete_on_mcp_is_405_too(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url) as client:
        assert (await client.delete("/mcp")).status_code == 405


async def test_a_stateless_call_with_a_progress_token_streams_progress(base_url: str) -> None:
    params = {"name": "confer", "arguments": {"question": "Which?"}, "_meta": {"progressToken": "p"}}
    async with httpx.AsyncClient(base_url=base_url) as client:
        reply = await client.post(
            "/mcp", json=stateless("tools/call", params, id="s"), headers=headers("tools/call", "confer")
        )
    events = [orjson.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: ")]
    assert [e.get("method") for e in events[:-1]] == ["notifications/progress"] * 3
    assert events[-1]["result"]["resultType"] == "complete"


TASKS_META = {
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}
}


@pytest.fixture
async def tasks_url(tmp_path: Path) -> AsyncIterator[str]:
    """A server that keeps tasks, as a serving process does."""
    async with SimPanel() as panel:
        config = load_config(str(panel_config(panel, tmp_path)), env={}, dotenv=None)
        async with open_runtime(config) as runtime:
            server = Server(runtime)
            async with TaskStore.running(
                TasksConfig(ttl_seconds=60, poll_interval_ms=100), server.task_error
            ) as store:
                server.tasks = store
                async with serving(server) as url:
                    yield url


async def test_a_confer_becomes_a_task_only_for_a_client_that_declares_tasks(tasks_url: str) -> None:
    call = {"name": "confer", "arguments": {"question": "Which?"}}
    async with httpx.AsyncClient(base_url=tasks_url) as client:
        found = (
            await client.post("/mcp", json=stateless("server/discover"), headers=headers("server/discover"))
        ).json()
        plain = await client.post(
            "/mcp", json=stateless("tools/call", call), headers=headers("tools/call", "confer")
        )
        asked = stateless("tools/call", {**call, "_meta": TASKS_META}, id=2)
        created = (await client.post("/mcp", json=asked, headers=headers("tools/call", "confer"))).json()[
            "result"
        ]
        task_id = created["taskId"]
        polls: list[dict[str, Any]] = []
        get = stateless("tasks/get", {"taskId": task_id, "_meta": TASKS_META}, id=3)
        with anyio.fail_after(20):
            while not polls or polls[-1]["status"] == "working":
                polled = await client.post("/mcp", json=get, headers=headers("tasks/get", task_id))
                polls.append(polled.json()["result"])
                await anyio.sleep(0.02)
        update = stateless(
            "tasks/update", {"taskId": task_id, "inputResponses": {}, "_meta": TASKS_META}, id=4
        )
        acked = (await client.post("/mcp", json=update, headers=headers("tasks/update", task_id))).json()
        unknown = stateless("tasks/cancel", {"taskId": "no-such-task", "_meta": TASKS_META}, id=5)
        refused = (
            await client.post("/mcp", json=unknown, headers=headers("tasks/cancel", "no-such-task"))
        ).json()
        wrong_name = await client.post("/mcp", json=update, headers=headers("tasks/update", "another-task"))
    assert found["result"]["capabilities"]["extensions"] == {"io.modelcontextprotocol/tasks": {}}
    assert plain.json()["result"]["resultType"] == "complete", "no extension declared: an ordinary result"
    assert created["resultType"] == "task" and created["status"] == "working"
    assert (
        created["ttlMs"] == 60_000 and created["pollIntervalMs"] == 100 and created["createdAt"].endswith("Z")
    )
    final = polls[-1]
    assert (final["resultType"], final["status"], final["taskId"]) == ("complete", "completed", task_id)
    assert first_error_free(final["result"]["structuredContent"])
    assert final["statusMessage"] == "completed"
    assert acked["result"] == {"resultType": "complete", "_meta": acked["result"]["_meta"]}
    assert refused["error"]["code"] == -32602
    assert (wrong_name.status_code, wrong_name.json()["error"]["code"]) == (400, -32020)


def first_error_free(structured: Any) -> bool:
    return list(validator("confer.output.json").iter_errors(structured)) == []


TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize("where", ["meta", "header"])
async def test_the_callers_trace_id_is_on_every_event_of_the_session(
    base_url: str, tmp_path: Path, where: str
) -> None:
    traceparent = f"00-{TRACE}-00f067aa0ba902b7-01"
    params: dict[str, Any] = {"name": "confer", "arguments": {"question": "Which?", "session_id": "traced"}}
    sent = headers("tools/call", "confer")
    if where == "meta":
        params["_meta"] = {"traceparent": traceparent, "tracestate": "congo=t61rcWkgMzE"}
    else:
        sent["traceparent"] = traceparent
    untraced = {"name": "confer", "arguments": {"question": "Which?", "session_id": "untraced"}}
    bad = {**untraced, "_meta": {"traceparent": f"00-{TRACE}-zz-01"}}  # malformed: ignored
    async with httpx.AsyncClient(base_url=base_url) as client:
        await client.post("/mcp", json=stateless("tools/call", params), headers=sent)
        await client.post(
            "/mcp", json=stateless("tools/call", bad, id=2), headers=headers("tools/call", "confer")
        )
    await anyio.sleep(0.1)
    events = read_events(tmp_path / "events.ndjson")
    traced = [e for e in events if e.get("session_id") == "traced"]
    assert {e["event"] for e in traced} >= {"session_start", "provider_call", "session_end"}
    assert {e.get("trace_id") for e in traced} == {TRACE}
    assert all("trace_id" not in e for e in events if e.get("session_id") == "untraced")
    for event in events:
        assert first_event_error(event) is None


def first_event_error(event: dict[str, Any]) -> Any:
    errors = list(validator(f"events/{event['event']}.json").iter_errors(event))
    return errors[0].message if errors else None


async def test_a_long_call_sends_heartbeats_naming_who_is_still_awaited(tmp_path: Path) -> None:
    async with SimPanel() as panel:
        panel.set_scenario("m-gamma", Scenario(replies=(Reply(),), latency_ms=700))
        path = panel_config(panel, tmp_path, server={"progress_heartbeat_seconds": 0.1})
        config = load_config(str(path), env={}, dotenv=None)
        params = {"name": "confer", "arguments": {"question": "Which?"}, "_meta": {"progressToken": "hb"}}
        async with (
            open_runtime(config) as runtime,
            serving(Server(runtime)) as url,
            httpx.AsyncClient(base_url=url, headers=ACCEPT) as client,
        ):
            reply = await client.post("/mcp", json=rpc("tools/call", params, id="h"))
    events = [orjson.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: ")]
    notes = [e["params"] for e in events[:-1]]
    beats = [n for n in notes if n["message"].startswith("still waiting for")]
    assert len(beats) >= 3, notes
    assert beats[-1]["message"] == "still waiting for gamma", "alpha and beta answered at once"
    values = [n["progress"] for n in notes]
    assert values == sorted(values) and len(set(values)) == len(values), "progress only grows"
    assert [n["progress"] for n in notes if "total" in n] == [1, 2, 3]
    assert events[-1]["result"]["structuredContent"]["degraded"] is False
