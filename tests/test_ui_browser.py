"""The page in a real browser (headless Chromium), against `conclave ui` over loopback after the
demo ran: the list, one session's answers side by side, a session followed live while it runs,
and hostile text that stays text; and against `conclave serve --http`, a running session's answers
growing on its page as they stream. One browser serves the whole module.

Skipped, loudly, where Chromium or Playwright is missing (scripts/setup dev installs both when it
can)."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest

from conclave.app.demo import run_demo
from tests.browser import chromium, conclave_ui, why_no_browser
from tests.live_support import MEMBERS, long_reply, panel_in_thread, rpc_confer, serve_http
from tests.ui_support import IMG, SCRIPT, hostile_session, slow_session, workdir_config

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

SKIP = why_no_browser()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


def in_thread(function: Callable[..., Awaitable[Any]], *args: Any) -> Callable[[], Any]:
    """Start an async function on its own loop in another thread (Playwright's sync API keeps a
    loop of its own running in this one); returns what waits for it and gives its result."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = anyio.run(function, *args)
        except BaseException as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()

    def wait() -> Any:
        worker.join(timeout=60)
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("value")

    return wait


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ui-browser")
    base = workdir_config(folder)
    in_thread(lambda: run_demo(base, latency_ms=0, progress=None))()
    in_thread(hostile_session, base, "hostile-1")()
    return folder


@pytest.fixture(scope="module")
def ui(workdir: Path) -> Iterator[str]:
    with conclave_ui(workdir) as address:
        yield address


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    opened.set_default_timeout(10_000)
    yield opened
    context.close()


def test_the_list_shows_the_demos_two_sessions_with_tool_status_and_cost(page: Page, ui: str) -> None:
    from playwright.sync_api import expect

    page.goto(f"{ui}/")
    expect(page.get_by_role("heading", name="Recent sessions")).to_be_visible()
    for tool, question in (("confer", "How tall is the Exampleville"), ("coordinate", "Choose an eviction")):
        row = page.locator("tr", has_text=question)
        expect(row).to_have_count(1)
        expect(row.locator(".tool")).to_have_text(tool)
        expect(row.locator(".badge")).to_have_text("ok")
        expect(row.locator("td.num").first).to_contain_text("$")


def test_one_session_shows_its_answers_side_by_side_with_hops_review_and_synthesis(
    page: Page, ui: str
) -> None:
    from playwright.sync_api import expect

    page.goto(f"{ui}/")
    page.get_by_role("link", name="How tall is the Exampleville").click()
    cards = page.locator("section:has(h2:text-is('Answers')) .card")
    expect(cards).to_have_count(3)
    boxes = [cards.nth(i).bounding_box() for i in range(3)]
    assert all(box is not None for box in boxes)
    tops, lefts = [b["y"] for b in boxes if b], [b["x"] for b in boxes if b]
    assert max(tops) - min(tops) < 2 and lefts == sorted(lefts), f"side by side: {boxes}"
    fetcher = cards.filter(has_text="sim-openai")
    expect(fetcher).to_contain_text("sim-gpt")
    expect(fetcher).to_contain_text("2 hops")
    result = fetcher.locator("pre.result")
    expect(result).to_be_hidden()  # collapsed until asked for
    fetcher.locator("summary").click()
    expect(result).to_be_visible()
    expect(result).to_contain_text("47 metres tall")
    expect(page.locator("table.aggregate tr.top")).to_contain_text("sim-gemini")
    expect(page.locator("section.synthesis")).to_contain_text("47 metres tall (its own page says so)")


def test_a_running_session_is_followed_live_until_it_ends(page: Page, ui: str, workdir: Path) -> None:
    from playwright.sync_api import expect

    page.goto(f"{ui}/")
    latencies = {"sim-openai": 0.3, "sim-anthropic": 2.0, "sim-gemini": 3.5}
    finished = in_thread(slow_session, workdir_config(workdir), "live-1", latencies)
    try:
        running = page.locator('tr[data-session="live-1"][data-status="running"]')
        expect(running).to_be_visible()  # the list, loaded before the session began, updated itself
        running.get_by_role("link").click()
        expect(page.locator("h1 .badge")).to_have_text("running")
        events = page.locator("#activity li")
        expect(events).not_to_have_count(0)
        seen = events.count()
        expect(events).not_to_have_count(seen)  # a member answered while the page was open
        expect(page.locator("h1 .badge")).to_have_text("ok")  # session_end, then the transcript
        expect(page.locator(".columns .card")).to_have_count(3)
    finally:
        result = finished()
    assert result["degraded"] is False


def test_markup_in_a_fetched_page_and_an_answer_is_shown_as_text_and_never_run(page: Page, ui: str) -> None:
    from playwright.sync_api import expect

    page.goto(f"{ui}/")
    expect(page.locator("tr", has_text=SCRIPT)).to_have_count(1)  # the question, as text
    page.goto(f"{ui}/session?id=hostile-1")
    answer = page.locator(".card", has_text="sim-openai")
    expect(answer.locator(".text")).to_contain_text(f"{SCRIPT} {IMG}")
    answer.locator("summary").click()
    expect(answer.locator("pre.result")).to_contain_text(SCRIPT)  # the fetched page's text
    expect(answer.locator("pre.result")).to_contain_text(IMG)
    page.wait_for_timeout(300)  # time for an image error handler, were there an image
    assert page.evaluate("window.__pwned") is None
    assert page.locator("img").count() == 0
    assert page.locator("script").count() == 1  # the page's own


def test_a_foreign_origin_or_host_is_refused(ui: str) -> None:
    port = ui.rsplit(":", 1)[1]
    with httpx.Client(base_url=ui) as http:
        assert http.get("/", headers={"Origin": "http://attacker.example"}).status_code == 403
        assert http.get("/", headers={"Host": f"rebound.attacker.example:{port}"}).status_code == 403
        assert http.post("/", content=b"x").status_code == 405
        assert http.get("/").status_code == 200


def test_a_running_session_s_answers_grow_on_its_page_as_they_stream(page: Page, tmp_path: Path) -> None:
    """`serve --http` serving the page and running the session: its answers' text grows in the
    `Streaming…` cards, as text (markup in it stays text), until the session's end replaces them
    with the final answers."""
    from playwright.sync_api import expect

    replies = {name: long_reply(name, 120) for name in MEMBERS}
    replies["beta"] = f"{SCRIPT} {IMG} " + replies["beta"]  # a word at a time: never markup
    with (
        panel_in_thread(tmp_path, stream_tokens_per_s=40, latency_ms=1500, replies=replies) as config,
        serve_http(config, tmp_path) as base,
    ):
        page.goto(f"{base}/ui/")
        finished = in_thread(rpc_confer, base, "stream-1")
        try:
            running = page.locator('tr[data-session="stream-1"][data-status="running"]')
            expect(running).to_be_visible()
            running.get_by_role("link").click()
            expect(page.locator("h1 .badge")).to_have_text("running")
            alpha = page.locator('#streaming .card[data-provider="alpha"] .text')
            expect(alpha).to_contain_text("Zebrafinch-alpha-")
            before = alpha.inner_text()
            expect(alpha).not_to_have_text(before)  # it grew while the page watched
            assert before.strip() in alpha.inner_text(), "added to, never replaced"
            expect(page.locator('#streaming .card[data-provider="beta"] .text')).to_contain_text(SCRIPT)
            expect(page.locator("h1 .badge")).to_have_text("ok", timeout=30_000)  # the end: the transcript
            expect(page.locator("#streaming")).to_have_count(0)
            cards = page.locator(".columns .card")
            expect(cards).to_have_count(3)
            expect(cards.filter(has_text="Zebrafinch-alpha-119")).to_have_count(1)
        finally:
            result = finished()
    assert result["degraded"] is False
    assert page.evaluate("window.__pwned") is None
    assert page.locator("img").count() == 0
