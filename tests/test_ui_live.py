"""The page's live text: a session running in the process that serves the page (`conclave serve
--http`) streams its answers to `/ui/live?session=…` as they come, from the runtime's hub and never
through the event log. Over real HTTP against a subprocess and a slow-streaming SimPanel; the
route's refusals; and the page on its own (`conclave ui`), which has no hub and says 404."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from conclave.app.sim import SimPanel
from conclave.app.ui import build_app
from conclave.app.ui.app import CSP
from conclave.core.messages import Delta
from conclave.deliberation.live import LiveDeltas
from conclave.schema.config import load_config
from tests.live_support import (
    ACCEPT,
    MEMBERS,
    confer_call,
    live_config,
    read_sse,
    script_long_replies,
    serve_http,
    sse_messages,
)
from tests.support import read_events

pytestmark = pytest.mark.anyio


async def hear_live(
    http: httpx.AsyncClient, session_id: str, called: dict[str, Any]
) -> list[tuple[str, Any]]:
    """`/ui/live` for `session_id`, from before its first delta until it ends. Until the session
    begins in the server, the stream ends at once and empty: ask again."""
    while True:
        events = await read_sse(http, f"/ui/live?session={session_id}")
        if any(name == "delta" for name, _ in events):
            return events
        assert "messages" not in called, f"the call ended before its page heard it: {events}"
        await anyio.sleep(0.05)


async def test_a_running_session_s_answers_stream_to_its_page_live_and_never_to_the_event_log(
    tmp_path: Path,
) -> None:
    async with SimPanel(stream_tokens_per_s=40) as panel:
        # The members think a second, then stream 60 words each for a second and a half.
        replies = script_long_replies(panel, latency_ms=1000)
        with serve_http(live_config(panel, tmp_path), tmp_path) as base:
            async with httpx.AsyncClient(base_url=base, timeout=60) as http:
                called: dict[str, Any] = {}
                pages: list[str] = []

                async def call() -> None:
                    response = await http.post("/mcp", json=confer_call("live-1"), headers=ACCEPT)
                    called["messages"] = sse_messages(response.text)

                async def watch_the_page() -> None:
                    while "messages" not in called:
                        page = await http.get("/ui/session?id=live-1")
                        if page.status_code == 200 and "data-live=" in page.text:
                            pages.append(page.text)
                            return
                        await anyio.sleep(0.05)

                with anyio.fail_after(60):
                    async with anyio.create_task_group() as group:
                        group.start_soon(call)
                        group.start_soon(watch_the_page)
                        heard = await hear_live(http, "live-1", called)
                    after = await read_sse(http, "/ui/live?session=live-1")
    events = read_events(tmp_path / "events.ndjson")  # the server has stopped: all of it is written

    *final_progress, final = called["messages"]
    answers = {a["provider"]: a["text"] for a in final["result"]["structuredContent"]["answers"]}
    assert answers == replies, "the scripted replies are the answers"

    assert heard[-1] == ("end", {}), "the stream ends with the session"
    assert [name for name, _ in heard if name != "delta"] == ["end"], "nothing dropped, nothing else"
    deltas = [data for name, data in heard if name == "delta"]
    assert {d["kind"] for d in deltas} == {"start", "text"} and {d["role"] for d in deltas} == {None}
    starts = [d["provider"] for d in deltas if d["kind"] == "start"]
    assert sorted(starts) == sorted(MEMBERS), "each member's one model call opens with a start"
    assert all(set(d) == {"provider", "role", "kind", "text", "index"} for d in deltas)
    said = {name: "".join(d["text"] for d in deltas if d["provider"] == name) for name in MEMBERS}
    assert said == answers, "every piece, in order: the page's text is each final answer"
    assert len(deltas) >= 3 * 50, "heard as it streamed, a word or so at a time"

    # The caller's own sink still heard them: MCP progress counted the tokens meanwhile.
    assert any("tokens" in m["params"].get("message", "") for m in final_progress)

    (page,) = pages
    assert 'data-live="/ui/live?session=live-1"' in page and 'id="streaming"' in page
    assert after == [("end", {})], "an ended session: an empty stream"

    log = (tmp_path / "events.ndjson").read_text(encoding="utf-8")
    assert "Zebrafinch" not in log, "no delta text (nor answer text, content off) in the event log"
    assert not any("delta" in str(e["event"]) for e in events)
    assert [e["event"] for e in events if e.get("session_id") == "live-1"].count("provider_call") == 3
    transcript = "".join(p.read_text(encoding="utf-8") for p in (tmp_path / "transcripts").rglob("*.json"))
    assert "Zebrafinch-alpha-59" in transcript, "the answers are kept where they always were"


async def test_the_live_route_refuses_as_the_page_does_and_never_fails(tmp_path: Path) -> None:
    async with SimPanel() as panel:
        with serve_http(live_config(panel, tmp_path), tmp_path) as base:
            port = base.rsplit(":", 1)[1]
            async with httpx.AsyncClient(base_url=base, timeout=30) as http:
                with anyio.fail_after(30):
                    unknown = await read_sse(http, "/ui/live?session=nobody-here")
                responses = {
                    "no id": await http.get("/ui/live"),
                    "bad id": await http.get("/ui/live", params={"session": "../../etc/passwd"}),
                    "long id": await http.get("/ui/live", params={"session": "a" * 129}),
                    "hostile host": await http.get(
                        "/ui/live?session=nobody-here", headers={"Host": f"rebound.attacker.example:{port}"}
                    ),
                    "foreign origin": await http.get(
                        "/ui/live?session=nobody-here", headers={"Origin": "http://attacker.example"}
                    ),
                    "post": await http.post("/ui/live?session=nobody-here"),
                }
    assert unknown == [("end", {})], "a session not running here: an empty stream, at once"
    statuses = {name: response.status_code for name, response in responses.items()}
    assert statuses == {
        "no id": 404,
        "bad id": 404,
        "long id": 404,
        "hostile host": 403,
        "foreign origin": 403,
        "post": 405,
    }
    for name, response in responses.items():
        assert response.headers["content-security-policy"] == CSP, name


# -- in process: the page with a hub, and without --------------------------------------------------


@pytest.fixture
def config(tmp_path: Path) -> Any:
    overrides = [f"telemetry.path={tmp_path}/events.ndjson", f"transcripts.dir={tmp_path}/transcripts"]
    return load_config(None, overrides=overrides, env={}, dotenv=None)


@pytest.fixture
async def hub_client(
    config: Any,
) -> AsyncIterator[tuple[LiveDeltas, TestClient[web.Request, web.Application]]]:
    hub = LiveDeltas()
    server = TestServer(build_app(config, live=hub), handler_cancellation=True)
    async with TestClient(server) as client:
        yield hub, client


async def test_a_reader_that_leaves_is_unsubscribed(
    hub_client: tuple[LiveDeltas, TestClient[web.Request, web.Application]],
) -> None:
    hub, client = hub_client
    with hub.running("s1"), anyio.fail_after(10):
        response = await client.get("/live?session=s1")
        assert response.status == 200
        while hub.subscribers("s1") == 0:
            await anyio.sleep(0.01)
        hub.publish("s1", "alpha", None, Delta("text", "<b>hi</b>"))
        line = b""
        while b"\n\n" not in line:
            line += await response.content.readany()
        assert line.startswith(b"event: delta\ndata: ")
        assert b'"text":"<b>hi</b>"' in line, "JSON, the text as it was: the page sets it as text"
        response.close()
        while hub.subscribers("s1"):
            hub.publish("s1", "alpha", None, Delta("text", "more"))  # a write to the gone reader fails
            await anyio.sleep(0.01)


async def test_a_reader_that_falls_behind_is_told_what_it_missed(config: Any) -> None:
    hub = LiveDeltas(buffer=4)
    async with TestClient(TestServer(build_app(config, live=hub))) as client:
        with anyio.fail_after(10):
            with hub.running("s1"):
                response = await client.get("/live?session=s1")
                while hub.subscribers("s1") == 0:
                    await anyio.sleep(0.01)
                for i in range(50):  # faster than any reader: no await between them
                    hub.publish("s1", "alpha", None, Delta("text", f"{i} "))
            body = (await response.read()).decode()
    names = [line.removeprefix("event: ") for line in body.splitlines() if line.startswith("event: ")]
    assert names[-2:] == ["gap", "end"] and names.count("delta") < 50
    dropped = int(body.split('event: gap\ndata: {"dropped":')[1].split("}")[0])
    assert names.count("delta") + dropped == 50, "each delta is either heard or counted as dropped"


async def test_the_page_on_its_own_has_no_hub_so_no_live_text(config: Any, tmp_path: Path) -> None:
    log = tmp_path / "events.ndjson"
    log.write_text(
        '{"ts": 1.0, "event": "session_start", "session_id": "s1", "tool": "confer"}\n', encoding="utf-8"
    )
    async with TestClient(TestServer(build_app(config))) as client:
        live = await client.get("/live?session=s1")
        page = await client.get("/session?id=s1")
        text = await page.text()
    assert live.status == 404 and live.headers["Content-Security-Policy"] == CSP
    assert page.status == 200 and "running" in text
    assert "data-live" not in text and "data-events" in text, "it follows the log as before, no more"


async def test_a_session_running_elsewhere_gets_no_live_attribute_even_with_a_hub(
    hub_client: tuple[LiveDeltas, TestClient[web.Request, web.Application]], tmp_path: Path
) -> None:
    hub, client = hub_client
    (tmp_path / "events.ndjson").write_text(
        '{"ts": 1.0, "event": "session_start", "session_id": "s1", "tool": "confer"}\n', encoding="utf-8"
    )
    elsewhere = await (await client.get("/session?id=s1")).text()
    with hub.running("s1"):
        here = await (await client.get("/session?id=s1")).text()
    assert "data-live" not in elsewhere
    assert 'data-live="/live?session=s1"' in here
