"""A starting server answers `initialize`, `ping` and `tools/list` before its runtime is up, tool
calls wait for the runtime, and a runtime that fails to open stops the server with its own error."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from conclave.app import runtime as runtime_module
from conclave.app.runtime import open_runtime
from conclave.app.server.core import Server
from conclave.app.server.lifecycle import serving
from conclave.app.sim import SimPanel
from conclave.obs.telemetry import Telemetry
from conclave.schema.config import Config
from tests.server_support import panel_config, start_server

pytestmark = pytest.mark.anyio

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}
TOOLS_LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
LIST_PROVIDERS = {
    "jsonrpc": "2.0",
    "id": 3,
    "method": "tools/call",
    "params": {"name": "list_providers", "arguments": {}},
}


async def nowhere(_message: Any) -> None:
    pass


def one_provider(make_config: Callable[..., Config]) -> Config:
    return make_config({"a": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}})


async def test_a_server_without_a_runtime_answers_the_handshake_and_holds_tool_calls_until_attached(
    make_config: Callable[..., Config],
) -> None:
    config = one_provider(make_config)
    server = Server(telemetry=Telemetry(None))
    init = await server.handle_message(INITIALIZE, nowhere)
    listed = await server.handle_message(TOOLS_LIST, nowhere)
    assert init["result"]["serverInfo"]["name"] == "conclave"
    assert [t["name"] for t in listed["result"]["tools"]] == [
        "confer",
        "coordinate",
        "fetch",
        "verify",
        "list_providers",
    ]
    replies: list[Any] = []

    async def call() -> None:
        replies.append(await server.handle_message(LIST_PROVIDERS, nowhere))

    async with open_runtime(config) as rt, anyio.create_task_group() as group:
        group.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        assert replies == []  # waiting for the runtime, not failing
        server.attach(rt)
    assert replies[0]["result"]["structuredContent"]["providers"][0]["name"] == "a"
    assert replies[0]["result"]["isError"] is False


async def test_an_unknown_tool_is_refused_before_the_runtime_is_up() -> None:
    server = Server(telemetry=Telemetry(None))
    with anyio.fail_after(5):  # must not wait for a runtime that will never come
        reply = await server.handle_message(
            {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "nope"}}, nowhere
        )
    assert reply["error"]["code"] == -32602
    assert "nope" in reply["error"]["message"]


@pytest.mark.parametrize("tool", ["confer", "coordinate", "fetch", "verify", "list_providers"])
async def test_invalid_arguments_are_refused_at_the_door_before_the_runtime_is_up(tool: str) -> None:
    """Every tool's arguments are checked by the server itself, before it waits for a runtime."""
    server = Server(telemetry=Telemetry(None))
    call = {"name": tool, "arguments": {"nope": 1}}
    with anyio.fail_after(5):
        mcp = await server.handle_message(
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}, nowhere
        )
        plain = await server.handle_message(
            {"jsonrpc": "2.0", "id": 2, "method": tool, "params": {"nope": 1}}, nowhere
        )
    assert mcp["result"]["isError"] is True
    assert mcp["result"]["content"][0]["text"].startswith(f"Invalid arguments for {tool} at $")
    assert plain["error"]["code"] == -32602


async def test_serving_attaches_the_runtime_and_runs_tools(make_config: Callable[..., Config]) -> None:
    config = one_provider(make_config)
    async with serving(config) as server:
        with anyio.fail_after(30):
            reply = await server.handle_message(LIST_PROVIDERS, nowhere)
    assert reply["result"]["structuredContent"]["providers"][0]["kind"] == "openai"


async def test_a_runtime_that_fails_to_open_ends_serving_with_that_error(
    make_config: Callable[..., Config], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = one_provider(make_config)

    def broken(*_args: Any, **_kwargs: Any) -> AsyncIterator[Any]:
        raise PermissionError(13, "Permission denied", "/unwritable/transcripts")

    monkeypatch.setattr(runtime_module, "open_runtime", broken)
    waiting: list[Any] = []

    async def serve_one_call() -> None:
        async with serving(config) as server:
            with anyio.fail_after(30):
                waiting.append(await server.handle_message(LIST_PROVIDERS, nowhere))

    # Bare, not in an exception group: `conclave serve` turns an OSError into one line and exit 2.
    with pytest.raises(PermissionError, match="Permission denied"):
        await serve_one_call()
    assert waiting == []  # the waiting call was cancelled with the server, not answered wrongly


def test_the_stdio_server_front_loads_without_the_http_stack_or_the_deliberation_code() -> None:
    """What makes `serve` answer its first request fast: the modules it imports before
    answering. The runtime's half loads on a worker thread (server.lifecycle)."""
    heavy = ["aiohttp", "httpx", "conclave.app.runtime", "conclave.deliberation", "conclave.providers"]
    probe = (
        "import sys, conclave.app.cli, conclave.app.server.stdio\n"
        f"print([m for m in {heavy!r} if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


async def test_serve_answers_a_pipelined_handshake_and_tool_call_then_exits_at_eof(tmp_path: Path) -> None:
    async with SimPanel() as panel:
        server = await start_server(panel_config(panel, tmp_path), tmp_path)
        for message in (INITIALIZE, TOOLS_LIST, LIST_PROVIDERS):
            await server.send(message)
        replies = {reply["id"]: reply for reply in [await server.recv(30) for _ in range(3)]}
        assert await server.close() == 0
    assert replies[1]["result"]["protocolVersion"] == "2025-11-25"
    assert len(replies[2]["result"]["tools"]) == 5
    names = [p["name"] for p in replies[3]["result"]["structuredContent"]["providers"]]
    assert names[:3] == ["alpha", "beta", "gamma"], "the config's own first, then the presets"


def test_serve_exits_cleanly_when_the_client_leaves_after_the_handshake(
    tmp_path: Path, write_config: Callable[..., Path], events_path: Path
) -> None:
    config = write_config(
        {
            "providers": {"a": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}},
            "panel": ["a"],
            "roles": {"proposer": "a", "critics": ["a"], "synthesizer": "a"},
            "telemetry": {"path": str(events_path)},
        }
    )
    lines = orjson.dumps(INITIALIZE) + b"\n" + orjson.dumps(TOOLS_LIST) + b"\n"
    done = subprocess.run(
        [sys.executable, "-m", "conclave", "serve", "--config", str(config)],
        input=lines,
        capture_output=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert [orjson.loads(line)["id"] for line in done.stdout.splitlines()] == [1, 2]
