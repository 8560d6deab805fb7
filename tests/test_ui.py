"""The page of `conclave ui` without a browser: the records it reads sessions into, the HTML it
renders from them, and the guard and headers every response passes through. (The browser's view
is tests/test_ui_browser.py.)"""

from __future__ import annotations

import dataclasses
import html as htmllib
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from conclave.app.cli import main as cli_main
from conclave.app.demo import CRITIC_ASK, PROPOSER_ASK, SYNTHESIZER_ASK, run_demo
from conclave.app.runner import run_tool
from conclave.app.runtime import open_runtime
from conclave.app.sim import Reply, Rule, Scenario, SimPanel
from conclave.app.sim.simulated import simulated_config
from conclave.app.ui import build_app, mount
from conclave.app.ui.app import CSP
from conclave.app.ui.markup import Safe, el, escape
from conclave.app.ui.model import from_events, from_transcript
from conclave.app.ui.pages import session_body
from conclave.app.ui.sessions import RECENT, Sessions
from conclave.schema.answer_schema import choices_schema
from conclave.schema.config import Config
from tests.ui_support import IMG, SCRIPT, hostile_session, model, workdir_config


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's three sessions and a hostile one, run for real into one folder."""
    folder = tmp_path_factory.mktemp("ui")
    base = workdir_config(folder)
    anyio.run(lambda: run_demo(base, latency_ms=0, progress=None))
    anyio.run(hostile_session, base, "hostile-1")
    return folder


@pytest.fixture
def sessions(workdir: Path) -> Sessions:
    return Sessions(workdir / "events.ndjson", workdir / "transcripts")


DEMO_PREFIXES = {"confer": "demo-confer-", "coordinate": "demo-coord-", "vote": "demo-vote-"}


def demo_id(sessions: Sessions, which: str) -> str:
    """One of the demo's sessions: its confer with tools, its coordinate, or its confer that votes."""
    return next(s.session_id for s in sessions.recent() if s.session_id.startswith(DEMO_PREFIXES[which]))


def view_of(sessions: Sessions, session_id: str) -> Safe:
    summary = sessions.summary(session_id)
    assert summary is not None
    transcript = sessions.transcript(session_id)
    assert transcript is not None
    return session_body(from_transcript(summary, transcript))


# -- markup -----------------------------------------------------------------------------------


def test_text_is_escaped_wherever_it_goes_and_only_markup_made_here_passes() -> None:
    assert el("p", SCRIPT) == "<p>&lt;script&gt;window.__pwned=1&lt;/script&gt;</p>"
    assert el("a", "x", href='" onmouseover="alert(1)') == '<a href="&quot; onmouseover=&quot;alert(1)">x</a>'
    safe = el("b", "bold")
    assert el("p", safe) == "<p><b>bold</b></p>"
    assert el("p", safe + "<i>") == "<p>&lt;b&gt;bold&lt;/b&gt;&lt;i&gt;</p>", "Safe + str is a str again"
    assert el("p", ["a", ["<b>", None, 3]]) == "<p>a&lt;b&gt;3</p>"
    assert escape(IMG) == "&lt;img src=&quot;x&quot; onerror=&quot;window.__pwned=2&quot;&gt;"


# -- reading sessions -------------------------------------------------------------------------


def test_the_list_has_every_session_with_its_tool_question_status_and_cost(sessions: Sessions) -> None:
    rows = {row.session_id: row for row in sessions.recent()}
    confer, coordinate = rows[demo_id(sessions, "confer")], rows[demo_id(sessions, "coordinate")]
    assert confer.status == coordinate.status == "ok" and not confer.degraded
    assert confer.question is not None and confer.question.startswith(
        "How tall is the Exampleville lighthouse?"
    )
    assert coordinate.question is not None and coordinate.question.startswith("Choose an eviction policy")
    assert confer.cost_usd and confer.cost_usd > 0 and confer.duration_ms and confer.answers == confer.ok == 7
    hostile = rows["hostile-1"].question or ""
    assert hostile.startswith("What does http://127.0.0.1:") and hostile.endswith(SCRIPT)
    assert list(rows)[-1] == confer.session_id, "newest first: the demo ran before the hostile session"


def test_a_confer_reads_as_answers_side_by_side_with_each_hop_and_its_neutralized_result(
    sessions: Sessions,
) -> None:
    summary = sessions.summary(demo_id(sessions, "confer"))
    assert summary is not None
    view = from_transcript(summary, sessions.transcript(summary.session_id) or {})
    answers = {a.provider: a for a in view.answers}
    assert list(answers) == ["sim-openai", "sim-anthropic", "sim-gemini"]
    fetcher = answers["sim-openai"]
    assert fetcher.status == "ok" and fetcher.model == "sim-gpt" and fetcher.hops == 2 and fetcher.cost_usd
    (hop,) = fetcher.calls
    assert (hop.number, hop.tool, hop.status) == (1, "fetch", "ok")
    assert hop.result is not None and "<untrusted_input>" in hop.result and "47 metres tall" in hop.result
    assert not hop.said and hop.arguments is not None, "a native call: its arguments are the call"
    assert "/lighthouse" in hop.arguments
    assert "<tool_call>" in (answers["sim-gemini"].calls[0].said or ""), "the tag the model wrote is the call"
    html = view_of(sessions, summary.session_id)
    assert "fetch {" in html and "/lighthouse&quot;" in html, "the native call shown with its arguments"
    assert view.review is not None and view.review.top == "sim-gemini" and len(view.review.rankings) == 3
    assert view.review.aggregate[0]["provider"] == "sim-gemini"
    assert view.synthesis is not None and view.synthesis.provider == "sim-anthropic"
    assert view.synthesis.envelope and "47 metres" in view.synthesis.envelope["answer"]
    assert view.usage["cost_usd"] == summary.cost_usd and not view.degraded


def test_a_coordinate_reads_as_rounds_of_proposal_critiques_and_verdicts(sessions: Sessions) -> None:
    summary = sessions.summary(demo_id(sessions, "coordinate"))
    assert summary is not None
    view = from_transcript(summary, sessions.transcript(summary.session_id) or {})
    round_ = view.rounds[0]  # the demo may go on to revise in a second round
    assert round_.proposal is not None and round_.proposal.provider == "sim-openai"
    verdicts = {c.provider: (c.envelope or {}).get("verdict") for c in round_.critiques}
    assert verdicts == {"sim-anthropic": "revise", "sim-gemini": "accept"}
    checked = next(c for c in round_.critiques if c.provider == "sim-gemini")
    assert [h.tool for h in checked.calls] == ["verify"]
    assert view.synthesis is not None and view.synthesis.role == "synthesizer"
    last = {(c.envelope or {}).get("verdict") for c in view.rounds[-1].critiques}
    assert set(view.per_role) == {"proposer", "critic", "synthesizer"} and view.converged is (
        last == {"accept"}
    )
    html = view_of(sessions, summary.session_id)
    assert "Round 1" in html and "revise" in html and "accept" in html and "Synthesis" in html


def test_a_running_session_is_listed_as_running_and_shows_its_events(workdir: Path, tmp_path: Path) -> None:
    log = tmp_path / "events.ndjson"
    sessions = Sessions(log, tmp_path / "none")
    assert sessions.recent() == []
    start = {
        "ts": "2026-01-01T00:00:00+00:00",
        "event": "session_start",
        "session_id": "s1",
        "tool": "confer",
    }
    call = {"ts": "2026-01-01T00:00:01+00:00", "event": "provider_call", "session_id": "s1", "provider": "p"}
    log.write_bytes(orjson.dumps(start) + b"\n" + orjson.dumps(call) + b"\n")
    (row,) = sessions.recent()
    assert row.running and row.tool == "confer"
    view = from_events(row, sessions.events("s1"))
    assert len(view.activity) == 2 and "provider_call" in view.activity[1]
    end = {
        **start,
        "event": "session_end",
        "status": "degraded",
        "duration_ms": 5.0,
        "usage": {"cost_usd": 0.5},
    }
    end["degraded_reasons"] = [{"provider": "p", "role": None, "status": "timeout", "code": None}]
    with log.open("ab") as handle:
        handle.write(orjson.dumps(end) + b"\n")
    (row,) = sessions.recent()
    assert (row.status, row.degraded, row.cost_usd) == ("degraded", True, 0.5), "read from where it stopped"
    html = session_body(from_events(row, sessions.events("s1")))
    assert "Degraded" in html and "p: timed out" in html and '<small class="code">timeout</small>' in html


def test_a_session_known_only_by_its_transcript_is_still_listed(workdir: Path, tmp_path: Path) -> None:
    sessions = Sessions(tmp_path / "no-log.ndjson", workdir / "transcripts")
    rows = {row.session_id: row for row in sessions.recent()}
    assert rows["hostile-1"].status == "ok" and rows["hostile-1"].cost_usd is not None
    assert rows["hostile-1"].question and rows["hostile-1"].question.endswith(SCRIPT)


def test_a_transcript_named_outside_the_transcripts_folder_is_never_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text('{"arguments": {"question": "leaked"}}')
    log = tmp_path / "events.ndjson"
    end = {"ts": "2026-01-01T00:00:00+00:00", "event": "session_end", "session_id": "s", "tool": "confer"}
    log.write_bytes(orjson.dumps({**end, "status": "ok", "transcript": str(secret)}) + b"\n")
    sessions = Sessions(log, tmp_path / "transcripts")
    assert sessions.transcript("s") is None and sessions.recent()[0].question is None


# -- over HTTP --------------------------------------------------------------------------------


@pytest.fixture
async def client(workdir: Path) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    async with TestClient(TestServer(build_app(workdir_config(workdir)))) as test_client:
        yield test_client


@pytest.mark.anyio
async def test_every_response_carries_the_strict_policy_even_a_refusal(
    client: TestClient[web.Request, web.Application],
) -> None:
    for method, path, status in [
        ("GET", "/", 200),
        ("GET", "/session?id=hostile-1", 200),
        ("GET", "/session?id=nobody", 404),
        ("GET", "/static/app.js", 200),
        ("GET", "/static/../sessions.py", 404),
        ("POST", "/", 405),
    ]:
        response = await client.request(method, path)
        assert response.status == status, path
        headers = response.headers
        assert headers["Content-Security-Policy"] == CSP and "'unsafe-inline'" not in CSP
        assert headers["X-Content-Type-Options"] == "nosniff" and headers["Referrer-Policy"] == "no-referrer"
        assert headers["X-Frame-Options"] == "DENY" and headers["Cache-Control"] == "no-store"


@pytest.mark.anyio
async def test_the_page_is_read_only_so_anything_but_get_is_405(
    client: TestClient[web.Request, web.Application],
) -> None:
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        for path in ("/", "/session?id=hostile-1", "/events", "/nowhere"):
            response = await client.request(method, path)
            assert (response.status, response.headers["Allow"]) == (405, "GET, HEAD"), (method, path)
    assert (await client.head("/")).status == 200


@pytest.mark.anyio
async def test_a_foreign_host_or_origin_is_refused_against_dns_rebinding(
    client: TestClient[web.Request, web.Application],
) -> None:
    port = client.port
    assert (await client.get("/", headers={"Host": f"attacker.example:{port}"})).status == 403
    assert (await client.get("/", headers={"Origin": "http://attacker.example"})).status == 403
    assert (await client.get("/", headers={"Origin": "null"})).status == 403
    assert (await client.get("/", headers={"Host": f"localhost:{port}"})).status == 200
    assert (await client.get("/", headers={"Origin": f"http://127.0.0.1:{port}"})).status == 200


@pytest.mark.anyio
async def test_model_and_page_text_reaches_the_html_escaped(
    client: TestClient[web.Request, web.Application],
) -> None:
    html = await (await client.get("/session?id=hostile-1")).text()
    assert "window.__pwned=1" in html and "<script>window" not in html
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in html
    assert "&lt;img src=&quot;x&quot; onerror=&quot;window.__pwned=2&quot;&gt;" in html
    assert re.findall(r"<script[^>]*>", html) == ['<script src="/static/app.js" defer>']
    assert "<img" not in html and not re.search(r"<[^>]*\sonerror=", html), "no tag carries a handler"
    listing = await (await client.get("/")).text()
    assert "&lt;script&gt;window.__pwned=1" in listing and "<script>window" not in listing


@pytest.mark.anyio
async def test_the_event_stream_sends_what_is_appended_then_ends_with_the_session(
    client: TestClient[web.Request, web.Application], workdir: Path
) -> None:
    log = workdir / "events.ndjson"
    offset = log.stat().st_size
    response = await client.get(f"/events?session=live-1&from={offset}")
    assert response.headers["Content-Type"] == "text/event-stream"
    assert response.headers["Content-Security-Policy"] == CSP
    events = [
        {
            "ts": "2026-01-01T00:00:00+00:00",
            "event": "session_start",
            "session_id": "live-1",
            "tool": "confer",
        },
        {
            "ts": "2026-01-01T00:00:00+00:00",
            "event": "session_start",
            "session_id": "other",
            "tool": "confer",
        },
        {"ts": "2026-01-01T00:00:01+00:00", "event": "session_end", "session_id": "live-1", "tool": "confer"},
    ]
    with log.open("ab") as handle:
        handle.write(b"".join(orjson.dumps(e) + b"\n" for e in events))
    with anyio.fail_after(5):
        body = (await response.content.read()).decode()
    frames = [f for f in body.split("\n\n") if f.startswith("event:")]
    assert [f.split("\n")[0] for f in frames] == ["event: log", "event: log", "event: end"]
    first = orjson.loads(frames[0].split("data: ")[1])
    assert first["event"] == "session_start" and "session_start" in first["line"]
    assert f"id: {log.stat().st_size}" in frames[1], "an id to resume from after a reconnection"
    # The test's own events have no place in the shared folder's log for the other tests.
    with log.open("r+b") as handle:
        handle.truncate(offset)


# -- the commands -----------------------------------------------------------------------------


def test_ui_refuses_a_bind_other_machines_can_reach_unless_told(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["ui", "--http", "0.0.0.0:0"]) == 2
    assert "--allow-remote" in capsys.readouterr().err


@pytest.fixture
def serve_with_ui(tmp_path: Path) -> Iterator[str]:
    settings = ["--set", f"telemetry.path={tmp_path}/e.ndjson", "--set", f"transcripts.dir={tmp_path}/t"]
    command = [sys.executable, "-m", "conclave", "serve", "--http", "127.0.0.1:0", "--set", "server.ui=true"]
    env = {k: v for k, v in os.environ.items() if k != "CONCLAVE_CONFIG"}
    server = subprocess.Popen([*command, *settings], stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    try:
        assert server.stderr is not None
        line = server.stderr.readline()
        found = re.search(r"http://127\.0\.0\.1:(\d+)/mcp", line)
        assert found and "/ui/" in line, line
        yield f"http://127.0.0.1:{found[1]}"
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.anyio
async def test_serve_http_shows_the_page_at_ui_with_the_same_guard(serve_with_ui: str) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=serve_with_ui) as http:
        page = await http.get("/ui/")
        assert page.status_code == 200 and page.headers["content-security-policy"] == CSP
        assert 'href="/ui/static/style.css"' in page.text and "No sessions yet" in page.text
        assert (await http.get("/ui/static/app.js")).status_code == 200
        assert (await http.get("/ui/", headers={"Origin": "http://attacker.example"})).status_code == 403
        assert (await http.post("/ui/")).status_code == 405
        assert (await http.get("/nowhere")).status_code == 404, "nothing else moved"


@pytest.mark.anyio
async def test_serve_http_says_at_its_root_where_the_page_is_when_it_is_on(serve_with_ui: str) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=serve_with_ui) as http:
        index = await http.get("/")
        assert index.status_code == 200 and index.headers["content-type"].startswith("text/plain")
        assert "/mcp" in index.text and "/rpc" in index.text and "GET  /ui/" in index.text
        described = (await http.get("/", headers={"Accept": "application/json"})).json()
        assert described["endpoints"]["ui"]["path"] == "/ui/"
        assert (await http.get("/", headers={"Origin": "http://attacker.example"})).status_code == 403


@pytest.mark.anyio
async def test_the_page_mounts_under_a_prefix_with_every_link_under_it(workdir: Path) -> None:
    parent = web.Application()
    mount(parent, workdir_config(workdir), bound_host="127.0.0.1")
    async with TestClient(TestServer(parent)) as http:
        html = await (await http.get("/ui/")).text()
    links = re.findall(r'(?:href|src|data-fragment|data-events)="([^"]+)"', html)
    assert links and all(link.startswith("/ui/") for link in links), links


# -- what the page makes plain: long questions, dry runs, costs, rounds, codes ----------------------

LONG_QUESTION = " ".join(f"word{i % 10}" for i in range(20_000))  # 119,999 characters
PROPOSAL = {
    "proposal": "Use a bounded queue.",
    "rationale": "It pushes back on producers.",
    "confidence": 0.7,
    "revision_notes": "A first draft: nothing to revise yet.",
}
ACCEPT = {"verdict": "accept", "issues": [], "summary": "Fine as it is.", "confidence": 0.8}
REVISE = {
    "verdict": "revise",
    "issues": [{"severity": "major", "description": "No limit is named.", "suggestion": "Name one."}],
    "confidence": 0.6,
}
SYNTHESIS = {"answer": "Use a queue bounded at 1,000 items.", "confidence": 0.8}


def says(envelope: Mapping[str, Any]) -> Reply:
    return Reply(text=json.dumps(envelope))


async def call(
    base: Config,
    tool: str,
    args: dict[str, Any],
    scripts: Mapping[str, Scenario] | None = None,
    *,
    content: bool = False,
    unpriced: tuple[str, ...] = (),
) -> None:
    """One call through the real stack against the simulated panel, its members scripted;
    `content`: telemetry.include_content; `unpriced`: members configured without a price."""
    async with SimPanel() as panel:
        for member, scenario in (scripts or {}).items():
            panel.set_scenario(model(member), scenario)
        telemetry = dataclasses.replace(base.telemetry, include_content=content)
        urls = {kind: panel.base_url(kind) for kind in ("openai", "anthropic", "gemini")}
        config = simulated_config(dataclasses.replace(base, telemetry=telemetry), urls)
        providers = {
            name: dataclasses.replace(p, price=None) if name in unpriced else p
            for name, p in config.providers.items()
        }
        async with open_runtime(dataclasses.replace(config, providers=providers)) as runtime:
            await run_tool(runtime, tool, args, None)


def debate(session_id: str, critics: list[str], rounds: int = 1) -> dict[str, Any]:
    return {
        "task": "How should the service queue its jobs?",
        "proposer": "sim-openai",
        "critics": critics,
        "synthesizer": "sim-anthropic",
        "rounds": rounds,
        "session_id": session_id,
    }


async def plain_sessions(base: Config) -> None:
    proposer = Scenario(rules=(Rule(SYNTHESIZER_ASK, says(SYNTHESIS)), Rule(PROPOSER_ASK, says(PROPOSAL))))
    accepts = Scenario(rules=(Rule(CRITIC_ASK, says(ACCEPT)),))
    revises = Scenario(rules=(Rule(SYNTHESIZER_ASK, says(SYNTHESIS)), Rule(CRITIC_ASK, says(REVISE))))
    await call(
        base, "confer", {"question": LONG_QUESTION, "providers": ["sim-openai"], "session_id": "long-1"}
    )
    await call(base, "confer", {"question": "Quiet?", "dry_run": True, "session_id": "dry-quiet"})
    told = debate("dry-told", ["sim-gemini"], rounds=2) | {"dry_run": True}
    await call(base, "coordinate", told, content=True)
    scripts = {"sim-openai": proposer, "sim-gemini": accepts, "sim-anthropic": revises}
    await call(base, "coordinate", debate("agreed-1", ["sim-gemini"], rounds=2), scripts)
    await call(base, "coordinate", debate("revise-1", ["sim-anthropic"]), scripts)
    # sim-gemini never answers in the critic's JSON, sim-anthropic refuses to synthesize (sim-openai
    # stands in), and sim-gemini has no price.
    garbled = Scenario(replies=(Reply(text="Looks fine to me."),))  # asked again too: every call
    refuses = Scenario(rules=(Rule(SYNTHESIZER_ASK, Reply(status=400, error_message="no")),))
    scripts = {"sim-openai": proposer, "sim-gemini": garbled, "sim-anthropic": refuses}
    await call(base, "coordinate", debate("codes-1", ["sim-gemini"]), scripts, unpriced=("sim-gemini",))


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ui-plain")
    anyio.run(plain_sessions, workdir_config(folder))
    return folder


@pytest.fixture
async def plain_client(plain: Path) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    async with TestClient(TestServer(build_app(workdir_config(plain)))) as test_client:
        yield test_client


async def fetch_page(client: TestClient[web.Request, web.Application], path: str) -> str:
    response = await client.get(path)
    assert response.status == 200, path
    return await response.text()


def row_of(page: str, session_id: str) -> str:
    found = re.search(rf'<tr data-session="{re.escape(session_id)}"[^>]*>.*?</tr>', page, re.S)
    assert found, f"no row for {session_id}"
    return found[0]


def shown(markup: str) -> str:
    """The text a reader sees: tags out, entities decoded, whitespace as single spaces."""
    return " ".join(htmllib.unescape(re.sub(r"<[^>]+>", " ", markup)).split())


def link_text(row: str) -> str:
    found = re.search(r'<td class="question"><a href="[^"]*">(.*?)</a>', row, re.S)
    assert found, row
    return shown(found[1])


def costs_of(page: str) -> tuple[dict[str, float], float]:
    """Each part's cost and the total, as the page gives them (`data-cost`)."""
    parts = re.findall(r'<tr data-part="([^"]+)">.*?data-cost="([^"]+)"', page, re.S)
    total = re.search(r'<tfoot>.*?data-cost="([^"]+)"', page, re.S)
    assert parts and total, "no cost table"
    return {name: float(cost) for name, cost in parts}, float(total[1])


@pytest.mark.anyio
async def test_a_huge_question_is_a_short_preview_in_the_list_and_whole_on_its_page(
    plain_client: TestClient[web.Request, web.Application],
) -> None:
    listing = await fetch_page(plain_client, "/")
    preview = link_text(row_of(listing, "long-1"))
    assert preview.endswith("…") and 150 <= len(preview) <= 201, len(preview)
    kept = preview[:-1]
    assert LONG_QUESTION.startswith(kept) and LONG_QUESTION[len(kept)] == " ", "cut after a whole word"
    assert len(listing.encode()) < 20_000, "one long question no longer makes the list 138 KB"
    page = await fetch_page(plain_client, "/session?id=long-1")
    assert LONG_QUESTION in page, "the whole question stays on the session's own page"


@pytest.mark.anyio
async def test_the_list_stays_small_however_many_huge_questions_there_are(tmp_path: Path) -> None:
    base = workdir_config(tmp_path)
    for n in range(RECENT + 5):  # dry runs: nothing called, the question kept in the event log
        args = {"question": f"{n} {LONG_QUESTION}", "dry_run": True, "session_id": f"big-{n}"}
        await call(base, "confer", args, content=True)
    async with TestClient(TestServer(build_app(base))) as client:
        listing = await fetch_page(client, "/")
    assert listing.count("<tr data-session=") == RECENT
    assert len(listing.encode()) < RECENT * 1_500, "each row is bounded, and so is the number of rows"


@pytest.mark.anyio
async def test_a_dry_run_says_it_called_nothing_instead_of_costing_nothing(
    plain_client: TestClient[web.Request, web.Application],
) -> None:
    listing = await fetch_page(plain_client, "/")
    quiet, told = row_of(listing, "dry-quiet"), row_of(listing, "dry-told")
    assert link_text(quiet) == "(dry run: question not recorded)", (
        "not the session id where the question goes"
    )
    assert link_text(told) == "How should the service queue its jobs?", "from session_start, when it is kept"
    for row in (quiet, told):
        assert "dry run: at most $" in shown(row) and "$0.00" not in row
    page = await fetch_page(plain_client, "/session?id=dry-quiet")
    text = shown(page[page.index("<main") :])
    assert "Dry run: nothing was called and nothing was spent" in text
    assert "written when the call ends" not in text and "a dry run writes no transcript" in text
    assert "Its plan bounds the cost: at most $" in text and "$0.00" not in text.split("Events")[0]
    coordinate = shown(await fetch_page(plain_client, "/session?id=dry-told"))
    assert "How should the service queue its jobs?" in coordinate and "rounds 2 asked, none run" in coordinate


@pytest.mark.anyio
async def test_the_confer_page_shows_where_every_cent_went_review_included(
    client: TestClient[web.Request, web.Application], sessions: Sessions
) -> None:
    session_id = demo_id(sessions, "confer")
    page = await fetch_page(client, f"/session?id={session_id}")
    parts, total = costs_of(page)
    assert list(parts) == ["answers", "review", "synthesis"]
    assert parts["review"] > 0 and sum(parts.values()) == pytest.approx(total, abs=1e-9)
    transcript = sessions.transcript(session_id) or {}
    assert total == transcript["result"]["usage"]["cost_usd"]
    assert parts["synthesis"] >= transcript["result"]["synthesis"]["usage"]["cost_usd"]


@pytest.mark.anyio
async def test_a_coordinate_page_has_per_role_totals_its_rounds_and_why_it_stopped(
    plain_client: TestClient[web.Request, web.Application],
) -> None:
    revised = await fetch_page(plain_client, "/session?id=revise-1")
    parts, total = costs_of(revised)
    assert list(parts) == ["proposer", "critic", "synthesizer"]
    assert sum(parts.values()) == pytest.approx(total, abs=1e-9) and all(parts.values())
    text = shown(revised)
    assert "rounds 1 of 1 asked" in text
    assert "rounds exhausted: after the last round asked for, sim-anthropic had not accepted" in text
    agreed = shown(await fetch_page(plain_client, "/session?id=agreed-1"))
    assert "rounds 1 of 2 asked" in agreed
    assert "every critic accepted; the 1 remaining round did not run" in agreed


@pytest.mark.anyio
async def test_codes_read_as_words_once_each_with_the_code_kept_small(
    plain_client: TestClient[web.Request, web.Application],
) -> None:
    page = await fetch_page(plain_client, "/session?id=codes-1")
    banner = re.search(r'<section class="banner degraded".*?</section>', page, re.S)
    assert banner, "codes-1 is degraded"
    (reason,) = re.findall(r"<li>(.*?)</li>", banner[0], re.S)
    assert (
        shown(reason)
        == "sim-gemini (critic): answered in the wrong format, even when asked again invalid_envelope"
    )
    assert reason.count("invalid_envelope") == 1 and '<small class="code">invalid_envelope</small>' in reason
    warnings = re.search(r'<section class="banner warn".*?</section>', page, re.S)
    assert warnings, "codes-1 has warnings"
    said = shown(warnings[0])
    assert "cost unknown: a provider has no price configured price_unknown" in said
    assert "a fallback synthesizer stood in for the one asked synthesizer_fallback" in said
    assert "price_unknown, synthesizer_fallback" not in page
    assert '<span class="badge bad" title="invalid_envelope">wrong format</span>' in page
    assert "1 hop ·" in shown(page) and "1 hops" not in shown(page)
    assert '<span class="key" title="revision_notes">Revision notes</span>' in page
    listing = await fetch_page(plain_client, "/")
    assert "1 part missing" in shown(row_of(listing, "codes-1"))
    css = await fetch_page(plain_client, "/static/style.css")
    key_rule = re.search(r"\.key \{[^}]*\}", css)
    assert key_rule and "uppercase" not in key_rule[0], "a field's name reads as written, not shouted"


# -- structured answers and the vote ------------------------------------------------------------

CHOICES = choices_schema(["SQS", "Kafka", "RabbitMQ"])
PICK = {  # a free-text field put to the vote (`vote_fields`), so a hostile string can win it
    "type": "object",
    "properties": {"pick": {"type": "string"}, "reason": {"type": "string"}},
    "required": ["pick", "reason"],
    "additionalProperties": False,
}


def answering(value: Mapping[str, Any]) -> Scenario:
    return Scenario(replies=(Reply(value=value),))


async def voting_sessions(base: Config) -> None:
    # A tie: one for SQS, one for Kafka, and sim-gemini answers "Redis" (not a choice) twice.
    split = {
        "sim-openai": answering({"choice": "SQS", "reason": "managed"}),
        "sim-anthropic": answering({"choice": "Kafka", "reason": "replay"}),
        "sim-gemini": answering({"choice": "Redis", "reason": "fast"}),
    }
    args = {"question": "Which queue?", "answer_schema": CHOICES, "session_id": "vote-split"}
    await call(base, "confer", args, split)
    # Markup in the values: it wins the vote, dissents, and gives a reason; all of it is text.
    hostile = {
        "sim-openai": answering({"pick": SCRIPT, "reason": IMG}),
        "sim-anthropic": answering({"pick": SCRIPT, "reason": "agreed"}),
        "sim-gemini": answering({"pick": IMG, "reason": "other"}),
    }
    args = {
        "question": "Pick one.",
        "answer_schema": PICK,
        "vote_fields": ["pick"],
        "session_id": "vote-hostile",
    }
    await call(base, "confer", args, hostile)


@pytest.fixture(scope="module")
def voting(tmp_path_factory: pytest.TempPathFactory) -> Sessions:
    folder = tmp_path_factory.mktemp("ui-vote")
    anyio.run(voting_sessions, workdir_config(folder))
    return Sessions(folder / "events.ndjson", folder / "transcripts")


def section_of(page: str, heading: str) -> str:
    found = re.search(rf"<section><h2>{re.escape(heading)}.*?</section>", page, re.S)
    assert found, f"no section {heading!r}"
    return found[0]


def heading_of(section: str) -> str:
    found = re.search(r"<h2>.*?</h2>", section, re.S)
    assert found, "no heading"
    return shown(found[0])


def vote_rows(page: str) -> dict[str, str]:
    """Each voted field's row of the vote table, as a reader sees it."""
    return {f: shown(row) for f, row in re.findall(r'<tr data-field="([^"]*)">(.*?)</tr>', page, re.S)}


def test_the_demos_vote_is_a_table_under_its_consensus_with_the_dissent_named(sessions: Sessions) -> None:
    session_id = demo_id(sessions, "vote")
    summary = sessions.summary(session_id)
    assert summary is not None
    view = from_transcript(summary, sessions.transcript(session_id) or {})
    assert view.vote is not None and view.vote.consensus == {"choice": "SQS"} and view.vote.reason is None
    (choice,) = view.vote.fields
    assert (choice.field, choice.winner, choice.won, choice.votes, choice.of) == ("choice", "SQS", True, 2, 3)
    assert [(d.provider, d.value) for d in choice.dissent] == [("sim-gemini", "Kafka")]
    assert {a.provider: (a.value or {}).get("choice") for a in view.answers} == {
        "sim-openai": "SQS",
        "sim-anthropic": "SQS",
        "sim-gemini": "Kafka",
    }
    page = view_of(sessions, session_id)
    vote = section_of(page, "Vote")
    assert heading_of(vote) == "Vote · consensus: choice = SQS"
    assert vote_rows(vote) == {"choice": "choice SQS 2 of 3 67% no sim-gemini : Kafka"}
    assert "Not counted" not in vote, "every answer was valid"
    answers = section_of(page, "Answers")
    assert "choice SQS reason Managed: no brokers" in shown(answers), "each answer's fields, by name"
    assert "&quot;choice&quot;" not in answers, "not the answer's JSON text"
    assert page.index("<h2>Answers") < page.index("<h2>Vote"), "the vote follows the answers it counts"


def test_a_vote_without_a_consensus_says_why_and_names_whom_it_did_not_count(voting: Sessions) -> None:
    page = view_of(voting, "vote-split")
    vote = section_of(page, "Vote")
    heading = heading_of(vote)
    assert heading == "Vote · no consensus: no strict majority on 'choice': 1 of 2 (a tie)"
    assert vote_rows(vote) == {"choice": "choice a tie 1 of 2 50% no sim-openai : SQS sim-anthropic : Kafka"}
    assert "Not counted (no answer valid against the schema): sim-gemini" in shown(vote)
    card = re.search(r'<article class="card bad">.*?</article>', page, re.S)
    assert card and "sim-gemini" in card[0]
    said = shown(card[0])
    assert '<span class="badge bad" title="invalid_answer">invalid answer</span>' in card[0]
    assert "gave no answer valid against the answer schema, even when asked again" in said
    assert "'Redis' is not one of" in said, "the validator's own words, escaped"
    assert 'not valid against the answer schema (so not counted in the vote): {"choice":"Redis"' in said
    assert "Degraded" in page and "sim-gemini: gave no answer valid against the answer schema" in shown(page)


def test_markup_in_a_structured_answer_or_the_vote_is_text(voting: Sessions) -> None:
    page = view_of(voting, "vote-hostile")
    vote = section_of(page, "Vote")
    assert heading_of(vote) == f"Vote · consensus: pick = {SCRIPT}"
    assert vote_rows(vote) == {"pick": f"pick {SCRIPT} 2 of 3 67% no sim-gemini : {IMG}"}
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in vote
    assert "&lt;img src=&quot;x&quot; onerror=&quot;window.__pwned=2&quot;&gt;" in vote
    answers = section_of(page, "Answers")
    assert f"reason {IMG}" in shown(answers)
    for markup in (page, vote, answers):
        assert "<script" not in markup and "<img" not in markup
        assert not re.search(r"<[^>]*\sonerror=", markup), "no tag carries a handler"
