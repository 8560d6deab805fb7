"""The Evals pages of `conclave ui`: the runs `conclave eval` wrote under `evals.dir` (`/evals`), one
run's table of strategies, judge agreement and chart (`/eval?run=…`), and its files
(`/eval/chart.svg`, `/eval/results.jsonl`). A run is a name, never a path: whatever else `?run=`
says is 404. A summary that cannot be read is listed with the reason, never a 500. Markup in a
summary is text."""

from __future__ import annotations

import copy
import html as htmllib
import os
import re
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from conclave.app.ui import build_app, mount
from conclave.app.ui.app import CSP, SECURITY_HEADERS
from conclave.app.ui.evals import SUMMARY_SCHEMA, read_summary
from conclave.schema.config import Config, load_config
from conclave.schema.schemas import first_error
from tests.browser import chromium, conclave_ui, why_no_browser
from tests.ui_support import SCRIPT

GOOD, OLDER = "20261127-104500-basic", "20261126-090000-older"
BROKEN, INVALID, MISSING, LINKED, SNEAKY = "broken", "invalid", "missing", "linked", "sneaky"

HOSTILE = f"answers {SCRIPT} and <img src=x onerror=alert(1)>"
SUMMARY: dict[str, Any] = {
    "version": 1,
    "suite": "basic",
    "items": 50,
    "started_at": "2026-11-27T10:45:00+00:00",
    "finished_at": "2026-11-27T10:57:30+00:00",
    "seed": 7,
    "budget": "equal",
    "panel": ["sim-openai", "sim-anthropic", "sim-gemini"],
    "stopped": "max_cost",
    "best_single": "single:sim-openai",
    "judge": {"judges": ["sim-anthropic", "sim-gemini"], "judged": 50, "kappa": 0.81},
    "strategies": [
        {
            "strategy": "single:sim-openai",
            "description": "sim-openai alone, once",
            "calls_per_item": 1,
            "samples": 1,
            "items": 50,
            "scored": 50,
            "correct": 38,
            "accuracy": 0.76,
            "ci_low": 0.626,
            "ci_high": 0.857,
            "failed": 0,
            "degraded": 0,
            "cost_usd_per_item": None,
            "tokens_per_item": 812.6,
            "latency_ms_p50": 410.0,
            "latency_ms_p95": 980.0,
            "vs_best_single": None,
        },
        {
            "strategy": "council",
            "description": "confer: the panel answers, reviews, and one synthesizes",
            "calls_per_item": 7,
            "samples": 1,
            "items": 50,
            "scored": 50,
            "correct": 41,
            "accuracy": 0.82,
            "ci_low": 0.741,
            "ci_high": 0.88,
            "failed": 1,
            "degraded": 2,
            "cost_usd_per_item": 0.0123,
            "tokens_per_item": 4321.4,
            "latency_ms_p50": 820.0,
            "latency_ms_p95": 1450.0,
            "vs_best_single": {
                "against": "single:sim-openai",
                "difference": 0.06,
                "ci_low": -0.021,
                "ci_high": 0.14,
                "mcnemar_p": 0.21,
                "pairs": 50,
            },
        },
        {
            "strategy": "hostile",
            "description": HOSTILE,
            "calls_per_item": 3,
            "samples": 3,
            "items": 50,
            "scored": 0,
            "correct": 0,
            "accuracy": None,
            "ci_low": None,
            "ci_high": None,
            "failed": 50,
            "degraded": 0,
            "cost_usd_per_item": 0.0,
            "tokens_per_item": None,
            "latency_ms_p50": None,
            "latency_ms_p95": None,
            "vs_best_single": None,
        },
    ],
    "files": {"results": "results.jsonl", "chart_png": "chart.png", "chart_svg": "chart.svg"},
}


def older_summary() -> dict[str, Any]:
    older = copy.deepcopy(SUMMARY)
    older.update(
        suite="smoke",
        items=10,
        started_at="2026-11-26T09:00:00Z",
        finished_at="2026-11-26T09:01:00Z",
        stopped=None,
        judge=None,
        files={"results": "results.jsonl", "chart_png": None, "chart_svg": None},
    )
    older["strategies"] = older["strategies"][:1]
    return older


def invalid_summary() -> dict[str, Any]:
    invalid = copy.deepcopy(SUMMARY)
    invalid["strategies"][0]["accuracy"] = "high"
    return invalid


# A chart as matplotlib writes one: its colours in `style` attributes and a <style> element.
CHART = b"""<?xml version="1.0" encoding="utf-8" standalone="no"?>
<svg xmlns="http://www.w3.org/2000/svg" width="240" height="120" viewBox="0 0 240 120">
 <defs><style type="text/css">*{stroke-linejoin: round; stroke-linecap: butt}</style></defs>
 <rect x="0" y="0" width="240" height="120" style="fill: #1f77b4"/>
</svg>
"""
RESULTS = (
    b'{"item": 1, "strategy": "council", "correct": true}\n{"item": 1, "strategy": "single:sim-openai"}\n'
)
SECRET = b"<svg xmlns='http://www.w3.org/2000/svg'><text>secret outside evals.dir</text></svg>"


def stamp(path: Path, when: str) -> None:
    seconds = datetime.fromisoformat(when).replace(tzinfo=UTC).timestamp()
    os.utime(path, (seconds, seconds))


def write_runs(evals: Path, outside: Path) -> None:
    """Two good runs, a summary that is not JSON, one that is not a summary, a run folder without
    a summary, and three ways of reaching outside evals.dir (a folder linked out of it, a chart
    linked out of a run, and a folder beside it)."""
    for name, body in ((GOOD, SUMMARY), (OLDER, older_summary()), (INVALID, invalid_summary())):
        (evals / name).mkdir(parents=True)
        (evals / name / "summary.json").write_bytes(orjson.dumps(body, option=orjson.OPT_INDENT_2))
        (evals / name / "results.jsonl").write_bytes(RESULTS)
    (evals / GOOD / "chart.svg").write_bytes(CHART)
    (evals / GOOD / "chart.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (evals / BROKEN).mkdir()
    (evals / BROKEN / "summary.json").write_text('{"version": 1, "suite": ')
    (evals / MISSING).mkdir()
    (evals / MISSING / "results.jsonl").write_bytes(RESULTS)
    (evals / "stray.json").write_text("{}")  # a file, not a run
    outside.mkdir()
    (outside / "summary.json").write_bytes(orjson.dumps(SUMMARY))
    (outside / "chart.svg").write_bytes(SECRET)
    (outside / "results.jsonl").write_bytes(SECRET)
    (evals / LINKED).symlink_to(outside, target_is_directory=True)
    (evals / SNEAKY).mkdir()
    (evals / SNEAKY / "summary.json").write_bytes(orjson.dumps(older_summary()))
    (evals / SNEAKY / "chart.svg").symlink_to(outside / "chart.svg")
    (evals / SNEAKY / "results.jsonl").symlink_to(outside / "results.jsonl")
    stamp(evals / BROKEN / "summary.json", "2026-11-25T00:00:00")
    stamp(evals / INVALID / "summary.json", "2026-11-24T00:00:00")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ui-evals")
    write_runs(folder / "evals", folder / "outside")
    return folder


def config_for(workdir: Path) -> Config:
    overrides = [
        f"telemetry.path={workdir}/events.ndjson",
        f"transcripts.dir={workdir}/transcripts",
        f"evals.dir={workdir}/evals",
    ]
    return load_config(None, overrides=overrides, env={}, dotenv=None)


@pytest.fixture
async def client(workdir: Path) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    async with TestClient(TestServer(build_app(config_for(workdir)))) as test_client:
        yield test_client


Client = TestClient[web.Request, web.Application]


async def page_of(client: Client, path: str, **params: str) -> str:
    response = await client.get(path, params=params or None)
    assert response.status == 200, (path, params)
    assert response.headers["Content-Type"] == "text/html; charset=utf-8"
    return await response.text()


def shown(markup: str) -> str:
    """The text a reader sees: tags out, entities decoded, whitespace as single spaces."""
    return " ".join(htmllib.unescape(re.sub(r"<[^>]+>", " ", markup)).split())


def rows_of(page: str, attribute: str) -> dict[str, str]:
    """Each table row carrying `data-<attribute>`, by its value, as its markup."""
    found = re.findall(rf'(<tr data-{attribute}="([^"]*)".*?</tr>)', page, re.S)
    return {htmllib.unescape(name): row for row, name in found}


def cells(row: str) -> list[str]:
    return [shown(cell) for cell in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, re.S)]


def assert_secure(response: Any) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert response.headers[name] == value, name
    assert "'unsafe-inline'" not in CSP and "script-src 'self'" in CSP


# -- the fixtures are summaries -----------------------------------------------------------------


def test_the_fixture_runs_are_summaries_and_the_invalid_one_is_not() -> None:
    """Checked against schemas/eval.summary.json, which `conclave eval` writes to."""
    for summary in (SUMMARY, older_summary()):
        error = first_error(SUMMARY_SCHEMA, summary)
        assert error is None, error.message
    error = first_error(SUMMARY_SCHEMA, invalid_summary())
    assert error is not None and list(error.absolute_path) == ["strategies", 0, "accuracy"]


def test_the_page_reads_a_summary_field_by_field_and_says_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    path.write_bytes(orjson.dumps(SUMMARY))
    summary, problem = read_summary(path)
    assert problem is None and summary is not None
    assert summary.best is not None and summary.best.strategy == "council"
    assert [s.strategy for s in summary.strategies] == ["single:sim-openai", "council", "hostile"]
    for broken, why in [
        ({**SUMMARY, "version": 2}, "version 2: this page reads version 1"),
        ({**SUMMARY, "strategies": "all"}, "strategies"),
        ({**SUMMARY, "items": True}, "items"),
        ({**SUMMARY, "judge": {"judges": ["a"], "judged": 1, "kappa": "high"}}, "kappa"),
        ([1, 2], "not a valid summary"),
    ]:
        path.write_bytes(orjson.dumps(broken))
        summary, problem = read_summary(path)
        assert summary is None and problem is not None and why in problem, (broken, problem)
    path.write_text("[1, 2")
    summary, problem = read_summary(path)
    assert summary is None and (problem or "").startswith("not JSON: ")


# -- the list -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_list_has_every_run_newest_first_with_its_numbers(client: Client) -> None:
    page = await page_of(client, "/evals")
    rows = rows_of(page, "run")
    # By when each started (SNEAKY started with OLDER: then by name); an unreadable one by when its
    # summary was written. No run without a summary, nothing outside evals.dir.
    assert list(rows) == [GOOD, OLDER, SNEAKY, BROKEN, INVALID]
    assert cells(rows[GOOD]) == [
        GOOD,
        "basic",
        "50",
        "2026-11-27 10:45:00 UTC",
        "3",
        "council 82.0%",
        "stopped: max_cost",
    ]
    assert cells(rows[OLDER]) == [
        OLDER,
        "smoke",
        "10",
        "2026-11-26 09:00:00 UTC",
        "1",
        "single:sim-openai 76.0%",
        "",
    ]
    assert f'href="/eval?run={GOOD}"' in rows[GOOD]
    assert "<h1>Eval runs</h1>" in page


@pytest.mark.anyio
async def test_an_unreadable_summary_is_listed_with_the_reason_never_a_500(client: Client) -> None:
    rows = rows_of(await page_of(client, "/evals"), "run")
    broken, invalid = shown(rows[BROKEN]), shown(rows[INVALID])
    assert broken.startswith(f"{BROKEN} unreadable not JSON: "), broken
    assert invalid.startswith(f"{INVALID} unreadable not a valid summary: $.strategies[0].accuracy"), invalid
    assert 'data-readable="false"' in rows[BROKEN] and 'data-readable="true"' in rows[GOOD]
    for name, reason in ((BROKEN, "not JSON"), (INVALID, "not a valid summary")):
        page = shown(await page_of(client, "/eval", run=name))
        assert f"Unreadable: unreadable its summary.json is {reason}" in page
        assert "results.jsonl" in page and "Strategies" not in page


@pytest.mark.anyio
async def test_no_runs_yet_says_where_they_will_be(tmp_path: Path) -> None:
    async with TestClient(TestServer(build_app(config_for(tmp_path)))) as client:
        page = shown(await page_of(client, "/evals"))
    assert f"No eval runs under {tmp_path}/evals yet" in page


# -- one run ------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_run_is_its_strategies_with_every_number_as_a_reader_sees_it(client: Client) -> None:
    page = await page_of(client, "/eval", run=GOOD)
    rows = rows_of(page, "strategy")
    assert list(rows) == ["single:sim-openai", "council", "hostile"]
    assert cells(rows["council"]) == [
        "council ★",
        "confer: the panel answers, reviews, and one synthesizes",
        "82.0% 74.1–88.0",
        "41/50",
        "1",
        "2",
        "$0.0123",
        "4,321",
        "820 / 1,450 ms",
        "+6.0 pts 95% CI -2.1 to +14.0 McNemar p = 0.210, 50 pairs vs single:sim-openai",
    ]
    assert 'class="top"' in rows["council"] and 'data-accuracy="0.82"' in rows["council"]
    assert cells(rows["single:sim-openai"]) == [
        "single:sim-openai",
        "sim-openai alone, once",
        "76.0% 62.6–85.7",
        "38/50",
        "0",
        "0",
        "—",
        "813",
        "410 / 980 ms",
        "—",
    ]
    hostile = cells(rows["hostile"])
    assert hostile[2:] == ["—", "0/0", "50", "0", "$0.00", "—", "—", "—"]
    text = shown(page)
    assert "Stopped early: the cost cap was reached (max_cost)" in text
    assert "suite basic items 50 started 2026-11-27 10:45:00 UTC took 12 min 30 s" in text
    assert "best single member single:sim-openai budget equal seed 7" in text
    assert "Judge agreement Judged by sim-anthropic, sim-gemini: 50 answers judged." in text
    assert "(Fleiss' κ; 1: complete, 0: no better than chance): 0.81." in text


@pytest.mark.anyio
async def test_a_run_shows_its_chart_and_offers_its_results(client: Client) -> None:
    page = await page_of(client, "/eval", run=GOOD)
    assert re.findall(r"<img[^>]*>", page) == [
        f'<img src="/eval/chart.svg?run={GOOD}" alt="{GOOD}: each strategy&#x27;s accuracy against its cost per item" class="chart">'
    ]
    link = re.search(r'<a href="([^"]+)" download="([^"]+)">results.jsonl</a>', page)
    assert link and link.groups() == (f"/eval/results.jsonl?run={GOOD}", f"{GOOD}-results.jsonl")
    chart = await client.get(link[1].replace("results.jsonl", "chart.svg"))
    assert (chart.status, chart.headers["Content-Type"], await chart.read()) == (200, "image/svg+xml", CHART)
    assert_secure(chart)
    results = await client.get(link[1])
    assert results.status == 200 and results.headers["Content-Type"] == "application/x-ndjson"
    assert results.headers["Content-Disposition"] == f'attachment; filename="{GOOD}-results.jsonl"'
    assert await results.read() == RESULTS
    assert_secure(results)
    head = await client.head(f"/eval/chart.svg?run={GOOD}")
    assert head.status == 200 and head.headers["Content-Length"] == str(len(CHART))


@pytest.mark.anyio
async def test_a_run_without_chart_or_judge_says_so_and_its_chart_is_404(client: Client) -> None:
    page = await page_of(client, "/eval", run=OLDER)
    text = shown(page)
    assert "No chart: chart.svg is drawn only where matplotlib is installed." in text
    assert "<img" not in page and "Judge agreement" not in text and "Stopped early" not in text
    missing = await client.get("/eval/chart.svg", params={"run": OLDER})
    assert missing.status == 404
    assert_secure(missing)


@pytest.mark.anyio
async def test_markup_in_a_summary_is_text(client: Client) -> None:
    page = await page_of(client, "/eval", run=GOOD)
    assert (
        "answers &lt;script&gt;window.__pwned=1&lt;/script&gt; and &lt;img src=x onerror=alert(1)&gt;" in page
    )
    assert re.findall(r"<script[^>]*>", page) == ['<script src="/static/app.js" defer>']
    assert len(re.findall(r"<img", page)) == 1 and not re.search(r"<[^>]*\sonerror=", page)


# -- names, not paths ---------------------------------------------------------------------------

ATTEMPTS = [
    "",
    ".",
    "..",
    "../outside",
    "../evals/" + GOOD,
    GOOD + "/",
    GOOD + "/../" + GOOD,
    "./" + GOOD,
    "/etc",
    "/etc/passwd",
    "..\\outside",
    GOOD + "\x00",
    GOOD + "\n",
    ".hidden",
    "x" * 256,
    LINKED,
    MISSING,
    "nobody",
]


@pytest.mark.anyio
@pytest.mark.parametrize("route", ["/eval", "/eval/chart.svg", "/eval/results.jsonl"])
async def test_whatever_else_run_says_is_404_never_a_path(client: Client, workdir: Path, route: str) -> None:
    attempts = [*ATTEMPTS, str(workdir / "outside"), str(workdir / "evals" / GOOD)]
    for run in attempts:
        response = await client.get(route, params={"run": run})
        assert response.status == 404, (route, run)
        assert_secure(response)
        assert b"secret outside" not in await response.read()
    for raw in ("run=%2e%2e", "run=%2e%2e%2foutside", "run=..%2Foutside", "run=%2Fetc%2Fpasswd", ""):
        response = await client.get(f"{route}?{raw}")
        assert response.status == 404, (route, raw)
        assert b"secret outside" not in await response.read()


@pytest.mark.anyio
async def test_a_file_linked_out_of_its_run_is_not_served(client: Client) -> None:
    assert (await page_of(client, "/eval", run=SNEAKY)).count("<img") == 0
    for route in ("/eval/chart.svg", "/eval/results.jsonl"):
        response = await client.get(route, params={"run": SNEAKY})
        assert response.status == 404 and b"secret" not in await response.read()


@pytest.mark.anyio
async def test_every_eval_response_carries_the_strict_policy_and_is_read_only(client: Client) -> None:
    for path, status in [
        ("/evals", 200),
        (f"/eval?run={GOOD}", 200),
        (f"/eval?run={BROKEN}", 200),
        ("/eval?run=../x", 404),
        (f"/eval/results.jsonl?run={GOOD}", 200),
        ("/eval/chart.svg?run=nobody", 404),
    ]:
        response = await client.get(path)
        assert response.status == status, path
        assert_secure(response)
        assert (await client.post(path)).status == 405
    refused = await client.get("/evals", headers={"Origin": "http://attacker.example"})
    assert refused.status == 403
    assert_secure(refused)


# -- navigation and the mount -------------------------------------------------------------------


@pytest.mark.anyio
async def test_sessions_and_evals_link_to_each_other(client: Client) -> None:
    for path, here in (("/", "/"), ("/evals", "/evals"), (f"/eval?run={GOOD}", "/evals")):
        page = await page_of(client, path)
        nav = re.search(r'<nav class="sections">(.*?)</nav>', page, re.S)
        assert nav, path
        links = re.findall(r'<a href="([^"]+)"[^>]*>([^<]+)</a>', nav[1])
        assert links == [("/", "sessions"), ("/evals", "evals")], path
        assert re.search(rf'<a href="{re.escape(here)}" class="crumb here" aria-current="page">', nav[1])


@pytest.mark.anyio
async def test_the_evals_pages_mount_under_a_prefix_with_every_link_under_it(workdir: Path) -> None:
    parent = web.Application()
    mount(parent, config_for(workdir), bound_host="127.0.0.1")
    async with TestClient(TestServer(parent)) as http:
        for path in ("/ui/evals", f"/ui/eval?run={GOOD}"):
            response = await http.get(path)
            assert response.status == 200, path
            html = await response.text()
            links = re.findall(r'(?:href|src)="([^"]+)"', html)
            assert links and all(link.startswith("/ui/") for link in links), links
        chart = await http.get(f"/ui/eval/chart.svg?run={GOOD}")
        assert chart.status == 200 and await chart.read() == CHART
        assert (await http.get("/ui/eval/chart.svg?run=..")).status == 404


# -- in a browser -------------------------------------------------------------------------------

NO_BROWSER = why_no_browser()


@pytest.fixture(scope="module")
def browser_ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`conclave ui` run as a user runs it, in a folder whose `.conclave/evals` has the runs."""
    folder = tmp_path_factory.mktemp("ui-evals-browser")
    write_runs(folder / ".conclave" / "evals", folder / "outside")
    with conclave_ui(folder) as address:
        yield address


@pytest.mark.skipif(NO_BROWSER is not None, reason=NO_BROWSER or "")
def test_in_a_browser_the_chart_draws_with_its_colours_and_nothing_runs(browser_ui: str) -> None:
    from playwright.sync_api import expect

    with chromium() as browser:
        page = browser.new_page()
        page.set_default_timeout(10_000)
        errors: list[str] = []
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        page.goto(f"{browser_ui}/")
        page.get_by_role("link", name="evals").click()
        expect(page.get_by_role("heading", name="Eval runs")).to_be_visible()
        page.get_by_role("link", name=GOOD).click()
        expect(page.locator('tr[data-strategy="council"]')).to_contain_text("82.0%")
        expect(page.locator('tr[data-strategy="hostile"]')).to_contain_text(SCRIPT)
        chart = page.locator("img.chart")
        expect(chart).to_be_visible()
        page.wait_for_function("document.querySelector('img.chart').complete")
        colour = page.evaluate(
            """() => {
                const img = document.querySelector('img.chart');
                const canvas = document.createElement('canvas');
                canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
                const context = canvas.getContext('2d');
                context.drawImage(img, 0, 0);
                return [img.naturalWidth, ...context.getImageData(120, 60, 1, 1).data];
            }"""
        )
        assert colour == [240, 0x1F, 0x77, 0xB4, 255], "drawn, with the colour its style attribute gives"
        assert page.evaluate("window.__pwned") is None
        assert not [e for e in errors if "Content Security Policy" in e], errors
