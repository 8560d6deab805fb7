"""The server's dispatch in process: pagination, cancellation bookkeeping, internal errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from conclave.app.runtime import open_runtime
from conclave.app.server import handlers
from conclave.app.server.core import Server
from conclave.schema import schemas
from conclave.schema.config import Config
from tests.support import read_events

pytestmark = pytest.mark.anyio


async def nowhere(_message: Any) -> None:
    pass


async def test_tools_list_pages_with_an_opaque_cursor(make_config: Callable[..., Config]) -> None:
    config = make_config({"a": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}})
    async with open_runtime(config) as rt:
        server = Server(rt, page_size=2)
        names: list[str] = []
        cursor = None
        for _ in range(5):
            params = {"cursor": cursor} if cursor else {}
            reply = await server.handle_message(
                {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": params}, nowhere
            )
            names += [t["name"] for t in reply["result"]["tools"]]
            cursor = reply["result"].get("nextCursor")
            if cursor is None:
                break
        bad = await server.handle_message(
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"cursor": "not-a-cursor"}}, nowhere
        )
    assert names == ["confer", "coordinate", "fetch", "verify", "list_providers"]
    assert bad["error"]["code"] == -32602


async def test_an_internal_failure_is_minus_32603_with_an_id_that_finds_the_trace(
    make_config: Callable[..., Config], events_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config({"a": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}})

    async def broken(*_args: Any) -> dict[str, Any]:
        raise RuntimeError("kaboom inside")

    monkeypatch.setattr(handlers, "run_list_providers", broken)
    async with open_runtime(config) as rt:
        server = Server(rt)
        reply = await server.handle_message({"jsonrpc": "2.0", "id": 5, "method": "list_providers"}, nowhere)
    error = reply["error"]
    assert (error["code"], error["message"]) == (-32603, "Internal error")
    assert "kaboom" not in str(error)
    logged = next(e for e in read_events(events_path) if e["event"] == "rpc_error" and e.get("error_id"))
    assert logged["error_id"] == error["data"]["error_id"]
    assert "kaboom inside" in logged["traceback"]


TOOL_CALLS = {
    "confer": {"question": "q?", "dry_run": True},
    "coordinate": {"task": "t", "proposer": "a", "critics": ["b"], "synthesizer": "a", "dry_run": True},
    "fetch": {"url": "http://127.0.0.1:9/"},  # refused by the network guard: no traffic
    "verify": {"checks": [{"type": "math", "expression": "1+1", "expected": 2}]},
    "list_providers": {},
}


@pytest.mark.parametrize("tool", sorted(TOOL_CALLS))
async def test_a_tools_call_checks_its_arguments_against_the_schema_exactly_once(
    make_config: Callable[..., Config], monkeypatch: pytest.MonkeyPatch, tool: str
) -> None:
    """The server checks every tool's arguments at its door, and nothing below checks again."""
    config = make_config(
        {
            "a": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"},
            "b": {"kind": "openai", "model": "n", "base_url": "http://127.0.0.1:9/v1"},
        }
    )
    checked: list[str] = []
    real_acceptor = schemas.acceptor  # every check starts there, valid or not

    def counting(relative: str) -> Any:
        checked.append(relative)
        return real_acceptor(relative)

    async with open_runtime(config) as rt:
        server = Server(rt)
        monkeypatch.setattr(schemas, "acceptor", counting)
        message = {"name": tool, "arguments": TOOL_CALLS[tool]}
        reply = await server.handle_message(
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": message}, nowhere
        )
        bad = await server.handle_message(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {**message, "arguments": {"nope": 1}},
            },
            nowhere,
        )

    assert "result" in reply
    assert checked.count(f"{tool}.input.json") == 2  # once for the good call, once for the bad one
    assert bad["result"]["isError"] is True
    assert "nope" in bad["result"]["content"][0]["text"]


async def test_a_session_id_still_running_is_refused_with_its_reason(tmp_path: Path) -> None:
    from conclave.app.sim import SimPanel
    from conclave.schema.config import load_config
    from tests.server_support import panel_config

    call = {"name": "confer", "arguments": {"question": "Which?", "session_id": "s-once"}}
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}
    replies: list[dict[str, Any]] = []
    async with SimPanel(latency_ms=300) as panel:
        config = load_config(str(panel_config(panel, tmp_path)), env={}, dotenv=None)
        async with open_runtime(config) as rt:
            server = Server(rt)

            async def send(delay: float, request_id: int) -> None:
                await anyio.sleep(delay)
                replies.append(await server.handle_message({**message, "id": request_id}, nowhere))

            async with anyio.create_task_group() as group:
                group.start_soon(send, 0.0, 1)
                group.start_soon(send, 0.1, 2)
            again = await server.handle_message({**message, "id": 3}, nowhere)
    refused, done = sorted(replies, key=lambda r: r["id"], reverse=True)
    assert refused["id"] == 2 and refused["error"]["code"] == -32602
    assert refused["error"]["data"] == {"reason": "session_in_flight"}
    assert "still running" in refused["error"]["message"]
    assert done["result"]["structuredContent"]["session_id"] == "s-once"
    assert again["result"]["structuredContent"]["session_id"] == "s-once", "free again once it ended"
