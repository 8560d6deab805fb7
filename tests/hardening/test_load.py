"""F7 item 5, load and soak: concurrent `confer` calls over the stdio and HTTP servers against the
simulated panel in its own process (random latencies 50-400 ms, ~5 % injected faults, one attempt).

CI runs 50 calls per transport and a 2-second soak. The long run (`CONCLAVE_LONG=1`, marker `slow`):

    CONCLAVE_LONG=1 .venv/bin/pytest tests/hardening/test_load.py

runs 1,000 concurrent calls per transport (`CONCLAVE_LOAD_N`) and a 10-minute soak at 20 confers/s
(`CONCLAVE_SOAK_SECONDS`, `CONCLAVE_SOAK_RATE`, `CONCLAVE_SOAK_TRANSPORT`). The driver is
`tests/hardening/load.py`; see its docstring for what each run checks.
"""

from __future__ import annotations

import os
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
from conclave.app.sim import Reply, Scenario, SimPanel
from conclave.deliberation.confer import confer
from conclave.schema.config import load_config
from tests.hardening.figures import long_run, record
from tests.hardening.load import (
    TRANSPORTS,
    LoadReport,
    SimProcess,
    SoakReport,
    check_events,
    run_load,
    run_soak,
    serve,
    write_config,
)
from tests.server_support import panel_config

pytestmark = pytest.mark.anyio

LONG = long_run()
CI_N = 50
LONG_N = int(os.environ.get("CONCLAVE_LOAD_N", "1000"))
CI_SOAK_SECONDS = 2.0
SOAK_SECONDS = float(os.environ.get("CONCLAVE_SOAK_SECONDS", "600"))
SOAK_RATE = float(os.environ.get("CONCLAVE_SOAK_RATE", "20"))
SOAK_TRANSPORT: Any = os.environ.get("CONCLAVE_SOAK_TRANSPORT", "http")
long_only = pytest.mark.skipif(not LONG, reason="long run: set CONCLAVE_LONG=1")
ci_only = pytest.mark.skipif(LONG, reason="CONCLAVE_LONG=1 runs the full-size version instead")


def record_load(report: LoadReport) -> None:
    name = f"load {report.transport}"
    record(
        f"{name}: responses lost",
        report.lost + report.invalid_replies + report.duplicates,
        total=report.calls,
        target="== 0",
        details={
            "no reply": report.lost,
            "wrong reply": report.invalid_replies,
            "duplicate or unexpected": report.duplicates,
            "concurrent calls": report.n,
            "throughput confers/s": report.throughput,
            "p50/p95 ms": [report.p50_ms, report.p95_ms],
            "statuses": report.statuses,
        },
    )
    record(
        f"{name}: transcripts lost or corrupt",
        report.transcripts_lost + report.transcripts_corrupt,
        total=report.calls,
        target="== 0",
        details={"lost": report.transcripts_lost, "corrupt or mismatched": report.transcripts_corrupt},
    )
    record(
        f"{name}: invalid event lines",
        report.invalid_event_lines,
        total=report.event_lines,
        target="== 0",
        details={"sessions missing events": report.sessions_missing_events},
    )
    record(
        f"{name}: RSS drift %",
        report.rss_drift_pct,
        target="abs <= 10",
        unit="%",
        details={"warm MB": report.rss_warm_mb, "after MB": report.rss_after_mb},
    )


def record_soak(report: SoakReport) -> None:
    record("soak: duration s", report.duration_s, target=f">= {report.seconds_planned:g}", unit="s")
    record(
        "soak: throughput confers/s",
        report.throughput,
        target=f">= {0.95 * report.rate:g}",
        details={"rate": report.rate, "transport": report.transport, "drain s": report.drain_s},
    )
    record(
        "soak: errors",
        report.errors,
        target="== 0",
        details={
            "calls": report.calls,
            "completed": report.completed,
            "lost": report.lost,
            "wrong replies": report.invalid_replies,
            "transcripts": report.transcripts_bad,
            "invalid event lines": report.invalid_event_lines,
            "sessions missing events": report.sessions_missing_events,
            "p50/p95/max ms": [report.p50_ms, report.p95_ms, report.max_ms],
        },
    )
    record(
        "soak: RSS drift %",
        report.rss_drift_pct,
        target="abs <= 10",
        unit="%",
        details={
            "start MB": report.rss_start_mb,
            "end MB": report.rss_end_mb,
            "max MB": report.rss_max_mb,
            "slope MB/min": report.rss_slope_mb_per_min,
            "timeline (s, MB)": report.rss_timeline_mb,
        },
    )


async def load_and_check(transport: Any, n: int, workdir: Path) -> None:
    report = await run_load(transport, n, workdir)
    record_load(report)
    problems = report.problems()
    assert not problems, f"{transport} load, {n} concurrent confers (files in {workdir}):\n" + "\n".join(
        problems
    )


# ----------------------------------------------------------------------------- load


@ci_only
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_concurrent_confers_lose_no_reply_transcript_or_event(transport: str, tmp_path: Path) -> None:
    await load_and_check(transport, CI_N, tmp_path)


@pytest.mark.slow
@long_only
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_thousand_concurrent_confers_lose_nothing(transport: str, tmp_path: Path) -> None:
    await load_and_check(transport, LONG_N, tmp_path)


# ----------------------------------------------------------------------------- soak


@ci_only
async def test_steady_traffic_for_a_few_seconds(tmp_path: Path) -> None:
    report = await run_soak(
        SOAK_TRANSPORT, tmp_path, rate=SOAK_RATE, seconds=CI_SOAK_SECONDS, warmup_calls=20
    )
    record_soak(report)
    problems = report.problems()
    assert not problems, f"soak (files in {tmp_path}):\n" + "\n".join(problems)


@pytest.mark.slow
@long_only
async def test_soak_steady_traffic(tmp_path: Path) -> None:
    report = await run_soak(SOAK_TRANSPORT, tmp_path, rate=SOAK_RATE, seconds=SOAK_SECONDS)
    record_soak(report)
    problems = report.problems()
    assert not problems, f"soak (files in {tmp_path}):\n" + "\n".join(problems)


# ----------------------------------------------------------------------------- weaknesses the load found


async def test_text_with_a_key_like_query_before_a_quote_keeps_transcripts_and_events_parseable(
    tmp_path: Path,
) -> None:
    """A question (echoed in the answer) holding `?key=…"` must still give a transcript and event
    lines that parse. The load run found transcripts and `session_start` lines cut into invalid JSON:
    redaction over serialized bytes ate the backslash of the escaped quote."""
    question = 'Read https://api.example.test/v1?key=abc123"quoted" and say "done".'
    async with SimPanel() as panel:
        panel.set_scenario("m-alpha", Scenario(replies=(Reply(text="echo: {last}"),)))
        path = panel_config(
            panel, tmp_path, telemetry={"path": str(tmp_path / "events.ndjson"), "include_content": True}
        )
        config = load_config(str(path), env={}, dotenv=None)
        async with open_runtime(config) as runtime:
            result = (await confer(runtime, {"question": question, "providers": ["alpha"]})).to_dict()
    assert result["answers"][0]["status"] == "ok"
    transcripts = list((tmp_path / "transcripts").rglob("*.json"))
    assert len(transcripts) == 1
    try:
        saved = orjson.loads(transcripts[0].read_bytes())
    except orjson.JSONDecodeError as exc:
        pytest.fail(f"the transcript does not parse: {exc}: {transcripts[0].read_bytes()[:600]!r}")
    assert saved["session_id"] == result["session_id"]
    events = check_events(tmp_path / "events.ndjson", [result["session_id"]], members=1)
    assert events.invalid == [] and events.missing == []


@pytest.fixture
async def http_base_url(tmp_path: Path) -> AsyncIterator[str]:
    async with SimPanel() as panel:
        panel.set_scenario("m-alpha", Scenario(latency_ms=600))
        config = load_config(str(panel_config(panel, tmp_path)), env={}, dotenv=None)
        async with open_runtime(config) as runtime:
            runner = web.AppRunner(build_app(Server(runtime)), access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            try:
                yield f"http://127.0.0.1:{port}"
            finally:
                await runner.cleanup()


async def test_over_http_one_client_cannot_cancel_another_clients_request(http_base_url: str) -> None:
    """Every HTTP client numbers its requests from 1. Client B's `notifications/cancelled` for *its*
    request 1 must not cancel client A's request 1: A must still get its reply. The server keys
    in-flight calls by the bare JSON-RPC id across all HTTP clients, so A got an empty 204 (a lost
    response, caused by someone else)."""
    replies: dict[str, httpx.Response] = {}
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "confer",
        "params": {"question": "Which?", "providers": ["alpha"]},
    }
    cancel = {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": 1, "reason": "mine"},
    }

    async def client_a() -> None:
        async with httpx.AsyncClient(base_url=http_base_url) as client:
            replies["a"] = await client.post("/rpc", json=call)

    async def client_b() -> None:
        await anyio.sleep(0.2)  # A's call is in flight (the panel answers after 600 ms)
        async with httpx.AsyncClient(base_url=http_base_url) as client:
            replies["b"] = await client.post(
                "/mcp", json=cancel, headers={"accept": "application/json, text/event-stream"}
            )

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(client_a)
            group.start_soon(client_b)
    assert replies["b"].status_code == 202
    a = replies["a"]
    assert a.status_code == 200 and a.content, (
        f"client A's reply was lost: HTTP {a.status_code} {a.content!r}"
    )
    assert a.json()["result"]["answers"][0]["status"] == "ok"


async def test_a_cancelled_confer_still_closes_its_session_in_the_event_log(tmp_path: Path) -> None:
    """`notifications/cancelled` (and a client hanging up mid-call, under load) cancels the call's
    scope. The event log must still close the session: a `session_end` after the `session_start`,
    valid against its schema. Today the session stays open forever (no `session_end`, and no
    `provider_call` for the upstream requests already sent), so `conclave tail` and any accounting
    built on the log cannot tell a cancelled call from one still running."""
    async with SimPanel() as panel:
        panel.set_scenario("m-alpha", Scenario(latency_ms=3000))
        config = load_config(str(panel_config(panel, tmp_path)), env={}, dotenv=None)
        async with open_runtime(config) as runtime:
            with anyio.move_on_after(0.3) as scope:  # what the server's per-request scope does
                await confer(
                    runtime, {"question": "Which?", "providers": ["alpha"], "session_id": "s-cancelled"}
                )
    assert scope.cancelled_caught
    check = check_events(tmp_path / "events.ndjson", [])
    assert check.invalid == []
    lines = [orjson.loads(line) for line in (tmp_path / "events.ndjson").read_bytes().splitlines()]
    names = [e["event"] for e in lines if e.get("session_id") == "s-cancelled"]
    assert names[0] == "session_start"
    assert "session_end" in names, f"the cancelled session was never closed: {names}"


async def test_a_bearer_token_after_a_tab_or_newline_is_redacted_from_transcripts_and_events(
    tmp_path: Path,
) -> None:
    """The transcript check compares each transcript with its reply after `Redactor.value` (what the
    writer used to apply). Serialized-bytes redaction (`Redactor.json_bytes`) differs for a bearer
    token separated by a tab or newline: in JSON those are the escapes `\\t` / `\\n`, which the
    `bearer\\s+` shape does not match, so the token reaches transcripts and (with content on) events."""
    token = "tok9Zq7Xw3Lm5Pr8Ks2"
    question = f"The failing request sent 'Authorization: Bearer\t{token}' and\nBearer\n{token}."
    async with SimPanel() as panel:
        panel.set_scenario("m-alpha", Scenario(replies=(Reply(text="echo: {last}"),)))
        telemetry = {"path": str(tmp_path / "events.ndjson"), "include_content": True}
        config = load_config(str(panel_config(panel, tmp_path, telemetry=telemetry)), env={}, dotenv=None)
        async with open_runtime(config) as runtime:
            result = (await confer(runtime, {"question": question, "providers": ["alpha"]})).to_dict()
    assert token in (result["answers"][0]["text"] or "")  # the reply itself is the caller's own text
    written = {p.name: p.read_bytes() for p in (tmp_path / "transcripts").rglob("*.json")}
    written["events.ndjson"] = (tmp_path / "events.ndjson").read_bytes()
    leaked = sorted(name for name, data in written.items() if token.encode() in data)
    assert leaked == [], f"the bearer token was written to {leaked}"


async def test_over_http_a_client_that_hangs_up_stops_its_call(tmp_path: Path) -> None:
    """Over HTTP each POST is its own connection for request ids, so `notifications/cancelled` from
    another POST cannot reach a call; the only way left to cancel is hanging up (the comment in
    `conclave/app/server/http.py` says aiohttp then cancels the handler). `conclave serve --http` builds
    its `AppRunner` without `handler_cancellation=True`, so aiohttp lets the handler run on: under
    load, every call a client abandons (a client timeout, a retry storm) keeps its provider requests
    going to the end. Measured: the session ends `ok` after the full upstream latency, not `cancelled`."""
    async with SimProcess(tmp_path) as sim:
        root = sim.urls["openai"].rsplit("/openai", 1)[0]
        async with httpx.AsyncClient(base_url=root, trust_env=False) as control:
            reply = await control.put("/_sim/scenarios/m-alpha", json={"latency_ms": 2500})
            reply.raise_for_status()
        config = write_config(sim, tmp_path)
        async with serve("http", config, tmp_path) as server:
            call = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "confer",
                "params": {"question": "Which?", "providers": ["alpha"], "session_id": "s-hung-up"},
            }
            async with httpx.AsyncClient(base_url=server.base_url, trust_env=False) as client:
                with anyio.move_on_after(0.4):  # the client gives up and closes its connection
                    await client.post("/rpc", json=call)
            await anyio.sleep(1.0)  # well before the panel would answer (2.5 s after the call)
            events = [orjson.loads(line) for line in (tmp_path / "events.ndjson").read_bytes().splitlines()]
    ends = [e for e in events if e.get("event") == "session_end" and e.get("session_id") == "s-hung-up"]
    assert [e["status"] for e in ends] == ["cancelled"], f"session_end events for the call: {ends}"
