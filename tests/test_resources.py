"""Past deliberations as MCP resources (docs/server.md#resources): listed newest first, read whole
as JSON or summarized as Markdown, in both eras, over stdio and HTTP; hostile ids refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from conclave.app.labels import DEGRADED_LABELS
from conclave.app.runtime import open_runtime
from conclave.app.server.core import Server
from conclave.app.sim import SimPanel
from conclave.app.ui.markdown import session_markdown
from conclave.app.ui.model import from_transcript
from conclave.app.ui.sessions import Sessions
from conclave.schema.config import load_config
from tests.hardening.load import serve
from tests.server_support import StdioServer, panel_config, start_server

pytestmark = pytest.mark.anyio

QUESTIONS = ("Which queue should we use for the billing jobs?", "Is Redis enough for the session cache?")
HOSTILE = (
    "conclave://sessions/../etc/passwd",
    "conclave://sessions/a/b",
    "conclave://sessions/%2e%2e%2fetc%2fpasswd",
    "conclave://sessions/..",
    "conclave://sessions/",
    "file:///etc/passwd",
    "conclave://elsewhere/abc",
)


async def nowhere(_message: Any) -> None:
    pass


def confer(question: str) -> dict[str, Any]:
    return {"name": "confer", "arguments": {"question": question}}


# ---------------------------------------------------------------- stdio, the handshake era


async def rpc(server: StdioServer, method: str, params: Any = None, *, id: Any = 1) -> dict[str, Any]:
    reply: dict[str, Any] = await server.request(method, params, id=id)
    return reply


async def test_past_sessions_are_listed_read_and_summarized_over_stdio(
    panel: SimPanel, tmp_path: Path
) -> None:
    server = await start_server(panel_config(panel, tmp_path), tmp_path)
    try:
        init = await rpc(server, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {}})
        results = []
        for n, question in enumerate(QUESTIONS, 2):
            called = await rpc(server, "tools/call", confer(question), id=n)
            results.append(called["result"]["structuredContent"])
        listed = (await rpc(server, "resources/list", {}, id=10))["result"]
        templates = (await rpc(server, "resources/templates/list", id=11))["result"]
        newest = results[-1]
        uri = f"conclave://sessions/{newest['session_id']}"
        whole = (await rpc(server, "resources/read", {"uri": uri}, id=12))["result"]
        summary = (await rpc(server, "resources/read", {"uri": uri + "/summary"}, id=13))["result"]
        bad_cursor = await rpc(server, "resources/list", {"cursor": "nope"}, id=14)
        unknown = await rpc(server, "resources/read", {"uri": "conclave://sessions/no-such-session"}, id=15)
        hostile = [await rpc(server, "resources/read", {"uri": u}, id=f"h{i}") for i, u in enumerate(HOSTILE)]
    finally:
        assert await server.close() == 0

    assert init["result"]["capabilities"]["resources"] == {"listChanged": False}
    resources = listed["resources"]
    assert [r["name"] for r in resources] == [r["session_id"] for r in reversed(results)], "newest first"
    assert "nextCursor" not in listed
    first = resources[0]
    assert first["uri"] == uri and first["mimeType"] == "application/json"
    assert first["title"] == QUESTIONS[-1]
    assert first["description"].startswith("confer, ") and "started 20" in first["description"]
    assert [t["uriTemplate"] for t in templates["resourceTemplates"]] == [
        "conclave://sessions/{id}",
        "conclave://sessions/{id}/summary",
    ]
    assert [t["mimeType"] for t in templates["resourceTemplates"]] == ["application/json", "text/markdown"]

    (content,) = whole["contents"]
    assert (content["uri"], content["mimeType"]) == (uri, "application/json")
    transcript = json.loads(content["text"])
    assert transcript["tool"] == "confer" and transcript["session_id"] == newest["session_id"]
    assert transcript["arguments"]["question"] == QUESTIONS[-1]
    assert [a["text"] for a in transcript["result"]["answers"]] == [a["text"] for a in newest["answers"]]

    (markdown,) = summary["contents"]
    assert markdown["mimeType"] == "text/markdown" and markdown["uri"] == uri + "/summary"
    text = markdown["text"]
    assert QUESTIONS[-1] in text
    for answer in newest["answers"]:
        assert answer["text"] and answer["text"] in text and f"### {answer['provider']} " in text
    assert "## Totals" in text and "tokens" in text

    assert bad_cursor["error"]["code"] == -32602
    assert unknown["error"]["code"] == -32002, "the handshake era's resource-not-found"
    assert unknown["error"]["data"] == {"uri": "conclave://sessions/no-such-session"}
    assert "no-such-session" in unknown["error"]["message"]
    for uri_sent, reply in zip(HOSTILE, hostile, strict=True):
        assert reply["error"]["code"] == -32602, uri_sent
        assert reply["error"]["data"] == {"uri": uri_sent} and uri_sent in reply["error"]["message"]


# ---------------------------------------------------------------- HTTP, the stateless era

META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}
ACCEPT = {"accept": "application/json, text/event-stream"}


def stateless(method: str, params: dict[str, Any] | None = None, id: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": {**(params or {}), "_meta": META}}


def headers(method: str, name: str | None = None) -> dict[str, str]:
    sent = {**ACCEPT, "mcp-protocol-version": "2026-07-28", "mcp-method": method}
    return sent | ({"mcp-name": name} if name is not None else {})


async def test_past_sessions_over_http_in_the_stateless_era(panel: SimPanel, tmp_path: Path) -> None:
    async with (
        serve("http", panel_config(panel, tmp_path), tmp_path) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as client,
    ):

        async def post(method: str, params: dict[str, Any] | None = None, name: str | None = None) -> Any:
            return await client.post("/mcp", json=stateless(method, params), headers=headers(method, name))

        discovered = (await post("server/discover")).json()["result"]
        sessions = []
        for question in QUESTIONS:
            called = await post("tools/call", confer(question), "confer")
            sessions.append(called.json()["result"]["structuredContent"]["session_id"])
        listed = (await post("resources/list")).json()["result"]
        templates = (await post("resources/templates/list")).json()["result"]
        uri = f"conclave://sessions/{sessions[0]}"
        read = (await post("resources/read", {"uri": uri}, uri)).json()["result"]
        summary = (await post("resources/read", {"uri": uri + "/summary"}, uri + "/summary")).json()["result"]
        no_name = await post("resources/read", {"uri": uri})
        missing = "conclave://sessions/no-such-session"
        unknown = await post("resources/read", {"uri": missing}, missing)
        hostile = await post("resources/read", {"uri": HOSTILE[0]}, HOSTILE[0])
        bad_cursor = await post("resources/list", {"cursor": "nope"})

    assert discovered["capabilities"]["resources"] == {"listChanged": False}
    assert [r["name"] for r in listed["resources"]] == list(reversed(sessions))
    assert (listed["resultType"], listed["ttlMs"], listed["cacheScope"]) == ("complete", 0, "private")
    assert templates["cacheScope"] == "public" and len(templates["resourceTemplates"]) == 2
    assert (read["resultType"], read["cacheScope"]) == ("complete", "private")
    assert json.loads(read["contents"][0]["text"])["arguments"]["question"] == QUESTIONS[0]
    assert QUESTIONS[0] in summary["contents"][0]["text"]
    assert (no_name.status_code, no_name.json()["error"]["code"]) == (400, -32020), "Mcp-Name is required"
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (400, -32602), "not found, in this era"
    assert unknown.json()["error"]["data"] == {"uri": missing}
    assert (hostile.status_code, hostile.json()["error"]["code"]) == (400, -32602)
    assert (bad_cursor.status_code, bad_cursor.json()["error"]["code"]) == (400, -32602)


# ---------------------------------------------------------------- in process: paging, no sessions


async def test_the_list_pages_newest_first_with_an_opaque_cursor(panel: SimPanel, tmp_path: Path) -> None:
    config = load_config(str(panel_config(panel, tmp_path)), env={}, dotenv=None)
    async with open_runtime(config) as runtime:
        server = Server(runtime, page_size=2)
        empty = await server.handle_message(request("resources/list"), nowhere)
        asked = []
        for n in range(5):
            reply = await server.handle_message(
                request("tools/call", confer(f"Question number {n}?")), nowhere
            )
            asked.append(reply["result"]["structuredContent"]["session_id"])
            if n == 2:  # a dry run between them: it has no transcript to read, so it is not listed
                planned = {"name": "confer", "arguments": {"question": "Plan?", "dry_run": True}}
                await server.handle_message(request("tools/call", planned), nowhere)
        pages, cursor = [], None
        for _ in range(5):
            reply = await server.handle_message(
                request("resources/list", {"cursor": cursor} if cursor else {}), nowhere
            )
            pages.append([r["name"] for r in reply["result"]["resources"]])
            cursor = reply["result"].get("nextCursor")
            if cursor is None:
                break
    assert empty["result"] == {"resources": []}
    assert [len(page) for page in pages] == [2, 2, 1]
    assert [name for page in pages for name in page] == list(reversed(asked))


def request(method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}


# ---------------------------------------------------------------- the summary's wording


def test_the_summary_says_fallbacks_late_members_review_and_coordinate_plainly(tmp_path: Path) -> None:
    day = tmp_path / "transcripts" / "2026-11-27"
    day.mkdir(parents=True)
    usage = {"input_tokens": 120, "output_tokens": 45, "cost_usd": 0.0012}
    confer_result = {
        "session_id": "s-confer",
        "answers": [
            {"provider": "alpha", "model": "m-alpha", "status": "ok", "text": "Use a queue.", "usage": usage},
            {
                "provider": "delta",
                "model": "m-delta",
                "status": "ok",
                "text": "Use Kafka.",
                "fallback_from": {"provider": "beta", "status": "error", "code": "auth_error"},
            },
            {"provider": "gamma", "model": "m-gamma", "status": "late", "text": None},
        ],
        "review": {
            "rankings": [],
            "aggregate": [{"provider": "alpha", "borda": 1.0, "mean_rank": 1.0, "reviews": 2}],
            "top": "alpha",
            "agreement": 0.5,
        },
        "synthesis": {
            "provider": "alpha",
            "model": "m-alpha",
            "status": "ok",
            "envelope": {"answer": "A queue."},
        },
        "degraded": True,
        "degraded_reasons": [{"provider": "gamma", "status": "late"}],
        "usage": usage,
        "latency_ms": 1500,
    }
    coordinate_result = {
        "session_id": "s-coord",
        "rounds": [
            {
                "round": 1,
                "proposal": {
                    "provider": "alpha",
                    "model": "m",
                    "role": "proposer",
                    "status": "ok",
                    "envelope": {"proposal": "Use PostgreSQL."},
                },
                "critiques": [
                    {
                        "provider": "beta",
                        "model": "m",
                        "role": "critic",
                        "status": "ok",
                        "envelope": {"verdict": "accept", "issues": [], "summary": "Sound."},
                    }
                ],
            }
        ],
        "synthesis": {
            "provider": "gamma",
            "model": "m",
            "role": "synthesizer",
            "status": "ok",
            "envelope": {"answer": "PostgreSQL it is.", "confidence": 0.9},
        },
        "converged": True,
        "rounds_run": 1,
        "usage": usage,
    }
    for sid, tool, result, asked in (
        ("s-confer", "confer", confer_result, {"question": "Which queue?"}),
        ("s-coord", "coordinate", coordinate_result, {"task": "Pick a database."}),
    ):
        body = {"tool": tool, "session_id": sid, "arguments": asked, "result": result}
        (day / f"{sid}-{tool}-100000000000-0000.json").write_bytes(orjson.dumps(body))
    sessions = Sessions(tmp_path / "events.ndjson", tmp_path / "transcripts")

    def markdown(sid: str) -> str:
        row = sessions.summary(sid)
        assert row is not None
        return session_markdown(from_transcript(row, sessions.transcript(sid) or {}))

    said = markdown("s-confer")
    assert "## Question\n\nWhich queue?" in said
    assert "Answered for beta (its API key was refused)." in said
    assert f"Late ({DEGRADED_LABELS['late']})." in said
    assert "Top: alpha (agreement 0.50)" in said and "1. alpha: Borda 1.0" in said
    assert "## Synthesis" in said and "A queue." in said
    assert "120 in / 45 out tokens" in said and "$0.001200" in said and "1.50 s" in said
    assert "- gamma: " + DEGRADED_LABELS["late"] in said
    debate = markdown("s-coord")
    assert "## Task\n\nPick a database." in debate
    assert "## Round 1" in debate and "Use PostgreSQL." in debate and "verdict: accept" in debate
    assert "PostgreSQL it is." in debate and "every critic accepted" in debate
