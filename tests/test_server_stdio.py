"""`conclave serve` as a subprocess over stdio: framing, errors, MCP, progress, cancellation."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from conclave.app.server.stdio import MAX_LINE_BYTES, _is_pipe
from conclave.app.sim import Reply, Scenario, SimPanel
from conclave.schema.answer_schema import choices_schema
from conclave.schema.schemas import validator
from tests.server_support import StdioServer, panel_config, start_server

pytestmark = pytest.mark.anyio


@pytest.fixture
async def server(panel: SimPanel, tmp_path: Path) -> AsyncIterator[StdioServer]:
    proc = await start_server(panel_config(panel, tmp_path), tmp_path)
    try:
        yield proc
    finally:
        if proc.process.returncode is None:
            proc.process.kill()
            await proc.process.wait()


async def initialize(server: StdioServer, version: str = "2025-11-25") -> dict[str, Any]:
    reply = await server.request(
        "initialize",
        {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}},
        id=0,
    )
    await server.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return reply  # type: ignore[no-any-return]


async def test_a_garbage_line_is_a_parse_error_and_the_server_keeps_serving(server: StdioServer) -> None:
    await server.send(b"this is not json")
    error = await server.recv()
    assert (error["id"], error["error"]["code"]) == (None, -32700)
    assert (await server.request("ping"))["result"] == {}


@pytest.mark.parametrize(
    ("message", "reply_id"),
    [
        (b"1", None),
        (b'"text"', None),
        (b'{"jsonrpc": "1.0", "method": "ping", "id": 3}', 3),
        (b'{"jsonrpc": "2.0", "id": 4}', 4),
        (b'{"jsonrpc": "2.0", "method": 5, "id": 5}', 5),
        (b'{"jsonrpc": "2.0", "method": "ping", "id": {"x": 1}}', None),
        (b'{"jsonrpc": "2.0", "method": "ping", "id": 6, "params": "nope"}', 6),
        (b"[]", None),
    ],
)
async def test_invalid_requests_get_minus_32600(server: StdioServer, message: bytes, reply_id: Any) -> None:
    await server.send(message)
    error = await server.recv()
    assert (error["id"], error["error"]["code"]) == (reply_id, -32600)


async def test_an_unknown_method_is_minus_32601_and_ids_keep_their_type(server: StdioServer) -> None:
    by_string = await server.request("no/such/method", id="abc")
    by_number = await server.request("ping", id=42)
    assert (by_string["id"], by_string["error"]["code"]) == ("abc", -32601)
    assert by_number == {"jsonrpc": "2.0", "id": 42, "result": {}}


async def test_notifications_are_never_answered(server: StdioServer) -> None:
    await server.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    await server.send({"jsonrpc": "2.0", "method": "no/such/notification"})
    await server.send({"jsonrpc": "2.0", "method": "confer", "params": {"bad": 1}})
    assert await server.request("ping", id="after") == {"jsonrpc": "2.0", "id": "after", "result": {}}


async def test_a_batch_is_answered_as_a_batch(server: StdioServer) -> None:
    await server.send(
        [
            {"jsonrpc": "2.0", "id": 1, "method": "ping"},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "nope"},
        ]
    )
    replies = await server.recv()
    assert isinstance(replies, list)
    assert sorted((r["id"], "error" in r) for r in replies) == [(1, False), (2, True)]


async def test_huge_invalid_and_deep_inputs_do_not_stop_the_server(server: StdioServer) -> None:
    await server.send(
        b'{"jsonrpc": "2.0", "id": 9, "method": "ping", "params": {"x": "' + b"a" * 10_000_000 + b'"'
    )
    assert (await server.recv())["error"]["code"] == -32700
    big = {
        "jsonrpc": "2.0",
        "id": 10,
        "method": "verify",
        "params": {"checks": [{"type": "contains", "text": "a" * 10_000_000, "substring": "a"}]},
    }
    reply = await server.request("verify", big["params"], id=10)
    assert reply["error"]["code"] == -32602
    assert reply["error"]["data"]["path"] == "$.checks[0].text"
    await server.send(b'{"jsonrpc": "2.0", "id": 11, "method": "ping", "x": "\xff\xfe"}')
    assert (await server.recv())["error"]["code"] == -32700
    await server.send(b"[" * 100_000 + b"]" * 100_000)
    assert (await server.recv())["error"]["code"] == -32700
    assert (await server.request("ping", id=12))["result"] == {}


async def test_a_line_over_the_size_cap_is_refused_whole_and_the_next_line_is_served(
    server: StdioServer,
) -> None:
    """Over 32 MiB in one line: one parse error naming the cap, none of its bytes read as
    requests (the line holds a ping), and the ping on the next line answered."""
    filler = b"a" * (MAX_LINE_BYTES + 5 * 1024 * 1024)
    await server.send(b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "x": "' + filler + b'"}')
    await server.send(b'{"jsonrpc": "2.0", "id": 2, "method": "ping"}')
    refused = await server.recv(60)
    assert (refused["id"], refused["error"]["code"]) == (None, -32700)
    assert f"over {MAX_LINE_BYTES} bytes" in refused["error"]["message"]
    assert await server.recv(60) == {"jsonrpc": "2.0", "id": 2, "result": {}}


async def test_requests_from_a_file_get_replies_in_a_file(panel: SimPanel, tmp_path: Path) -> None:
    """Not a pipe (a shell redirect): stdin and stdout go through worker threads instead."""
    requests = tmp_path / "requests.ndjson"
    requests.write_bytes(
        b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}\n'
        b'{"jsonrpc": "2.0", "id": 2, "method": "list_providers"}\n'
    )
    replies = tmp_path / "replies.ndjson"
    config = panel_config(panel, tmp_path)
    with requests.open("rb") as stdin, replies.open("wb") as stdout:
        done = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                [sys.executable, "-m", "conclave", "serve", "--config", str(config)],
                stdin=stdin,
                stdout=stdout,
                stderr=subprocess.PIPE,
                timeout=60,
                cwd=tmp_path,
            )
        )
    assert done.returncode == 0, done.stderr.decode()
    lines = sorted(replies.read_bytes().splitlines())
    assert len(lines) == 2
    assert b'"id":1,"result":{}' in lines[0]
    assert b'"name":"alpha"' in lines[1]


def test_only_pipes_and_sockets_take_the_event_loop_path(tmp_path: Path) -> None:
    """Pipes (how MCP clients spawn servers) are served on the event loop; a regular file, or a
    stream without a descriptor, goes through threads (a pipe transport on a shared terminal
    would leave it non-blocking for the shell)."""
    read_end, write_end = os.pipe()
    left, right = socket.socketpair()
    regular = tmp_path / "requests.ndjson"
    regular.write_bytes(b"")
    with (
        os.fdopen(read_end, "rb") as pipe_in,
        os.fdopen(write_end, "wb") as pipe_out,
        left,
        right,
        left.makefile("rb") as socket_in,
        regular.open("rb") as plain_file,
    ):
        assert _is_pipe(pipe_in) and _is_pipe(pipe_out) and _is_pipe(socket_in)
        assert not _is_pipe(plain_file)
        assert not _is_pipe(io.BytesIO(b""))


def test_a_client_that_stops_reading_replies_ends_the_server_quietly(tmp_path: Path) -> None:
    """Its stdout closed under it (a client that died, `| head`): exit 0 with one line on
    stderr, never a traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "conclave", "serve", "--set", f"telemetry.path={tmp_path / 'events.ndjson'}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}\n')
    proc.stdin.flush()
    assert b'"id":1' in proc.stdout.readline()
    proc.stdout.close()
    proc.stdin.write(b'{"jsonrpc": "2.0", "id": 2, "method": "ping"}\n')
    proc.stdin.flush()
    assert proc.wait(timeout=30) == 0
    stderr = proc.stderr.read().decode()
    proc.stdin.close()
    proc.stderr.close()
    assert "Traceback" not in stderr
    assert "stopped reading replies" in stderr


STATELESS_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "0"},
}


async def test_server_discover_names_both_eras_and_the_server(server: StdioServer) -> None:
    reply = await server.request("server/discover", {"_meta": STATELESS_META}, id="d")
    result = reply["result"]
    assert result["resultType"] == "complete"
    assert result["supportedVersions"][0] == "2026-07-28" and "2025-11-25" in result["supportedVersions"]
    assert result["capabilities"]["tools"] == {"listChanged": False}
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "conclave"
    assert result["ttlMs"] > 0 and result["cacheScope"] == "public" and result["instructions"]


async def test_a_stateless_request_without_its_meta_fields_is_invalid_params(server: StdioServer) -> None:
    missing = await server.request("server/discover", {}, id="m")
    assert (missing["id"], missing["error"]["code"]) == ("m", -32602)
    no_caps = {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}
    partial = await server.request("tools/list", {"_meta": no_caps}, id="p")
    assert (partial["id"], partial["error"]["code"]) == ("p", -32602)
    assert "clientCapabilities" in partial["error"]["message"]
    future = {**STATELESS_META, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}
    unknown = await server.request("tools/list", {"_meta": future}, id="u")
    assert unknown["error"]["code"] == -32022
    assert unknown["error"]["data"] == {
        "supported": ["2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"],
        "requested": "2099-01-01",
    }


async def test_stateless_requests_list_and_call_tools_without_a_handshake(server: StdioServer) -> None:
    listed = (await server.request("tools/list", {"_meta": STATELESS_META}, id=1))["result"]
    assert {t["name"] for t in listed["tools"]} >= {"confer", "verify"}
    assert (listed["resultType"], listed["cacheScope"]) == ("complete", "public") and listed["ttlMs"] > 0
    check = {"checks": [{"type": "math", "expression": "6*7", "expected": 42}]}
    params = {"name": "verify", "arguments": check, "_meta": STATELESS_META}
    called = (await server.request("tools/call", params, id=2))["result"]
    assert called["resultType"] == "complete" and called["isError"] is False
    assert called["structuredContent"]["passed"] is True


async def test_handshake_methods_do_not_exist_in_the_stateless_era_but_still_work_without_it(
    server: StdioServer,
) -> None:
    for method in ("initialize", "ping", "logging/setLevel"):
        reply = await server.request(method, {"_meta": STATELESS_META}, id=method)
        assert (reply["id"], reply["error"]["code"]) == (method, -32601)
    assert (await initialize(server))["result"]["protocolVersion"] == "2025-11-25"
    assert (await server.request("ping", id="after"))["result"] == {}


async def test_initialize_negotiates_the_protocol_version(server: StdioServer) -> None:
    reply = await initialize(server)
    assert reply["result"]["protocolVersion"] == "2025-11-25"
    assert reply["result"]["capabilities"]["tools"] == {"listChanged": False}
    assert reply["result"]["serverInfo"]["name"] == "conclave"
    older = await server.request("initialize", {"protocolVersion": "2025-03-26", "capabilities": {}}, id=1)
    assert older["result"]["protocolVersion"] == "2025-03-26"
    future = await server.request("initialize", {"protocolVersion": "2099-01-01", "capabilities": {}}, id=2)
    assert future["result"]["protocolVersion"] == "2025-11-25"


async def test_tools_list_describes_every_tool_with_schemas_and_annotations(server: StdioServer) -> None:
    await initialize(server)
    tools = {t["name"]: t for t in (await server.request("tools/list"))["result"]["tools"]}
    assert set(tools) == {"confer", "coordinate", "fetch", "verify", "list_providers"}
    for tool in tools.values():
        assert tool["inputSchema"]["type"] == "object" and tool["outputSchema"]["type"] == "object"
        assert tool["title"] and tool["description"]
    assert tools["fetch"]["annotations"]["openWorldHint"] is True
    assert tools["fetch"]["annotations"]["readOnlyHint"] is True
    assert tools["verify"]["annotations"]["openWorldHint"] is False


async def test_tools_call_confer_returns_text_and_valid_structured_content_with_progress(
    server: StdioServer, panel: SimPanel
) -> None:
    await initialize(server)
    await server.send(
        {
            "jsonrpc": "2.0",
            "id": "c1",
            "method": "tools/call",
            "params": {
                "name": "confer",
                "arguments": {"question": "Which?"},
                "_meta": {"progressToken": "tok"},
            },
        }
    )
    progress, reply = [], None
    while reply is None:
        message = await server.recv()
        if message.get("method") == "notifications/progress":
            progress.append(message["params"])
        else:
            reply = message
    result = reply["result"]
    assert result["isError"] is False
    assert list(validator("confer.output.json").iter_errors(result["structuredContent"])) == []
    assert "alpha" in result["content"][0]["text"]
    assert [p["progress"] for p in progress] == [1, 2, 3]
    assert {p["progressToken"] for p in progress} == {"tok"}
    assert len(panel.received) == 3


async def test_bad_arguments_are_an_is_error_result_and_an_unknown_tool_is_minus_32602(
    server: StdioServer,
) -> None:
    await initialize(server)
    bad = await server.request("tools/call", {"name": "fetch", "arguments": {"url": 5}})
    assert bad["result"]["isError"] is True
    assert "$.url" in bad["result"]["content"][0]["text"]
    refused = await server.request(
        "tools/call", {"name": "fetch", "arguments": {"url": "http://169.254.169.254/"}}
    )
    assert (
        refused["result"]["isError"] is True and "metadata_address" in refused["result"]["content"][0]["text"]
    )
    unknown = await server.request("tools/call", {"name": "shell", "arguments": {}})
    assert unknown["error"]["code"] == -32602
    # With a progress token the call runs beside the progress reporter: still -32602, unwrapped.
    reported = await server.request(
        "tools/call", {"name": "shell", "arguments": {}, "_meta": {"progressToken": 1}}
    )
    assert reported["error"]["code"] == -32602, reported
    bad = await server.request(
        "tools/call", {"name": "confer", "arguments": 5, "_meta": {"progressToken": 2}}
    )
    assert bad["error"]["code"] == -32602, bad


async def test_plain_methods_return_the_structured_result_or_a_typed_error(server: StdioServer) -> None:
    checks = {"checks": [{"type": "math", "expression": "2+2", "expected": 4}]}
    assert (await server.request("verify", checks))["result"]["passed"] is True
    providers = (await server.request("list_providers"))["result"]["providers"]
    assert [p["name"] for p in providers if p["in_panel"]] == ["alpha", "beta", "gamma"]
    assert all(p["breaker"] == "closed" for p in providers)
    invalid = await server.request("confer", {"question": 7})
    assert invalid["error"]["code"] == -32602
    assert invalid["error"]["data"] == {"path": "$.question", "message": "7 is not of type 'string'"}
    refused = await server.request("fetch", {"url": "file:///etc/passwd"})
    assert refused["error"]["code"] == -32000
    assert refused["error"]["data"]["reason"] == "scheme_not_allowed"


async def test_tools_call_confer_with_an_answer_schema_returns_the_vote_as_its_schema_says(
    server: StdioServer, panel: SimPanel
) -> None:
    """As an MCP client sees it: the tool's published input schema takes `answer_schema`, and the
    structured result carries each member's `value` and the `vote`, valid against the output schema."""
    await initialize(server)
    listed = await server.request("tools/list")
    (confer,) = [t for t in listed["result"]["tools"] if t["name"] == "confer"]
    assert {"answer_schema", "vote_fields", "tolerance"} <= set(confer["inputSchema"]["properties"])
    for model, choice in (("m-alpha", "SQS"), ("m-beta", "SQS"), ("m-gamma", "Kafka")):
        panel.set_scenario(model, Scenario(replies=(Reply(value={"choice": choice, "reason": "r"}),)))
    schema = choices_schema(["SQS", "Kafka"])
    reply = await server.request(
        "tools/call", {"name": "confer", "arguments": {"question": "Which?", "answer_schema": schema}}
    )
    result = reply["result"]["structuredContent"]
    assert list(validator("confer.output.json").iter_errors(result)) == []
    assert [a["value"]["choice"] for a in result["answers"]] == ["SQS", "SQS", "Kafka"]
    assert result["vote"]["consensus"] == {"choice": "SQS"}
    text = reply["result"]["content"][0]["text"]
    assert (
        '## vote — consensus {"choice":"SQS"}' in text
        and '- choice: "SQS" (2 of 3); dissent: gamma "Kafka"' in text
    )


@pytest.mark.parametrize(("tool", "asked"), [("confer", "question"), ("coordinate", "task")])
async def test_an_answer_schema_outside_the_portable_subset_is_refused_naming_the_keyword(
    server: StdioServer, panel: SimPanel, tool: str, asked: str
) -> None:
    schema = {"type": "object", "properties": {"pick": {"type": "string", "pattern": "^[AB]$"}}}
    invalid = await server.request(tool, {asked: "Which?", "answer_schema": schema})
    assert invalid["error"]["code"] == -32602
    assert invalid["error"]["data"]["path"] == "$.answer_schema.properties.pick"
    assert "'pattern'" in invalid["error"]["data"]["message"]
    await initialize(server)
    called = await server.request(
        "tools/call", {"name": tool, "arguments": {asked: "Which?", "answer_schema": schema}}
    )
    assert called["result"]["isError"] is True and "'pattern'" in called["result"]["content"][0]["text"]
    assert panel.received == [], "refused before any call"


async def test_ping_is_answered_during_a_long_call_and_cancel_stops_it_with_no_reply(
    server: StdioServer, panel: SimPanel
) -> None:
    panel.set_scenario("m-alpha", Scenario(replies=(Reply(latency_ms=15_000),)))
    await initialize(server)
    await server.send(
        {
            "jsonrpc": "2.0",
            "id": "slow",
            "method": "tools/call",
            "params": {"name": "confer", "arguments": {"question": "q", "providers": ["alpha"]}},
        }
    )
    with anyio.fail_after(10):
        while not panel.received:
            await anyio.sleep(0.02)
    assert (await server.request("ping", id="p"))["id"] == "p"
    await server.send(
        {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": "slow", "reason": "user gave up"},
        }
    )
    with anyio.fail_after(10):
        while not panel.aborted:
            await anyio.sleep(0.02)
    assert panel.aborted == ["m-alpha"]
    assert (await server.request("ping", id="p2"))["id"] == "p2", "no reply for the cancelled call came first"


async def test_the_server_exits_cleanly_at_stdin_eof_after_finishing_what_it_received(
    server: StdioServer,
) -> None:
    await server.send({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert await server.close() == 0


@pytest.mark.parametrize(("method", "argument"), [("confer", "question"), ("coordinate", "task")])
async def test_a_blank_question_is_invalid_params_naming_it(
    server: StdioServer, method: str, argument: str
) -> None:
    reply = await server.request(method, {argument: " \n\t "}, id=21)
    assert reply["error"]["code"] == -32602
    assert reply["error"]["data"]["path"] == f"$.{argument}"
    assert "is blank" in reply["error"]["message"] + str(reply["error"]["data"])


async def test_while_answers_stream_progress_says_how_far_each_member_is(tmp_path: Path) -> None:
    async with SimPanel(stream_tokens_per_s=60) as slow:
        for model in ("m-alpha", "m-beta", "m-gamma"):
            slow.set_scenario(model, Scenario(replies=(Reply(text="word " * 40),)))
        server = await start_server(panel_config(slow, tmp_path), tmp_path)
        try:
            await initialize(server)
            started = anyio.current_time()
            params = {"name": "confer", "arguments": {"question": "Which?"}, "_meta": {"progressToken": 9}}
            await server.send({"jsonrpc": "2.0", "id": "s1", "method": "tools/call", "params": params})
            notes, reply = [], None
            while reply is None:
                message = await server.recv()
                if message.get("method") == "notifications/progress":
                    notes.append(message["params"])
                else:
                    reply = message
            took = anyio.current_time() - started
        finally:
            server.process.kill()
            await server.process.wait()
    assert reply["result"]["isError"] is False
    counted = [n for n in notes if "tokens" in n["message"]]
    assert counted, "token counts came while the answers streamed"
    assert len(counted) <= took / 0.5 + 1, "at most one count every 0.5 s for the whole call"
    progress = [n["progress"] for n in notes]
    assert progress == sorted(progress) and len(set(progress)) == len(progress), "progress only grows"
    seen: dict[str, int] = {}
    for note in counted:
        for part in note["message"].split(", "):
            member, _, count = part.partition(": ")
            tokens = int(count.removesuffix(" tokens"))
            assert tokens >= seen.get(member, 0), "a member's count never decreases"
            seen[member] = tokens
    assert set(seen) <= {"alpha", "beta", "gamma"} and seen
