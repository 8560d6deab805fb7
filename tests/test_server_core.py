"""The server's dispatch in process: pagination, cancellation bookkeeping, internal errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conclave import schemas
from conclave.config import Config
from conclave.runtime import open_runtime
from conclave.server import handlers
from conclave.server.core import Server
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
